#!/usr/bin/env bash
# run139: where the 3-4 row time goes on the H200 stand-in (52 SMs held; bench_cuda --timeline now takes
# --reserve-sms): the default, STRATA_CUDA_EXPERIMENT=1 (timing only: n-tile 1 without its own B loads) and
# two row tiles per warp with B ahead, a block per tile. Tile records summarised by timeline_report.py.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT0=$OUT
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
V='- STRATA_CUDA_EXPERIMENT=1 STRATA_CUDA_LAYER_WARP_ROWS=32,STRATA_CUDA_LAYER_LEAN=0,STRATA_CUDA_LAYER_PERSISTENT=0'
OUT=$OUT0/tl CSV=1 TESTS=0 ROUNDS=3 EXPERTS2= VARIANTS="$V" TIMELINE_ARGS='--reserve-sms 52' \
  bash tools/device/layer_timeline.sh > /dev/null 2>&1
grep -v "in flight per\|read rate per" $OUT0/tl/summary.txt | cut -c1-260
