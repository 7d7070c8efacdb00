#!/usr/bin/env bash
# The libFuzzer targets (tests/fuzz): builds them with clang, ASan and UBSan into build-fuzz/
# and runs each for a bounded time over its committed corpus (tests/fuzz/corpus/<target>/).
#
#   scripts/fuzz.sh                  build, then run every target
#   scripts/fuzz.sh --build-only     build only (scripts/test.sh does this before ctest)
#   scripts/fuzz.sh --run-only T...  run the named targets, already built (ctest's fuzz tests)
#
#   TANDEM_FUZZ_SECONDS  seconds per target (default 60); 0 replays the corpus once, no fuzzing
#   TANDEM_BUILD_JOBS    build parallelism (default: nproc)
#
# Inputs that find new coverage are kept in build-fuzz/corpus/<target>/, not in the repo (copy
# the small interesting ones into tests/fuzz/corpus/ by hand). A crash, a leak, a sanitizer
# report, a unit slower than 25 s or over 2 GiB leaves build-fuzz/artifacts/<target>/ and makes
# this script fail; reproduce with build-fuzz/fuzz/<target> <artifact>.
# Exits 77 (ctest's skip) when clang or libFuzzer's runtime is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
all_targets=(spec_fuzz schedule_csv_fuzz worker_request_fuzz)
build=1 run=1
targets=("${all_targets[@]}")
case "${1:-}" in
  --build-only) run=0 ;;
  --run-only)
    build=0
    shift
    [ $# -gt 0 ] && targets=("$@")
    ;;
  "") ;;
  *) echo "usage: $0 [--build-only | --run-only TARGET...]" >&2; exit 2 ;;
esac
seconds="${TANDEM_FUZZ_SECONDS:-60}"

if [ "$build" = 1 ]; then
  if ! command -v clang++ >/dev/null ||
     ! ls /usr/lib/llvm-*/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a >/dev/null 2>&1; then
    echo "fuzz: clang++ or libFuzzer's runtime is missing (scripts/install-deps.sh --test)" >&2
    exit 77
  fi
  export CCACHE_DIR="${CCACHE_DIR:-$HOME/.cache/ccache}"
  jobs="${TANDEM_BUILD_JOBS:-$(nproc)}"
  CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DTANDEM_FUZZ=ON -DTANDEM_BUILD_TESTS=OFF -DTANDEM_BUILD_BENCH=OFF >/dev/null
  ninja -C build-fuzz -j "$jobs" "${targets[@]}"
fi
[ "$run" = 1 ] || exit 0

export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
status=0
for t in "${targets[@]}"; do
  bin="build-fuzz/fuzz/$t"
  if [ ! -x "$bin" ]; then
    echo "fuzz: $bin is not built (scripts/fuzz.sh --build-only)" >&2
    exit 77
  fi
  seeds="tests/fuzz/corpus/$t"
  work="build-fuzz/corpus/$t"
  artifacts="build-fuzz/artifacts/$t"
  mkdir -p "$work" "$artifacts"
  dict=()
  [ -f "tests/fuzz/$t.dict" ] && dict=("-dict=tests/fuzz/$t.dict")
  if [ "$seconds" = 0 ]; then
    echo "fuzz: $t: replaying $(ls "$seeds" | wc -l) seeds"
    args=(-runs=0)
  else
    echo "fuzz: $t for ${seconds} s"
    args=(-max_total_time="$seconds" -print_final_stats=1)
  fi
  # Output goes to a log; its tail is printed (all of it on a failure).
  log="build-fuzz/$t.log"
  # The outer timeout bounds the whole run: libFuzzer's out-of-memory report walks the heap
  # and can take minutes on a big one.
  if timeout -k 10 $((seconds + 180)) "$bin" "${args[@]}" "${dict[@]}" -timeout=25 \
      -rss_limit_mb=2048 -max_len=65536 -artifact_prefix="$artifacts/" "$work" "$seeds" \
      >"$log" 2>&1; then
    grep -E "^(stat::number_of_executed_units|stat::peak_rss_mb|#[0-9]+.*(DONE|INITED))" "$log" |
      tail -4 || true
    echo "fuzz: $t: ok"
  else
    cat "$log"
    echo "fuzz: $t: FAILED (artifacts in $artifacts/)" >&2
    status=1
  fi
done
exit "$status"
