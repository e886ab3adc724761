#!/usr/bin/env python3
# Where a layer launch's time goes, from `bench_cuda --timeline --timeline-csv FILE` (the layer kernel's raw tile records).
"""Reads the tile records of every timed launch and prints, per rows-per-expert count (medians over launches):

  - the phases: the preparation's lead, the first inputs, when the tickets ran out, the last tile's end;
  - an estimated read rate per microsecond (each tile's bytes spread evenly over its begin..end) against the peak
    given by --peak-gbs, and how many bytes were read at below --full of it (the launch's underused time);
  - the down tiles' waits for their inputs, split into waits that began before their item's last gate/up tile had
    ended (a dependency) and after (the readiness check's own latency);
  - the gate/up tiles' count (stored -> end: fence, count, any encoding), the longest of each 64-row group's
    (4 tiles of 16 rows, or 2 of 32) apart;
  - the tail: tiles still running after the last ticket was taken.

Usage: tools/timeline_report.py tiles.csv [--peak-gbs 3350] [--gu-bytes B] [--dn-bytes B]
The byte counts and --gu-tiles-per-item default to a GLM-5.2 layer's Q4_G64 tiles of 16 gate/up rows (2 x 16 rows
x 6144 columns) and 64 down rows (x 2048 columns), with their group scales; records of larger tiles
(STRATA_CUDA_LAYER_WARP_ROWS: their gu_rows and dn_rows columns) scale them.
"""
import argparse
import csv
import statistics
import sys
from collections import defaultdict


def median(v):
    return statistics.median(v) if v else 0.0


