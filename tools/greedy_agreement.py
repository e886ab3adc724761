#!/usr/bin/env python3
"""How often a non-exact mode changes greedy text: runs `strata run --temperature 0` on each prompt with a
reference config and with each other config, and reports how many continuations are identical and how much of
the reference text each keeps (common prefix). A measurement, not a test.

  tools/greedy_agreement.py [--bin build/bin/strata] [--model DIR] [--max-new 64] [--prompts FILE]
                            REFERENCE.yaml OTHER.yaml [...]

Without --model the bundled strata-nano runs; without --prompts, twenty Python openings (what it was trained
on). A prompts file holds one prompt per line, with \\n for newlines.
"""
import argparse
import subprocess
import sys

DEFAULT_PROMPTS = [
    "def fibonacci(n):", "import os\n\ndef list_files(path):", "class Stack:\n    def __init__(self):",
    "def quicksort(arr):", "for i in range(10):", "def read_json(path):\n    with open(path) as f:",
    "import numpy as np\n\ndef normalize(x):", "def is_prime(n):", "class Point:\n    def __init__(self, x, y):",
    "def merge(a, b):", "try:\n    import yaml\nexcept ImportError:", "def main():\n    args = parse_args()",
    "def binary_search(xs, target):", "async def fetch(session, url):", "def flatten(lst):",
    "with open('data.csv') as f:", "def __repr__(self):", "if __name__ == '__main__':",
    "def count_words(text):", "from collections import defaultdict\n\ndef group_by(items, key):",
]


def continuation(args, config, prompt):
    cmd = [args.bin, "run", "--config", config, "--prompt", prompt, "--max-new", str(args.max_new),
           "--temperature", "0"]
    if args.model:
        cmd += ["--model", args.model]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stderr}")
    return r.stdout


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default="build/bin/strata")
    ap.add_argument("--model")
    ap.add_argument("--max-new", type=int, default=64)
    ap.add_argument("--prompts")
    ap.add_argument("reference")
    ap.add_argument("others", nargs="+")
    args = ap.parse_args()
    prompts = DEFAULT_PROMPTS
    if args.prompts:
        with open(args.prompts, encoding="utf-8") as f:
            prompts = [line.rstrip("\n").replace("\\n", "\n") for line in f if line.strip()]
    ref = [continuation(args, args.reference, p) for p in prompts]
    for other in args.others:
        got = [continuation(args, other, p) for p in prompts]
        kept = []
        for a, b in zip(ref, got):
            n = 0
            while n < min(len(a), len(b)) and a[n] == b[n]:
                n += 1
            kept.append(n / max(len(a), 1))
        same = sum(a == b for a, b in zip(ref, got))
        kept.sort()
        print(f"{other}: {same}/{len(prompts)} continuations identical to {args.reference}; "
              f"reference text kept: median {kept[len(kept) // 2]:.0%}, least {kept[0]:.0%}")


if __name__ == "__main__":
    main()
