#!/usr/bin/env bash
# run108: 361db9c, the layer kernel's B operand staged in shared memory per tile (STRATA_CUDA_LAYER_BSMEM=1).
set -u
OUT0=$OUT
b=build-cuda/bundle
export LD_LIBRARY_PATH="$PWD/$b/lib" STRATA_FIXTURES_DIR="$PWD/tests/fixtures" STRATA_CUDA_NO_EMU=1 STRATA_CUDA_REQUIRE=1
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader
timeout 200 $b/bin/test_cuda -tc="*layer kernel*" > $OUT0/test_layer.log 2>&1; echo "test_cuda layer: exit $?; $(tail -2 $OUT0/test_layer.log | head -1)"
V=STRATA_CUDA_LAYER_BSMEM=1
OUT=$OUT0/full TESTS=0 PASSES=3 VARIANTS="- $V $V,STRATA_CUDA_LAYER_PERSISTENT=1" tools/device/layer_ab.sh > /dev/null 2>&1
cut -c1-300 "$OUT0/full/summary.txt"
OUT=$OUT0/tl TESTS=0 EXPERTS2= VARIANTS="- $V" tools/device/layer_timeline.sh > /dev/null 2>&1
grep -h -B1 -A5 "^rows" $OUT0/tl/summary.txt | cut -c1-250 | head -40
