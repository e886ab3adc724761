#!/usr/bin/env bash
# run138: one staging buffer for the layer kernel's gate/up and down tiles (half its shared memory), against
# the old footprint (STRATA_CUDA_EXPERIMENT_SMEM_PAD=4352 bytes of unused dynamic shared memory, uncommitted) and
# 12 KB; two row tiles per warp (WARP_ROWS=32). Full card, then (an H100) the stand-in with 52 SMs held.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT0=$OUT
name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "GPU: $name"
V='- STRATA_CUDA_EXPERIMENT_SMEM_PAD=4352 STRATA_CUDA_EXPERIMENT_SMEM_PAD=12288 STRATA_CUDA_LAYER_WARP_ROWS=32'
OUT=$OUT0/full TESTS=1 TEST_CASES='*layer kernel*' PASSES=2 VARIANTS="$V" bash tools/device/layer_ab.sh > /dev/null 2>&1
cut -c1-330 $OUT0/full/summary.txt
case "$name" in
  *H100*)
    OUT=$OUT0/standin TESTS=0 PASSES=2 VARIANTS="$V" BENCH_ARGS='--layer --quick --rounds 5 --reserve-sms 52' \
      bash tools/device/layer_ab.sh > /dev/null 2>&1
    echo "== stand-in (52 SMs held)"; cut -c1-330 $OUT0/standin/summary.txt ;;
esac
