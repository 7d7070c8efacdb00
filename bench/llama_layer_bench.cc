// Time of one Llama block forward + backward, and of the head (RMSNorm + LM head +
// cross-entropy) forward + backward, on the CPU reference kernels (worker/model/llama.h), at 1
// and 2 threads (openblas_set_num_threads, which the kernels also read as their own thread
// count: kernels::KernelThreads()). bench/torch_llama_layer.py prints the same table for PyTorch on
// the same shapes. The defaults are issue 21's figure: micro-batch 4, seq 256, d 768, 12 query
// heads, 4 kv heads, SwiGLU width 2048, and SmolLM2's vocabulary (49152) for the head.
//
//   build/bin/bench_llama_layer [--reps N] [--b 4] [--t 256] [--c 768] [--nh 12] [--kv 4]
//                               [--h 2048] [--v 49152] [--threads 1,2] [--keep-heap 1]
//                               [--phases 1] [--head 0]
//
// --keep-heap 1 keeps every allocation in glibc's heap (mallopt M_MMAP_MAX = 0,
// M_TRIM_THRESHOLD = INT_MAX), as tandem-worker does by default; see bench_gpt_layer.
// --phases 1 also times, with the kernels alone on the block's shapes, the attention core
// (GqaCausalAttentionForward + Backward: rotated q, k, v -> merged heads), the seven linears
// (forward, input and weight gradients) and the elementwise kernels (RMSNorm, RoPE, SwiGLU,
// the residual adds). Their sum is close to the block's time, which also pays for its
// allocations and gradient copies. --head 0 skips the head + loss rows (the block's figures
// alone, in a fraction of the time).
//
// FLOPs, 2*m*n*k per GEMM (N = B*T rows, C = d_model, KVD = KV * C / NH, H = d_hidden):
//   block forward  = 2*N*C*(C + 2 KVD + C + 3H)  [q, k, v, o, gate, up, down]
//                  + 2 * 2*B*T*T*C              [q k^T and att v over all query heads, full T x T]
//   block backward = 2 x the linear GEMMs (input and weight gradients)
//                  + 4 * 2*B*T*T*C              [d att, d v, d q, d k]
//   head           = 3 * 2*N*C*V                [logits; d rms_f; d W]
// Elementwise work (RMSNorm, RoPE, SwiGLU, softmax, the residual adds) is timed but not
// counted; neither is the causal kernel's skipped upper triangle (as bench_gpt_layer).
//
// Debian 12's OpenBLAS 0.3.21 does not recognise some newer CPUs (Sapphire Rapids) and falls
// back to its SSE3 "Prescott" kernels (both programs' first lines name the kernels in use);
// OPENBLAS_CORETYPE (e.g. SkylakeX) overrides the choice, for this bench and for
// torch_llama_layer.py on Debian's torch alike (see docs/benchmarks.md, "Llama block").
#include <cblas.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "bench/layer_timing.h"
#include "worker/model/kernels.h"
#include "worker/model/llama.h"
#include "worker/model/llama_kernels.h"
#include "worker/model/random.h"

