#!/usr/bin/env bash
# run164: an H100 (no H200 could be started): test_cuda on a real GPU (19 cases; the shared gate/up operands among
# them), then shared operands (the default) against an operand per expert (STRATA_CUDA_SHARE_OPERANDS=0, the same
# binary) at 1-8 rows, 2 passes alternating on the full card and 2 with --reserve-sms 52 --layer-experts 5 (with the H200's default WARP_ROWS=32: the H200 stand-in of
# docs/benchmarks.md: a hypothesis for the H200, not its figure).
set -uo pipefail
cd "$(dirname "$0")/../.."
export LD_LIBRARY_PATH=$PWD/build-cuda/bundle/lib
B=build-cuda/bundle/bin/bench_cuda
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader | head -1
STRATA_FIXTURES_DIR=$PWD/tests/fixtures STRATA_CUDA_NO_EMU=1 STRATA_CUDA_REQUIRE=1 timeout 240 \
  build-cuda/bundle/bin/test_cuda > $OUT/test_cuda.log 2>&1
echo "test_cuda: exit $?; $(grep -E '^\[doctest\] (test cases|assertions)' $OUT/test_cuda.log | tr '\n' ' ')"
grep -E "ERROR|FAILED|FATAL" $OUT/test_cuda.log | head -8
gzip -9 $OUT/test_cuda.log
row() {  # label, extra bench args, then env assignments
  local label=$1 extra=$2; shift 2
  out=$(env "$@" timeout 90 $B --layer --quick --rounds 5 $extra 2>&1)
  [ "$label" = "default p1" ] && echo "$out" | grep "layer kernel tiles"
  echo "$label: $(echo "$out" | awk '/^tensor cores, exact \(default\)/ && $(NF-6) <= 8 {printf "%sr %s; ", $(NF-6), $(NF-1)}')"
}
for pass in 1 2; do
  row "default p$pass" "--layer-experts 8" X=1
  row "share 0 p$pass" "--layer-experts 8" STRATA_CUDA_SHARE_OPERANDS=0
done
for pass in 1 2; do
  row "stand-in default p$pass" "--reserve-sms 52 --layer-experts 5" STRATA_CUDA_LAYER_WARP_ROWS=32
  row "stand-in share 0 p$pass" "--reserve-sms 52 --layer-experts 5" STRATA_CUDA_LAYER_WARP_ROWS=32 STRATA_CUDA_SHARE_OPERANDS=0
done
