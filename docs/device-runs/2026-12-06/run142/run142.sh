#!/usr/bin/env bash
# run142: test_cuda (every case; the layer kernel also with two row tiles per warp in the gate/up tiles, the
# down tiles or both); layer A/B of STRATA_CUDA_LAYER_WARP_ROWS=32/16, 16/32 and 32 against the default (one
# staging buffer in the layer kernel), full card, then (an H100) the stand-in with 52 SMs held.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT0=$OUT
name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "GPU: $name"
V='- STRATA_CUDA_LAYER_WARP_ROWS=32/16 STRATA_CUDA_LAYER_WARP_ROWS=16/32 STRATA_CUDA_LAYER_WARP_ROWS=32'
OUT=$OUT0/full TESTS=1 PASSES=2 VARIANTS="$V" bash tools/device/layer_ab.sh > /dev/null 2>&1
cut -c1-330 $OUT0/full/summary.txt
case "$name" in
  *H100*)
    OUT=$OUT0/standin TESTS=0 PASSES=2 VARIANTS="$V" BENCH_ARGS='--layer --quick --rounds 5 --reserve-sms 52' \
      bash tools/device/layer_ab.sh > /dev/null 2>&1
    echo "== stand-in (52 SMs held)"; cut -c1-330 $OUT0/standin/summary.txt ;;
esac
