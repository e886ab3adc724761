#!/usr/bin/env bash
# run107: Nsight Compute of the ring form (STRATA_CUDA_LAYER_RING=2, K=2, 1 n-tile) against the register form.
set -u
OUT0=$OUT
OUT=$OUT0/ring STRATA_CUDA_LAYER_RING=2 NCU_KERNEL='tc_q4_layer_ring_kernel<.int.4, .int.1, .int.4>' tools/device/layer_ncu.sh > /dev/null 2>&1
OUT=$OUT0/regs NCU_KERNEL='tc_q4_layer_kernel<.int.4, .int.1, .bool.0>' tools/device/layer_ncu.sh > /dev/null 2>&1
for d in ring regs; do echo "== $d"; grep -E "Duration|DRAM Throughput|L1/TEX Hit|Achieved Occupancy|No Eligible|Issued Warp|dram__bytes|l1tex__t_sector_hit|sm__inst|Warp Cycles|Stall|smsp__pcsamp" $OUT0/$d/ncu-0.txt | head -30; done
grep -iE "stall|warp cycles per" -A1 $OUT0/ring/ncu-0.txt | head -40
