#!/usr/bin/env bash
# Installs the Debian 12 packages Tandem builds with (idempotent; needs root or sudo).
set -euo pipefail
packages=(
  g++ cmake ninja-build ccache pkg-config make
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libabsl-dev
  libspdlog-dev libfmt-dev libgtest-dev libgmock-dev libopenblas-dev libgloo-dev
  libsqlite3-dev libyaml-cpp-dev nlohmann-json3-dev
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"
echo "installing: ${missing[*]}"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
