#!/usr/bin/env bash
# run150: why run149's build (the SM order patch, SM order off) ran the default 1-3.7 us slower than 110b70e's
# (bench_cuda_base), also a block per tile. (1) Nsight Compute's warp stall reasons per issued instruction of the
# default instances, 1 n-tile B-ahead (1-2 rows) and 2 n-tiles lean (3-4 rows), both builds: does "no
# instruction" (instruction fetch: the patch's kernel has 5304 instructions against 3712) differ? (2) layer A/B
# of 110b70e, the patch, "loop only" (110b70e with only the ticket's counter address read from shared memory in
# the main loop: a generic ATOM and an LDS, the loops' lengths unchanged) and "code only" (the patch with the
# ticket taken from lw.sync as before: the range scan inlined, main loops 3 instructions longer), full card.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT0=$OUT
for f in build-cuda/bundle/bin/*.gz; do gunzip -f "$f"; done
export LD_LIBRARY_PATH="$PWD/build-cuda/bundle/lib"
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
V='bin=bench_cuda_base - bin=bench_cuda_looponly bin=bench_cuda_codeonly'
OUT=$OUT0/full TESTS=0 PASSES=2 VARIANTS="$V" bash tools/device/layer_ab.sh > /dev/null 2>&1
cut -c1-260 $OUT0/full/summary.txt
ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
m='regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,gpu__time_duration.sum,smsp__inst_executed.sum,sm__cycles_active.avg'
for bin in bench_cuda_base bench_cuda; do
  for k in 'tc_q4_layer_kernel<.int.4, .int.2, .bool.1, .int.1, .int.1>'; do
    f=$OUT0/${bin}_$(echo "$k" | tr -dc '0-9').txt
    timeout 90 "$ncu" --kernel-name-base demangled -k "regex:$k" --launch-skip 2 --launch-count 1 --metrics "$m" \
      build-cuda/bundle/bin/$bin --layer --quick --rounds 1 > "$f" 2>&1
    echo "== $bin $k: exit $?"
    grep -E "stalled|duration|inst_executed|cycles_active" "$f" | awk '{printf "%s %s; ", $1, $NF} END {print ""}' | \
      sed 's/smsp__average_warps_issue_stalled_//g; s/_per_issue_active.ratio//g'
  done
done
