#!/usr/bin/env bash
# run106: the ring form with stages of K batches per warp (bulk copies of K x 2 KB), released after compute.
set -u
OUT0=$OUT
b=build-cuda/bundle
export LD_LIBRARY_PATH="$PWD/$b/lib" STRATA_FIXTURES_DIR="$PWD/tests/fixtures" STRATA_CUDA_NO_EMU=1 STRATA_CUDA_REQUIRE=1
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader
for k in 1 2 3; do timeout 200 $b/bin/test_cuda -tc="*layer kernel*" > $OUT0/test_layer_$k.log 2>&1; echo "test_cuda layer ($k): exit $?; $(tail -2 $OUT0/test_layer_$k.log | head -1)"; done
R=STRATA_CUDA_LAYER_RING
K=STRATA_CUDA_LAYER_RING_BATCHES
B=STRATA_CUDA_LAYER_RING_BLOCKS
OUT=$OUT0/full TESTS=0 PASSES=2 VARIANTS="- $R=2,$K=2 $R=3,$K=2,$B=3 $R=2,$K=4,$B=3 $R=1,$K=4 $R=4,$K=1 $R=2,$K=1 $R=1,$K=2" tools/device/layer_ab.sh > /dev/null 2>&1
cut -c1-300 "$OUT0/full/summary.txt"
OUT=$OUT0/tl TESTS=0 EXPERTS2= VARIANTS="- $R=2,$K=2 $R=2,$K=4,$B=3" tools/device/layer_timeline.sh > /dev/null 2>&1
grep -h -B1 -A5 "^rows" $OUT0/tl/summary.txt | cut -c1-250 | head -60
