#!/usr/bin/env bash
# run151: (1) with two n-tiles a thread whose column holds no token loads the last live column (3 rows: half of
# n-tile 1's B lines not filled; commit "tc_q4_tile: with two n-tiles ..."), (2) the layer kernel's group
# encoding out of line, (3) on (2): lean instances prefetch B into L1 one or two units ahead (STRATA_CUDA_PF_B=1, 2). layer A/B, 2 passes, one machine start: b52193a's bench_cuda
# (bin=bench_cuda_base), (1) alone (bin=bench_cuda_clamp), (1)+(2) (this bundle's), (3) (bin=bench_cuda_pf1, pf2), pf1 with the B-ahead instances prefetching the unit after the one they load (pfa), and it with 32-row warps (gate/up 32 and down 16, or both 32: run143's variants); full card, then on an
# H100 the stand-in (52 SMs held); test_cuda (all); then Nsight Compute's L2 sectors read by the L1 of the 3-row default instance.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT0=$OUT
for f in build-cuda/bundle/bin/*.gz build-cuda/bundle/lib/*.gz build-cuda/bundle/lib/strata/plugins/*.gz; do gunzip -f "$f"; done
export LD_LIBRARY_PATH="$PWD/build-cuda/bundle/lib"
name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "GPU: $name"
V='bin=bench_cuda_base bin=bench_cuda_clamp - bin=bench_cuda_pf1 bin=bench_cuda_pf2 bin=bench_cuda_pfa STRATA_CUDA_LAYER_WARP_ROWS=32/16 STRATA_CUDA_LAYER_WARP_ROWS=32'
OUT=$OUT0/full TESTS=0 PASSES=2 VARIANTS="$V" bash tools/device/layer_ab.sh > /dev/null 2>&1
cut -c1-330 $OUT0/full/summary.txt
case "$name" in
  *H100*)
    OUT=$OUT0/standin TESTS=0 PASSES=2 VARIANTS="$V" BENCH_ARGS='--layer --quick --rounds 5 --reserve-sms 52' \
      bash tools/device/layer_ab.sh > /dev/null 2>&1
    echo "== stand-in (52 SMs held)"; cut -c1-330 $OUT0/standin/summary.txt ;;
esac
STRATA_FIXTURES_DIR=$PWD/tests/fixtures STRATA_CUDA_NO_EMU=1 STRATA_CUDA_REQUIRE=1 timeout 200 \
  build-cuda/bundle/bin/test_cuda > $OUT0/test_cuda.log 2>&1
echo "test_cuda: exit $?"
grep -a "test cases\|assertions" $OUT0/test_cuda.log
ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
m='lts__t_sectors_srcunit_tex_op_read.sum,l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum,gpu__time_duration.sum,smsp__average_warps_issue_stalled_no_instruction_per_issue_active.ratio,smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio'
for bin in bench_cuda_base bench_cuda bench_cuda_pf1; do
  k='tc_q4_layer_kernel<.int.4, .int.2, .bool.1, .int.1, .int.1>'
  f=$OUT0/ncu_${bin}.txt
  timeout 60 "$ncu" --kernel-name-base demangled -k "regex:$k" --launch-skip 2 --launch-count 3 --metrics "$m" \
    build-cuda/bundle/bin/$bin --layer --quick --rounds 1 > "$f" 2>&1
  echo "== $bin: exit $?"
  grep -E "lts__|l1tex__|duration|stalled" "$f" | awk '{printf "%s %s; ", $1, $NF} END {print ""}' | \
    sed 's/smsp__average_warps_issue_stalled_//g; s/_per_issue_active.ratio//g'
done
