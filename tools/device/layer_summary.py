#!/usr/bin/env python3
"""Ranges per variant of layer_ab.sh's summary.txt files: for each variant and mode, the queued µs per row count.

    python3 tools/device/layer_summary.py docs/device-runs/2026-12-06/run151/summary_full.txt [more.txt ...]
    python3 tools/device/layer_summary.py --all summary.txt     # every mode, not only default and tile/block

Reads the "pass N variant M [v]: ... queued: R rows X us (P%) [mode] R rows X us ..." lines (those with the
"[stand-in] " prefix, STANDIN=1, as variants of their own) and prints min-max over the passes, one line per
(variant, mode).
"""
import collections
import re
import sys


def ranges(path, every_mode):
    table = collections.OrderedDict()
    for line in open(path, encoding="utf-8", errors="replace"):
        m = re.match(r"(\[stand-in\] )?pass (\d+) variant (\d+) \[(.*?)\]: .*?queued: (.*)", line)
        if not m:
            continue
        variant, rest = (m.group(1) or "") + m.group(4), m.group(5)  # (STANDIN=1: full card and stand-in apart)
        parts = re.split(r"\[([^\]]+)\] ", rest)
        modes = collections.OrderedDict([("default", parts[0])])
        for i in range(1, len(parts) - 1, 2):
            modes[parts[i]] = modes.get(parts[i], "") + parts[i + 1]
        for mode, text in modes.items():
            if not every_mode and mode not in ("default", "tile/block"):
                continue
            rows = table.setdefault((variant, mode), collections.defaultdict(list))
            for r, us in re.findall(r"(\d+) rows ([\d.]+) us", text):
                rows[int(r)].append(float(us))
    return table


def main(argv):
    every_mode = "--all" in argv
    paths = [a for a in argv if a != "--all"]
    if not paths:
        sys.exit(__doc__)
    for path in paths:
        print("==", path)
        for (variant, mode), rows in ranges(path, every_mode).items():
            cells = "  ".join(f"{r}r {min(x):.1f}-{max(x):.1f}" for r, x in sorted(rows.items()))
            print(f"{variant[:52]:52s} {mode:12s} {cells}")


if __name__ == "__main__":
    main(sys.argv[1:])
