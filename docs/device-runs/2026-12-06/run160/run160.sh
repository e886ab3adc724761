#!/usr/bin/env bash
# run160: on the warm H200 of run159 (the same bundle): the default against the two-row-tile settings forced to a
# block per tile, and the default's shape forced to a block per tile, 3 passes, 1-8 rows. The command line given
# to the device tool (after the unpacking of run159), kept as a script.
set -uo pipefail
cd "$(dirname "$0")/../../../.."
export LD_LIBRARY_PATH=$PWD/build-cuda/bundle/lib
B=build-cuda/bundle/bin/bench_cuda
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader
for pass in 1 2 3; do
  for v in "16 auto" "32 0" "32/16 0" "16 0"; do
    set -- $v
    q=$(STRATA_CUDA_LAYER_WARP_ROWS=$1 STRATA_CUDA_LAYER_PERSISTENT=$2 timeout 90 $B --layer --quick --rounds 5 \
          --layer-experts 8 2>&1 | awk '/^tensor cores, exact \(default\)/ && $(NF-6) <= 8 {printf "%sr %s; ", $(NF-6), $(NF-1)}')
    echo "rows $1 persistent $2 pass $pass: $q"
  done
done
