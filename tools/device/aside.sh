#!/usr/bin/env bash
# Sets tracked files the device runs do not need outside the checkout, and puts them back: the working tree
# (tracked files) travels to the device machine with what is carried, 64 MiB in all, and the tree alone is
# ~70 MB (the bundled model and the fixtures). test_cuda on the device then runs the other 14 fixtures.
#
#   tools/device/aside.sh out     before a device run (moves them to $ASIDE, default /tmp/strata-aside)
#   tools/device/aside.sh back    after it (before any commit: git sees them as deleted meanwhile)
set -euo pipefail
cd "$(dirname "$0")/../.."
aside=${ASIDE:-/tmp/strata-aside}
paths=(models/strata-nano/model-00001-of-00001.safetensors tests/fixtures/glm_moe_dsa-q4-alt
       tests/fixtures/deepseek_v3-alt)
case "${1:-}" in
  out)
    [ -e "$aside" ] && { echo "aside.sh: $aside exists (run 'aside.sh back' first)" >&2; exit 1; }
    for p in "${paths[@]}"; do mkdir -p "$aside/$(dirname "$p")"; mv "$p" "$aside/$p"; done
    echo "aside.sh: ${#paths[@]} paths in $aside; the tree: $(git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1) bytes"
    ;;
  back)
    [ -d "$aside" ] || { echo "aside.sh: nothing in $aside" >&2; exit 1; }
    for p in "${paths[@]}"; do [ -e "$aside/$p" ] && mv "$aside/$p" "$p"; done
    rm -rf "$aside"
    git status --short -- "${paths[@]}"
    echo "aside.sh: back"
    ;;
  *) echo "usage: aside.sh out|back" >&2; exit 2 ;;
esac
