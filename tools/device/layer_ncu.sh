#!/usr/bin/env bash
# Nsight Compute on the layer kernel of bench_cuda --layer (GLM-5.2 layer, 8 experts), one instance per regex:
# where the time goes at 1-2 rows (1 n-tile) against 3-4 rows (2 n-tiles), with the L2 traffic beside the DRAM
# bytes (the operand's B values are read through L1/L2 by every block; how many bytes per weight byte?).
#
#   Here:   tools/device/cuda_check.sh bundle
#   There:  run(command="tools/device/layer_ncu.sh", carry=["build-cuda/bundle"])
# NCU_KERNEL: ';'-separated regexes over the demangled names (default: the 1-n-tile B-ahead instance, the
# 2-n-tile lean one: the defaults at 1-2 and 3-4 rows); NCU_SKIP (2) launches of each skipped first.
# Writes $OUT/ncu-N.txt and the key lines to $OUT/summary.txt.
set -uo pipefail
cd "$(dirname "$0")/../.."
out_default=/tmp/layer_ncu
TESTS=${TESTS:-0}
. tools/device/bench_setup.sh
ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
IFS=';' read -ra kernels <<< "${NCU_KERNEL:-tc_q4_layer_kernel<.int.4, .int.1, .bool.0>;tc_q4_layer_kernel<.int.4, .int.2, .bool.1>}"
metrics=dram__bytes_read.sum,lts__t_bytes.sum,lts__t_sectors_srcunit_tex_op_read.sum,lts__t_sectors_srcunit_tex_op_read_lookup_hit.sum,l1tex__t_bytes_pipe_lsu_mem_global_op_ld.sum,l1tex__t_sector_hit_rate.pct,lts__throughput.avg.pct_of_peak_sustained_elapsed,l1tex__throughput.avg.pct_of_peak_sustained_elapsed,sm__inst_executed.sum
for i in "${!kernels[@]}"; do
  timeout 240 "$ncu" --kernel-name-base demangled -k "regex:${kernels[$i]}" --launch-skip "${NCU_SKIP:-2}" \
    --launch-count 1 --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \
    --section SchedulerStats --section Occupancy --metrics "$metrics" \
    "$bundle/bin/bench_cuda" --layer --quick --rounds 1 > "$out/ncu-$i.txt" 2>&1
  note "ncu ${kernels[$i]}: exit $?"
  grep -E "^  [a-z_]|Duration|DRAM Throughput|L1/TEX Hit|L2 Hit|Cache Throughput|Achieved Occupancy|No Eligible|Issued Warp|dram__|lts__|l1tex__|sm__inst|Stall|Warp Cycles" \
    "$out/ncu-$i.txt" | head -50 >> "$summary"
done
cat "$summary"
