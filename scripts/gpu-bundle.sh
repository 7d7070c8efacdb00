#!/usr/bin/env bash
# Build the GPU check's programs here (where nvcc, NCCL and the Debian -dev packages are) and
# pack them for a device machine that has a GPU, a driver and the CUDA runtime but neither the
# build packages nor a network (the lent H200 is such a machine: see docs/benchmarks.md, "GPU").
#
#   scripts/gpu-bundle.sh [--build-dir DIR] [--out FILE] [--no-build] [--dry-run]
#   env: CMAKE_CUDA_ARCHITECTURES (90), TANDEM_BUILD_JOBS (nproc)
#
# The bundle (FILE, default gpu-prebuilt.tar.xz) holds, under gpu-prebuilt/:
#   bin/    tandem, tandem-coordinator, tandem-worker and the GPU benchmarks, stripped;
#   tests/  the CUDA and NCCL test programs gpu-check runs, stripped;
#   lib/    every shared library those programs load that is not part of the C runtime, the
#           C++ runtime or the CUDA toolkit/driver (those the device has; copying them would
#           fight its driver): gRPC, protobuf, Abseil, Gloo, OpenBLAS and their dependencies;
#   MANIFEST the commit it was built from, the CUDA architectures, and every file with its size.
# On the device, from the same commit's checkout, one command runs the whole check:
#   scripts/gpu-check.sh --prebuilt gpu-prebuilt.tar.xz
# (it unpacks the bundle and puts lib/ and the toolkit's lib64 on LD_LIBRARY_PATH itself).
# The bundle is build output: never commit it (.gitignore lists it).
#
# Exit: 0 the bundle is written and every program's dependencies resolve from it or from the
# libraries it leaves to the device; 1 a build or a check failed; 2 bad arguments or tools.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
build_dir="build-gpu"
out="gpu-prebuilt.tar.xz"
build=1
dry_run=0
usage="usage: $0 [--build-dir DIR] [--out FILE.tar.xz] [--no-build] [--dry-run]"
while [ $# -gt 0 ]; do
  case "$1" in
    --build-dir | --out)
      [ $# -ge 2 ] && [ -n "$2" ] || { echo "$1 needs a value; $usage" >&2; exit 2; }
      case "$1" in --build-dir) build_dir="$2" ;; --out) out="$2" ;; esac
      shift 2 ;;
    --no-build) build=0; shift ;;
    --dry-run) dry_run=1; shift ;;
    *) echo "$usage" >&2; exit 2 ;;
  esac
done
case "$out" in *.tar.xz) ;; *) echo "--out $out: the bundle is a .tar.xz" >&2; exit 2 ;; esac
arch="${CMAKE_CUDA_ARCHITECTURES:-90}"
jobs="${TANDEM_BUILD_JOBS:-$(nproc)}"

# What gpu-check.sh runs (its "targets"), split by where it looks for them.
bins=(tandem tandem-coordinator tandem-worker bench_gpu_gpt bench_host_staged bench_nccl_p2p)
tests=(worker_cuda_kernels_test worker_gpu_gpt_test worker_gpu_llama_test worker_conformance_test
  worker_cuda_device_copier_test worker_nccl_collectives_test worker_nccl_transport_test)

# Libraries the device provides: the C and C++ runtimes, the dynamic loader, and the CUDA
# runtime, cuBLAS and NCCL (matched to its driver). Everything else travels in lib/.
device_provides='^(linux-vdso|ld-linux|libc\.|libm\.|libdl\.|libpthread\.|librt\.|libstdc\+\+\.|libgcc_s\.|libcuda\.|libcudart\.|libcublas\.|libcublasLt\.|libnccl\.|libnvidia-)'

if [ "$dry_run" = 1 ]; then
  [ "$build" = 1 ] && echo "would: scripts/build.sh-style configure of $build_dir with CUDA (CMAKE_CUDA_ARCHITECTURES=$arch) and ninja -j $jobs ${bins[*]} ${tests[*]}"
  echo "would: strip ${bins[*]} into gpu-prebuilt/bin and ${tests[*]} into gpu-prebuilt/tests"
  echo "would: copy their shared libraries except those matching $device_provides into gpu-prebuilt/lib"
  echo "would: check every dependency resolves, write gpu-prebuilt/MANIFEST and pack $out"
  echo "dry run: nothing was built or written"
  exit 0
fi
for c in strip ldd tar xz; do
  command -v "$c" >/dev/null || { echo "gpu-bundle: needs $c" >&2; exit 2; }
