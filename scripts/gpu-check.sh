#!/usr/bin/env bash
# The GPU check: one command for a machine with NVIDIA GPUs (H100 / H200), meant to answer in
# one run whether the CUDA backend and the NCCL transport work and how fast they are.
#   1. prerequisites: locates nvcc (PATH, /usr/local/cuda, /usr/local/cuda-*), the CUDA
#      toolkit root, NCCL (beside the toolkit, /usr/include, or PyPI's nvidia-nccl wheel) and
#      PyTorch; installs from PyPI what is missing (NCCL, torch) when the network allows; checks
#      the driver against the toolkit (CUDA 13 needs driver >= 580, 12 >= 525) with a clear
#      message; names anything still missing and stops (exit 2);
#   2. configures build-gpu/ with the compiler, toolkit root and NCCL root passed explicitly
#      (CMake's CUDA detection searches PATH only) and builds the CUDA tests, the daemons and
#      the benchmarks; or, with --prebuilt DIR, uses a tree built elsewhere (on a machine with
#      nvcc) and builds nothing; --prebuilt BUNDLE.tar.xz takes what scripts/gpu-bundle.sh packs
#      for a device without the build packages or a network (programs and their libraries);
#   3. runs the CUDA tests (kernels, GpuGpt, the StageCompute conformance suite against the CPU
#      path, NCCL where two GPUs exist); a test that skips for want of a device fails the check;
#   4. runs GPU jobs through the daemons, each checked for a finite, falling loss and zero
#      skipped steps (scripts/check_losses.py), not only for SUCCEEDED: examples/gpu-pipeline.yaml
#      (one worker, two chunks on one GPU), examples/gpu-llama.yaml (the same for a llama),
#      examples/gpu-pipeline-2stage.yaml (two workers on
#      ONE GPU: the host-staged transport) and, where two GPUs exist, the same two stages on two
#      GPUs over NCCL;
#   5. benchmarks, each loss checked: bench_gpu_gpt beside bench/torch_gpt_gpu.py on the same
#      GPT-2 124M shapes (eager, and torch.compile where it works): tokens/s and MFU;
#      bench_nccl_p2p where two GPUs exist (NCCL against cudaMemcpyPeer), and bench_host_staged
#      (the host-staged transport on one GPU against the device <-> host copies it makes);
#   6. a summary with every figure, the lines docs/benchmarks.md records.
# Every program runs with CUDA_MODULE_LOADING=EAGER (the programs set it themselves too; see
# docs/architecture.md, "Eager module loading"). Every part runs under `timeout`, within an
# 8-minute budget overall (TANDEM_GPU_BUDGET seconds).
#
#   scripts/gpu-check.sh [--dry-run] [--prebuilt DIR|BUNDLE.tar.xz] [--batch 8] [--steps 10] [--warmup 3]
#   env: TANDEM_GPU_BUILD_DIR (build-gpu), CMAKE_CUDA_ARCHITECTURES (90), PYTHON (python3),
#        PEAK_TFLOPS (989), TANDEM_BUILD_JOBS (nproc), TANDEM_GPU_BUDGET (470)
# --dry-run: no device needed; says what it found, what it would install and what it would
#   build and run, and exits 0 (tests/scripts runs it on every CI machine).
#
# Exit: 0 all passed and both benchmarks ran; 1 a build, test, job or benchmark failed; 2 a
# prerequisite is missing; 3 the tests passed but PyTorch is missing (no ratio).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
root="$(pwd)"
start=$(date +%s)
budget="${TANDEM_GPU_BUDGET:-470}" # seconds, under the 8 minutes
build_dir="${TANDEM_GPU_BUILD_DIR:-build-gpu}"
arch="${CMAKE_CUDA_ARCHITECTURES:-90}"
python="${PYTHON:-python3}"
peak="${PEAK_TFLOPS:-989}"
jobs="${TANDEM_BUILD_JOBS:-$(nproc)}"
batch=8
steps=10
warmup=3
dry_run=0
prebuilt=""
usage="usage: $0 [--dry-run] [--prebuilt DIR] [--batch B] [--steps N] [--warmup N]"
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) dry_run=1; shift ;;
    --prebuilt) [ $# -ge 2 ] || { echo "$usage" >&2; exit 2; }; prebuilt="$2"; shift 2 ;;
    --batch | --steps | --warmup)
      if [ $# -lt 2 ] || ! [[ "$2" =~ ^[1-9][0-9]*$ ]]; then
        echo "$1 needs a positive integer; $usage" >&2
        exit 2
      fi
      case "$1" in --batch) batch="$2" ;; --steps) steps="$2" ;; --warmup) warmup="$2" ;; esac
      shift 2 ;;
    *) echo "$usage" >&2; exit 2 ;;
  esac
