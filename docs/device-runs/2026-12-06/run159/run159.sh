#!/usr/bin/env bash
# run159: run157 again, for an H200 only (the H100 branch ran in run157/run158): on an H100 it stops at once.
set -uo pipefail
cd "$(dirname "$0")/../.."
name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
case "$name" in
  *H200*) bash build-cuda/bundle/run157.sh ;;
  *) echo "GPU: $name (not an H200: nothing to run)" ;;
esac
