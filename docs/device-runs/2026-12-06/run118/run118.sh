#!/usr/bin/env bash
# run118: every bench_cuda suite (--quick) for the i8_at build and bench_base (f99358b), twice alternating.
set -u
OUT0=$OUT
b=build-cuda/bundle
export LD_LIBRARY_PATH="$PWD/$b/lib" STRATA_FIXTURES_DIR="$PWD/tests/fixtures" STRATA_CUDA_NO_EMU=1 STRATA_CUDA_REQUIRE=1
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader
for pass in 1 2; do
  for v in bench_cuda bench_base; do
    s=$SECONDS; timeout 280 $b/bin/$v --quick --rounds 3 > $OUT0/${v}_p$pass.log 2>&1; echo "$v pass $pass: exit $? $((SECONDS - s))s"
  done
done
