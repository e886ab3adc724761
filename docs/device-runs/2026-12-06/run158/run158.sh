#!/usr/bin/env bash
# run158: right after run157 on the same warm H100 (the same bundle, e81b63a's build of a7ac17f): the two-row-tile
# settings of runs 140-143 (STRATA_CUDA_LAYER_WARP_ROWS=32/16 and 32, two gate/up slices) against the default and one
# slice, re-judged with the stand-in that has the H200's waves (52 SMs held, 5 experts) and on the full card with 13
# experts (the 8-expert stand-in's tile ratio). Passed to the device tool as one command line; kept here as a script.
set -uo pipefail
cd "$(dirname "$0")/../../../.."
for f in build-cuda/bundle/bin/*.gz build-cuda/bundle/lib/*.gz build-cuda/bundle/lib/strata/plugins/*.gz; do gunzip -f $f; done
chmod +x build-cuda/bundle/bin/*
export LD_LIBRARY_PATH=$PWD/build-cuda/bundle/lib
B=build-cuda/bundle/bin/bench_cuda
for cfg in "--reserve-sms 52 --layer-experts 5" "--layer-experts 13"; do
  for pass in 1 2; do
    for v in "2 16" "2 32/16" "2 32" "1 16"; do
      set -- $v
      q=$(STRATA_CUDA_GATE_UP_SLICES=$1 STRATA_CUDA_LAYER_WARP_ROWS=$2 timeout 90 $B --layer --quick --rounds 5 $cfg 2>&1 |
          awk '/^tensor cores, exact \(default\)|^tensor cores, exact, (tile\/block|persistent)/ && $(NF-6) <= 4 {
                 printf "%s %sr %s; ", ($4 == "(default)" ? "def" : $4), $(NF-6), $(NF-1)}')
      echo "[$cfg] slices $1 rows $2 pass $pass: $q"
    done
  done
done
