#!/usr/bin/env bash
# run127: lean fences (STRATA_CUDA_LAYER_FENCES=lean: counts by one thread per block, acquire-release;
# relaxed polls ending in one acquire) against the default (__threadfence in every thread, acquiring
# polls): test_cuda's layer-kernel cases (both in it), the layer A/B (3 passes), timelines with tile records.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT0=$OUT
OUT=$OUT0/ab TEST_CASES='*layer kernel*' TESTS=1 PASSES=3 VARIANTS='- STRATA_CUDA_LAYER_FENCES=lean' \
  bash tools/device/layer_ab.sh > /dev/null 2>&1
OUT=$OUT0/tl CSV=1 TESTS=0 ROUNDS=3 EXPERTS2= VARIANTS='- STRATA_CUDA_LAYER_FENCES=lean' \
  bash tools/device/layer_timeline.sh > /dev/null 2>&1
cat $OUT0/ab/summary.txt; grep -v "in flight per\|read rate per" $OUT0/tl/summary.txt | cut -c1-300
grep "read rate per" $OUT0/tl/summary.txt | cut -c1-330