done
if [ -n "$prebuilt" ]; then
  # A bundle from scripts/gpu-bundle.sh: unpack it beside itself (gpu-prebuilt/).
  case "$prebuilt" in
    *.tar.xz)
      [ -f "$prebuilt" ] || { echo "--prebuilt $prebuilt: no such bundle" >&2; exit 2; }
      into="$(dirname "$prebuilt")"
      if [ "$dry_run" = 1 ]; then
        echo "would: unpack $prebuilt into $into/gpu-prebuilt"
      else
        tar -C "$into" -xJf "$prebuilt" || { echo "--prebuilt $prebuilt: cannot unpack" >&2; exit 2; }
      fi
      prebuilt="$into/gpu-prebuilt" ;;
  esac
  [ -d "$prebuilt/bin" ] || [ "$dry_run" = 1 ] ||
    { echo "--prebuilt $prebuilt: no $prebuilt/bin (a build tree or a gpu-bundle.sh bundle)" >&2; exit 2; }
  build_dir="$prebuilt"
  # A bundle carries its non-CUDA libraries in lib/ and the commit it was built from.
  if [ -d "$prebuilt/lib" ]; then
    export LD_LIBRARY_PATH="$(cd "$prebuilt/lib" && pwd)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  fi
  if [ -f "$prebuilt/MANIFEST" ]; then
    built_from="$(sed -n 's/^commit //p' "$prebuilt/MANIFEST")"
    here="$(git rev-parse HEAD 2>/dev/null || echo unknown)"
    echo "prebuilt from commit $built_from; this checkout is $here"
    [ "${built_from%% *}" = "$here" ] ||
      echo "WARNING: the bundle was built from another commit than this checkout's scripts and examples"
  fi
fi
log_dir="$build_dir/gpu-check"
[ "$dry_run" = 1 ] || mkdir -p "$log_dir"
export CUDA_MODULE_LOADING=EAGER

say() { printf '\n== %s (%ds)\n' "$*" "$(($(date +%s) - start))"; }
# The smaller of $1 seconds and what is left of the budget (at least 1).
cap() {
  local left=$((budget - ($(date +%s) - start)))
  [ "$left" -lt 1 ] && left=1
  [ "$1" -lt "$left" ] && echo "$1" || echo "$left"
}
would() { echo "would: $*"; }

# ---- 1. Prerequisites.
say "prerequisites"
missing=()
if [ -z "$prebuilt" ]; then
  for c in cmake ninja g++; do command -v "$c" >/dev/null || missing+=("$c (command)"); done
fi
nvcc=""
for c in "$(command -v nvcc || true)" /usr/local/cuda/bin/nvcc /usr/local/cuda-*/bin/nvcc; do
  [ -n "$c" ] && [ -x "$c" ] && { nvcc="$(readlink -f "$c")"; break; }
done
cuda_root=""
cuda_major=""
if [ -n "$nvcc" ]; then
  cuda_root="$(dirname "$(dirname "$nvcc")")"
  cuda_major="$("$nvcc" --version | sed -n 's/.*release \([0-9]*\)\..*/\1/p' | head -1)"
  echo "nvcc: $nvcc (CUDA ${cuda_major:-?}, toolkit root $cuda_root)"
  # A prebuilt tree's programs load the toolkit's cudart and cuBLAS from here.
  [ -n "$prebuilt" ] && [ -d "$cuda_root/lib64" ] &&
    export LD_LIBRARY_PATH="$cuda_root/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
elif [ -z "$prebuilt" ]; then
  missing+=("nvcc (the CUDA toolkit: scripts/install-cuda-toolkit.sh, or --prebuilt DIR)")
fi
# NCCL: beside the toolkit, in /usr, or PyPI's wheel (nvidia/nccl/{include,lib}).
nccl_wheel_dir() {
  "$python" -c 'import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__) if nvidia.nccl.__file__ else list(nvidia.nccl.__path__)[0])' 2>/dev/null
}
nccl_root=""
for d in "${NCCL_ROOT:-}" "$cuda_root" /usr "$(nccl_wheel_dir)"; do
  [ -n "$d" ] && [ -f "$d/include/nccl.h" ] && { nccl_root="$d"; break; }
