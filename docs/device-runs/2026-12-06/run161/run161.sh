#!/usr/bin/env bash
# run161: right after run160 on the same H200: WARP_ROWS=32 a block per tile with STRATA_CUDA_LAYER_LEAN auto, 1
# and 0 (2 passes, 1-4 rows). The command line given to the device tool, kept as a script.
set -uo pipefail
cd "$(dirname "$0")/../../../.."
export LD_LIBRARY_PATH=$PWD/build-cuda/bundle/lib
B=build-cuda/bundle/bin/bench_cuda
for pass in 1 2; do
  for l in -1 1 0; do
    q=$(STRATA_CUDA_LAYER_WARP_ROWS=32 STRATA_CUDA_LAYER_PERSISTENT=0 \
        STRATA_CUDA_LAYER_LEAN=$([ $l = -1 ] && echo auto || echo $l) timeout 90 $B --layer --quick --rounds 5 \
          --layer-experts 8 2>&1 | awk '/^tensor cores, exact \(default\)/ && $(NF-6) <= 4 {printf "%sr %s; ", $(NF-6), $(NF-1)}')
    echo "rows 32 tile/block lean $l pass $pass: $q"
  done
done
