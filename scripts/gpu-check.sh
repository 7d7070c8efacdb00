#!/usr/bin/env bash
# The GPU check (issue 6), one command for a machine with an NVIDIA GPU (H100 / H200), CUDA 13,
# the Debian build packages and PyTorch already installed, and no network:
#   1. configures build-gpu/ (scripts/build.sh's flags, CMAKE_CUDA_ARCHITECTURES=90 unless set)
#      and builds only the CUDA tests, the daemons, bench_gpu_gpt and bench_nccl_p2p;
#   2. runs the CUDA tests (worker_cuda_kernels_test, worker_gpu_gpt_test, the StageCompute
#      conformance suite worker_conformance_test with its cuda_fp32 / cuda_bf16 cases, and
#      worker_nccl_transport_test where built); a test that skips for want of a device fails
#      the check (this machine is meant to have one; the NCCL pair tests need two GPUs and
#      are only reported);
#   3. runs examples/gpu-pipeline.yaml through the daemons: a local coordinator and one
#      `tandem-worker --device cuda:0` holding both of its stages, until SUCCEEDED;
#   4. runs bench_gpu_gpt and bench/torch_gpt_gpu.py with the same shapes and steps, and prints
#      both results and their ratio; where two GPUs exist, bench_nccl_p2p (NCCL point-to-point
#      through NcclTransport beside cudaMemcpyPeer on the same pair: the 90% target).
# Every part runs under `timeout`, within an 8-minute budget overall.
#
#   scripts/gpu-check.sh [--batch 8] [--steps 10] [--warmup 3]
#   env: TANDEM_GPU_BUILD_DIR (build-gpu), CMAKE_CUDA_ARCHITECTURES (90), PYTHON (python3),
#        PEAK_TFLOPS (989), TANDEM_BUILD_JOBS (nproc)
#
# It installs nothing: scripts/install-deps.sh runs apt-get for any missing package, which
# needs the network, so this script only checks for the packages and names the missing ones.
# Exit: 0 all passed and both benchmarks ran; 1 a build, test or benchmark failed; 2 a
# prerequisite is missing; 3 the tests passed but PyTorch is missing (no ratio).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
root="$(pwd)"
start=$(date +%s)
budget=470 # seconds, under the 8 minutes
build_dir="${TANDEM_GPU_BUILD_DIR:-build-gpu}"
arch="${CMAKE_CUDA_ARCHITECTURES:-90}"
python="${PYTHON:-python3}"
peak="${PEAK_TFLOPS:-989}"
jobs="${TANDEM_BUILD_JOBS:-$(nproc)}"
batch=8
steps=10
warmup=3
while [ $# -gt 0 ]; do
  case "$1" in
    --batch) batch="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    --warmup) warmup="$2"; shift 2 ;;
    *) echo "usage: $0 [--batch B] [--steps N] [--warmup N]" >&2; exit 2 ;;
  esac
done
log_dir="$build_dir/gpu-check"
mkdir -p "$log_dir"

say() { printf '\n== %s (%ds)\n' "$*" "$(($(date +%s) - start))"; }
# The smaller of $1 seconds and what is left of the budget (at least 1).
cap() {
  local left=$((budget - ($(date +%s) - start)))
  [ "$left" -lt 1 ] && left=1
  [ "$1" -lt "$left" ] && echo "$1" || echo "$left"
}

# ---- 1. Prerequisites (offline: nothing is installed).
say "prerequisites"
missing=()
for c in cmake ninja g++; do command -v "$c" >/dev/null || missing+=("$c (command)"); done
nvcc=""
for c in /usr/local/cuda/bin/nvcc "$(command -v nvcc || true)"; do
  [ -n "$c" ] && [ -x "$c" ] && { nvcc="$c"; break; }
done
[ -z "$nvcc" ] && missing+=("nvcc (CUDA toolkit, expected at /usr/local/cuda)")
if command -v dpkg-query >/dev/null; then
  # The build packages of scripts/install-deps.sh (without its --test extras).
  for p in libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libabsl-dev \
    libspdlog-dev libfmt-dev libgtest-dev libgmock-dev libopenblas-dev libgloo-dev \
    libsqlite3-dev zlib1g-dev libyaml-cpp-dev nlohmann-json3-dev libcpp-httplib-dev libssl-dev; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
      missing+=("$p (Debian package)")
  done
