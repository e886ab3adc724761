#!/usr/bin/env bash
# run155: c483b96. The H200's wave structure on an H100: with 8 experts the H200 (132 SMs, 528 resident layer
# blocks) runs the 512 gate/up tiles of STRATA_CUDA_GATE_UP_SLICES=1 in 0.97 waves and the 768 down tiles in 1.45;
# the stand-in (52 SMs held: 320 blocks) has 1.6 and 2.4 there, but with 5 experts 1.0 and 1.5, the H200's ratios
# at its per-SM bandwidth. So: stand-in at 5 experts (the H200's 8-expert layer, both the waves and the bandwidth
# per SM), and as a cross-check the full card at 13 experts (1.58 waves of gate/up tiles: the stand-in's 8-expert
# ratio) and at 8. Each: the default (2 slices) and one slice, alternating, 2 passes. On an H200: the A/B itself
# (3 passes) and test_cuda.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT0=$OUT
echo "GPU: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then  # the real thing: A/B, then test_cuda
  OUT=$OUT0/ab TESTS=0 PASSES=3 VARIANTS='- STRATA_CUDA_GATE_UP_SLICES=1' bash tools/device/layer_ab.sh > /dev/null 2>&1
  cut -c1-300 $OUT0/ab/summary.txt
  STRATA_FIXTURES_DIR=$PWD/tests/fixtures STRATA_CUDA_NO_EMU=1 STRATA_CUDA_REQUIRE=1 LD_LIBRARY_PATH=$PWD/build-cuda/bundle/lib \
    timeout 200 build-cuda/bundle/bin/test_cuda > $OUT0/test_cuda.log 2>&1
  echo "test_cuda: exit $?"; grep -a "test cases\|assertions" $OUT0/test_cuda.log
  exit 0
fi
OUT=$OUT0/setup TESTS=0 PASSES=0 bash tools/device/layer_ab.sh > /dev/null 2>&1  # (unpacks the bundle)
export LD_LIBRARY_PATH="$PWD/build-cuda/bundle/lib"
B=build-cuda/bundle/bin/bench_cuda
for cfg in "--reserve-sms 52 --layer-experts 5" "--layer-experts 13" "--layer-experts 8" "--reserve-sms 52 --layer-experts 8"; do
  for pass in 1 2; do
    for s in 2 1; do
      f=$OUT0/$(echo "$cfg" | tr -dc '0-9a-z ' | tr ' ' '_')_s${s}_p$pass.log
      STRATA_CUDA_GATE_UP_SLICES=$s timeout 90 $B --layer --quick --rounds 5 $cfg > $f 2>&1
      q=$(awk '/^tensor cores, exact \(default\)|^tensor cores, exact, (tile\/block|persistent)/ && $(NF-6) <= 4 {
                 printf "%s %sr %s; ", ($4 == "(default)" ? "def" : $4), $(NF-6), $(NF-1)}' $f)
      echo "[$cfg] slices $s pass $pass: $q"
    done
  done
done
