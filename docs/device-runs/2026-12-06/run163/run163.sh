#!/usr/bin/env bash
# run163: (1) shared gate/up operands (experts with the same rows of x read one operand; plan_group) against an
# operand per expert (STRATA_CUDA_SHARE_OPERANDS=0, the same binary: a host-side switch), 3 passes alternating,
# and run162's check of the device-dependent tile shape (WARP_ROWS=16 once; the header names the tiles), and
# other layer settings once with shared operands;
# (2) the layer kernel's tile timeline at 1-4 rows with the default and without sharing (bench_cuda --timeline
# --rounds 3, records into $OUT). Stops at once on another card (the verdicts are the H200's). First test_cuda on
# the device (19 cases; the shared-operand case among them).
set -uo pipefail
cd "$(dirname "$0")/../.."
export LD_LIBRARY_PATH=$PWD/build-cuda/bundle/lib
B=build-cuda/bundle/bin/bench_cuda
name=$(nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader | head -1)
echo "$name"
case "$name" in *H200*) ;; *) echo "not an H200: stopped"; exit 0 ;; esac
STRATA_FIXTURES_DIR=$PWD/tests/fixtures STRATA_CUDA_NO_EMU=1 STRATA_CUDA_REQUIRE=1 timeout 240 \
  build-cuda/bundle/bin/test_cuda > $OUT/test_cuda.log 2>&1
echo "test_cuda: exit $?; $(grep -E '^\[doctest\] (test cases|assertions)' $OUT/test_cuda.log | tr '\n' ' ')"
grep -E "ERROR|FAILED|FATAL" $OUT/test_cuda.log | head -8
gzip -9 $OUT/test_cuda.log
row() {  # label, then env assignments
  local label=$1; shift
  out=$(env "$@" timeout 90 $B --layer --quick --rounds 5 --layer-experts 8 2>&1)
  [ "$label" = "default p1" ] && echo "$out" | grep "layer kernel tiles"
  echo "$label: $(echo "$out" | awk '/^tensor cores, exact \(default\)/ && $(NF-6) <= 8 {printf "%sr %s; ", $(NF-6), $(NF-1)}')"
}
for pass in 1 2 3; do
  row "default p$pass" X=1
  row "share 0 p$pass" STRATA_CUDA_SHARE_OPERANDS=0
done
row "warp rows 16" STRATA_CUDA_LAYER_WARP_ROWS=16
# with shared operands the L1 holds one gate/up operand: do the other layer settings now win?
row "lean 0" STRATA_CUDA_LAYER_LEAN=0
row "warp rows 32/16" STRATA_CUDA_LAYER_WARP_ROWS=32/16
row "persistent 1" STRATA_CUDA_LAYER_PERSISTENT=1
row "warp rows 16 share 0" STRATA_CUDA_LAYER_WARP_ROWS=16 STRATA_CUDA_SHARE_OPERANDS=0
for s in 1 0; do
  echo "== timeline, share $s"
  STRATA_CUDA_SHARE_OPERANDS=$s timeout 150 $B --timeline --rounds 3 --timeline-csv $OUT/tl163_share$s.csv 2>&1 | grep -v "^device\|^GLM" | cut -c1-400 | tail -26
  gzip -9 $OUT/tl163_share$s.csv
done
