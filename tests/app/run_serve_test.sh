#!/usr/bin/env bash
# Runs tests/app/test_serve.py with the real `openai` client from a venv in the build tree (created on first use).
set -euo pipefail
bin=$1 model=$2 venv=$3 script=$4
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c "import openai" 2>/dev/null; then
  python3 -m venv "$venv"
  # (PyPI sometimes answers with no versions for a while: three tries, a pause between them)
  for try in 1 2 3; do
    "$venv/bin/pip" install -q --disable-pip-version-check "openai>=1.30" && break
    [ "$try" = 3 ] && { echo "run_serve_test.sh: could not install the openai client from PyPI (3 tries)" >&2; exit 1; }
    sleep 20
  done
fi
exec "$venv/bin/python" "$script" --bin "$bin" --model "$model"
