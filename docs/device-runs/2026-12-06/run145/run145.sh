#!/usr/bin/env bash
# run145: on an H200: test_cuda, then the layer A/B of the default against STRATA_CUDA_LAYER_WARP_ROWS=32/16 and
# 32 (3 passes) and the timing-only STRATA_CUDA_EXPERIMENT=3 (n-tile 1 loads n-tile 0's B lines again; uncommitted).
# On an H100: run144's A/B (the default against the experiment, full card and the stand-in).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT0=$OUT
name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "GPU: $name"
case "$name" in
  *H200*)
    V='- STRATA_CUDA_LAYER_WARP_ROWS=32/16 STRATA_CUDA_LAYER_WARP_ROWS=32 STRATA_CUDA_EXPERIMENT=3'
    OUT=$OUT0/full TESTS=1 PASSES=3 VARIANTS="$V" bash tools/device/layer_ab.sh > /dev/null 2>&1
    cut -c1-330 $OUT0/full/summary.txt ;;
  *)
    bash "$(dirname "$0")/run144.sh" ;;
esac
