#!/usr/bin/env bash
# run130: 47ac11f (one fence per gate/up tile, persistent at 1 n-tile for launches of >= 2 tiles per resident
# block): test_cuda; layer A/B against STRATA_CUDA_LAYER_PERSISTENT=0 (a block per tile, same fences); every
# suite of bench_cuda --quick twice; the timeline with tile records (8 and 32 experts).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT0=$OUT
OUT=$OUT0/ab TESTS=1 PASSES=3 VARIANTS='- STRATA_CUDA_LAYER_PERSISTENT=0' bash tools/device/layer_ab.sh > /dev/null 2>&1
export LD_LIBRARY_PATH="$PWD/build-cuda/bundle/lib"
for k in 1 2; do
  timeout 200 build-cuda/bundle/bin/bench_cuda --quick --rounds 3 > $OUT0/bench_$k.log 2>&1
  echo "== bench_cuda --quick --rounds 3 ($k): exit $?"
done
OUT=$OUT0/tl CSV=1 TESTS=0 ROUNDS=3 bash tools/device/layer_timeline.sh > /dev/null 2>&1
cut -c1-600 $OUT0/ab/summary.txt; grep -v "in flight per\|read rate per" $OUT0/tl/summary.txt | cut -c1-300
for k in 1 2; do grep -E "^exact tensor cores \(default\)|^W4A16" $OUT0/bench_$k.log; done
