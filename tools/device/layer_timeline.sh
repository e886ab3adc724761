#!/usr/bin/env bash
# Where a GLM-5.2 decode layer launch's time goes, on the GPU machine: bench_cuda --timeline (the layer kernel
# records each tile's SM, start, inputs and end) for settings given as VARIANTS, at 8 experts and at EXPERTS2
# (32; empty: none) experts per group, after test_cuda (TESTS=1).
#
#   Here:   tools/device/cuda_check.sh bundle      (builds build-cuda/bundle)
#   There:  run(command="OUT=$OUT/t tools/device/layer_timeline.sh", carry=["build-cuda/bundle"])
# VARIANTS: space-separated environment settings ("-" for none, several of one variant joined by commas), as in
# layer_ab.sh; ROUNDS (3): timed passes over the 8 layers. CSV=1: every launch's tile records too
# (bench_cuda --timeline-csv), summarised by tools/timeline_report.py into the summary and kept in logs.tgz.
# Writes under $OUT: summary.txt (every variant's timeline table and profiles) and logs.tgz.
set -uo pipefail
cd "$(dirname "$0")/../.."
out_default=/tmp/layer_timeline
. tools/device/bench_setup.sh
i=0
for v in ${VARIANTS:--}; do
  i=$((i + 1))
  envs=()
  [ "$v" != "-" ] && IFS=, read -r -a envs <<< "$v"
  for experts in 8 ${EXPERTS2-32}; do
    log="timeline_v${i}_e${experts}.log"
    start=$SECONDS
    csv=()
    [ "${CSV:-0}" = "1" ] && csv=(--timeline-csv "$out/tiles_v${i}_e${experts}.csv")
    timeout 240 env "${envs[@]}" "$bundle/bin/bench_cuda" --timeline --layer-experts "$experts" \
      --rounds "${ROUNDS:-3}" "${csv[@]}" > "$out/$log" 2>&1
    rc=$?
    note "== variant $i [$v], $experts experts: exit $rc, $((SECONDS - start))s"
    sed -n '/^timeline/,$p' "$out/$log" >> "$summary"
    logs+=("$log")
    if [ ${#csv[@]} -gt 0 ] && [ -f "${csv[1]}" ]; then
      peak=$(sed -n "s/.*peak used below ('% of peak'): \([0-9]*\) GB\/s.*/\1/p" "$out/$log")
      python3 tools/timeline_report.py "${csv[1]}" --peak-gbs "${peak:-4800}" \
        --gu-tiles-per-item 128 --profile >> "$summary" 2>&1
      logs+=("$(basename "${csv[1]}")")
    fi
  done
done
tar czf "$out/logs.tgz" -C "$out" "${logs[@]}" && (cd "$out" && rm -f "${logs[@]}")
cat "$summary"
