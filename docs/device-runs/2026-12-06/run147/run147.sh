#!/usr/bin/env bash
# run147: the persistent layer kernel's tiles in SM order (STRATA_CUDA_LAYER_SM_ORDER=1: each SM's blocks take a
# contiguous range of gate/up tiles, one expert's, so they share its B in L1; uncommitted): the layer
# test cases; A/B against the default, full card, then (an H100) the stand-in with 52 SMs held.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT0=$OUT
name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "GPU: $name"
V='- STRATA_CUDA_LAYER_SM_ORDER=1'
OUT=$OUT0/full TESTS=1 TEST_CASES='*layer kernel*' PASSES=2 VARIANTS="$V" bash tools/device/layer_ab.sh > /dev/null 2>&1
cut -c1-330 $OUT0/full/summary.txt
case "$name" in
  *H100*)
    OUT=$OUT0/standin TESTS=0 PASSES=2 VARIANTS="$V" BENCH_ARGS='--layer --quick --rounds 5 --reserve-sms 52' \
      bash tools/device/layer_ab.sh > /dev/null 2>&1
    echo "== stand-in (52 SMs held)"; cut -c1-330 $OUT0/standin/summary.txt ;;
esac
