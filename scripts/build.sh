#!/usr/bin/env bash
# Configures and builds Tandem into build/ (Ninja + ccache). Extra arguments go to cmake.
#   TANDEM_BUILD_DIR  another build directory (scripts/sanitize.sh's build-asan/)
#   --programs   build only the three programs (tandem-coordinator, tandem-worker, tandem),
#                not the tests and benchmarks: what scripts/demo.sh needs.
set -euo pipefail
cd "$(dirname "$0")/.."
targets=()
if [ "${1:-}" = "--programs" ]; then
  targets=(tandem-coordinator tandem-worker tandem)
  shift
fi
./scripts/install-deps.sh
export CCACHE_DIR="${CCACHE_DIR:-$HOME/.cache/ccache}"
# The cache is keyed by paths relative to the checkout's parent, so another clone or build
# directory of the same sources hits it too.
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$(dirname "$PWD")}" CCACHE_NOHASHDIR="${CCACHE_NOHASHDIR:-1}"
jobs="${TANDEM_BUILD_JOBS:-$(nproc)}"
dir="${TANDEM_BUILD_DIR:-build}"
cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" >/dev/null
ninja -C "$dir" -j "$jobs" "${targets[@]}"
