#!/usr/bin/env bash
# run140: Nsight Compute of the 2-n-tile layer kernel (3-4 rows), full card: the default (lean), the timing-only
# experiment without n-tile 1's B loads (STRATA_CUDA_EXPERIMENT=1), two row tiles per warp (lean and B-ahead).
# What differs in L1 hit rate, L2 traffic, stalls?
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT0=$OUT
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
k='tc_q4_layer_kernel<.int.4, .int.2, .bool.1, .int.1, .int.0>'
OUT=$OUT0/a NCU_KERNEL="$k" bash tools/device/layer_ncu.sh > /dev/null 2>&1
OUT=$OUT0/b STRATA_CUDA_EXPERIMENT=1 NCU_KERNEL='tc_q4_layer_kernel<.int.4, .int.2, .bool.1, .int.1, .int.1>' \
  bash tools/device/layer_ncu.sh > /dev/null 2>&1
OUT=$OUT0/c STRATA_CUDA_LAYER_WARP_ROWS=32 \
  NCU_KERNEL='tc_q4_layer_kernel<.int.4, .int.2, .bool.1, .int.2, .int.0>;tc_q4_layer_kernel<.int.4, .int.2, .bool.0, .int.2, .int.0>' \
  bash tools/device/layer_ncu.sh > /dev/null 2>&1
for d in a b c; do echo "== $d"; grep -E "ncu |Duration|L1/TEX Hit|L2 Hit|No Eligible|Issued Warp|dram__bytes|lts__t_bytes|lts__t_sectors_srcunit_tex_op_read|l1tex__t_bytes|l1tex__t_sector_hit|l1tex__throughput|lts__throughput|sm__inst|Achieved Occupancy|Stall Long|Stall Short|Stall MIO|Stall LG" $OUT0/$d/summary.txt | cut -c1-150; done
