#!/usr/bin/env bash
# run113: the down tiles' B operand staged in shared memory (STRATA_CUDA_LAYER_DN_BSMEM=1: read from there from
# the first batch, after waiting for the copy; =2: from the second batch), and the first preparation's
# dependents triggered after its encoding (STRATA_CUDA_PREP_LATE=1).
set -u
OUT0=$OUT
b=build-cuda/bundle
export LD_LIBRARY_PATH="$PWD/$b/lib" STRATA_FIXTURES_DIR="$PWD/tests/fixtures" STRATA_CUDA_NO_EMU=1 STRATA_CUDA_REQUIRE=1
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader
timeout 200 $b/bin/test_cuda -tc="*layer kernel*" > $OUT0/test_layer.log 2>&1; echo "test_cuda layer: exit $?; $(tail -2 $OUT0/test_layer.log | head -1)"
V=STRATA_CUDA_LAYER_DN_BSMEM
OUT=$OUT0/full TESTS=0 PASSES=3 VARIANTS="- $V=1 $V=2 STRATA_CUDA_PREP_LATE=1" tools/device/layer_ab.sh > /dev/null 2>&1
cut -c1-300 "$OUT0/full/summary.txt"
OUT=$OUT0/tl TESTS=0 EXPERTS2= VARIANTS="- $V=1 $V=2 STRATA_CUDA_PREP_LATE=1" tools/device/layer_timeline.sh > /dev/null 2>&1
grep -h -B1 -A5 "^rows" $OUT0/tl/summary.txt | cut -c1-250 | grep -v "^   [234] " | head -48