done

if [ "$build" = 1 ]; then
  nvcc=""
  for c in "$(command -v nvcc || true)" /usr/local/cuda/bin/nvcc /usr/local/cuda-*/bin/nvcc; do
    [ -n "$c" ] && [ -x "$c" ] && { nvcc="$(readlink -f "$c")"; break; }
  done
  [ -n "$nvcc" ] || { echo "gpu-bundle: no nvcc (scripts/install-cuda-toolkit.sh)" >&2; exit 2; }
  export CCACHE_DIR="${CCACHE_DIR:-$HOME/.cache/ccache}"
  cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CUDA_ARCHITECTURES="$arch" -DCMAKE_CUDA_COMPILER="$nvcc" \
    -DCUDAToolkit_ROOT="$(dirname "$(dirname "$nvcc")")" >"$build_dir.configure.log" 2>&1 || {
    tail -20 "$build_dir.configure.log"; echo "FAIL: configure" >&2; exit 1; }
  grep -q "Tandem: CUDA support ON" "$build_dir.configure.log" || {
    grep "Tandem:" "$build_dir.configure.log"; echo "FAIL: CMake did not enable CUDA" >&2; exit 1; }
  ninja -C "$build_dir" -j "$jobs" "${bins[@]}" "${tests[@]}" || { echo "FAIL: build" >&2; exit 1; }
fi

stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT
root="$stage/gpu-prebuilt"
mkdir -p "$root/bin" "$root/tests" "$root/lib"
for b in "${bins[@]}"; do
  [ -x "$build_dir/bin/$b" ] || { echo "FAIL: $build_dir/bin/$b is not built" >&2; exit 1; }
  strip -o "$root/bin/$b" "$build_dir/bin/$b" || exit 1
done
for t in "${tests[@]}"; do
  [ -x "$build_dir/tests/$t" ] || { echo "FAIL: $build_dir/tests/$t is not built" >&2; exit 1; }
  strip -o "$root/tests/$t" "$build_dir/tests/$t" || exit 1
done

# ldd lists the whole closure (a library's own dependencies too), so one pass per program
# is enough. `cp -L` follows Debian's alternatives links (libopenblas.so.0).
unresolved=()
for f in "$root"/bin/* "$root"/tests/*; do
  while read -r name arrow path _; do
    [ "$arrow" = "=>" ] || continue
    [[ "$name" =~ $device_provides ]] && continue
    if [ "$path" = "not" ]; then
      unresolved+=("$(basename "$f"): $name")
      continue
    fi
    [ -e "$root/lib/$name" ] || cp -L "$path" "$root/lib/$name" || exit 1
  done < <(ldd "$f")
done
if [ ${#unresolved[@]} -gt 0 ]; then
  echo "FAIL: libraries not found here, so not bundled:" >&2
  printf '  %s\n' "${unresolved[@]}" >&2
  exit 1
fi
# The check a device would make: with only lib/ added, nothing but what the device provides
# may be looked up elsewhere. (Here the system has everything, so resolve against lib/ first
# and require each bundled name to come from it.)
bad=()
for f in "$root"/bin/* "$root"/tests/*; do
  while read -r name arrow path _; do
    [ "$arrow" = "=>" ] || continue
    [[ "$name" =~ $device_provides ]] && continue
    [ "$path" = "$root/lib/$name" ] || bad+=("$(basename "$f"): $name -> $path")
  done < <(LD_LIBRARY_PATH="$root/lib" ldd "$f")
done
if [ ${#bad[@]} -gt 0 ]; then
  echo "FAIL: dependencies that would not come from the bundle:" >&2
  printf '  %s\n' "${bad[@]}" >&2
  exit 1
fi

{
  echo "commit $(git rev-parse HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD 2>/dev/null || echo ' (with uncommitted changes)')"
  echo "cuda_architectures $arch"
  echo "built_on $(uname -srm)"
  (cd "$root" && find bin tests lib -type f -printf '%s %p\n' | sort -k2)
} >"$root/MANIFEST"
mkdir -p "$(dirname "$out")"
tar -C "$stage" -cJf "$out" gpu-prebuilt || { echo "FAIL: tar" >&2; exit 1; }
echo "wrote $out ($(du -h "$out" | cut -f1); $(ls "$root/bin" | wc -l) programs," \
  "$(ls "$root/tests" | wc -l) tests, $(ls "$root/lib" | wc -l) libraries)"
echo "on the device: scripts/gpu-check.sh --prebuilt $(basename "$out")"
