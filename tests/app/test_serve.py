#!/usr/bin/env python3
# strata serve driven by the real OpenAI Python client (and raw HTTP for the error cases): completions, streaming,
# concurrency vs sequential results, cancellation freeing a slot, 4xx errors, API key, 429, 503 while loading.
import argparse, concurrent.futures, http.client, json, os, socket, subprocess, sys, time, unittest

import openai

ARGS = None


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


class Server:
    def __init__(self, *extra, env=None):
        self.port = free_port()
        e = dict(os.environ)
        e.update(env or {})
        self.proc = subprocess.Popen([ARGS.bin, "serve", "--model", ARGS.model, "--port", str(self.port), "--threads", "2",
                                      *extra], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=e)

    def wait_ready(self, timeout=60):
        t0 = time.time()
        while time.time() - t0 < timeout:
            try:
                st, _ = self.get("/health")
                if st == 200:
                    return
            except OSError:
                pass
            time.sleep(0.05)
        raise RuntimeError("server did not become ready")

    def request(self, method, path, body=None, headers=None):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        c.request(method, path, body=body, headers=headers or {})
        r = c.getresponse()
        data = r.read()
        c.close()
        return r.status, data

    def get(self, path):
        return self.request("GET", path)

    def post(self, path, obj_or_bytes, headers=None):
        body = obj_or_bytes if isinstance(obj_or_bytes, bytes) else json.dumps(obj_or_bytes).encode()
        h = {"Content-Type": "application/json"}
        h.update(headers or {})
        return self.request("POST", path, body, h)

    def client(self, key="unused"):
        return openai.OpenAI(base_url=f"http://127.0.0.1:{self.port}/v1", api_key=key, max_retries=0, timeout=60)

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def chat_once(client, text, max_tokens=24, stream=False, **kw):
    msgs = [{"role": "user", "content": text}]
    if not stream:
        r = client.chat.completions.create(model="chat-model", messages=msgs, max_tokens=max_tokens, temperature=0, **kw)
        return r.choices[0].message.content, r.choices[0].finish_reason, r.usage
    out, finish = "", None
    for ch in client.chat.completions.create(model="chat-model", messages=msgs, max_tokens=max_tokens, temperature=0,
                                             stream=True, **kw):
        if ch.choices and ch.choices[0].delta.content:
            out += ch.choices[0].delta.content
        if ch.choices and ch.choices[0].finish_reason:
            finish = ch.choices[0].finish_reason
    return out, finish, None


class ServeTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.srv = Server("--parallel", "8", "--queue", "32")
        cls.srv.wait_ready()
        cls.client = cls.srv.client()

    @classmethod
    def tearDownClass(cls):
        cls.srv.stop()

    def test_models_and_health(self):
        ids = [m.id for m in self.client.models.list().data]
        self.assertEqual(ids, ["chat-model"])
        st, body = self.srv.get("/health")
        self.assertEqual((st, json.loads(body)["status"]), (200, "ok"))

    def test_chat_nonstream_and_stream_agree(self):
        text, finish, usage = chat_once(self.client, "Hello there, how are you?")
        self.assertIsInstance(text, str)
        self.assertIn(finish, ("stop", "length"))
        self.assertGreater(usage.prompt_tokens, 5)
        self.assertLessEqual(usage.completion_tokens, 24)
        self.assertEqual(usage.total_tokens, usage.prompt_tokens + usage.completion_tokens)
        s_text, s_finish, _ = chat_once(self.client, "Hello there, how are you?", stream=True)
        self.assertEqual(s_text, text)
        self.assertEqual(s_finish, finish)

    def test_completions_and_stop(self):
        r = self.client.completions.create(model="chat-model", prompt="The quick brown fox", max_tokens=20, temperature=0)
        full = r.choices[0].text
        self.assertEqual(r.object, "text_completion")
        self.assertGreater(r.usage.prompt_tokens, 0)
        streamed = "".join(c.choices[0].text for c in self.client.completions.create(
            model="chat-model", prompt="The quick brown fox", max_tokens=20, temperature=0, stream=True) if c.choices)
        self.assertEqual(streamed, full)
        if len(full) > 6:
            stop = full[3:6]
            r2 = self.client.completions.create(model="chat-model", prompt="The quick brown fox", max_tokens=20,
                                                temperature=0, stop=[stop])
            self.assertEqual(r2.choices[0].finish_reason, "stop")
            self.assertEqual(r2.choices[0].text, full[:full.index(stop)])

    def test_seeded_sampling_is_reproducible(self):
        kw = dict(model="chat-model", messages=[{"role": "user", "content": "Tell me a story"}], max_tokens=16,
                  temperature=0.9, top_p=0.95, seed=1234)
        a = self.client.chat.completions.create(**kw).choices[0].message.content
        b = self.client.chat.completions.create(**kw).choices[0].message.content
        self.assertEqual(a, b)

    def test_concurrent_requests_equal_sequential(self):
        prompts = [f"Question number {i}: what is {i} plus {i * 3}?" for i in range(8)]
        sequential = [chat_once(self.client, p)[0] for p in prompts]
        with concurrent.futures.ThreadPoolExecutor(8) as ex:
            concurrent_ = list(ex.map(lambda p: chat_once(self.client, p)[0], prompts))
        self.assertEqual(concurrent_, sequential)
        with concurrent.futures.ThreadPoolExecutor(8) as ex:
            streamed = list(ex.map(lambda p: chat_once(self.client, p, stream=True)[0], prompts))
        self.assertEqual(streamed, sequential)

    def test_bad_requests_get_4xx_and_the_server_survives(self):
        cases = [
            (b"{not json", 400, None),
            ({"model": "x"}, 400, "messages"),
            ({"messages": "hello"}, 400, "messages"),
            ({"messages": [{"content": "no role"}]}, 400, None),
            ({"messages": [{"role": "user", "content": "hi"}], "temperature": "hot"}, 400, "temperature"),
            ({"messages": [{"role": "user", "content": "hi"}], "max_tokens": -5}, 400, "max_tokens"),
            ({"messages": [{"role": "user", "content": "hi"}], "stream": "yes"}, 400, "stream"),
            ({"messages": [{"role": "user", "content": "hi"}], "stop": [1, 2]}, 400, "stop"),
            ({"messages": [{"role": "user", "content": "hi"}], "n": 3}, 400, "n"),
            # a content part whose "type" is not a string (was a 500 from the JSON library; found by a random-body run)
            ({"messages": [{"role": "user", "content": [{"type": {"a": 1}, "text": "x"}]}]}, 400, "messages[0].content"),
            ({"messages": [{"role": "user", "content": "word " * 2000}]}, 400, "messages"),
        ]
        for body, status, param in cases:
            st, data = self.srv.post("/v1/chat/completions", body)
            self.assertEqual(st, status, (body, data))
            err = json.loads(data)["error"]
            self.assertTrue(err["message"])
            if param:
                self.assertEqual(err["param"], param, err)
        st, data = self.srv.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "word " * 2000}]})
        self.assertEqual(json.loads(data)["error"]["code"], "context_length_exceeded")
        st, data = self.srv.post("/v1/completions", {"prompt": 42})
        self.assertEqual(st, 400)
        # Deeply nested JSON (it once overflowed the stack and killed the server), in an unknown key, in the
        # content and in tools; brackets inside a string do not count.
        deep = b"[" * 100000 + b"]" * 100000
        for body in (b'{"messages": [{"role": "user", "content": "hi", "x": ' + deep + b"}]}",
                     b'{"messages": [{"role": "user", "content": ' + deep + b"}]}",
                     b'{"messages": [{"role": "user", "content": "hi"}], "tools": ' + deep + b"}"):
            st, data = self.srv.post("/v1/chat/completions", body)
            self.assertEqual(st, 400, data[:200])
            self.assertIn("deeper than 128 levels", json.loads(data)["error"]["message"])
        st, data = self.srv.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "[" * 150}],
                                                          "max_tokens": 2})
        self.assertEqual(st, 200, data[:200])
        st, data = self.srv.post("/v1/chat/completions", b"{" + b" " * (5 * 1024 * 1024) + b"}")
        self.assertEqual(st, 413)
        st, data = self.srv.get("/v1/nothing-here")
        self.assertEqual(st, 404)
        self.assertIn("error", json.loads(data))
        with self.assertRaises(openai.BadRequestError):
            self.client.chat.completions.create(model="chat-model", messages=[], max_tokens=4)
        self.assertIsInstance(chat_once(self.client, "still alive?")[0], str)

    def test_metrics(self):
        chat_once(self.client, "count me")
        st, data = self.srv.get("/metrics")
        text = data.decode()
        self.assertEqual(st, 200)
        self.assertIn("strata_requests_total", text)
        self.assertIn("strata_generated_tokens_total", text)
        # The expert tiers: the chat model's experts are used from the mapped checkpoint (tier "ram").
        ram = [l for l in text.splitlines() if l.startswith('strata_expert_uses_total{tier="ram"}')]
        self.assertEqual(len(ram), 1, text)
        self.assertGreater(float(ram[0].split()[-1]), 0)


