#!/usr/bin/env bash
# run117: the narrow kernels' B operand with each unit's 8 columns together (i8_at), against bench_base (f99358b).
set -u
OUT0=$OUT
b=build-cuda/bundle
export LD_LIBRARY_PATH="$PWD/$b/lib" STRATA_FIXTURES_DIR="$PWD/tests/fixtures" STRATA_CUDA_NO_EMU=1 STRATA_CUDA_REQUIRE=1
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader
timeout 300 $b/bin/test_cuda > $OUT0/test_cuda.log 2>&1; echo "test_cuda: exit $?; $(tail -3 $OUT0/test_cuda.log | head -2 | tr '\n' ' ')"
OUT=$OUT0/full TESTS=0 PASSES=3 VARIANTS="- bin=bench_base" tools/device/layer_ab.sh > /dev/null 2>&1
cut -c1-230 "$OUT0/full/summary.txt"
OUT=$OUT0/tl TESTS=0 EXPERTS2= tools/device/layer_timeline.sh > /dev/null 2>&1
grep -h -A6 "^rows" $OUT0/tl/summary.txt | cut -c1-250 | grep -v "in flight per" | head -24
grep -h "median" $OUT0/tl/summary.txt | cut -c1-250
