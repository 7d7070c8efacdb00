#!/usr/bin/env bash
# The test suite under AddressSanitizer and UndefinedBehaviorSanitizer: builds every program
# and test binary with -fsanitize=address,undefined (TANDEM_SANITIZE, CPU code only) into
# build-asan/, then runs the unit and integration tests there. Integration tests start the
# sanitized coordinator and workers as real processes, so a daemon's memory error or undefined
# behaviour is caught too (the daemons are killed at the end of a test, so leaks are checked
# in the test binaries only). Not part of CI (the build alone is some 25 minutes
# on 2 cores); run it after changing the executor, the transports or the services.
#
#   scripts/sanitize.sh              build, then ctest -L 'unit|integration'
#   scripts/sanitize.sh -R REGEX     build, then only the tests matching REGEX
#
#   TANDEM_BUILD_JOBS  build parallelism (default: nproc)
#   TANDEM_TEST_JOBS   ctest parallelism (default: 2)
#
# A report aborts the process (halt_on_error), and ctest prints it with the failing test.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh --test
TANDEM_BUILD_DIR=build-asan ./scripts/build.sh -DTANDEM_SANITIZE=ON -DTANDEM_BUILD_BENCH=OFF
# Every sanitized process (test binaries and the daemons they start) writes its ASan reports to
# reports/asan.<pid> as well as aborting: a daemon that a fault test kills on purpose, or whose
# crash a test tolerates, still leaves its report there, and any report fails this run. UBSan's
# reports (gcc's runtime ignores log_path beside ASan) go to the process's stderr, a test's
# output or a daemon's log, and abort the process, which fails the test that needs it.
reports="$PWD/build-asan/reports"
rm -rf "$reports"
mkdir -p "$reports"
export ASAN_OPTIONS="${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1:strict_string_checks=1:detect_stack_use_after_return=1:log_path=$reports/asan}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
select=(-L 'unit|integration')
[ "${1:-}" = "-R" ] && select=(-R "$2")
# Sanitized code runs 2-5 times slower: the per-test timeout is raised to match.
status=0
ctest --test-dir build-asan --output-on-failure -j "${TANDEM_TEST_JOBS:-2}" --timeout 1200 \
  "${select[@]}" || status=$?
if [ -n "$(ls -A "$reports")" ]; then
  echo "sanitize: sanitizer reports in $reports:" >&2
  for f in "$reports"/*; do
    echo "== $f" >&2
    head -40 "$f" >&2
  done
  status=1
fi
exit "$status"
