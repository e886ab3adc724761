#!/usr/bin/env bash
# Where a GLM-5.2 decode layer launch's time goes, on the GPU machine: bench_cuda --timeline (the layer kernel
# records each tile's SM, start, inputs and end) for settings given as VARIANTS, at 8 experts and at EXPERTS2
# (32; empty: none) experts per group, after test_cuda (TESTS=1).
#
#   Here:   tools/device/cuda_check.sh bundle      (builds build-cuda/bundle)
#   There:  run(command="OUT=$OUT/t tools/device/layer_timeline.sh", carry=["build-cuda/bundle"])
# VARIANTS: space-separated environment settings ("-" for none, several of one variant joined by commas), as in
# layer_ab.sh; ROUNDS (3): timed passes over the 8 layers. Writes under $OUT: summary.txt (every variant's
# timeline table and profiles) and logs.tgz.
set -uo pipefail
cd "$(dirname "$0")/../.."
bundle=${BUNDLE:-build-cuda/bundle}
out=${OUT:-/tmp/layer_timeline}
mkdir -p "$out"
export LD_LIBRARY_PATH="$PWD/$bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export STRATA_FIXTURES_DIR="$PWD/tests/fixtures" STRATA_CUDA_NO_EMU=1 STRATA_CUDA_REQUIRE=1
summary="$out/summary.txt"
: > "$summary"
note() { echo "$*" | tee -a "$summary"; }
logs=()
if [ "${TESTS:-1}" = "1" ]; then
  timeout 300 "$bundle/bin/test_cuda" > "$out/test_cuda.log" 2>&1
  note "test_cuda: exit $?; $(grep -E '^\[doctest\] (test cases|assertions)' "$out/test_cuda.log" | tr '\n' ' ')"
  logs+=(test_cuda.log)
fi
i=0
for v in ${VARIANTS:--}; do
  i=$((i + 1))
  envs=()
  [ "$v" != "-" ] && IFS=, read -r -a envs <<< "$v"
  for experts in 8 ${EXPERTS2-32}; do
    log="timeline_v${i}_e${experts}.log"
    start=$SECONDS
    timeout 240 env "${envs[@]}" "$bundle/bin/bench_cuda" --timeline --layer-experts "$experts" \
      --rounds "${ROUNDS:-3}" > "$out/$log" 2>&1
    rc=$?
    note "== variant $i [$v], $experts experts: exit $rc, $((SECONDS - start))s"
    sed -n '/^timeline/,$p' "$out/$log" >> "$summary"
    logs+=("$log")
  done
done
tar czf "$out/logs.tgz" -C "$out" "${logs[@]}" && (cd "$out" && rm -f "${logs[@]}")
cat "$summary"
