#!/usr/bin/env bash
# run125: the layer kernel's raw tile records (timeline CSV, 8 and 32 experts), then the layer A/B of the modes.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT0=$OUT
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv > $OUT0/gpu.txt 2>&1
OUT=$OUT0/tl CSV=1 TESTS=0 ROUNDS=3 bash tools/device/layer_timeline.sh > /dev/null 2>&1
OUT=$OUT0/ab TESTS=0 PASSES=2 bash tools/device/layer_ab.sh > /dev/null 2>&1
cat $OUT0/gpu.txt; cat $OUT0/tl/summary.txt | grep -v "in flight per" | cut -c1-400; cat $OUT0/ab/summary.txt
