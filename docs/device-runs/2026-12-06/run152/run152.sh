#!/usr/bin/env bash
# run152: HEAD (= b52193a's kernels). On an H200: layer A/B of WARP_ROWS=32/16 and 32 against the default (3
# passes, full card), then test_cuda. On an H100: Nsight Compute's L1 wavefronts and throughput of the 2-n-tile
# instances (the default lean one, and 32/16's) at 3 rows: is the L1 pipeline what 2 n-tiles wait on?
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT0=$OUT
name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "GPU: $name"
case "$name" in
  *H200*)
    V='- STRATA_CUDA_LAYER_WARP_ROWS=32/16 STRATA_CUDA_LAYER_WARP_ROWS=32'
    OUT=$OUT0/full TESTS=0 PASSES=3 VARIANTS="$V" bash tools/device/layer_ab.sh > /dev/null 2>&1
    cut -c1-330 $OUT0/full/summary.txt
    STRATA_FIXTURES_DIR=$PWD/tests/fixtures STRATA_CUDA_NO_EMU=1 STRATA_CUDA_REQUIRE=1 timeout 200 \
      build-cuda/bundle/bin/test_cuda > $OUT0/test_cuda.log 2>&1
    echo "test_cuda: exit $?"
    grep -a "test cases\|assertions" $OUT0/test_cuda.log ;;
  *)
    OUT=$OUT0/setup TESTS=0 PASSES=0 bash tools/device/layer_ab.sh > /dev/null 2>&1  # (unpacks the bundle)
    export LD_LIBRARY_PATH="$PWD/build-cuda/bundle/lib"
    ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
    m='l1tex__data_pipe_lsu_wavefronts_mem_lg.sum,l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum,l1tex__throughput.avg.pct_of_peak_sustained_active,l1tex__data_pipe_lsu_wavefronts.avg.pct_of_peak_sustained_active,lts__t_sectors_srcunit_tex_op_read.sum,gpu__time_duration.sum,smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_lg_throttle_per_issue_active.ratio'
    for v in '-:tc_q4_layer_kernel<.int.4, .int.2, .bool.1, .int.1, .int.1>' \
             'STRATA_CUDA_LAYER_WARP_ROWS=32/16:tc_q4_layer_kernel<.int.4, .int.2, .bool.1, .int.2, .int.1>' \
             '-:tc_q4_layer_kernel<.int.4, .int.1, .bool.0, .int.1, .int.1>'; do
      e=${v%%:*}; k=${v#*:}; f=$OUT0/ncu_$(echo "$e$k" | tr -dc '0-9A-Za-z' | tail -c 40).txt
      env $([ "$e" != "-" ] && echo "$e") timeout 60 "$ncu" --kernel-name-base demangled -k "regex:$k" \
        --launch-skip 2 --launch-count 1 --metrics "$m" build-cuda/bundle/bin/bench_cuda --layer --quick --rounds 1 > "$f" 2>&1
      echo "== [$e] $k: exit $?"
      grep -E "l1tex__|lts__|duration|stalled" "$f" | awk '{printf "%s %s; ", $1, $NF} END {print ""}' | \
        sed 's/smsp__average_warps_issue_stalled_//g; s/_per_issue_active.ratio//g'
    done ;;
esac