done
nccl_wheel="nvidia-nccl-cu${cuda_major:-13}"
if [ -z "$nccl_root" ] && [ -z "$prebuilt" ]; then
  if [ "$dry_run" = 1 ]; then
    would "$python -m pip install $nccl_wheel   (NCCL is not beside the toolkit nor in /usr)"
  else
    echo "NCCL not found; installing $nccl_wheel from PyPI"
    timeout "$(cap 120)" "$python" -m pip install -q "$nccl_wheel" >"$log_dir/pip-nccl.log" 2>&1 ||
      tail -3 "$log_dir/pip-nccl.log"
    d="$(nccl_wheel_dir)"
    [ -n "$d" ] && [ -f "$d/include/nccl.h" ] && nccl_root="$d"
  fi
  [ -z "$nccl_root" ] && [ "$dry_run" = 0 ] &&
    missing+=("NCCL (nccl.h; pip install $nccl_wheel, or NCCL_ROOT=DIR)")
fi
[ -n "$nccl_root" ] && echo "NCCL: $nccl_root"
# The NCCL library must also load at run time (a wheel's lib/ is not on the loader's path).
[ -n "$nccl_root" ] && [ -d "$nccl_root/lib" ] &&
  export LD_LIBRARY_PATH="$nccl_root/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
if [ -z "$prebuilt" ] && command -v dpkg-query >/dev/null; then
  # The build packages of scripts/install-deps.sh (without its --test extras).
  for p in libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libabsl-dev \
    libspdlog-dev libfmt-dev libgtest-dev libgmock-dev libopenblas-dev libgloo-dev \
    libsqlite3-dev zlib1g-dev libyaml-cpp-dev nlohmann-json3-dev libcpp-httplib-dev libssl-dev \
    libcli11-dev; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
      missing+=("$p (Debian package: scripts/install-deps.sh)")
  done
fi
# The driver: a toolkit's programs fail at their first CUDA call on an older driver.
driver=""
gpus=0
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader 2>/dev/null
  driver="$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -1)"
  gpus="$(nvidia-smi --query-gpu=index --format=csv,noheader 2>/dev/null | wc -l)"
fi
need_driver=""
case "$cuda_major" in 13) need_driver=580 ;; 12) need_driver=525 ;; esac
if [ -n "$driver" ] && [ -n "$need_driver" ] && [ "${driver%%.*}" -lt "$need_driver" ]; then
  missing+=("an NVIDIA driver >= $need_driver for CUDA $cuda_major (this one is $driver)")
elif [ -z "$driver" ]; then
  if [ "$dry_run" = 1 ]; then
    echo "no NVIDIA driver (nvidia-smi): a dry run goes on; a real run would stop here"
  else
    missing+=("an NVIDIA GPU and driver (nvidia-smi finds none)")
  fi
