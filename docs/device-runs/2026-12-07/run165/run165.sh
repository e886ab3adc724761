#!/usr/bin/env bash
# run165 (the command line given to the device tool, kept as a script; same machine and bundle as run164, 1e1146a):
# one shared operand (share1, then the default) against an operand per expert (share0) with the default 16-row and
# with 32-row gate/up tiles on the full H100 (8 experts), and on the stand-in with 16-row tiles. Printed lines:
# README.md.
export LD_LIBRARY_PATH=$PWD/build-cuda/bundle/lib; B=build-cuda/bundle/bin/bench_cuda
row() { local label=$1 extra=$2; shift 2; out=$(env "$@" timeout 90 $B --layer --quick --rounds 5 $extra 2>&1); echo "$label: $(echo "$out" | awk '/^tensor cores, exact \(default\)/ && $(NF-6) <= 8 {printf "%sr %s; ", $(NF-6), $(NF-1)}')"; }
for p in 1 2; do
  row "full 32 share1 p$p" "--layer-experts 8" STRATA_CUDA_LAYER_WARP_ROWS=32
  row "full 32 share0 p$p" "--layer-experts 8" STRATA_CUDA_LAYER_WARP_ROWS=32 STRATA_CUDA_SHARE_OPERANDS=0
  row "stand-in 16 share1 p$p" "--reserve-sms 52 --layer-experts 5" X=1
  row "stand-in 16 share0 p$p" "--reserve-sms 52 --layer-experts 5" STRATA_CUDA_SHARE_OPERANDS=0
  row "full 16 share1 p$p" "--layer-experts 8" X=1
  row "full 16 share0 p$p" "--layer-experts 8" STRATA_CUDA_SHARE_OPERANDS=0
done
