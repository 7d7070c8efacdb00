// Trains the `gpt2` preset (GPT-2 124M: 12 layers, d 768, 12 heads, V 50304, T 1024; the
// shape and the AdamW defaults come from common/spec.cc's WithDefaults) on one GPU with
// GpuGpt (worker/backend/cuda/gpu_gpt.h) on synthetic uniform random tokens, and prints
// tokens/s, step time, MFU and the device memory accounting. bench/torch_gpt_gpu.py is its
// PyTorch peer (same model, shapes, steps and formula); scripts/gpu-check.sh runs both.
//
//   build/bin/bench_gpu_gpt [--batch 8] [--seq 1024] [--accum 1] [--warmup 3] [--steps 10]
//                           [--precision bf16|fp32] [--lr 6e-4] [--peak-tflops 989] [--seed 1]
//                           [--weight-decay <spec default 0>]
//
// A step is `accum` micro-batches of (batch, seq) tokens (ForwardBackward each) and one AdamW
// Step; it is timed on the host clock, and each phase on CUDA events.
// MFU = (6 N + 12 L T C) * tokens/s / (peak TFLOP/s * 1e12), with N the parameter count (the
// tied wte counted once, wpe included), L layers, T the sequence length, C d_model: 6 N
// FLOPs per token for the weights' forward and backward GEMMs, 12 L T C for attention's
// q k^T and att v (forward 4 L T C, backward twice that) over the full T x T (PaLM's appendix
// B formula, as nanoGPT and llm.c). --peak-tflops defaults to 989, the dense bf16 tensor
// peak of an H100 / H200 SXM. Without a usable GPU the bench says so and exits 77.
// The last line is machine-readable: "RESULT impl=tandem tokens_per_s=... step_ms=... mfu=...".
#include <cuda_runtime_api.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "common/spec.h"
#include "worker/backend/cuda/cuda_status.h"
#include "worker/backend/cuda/device.h"
#include "worker/backend/cuda/gpu_gpt.h"
#include "worker/backend/cuda/module_loading.h"
#include "worker/model/random.h"

namespace {

using tandem::worker::Rng;
using tandem::worker::cuda::AdamWHyper;
using tandem::worker::cuda::GpuGpt;
using tandem::worker::cuda::GpuGptConfig;
using tandem::worker::cuda::GpuGptMemory;
using tandem::worker::cuda::GpuPrecision;

struct Flags {
  int64_t batch = 8;
  int64_t seq = 1024;
  int64_t accum = 1;
  int warmup = 3;
  int steps = 10;
  std::string precision = "bf16";
  double lr = 6e-4;
  double weight_decay = -1.0;  // < 0: the spec's default
  double peak_tflops = 989.0;
  uint64_t seed = 1;
};

bool ParseFlags(int argc, char** argv, Flags& f) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "flag %s needs a value\n", a.c_str());
      return false;
    }
    const char* v = argv[++i];
    bool ok = true;
    if (a == "--batch") {
      ok = absl::SimpleAtoi(v, &f.batch) && f.batch >= 1;
    } else if (a == "--seq") {
      ok = absl::SimpleAtoi(v, &f.seq) && f.seq >= 1;
    } else if (a == "--accum") {
      ok = absl::SimpleAtoi(v, &f.accum) && f.accum >= 1;
    } else if (a == "--warmup") {
      ok = absl::SimpleAtoi(v, &f.warmup) && f.warmup >= 0;
    } else if (a == "--steps") {
      ok = absl::SimpleAtoi(v, &f.steps) && f.steps >= 1;
    } else if (a == "--precision") {
      f.precision = v;
      ok = f.precision == "bf16" || f.precision == "fp32";
    } else if (a == "--lr") {
      ok = absl::SimpleAtod(v, &f.lr) && std::isfinite(f.lr);
    } else if (a == "--weight-decay") {
      ok = absl::SimpleAtod(v, &f.weight_decay) && f.weight_decay >= 0 &&
           std::isfinite(f.weight_decay);
    } else if (a == "--peak-tflops") {
      ok = absl::SimpleAtod(v, &f.peak_tflops) && f.peak_tflops > 0;
    } else if (a == "--seed") {
      ok = absl::SimpleAtoi(v, &f.seed);
    } else {
      std::fprintf(stderr, "unknown flag %s\n", a.c_str());
      return false;
    }
    if (!ok) {
      std::fprintf(stderr, "bad value for %s: %s\n", a.c_str(), v);
      return false;
    }
  }
  return true;
}

