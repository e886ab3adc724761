#!/usr/bin/env bash
# One device call for the GPU plugin and the expert tiers: test_cuda on the real GPU, the decode kernel
# benchmark, a memcheck of the gemv kernels, and bench_e2e on a synthetic GLM-5.2-shaped model for every
# placement (all RAM, 0/25/50/75/100 % of the experts in VRAM, overlap off, streamed from disk).
#
#   Here:   tools/device/cuda_check.sh bundle && cmake --build build-cuda --target bench_e2e make_synthetic_model
#           && tools/device/bundle.sh build-cuda build-cuda/bundle   (then trim: see docs/device-runs/README)
#   There:  run(command="tools/device/phase3_check.sh", carry=["build-cuda/bundle"])
# Logs go to $OUT: summary.txt (printed last) and logs.tgz (every log, e2e-logs.tgz inside). BUDGET (seconds,
# default 560) bounds the whole script.
# STEPS (default "tests bench e2e memcheck") and CONFIGS (default: every placement below) narrow a run;
# BENCH_ARGS (default "--decode --rounds 7") and BENCH_TIMEOUT (90 s) set the kernel benchmark, E2E_ARGS
# (default "--prefill 32 --decode 16 --reps 2") the end-to-end one. A config named NAME+ab runs NAME.yaml with
# bench_e2e --ab-overlap (overlap on / off alternating in one process: the overlap efficiency); NAME[+ab]@N runs
# it with --threads N. STEPS may add "ncu": Nsight Compute on bench_cuda --decode --rounds 1 for the kernels
# matching NCU_KERNEL (see 2b), NCU_SKIP / NCU_COUNT launches (default 2 / 2), into ncu-N.txt.
set -uo pipefail
cd "$(dirname "$0")/../.."
b=${BUNDLE:-build-cuda/bundle}  # BUNDLE: another bundle folder (e.g. build/bundle)
export LD_LIBRARY_PATH="$PWD/$b/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export STRATA_FIXTURES_DIR="$PWD/tests/fixtures" STRATA_CUDA_NO_EMU=1 STRATA_CUDA_REQUIRE=1
out=${OUT:-/tmp/phase3}
mkdir -p "$out"
t0=$(date +%s)
budget=${BUDGET:-560}
left() { echo $((budget - ($(date +%s) - t0))); }
summary="$out/summary.txt"
: > "$summary"
note() { echo "$*" | tee -a "$summary"; }
{ date -u; git log -1 --format='commit %H %s' 2>/dev/null; nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,memory.total --format=csv; nproc; free -g; df -h /tmp | tail -1; } > "$out/env.txt" 2>&1

# 1. The plugin's tests on the GPU (conformance, gemv prefill == decode, memory, async, failures, fixtures,
#    expert tiers with the GPU).
steps=${STEPS:-tests bench e2e memcheck}
want() { [[ " $steps " == *" $1 "* ]]; }
if want tests; then
  timeout 150 "$b/bin/test_cuda" --duration=true > "$out/test_cuda.log" 2>&1
  note "test_cuda: exit $?; $(grep -E '^\[doctest\] (test cases|assertions)' "$out/test_cuda.log" | tr '\n' ' ')"
  grep -E "ERROR|FAILED|FATAL" "$out/test_cuda.log" | head -8 | tee -a "$summary"
fi

# 2. Decode kernels: GLM-5.2 layer 1-8 rows, projection shape, gemv vs tensor cores.
if want bench; then
  timeout ${BENCH_TIMEOUT:-90} "$b/bin/bench_cuda" ${BENCH_ARGS:---decode --rounds 7} > "$out/bench_cuda.log" 2>&1
  note "bench_cuda ${BENCH_ARGS:---decode --rounds 7}: exit $?"
  grep -E "GLM|glm|%|floor" "$out/bench_cuda.log" | head -40 >> "$summary"
fi

# 2b. Nsight Compute on the decode kernels (base clocks; the report is the text of the chosen sections). NCU_KERNEL
#     is one or more ';'-separated regexes over the demangled names, which carry casts: "(int)4, (int)1, (bool)1";
#     e.g. "gemv_q4_kernel<.int.4, .int.1, .bool..>" (Q4_G64, 1 token, gate/up and linear).
if want ncu; then
  ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
  IFS=';' read -ra kernels <<< "${NCU_KERNEL:-tc_q4}"
  for i in "${!kernels[@]}"; do
    timeout 200 "$ncu" --kernel-name-base demangled -k "regex:${kernels[$i]}" --launch-skip "${NCU_SKIP:-2}" \
      --launch-count "${NCU_COUNT:-2}" --section SpeedOfLight --section MemoryWorkloadAnalysis \
      --section WarpStateStats --section Occupancy --section LaunchStats --section SchedulerStats \
      "$b/bin/bench_cuda" --decode --rounds 1 > "$out/ncu-$i.txt" 2>&1
    note "ncu ${kernels[$i]}: exit $?"
    grep -E "^  [a-z_]|Duration|DRAM Throughput|L1/TEX Hit|L2 Hit|L1/TEX Cache Throughput|L2 Cache Throughput|Achieved Occupancy|Registers Per|No Eligible|Block Limit" \
      "$out/ncu-$i.txt" | head -40 >> "$summary"
  done
