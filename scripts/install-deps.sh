#!/usr/bin/env bash
# Installs strata's build and test dependencies from Debian 12 packages (skips apt when all are present).
set -euo pipefail
packages=(
  build-essential cmake ninja-build ccache pkg-config
  libtbb-dev libboost-dev libboost-filesystem-dev libfmt-dev libyaml-cpp-dev
  doctest-dev nlohmann-json3-dev libcli11-dev libspdlog-dev
  libpcre2-dev libutf8proc-dev libcpp-httplib-dev libssl-dev zlib1g-dev python3-venv liburing-dev
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi
sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
echo "install-deps: installing ${missing[*]}"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
