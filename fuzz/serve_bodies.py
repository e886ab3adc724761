# Random request bodies against a real `strata serve`: every answer must be 200, 400 (with a JSON error message),
# 413 or 429, and the server must stay up. Usage: python3 fuzz/serve_bodies.py BIN MODEL_DIR COUNT [SEED]
# (e.g. build/bin/strata tests/fixtures/chat-model 1500 1). Prints each bad answer with its body, then a count.
import json, random, subprocess, sys, time, urllib.request

BIN, MODEL = sys.argv[1], sys.argv[2]
N = int(sys.argv[3])
port = 18500
p = subprocess.Popen([BIN, "serve", "--model", MODEL, "--port", str(port)], stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL)
for _ in range(100):
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1); break
    except Exception: time.sleep(0.2)
rng = random.Random(int(sys.argv[4]) if len(sys.argv) > 4 else 1)
def rstr():
    pool = ["", "hi", "user", "assistant", "system", "tool", "function", "developer", "\u0000", "\ud7ff", "é€😀", "<|im_end|>", "<think>", "{{ x }}", "{% if %}", "a" * rng.randint(0, 3000), "\n" * 5, "[" * 50]
    return rng.choice(pool) if rng.random() < 0.7 else "".join(chr(rng.randint(1, 0x2FFF)) for _ in range(rng.randint(0, 30)))
def rval(d=0):
    r = rng.random()
    if d > 6 or r < 0.3: return rstr()
    if r < 0.4: return rng.choice([0, 1, -1, 2**31, 2**63 - 1, -2**63, 10**30, 0.5, -1e308, 1e308, float("nan") if rng.random() < 0.1 else 3])
    if r < 0.5: return rng.choice([True, False, None])
    if r < 0.75: return [rval(d + 1) for _ in range(rng.randint(0, 4))]
    return {rstr() if rng.random() < 0.3 else rng.choice(KEYS): rval(d + 1) for _ in range(rng.randint(0, 5))}
KEYS = ["role", "content", "name", "tool_calls", "tool_call_id", "type", "text", "function", "arguments", "parameters", "properties", "reasoning_content", "image_url"]
TOP = ["model", "messages", "prompt", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "seed", "stop", "stream", "stream_options", "n", "tools", "tool_choice", "logprobs", "presence_penalty", "frequency_penalty", "chat_template_kwargs", "enable_thinking", "user", "response_format"]
def message():
    m = {"role": rng.choice(["user", "assistant", "system", "tool", rstr()]), "content": rval() if rng.random() < 0.4 else rstr()}
    for _ in range(rng.randint(0, 2)): m[rng.choice(KEYS)] = rval()
    return m
def body():
    b = {}
    if rng.random() < 0.9: b["messages"] = [message() for _ in range(rng.randint(0, 4))] if rng.random() < 0.9 else rval()
    for _ in range(rng.randint(0, 5)): b[rng.choice(TOP)] = rval()
    if rng.random() < 0.8: b["max_tokens"] = rng.randint(1, 3)
    if "stream" in b and rng.random() < 0.5: b["stream"] = rng.choice([True, False])
    return b
bad = 0
for i in range(N):
    b = body()
    path = rng.choice(["/v1/chat/completions", "/v1/chat/completions", "/v1/completions"])
    if path == "/v1/completions": b["prompt"] = rval() if rng.random() < 0.3 else rstr()
    data = json.dumps(b, allow_nan=True).encode("utf-8", "surrogatepass")
    if rng.random() < 0.05:  # invalid UTF-8 inside a string
        data = data.replace(b'"hi"', b'"h\xff\xfei"')
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, headers={"Content-Type": "application/json"})
    try:
        r = urllib.request.urlopen(req, timeout=60); st = r.status; out = r.read()
    except urllib.error.HTTPError as e:
        st = e.code; out = e.read()
    except Exception as e:
        print("DEAD/EXC", i, repr(e), data[:500]); bad += 1
        if p.poll() is not None: print("server exited", p.returncode); break
        continue
    if st not in (200, 400, 413, 429):
        print("STATUS", st, out[:300], data[:500]); bad += 1
    elif st == 400:
        try: json.loads(out)["error"]["message"]
        except Exception: print("BAD 400 BODY", out[:200]); bad += 1
p.terminate(); p.wait()
print("done", N, "bad", bad)
