#!/usr/bin/env bash
# bundle.sh [--cuda] BIN_DIR DEST: copies tandem-coordinator, tandem-worker and tandem from BIN_DIR to
# DEST/bin, and every shared library they load (as ldd resolves it on the build machine) to
# DEST/lib, except the C and C++ runtimes that every base image has (glibc, libstdc++,
# libgcc_s) and that are newer there, never older. The images' runtime stages then need no
# packages nor a matching distribution. The programs must be linked with the DT_RPATH
# $ORIGIN/../lib (the Dockerfiles' build.sh flags): unlike RUNPATH it also serves the
# libraries' own dependencies, and unlike /etc/ld.so.conf.d it leaves the base image's
# programs on the base image's libraries.
#   --cuda  for the GPU image: tandem-worker must link the CUDA runtime, cuBLAS and NCCL (a
#           build that did not find the toolkit fails here, not on a GPU node), and those
#           libraries are left out: NVIDIA's CUDA runtime image has them, matched to its driver
#           stack (and the driver's libcuda comes from the node, never from an image).
set -euo pipefail
cuda=0
if [ "${1:-}" = "--cuda" ]; then
  cuda=1
  shift
fi
[ $# = 2 ] || {
  echo "usage: bundle.sh [--cuda] BIN_DIR DEST" >&2
  exit 2
}
bin="$1" dest="$2"
cuda_libs='^lib(cudart|cublas|cublasLt|nccl|cuda|nvidia-.*)\.so'
if [ "$cuda" = 1 ]; then
  for lib in libcudart libcublas libcublasLt libnccl; do
    if ! ldd "$bin/tandem-worker" | grep -q "^[[:space:]]*$lib\.so"; then
      echo "$bin/tandem-worker does not link $lib: it was built without the CUDA toolkit" \
        "(scripts/install-cuda-toolkit.sh, and nvcc on PATH)" >&2
      exit 1
    fi
  done
fi
mkdir -p "$dest/bin" "$dest/lib"
programs=(tandem-coordinator tandem-worker tandem)
for p in "${programs[@]}"; do
  if ! readelf -d "$bin/$p" | grep -q '(RPATH).*\[\$ORIGIN/../lib\]'; then
    echo "$bin/$p has no DT_RPATH \$ORIGIN/../lib: build with" \
      "-DCMAKE_BUILD_WITH_INSTALL_RPATH=ON -DCMAKE_INSTALL_RPATH='\$ORIGIN/../lib'" \
      "-DCMAKE_EXE_LINKER_FLAGS=-Wl,--disable-new-dtags" >&2
    exit 1
  fi
  install -m 0755 "$bin/$p" "$dest/bin/$p"
done
for p in "${programs[@]}"; do
  ldd "$bin/$p"
done | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | sort -u | while read -r name path; do
  case "$name" in
    linux-vdso.so.* | ld-linux*.so.* | libc.so.* | libm.so.* | libpthread.so.* | libdl.so.* | \
      librt.so.* | libresolv.so.* | libutil.so.* | libstdc++.so.* | libgcc_s.so.*) continue ;;
  esac
  if [ "$cuda" = 1 ] && [[ "$name" =~ $cuda_libs ]]; then continue; fi
  cp -L "$path" "$dest/lib/$name"
done
# Debug information stays in the build stage.
strip --strip-debug "$dest"/bin/* "$dest"/lib/*
echo "bundled ${programs[*]} and $(ls "$dest/lib" | wc -l) libraries into $dest"
