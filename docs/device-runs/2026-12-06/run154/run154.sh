#!/usr/bin/env bash
# run154: a21a51d. STRATA_CUDA_GATE_UP_SLICES=1 (gate/up tiles of 32 rows, whole-K warps) against the default
# (2 slices) in one binary, and against d5fea33's bench_cuda (the default must equal it). Layer A/B (2 passes;
# on an H100 the stand-in too), then 16 experts per layer (twice the tiles: is the full card's loss with one
# slice the single wave of gate/up tiles?), the tile timelines, and test_cuda on the GPU.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT0=$OUT
echo "GPU: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
V='- STRATA_CUDA_GATE_UP_SLICES=1 bin=bench_cuda_d5fea33'
OUT=$OUT0/ab STANDIN=1 TESTS=0 PASSES=2 VARIANTS="$V" bash tools/device/layer_ab.sh > /dev/null 2>&1
cut -c1-300 $OUT0/ab/summary.txt
export LD_LIBRARY_PATH="$PWD/build-cuda/bundle/lib"
B=build-cuda/bundle/bin/bench_cuda
for s in 2 1; do
  STRATA_CUDA_GATE_UP_SLICES=$s timeout 60 $B --layer --quick --rounds 5 --layer-experts 16 > $OUT0/experts16_s$s.log 2>&1
  echo "== 16 experts, slices $s: exit $?"
  grep -E "^tensor cores, exact \(default\)|tile/block" $OUT0/experts16_s$s.log | cut -c1-110
  STRATA_CUDA_GATE_UP_SLICES=$s timeout 60 $B --timeline > $OUT0/timeline_s$s.log 2>&1
  echo "== timeline, slices $s: exit $?"
done
STRATA_FIXTURES_DIR=$PWD/tests/fixtures STRATA_CUDA_NO_EMU=1 STRATA_CUDA_REQUIRE=1 timeout 200 \
  build-cuda/bundle/bin/test_cuda > $OUT0/test_cuda.log 2>&1
echo "test_cuda: exit $?"
grep -a "test cases\|assertions" $OUT0/test_cuda.log
