#!/usr/bin/env bash
# Runs tests/app/test_serve.py with the real `openai` client from a venv in the build tree (created on first use).
set -euo pipefail
bin=$1 model=$2 venv=$3 script=$4
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c "import openai" 2>/dev/null; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check "openai>=1.30"
fi
exec "$venv/bin/python" "$script" --bin "$bin" --model "$model"
