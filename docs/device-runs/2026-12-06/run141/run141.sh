#!/usr/bin/env bash
# run141: two row tiles per warp in the gate/up tiles only (STRATA_CUDA_LAYER_WARP_ROWS=32/16; uncommitted),
# lean and B-ahead, against the default and the timing-only bound STRATA_CUDA_EXPERIMENT=1 (n-tile 1 without
# its own B loads). Full card, then (an H100) the stand-in with 52 SMs held.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT0=$OUT
name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "GPU: $name"
V='- STRATA_CUDA_LAYER_WARP_ROWS=32/16 STRATA_CUDA_LAYER_WARP_ROWS=32/16,STRATA_CUDA_LAYER_LEAN=0 STRATA_CUDA_EXPERIMENT=1'
OUT=$OUT0/full TESTS=1 TEST_CASES='*layer kernel*' PASSES=2 VARIANTS="$V" bash tools/device/layer_ab.sh > /dev/null 2>&1
cut -c1-330 $OUT0/full/summary.txt
case "$name" in
  *H100*)
    OUT=$OUT0/standin TESTS=0 PASSES=2 VARIANTS="$V" BENCH_ARGS='--layer --quick --rounds 5 --reserve-sms 52' \
      bash tools/device/layer_ab.sh > /dev/null 2>&1
    echo "== stand-in (52 SMs held)"; cut -c1-330 $OUT0/standin/summary.txt ;;
esac