fi
if [ ${#missing[@]} -gt 0 ]; then
  echo "missing, and this script does not install anything (no network here):"
  printf '  %s\n' "${missing[@]}"
  echo "install them on a machine with network access (scripts/install-deps.sh), then rerun"
  exit 2
fi
[ -n "$nvcc" ] && "$nvcc" --version | tail -1
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
else
  echo "warning: nvidia-smi not found; the tests will say whether a device is usable"
fi
have_torch=1
if ! torch_info="$("$python" -c 'import torch; print(torch.__version__, torch.version.cuda, torch.cuda.is_available())' 2>&1)"; then
  have_torch=0
  echo "PyTorch: not importable by $python ($(echo "$torch_info" | tail -1)); the torch benchmark will not run"
else
  echo "PyTorch (version, CUDA, device usable): $torch_info"
fi

# ---- 2. Configure and build only what the check needs.
say "configure $build_dir (CMAKE_CUDA_ARCHITECTURES=$arch)"
export CCACHE_DIR="${CCACHE_DIR:-$HOME/.cache/ccache}"
if ! timeout "$(cap 120)" cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CUDA_ARCHITECTURES="$arch" >"$log_dir/configure.log" 2>&1; then
  tail -30 "$log_dir/configure.log"
  echo "FAIL: configure (log: $log_dir/configure.log)"
  exit 1
fi
if ! grep -q "Tandem: CUDA support ON" "$log_dir/configure.log" ||
  grep -q "NCCL not found" "$log_dir/configure.log"; then
  grep "Tandem:" "$log_dir/configure.log"
  echo "FAIL: CMake did not enable the CUDA backend (CUDA toolkit or NCCL not found)"
  exit 2
fi
targets=(worker_cuda_kernels_test worker_gpu_gpt_test worker_conformance_test bench_gpu_gpt
  tandem-coordinator tandem-worker tandem)
if ninja -C "$build_dir" -t targets all 2>/dev/null | grep -q '^worker_nccl_transport_test:'; then
  targets+=(worker_nccl_transport_test bench_nccl_p2p)
fi
say "build ${targets[*]} (-j $jobs)"
if ! timeout "$(cap 240)" ninja -C "$build_dir" -j "$jobs" "${targets[@]}" \
  >"$log_dir/build.log" 2>&1; then
  grep -E "error|FAILED" "$log_dir/build.log" | head -30
  echo "FAIL: build (log: $log_dir/build.log)"
  exit 1
fi

# ---- 3. Conformance tests.
failed=()
for t in worker_cuda_kernels_test worker_gpu_gpt_test worker_conformance_test \
  worker_nccl_transport_test; do
  bin="$build_dir/tests/$t"
  [ -x "$bin" ] || continue
  say "test $t"
  log="$log_dir/$t.log"
  timeout "$(cap 90)" "$bin" >"$log" 2>&1
  rc=$?
  grep -E '^\[==========\] .* ran|^\[ +(PASSED|SKIPPED|FAILED) +\] [0-9]+ test' "$log" || true
  if [ "$rc" -ne 0 ]; then
    grep -E -B2 -A12 'Failure|^\[  FAILED' "$log" | head -60
    [ "$rc" -eq 124 ] && echo "(timed out)"
    failed+=("$t (rc $rc)")
  elif grep -q "no CUDA device" "$log"; then
    grep -m1 "no CUDA device" "$log"
    failed+=("$t (skipped: no usable device)")
  fi
done

# ---- 3b. A pipeline job on the GPU through the daemons.
say "examples/gpu-pipeline.yaml on tandem-worker --device cuda:0"
run="$log_dir/cluster"
rm -rf "$run" && mkdir -p "$run"
bin="$build_dir/bin"
daemons=()
"$bin/tandem-coordinator" --listen 127.0.0.1:0 --port-file "$run/coordinator.port" \
  --data-root "$run/store" >"$run/coordinator.log" 2>&1 &
daemons+=($!)
for _ in $(seq 100); do [ -s "$run/coordinator.port" ] && break; sleep 0.1; done
export TANDEM_COORDINATOR="127.0.0.1:$(cat "$run/coordinator.port" 2>/dev/null)"
"$bin/tandem-worker" --coordinator "$TANDEM_COORDINATOR" --listen 127.0.0.1:0 --device cuda:0 \
  >"$run/worker.log" 2>&1 &
daemons+=($!)
pipeline_ok=0
if job="$(timeout 20 "$bin/tandem" submit examples/gpu-pipeline.yaml)"; then
  timeout "$(cap 120)" "$bin/tandem" watch "$job" | tail -5
  "$bin/tandem" status "$job" | tee "$run/status.txt"
  grep -q "SUCCEEDED" "$run/status.txt" && pipeline_ok=1
fi
kill "${daemons[@]}" 2>/dev/null
wait "${daemons[@]}" 2>/dev/null
if [ "$pipeline_ok" != 1 ]; then
  tail -20 "$run/worker.log" "$run/coordinator.log"
  failed+=("gpu-pipeline job (logs: $run)")
fi

# ---- 4. Benchmarks, same shapes and steps.
bench_args=(--batch "$batch" --steps "$steps" --warmup "$warmup" --peak-tflops "$peak")
say "bench_gpu_gpt ${bench_args[*]}"
timeout "$(cap 150)" "$build_dir/bin/bench_gpu_gpt" "${bench_args[@]}" 2>&1 |
  tee "$log_dir/bench_gpu_gpt.log"
rc=${PIPESTATUS[0]}
[ "$rc" -ne 0 ] && failed+=("bench_gpu_gpt (rc $rc)")
ours="$(grep '^RESULT' "$log_dir/bench_gpu_gpt.log" | tail -1)"
theirs=""
if [ "$have_torch" = 1 ]; then
  say "torch_gpt_gpu.py ${bench_args[*]}"
  timeout "$(cap 150)" "$python" "$root/bench/torch_gpt_gpu.py" "${bench_args[@]}" 2>&1 |
    tee "$log_dir/torch_gpt_gpu.log"
  rc=${PIPESTATUS[0]}
  [ "$rc" -ne 0 ] && failed+=("torch_gpt_gpu.py (rc $rc)")
  theirs="$(grep '^RESULT' "$log_dir/torch_gpt_gpu.log" | tail -1)"
fi

nccl=""
if [ -x "$build_dir/bin/bench_nccl_p2p" ]; then
  say "bench_nccl_p2p"
  timeout "$(cap 60)" "$build_dir/bin/bench_nccl_p2p" 2>&1 | tee "$log_dir/bench_nccl_p2p.log"
  rc=${PIPESTATUS[0]}
  # 77: fewer than two GPUs, so nothing to measure (reported, not a failure).
  [ "$rc" -ne 0 ] && [ "$rc" -ne 77 ] && failed+=("bench_nccl_p2p (rc $rc)")
  nccl="$(grep '^RESULT' "$log_dir/bench_nccl_p2p.log" | tail -1)"
fi

# ---- 5. Summary.
say "summary (logs: $log_dir)"
field() { echo "$1" | tr ' ' '\n' | sed -n "s/^$2=//p"; }
echo "tandem: ${ours:-no result}"
echo "torch:  ${theirs:-no result}"
echo "nccl:   ${nccl:-not measured (needs two GPUs)}"
if [ -n "$ours" ] && [ -n "$theirs" ]; then
  awk -v a="$(field "$ours" tokens_per_s)" -v b="$(field "$theirs" tokens_per_s)" \
    -v ma="$(field "$ours" mfu)" -v mb="$(field "$theirs" mfu)" 'BEGIN {
      printf "tokens/s tandem / torch = %.3f (MFU %.2f%% vs %.2f%%)\n", a / b, 100 * ma, 100 * mb }'
fi
if [ ${#failed[@]} -gt 0 ]; then
  echo "FAIL:"
  printf '  %s\n' "${failed[@]}"
  exit 1
fi
if [ "$have_torch" = 0 ]; then
  echo "tests passed; PyTorch missing, so no ratio (install torch for $python offline, e.g. from a wheel)"
  exit 3
fi
echo "PASS"
