#!/usr/bin/env bash
# run134: the session's final code (release counts): test_cuda, the layer A/B of the modes (2 passes).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=$OUT/ab TESTS=1 PASSES=2 bash tools/device/layer_ab.sh 2>&1 | cut -c1-420
