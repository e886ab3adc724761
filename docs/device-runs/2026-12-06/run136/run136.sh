#!/usr/bin/env bash
# run136: what the second n-tile (3-4 rows) costs the layer kernel, timing only (uncommitted experiment,
# STRATA_CUDA_EXPERIMENT=1: n-tile 1 reuses n-tile 0's B values and multipliers, its mma kept; =2: also no mma
# for n-tile 1; wrong results for tokens 2-3). Full card, then (an H100) the H200 stand-in with 52 SMs held.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT0=$OUT
name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "GPU: $name"
V='- STRATA_CUDA_EXPERIMENT=1 STRATA_CUDA_EXPERIMENT=2'
OUT=$OUT0/full TESTS=0 PASSES=2 VARIANTS="$V" bash tools/device/layer_ab.sh > /dev/null 2>&1
cut -c1-420 $OUT0/full/summary.txt
case "$name" in
  *H100*)
    OUT=$OUT0/standin TESTS=0 PASSES=2 VARIANTS="$V" BENCH_ARGS='--layer --quick --rounds 5 --reserve-sms 52' \
      bash tools/device/layer_ab.sh > /dev/null 2>&1
    echo "== stand-in (52 SMs held)"; cut -c1-420 $OUT0/standin/summary.txt ;;
  *)
    OUT=$OUT0/tl CSV=1 TESTS=1 ROUNDS=3 bash tools/device/layer_timeline.sh > /dev/null 2>&1
    grep -v "in flight per\|read rate per" $OUT0/tl/summary.txt | cut -c1-300 ;;
esac
