#!/usr/bin/env bash
# Bundles the built binaries, plugins and the non-system shared libraries they need into one folder, so the GPU
# machine (no apt there) can run them: tools/device/bundle.sh [BUILD_DIR] [OUT_DIR]; then run with
# LD_LIBRARY_PATH=OUT_DIR/lib OUT_DIR/bin/<program>. BINS="test_cuda bench_cuda" bundles only those programs
# (and the libraries they need): the tree and what is carried travel to the device within 64 MiB together.
# Only OUT_DIR's bin/ and lib/ are replaced: files beside them (a run script written into the bundle) stay.
set -euo pipefail
build=${1:-build}
out=${2:-devbundle}
rm -rf "$out/bin" "$out/lib"
mkdir -p "$out/bin" "$out/lib/strata/plugins"
for b in ${BINS:-strata bench_kernels bench_decode bench_e2e make_synthetic_model bench_cuda bench_read test_cuda}; do
  [ -x "$build/bin/$b" ] && cp "$build/bin/$b" "$out/bin/"
done
cp "$build"/lib/libstrata_core.so "$out/lib/"
cp "$build"/lib/strata/plugins/*.so "$out/lib/strata/plugins/"
# Libraries outside glibc / the C++ runtime that the binaries need (TBB, fmt, yaml-cpp, Boost, ...).
for f in "$out"/bin/* "$out"/lib/*.so "$out"/lib/strata/plugins/*.so; do
  ldd "$f" | awk '/=> \// {print $3}' | grep -v "/devbundle/\|libstrata_"
done | sort -u | grep -Ev '/(libc|libm|libpthread|libdl|librt|libgcc_s|libstdc\+\+|ld-linux)[.-]' | while read -r lib; do
  cp -L "$lib" "$out/lib/"
done
strip --strip-unneeded "$out"/bin/* "$out"/lib/*.so* "$out"/lib/strata/plugins/*.so 2>/dev/null || true
du -sh "$out"