class SlotTest(unittest.TestCase):
    def test_cancelled_stream_frees_its_slot_and_429_when_full(self):
        srv = Server("--parallel", "1", "--queue", "1", "--max-new", "100000")
        try:
            srv.wait_ready()
            # A long stream that the client abandons after two chunks.
            c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=30)
            c.request("POST", "/v1/completions", body=json.dumps(
                {"prompt": "Once upon a time", "max_tokens": 400, "temperature": 0.8, "seed": 1, "stream": True}),
                headers={"Content-Type": "application/json"})
            r = c.getresponse()
            self.assertEqual(r.status, 200)
            r.fp.readline()
            r.fp.readline()
            c.sock.shutdown(socket.SHUT_RDWR)
            c.close()
            # The only slot must come free: a new request completes well before the abandoned one would have.
            t0 = time.time()
            out = srv.client().completions.create(model="chat-model", prompt="Hi", max_tokens=4, temperature=0)
            self.assertTrue(out.choices)
            self.assertLess(time.time() - t0, 20)
            st, data = srv.get("/metrics")
            cancelled = [l for l in data.decode().splitlines() if l.startswith("strata_requests_cancelled_total")]
            self.assertTrue(cancelled and float(cancelled[0].split()[1]) >= 1, cancelled)
            # One decoding, one queued: the others get 429 while the server keeps working.
            body = {"prompt": "Tell me everything", "max_tokens": 300, "temperature": 0.7, "seed": 3}
            with concurrent.futures.ThreadPoolExecutor(6) as ex:
                statuses = list(ex.map(lambda _: srv.post("/v1/completions", body)[0], range(6)))
            self.assertIn(429, statuses)
            self.assertIn(200, statuses)
        finally:
            srv.stop()

    def test_queue_zero_still_serves_free_slots(self):
        srv = Server("--parallel", "2", "--queue", "0")
        try:
            srv.wait_ready()
            out = srv.client().completions.create(model="chat-model", prompt="Hi", max_tokens=3, temperature=0)
            self.assertTrue(out.choices)
        finally:
            srv.stop()

    def test_bad_model_folder_exits_instead_of_hanging(self):
        port = free_port()
        r = subprocess.run([ARGS.bin, "serve", "--model", "/nonexistent/model", "--port", str(port)], capture_output=True,
                           timeout=30)
        self.assertEqual(r.returncode, 1)
        self.assertIn(b"not a model directory", r.stderr)

    def test_api_key_and_loading(self):
        srv = Server("--api-key", "sekret", env={"STRATA_SERVE_TEST_LOAD_DELAY_MS": "1500"})
        try:
            # The port answers before the model is loaded: 503 with a JSON error, not a refused connection.
            t0 = time.time()
            while True:
                try:
                    st, data = srv.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]},
                                        {"Authorization": "Bearer sekret"})
                    break
                except OSError:
                    self.assertLess(time.time() - t0, 10)
                    time.sleep(0.02)
            self.assertEqual(st, 503, data)
            self.assertEqual(json.loads(data)["error"]["code"], "model_loading")
            srv.wait_ready()
            with self.assertRaises(openai.AuthenticationError):
                srv.client("wrong").chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
            out = srv.client("sekret").chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}],
                                                               max_tokens=3, temperature=0)
            self.assertTrue(out.choices)
        finally:
            srv.stop()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--bin", required=True)
    p.add_argument("--model", required=True)
    ARGS, rest = p.parse_known_args()
    res = unittest.main(argv=[sys.argv[0]] + rest, exit=False, verbosity=2).result
    failed = len(res.failures) + len(res.errors)
    print(f"{res.testsRun - failed} passed, {failed} failed")
    sys.exit(1 if failed else 0)
