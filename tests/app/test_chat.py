#!/usr/bin/env python3
# strata chat as a user drives it: a turn streams an answer, Ctrl-C (SIGINT) stops that answer but not the
# program, /stats and /reset work, and strata run prints the prompt and its completion.
import argparse, json, os, shutil, signal, subprocess, sys, tempfile, time, unittest

ARGS = None


def long_context_model(tmp):
    # The chat fixture with a longer context, so an answer can run long enough to be interrupted.
    d = os.path.join(tmp, "model")
    shutil.copytree(ARGS.model, d)
    cfg = json.load(open(os.path.join(d, "config.json")))
    cfg["max_position_embeddings"] = 6000
    json.dump(cfg, open(os.path.join(d, "config.json"), "w"))
    return d


class ChatTest(unittest.TestCase):
    def test_ctrl_c_stops_the_answer_not_the_program(self):
        with tempfile.TemporaryDirectory() as tmp:
            model = long_context_model(tmp)
            p = subprocess.Popen([ARGS.bin, "chat", "--model", model, "--max-new", "5000", "--temperature", "0.8",
                                  "--seed", "1", "--threads", "1"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE)
            os.set_blocking(p.stdout.fileno(), False)
            p.stdin.write(b"Tell me a very long story\n")
            p.stdin.flush()
            got = b""
            t0 = time.time()
            while not got and time.time() - t0 < 20:
                chunk = p.stdout.read()
                if chunk:
                    got += chunk
                time.sleep(0.005)
            self.assertTrue(got, "no answer started")
            p.send_signal(signal.SIGINT)
            time.sleep(0.3)
            self.assertIsNone(p.poll(), "Ctrl-C ended the program")
            out, err = p.communicate(b"/stats\n/reset\nand again\n/exit\n", timeout=60)
            self.assertEqual(p.returncode, 0, err.decode(errors="replace"))
            err = err.decode(errors="replace")
            self.assertIn("cancelled", err)          # the interrupted turn's summary
            self.assertIn("KV cache:", err)          # /stats
            self.assertIn("conversation cleared", err)  # /reset

    def test_run_streams_prompt_and_completion(self):
        r = subprocess.run([ARGS.bin, "run", "--model", ARGS.model, "--prompt", "Hello, world", "--max-new", "12",
                            "--temperature", "0", "--stats", "json"], capture_output=True, timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertTrue(r.stdout.startswith(b"Hello, world"))
        stats = json.loads(r.stderr.decode().strip().splitlines()[-1])
        self.assertEqual(stats["new_tokens"], 12)
        self.assertEqual(stats["finish_reason"], "length")
        again = subprocess.run([ARGS.bin, "run", "--model", ARGS.model, "--prompt", "Hello, world", "--max-new", "12",
                                "--temperature", "0"], capture_output=True, timeout=60)
        self.assertEqual(again.stdout, r.stdout)
        bad = subprocess.run([ARGS.bin, "run", "--model", ARGS.model, "--prompt", "x", "--top-p", "7"],
                             capture_output=True, timeout=60)
        self.assertEqual(bad.returncode, 1)
        self.assertIn(b"top_p 7 is outside (0, 1]", bad.stderr)
        nomodel = subprocess.run([ARGS.bin, "run", "--model", os.path.join(ARGS.fixtures, "qwen3_moe-tiny"), "--prompt", "x"],
                                 capture_output=True, timeout=60)
        self.assertEqual(nomodel.returncode, 1)
        self.assertIn(b"no tokenizer.json", nomodel.stderr)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--fixtures", required=True)
    ARGS, rest = ap.parse_known_args()
    res = unittest.main(argv=[sys.argv[0]] + rest, exit=False, verbosity=2).result
    failed = len(res.failures) + len(res.errors)
    print(f"{res.testsRun - failed} passed, {failed} failed")
    sys.exit(1 if failed else 0)
