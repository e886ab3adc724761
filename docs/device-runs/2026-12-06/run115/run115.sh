#!/usr/bin/env bash
# run115: the gate/up tiles waiting on the preparation's counter of finished blocks (STRATA_CUDA_LAYER_PREP_FLAG=1)
# instead of the preparation grid's completion (griddepcontrol.wait).
set -u
OUT0=$OUT
b=build-cuda/bundle
export LD_LIBRARY_PATH="$PWD/$b/lib" STRATA_FIXTURES_DIR="$PWD/tests/fixtures" STRATA_CUDA_NO_EMU=1 STRATA_CUDA_REQUIRE=1
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader
for k in 1 2 3; do timeout 200 $b/bin/test_cuda -tc="*layer kernel*" > $OUT0/test_layer_$k.log 2>&1; echo "test_cuda layer $k: exit $?; $(tail -2 $OUT0/test_layer_$k.log | head -1)"; done
OUT=$OUT0/full TESTS=0 PASSES=3 VARIANTS="- STRATA_CUDA_LAYER_PREP_FLAG=1" tools/device/layer_ab.sh > /dev/null 2>&1
cut -c1-200 "$OUT0/full/summary.txt"
OUT=$OUT0/tl TESTS=0 EXPERTS2= VARIANTS="- STRATA_CUDA_LAYER_PREP_FLAG=1" tools/device/layer_timeline.sh > /dev/null 2>&1
grep -h -A6 "^rows" $OUT0/tl/summary.txt | cut -c1-250 | grep -v "in flight per" | head -40