double MiB(size_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0); }

double NowMs() {
  return std::chrono::duration<double, std::milli>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

int main(int argc, char** argv) {
  tandem::worker::cuda::UseEagerModuleLoading();  // before any CUDA call
  Flags flags;
  if (!ParseFlags(argc, argv, flags)) return 2;
  tandem::v1::JobSpec spec;
  spec.mutable_model()->set_preset("gpt2");
  spec = tandem::WithDefaults(spec);
  const tandem::v1::ModelSpec& m = spec.model();
  const tandem::v1::OptimizerSpec& o = spec.optimizer();
  GpuGptConfig cfg;
  cfg.n_layer = m.n_layer();
  cfg.n_head = m.n_head();
  cfg.d_model = m.d_model();
  cfg.d_hidden = m.d_hidden();
  cfg.seq_len = m.seq_len();
  cfg.vocab = m.vocab_size();
  cfg.tie_embeddings = m.tie_embeddings();
  cfg.batch = flags.batch;
  cfg.seq = flags.seq;
  cfg.precision = flags.precision == "bf16" ? GpuPrecision::kBf16 : GpuPrecision::kFp32;
  cfg.seed = flags.seed;
  AdamWHyper hyper;
  hyper.beta1 = o.beta1();
  hyper.beta2 = o.beta2();
  hyper.eps = o.eps();
  hyper.weight_decay =
      flags.weight_decay >= 0 ? static_cast<float>(flags.weight_decay) : o.weight_decay();

  // The plan needs no device: print it first.
  absl::StatusOr<GpuGptMemory> plan = tandem::worker::cuda::PlanGpuGptMemory(cfg);
  if (!plan.ok()) {
    std::fprintf(stderr, "bench_gpu_gpt: %s\n", plan.status().ToString().c_str());
    return 2;
  }
  std::printf("planned device memory: %.1f MiB (activations %.1f MiB)\n", MiB(plan->total()),
              MiB(plan->activations));
  if (absl::Status s = tandem::worker::cuda::CudaAvailable(); !s.ok()) {
    std::printf("bench_gpu_gpt: no usable CUDA device, nothing to measure (%s)\n",
                s.ToString().c_str());
    return 77;
  }

  int device = 0;
  cudaDeviceProp prop{};
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
    std::snprintf(prop.name, sizeof(prop.name), "unknown");
  }
  std::printf(
      "bench_gpu_gpt: GPT-2 124M (L %lld, d %lld, NH %lld, V %lld, T %lld), %s, B %lld, accum "
      "%lld, AdamW b1 %g b2 %g eps %g wd %g lr %g, device %s\n",
      static_cast<long long>(cfg.n_layer), static_cast<long long>(cfg.d_model),
      static_cast<long long>(cfg.n_head), static_cast<long long>(cfg.vocab),
      static_cast<long long>(cfg.seq), flags.precision.c_str(), static_cast<long long>(cfg.batch),
      static_cast<long long>(flags.accum), hyper.beta1, hyper.beta2, hyper.eps, hyper.weight_decay,
      flags.lr, prop.name);

  const double t_create = NowMs();
  absl::StatusOr<std::unique_ptr<GpuGpt>> model = GpuGpt::Create(cfg, hyper);
  if (!model.ok()) {
    std::fprintf(stderr, "bench_gpu_gpt: %s\n", model.status().ToString().c_str());
    return 1;
  }
  GpuGpt& g = **model;
  const GpuGptMemory& mem = g.memory();
  std::printf("created in %.0f ms; parameters N = %lld (tied wte once)\n", NowMs() - t_create,
              static_cast<long long>(g.num_parameters()));
  std::printf(
      "device memory (MiB): parameters %.1f, bf16 copies %.1f, gradients %.1f, optimizer state "
      "%.1f, activations %.1f, workspace %.1f, total %.1f\n",
      MiB(mem.parameters), MiB(mem.compute_weights), MiB(mem.gradients), MiB(mem.optimizer_state),
      MiB(mem.activations), MiB(mem.workspace), MiB(mem.total()));

  // Synthetic data: uniform tokens; the target of position t is the token at t + 1.
  const size_t n = static_cast<size_t>(cfg.batch * cfg.seq);
  Rng rng(flags.seed ^ 0x5eedULL);
  std::vector<int32_t> stream(n + 1), tokens(n), targets(n);
  auto next_batch = [&] {
    for (int32_t& x : stream) x = static_cast<int32_t>(rng.Below(static_cast<uint64_t>(cfg.vocab)));
    std::memcpy(tokens.data(), stream.data(), n * sizeof(int32_t));
    std::memcpy(targets.data(), stream.data() + 1, n * sizeof(int32_t));
  };

  std::printf("%5s %8s %8s %9s %9s %9s %9s\n", "step", "loss", "norm", "fwd ms", "bwd ms", "opt ms",
              "step ms");
  double timed_ms = 0.0, fwd = 0.0, bwd = 0.0, opt = 0.0;
  for (int step = 0; step < flags.warmup + flags.steps; ++step) {
    const double t0 = NowMs();
    double loss = 0.0, step_fwd = 0.0, step_bwd = 0.0;
    for (int64_t k = 0; k < flags.accum; ++k) {
      next_batch();
      absl::StatusOr<float> l = g.ForwardBackward(tokens.data(), targets.data(), flags.accum);
      if (!l.ok()) {
        std::fprintf(stderr, "bench_gpu_gpt: step %d: %s\n", step, l.status().ToString().c_str());
        return 1;
      }
      loss += *l / static_cast<double>(flags.accum);
      step_fwd += g.last_times().forward_ms;
      step_bwd += g.last_times().backward_ms;
    }
    absl::StatusOr<float> norm = g.Step(static_cast<float>(flags.lr));
    if (!norm.ok()) {
      std::fprintf(stderr, "bench_gpu_gpt: step %d: %s\n", step, norm.status().ToString().c_str());
      return 1;
    }
    const double ms = NowMs() - t0;
    const bool timed = step >= flags.warmup;
    std::printf("%5d %8.4f %8.4f %9.2f %9.2f %9.2f %9.2f%s\n", step, loss, *norm, step_fwd,
                step_bwd, g.last_times().optimizer_ms, ms, timed ? "" : "  (warm-up)");
    if (timed) {
      timed_ms += ms;
      fwd += step_fwd;
      bwd += step_bwd;
      opt += g.last_times().optimizer_ms;
    }
  }
  const double steps = flags.steps;
  const double tokens_per_step = static_cast<double>(n) * static_cast<double>(flags.accum);
  const double tokens_per_s = tokens_per_step * steps / (timed_ms / 1e3);
  const double flops_per_token = 6.0 * static_cast<double>(g.num_parameters()) +
                                 12.0 * static_cast<double>(cfg.n_layer * cfg.seq * cfg.d_model);
  const double mfu = flops_per_token * tokens_per_s / (flags.peak_tflops * 1e12);
  size_t free_bytes = 0, total_bytes = 0;
  (void)cudaMemGetInfo(&free_bytes, &total_bytes);
  std::printf(
      "timed %d steps: step %.2f ms (fwd %.2f, bwd %.2f, opt %.2f on events), %.0f tokens/s\n",
      flags.steps, timed_ms / steps, fwd / steps, bwd / steps, opt / steps, tokens_per_s);
  std::printf(
      "MFU = (6 N + 12 L T C) x tokens/s / peak = (6 x %lld + 12 x %lld x %lld x %lld) x "
      "%.0f / %.0f TFLOP/s = %.2f%%\n",
      static_cast<long long>(g.num_parameters()), static_cast<long long>(cfg.n_layer),
      static_cast<long long>(cfg.seq), static_cast<long long>(cfg.d_model), tokens_per_s,
      flags.peak_tflops, 100.0 * mfu);
  std::printf("device memory in use %.0f MiB of %.0f MiB\n", MiB(total_bytes - free_bytes),
              MiB(total_bytes));
  std::printf(
      "RESULT impl=tandem precision=%s batch=%lld seq=%lld tokens_per_s=%.1f "
      "step_ms=%.3f mfu=%.5f\n",
      flags.precision.c_str(), static_cast<long long>(cfg.batch), static_cast<long long>(cfg.seq),
      tokens_per_s, timed_ms / steps, mfu);
  return 0;
}
