# Shared setup of the device A/B scripts (layer_ab.sh, layer_timeline.sh), sourced after `cd` to the repository
# root with `out_default` set: the bundle's libraries on the path, the fixtures, $out and its summary.txt,
# note() (a line to stdout and the summary), logs=() (files for logs.tgz), and with TESTS=1 (default) test_cuda
# run first and its counts noted.
bundle=${BUNDLE:-build-cuda/bundle}
out=${OUT:-$out_default}
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
