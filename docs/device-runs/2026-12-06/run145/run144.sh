#!/usr/bin/env bash
# run144: what n-tile 1's B loads cost, split (timing only, uncommitted): STRATA_CUDA_EXPERIMENT=3 keeps its loads but
# reads n-tile 0's lines again (L1 hits: the L1 load traffic stays, the L2 fills and L1 footprint halve), against
# the default. Full card, then (an H100) the stand-in with 52 SMs held.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT0=$OUT
name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "GPU: $name"
V='- STRATA_CUDA_EXPERIMENT=3'
OUT=$OUT0/full TESTS=0 PASSES=2 VARIANTS="$V" bash tools/device/layer_ab.sh > /dev/null 2>&1
cut -c1-330 $OUT0/full/summary.txt
case "$name" in
  *H100*)
    OUT=$OUT0/standin TESTS=0 PASSES=2 VARIANTS="$V" BENCH_ARGS='--layer --quick --rounds 5 --reserve-sms 52' \
      bash tools/device/layer_ab.sh > /dev/null 2>&1
    echo "== stand-in (52 SMs held)"; cut -c1-330 $OUT0/standin/summary.txt ;;
esac
