#!/usr/bin/env bash
# run153: gate/up tiles of 32 rows with each warp over the whole K (one matrix and 16-row tile per warp, no K
# slices), against d5fea33's build (bench_cuda_d5fea33: 16-row gate/up tiles, 2 K slices per matrix). Layer A/B
# first (3 passes, full card; on an H100 the stand-in too), then test_cuda on the GPU, then the prefill and
# decode suites of both builds (the wide kernels' gate/up blocks changed too: 64 rows, one K slice).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT0=$OUT
echo "GPU: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
V='bin=bench_cuda_d5fea33 - STRATA_CUDA_LAYER_WARP_ROWS=32/16'
OUT=$OUT0/ab STANDIN=1 TESTS=0 PASSES=3 VARIANTS="$V" bash tools/device/layer_ab.sh > /dev/null 2>&1
cut -c1-330 $OUT0/ab/summary.txt
export LD_LIBRARY_PATH="$PWD/build-cuda/bundle/lib"
STRATA_FIXTURES_DIR=$PWD/tests/fixtures STRATA_CUDA_NO_EMU=1 STRATA_CUDA_REQUIRE=1 timeout 200 \
  build-cuda/bundle/bin/test_cuda > $OUT0/test_cuda.log 2>&1
echo "test_cuda: exit $?"
grep -a "test cases\|assertions" $OUT0/test_cuda.log
for b in bench_cuda_d5fea33 bench_cuda; do
  for s in prefill decode; do
    timeout 120 build-cuda/bundle/bin/$b --$s --quick --rounds 3 > $OUT0/${s}_$b.log 2>&1
    echo "== $b --$s: exit $?"
  done
done
