#!/usr/bin/env bash
# run128: the final code of runs 125-127 (one fence per gate/up tile, the persistent layer kernel at every n-tile
# count): test_cuda; layer A/B against STRATA_CUDA_LAYER_PERSISTENT=auto (a block per tile at 1 n-tile, the old
# default's mode); every suite of bench_cuda --quick in both settings; the timeline with tile records.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT0=$OUT
OUT=$OUT0/ab TESTS=1 PASSES=3 VARIANTS='- STRATA_CUDA_LAYER_PERSISTENT=auto' bash tools/device/layer_ab.sh > /dev/null 2>&1
export LD_LIBRARY_PATH="$PWD/build-cuda/bundle/lib"
for v in new auto; do
  if [ $v = new ]; then e=(); else e=(STRATA_CUDA_LAYER_PERSISTENT=auto); fi
  timeout 200 env "${e[@]}" build-cuda/bundle/bin/bench_cuda --quick --rounds 3 > $OUT0/bench_$v.log 2>&1
  echo "== bench_cuda --quick --rounds 3 [$v]: exit $?"
done
OUT=$OUT0/tl CSV=1 TESTS=0 ROUNDS=3 EXPERTS2=32 bash tools/device/layer_timeline.sh > /dev/null 2>&1
cat $OUT0/ab/summary.txt | cut -c1-700; grep -v "in flight per\|read rate per" $OUT0/tl/summary.txt | cut -c1-300

