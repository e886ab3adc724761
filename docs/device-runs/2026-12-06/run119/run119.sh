#!/usr/bin/env bash
# run119: kTiles with a thread's two groups side by side (one 16-byte load per unit row), against bench_base
# (44ea653: i8_at, the old tile order).
set -u
OUT0=$OUT
b=build-cuda/bundle
export LD_LIBRARY_PATH="$PWD/$b/lib" STRATA_FIXTURES_DIR="$PWD/tests/fixtures" STRATA_CUDA_NO_EMU=1 STRATA_CUDA_REQUIRE=1
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader
timeout 300 $b/bin/test_cuda > $OUT0/test_cuda.log 2>&1; echo "test_cuda: exit $?; $(tail -3 $OUT0/test_cuda.log | head -2 | tr '\n' ' ')"
OUT=$OUT0/full TESTS=0 PASSES=3 VARIANTS="- bin=bench_base" tools/device/layer_ab.sh > /dev/null 2>&1
cut -c1-200 "$OUT0/full/summary.txt"
for pass in 1 2; do
  for v in bench_cuda bench_base; do
    s=$SECONDS; timeout 280 $b/bin/$v --quick --rounds 3 > $OUT0/${v}_p$pass.log 2>&1; echo "$v pass $pass: exit $? $((SECONDS - s))s"
  done
done
OUT=$OUT0/tl TESTS=0 EXPERTS2=32 tools/device/layer_timeline.sh > /dev/null 2>&1
grep -h "median" $OUT0/tl/summary.txt | cut -c1-250
