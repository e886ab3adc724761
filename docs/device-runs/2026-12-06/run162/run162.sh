#!/usr/bin/env bash
# run162: the device-dependent default tile shape (default_layer_warp_tiles): bench_cuda --layer by default and
# with WARP_ROWS=16 forced, 2 passes; the header line names the tiles chosen.
set -uo pipefail
cd "$(dirname "$0")/../.."
export LD_LIBRARY_PATH=$PWD/build-cuda/bundle/lib
B=build-cuda/bundle/bin/bench_cuda
nvidia-smi --query-gpu=name --format=csv,noheader
for pass in 1 2; do
  for w in default 16; do
    out=$( ( [ $w = default ] || export STRATA_CUDA_LAYER_WARP_ROWS=$w; timeout 90 $B --layer --quick --rounds 5 --layer-experts 8 ) 2>&1)
    [ $pass = 1 ] && echo "$out" | grep "layer kernel tiles"
    echo "$w pass $pass: $(echo "$out" | awk '/^tensor cores, exact \(default\)/ && $(NF-6) <= 4 {printf "%sr %s; ", $(NF-6), $(NF-1)}')"
  done
done
