#!/usr/bin/env bash
# run137: two 16-row tiles per warp in the layer kernel (STRATA_CUDA_LAYER_WARP_ROWS=32, uncommitted): the
# layer test cases; A/B against the default (and its B-ahead instance at 2 n-tiles), full card, then (an
# H100) the H200 stand-in with 52 SMs held.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT0=$OUT
name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "GPU: $name"
V='- STRATA_CUDA_LAYER_WARP_ROWS=32 STRATA_CUDA_LAYER_WARP_ROWS=32,STRATA_CUDA_LAYER_LEAN=0'
OUT=$OUT0/full TESTS=1 TEST_CASES='*layer kernel*' PASSES=2 VARIANTS="$V" bash tools/device/layer_ab.sh > /dev/null 2>&1
cut -c1-330 $OUT0/full/summary.txt
case "$name" in
  *H100*)
    OUT=$OUT0/standin TESTS=0 PASSES=2 VARIANTS="$V" BENCH_ARGS='--layer --quick --rounds 5 --reserve-sms 52' \
      bash tools/device/layer_ab.sh > /dev/null 2>&1
    echo "== stand-in (52 SMs held)"; cut -c1-330 $OUT0/standin/summary.txt ;;
esac