fi
echo "GPUs: $gpus"
have_torch=1
torch_probe='import torch; print(torch.__version__, torch.version.cuda, torch.cuda.is_available())'
if ! torch_info="$("$python" -c "$torch_probe" 2>&1)"; then
  if [ "$dry_run" = 1 ]; then
    would "$python -m pip install torch   (not importable by $python)"
  elif [ ${#missing[@]} -gt 0 ]; then
    echo "PyTorch not importable by $python (not installing it: the check stops below)"
  else
    echo "PyTorch not importable by $python; installing torch from PyPI"
    timeout "$(cap 240)" "$python" -m pip install -q torch numpy >"$log_dir/pip-torch.log" 2>&1 ||
      tail -3 "$log_dir/pip-torch.log"
  fi
  torch_info="$("$python" -c "$torch_probe" 2>&1)" || have_torch=0
  [ "$dry_run" = 1 ] && have_torch=1 && torch_info="(after the install above)"
fi
if [ "$have_torch" = 1 ] && [ "$dry_run" = 0 ] && [ "${torch_info##* }" != True ]; then
  echo "PyTorch (version, CUDA, device usable): $torch_info"
  echo "PyTorch cannot use the GPU here (a CPU build, or no driver); the PyTorch benchmarks will not run"
  have_torch=0
elif [ "$have_torch" = 1 ]; then
  echo "PyTorch (version, CUDA, device usable): $torch_info"
else
  echo "PyTorch: not importable by $python; the PyTorch benchmarks will not run"
fi
if [ ${#missing[@]} -gt 0 ]; then
  echo "missing:"
  printf '  %s\n' "${missing[@]}"
  [ "$dry_run" = 1 ] || exit 2
  echo "(a dry run goes on to show the rest; a real run stops here, exit 2)"
fi

# ---- 2. Configure and build only what the check needs (or take a prebuilt tree).
targets=(worker_cuda_kernels_test worker_gpu_gpt_test worker_gpu_llama_test worker_conformance_test bench_gpu_gpt
  tandem-coordinator tandem-worker tandem worker_nccl_transport_test bench_nccl_p2p
  bench_host_staged worker_cuda_device_copier_test worker_nccl_collectives_test)
cmake_args=(-S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
  -DCMAKE_CUDA_ARCHITECTURES="$arch" -DCMAKE_CUDA_COMPILER="$nvcc"
  -DCUDAToolkit_ROOT="$cuda_root" -DNCCL_ROOT="$nccl_root")
if [ "$dry_run" = 1 ]; then
  if [ -n "$prebuilt" ]; then
    echo "would use the prebuilt tree $prebuilt (no build)"
  else
    would "cmake ${cmake_args[*]}"
    would "ninja -C $build_dir -j $jobs ${targets[*]}"
  fi
elif [ -z "$prebuilt" ]; then
  say "configure $build_dir (CMAKE_CUDA_ARCHITECTURES=$arch)"
  export CCACHE_DIR="${CCACHE_DIR:-$HOME/.cache/ccache}"
  if ! timeout "$(cap 120)" cmake "${cmake_args[@]}" >"$log_dir/configure.log" 2>&1; then
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
  say "build ${targets[*]} (-j $jobs)"
  if ! timeout "$(cap 300)" ninja -C "$build_dir" -j "$jobs" "${targets[@]}" \
    >"$log_dir/build.log" 2>&1; then
    grep -E "error|FAILED" "$log_dir/build.log" | head -30
    echo "FAIL: build (log: $log_dir/build.log)"
    exit 1
  fi
fi
bin="$build_dir/bin"

# ---- 3. Conformance tests.
failed=()
# worker_nccl_collectives_test: its one-rank cases run on one GPU; the 2- and 3-rank ones skip
# below that many GPUs ("needs N CUDA devices"), which is not a failure.
tests=(worker_cuda_kernels_test worker_gpu_gpt_test worker_gpu_llama_test worker_conformance_test
  worker_cuda_device_copier_test worker_nccl_collectives_test)
[ "$gpus" -ge 2 ] && tests+=(worker_nccl_transport_test)
for t in "${tests[@]}"; do
  if [ "$dry_run" = 1 ]; then
    would "run $build_dir/tests/$t (a skip for want of a device fails the check)"
    continue
  fi
  exe="$build_dir/tests/$t"
  [ -x "$exe" ] || { failed+=("$t (not built)"); continue; }
  say "test $t"
  log="$log_dir/$t.log"
  # 240 s: worker_gpu_gpt_test includes the GPT-2 124M shapes against the CPU layers.
  timeout "$(cap 240)" "$exe" >"$log" 2>&1
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

# ---- 4. GPU jobs through the daemons, each checked for a finite, falling loss.
# run_job NAME SPEC DEVICE...: a coordinator and one worker per DEVICE, the spec submitted,
# watched to the end, and its status checked by check_losses.py.
run_job() {
  local name="$1" spec="$2"
  shift 2
  if [ "$dry_run" = 1 ]; then
    would "run $spec on $# worker(s) (--device $*), check a finite falling loss, no skipped step"
    return
  fi
  say "job $name: $spec on --device $*"
  local run="$log_dir/$name" pids=() port job ok=0
  rm -rf "$run" && mkdir -p "$run"
  "$bin/tandem-coordinator" --listen 127.0.0.1:0 --port-file "$run/coordinator.port" \
    --data-root "$run/store" >"$run/coordinator.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 100); do [ -s "$run/coordinator.port" ] && break; sleep 0.1; done
  port="127.0.0.1:$(cat "$run/coordinator.port" 2>/dev/null)"
  local i=0
  for d in "$@"; do
    "$bin/tandem-worker" --coordinator "$port" --listen 127.0.0.1:0 --device "$d" \
      >"$run/worker-$i.log" 2>&1 &
    pids+=($!)
    i=$((i + 1))
  done
  if job="$(TANDEM_COORDINATOR="$port" timeout 30 "$bin/tandem" submit "$spec")"; then
    TANDEM_COORDINATOR="$port" timeout "$(cap 150)" "$bin/tandem" watch "$job" | tail -3
    TANDEM_COORDINATOR="$port" "$bin/tandem" status "$job" -o json >"$run/status.json" 2>&1
    "$python" "$root/scripts/check_losses.py" job "$run/status.json" && ok=1
  fi
  kill "${pids[@]}" 2>/dev/null
  wait "${pids[@]}" 2>/dev/null
  if [ "$ok" != 1 ]; then
    tail -15 "$run"/worker-*.log "$run/coordinator.log"
    failed+=("job $name (logs: $run)")
  fi
}
run_job one-gpu-two-chunks examples/gpu-pipeline.yaml cuda:0
[ -f examples/gpu-llama.yaml ] && run_job one-gpu-llama examples/gpu-llama.yaml cuda:0
if [ -f examples/gpu-pipeline-2stage.yaml ]; then
  run_job one-gpu-two-workers examples/gpu-pipeline-2stage.yaml cuda:0 cuda:0
  [ "$gpus" -ge 2 ] && run_job two-gpus-nccl examples/gpu-pipeline-2stage.yaml cuda:0 cuda:1
fi

# ---- 5. Benchmarks, same shapes and steps; each loss checked against ln(vocab) (uniform
# random tokens: nothing to learn, so a correct model stays at the entropy).
bench_args=(--batch "$batch" --steps "$steps" --warmup "$warmup" --peak-tflops "$peak")
ln_vocab=10.8258 # ln 50304
# bench NAME EXPECT_LOSS COMMAND...: runs it, keeps its RESULT line in result_NAME, checks its loss.
bench() {
  local name="$1" expect="$2"
  shift 2
  if [ "$dry_run" = 1 ]; then
    would "$*"
    return
  fi
  say "$name: $*"
  timeout "$(cap 150)" "$@" 2>&1 | tee "$log_dir/$name.log"
  local rc=${PIPESTATUS[0]}
  # 77: nothing to measure here (e.g. bench_nccl_p2p on one GPU): reported, not a failure.
  if [ "$rc" -eq 77 ]; then return; fi
  [ "$rc" -ne 0 ] && failed+=("$name (rc $rc)")
  if [ "$expect" != - ] && [ "$rc" -eq 0 ]; then
    "$python" "$root/scripts/check_losses.py" bench "$log_dir/$name.log" --expect "$expect" ||
      failed+=("$name (loss)")
  fi
}
bench bench_gpu_gpt "$ln_vocab" "$bin/bench_gpu_gpt" "${bench_args[@]}"
if [ "$have_torch" = 1 ]; then
  bench torch_eager "$ln_vocab" "$python" "$root/bench/torch_gpt_gpu.py" "${bench_args[@]}"
  # torch.compile where it works: a failure to compile is reported, not a failure of the check.
  if [ "$dry_run" = 1 ] || "$python" "$root/bench/torch_gpt_gpu.py" --help 2>/dev/null | grep -q -- --compile; then
    n_failed=${#failed[@]}
    bench torch_compile "$ln_vocab" "$python" "$root/bench/torch_gpt_gpu.py" "${bench_args[@]}" --compile
    if [ ${#failed[@]} -gt "$n_failed" ]; then
      echo "torch.compile did not run here (reported, not counted): ${failed[*]:$n_failed}"
      failed=("${failed[@]:0:$n_failed}")
    fi
  fi
fi
[ "$gpus" -ge 2 ] || [ "$dry_run" = 1 ] && bench bench_nccl_p2p - "$bin/bench_nccl_p2p"
bench host_staged - "$bin/bench_host_staged"

# ---- 6. Summary.
if [ "$dry_run" = 1 ]; then
  say "dry run: nothing was built or run"
  exit 0
fi
say "summary (logs: $log_dir)"
result() { grep -h '^RESULT' "$log_dir/$1.log" 2>/dev/null | tail -1; }
field() { echo "$1" | tr ' ' '\n' | sed -n "s/^$2=//p"; }
ours="$(result bench_gpu_gpt)"
echo "tandem:        ${ours:-no result}"
for peer in torch_eager torch_compile; do
  theirs="$(result "$peer")"
  echo "$peer: ${theirs:-no result}"
  if [ -n "$ours" ] && [ -n "$theirs" ]; then
    awk -v p="$peer" -v a="$(field "$ours" tokens_per_s)" -v b="$(field "$theirs" tokens_per_s)" \
      -v ma="$(field "$ours" mfu)" -v mb="$(field "$theirs" mfu)" 'BEGIN {
        printf "  tokens/s tandem / %s = %.3f (MFU %.2f%% vs %.2f%%)\n", p, a / b, 100 * ma, 100 * mb }'
  fi
done
echo "nccl p2p:      $(result bench_nccl_p2p || true)"
[ -z "$(result bench_nccl_p2p)" ] && echo "               (not measured: needs two GPUs)"
echo "host-staged:   $(result host_staged)"
for j in "$log_dir"/*/status.json; do
  [ -f "$j" ] && "$python" "$root/scripts/check_losses.py" job "$j" | sed 's/^/job: /'
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "FAIL:"
  printf '  %s\n' "${failed[@]}"
  exit 1
fi
if [ "$have_torch" = 0 ]; then
  echo "tests passed; PyTorch missing, so no ratio (install torch for $python)"
  exit 3
fi
echo "PASS"
