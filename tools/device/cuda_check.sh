#!/usr/bin/env bash
# The cuda plugin on the GPU machine: its tests, a memory check, the kernel benchmark, the SASS summary.
#
#   Here (nvcc and the Debian libraries):  tools/device/cuda_check.sh bundle
#       builds build-cuda (Release, sm_90 + sm_120 + compute_90 PTX) and packs the binaries, plugins and the
#       non-system libraries they need into build-cuda/bundle (stripped; a few MB).
#   There (the device tool, from the repository root):
#       run(command="tools/device/cuda_check.sh", carry=["build-cuda/bundle"])
#       writes under $OUT: env.txt, test_cuda.log, memcheck.log, bench_cuda.log, sass.txt, summary.txt
#       (the summary is also the last thing printed).
set -uo pipefail
cd "$(dirname "$0")/../.."
bundle=build-cuda/bundle

if [ "${1:-}" = "bundle" ]; then
  set -e
  cmake -S . -B build-cuda -G Ninja -DCMAKE_BUILD_TYPE=Release -DSTRATA_CUDA=ON
  cmake --build build-cuda -j"$(nproc)" --target strata cpu_generic cpu_avx512 cuda test_cuda bench_cuda
  tools/device/bundle.sh build-cuda "$bundle"
  exit 0
fi

out=${OUT:-/tmp/cuda_check}
mkdir -p "$out"
export LD_LIBRARY_PATH="$PWD/$bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export STRATA_FIXTURES_DIR="$PWD/tests/fixtures"
export STRATA_CUDA_NO_EMU=1
export STRATA_CUDA_REQUIRE=1  # on the GPU machine a rejected plugin is a failure, not a skip
summary="$out/summary.txt"
: > "$summary"
note() { echo "$*" | tee -a "$summary"; }
if [ ! -x "$bundle/bin/test_cuda" ]; then
  note "no bundle at $bundle: run 'tools/device/cuda_check.sh bundle' here first and carry $bundle"
  exit 2
fi

{
  date -u
  git log -1 --format='commit %H %s' 2>/dev/null || true
  nvidia-smi 2>&1 || true
  nvidia-smi -q -d CLOCK 2>&1 | head -40 || true
  echo
  "$bundle/bin/strata" plugins 2>&1
} > "$out/env.txt"
note "$(grep -E '^\s+cuda ' "$out/env.txt" | head -1 | sed 's/^ *//')"

# 1. The tests (conformance vs cpu_generic, W4A16 tolerance, memory, async, failures, fixtures end to end).
timeout 300 "$bundle/bin/test_cuda" --duration=true > "$out/test_cuda.log" 2>&1
rc=$?
note "test_cuda: exit $rc; $(grep -E '^\[doctest\] (test cases|assertions)' "$out/test_cuda.log" | tr '\n' ' ')"
grep -E "ERROR|FAILED|SKIPPED|FATAL" "$out/test_cuda.log" | head -12 | tee -a "$summary"

# 2. compute-sanitizer memcheck on the kernel cases (bounds, misaligned and uninitialized device accesses).
if command -v compute-sanitizer > /dev/null; then
  timeout 240 compute-sanitizer --tool memcheck --leak-check no --error-exitcode 9 \
    "$bundle/bin/test_cuda" -tc='*matmul*,*expert_group equals*,*mixed formats*,*W4A16*,*issue/take*,*wide*' \
    > "$out/memcheck.log" 2>&1
  rc=$?
  note "memcheck: exit $rc; $(grep -E 'ERROR SUMMARY' "$out/memcheck.log" | tail -1)"
else
  note "memcheck: compute-sanitizer not found"
fi

# 3. The benchmark (kernel medians by device events; GB/s against the card's datasheet peak and the measured copy rate).
timeout 300 "$bundle/bin/bench_cuda" > "$out/bench_cuda.log" 2>&1
note "bench_cuda: exit $?"

# 4. What the compiler made of the tensor-core kernels (mma, load widths, local memory).
if command -v cuobjdump > /dev/null; then
  cuobjdump -sass -arch sm_90 "$bundle/lib/strata/plugins/libstrata_cuda.so" > "$out/sass_full.txt" 2>&1
  awk '/Function : /{fn=$3} {for (i = 1; i <= NF; i++) if ($i ~ /^(HMMA|LDG|LDL|STL|LDS|STS|HFMA2|LOP3|FFMA|SHFL)/) {split($i, a, " "); c[fn" "a[1]]++}}
       END {for (k in c) print k, c[k]}' "$out/sass_full.txt" | sort > "$out/sass.txt"
  rm -f "$out/sass_full.txt"
  note "sass: $(grep -c . "$out/sass.txt") (kernel, instruction) counts in sass.txt; local memory: $(grep -cE ' (LDL|STL)' "$out/sass.txt")"
fi

echo
echo "---- bench_cuda ----"
cat "$out/bench_cuda.log"
echo "---- summary ----"
cat "$summary"
