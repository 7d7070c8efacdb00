#!/usr/bin/env bash
# Configures and builds Tandem into build/ (Ninja + ccache). Extra arguments go to cmake.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
export CCACHE_DIR="${CCACHE_DIR:-$HOME/.cache/ccache}"
jobs="${TANDEM_BUILD_JOBS:-$(nproc)}"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" >/dev/null
ninja -C build -j "$jobs"
