// What the layer benchmarks (bench_gpt_layer, bench_llama_layer) share: the clock, the median,
// the timing of a forward + backward pair as the executor runs it, the table row and the
// allocator policy of --keep-heap. Header-only: the benchmarks are single-file programs.
#ifndef TANDEM_BENCH_LAYER_TIMING_H_
#define TANDEM_BENCH_LAYER_TIMING_H_

#include <malloc.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "worker/model/layer.h"

namespace tandem::bench {

inline double NowMs() {
  return std::chrono::duration<double, std::milli>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

inline double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Median of `reps` timed fwd() + bwd() pairs after one warm-up; *fwd_ms is the forward's.
// release() frees what the pair made, untimed (as the executor frees a micro-batch's context
// after its backward).
inline double TimePair(const std::function<void()>& fwd, const std::function<void()>& bwd,
                       const std::function<void()>& release, int reps, double* fwd_ms) {
  std::vector<double> total, forward;
  for (int r = 0; r <= reps; ++r) {
    const double t0 = NowMs();
    fwd();
    const double t1 = NowMs();
    bwd();
    const double t2 = NowMs();
    release();
    if (r > 0) {
      total.push_back(t2 - t0);
      forward.push_back(t1 - t0);
    }
  }
  *fwd_ms = Median(forward);
  return Median(total);
}

// A layer's forward + backward, as the executor runs them (a fresh SavedContext each time).
// Exits 1 on a layer's error.
inline double TimeLayer(worker::Layer& layer, const worker::Tensor& input,
                        const worker::MicroBatchData& data, int reps, double* fwd_ms) {
  worker::Tensor grad_out;
  if (!layer.is_loss()) {
    grad_out = input;  // any (B, T, C) gradient
    for (size_t i = 0; i < grad_out.size(); ++i) grad_out[i] *= 0.01f;
  }
  worker::SavedContext ctx;
  worker::Tensor out, grad_in;
  auto fwd = [&] {
    if (absl::Status s = layer.Forward(input, data, ctx, out); !s.ok()) {
      std::fprintf(stderr, "forward: %s\n", std::string(s.message()).c_str());
      std::exit(1);
    }
  };
  auto bwd = [&] {
    if (absl::Status s = layer.Backward(grad_out, ctx, grad_in); !s.ok()) {
      std::fprintf(stderr, "backward: %s\n", std::string(s.message()).c_str());
      std::exit(1);
    }
  };
  auto release = [&] {
    ctx = worker::SavedContext{};
    out = worker::Tensor{};
    grad_in = worker::Tensor{};
  };
  return TimePair(fwd, bwd, release, reps, fwd_ms);
}

// One row of the benchmarks' table: what, threads, forward ms, forward + backward ms, and
// GFLOP/s of `flops` counted FLOPs ("-" when 0).
inline void PrintRow(const char* what, int threads, double fwd_ms, double ms, double flops) {
  if (flops > 0) {
    std::printf("%-22s %7d %10.1f %10.1f %9.1f\n", what, threads, fwd_ms, ms, flops / (ms * 1e6));
  } else {
    std::printf("%-22s %7d %10.1f %10.1f %9s\n", what, threads, fwd_ms, ms, "-");
  }
  std::fflush(stdout);
}

// --keep-heap 1: glibc malloc serves every allocation from the heap and never trims it, so a
// step's large activation buffers are not mmapped and page-faulted afresh on every forward.
// Process-wide allocator policy: a choice for a program's main(), not for a library.
inline void KeepHeap() {
  mallopt(M_MMAP_MAX, 0);
  mallopt(M_TRIM_THRESHOLD, std::numeric_limits<int>::max());
}

}  // namespace tandem::bench

#endif  // TANDEM_BENCH_LAYER_TIMING_H_
