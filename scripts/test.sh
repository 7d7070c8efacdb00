#!/usr/bin/env bash
# Builds Tandem and runs the whole test suite (unit + integration with real processes on
# 127.0.0.1). This is the command CI runs.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh --test
./scripts/build.sh
# The lock annotations, checked by clang's thread-safety analysis over every file (syntax
# only; 77: no clang here).
thread_safety=0
./scripts/thread-safety.sh || thread_safety=$?
if [ "$thread_safety" -ne 0 ] && [ "$thread_safety" -ne 77 ]; then exit "$thread_safety"; fi
# The fuzz targets (clang, sanitizers) in build-fuzz/; ctest runs them (label fuzz) for
# TANDEM_FUZZ_SECONDS each (default 60). 77: no clang here, and ctest skips them.
fuzz_build=0
./scripts/fuzz.sh --build-only || fuzz_build=$?
if [ "$fuzz_build" -ne 0 ] && [ "$fuzz_build" -ne 77 ]; then exit "$fuzz_build"; fi
ctest --test-dir build --output-on-failure -j "${TANDEM_TEST_JOBS:-2}" --timeout 300