fi

# 3. The expert tiers end to end on a synthetic GLM-5.2-shaped container (1 dense + 2 MoE layers).
synth=/tmp/synth-glm52
if want e2e && [ "$(left)" -gt 150 ]; then
  timeout 120 "$b/bin/make_synthetic_model" --out "$synth" --layers 3 --vocab 32000 --force > "$out/synth.log" 2>&1
  note "make_synthetic_model: exit $?; $(tail -1 "$out/synth.log")"
  routed_gib=$(python3 -c "import json,os;m=json.load(open('$synth/model.safetensors.index.json'));print(2*256*21.23e6/2**30)")
  cfgs=/tmp/cfgs; mkdir -p $cfgs
  printf 'backends:\n  experts: [auto]\nmemory:\n  pin: none\n' > $cfgs/ram.yaml
  for share in 0 25 50 75 100; do
    gb=$(python3 -c "print(round($routed_gib*$share/100*1.02, 3))")
    printf 'backends:\n  experts: [cuda]\nmemory:\n  vram_gb: %s\n  pin: none\n' "$gb" > $cfgs/vram$share.yaml
  done
  printf 'backends:\n  experts: [cuda]\nmemory:\n  vram_gb: %s\n  pin: none\nscheduler:\n  overlap: false\n' \
    "$(python3 -c "print(round($routed_gib*0.5*1.02, 3))")" > $cfgs/vram50-serial.yaml
  printf 'backends:\n  experts: [auto]\nmemory:\n  ram_gb: 2\n  pin: none\ndisk:\n  direct_io: true\n' > $cfgs/disk.yaml
  printf 'backends:\n  experts: [auto]\nmemory:\n  ram_gb: 2\n  pin: none\ndisk:\n  direct_io: true\nscheduler:\n  prefetch: true\n' > $cfgs/disk-prefetch.yaml
  for c in ${CONFIGS:-ram vram100 vram50 vram50-serial disk disk-prefetch vram25 vram75 vram0}; do
    [ "$(left)" -lt 25 ] && { note "e2e $c: skipped (time)"; continue; }
    base=${c%%@*}; thr=""; [[ $c == *@* ]] && thr="--threads ${c##*@}"
    timeout $(( $(left) - 10 )) "$b/bin/bench_e2e" --model "$synth" --config $cfgs/${base%%+*}.yaml ${E2E_ARGS:---prefill 32 --decode 16 --reps 2} $([[ $base == *+ab ]] && echo --ab-overlap) $thr \
      --warmup 1 --json "$out/e2e-$c.json" > "$out/e2e-$c.log" 2>&1
    note "e2e $c: exit $?; $(grep -E '^median' "$out/e2e-$c.log")"
    grep -E "decode per token" "$out/e2e-$c.log" | tail -1 | tee -a "$summary"
    grep -E "^overlap A/B" "$out/e2e-$c.log" | tee -a "$summary"
    grep -E "peak RSS" "$out/e2e-$c.log" | tee -a "$summary"
  done
  tar czf "$out/e2e-logs.tgz" -C "$out" $(cd "$out" && ls e2e-* synth.log 2>/dev/null) 2>/dev/null && rm -f "$out"/e2e-*.log "$out"/e2e-*.json
fi

# 4. memcheck of the gemv kernels and the tier case (MEMCHECK_TC: other doctest case patterns), if time is left.
if want memcheck && command -v compute-sanitizer > /dev/null && [ "$(left)" -gt 60 ]; then
  timeout $(( $(left) - 10 )) compute-sanitizer --tool memcheck --leak-check no --error-exitcode 9 \
    "$b/bin/test_cuda" -tc="${MEMCHECK_TC:-*gemv*,*expert tiers*}" > "$out/memcheck.log" 2>&1
  note "memcheck (${MEMCHECK_TC:-*gemv*,*expert tiers*}): exit $?; $(grep -E 'ERROR SUMMARY' "$out/memcheck.log" | tail -1)"
fi
note "total $(( $(date +%s) - t0 )) s"
# The device tool brings back at most 8 files: this script's logs go back as one archive beside summary.txt.
mine=()
for f in env.txt test_cuda.log bench_cuda.log ncu-*.txt synth.log e2e-logs.tgz memcheck.log; do
  if [ -f "$out/$f" ]; then mine+=("$f"); fi
done
if [ ${#mine[@]} -gt 0 ]; then tar czf "$out/logs.tgz" -C "$out" "${mine[@]}" && (cd "$out" && rm -f "${mine[@]}"); fi
cat "$summary"
