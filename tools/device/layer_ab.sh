#!/usr/bin/env bash
# A/B of the GLM-5.2 decode layer between settings of one bundle, alternating in one machine start.
#
#   Here:   tools/device/cuda_check.sh bundle      (builds build-cuda/bundle)
#   There:  run(command="VARIANTS='STRATA_CUDA_LAYER_ENCODE=2 STRATA_CUDA_LAYER_ENCODE=0' tools/device/layer_ab.sh",
#               carry=["build-cuda/bundle"])
# VARIANTS: space-separated environment settings (one per variant; "-" for none; several settings of one
# variant joined by commas; a first "bin=NAME" runs $BUNDLE/bin/NAME instead of bench_cuda, e.g. the previous
# build's bench_cuda, carried as NAME.gz: a layer-kernel change is judged against that, run150); PASSES (2): how
# often the list is run through; BENCH_ARGS (--layer --quick --rounds 5); TESTS=1 runs test_cuda first. Writes
# under $OUT: summary.txt (the 1-8 row "queued" figures of the exact tensor cores per pass and variant, and
# with --latency the issue -> take wall medians, with STRATA_CUDA_TRACE=1 the host's laps per one-token issue;
# "[persistent]", "[lean]" ("[tile/block]", "[B-ahead]" where those are the default), "[own tokens]" (each
# expert its own rows, not the same ones): bench_cuda's rows of the layer kernel's other modes, measured in the
# same process) and logs.tgz (test_cuda.log and every bench log).
# An H100 standing in for an H200: BENCH_ARGS='--layer --quick --rounds 5 --reserve-sms 52' (docs/benchmarks.md);
# STANDIN=1 runs every pass on the full card and then, on an H100, again with --reserve-sms 52 (lines "[stand-in]").
# Here, the ranges over the passes per variant and mode: tools/device/layer_summary.py summary.txt.
set -uo pipefail
cd "$(dirname "$0")/../.."
out_default=/tmp/layer_ab
. tools/device/bench_setup.sh
bench_args=${BENCH_ARGS:---layer --quick --rounds 5}
stand_ins=("")
if [ "${STANDIN:-0}" = "1" ] && nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H100; then
  stand_ins+=(" --reserve-sms 52")
fi
for held in "${stand_ins[@]}"; do
  for pass in $(seq 1 "${PASSES:-2}"); do
    i=0
    for v in ${VARIANTS:--}; do
      i=$((i + 1))
      log="bench_p${pass}_v${i}${held:+_standin}.log"
      envs=()
      [ "$v" != "-" ] && IFS=, read -r -a envs <<< "$v"
      prog=bench_cuda
      if [ ${#envs[@]} -gt 0 ] && [ "${envs[0]#bin=}" != "${envs[0]}" ]; then
        prog=${envs[0]#bin=}
        envs=("${envs[@]:1}")
      fi
      start=$SECONDS
      timeout 240 env "${envs[@]}" "$bundle/bin/$prog" $bench_args$held > "$out/$log" 2>&1
      rc=$?
      took=$((SECONDS - start))
      q=$(awk '/^tensor cores, exact/ && $(NF-6) <= 8 {
                 name = substr($0, 1, 31); sub(/ +$/, "", name)
                 printf "%s%s rows %s us (%s) ", (name ~ /default/ ? "" : "[" substr(name, 22) "] "), $(NF-6), $(NF-1), $NF}' "$out/$log")
      # --latency: the issue -> take wall medians (poll 2 ms) back to back and after 1 ms idle
      l=$(awk '/^back to back|^after 1 ms idle/ { printf "%s: %s us; ", ($1 == "back" ? "back to back" : "after 1 ms"), $(NF-9) }' "$out/$log")
      # STRATA_CUDA_TRACE=1: the host's laps per one-token issue (the trace prints them when a backend closes)
      h=$(grep -m1 'one-token expert groups issued' "$out/$log" | sed 's/.*host time per issue: //')
      note "${held:+[stand-in] }pass $pass variant $i [$v]: exit $rc, ${took}s; queued: $q${l:+ issue->take: $l}${h:+ host: $h}"
      logs+=("$log")
    done
  done
done
tar czf "$out/logs.tgz" -C "$out" "${logs[@]}" && (cd "$out" && rm -f "${logs[@]}")
cat "$summary"
