#!/usr/bin/env bash
# run133: a gate/up tile counting with atom.release (no L1 invalidation) and only the group's last tile
# acquiring after it (STRATA_CUDA_LAYER_COUNT=release) against atom.acq_rel in every tile: test_cuda's
# layer-kernel cases (both in it), the layer A/B (3 passes), the timelines with tile records.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT0=$OUT
OUT=$OUT0/ab TEST_CASES='*layer kernel*' TESTS=1 PASSES=3 VARIANTS='- STRATA_CUDA_LAYER_COUNT=release' \
  bash tools/device/layer_ab.sh > /dev/null 2>&1
OUT=$OUT0/tl CSV=1 TESTS=0 ROUNDS=3 EXPERTS2= VARIANTS='- STRATA_CUDA_LAYER_COUNT=release' \
  bash tools/device/layer_timeline.sh > /dev/null 2>&1
cut -c1-330 $OUT0/ab/summary.txt; grep -E "device us|tickets out|gu count|count, max|dep wait|==" $OUT0/tl/summary.txt

