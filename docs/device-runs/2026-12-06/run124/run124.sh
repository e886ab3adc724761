#!/usr/bin/env bash
# run124: W4A16 unit rows through ld_unit_row (fewer spills), against bench_base (6eb5c4c): every suite, twice.
set -u
OUT0=$OUT
b=build-cuda/bundle
export LD_LIBRARY_PATH="$PWD/$b/lib" STRATA_FIXTURES_DIR="$PWD/tests/fixtures" STRATA_CUDA_NO_EMU=1 STRATA_CUDA_REQUIRE=1
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader
timeout 300 $b/bin/test_cuda > $OUT0/test_cuda.log 2>&1; echo "test_cuda: exit $?; $(tail -3 $OUT0/test_cuda.log | head -2 | tr '\n' ' ')"
for pass in 1 2; do
  for v in bench_cuda bench_base; do
    timeout 200 $b/bin/$v --quick --rounds 3 > $OUT0/${v}_p$pass.log 2>&1; echo "$v pass $pass: exit $?"
  done
done
for f in $OUT0/bench_*_p*.log; do echo "== $(basename $f)"; grep -E "^tensor cores, exact \(default\)|^exact tensor cores|^W4A16|^ +(1|4|16|64|256) " $f | sed 's/  */ /g'; done
