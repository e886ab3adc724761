#!/usr/bin/env bash
# run123: the multiplier clamp at one token (one n-tile), against bench_base (6eb5c4c).
set -u
OUT0=$OUT
b=build-cuda/bundle
export LD_LIBRARY_PATH="$PWD/$b/lib" STRATA_FIXTURES_DIR="$PWD/tests/fixtures" STRATA_CUDA_NO_EMU=1 STRATA_CUDA_REQUIRE=1
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader
timeout 300 $b/bin/test_cuda > $OUT0/test_cuda.log 2>&1; echo "test_cuda: exit $?; $(tail -3 $OUT0/test_cuda.log | head -2 | tr '\n' ' ')"
OUT=$OUT0/full TESTS=0 PASSES=4 VARIANTS="- bin=bench_base" tools/device/layer_ab.sh > /dev/null 2>&1
cut -c1-160 "$OUT0/full/summary.txt"