namespace {

using tandem::worker::IntTensor;
using tandem::worker::LlamaBlock;
using tandem::worker::LlamaConfig;
using tandem::worker::LlamaHead;
using tandem::worker::MicroBatchData;
using tandem::worker::Rng;
using tandem::worker::Tensor;
namespace kernels = tandem::worker::kernels;
using tandem::bench::PrintRow;
using tandem::bench::TimeLayer;
using tandem::bench::TimePair;

Tensor RandomTensor(std::vector<int64_t> shape, Rng& rng, float scale) {
  Tensor x(std::move(shape));
  for (size_t i = 0; i < x.size(); ++i) x[i] = scale * static_cast<float>(rng.Normal());
  return x;
}

// The block's sizes, for the phases timed on their own (--phases 1).
struct Shapes {
  int64_t b, t, c, nh, kv, h;
  int64_t hd() const { return c / nh; }
  int64_t kvd() const { return kv * hd(); }
  int64_t n() const { return b * t; }
};

// GqaCausalAttentionForward + Backward: rotated q, k, v -> merged heads, and back.
double TimeAttentionCore(const Shapes& s, Rng& rng, int reps, double* fwd_ms) {
  const int64_t n = s.n(), hd = s.hd(), kvd = s.kvd();
  const Tensor q = RandomTensor({n, s.c}, rng, 1.0f), k = RandomTensor({n, kvd}, rng, 1.0f);
  const Tensor v = RandomTensor({n, kvd}, rng, 1.0f), dy = RandomTensor({n, s.c}, rng, 0.01f);
  Tensor att, y, dq, dk, dv;
  auto fwd = [&] {
    att.Reset({s.b, s.nh, s.t, s.t});
    y.Reset({n, s.c});
    kernels::GqaCausalAttentionForward(q.data(), k.data(), v.data(), att.data(), y.data(), s.b, s.t,
                                       s.nh, s.kv, hd);
  };
  auto bwd = [&] {
    dq.Reset({n, s.c});
    dk.Reset({n, kvd});
    dv.Reset({n, kvd});
    kernels::GqaCausalAttentionBackward(dy.data(), q.data(), k.data(), v.data(), att.data(),
                                        dq.data(), dk.data(), dv.data(), s.b, s.t, s.nh, s.kv, hd);
  };
  auto release = [&] {
    for (Tensor* p : {&att, &y, &dq, &dk, &dv}) *p = Tensor{};
  };
  return TimePair(fwd, bwd, release, reps, fwd_ms);
}

// The seven linears, each on its own input: forward, then the input and weight gradients.
double TimeLinears(const Shapes& s, Rng& rng, int reps, double* fwd_ms) {
  const int64_t n = s.n(), c = s.c, kvd = s.kvd(), h = s.h;
  // (in, out) of q, k, v, o, gate, up, down.
  const std::vector<std::pair<int64_t, int64_t>> dims = {{c, c}, {c, kvd}, {c, kvd}, {c, c},
                                                         {c, h}, {c, h},   {h, c}};
  std::vector<Tensor> in, w, dout, dw, out(dims.size()), din(dims.size());
  for (const auto& [ic, oc] : dims) {
    in.push_back(RandomTensor({n, ic}, rng, 1.0f));
    w.push_back(RandomTensor({oc, ic}, rng, 0.02f));
    dout.push_back(RandomTensor({n, oc}, rng, 0.01f));
    dw.push_back(Tensor({oc, ic}));
  }
  auto fwd = [&] {
    for (size_t i = 0; i < dims.size(); ++i) {
      out[i].Reset({n, dims[i].second});
      kernels::LinearForward(in[i].data(), w[i].data(), nullptr, out[i].data(), n, dims[i].first,
                             dims[i].second);
    }
  };
  auto bwd = [&] {
    for (size_t i = 0; i < dims.size(); ++i) {
      din[i].Reset({n, dims[i].first});
      kernels::LinearBackward(dout[i].data(), nullptr, w[i].data(), din[i].data(), nullptr, nullptr,
                              n, dims[i].first, dims[i].second);
      kernels::LinearBackward(dout[i].data(), in[i].data(), nullptr, nullptr, dw[i].data(), nullptr,
                              n, dims[i].first, dims[i].second);
    }
  };
  auto release = [&] {
    for (size_t i = 0; i < dims.size(); ++i) out[i] = din[i] = Tensor{};
  };
  return TimePair(fwd, bwd, release, reps, fwd_ms);
}

// The block's elementwise kernels as LlamaBlock runs them: forward two RMSNorms, RoPE on q
// and k, SwiGLU and the two residual adds; backward the SwiGLU recompute and gradient, two
// RMSNorm gradients and RoPE's on dq and dk. No BLAS: threaded over --threads by the kernels
// themselves (kernels::KernelThreads()).
double TimeElementwise(const Shapes& s, Rng& rng, int reps, double* fwd_ms) {
  const int64_t n = s.n(), c = s.c, h = s.h, hd = s.hd();
  const Tensor x = RandomTensor({n, c}, rng, 1.0f), gain = RandomTensor({c}, rng, 1.0f);
  const Tensor gate = RandomTensor({n, h}, rng, 1.0f), up = RandomTensor({n, h}, rng, 1.0f);
  const Tensor dxn = RandomTensor({n, c}, rng, 0.01f), dact = RandomTensor({n, h}, rng, 0.01f);
  Tensor q = RandomTensor({n, c}, rng, 1.0f), k = RandomTensor({n, s.kvd()}, rng, 1.0f);
  Tensor cos({s.t, hd / 2}), sin({s.t, hd / 2}), dgain({c});
  kernels::RopeTables(s.t, hd, 10000.0, cos.data(), sin.data());
  Tensor xn1, xn2, rstd1, rstd2, act, sum, act2, dgate, dup, dx;
  auto fwd = [&] {
    for (Tensor* p : {&xn1, &xn2, &sum}) p->Reset({n, c});
    rstd1.Reset({n});
    rstd2.Reset({n});
    act.Reset({n, h});
    kernels::RmsNormForward(x.data(), gain.data(), xn1.data(), rstd1.data(), n, c, 1e-5f);
    kernels::RopeForward(q.data(), cos.data(), sin.data(), s.b, s.t, s.nh, hd);
    kernels::RopeForward(k.data(), cos.data(), sin.data(), s.b, s.t, s.kv, hd);
    kernels::Add(xn1.data(), x.data(), sum.data(), n * c);
    kernels::RmsNormForward(sum.data(), gain.data(), xn2.data(), rstd2.data(), n, c, 1e-5f);
    kernels::SwiGluForwardFast(gate.data(), up.data(), act.data(), n * h);
    kernels::Add(xn2.data(), sum.data(), sum.data(), n * c);
  };
  auto bwd = [&] {
    for (Tensor* p : {&act2, &dgate, &dup}) p->Reset({n, h});
    dx.Reset({n, c});
    kernels::SwiGluBackwardFast(gate.data(), up.data(), dact.data(), act2.data(), dgate.data(),
                                dup.data(), n * h);
    kernels::RmsNormBackward(dxn.data(), sum.data(), gain.data(), rstd2.data(), dx.data(),
                             dgain.data(), n, c);
    kernels::RopeBackward(q.data(), cos.data(), sin.data(), s.b, s.t, s.nh, hd);
    kernels::RopeBackward(k.data(), cos.data(), sin.data(), s.b, s.t, s.kv, hd);
    kernels::RmsNormBackward(dxn.data(), x.data(), gain.data(), rstd1.data(), dx.data(),
                             dgain.data(), n, c);
  };
  auto release = [&] {
    for (Tensor* p : {&xn1, &xn2, &rstd1, &rstd2, &act, &sum, &act2, &dgate, &dup, &dx}) {
      *p = Tensor{};
    }
  };
  return TimePair(fwd, bwd, release, reps, fwd_ms);
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 5;
  int64_t b = 4, t = 256, c = 768, nh = 12, kv = 4, h = 2048, v = 49152;
  std::vector<int> threads = {1, 2};
  bool keep_heap = false, phases = false, with_head = true;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    int64_t value = 0;
    if (flag == "--threads") {
      threads.clear();
      for (absl::string_view part : absl::StrSplit(argv[i + 1], ',')) {
        int n = 0;
        if (!absl::SimpleAtoi(part, &n) || n < 1) {
          std::fprintf(stderr, "bad --threads\n");
          return 2;
        }
        threads.push_back(n);
      }
      continue;
    }
    if (!absl::SimpleAtoi(argv[i + 1], &value) || value < 0) {
      std::fprintf(stderr, "bad value for %s\n", flag.c_str());
      return 2;
    }
    if (flag == "--keep-heap") {
      keep_heap = value != 0;
      continue;
    }
    if (flag == "--phases") {
      phases = value != 0;
      continue;
    }
    if (flag == "--head") {
      with_head = value != 0;
      continue;
    }
    if (value < 1) {
      std::fprintf(stderr, "%s must be >= 1\n", flag.c_str());
      return 2;
    }
    if (flag == "--reps") {
      reps = static_cast<int>(value);
    } else if (flag == "--b") {
      b = value;
    } else if (flag == "--t") {
      t = value;
    } else if (flag == "--c") {
      c = value;
    } else if (flag == "--nh") {
      nh = value;
    } else if (flag == "--kv") {
      kv = value;
    } else if (flag == "--h") {
      h = value;
    } else if (flag == "--v") {
      v = value;
    } else {
      std::fprintf(stderr, "unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  LlamaConfig cfg;
  cfg.n_layer = 12;
  cfg.n_head = nh;
  cfg.n_kv_head = kv;
  cfg.d_model = c;
  cfg.d_hidden = h;
  cfg.seq_len = t;
  cfg.vocab = v;
  cfg.tie_embeddings = true;  // as SmolLM2; changes only where the head's W is drawn from
  if (absl::Status s = tandem::worker::ValidateLlamaConfig(cfg); !s.ok()) {
    std::fprintf(stderr, "%s\n", std::string(s.message()).c_str());
    return 2;
  }
  if (keep_heap) tandem::bench::KeepHeap();
  const int64_t hd = c / nh, kvd = kv * hd, n = b * t;
  const double linear = 2.0 * n * c * (c + 2.0 * kvd + c + 3.0 * h);
  const double attention = 2.0 * 2.0 * b * t * t * c;
  const double block_flops = 3.0 * linear + 3.0 * attention;
  const double head_flops = 3.0 * 2.0 * n * c * v;

  LlamaBlock block(cfg, 0, 1234);
  LlamaHead head(cfg, 1234);
  Rng rng(7);
  const Tensor x = RandomTensor({b, t, c}, rng, 1.0f);
  IntTensor targets({b, t});
  for (size_t i = 0; i < targets.size(); ++i) {
    targets[i] = static_cast<int32_t>(rng.Below(static_cast<uint64_t>(v)));
  }
  MicroBatchData head_data;
  head_data.targets = &targets;
  head_data.loss_normalizer = n;

  std::printf(
      "tandem: B=%lld T=%lld C=%lld NH=%lld KV=%lld H=%lld V=%lld, median of %d (after 1 "
      "warm-up)%s, OpenBLAS %s kernels\n",
      static_cast<long long>(b), static_cast<long long>(t), static_cast<long long>(c),
      static_cast<long long>(nh), static_cast<long long>(kv), static_cast<long long>(h),
      static_cast<long long>(v), reps, keep_heap ? ", keep-heap" : "", openblas_get_corename());
  std::printf("%-22s %7s %10s %10s %9s\n", "what", "threads", "fwd ms", "fwd+bwd ms", "GFLOP/s");
  for (int th : threads) {
    openblas_set_num_threads(th);
    double fwd = 0;
    const double ms = TimeLayer(block, x, MicroBatchData{}, reps, &fwd);
    PrintRow("block fwd+bwd", th, fwd, ms, block_flops);
  }
  if (phases) {
    const Shapes shapes{b, t, c, nh, kv, h};
    for (int th : threads) {
      openblas_set_num_threads(th);
      double fwd = 0;
      double ms = TimeAttentionCore(shapes, rng, reps, &fwd);
      PrintRow("  attention core", th, fwd, ms, 3.0 * attention);
      ms = TimeLinears(shapes, rng, reps, &fwd);
      PrintRow("  7 linears", th, fwd, ms, 3.0 * linear);
      ms = TimeElementwise(shapes, rng, reps, &fwd);
      PrintRow("  norms+rope+swiglu", th, fwd, ms, 0.0);
    }
  }
  for (int th : with_head ? threads : std::vector<int>{}) {
    openblas_set_num_threads(th);
    double fwd = 0;
    const double ms = TimeLayer(head, x, head_data, reps, &fwd);
    PrintRow("head+loss fwd+bwd", th, fwd, ms, head_flops);
  }
  std::printf("counted GFLOP: block %.2f (attention %.2f), head %.2f\n", block_flops / 1e9,
              3.0 * attention / 1e9, head_flops / 1e9);
  return 0;
}
