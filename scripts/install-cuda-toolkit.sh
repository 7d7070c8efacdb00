#!/usr/bin/env bash
# Installs what Tandem's CUDA backend and NCCL transport build with on Debian 12 (x86_64), from
# NVIDIA's apt repository for Debian 12: its keyring package, then nvcc, the CUDA runtime,
# cuBLAS / cuBLASLt and NCCL for CUDA 13.0 (TANDEM_CUDA_VERSION=MAJOR-MINOR overrides, e.g.
# 12-9), under /usr/local/cuda-<version> and /usr/lib (NCCL). Needs root or sudo and access to
# developer.download.nvidia.com. Does nothing when nvcc and nccl.h are already there (as on
# the CI machines and NVIDIA's images). Put /usr/local/cuda/bin on PATH before building
# (scripts/build.sh finds nvcc there; without it the build is CPU-only). The GPU image's
# build stage (deploy/docker/Dockerfile.gpu) runs this.
set -euo pipefail
version="${TANDEM_CUDA_VERSION:-13-0}"
if ! [[ "$version" =~ ^[0-9]+-[0-9]+$ ]]; then
  echo "TANDEM_CUDA_VERSION must be MAJOR-MINOR (e.g. 13-0), got '$version'" >&2
  exit 2
fi
dotted="${version/-/.}"
nvcc="/usr/local/cuda-$dotted/bin/nvcc"
have_nccl() {
  [ -f /usr/include/nccl.h ] || [ -f "/usr/local/cuda-$dotted/include/nccl.h" ]
}
if [ -x "$nvcc" ] && have_nccl; then
  echo "CUDA $dotted toolkit and NCCL present ($nvcc)"
  exit 0
fi
sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends ca-certificates curl >/dev/null
keyring="$(mktemp --suffix=.deb)"
trap 'rm -f "$keyring"' EXIT
curl -fsSL -o "$keyring" \
  https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/cuda-keyring_1.1-1_all.deb
$sudo dpkg -i "$keyring" >/dev/null
$sudo apt-get update -qq
# NCCL is packaged per CUDA release ("2.28.7-1+cuda13.0"): the newest build for this one.
nccl="$(apt-cache madison libnccl-dev | awk -v v="+cuda$dotted" 'index($3, v) {print $3; exit}')"
if [ -z "$nccl" ]; then
  echo "NVIDIA's repository has no libnccl-dev for CUDA $dotted" >&2
  exit 1
fi
echo "installing: cuda-nvcc-$version cuda-cudart-dev-$version libcublas-dev-$version" \
  "libnccl-dev=$nccl (NVIDIA's repository)"
$sudo apt-get install -y -qq --no-install-recommends "cuda-nvcc-$version" \
  "cuda-cudart-dev-$version" "libcublas-dev-$version" "libnccl2=$nccl" "libnccl-dev=$nccl" \
  >/dev/null
"$nvcc" --version | tail -1
