#!/usr/bin/env bash
# run104: 532233a (staged batches) + a local experiment: STRATA_CUDA_PREP_CARVEOUT=pct set the preparation
# kernel's preferred carveout (cudaFuncSetAttribute), and the layer kernel asked the shared-memory opt-in whenever
# it had dynamic shared memory (so that N = 5 launches). Does the first wave's slow ramp with staged batches come
# from the SMs switching their L1/shared split next to the preparation kernel, or from the bulk copies' issue?
# Full card.
set -u
OUT0=$OUT
S=STRATA_CUDA_LAYER_STAGE
P=STRATA_CUDA_PREP_CARVEOUT=100
OUT=$OUT0/full TESTS=0 PASSES=2 VARIANTS="- $P ${S}_DN=4 ${S}_DN=4,$P $S=4,$P $S=5 ${S}_DN=2,$P" tools/device/layer_ab.sh > /dev/null 2>&1
cut -c1-330 "$OUT0/full/summary.txt"
OUT=$OUT0/tl TESTS=0 EXPERTS2= VARIANTS="- ${S}_DN=4 ${S}_DN=4,$P $S=4,$P" tools/device/layer_timeline.sh > /dev/null 2>&1
grep -h -B1 -A5 "^rows" $OUT0/tl/summary.txt | cut -c1-250 | head -60
