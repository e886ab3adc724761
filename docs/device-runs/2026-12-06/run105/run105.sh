#!/usr/bin/env bash
# run105: 70cd99b, the layer kernel's ring form (STRATA_CUDA_LAYER_RING=N: a producer warp per block bulk-copies
# the tile's weight batches into an N-stage shared-memory ring). Tests on the GPU (the layer kernels, ring form
# included), then an A/B at full card, then the timeline of the default and the best-looking ring settings.
set -u
OUT0=$OUT
b=build-cuda/bundle
export LD_LIBRARY_PATH="$PWD/$b/lib" STRATA_FIXTURES_DIR="$PWD/tests/fixtures" STRATA_CUDA_NO_EMU=1 STRATA_CUDA_REQUIRE=1
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader
timeout 200 $b/bin/test_cuda -tc="*layer kernel*" > $OUT0/test_layer.log 2>&1; echo "test_cuda layer: exit $?"; tail -3 $OUT0/test_layer.log
R=STRATA_CUDA_LAYER_RING
OUT=$OUT0/full TESTS=0 PASSES=2 VARIANTS="- $R=2 $R=3 $R=4 $R=6 $R=3,${R}_BLOCKS=3 $R=5,${R}_BLOCKS=3 $R=8,${R}_BLOCKS=3" tools/device/layer_ab.sh > /dev/null 2>&1
cut -c1-330 "$OUT0/full/summary.txt"
OUT=$OUT0/tl TESTS=0 EXPERTS2= VARIANTS="- $R=3 $R=5,${R}_BLOCKS=3" tools/device/layer_timeline.sh > /dev/null 2>&1
grep -h -B1 -A5 "^rows" $OUT0/tl/summary.txt | cut -c1-250 | head -60
