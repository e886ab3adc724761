# Shared setup of the device A/B scripts (layer_ab.sh, layer_timeline.sh), sourced after `cd` to the repository
# root with `out_default` set: the bundle's libraries on the path, the fixtures, $out and its summary.txt,
# note() (a line to stdout and the summary), logs=() (files for logs.tgz), and with TESTS=1 (default) test_cuda
# run first and its counts noted: TEST_CASES (a doctest -tc filter, e.g. '*layer kernel*') runs only those cases,
# TEST_RUNS (1) times, each into its own log (a race on the hardware may show in one run of several). A run script
# needs no environment of its own beyond these (runs 105-112 each wrote this setup out again).
bundle=${BUNDLE:-build-cuda/bundle}
# Programs and libraries carried gzip'd (bin/*.gz, e.g. the previous build's bench_cuda beside the new one for
# layer_ab.sh's bin=NAME variants; lib/*.gz, lib/strata/plugins/*.gz) are unpacked in place: the tree and the
# bundle travel together within 64 MiB (run151: 65.8 MB was refused, 61 MB taken). A program gzip'd with `gzip -c` comes back
# without its exec bit, hence the chmod.
for f in "$bundle"/bin/*.gz "$bundle"/lib/*.gz "$bundle"/lib/strata/plugins/*.gz; do
  [ -e "$f" ] && gunzip -f "$f" && case "$f" in */bin/*) chmod +x "${f%.gz}" ;; esac
done
out=${OUT:-$out_default}
mkdir -p "$out"
export LD_LIBRARY_PATH="$PWD/$bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export STRATA_FIXTURES_DIR="$PWD/tests/fixtures" STRATA_CUDA_NO_EMU=1 STRATA_CUDA_REQUIRE=1
summary="$out/summary.txt"
: > "$summary"
note() { echo "$*" | tee -a "$summary"; }
logs=()
if [ "${TESTS:-1}" = "1" ]; then
  for k in $(seq 1 "${TEST_RUNS:-1}"); do
    log=test_cuda.log
    [ "${TEST_RUNS:-1}" != "1" ] && log="test_cuda_$k.log"
    timeout 300 "$bundle/bin/test_cuda" ${TEST_CASES:+"-tc=$TEST_CASES"} > "$out/$log" 2>&1
    note "test_cuda${TEST_CASES:+ -tc=$TEST_CASES} ($k): exit $?; $(grep -E '^\[doctest\] (test cases|assertions)' "$out/$log" | tr '\n' ' ')"
    logs+=("$log")
  done
fi
