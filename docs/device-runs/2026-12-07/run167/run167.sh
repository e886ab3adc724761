#!/usr/bin/env bash
# run167: copies of a shared gate/up operand (STRATA_CUDA_SHARE_OPERANDS=N: the k-th expert with an operand reads
# copy k % N; 0 an operand per expert; auto one copy from 2 n-tiles, none at one), the same binary, passes
# alternating: on an H200 the GLM-5.2 layer with 8 experts, 3 passes; on an H100 the full card (8 experts, its
# 16-row tiles) and the H200 stand-in (--reserve-sms 52 --layer-experts 5 with WARP_ROWS=32), 2 passes each.
# First test_cuda (19 cases).
set -uo pipefail
cd "$(dirname "$0")/../.."
export LD_LIBRARY_PATH=$PWD/build-cuda/bundle/lib
B=build-cuda/bundle/bin/bench_cuda
name=$(nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader | head -1)
echo "$name"
STRATA_FIXTURES_DIR=$PWD/tests/fixtures STRATA_CUDA_NO_EMU=1 STRATA_CUDA_REQUIRE=1 timeout 240 \
  build-cuda/bundle/bin/test_cuda > $OUT/test_cuda.log 2>&1
echo "test_cuda: exit $?; $(grep -E '^\[doctest\] (test cases|assertions)' $OUT/test_cuda.log | tr '\n' ' ')"
grep -E "ERROR|FAILED|FATAL" $OUT/test_cuda.log | head -8
gzip -9 $OUT/test_cuda.log
row() {  # label, bench args, then env assignments
  local label=$1 extra=$2; shift 2
  out=$(env "$@" timeout 90 $B --layer --quick --rounds 5 $extra 2>&1)
  case "$label" in *auto\ p1*) echo "$out" | grep "layer kernel tiles" ;; esac
  echo "$label: $(echo "$out" | awk '/^tensor cores, exact \(default\)/ && $(NF-6) <= 8 {printf "%sr %s; ", $(NF-6), $(NF-1)}')"
}
ab() {  # prefix, passes, bench args, env
  local pre=$1 passes=$2 extra=$3; shift 3
  for pass in $(seq 1 $passes); do
    for s in auto 0 1 2 4; do row "$pre share $s p$pass" "$extra" "$@" STRATA_CUDA_SHARE_OPERANDS=$s; done
  done
}
case "$name" in
  *H200*) ab "h200" 3 "--layer-experts 8" X=1 ;;
  *) ab "full" 2 "--layer-experts 8" X=1
     ab "stand-in" 2 "--reserve-sms 52 --layer-experts 5" STRATA_CUDA_LAYER_WARP_ROWS=32 ;;
esac
