#!/usr/bin/env bash
# End to end on the GPU machine: one synthetic GLM-5-shaped model, bench_e2e under CPU-only, CPU int8
# (cpu_vnni) and hybrid (cuda experts as far as vram_gb holds them, the rest on the CPU) configs, in one start.
#
#   Here:   BINS="bench_e2e make_synthetic_model test_cuda bench_cuda bench_kernels" tools/device/bundle.sh \
#               build-cuda build-cuda/bundle
#   There:  run(command="tools/device/hybrid_e2e.sh", carry=["build-cuda/bundle"])
# MODEL_ARGS (--layers 3 --experts 32 --vocab 2000), E2E_ARGS (--prefill 512 --decode 16 --reps 3 --warmup 1),
# VRAM_GB (0.7: about half of the synthetic model's experts). Writes $OUT/e2e_summary.txt, one JSON per config.
set -uo pipefail
cd "$(dirname "$0")/../.."
bundle=${BUNDLE:-build-cuda/bundle}
out=${OUT:-/tmp/hybrid_e2e}
mkdir -p "$out"
export LD_LIBRARY_PATH="$PWD/$bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export STRATA_CUDA_NO_EMU=1
summary="$out/e2e_summary.txt"
: > "$summary"
note() { echo "$*" | tee -a "$summary"; }
model=/tmp/strata_s32
cfg=/tmp/strata_e2e_cfg
mkdir -p "$cfg"
"$bundle/bin/make_synthetic_model" --out "$model" ${MODEL_ARGS:---layers 3 --experts 32 --vocab 2000} \
  > "$out/make_model.log" 2>&1 || { note "make_synthetic_model failed"; cat "$out/make_model.log"; exit 1; }
vram=${VRAM_GB:-0.7}
yaml() {  # name dense experts
  printf 'backends:\n  dense: %s\n  experts: %s\nmemory:\n  vram_gb: %s\n  reserve_gb: 1\nscheduler:\n  threads: 0\n  overlap: true\n' \
    "$2" "$3" "$4" > "$cfg/$1.yaml"
}
yaml cpu "[auto]" "[cpu_avx512]" 0
yaml cpu_int8 "[cpu_vnni, auto]" "[cpu_vnni, cpu_avx512]" 0
yaml hybrid "[auto]" "[cuda, cpu_avx512]" "$vram"
yaml hybrid_int8 "[cpu_vnni, auto]" "[cuda, cpu_vnni, cpu_avx512]" "$vram"
for c in ${CONFIGS:-cpu cpu_int8 hybrid hybrid_int8}; do
  start=$SECONDS
  timeout 240 "$bundle/bin/bench_e2e" --model "$model" --config "$cfg/$c.yaml" \
    ${E2E_ARGS:---prefill 512 --decode 16 --reps 3 --warmup 1} --json "$out/e2e_$c.json" > "$out/e2e_$c.log" 2>&1
  rc=$?
  note "== $c (exit $rc, $((SECONDS - start)) s)"
  grep -E '^median of|dense=|per token:|^warning|^  (ram|vram):' "$out/e2e_$c.log" | head -12 | tee -a "$summary"
done
