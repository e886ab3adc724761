#!/usr/bin/env bash
# run149: SM order (STRATA_CUDA_LAYER_SM_ORDER=1, 2 with the down tiles too: the gate/up tickets dealt in rounds of SM_GROUP tiles to a range
# per SM, so the blocks on one SM run one expert's neighbouring tiles and share its B in L1; uncommitted) on
# 110b70e: test_cuda (all); layer A/B: 110b70e's bench_cuda (bin=bench_cuda_base), this default, SM order with
# the group = blocks per SM, 1 (control: no sharing), 8; SM_ORDER=2, alone and with WARP_ROWS=32/16; full card 2 passes, then (an
# H100) the stand-in with 52 SMs held.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT0=$OUT
[ -f build-cuda/bundle/bin/bench_cuda_base.gz ] && gunzip -f build-cuda/bundle/bin/bench_cuda_base.gz
name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "GPU: $name"
V='bin=bench_cuda_base - STRATA_CUDA_LAYER_SM_ORDER=1 STRATA_CUDA_LAYER_SM_ORDER=1,STRATA_CUDA_LAYER_SM_GROUP=1 STRATA_CUDA_LAYER_SM_ORDER=1,STRATA_CUDA_LAYER_SM_GROUP=8 STRATA_CUDA_LAYER_SM_ORDER=2 STRATA_CUDA_LAYER_SM_ORDER=2,STRATA_CUDA_LAYER_WARP_ROWS=32/16'
OUT=$OUT0/full TESTS=1 PASSES=2 VARIANTS="$V" bash tools/device/layer_ab.sh > /dev/null 2>&1
cut -c1-400 $OUT0/full/summary.txt
case "$name" in
  *H100*)
    OUT=$OUT0/standin TESTS=0 PASSES=2 VARIANTS="$V" BENCH_ARGS='--layer --quick --rounds 5 --reserve-sms 52' \
      bash tools/device/layer_ab.sh > /dev/null 2>&1
    echo "== stand-in (52 SMs held)"; cut -c1-400 $OUT0/standin/summary.txt
    tar xzf $OUT0/standin/logs.tgz -O 2>/dev/null | grep -m1 "the SMs held" ;;
esac
