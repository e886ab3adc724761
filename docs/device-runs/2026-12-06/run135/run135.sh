#!/usr/bin/env bash
# run135: the session's final code on whatever card a call naming nvidia-h200 gets: test_cuda, the layer A/B
# (2 passes), the timeline with tile records (8 experts).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT0=$OUT
nvidia-smi --query-gpu=name --format=csv,noheader
OUT=$OUT0/ab TESTS=1 PASSES=2 bash tools/device/layer_ab.sh 2>&1 | cut -c1-300
OUT=$OUT0/tl CSV=1 TESTS=0 ROUNDS=3 EXPERTS2= bash tools/device/layer_timeline.sh > /dev/null 2>&1
grep -E "device us|tickets out|median queued" $OUT0/tl/summary.txt | cut -c1-200
