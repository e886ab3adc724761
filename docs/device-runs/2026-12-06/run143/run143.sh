#!/usr/bin/env bash
# run143: the session's final code (one staging buffer in the layer kernel; STRATA_CUDA_LAYER_WARP_ROWS opt-in):
# test_cuda; layer A/B of WARP_ROWS=32/16 and 32 against the default, full card (3 passes), then (an H100) the
# H200 stand-in with 52 SMs held (2 passes); every bench_cuda suite once.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT0=$OUT
name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "GPU: $name"
V='- STRATA_CUDA_LAYER_WARP_ROWS=32/16 STRATA_CUDA_LAYER_WARP_ROWS=32'
OUT=$OUT0/full TESTS=1 PASSES=3 VARIANTS="$V" bash tools/device/layer_ab.sh > /dev/null 2>&1
cut -c1-330 $OUT0/full/summary.txt
case "$name" in
  *H100*)
    OUT=$OUT0/standin TESTS=0 PASSES=2 VARIANTS="$V" BENCH_ARGS='--layer --quick --rounds 5 --reserve-sms 52' \
      bash tools/device/layer_ab.sh > /dev/null 2>&1
    echo "== stand-in (52 SMs held)"; cut -c1-330 $OUT0/standin/summary.txt ;;
esac
export LD_LIBRARY_PATH="$PWD/build-cuda/bundle/lib"
timeout 200 build-cuda/bundle/bin/bench_cuda --quick --rounds 3 > $OUT0/bench.log 2>&1
echo "== bench_cuda --quick --rounds 3: exit $?"
grep -E "^exact tensor cores \(default\)|^W4A16" $OUT0/bench.log | cut -c1-200