def analyse(tiles, gu_bytes, dn_bytes, peak_gbs, full, bin_us, gu_per_item):
    """tiles: the records of one launch (gu_per_item gate/up tiles of 16 rows per expert; the bytes of 16-row
    gate/up and 64-row down tiles, scaled by the records' tile rows). Returns a dict of figures (us, MB)."""
    r = {}
    gu_rows, dn_rows = tiles[0]["gu_rows"], tiles[0]["dn_rows"]
    gu_bytes, dn_bytes = gu_bytes * gu_rows // 16, dn_bytes * dn_rows // 64
    gu_per_item = max(1, gu_per_item * 16 // gu_rows)
    group = max(1, 64 // gu_rows)  # gate/up tiles per 64-row group of h
    t_end = max(t["end"] for t in tiles)
    t_out = max(t["begin"] for t in tiles)
    prep_first = tiles[0]["prep_first"]
    r["prep_lead"] = -prep_first / 1e3
    r["span"] = t_end / 1e3
    r["device"] = (t_end - prep_first) / 1e3
    r["out"] = t_out / 1e3
    first = [t["inputs"] for t in tiles if t["begin"] < 1000 and t["inputs"] > 0]
    r["inputs_first"] = min(first) / 1e3 if first else 0.0
    # Estimated read rate: each tile's bytes evenly over [begin, end] (its first batches are requested at begin).
    nbins = int(t_end / 1e3 / bin_us) + 2
    rate = [0.0] * nbins  # bytes per bin
    for t in tiles:
        b = gu_bytes if t["kind"] == "gu" else dn_bytes
        lo, hi = t["begin"] / 1e3, max(t["end"], t["begin"] + 1) / 1e3
        per_us = b / (hi - lo)
        k = int(lo / bin_us)
        while k * bin_us < hi:
            a, z = max(lo, k * bin_us), min(hi, (k + 1) * bin_us)
            if z > a:
                rate[k] += per_us * (z - a)
            k += 1
    peak_bytes_per_bin = peak_gbs * 1e3 * bin_us  # GB/s = 1e3 bytes/us
    r["rate"] = [v / peak_bytes_per_bin for v in rate]
    total = sum(rate)
    # time below `full` of the peak, and what the launch would take at `full` throughout
    r["below_us"] = sum(bin_us for v in r["rate"][: int(t_end / 1e3 / bin_us) + 1] if v < full)
    r["at_full_us"] = total / (peak_gbs * 1e3 * full)
    r["mb"] = total / 1e6
    # Down tiles: their wait (begin -> inputs), split by whether their item's gate/up tiles had all ended.
    gu_end = defaultdict(int)
    n_gu = sum(1 for t in tiles if t["kind"] == "gu")
    per_item = gu_per_item
    items = max(1, n_gu // per_item)
    for t in tiles:
        if t["kind"] == "gu":
            gu_end[t["ticket"] // per_item] = max(gu_end[t["ticket"] // per_item], t["end"])
    dn = [t for t in tiles if t["kind"] == "dn" and t["inputs"] > 0]
    n_dn_per_item = max(1, len(dn) // items)
    dep, check = [], []
    for t in dn:
        item = (t["ticket"] - n_gu) // n_dn_per_item
        w = (t["inputs"] - t["begin"]) / 1e3
        (dep if t["begin"] < gu_end[item] else check).append(w)
    r["dn_dep_n"], r["dn_dep_sum"], r["dn_dep_med"] = len(dep), sum(dep), median(dep)
    r["dn_check_n"], r["dn_check_sum"], r["dn_check_med"] = len(check), sum(check), median(check)
    # Gate/up tiles' count (stored -> end: the fence, the count, any encoding), the longest of each 64-row
    # group's tiles (the one that encodes, by default) apart from the others.
    groups = defaultdict(list)
    for t in tiles:
        if t["kind"] == "gu" and t["stored"] > 0:
            groups[t["ticket"] // group].append((t["end"] - t["stored"]) / 1e3)
    last4, rest4 = [], []
    for v in groups.values():
        v.sort()
        last4.append(v[-1])
        rest4 += v[:-1]
    r["gu_count"], r["gu_count_last"] = median(rest4), median(last4)
    gu_t = [(t["end"] - t["inputs"]) / 1e3 for t in tiles if t["kind"] == "gu" and t["inputs"] > 0]
    dn_t = [(t["end"] - t["inputs"]) / 1e3 for t in dn]
    r["tile_gu"], r["tile_dn"] = median(gu_t), median(dn_t)
    # The tail: tiles ending after the last ticket was taken.
    tail = [t for t in tiles if t["end"] > t_out]
    r["tail_n"] = len(tail)
    last = max(tiles, key=lambda t: t["end"])
    r["tail_last_dur"] = (last["end"] - last["begin"]) / 1e3
    # Gaps in a block's stream: from a tile's end to the same block's next tile's begin.
    by_block = defaultdict(list)
    for t in tiles:
        by_block[(t["sm"], t["block"])].append(t)
    gaps = []
    for v in by_block.values():
        v.sort(key=lambda t: t["begin"])
        gaps += [(b["begin"] - a["end"]) / 1e3 for a, b in zip(v, v[1:])]
    r["gap_med"], r["gap_max"] = median(gaps), max(gaps) if gaps else 0.0
    r["blocks"] = len(by_block)
    return r


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv")
    ap.add_argument("--peak-gbs", type=float, default=3350.0, help="the card's peak (H100 SXM 3350, H200 4800)")
    ap.add_argument("--gu-bytes", type=int, default=2 * 16 * 6144 // 2 + 2 * 16 * 96 * 4)
    ap.add_argument("--dn-bytes", type=int, default=64 * 2048 // 2 + 64 * 32 * 4)
    ap.add_argument("--gu-tiles-per-item", type=int, default=128, help="per expert, of 16 rows")
    ap.add_argument("--full", type=float, default=0.85, help="the read rate counted as full, of the peak")
    ap.add_argument("--bin-us", type=float, default=1.0)
    ap.add_argument("--profile", action="store_true", help="print each rows count's median rate profile")
    args = ap.parse_args()
    launches = defaultdict(list)
    with open(args.csv) as f:
        for row in csv.DictReader(f):
            t = {
                "ticket": int(row["ticket"]),
                "kind": row["kind"],
                "sm": int(row["sm"]),
                "block": int(row["block"]),
                "begin": int(row["begin_ns"]),
                "inputs": int(row["inputs_ns"]),
                "end": int(row["end_ns"]),
                "stored": int(row.get("stored_ns") or 0),
                "prep_first": int(row["prep_first_ns"]),
                "gu_rows": int(row.get("gu_rows") or 16),
                "dn_rows": int(row.get("dn_rows") or 64),
            }
            launches[(int(row["rows"]), int(row["pass"]), int(row["layer"]))].append(t)
    if not launches:
        sys.exit("timeline_report: no tile records in " + args.csv)
    by_rows = defaultdict(list)
    for (rows, _, _), tiles in sorted(launches.items()):
        by_rows[rows].append(
            analyse(tiles, args.gu_bytes, args.dn_bytes, args.peak_gbs, args.full, args.bin_us, args.gu_tiles_per_item))
    keys = [
        ("device", "device us"), ("span", "tiles' span"), ("prep_lead", "prep lead"),
        ("inputs_first", "1st inputs"), ("out", "tickets out"), ("tail_last_dur", "last tile"),
        ("tail_n", "tail tiles"), ("at_full_us", f"at {args.full:.0%} us"), ("below_us", "us below"),
        ("tile_gu", "tile gu"), ("tile_dn", "tile dn"), ("gu_count", "gu count"),
        ("gu_count_last", "count, max/4"), ("dn_dep_n", "dn dep n"), ("dn_dep_med", "dep wait"),
        ("dn_check_n", "dn check n"), ("dn_check_med", "check wait"), ("gap_med", "gap med"),
        ("gap_max", "gap max"), ("blocks", "blocks"),
    ]
    print(f"{len(launches)} launches; medians per rows count (us unless said; peak {args.peak_gbs:.0f} GB/s)")
    print(f"{'':>14}" + "".join(f"{rows:>10}" for rows in sorted(by_rows)))
    for k, name in keys:
        print(f"{name:>14}" + "".join(f"{median([r[k] for r in by_rows[rows]]):>10.2f}" for rows in sorted(by_rows)))
    if args.profile:
        for rows in sorted(by_rows):
            rs = by_rows[rows]
            n = min(len(r["rate"]) for r in rs)
            prof = [median([r["rate"][k] for r in rs]) for k in range(n)]
            print(f"rows {rows}: read rate per {args.bin_us:g} us, % of peak: " + " ".join(f"{100 * v:.0f}" for v in prof))


if __name__ == "__main__":
    main()
