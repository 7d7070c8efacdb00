#!/usr/bin/env bash
# Builds Tandem and runs the whole test suite (unit + integration with real processes on
# 127.0.0.1). This is the command CI runs.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh --test
./scripts/build.sh
ctest --test-dir build --output-on-failure -j "${TANDEM_TEST_JOBS:-2}" --timeout 300
