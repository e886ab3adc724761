#!/usr/bin/env bash
# run132: the down tiles of the last N tickets asking the L2 for their whole weights as they start
# (STRATA_CUDA_LAYER_TAIL_PREFETCH=N, one cp.async.bulk.prefetch.L2 per tile) against none: the layer A/B
# (2 passes over 5 variants), then the timelines with tile records of none and N = 264.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT0=$OUT
V='- STRATA_CUDA_LAYER_TAIL_PREFETCH=132 STRATA_CUDA_LAYER_TAIL_PREFETCH=264 STRATA_CUDA_LAYER_TAIL_PREFETCH=528 STRATA_CUDA_LAYER_TAIL_PREFETCH=768'
OUT=$OUT0/ab TESTS=0 PASSES=2 VARIANTS="$V" bash tools/device/layer_ab.sh > /dev/null 2>&1
OUT=$OUT0/tl CSV=1 TESTS=0 ROUNDS=3 EXPERTS2= VARIANTS='- STRATA_CUDA_LAYER_TAIL_PREFETCH=264' \
  bash tools/device/layer_timeline.sh > /dev/null 2>&1
cut -c1-330 $OUT0/ab/summary.txt; grep -E "device us|tickets out|last tile|tile dn|==" $OUT0/tl/summary.txt
