#!/usr/bin/env bash
# scripts/gpu-bundle.sh packs what this build made, and gpu-check.sh --prebuilt takes the bundle:
# it unpacks it, puts its lib/ on the loader path and names the commit it was built from.
#   gpu_bundle_test.sh BUILD_DIR WORK_DIR
# Skips (77) where the build has no CUDA programs (no nvcc on this machine).
set -uo pipefail
build="$1"
work="$2"
root="$(cd "$(dirname "$0")/../.." && pwd)"
[ -x "$build/bin/bench_gpu_gpt" ] || { echo "no CUDA programs in $build: skipped"; exit 77; }
rm -rf "$work" && mkdir -p "$work"
fail() { echo "FAIL: $*"; exit 1; }
XZ_OPT=-T0 "$root/scripts/gpu-bundle.sh" --no-build --build-dir "$build" \
  --out "$work/gpu-prebuilt.tar.xz" || fail "gpu-bundle.sh"
listing="$(tar -tJf "$work/gpu-prebuilt.tar.xz")"
for f in bin/tandem-worker bin/bench_gpu_gpt tests/worker_conformance_test MANIFEST; do
  grep -qx "gpu-prebuilt/$f" <<<"$listing" || fail "the bundle has no $f"
done
# gRPC travels; the C++ runtime and the CUDA runtime stay with the device.
grep -q "gpu-prebuilt/lib/libgrpc++" <<<"$listing" || fail "the bundle has no libgrpc++"
grep -qE "gpu-prebuilt/lib/(libstdc\+\+|libcudart|libc\.)" <<<"$listing" &&
  fail "the bundle carries a library the device provides"
# On a machine with a GPU the real check would run; here only its unpacking is exercised, and
# it stops at the missing driver (exit 2) after naming the bundle's commit.
if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
  echo "a GPU is here: not running gpu-check.sh from a test"
  exit 0
fi
out="$(TANDEM_GPU_BUDGET=30 PYTHON=/bin/false "$root/scripts/gpu-check.sh" \
  --prebuilt "$work/gpu-prebuilt.tar.xz" 2>&1)"
rc=$?
echo "$out"
[ "$rc" = 2 ] || fail "gpu-check.sh --prebuilt without a GPU exited $rc, not 2"
[ -x "$work/gpu-prebuilt/bin/tandem-worker" ] || fail "gpu-check.sh did not unpack the bundle"
grep -q "prebuilt from commit $(git -C "$root" rev-parse HEAD)" <<<"$out" ||
  fail "gpu-check.sh did not name the bundle's commit"
# The bundled CLI runs from the bundle's libraries.
LD_LIBRARY_PATH="$work/gpu-prebuilt/lib" "$work/gpu-prebuilt/bin/tandem" --help >/dev/null 2>&1 ||
  fail "the bundled tandem does not start"
echo "PASS"
