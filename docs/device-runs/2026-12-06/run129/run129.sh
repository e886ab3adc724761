#!/usr/bin/env bash
# run129: the projection shape at n = 1, 4 (and the decode suites) with the persistent layer kernel at every
# n-tile count (the default since run127) against STRATA_CUDA_LAYER_PERSISTENT=auto, alternating 3 times.
set -uo pipefail
cd "$(dirname "$0")/../.."
export LD_LIBRARY_PATH="$PWD/build-cuda/bundle/lib"
for k in 1 2 3; do
  for v in new auto; do
    if [ $v = new ]; then e=(); else e=(STRATA_CUDA_LAYER_PERSISTENT=auto); fi
    timeout 200 env "${e[@]}" build-cuda/bundle/bin/bench_cuda --decode --rounds 5 > $OUT/decode_${v}_$k.log 2>&1
    echo "== $v $k: exit $?; $(grep -E '^exact tensor cores \(default\)' $OUT/decode_${v}_$k.log | awk '{printf "n=%s %s us; ", $5, $7}')"
  done
done
