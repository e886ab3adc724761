#!/usr/bin/env bash
# run157 (run156 as prepared, at a7ac17f): one gate/up K slice with 128-row down tiles (STRATA_CUDA_LAYER_WARP_ROWS=16/32): with 8 experts on 132
# SMs the 768 64-row down tiles end in a partial second round of the 528 blocks (run154's timeline); 384 128-row
# ones fit one. On an H100: the stand-in with the H200's waves (5 experts) and the full card with 8, each for the
# default, one slice, and one slice with 16/32, alternating, 2 passes; then test_cuda. On an H200: the same three
# with 8 experts (run157: 2 passes, for the budget), then test_cuda. run157 adds, on an H200 only, the two-row-tile settings of runs 140-143
# (STRATA_CUDA_LAYER_WARP_ROWS=32/16 and 32 with the default two slices), which the H100 stand-in favoured.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT0=$OUT
name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "GPU: $name"
OUT=$OUT0/setup TESTS=0 PASSES=0 bash tools/device/layer_ab.sh > /dev/null 2>&1  # (unpacks the bundle)
export LD_LIBRARY_PATH="$PWD/build-cuda/bundle/lib"
B=build-cuda/bundle/bin/bench_cuda
cfgs=("--reserve-sms 52 --layer-experts 5" "--layer-experts 8"); passes="1 2"; vs=("2 16" "1 16" "1 16/32")
case "$name" in *H200*) cfgs=("--layer-experts 8"); passes="1 2"; vs+=("2 32/16" "2 32") ;; esac
for cfg in "${cfgs[@]}"; do
  for pass in $passes; do
    for v in "${vs[@]}"; do
      set -- $v
      q=$(STRATA_CUDA_GATE_UP_SLICES=$1 STRATA_CUDA_LAYER_WARP_ROWS=$2 timeout 90 $B --layer --quick --rounds 5 $cfg 2>&1 |
          awk '/^tensor cores, exact \(default\)|^tensor cores, exact, (tile\/block|persistent)/ && $(NF-6) <= 4 {
                 printf "%s %sr %s; ", ($4 == "(default)" ? "def" : $4), $(NF-6), $(NF-1)}')
      echo "[$cfg] slices $1 rows $2 pass $pass: $q"
    done
  done
done
STRATA_FIXTURES_DIR=$PWD/tests/fixtures STRATA_CUDA_NO_EMU=1 STRATA_CUDA_REQUIRE=1 timeout 200 \
  build-cuda/bundle/bin/test_cuda > $OUT0/test_cuda.log 2>&1
echo "test_cuda: exit $?"
grep -a "test cases\|assertions" $OUT0/test_cuda.log
