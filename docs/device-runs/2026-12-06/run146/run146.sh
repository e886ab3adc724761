#!/usr/bin/env bash
# run146: 8-warp layer blocks (STRATA_CUDA_LAYER_WARPS=8: gate/up tiles of 32 rows and down tiles of 128, every
# warp's work as in a 4-warp block, so each B line a block loads serves twice the weights; uncommitted): the layer
# test cases; A/B against the default, full card, then (an H100) the stand-in with 52 SMs held.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT0=$OUT
name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "GPU: $name"
V='- STRATA_CUDA_LAYER_WARPS=8'
OUT=$OUT0/full TESTS=1 TEST_CASES='*layer kernel*' PASSES=2 VARIANTS="$V" bash tools/device/layer_ab.sh > /dev/null 2>&1
cut -c1-330 $OUT0/full/summary.txt
case "$name" in
  *H100*)
    OUT=$OUT0/standin TESTS=0 PASSES=2 VARIANTS="$V" BENCH_ARGS='--layer --quick --rounds 5 --reserve-sms 52' \
      bash tools/device/layer_ab.sh > /dev/null 2>&1
    echo "== stand-in (52 SMs held)"; cut -c1-330 $OUT0/standin/summary.txt ;;
esac
