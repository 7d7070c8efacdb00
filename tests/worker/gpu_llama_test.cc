// GpuLlama (worker/backend/cuda/gpu_llama.h) and its kernels against the CPU llama layers and
// kernels (worker/model/llama.h, llama_kernels.h), the CPU being the reference.
//
// Host only (every build with CUDA compiled in, no device needed): the layout (names, shapes,
// order, decay, tied flags) and the initial values against the CPU layers' Parameters() for
// every single-layer stage and the whole model, tied and untied (bit-identical); the RoPE
// tables against kernels::RopeTables (bit-identical); config validation; the SmolLM2-135M
// parameter count and memory plan.
//
// On a device (skipped with "no CUDA device: <status>" otherwise):
//  - kernels in fp32 on the same random inputs (RMSNorm, RoPE, SwiGLU forward and backward;
//    grouped-query attention forward and backward at a tiny shape, NH 4 / KV 2, and at
//    SmolLM2-135M's, NH 9 / KV 3, hd 64, T 2048): every element within kKernelTol = 1e-4 x
//    max(1, max |ref|) of its tensor (a different summation order and a few ulps of expf);
//  - each layer (embedding, block, head) as a one-layer stage against the CPU layer, forward
//    (output or loss) and backward (input gradient and every parameter gradient), with the
//    fused backward (B) and with the split one (I then W, against the CPU's I then W): in fp32
//    every tensor within kLayerTol = 1e-4 x its max |ref| (+1e-7 absolute); in bf16 (bf16 GEMM
//    operands and saved linear inputs, fp32 accumulation) within kBf16LayerTol = 5e-2 x its
//    max |ref|: each GEMM rounds its operands to 8 significant bits (~2^-8 = 0.4% each), and a
//    block's backward chains four GEMM levels and the attention, so a few 2^-8 of the tensor's
//    largest element, with margin; a wrong index or a missing term is off by O(1);
//  - the tiny llama (2 layers, d 64, 4 heads, 2 kv heads, H 192, T 16, V 256) as one stage,
//    tied and untied: fp32 ForwardBackward loss within 1e-5 relative and every gradient within
//    kLayerTol, then three AdamW steps' losses and gradient norms within 1e-4 relative of the
//    CPU layers driven with the CPU AdamW; a wider llama (d 128, T 64, B 8) in bf16 against the
//    CPU's fp32 over three AdamW steps at lr 1e-3: losses within 1e-2 relative (the stage
//    conformance test's bf16 tolerance, same reasoning: the loss averages 512 positions) and
//    gradient norms within 5e-2 (gpu_gpt_test's bf16 norm tolerance);
//  - three stages [0, 2), [2, 3), [3, 4) of the tied tiny llama, run as a pipeline with device
//    hand-over and the tied embedding's copies summed, against the whole model: loss within
//    1e-6 relative, every gradient within 1e-5 x its max |grad| (the same kernels; only the
//    embedding's atomicAdd scatter adds in another order);
//  - SmolLM2-135M's block shapes (d 576, 9 heads, 3 kv heads, H 1536, T 2048, one sequence) as
//    a one-block stage in fp32 against the CPU block: output, input gradient and weight
//    gradients within 1e-3 x max |ref| (fp32 rounding in other orders over K = 2048 positions).
#include "worker/backend/cuda/gpu_llama.h"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tests/worker/gpu_gpt_test_util.h"
#include "worker/backend/cuda/cuda_handles.h"
#include "worker/backend/cuda/cuda_kernels.h"
#include "worker/backend/cuda/device.h"
#include "worker/backend/cuda/device_buffer.h"
#include "worker/backend/cuda/gpu_llama_kernels.h"
#include "worker/backend/cuda/gpu_llama_layout.h"
#include "worker/model/layer_init.h"
#include "worker/model/llama.h"
#include "worker/model/llama_kernels.h"
#include "worker/model/optimizer.h"
#include "worker/model/random.h"

namespace tandem::worker::cuda {
namespace {

constexpr double kKernelTol = 1e-4;
constexpr double kLayerTol = 1e-4;
constexpr double kAbsTol = 1e-7;
constexpr double kBf16LayerTol = 5e-2;
constexpr double kLossTol = 1e-5;
constexpr double kStepTol = 1e-4;
constexpr double kBf16StepLossTol = 1e-2;
constexpr double kBf16NormTol = 5e-2;
constexpr double kSmolTol = 1e-3;

#define SKIP_WITHOUT_DEVICE()                        \
  do {                                               \
    if (absl::Status s = CudaAvailable(); !s.ok()) { \
      GTEST_SKIP() << "no CUDA device: " << s;       \
    }                                                \
  } while (false)

// The `llama-tiny` preset's model (common/spec.cc) with a (4, 16) micro-batch.
GpuLlamaConfig TinyLlama(GpuPrecision precision, bool tied = false) {
  GpuLlamaConfig c;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_kv_head = 2;
  c.d_model = 64;
  c.d_hidden = 192;
  c.seq_len = 16;
  c.vocab = 256;
  c.rope_theta = 10000.0;
  c.rms_eps = 1e-5;
  c.tie_embeddings = tied;
  c.batch = 4;
  c.seq = 16;
  c.precision = precision;
  c.seed = 7;
  return c;
}

// One block of SmolLM2-135M (HuggingFaceTB/SmolLM2-135M) with one 2048-token sequence.
GpuLlamaConfig SmolLm2(GpuPrecision precision) {
  GpuLlamaConfig c;
  c.n_layer = 30;
  c.n_head = 9;
  c.n_kv_head = 3;
  c.d_model = 576;
  c.d_hidden = 1536;
  c.seq_len = 2048;
  c.vocab = 49152;
  c.rope_theta = 100000.0;
  c.rms_eps = 1e-5;
  c.tie_embeddings = true;
  c.batch = 1;
  c.seq = 2048;
  c.precision = precision;
  c.seed = 7;
  return c;
}

LlamaConfig CpuConfig(const GpuLlamaConfig& c) {
  LlamaConfig l;
  l.n_layer = c.n_layer;
  l.n_head = c.n_head;
  l.n_kv_head = c.n_kv_head == 0 ? c.n_head : c.n_kv_head;
  l.d_model = c.d_model;
  l.d_hidden = c.d_hidden;
  l.seq_len = c.seq_len;
  l.vocab = c.vocab;
  l.rope_theta = c.rope_theta;
  l.rms_eps = c.rms_eps;
  l.tie_embeddings = c.tie_embeddings;
  return l;
}

GpuLlamaConfig Stage(GpuLlamaConfig c, int64_t begin, int64_t end) {
  c.layer_begin = begin;
  c.layer_end = end;
  return c;
}

// The CPU layers of a stage and, for each GPU layout tensor, the CPU parameter it mirrors (a
// stage holding both ends has one tied embedding: the head's copy has no GPU tensor).
struct CpuStage {
  std::vector<std::unique_ptr<Layer>> layers;
  std::vector<Parameter*> params;    // every layer's
  std::vector<Parameter*> matching;  // params[i] for the GPU layout's tensor i
  Parameter* head_copy = nullptr;    // the head's tied copy when the embedding is here too

  CpuStage(const GpuLlamaConfig& c, int begin, int end) {
    absl::StatusOr<std::vector<std::unique_ptr<Layer>>> built =
        BuildLlamaLayers(CpuConfig(c), c.seed, begin, end);
    EXPECT_TRUE(built.ok()) << built.status();
    if (!built.ok()) return;
    layers = *std::move(built);
    const bool both_ends = begin == 0 && end == c.n_layer + 2;
    for (auto& l : layers) {
      for (Parameter* p : l->Parameters()) {
        params.push_back(p);
        if (both_ends && l->is_loss() && p->tied) {
          head_copy = p;
        } else {
          matching.push_back(p);
        }
      }
    }
  }

  // The executor's tie rule, then the GPU's view: the embedding's copy holds the sum.
  void TieGradients() {
    if (head_copy == nullptr) return;
    Parameter* e = matching[0];
    for (size_t j = 0; j < e->grad.size(); ++j) {
      const float s = e->grad[j] + head_copy->grad[j];
      e->grad[j] = s;
      head_copy->grad[j] = s;
    }
  }

  double GradNorm() const {
    double s = 0.0;
    for (const Parameter* p : matching) {
      for (size_t j = 0; j < p->grad.size(); ++j) s += double{p->grad[j]} * p->grad[j];
    }
    return std::sqrt(s);
  }
};

void RandomIds(uint64_t seed, int64_t b, int64_t t, int64_t vocab, IntTensor& ids) {
  Rng rng(seed);
  ids.Reset({b, t});
  for (size_t i = 0; i < ids.size(); ++i) {
    ids[i] = static_cast<int32_t>(rng.Below(static_cast<uint64_t>(vocab)));
  }
}

std::vector<float> RandomVector(uint64_t seed, size_t n, double stddev) {
  Rng rng(seed);
  std::vector<float> v(n);
  for (float& x : v) x = static_cast<float>(rng.Normal() * stddev);
  return v;
}

// Every element of `got` within tol x max(floor, max |want|) + abs_tol of `want`.
void ExpectClose(const std::string& what, const float* got, const float* want, size_t n, double tol,
                 double floor = 0.0, double abs_tol = kAbsTol) {
  const GradError e = CompareGradient(got, want, n);
  EXPECT_LE(e.max_err, tol * std::max(floor, e.max_ref) + abs_tol)
      << what << ": max |ref| " << e.max_ref << ", max |err| " << e.max_err;
}

// ---------------------------------------------------------------------------------------
// Host only.

TEST(GpuLlamaLayoutTest, LayoutAndInitialValuesMatchTheCpuLayers) {
  for (bool tied : {false, true}) {
    const GpuLlamaConfig base = TinyLlama(GpuPrecision::kBf16, tied);
    std::vector<std::pair<int, int>> ranges = {{0, 4}, {0, 1}, {1, 2}, {2, 3}, {3, 4}, {1, 4}};
    for (auto [begin, end] : ranges) {
      SCOPED_TRACE(testing::Message() << "tied " << tied << " [" << begin << ", " << end << ")");
      absl::StatusOr<GpuLlamaConfig> cfg = ValidateGpuLlamaConfig(Stage(base, begin, end));
      ASSERT_TRUE(cfg.ok()) << cfg.status();
      const std::vector<GpuTensor> layout = GpuLlamaParameterLayout(*cfg);
      const std::vector<float> init = InitGpuLlamaParameters(*cfg, layout);
      CpuStage cpu(*cfg, begin, end);
      ASSERT_EQ(layout.size(), cpu.matching.size());
      const bool tied_split = tied && (begin == 0) != (end == 4);
      for (size_t i = 0; i < layout.size(); ++i) {
        const Parameter& p = *cpu.matching[i];
        EXPECT_EQ(layout[i].name, p.name);
        EXPECT_EQ(layout[i].shape, p.value.shape()) << p.name;
        EXPECT_EQ(layout[i].decay, p.decay) << p.name;
        // The 2-D weights are GEMM weights, but the embedding's only when the head reads it.
        const bool lookup_only = begin == 0 && i == 0 && !(tied && end == 4);
        EXPECT_EQ(layout[i].compute_copy, p.decay && !lookup_only) << p.name;
        EXPECT_EQ(layout[i].tied, p.tied && tied_split) << p.name;
        ASSERT_EQ(layout[i].count, p.value.size()) << p.name;
        EXPECT_EQ(std::memcmp(init.data() + layout[i].offset, p.value.data(),
                              p.value.size() * sizeof(float)),
                  0)
            << p.name << ": initial values differ";
      }
    }
  }
}

TEST(GpuLlamaLayoutTest, InitStdMatchesTheCpuLayers) { EXPECT_EQ(kGpuInitStd, kInitStd); }

TEST(GpuLlamaLayoutTest, RopeTablesMatchTheCpuBitForBit) {
  for (auto [t, hd, theta] :
       {std::tuple{int64_t{16}, int64_t{16}, 10000.0}, {int64_t{2048}, int64_t{64}, 100000.0}}) {
    const size_t n = static_cast<size_t>(t * hd / 2);
    std::vector<float> c1(n), s1(n), c2(n), s2(n);
    GpuRopeTables(t, hd, theta, c1.data(), s1.data());
    kernels::RopeTables(t, hd, theta, c2.data(), s2.data());
    EXPECT_EQ(std::memcmp(c1.data(), c2.data(), n * sizeof(float)), 0) << "cos, hd " << hd;
    EXPECT_EQ(std::memcmp(s1.data(), s2.data(), n * sizeof(float)), 0) << "sin, hd " << hd;
  }
}

TEST(GpuLlamaLayoutTest, ValidationNamesTheField) {
  const GpuLlamaConfig good = TinyLlama(GpuPrecision::kBf16);
  ASSERT_TRUE(ValidateGpuLlamaConfig(good).ok());
  struct Case {
    const char* field;
    void (*edit)(GpuLlamaConfig&);
  };
  const Case cases[] = {
      {"n_kv_head", [](GpuLlamaConfig& c) { c.n_kv_head = 3; }},
      {"head size", [](GpuLlamaConfig& c) { c.d_model = 4 * 15; }},
      {"d_hidden", [](GpuLlamaConfig& c) { c.d_hidden = 0; }},
      {"rope_theta", [](GpuLlamaConfig& c) { c.rope_theta = 0.0; }},
      {"rms_eps", [](GpuLlamaConfig& c) { c.rms_eps = -1.0; }},
      {"seq", [](GpuLlamaConfig& c) { c.seq = 17; }},
      {"layers", [](GpuLlamaConfig& c) { c.layer_begin = 4; }},
  };
  for (const Case& k : cases) {
    GpuLlamaConfig c = good;
    k.edit(c);
    const absl::StatusOr<GpuLlamaConfig> v = ValidateGpuLlamaConfig(c);
    ASSERT_FALSE(v.ok()) << k.field;
    EXPECT_EQ(v.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(v.status().message().find(k.field), std::string::npos) << v.status();
  }
  GpuLlamaConfig mha = good;
  mha.n_kv_head = 0;  // means n_head
  ASSERT_TRUE(ValidateGpuLlamaConfig(mha).ok());
  EXPECT_EQ(ValidateGpuLlamaConfig(mha)->n_kv_head, 4);
}

// SmolLM2-135M: 134,515,008 parameters (tied; HF reports 134.5M).
TEST(GpuLlamaLayoutTest, SmolLm2ParameterCountAndPlan) {
  const absl::StatusOr<GpuLlamaConfig> cfg = ValidateGpuLlamaConfig(SmolLm2(GpuPrecision::kBf16));
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  const std::vector<GpuTensor> layout = GpuLlamaParameterLayout(*cfg);
  EXPECT_EQ(ParameterElements(layout), size_t{134515008});
  EXPECT_EQ(layout.size(), size_t{1 + 30 * 9 + 1});
  const absl::StatusOr<GpuStageMemory> plan = PlanGpuLlamaMemory(*cfg);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->parameters, 134515008u * 4);
  EXPECT_EQ(plan->compute_weights, 134515008u * 2 - 30u * 2 * 576 * 2 - 576u * 2);
  // Per block at least the (NH, T, T) probabilities, per sequence.
  EXPECT_GT(plan->activations, size_t{30} * 9 * 2048 * 2048 * 4);
}

// Selective recomputation: no block's slot keeps its (B, NH, T, T) probabilities; the
// workspace holds one block's, rebuilt before that block's attention backward.
TEST(GpuLlamaLayoutTest, SelectiveRecomputationKeepsNoProbabilitiesInTheSlots) {
  GpuLlamaConfig cfg = SmolLm2(GpuPrecision::kBf16);
  const absl::StatusOr<GpuStageMemory> plain = PlanGpuLlamaMemory(cfg);
  cfg.selective_recompute = true;
  const absl::StatusOr<GpuStageMemory> selective = PlanGpuLlamaMemory(cfg);
  ASSERT_TRUE(plain.ok() && selective.ok());
  const size_t att = static_cast<size_t>(cfg.batch * cfg.n_head * cfg.seq * cfg.seq) * 4;
  EXPECT_EQ(plain->activations - selective->activations, size_t{30} * att);
  EXPECT_EQ(selective->workspace - plain->workspace, att);
  EXPECT_EQ(selective->parameters, plain->parameters);
}

// ---------------------------------------------------------------------------------------
// Kernels on a device.

struct Device {
  CudaStream stream;
  CublasHandle blas;
};

std::unique_ptr<Device> MakeDevice() {
  auto d = std::make_unique<Device>();
  absl::StatusOr<CudaStream> s = CudaStream::Create();
  EXPECT_TRUE(s.ok()) << s.status();
  if (!s.ok()) return nullptr;
  d->stream = *std::move(s);
  absl::StatusOr<CublasHandle> b = CublasHandle::Create(d->stream.get());
  EXPECT_TRUE(b.ok()) << b.status();
  if (!b.ok()) return nullptr;
  d->blas = *std::move(b);
  return d;
}

DeviceBuffer<float> Up(const std::vector<float>& host) {
  absl::StatusOr<DeviceBuffer<float>> b = DeviceBuffer<float>::FromHost(host.data(), host.size());
  EXPECT_TRUE(b.ok()) << b.status();
  // FromHost's cudaMemcpy may return before the DMA lands; the kernels run on another stream.
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return b.ok() ? *std::move(b) : DeviceBuffer<float>();
}

// A host copy after every stream's work (the kernels run on non-blocking streams).
std::vector<float> Down(const DeviceBuffer<float>& b) {
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<float> h(b.size());
  EXPECT_TRUE(b.CopyToHost(h.data(), h.size()).ok());
  return h;
}

TEST(GpuLlamaKernelsTest, RmsNormRopeSwiGluMatchTheCpu) {
  SKIP_WITHOUT_DEVICE();
  std::unique_ptr<Device> d = MakeDevice();
  ASSERT_NE(d, nullptr);
  // RMSNorm at SmolLM2's width, 2048 rows.
  {
    const int64_t n = 2048, c = 576;
    const size_t nc = static_cast<size_t>(n * c);
    std::vector<float> x = RandomVector(1, nc, 1.0), g = RandomVector(2, c, 0.5),
                       dy = RandomVector(3, nc, 1.0);
    for (float& v : g) v += 1.0f;
    std::vector<float> y(nc), rstd(n), dx(nc, 0.25f), dg(c, 0.5f);
    kernels::RmsNormForward(x.data(), g.data(), y.data(), rstd.data(), n, c, 1e-5f);
    kernels::RmsNormBackward(dy.data(), x.data(), g.data(), rstd.data(), dx.data(), dg.data(), n,
                             c);
    DeviceBuffer<float> dx_d = Up(x), dg_d = Up(g), ddy = Up(dy), dy_d = Up(std::vector<float>(nc)),
                        drs = Up(std::vector<float>(n)), ddx = Up(std::vector<float>(nc, 0.25f)),
                        ddg = Up(std::vector<float>(c, 0.5f));
    ASSERT_TRUE(RmsNormForward(d->stream.get(), dx_d.data(), dg_d.data(), dy_d.data(), drs.data(),
                               n, c, 1e-5f)
                    .ok());
    ASSERT_TRUE(RmsNormBackward(d->stream.get(), ddy.data(), dx_d.data(), dg_d.data(), drs.data(),
                                ddx.data(), ddg.data(), n, c)
                    .ok());
    ExpectClose("rmsnorm out", Down(dy_d).data(), y.data(), nc, kKernelTol, 1.0);
    ExpectClose("rmsnorm rstd", Down(drs).data(), rstd.data(), n, kKernelTol, 1.0);
    ExpectClose("rmsnorm din", Down(ddx).data(), dx.data(), nc, kKernelTol, 1.0);
    ExpectClose("rmsnorm dgain", Down(ddg).data(), dg.data(), c, kKernelTol, 1.0);
  }
  // RoPE on queries and keys at SmolLM2's shape (T 2048, hd 64) and an odd head count.
  for (auto [b, t, nhx, hd] : {std::tuple{int64_t{2}, int64_t{16}, int64_t{3}, int64_t{16}},
                               {int64_t{1}, int64_t{2048}, int64_t{9}, int64_t{64}}}) {
    const size_t n = static_cast<size_t>(b * t * nhx * hd), half = static_cast<size_t>(t * hd / 2);
    std::vector<float> cos(half), sin(half);
    kernels::RopeTables(t, hd, 100000.0, cos.data(), sin.data());
    std::vector<float> x = RandomVector(4, n, 1.0), fwd = x, bwd = x;
    kernels::RopeForward(fwd.data(), cos.data(), sin.data(), b, t, nhx, hd);
    kernels::RopeBackward(bwd.data(), cos.data(), sin.data(), b, t, nhx, hd);
    DeviceBuffer<float> dc = Up(cos), ds = Up(sin), df = Up(x), db = Up(x);
    ASSERT_TRUE(RopeForward(d->stream.get(), df.data(), dc.data(), ds.data(), b, t, nhx, hd).ok());
    ASSERT_TRUE(RopeBackward(d->stream.get(), db.data(), dc.data(), ds.data(), b, t, nhx, hd).ok());
    ExpectClose("rope forward", Down(df).data(), fwd.data(), n, kKernelTol, 1.0);
    ExpectClose("rope backward", Down(db).data(), bwd.data(), n, kKernelTol, 1.0);
  }
  // SwiGLU at SmolLM2's width.
  {
    const size_t n = 2048 * 1536;
    std::vector<float> gate = RandomVector(5, n, 2.0), up = RandomVector(6, n, 1.0),
                       dout = RandomVector(7, n, 1.0);
    std::vector<float> out(n), dgate(n, 0.125f), dup(n, -0.125f);
    kernels::SwiGluForward(gate.data(), up.data(), out.data(), n);
    kernels::SwiGluBackward(gate.data(), up.data(), dout.data(), dgate.data(), dup.data(), n);
    DeviceBuffer<float> dg = Up(gate), du = Up(up), dd = Up(dout),
                        dout_d = Up(std::vector<float>(n)), ddg = Up(std::vector<float>(n, 0.125f)),
                        ddu = Up(std::vector<float>(n, -0.125f));
    ASSERT_TRUE(SwiGluForward(d->stream.get(), dg.data(), du.data(), dout_d.data(), n).ok());
    ASSERT_TRUE(
        SwiGluBackward(d->stream.get(), dg.data(), du.data(), dd.data(), ddg.data(), ddu.data(), n)
            .ok());
    ExpectClose("swiglu out", Down(dout_d).data(), out.data(), n, kKernelTol, 1.0);
    ExpectClose("swiglu dgate", Down(ddg).data(), dgate.data(), n, kKernelTol, 1.0);
    ExpectClose("swiglu dup", Down(ddu).data(), dup.data(), n, kKernelTol, 1.0);
  }
}

TEST(GpuLlamaKernelsTest, GroupedQueryAttentionMatchesTheCpu) {
  SKIP_WITHOUT_DEVICE();
  std::unique_ptr<Device> d = MakeDevice();
  ASSERT_NE(d, nullptr);
  for (auto [b, t, nh, kv, hd] :
       {std::tuple{int64_t{2}, int64_t{16}, int64_t{4}, int64_t{2}, int64_t{16}},
        {int64_t{2}, int64_t{40}, int64_t{4}, int64_t{4}, int64_t{8}},
        {int64_t{1}, int64_t{2048}, int64_t{9}, int64_t{3}, int64_t{64}}}) {
    SCOPED_TRACE(testing::Message()
                 << "b " << b << " t " << t << " nh " << nh << " kv " << kv << " hd " << hd);
    const size_t qn = static_cast<size_t>(b * t * nh * hd),
                 kn = static_cast<size_t>(b * t * kv * hd),
                 an = static_cast<size_t>(b * nh * t * t);
    std::vector<float> q = RandomVector(10, qn, 1.0), k = RandomVector(11, kn, 1.0),
                       v = RandomVector(12, kn, 1.0), dy = RandomVector(13, qn, 1.0);
    std::vector<float> att(an), y(qn), dq(qn, 0.5f), dk(kn, 0.5f), dv(kn, 0.5f);
    kernels::GqaCausalAttentionForward(q.data(), k.data(), v.data(), att.data(), y.data(), b, t, nh,
                                       kv, hd);
    kernels::GqaCausalAttentionBackward(dy.data(), q.data(), k.data(), v.data(), att.data(),
                                        dq.data(), dk.data(), dv.data(), b, t, nh, kv, hd);
    DeviceBuffer<float> dq_in = Up(q), dk_in = Up(k), dv_in = Up(v), ddy = Up(dy),
                        datt = Up(std::vector<float>(an)), dyo = Up(std::vector<float>(qn)),
                        ddq = Up(std::vector<float>(qn, 0.5f)),
                        ddk = Up(std::vector<float>(kn, 0.5f)),
                        ddv = Up(std::vector<float>(kn, 0.5f)),
                        scratch = Up(std::vector<float>(static_cast<size_t>(nh * t * t)));
    ASSERT_TRUE(GqaCausalAttentionForward(d->blas.get(), d->stream.get(), dq_in.data(),
                                          dk_in.data(), dv_in.data(), datt.data(), dyo.data(), b, t,
                                          nh, kv, hd)
                    .ok());
    ASSERT_TRUE(GqaCausalAttentionBackward(d->blas.get(), d->stream.get(), ddy.data(), dq_in.data(),
                                           dk_in.data(), dv_in.data(), datt.data(), ddq.data(),
                                           ddk.data(), ddv.data(), scratch.data(), b, t, nh, kv, hd)
                    .ok());
    ExpectClose("att", Down(datt).data(), att.data(), an, kKernelTol, 1.0);
    ExpectClose("out", Down(dyo).data(), y.data(), qn, kKernelTol, 1.0);
    ExpectClose("dq", Down(ddq).data(), dq.data(), qn, kKernelTol, 1.0);
    ExpectClose("dk", Down(ddk).data(), dk.data(), kn, kKernelTol, 1.0);
    ExpectClose("dv", Down(ddv).data(), dv.data(), kn, kKernelTol, 1.0);
  }
}

// ---------------------------------------------------------------------------------------
// Layers and stages on a device.

std::unique_ptr<GpuLlama> MakeGpu(const GpuLlamaConfig& c, const AdamWHyper& hyper = {}) {
  absl::StatusOr<std::unique_ptr<GpuLlama>> g = GpuLlama::Create(c, hyper);
  EXPECT_TRUE(g.ok()) << g.status();
  return g.ok() ? std::move(*g) : nullptr;
}

TEST(GpuLlamaTest, CreateWithoutADeviceFails) {
  if (CudaAvailable().ok()) GTEST_SKIP() << "a CUDA device is present; nothing fails here";
  const absl::StatusOr<std::unique_ptr<GpuLlama>> g =
      GpuLlama::Create(TinyLlama(GpuPrecision::kFp32), AdamWHyper{});
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), absl::StatusCode::kFailedPrecondition) << g.status();
}

void ExpectGradients(GpuLlama& gpu, const std::vector<Parameter*>& want, double tol,
                     const std::string& what) {
  const std::vector<GpuTensor>& layout = gpu.layout();
  ASSERT_EQ(layout.size(), want.size());
  for (size_t i = 0; i < layout.size(); ++i) {
    std::vector<float> got(layout[i].count);
    ASSERT_TRUE(gpu.GetGradient(i, got.data(), got.size()).ok());
    ExpectClose(what + " " + layout[i].name, got.data(), want[i]->grad.data(), got.size(), tol);
  }
}

// One global layer `layer` as a one-layer stage: forward and backward against the CPU layer,
// the fused backward on one GPU stage and CPU layer, the split one (I then W) on another of
// each.
void CheckOneLayer(const GpuLlamaConfig& base, int layer, double tol) {
  SCOPED_TRACE(testing::Message() << "layer " << layer);
  const GpuLlamaConfig c = Stage(base, layer, layer + 1);
  const bool embedding = layer == 0, head = layer == c.n_layer + 1;
  std::unique_ptr<GpuLlama> fused = MakeGpu(c), split = MakeGpu(c);
  ASSERT_TRUE(fused && split);
  CpuStage cpu_fused(c, layer, layer + 1), cpu_split(c, layer, layer + 1);
  ASSERT_EQ(cpu_fused.layers.size(), 1u);
  const int64_t n = c.batch * c.seq, width = c.d_model;
  const size_t act = static_cast<size_t>(n * width);
  IntTensor tokens, targets;
  RandomIds(20 + layer, c.batch, c.seq, c.vocab, tokens);
  RandomIds(30 + layer, c.batch, c.seq, c.vocab, targets);
  const std::vector<float> x = RandomVector(40 + layer, act, 1.0);
  const std::vector<float> dout = RandomVector(50 + layer, act, 0.01);
  DeviceBuffer<float> in_d = Up(x), dout_d = Up(dout), out_d = Up(std::vector<float>(act)),
                      din_fused = Up(std::vector<float>(act)),
                      din_split = Up(std::vector<float>(act));
  MicroBatchData data;
  data.tokens = &tokens;
  data.targets = &targets;
  data.loss_normalizer = n;
  Tensor cpu_in;
  if (!embedding)
    cpu_in = Tensor({c.batch, c.seq, width}, TensorStorage<float>(x.begin(), x.end()));
  const Tensor cpu_dout =
      head ? Tensor()
           : Tensor({c.batch, c.seq, width}, TensorStorage<float>(dout.begin(), dout.end()));
  // CPU: forward, then B on one copy and I, W on the other.
  Tensor cpu_out, cpu_din, cpu_din_split;
  SavedContext ctx_fused, ctx_split;
  ASSERT_TRUE(cpu_fused.layers[0]->Forward(cpu_in, data, ctx_fused, cpu_out).ok());
  Tensor unused;
  ASSERT_TRUE(cpu_split.layers[0]->Forward(cpu_in, data, ctx_split, unused).ok());
  ASSERT_TRUE(cpu_fused.layers[0]->Backward(cpu_dout, ctx_fused, cpu_din).ok());
  ASSERT_TRUE(cpu_split.layers[0]->BackwardInput(cpu_dout, ctx_split, cpu_din_split).ok());
  ASSERT_TRUE(cpu_split.layers[0]->BackwardWeight(ctx_split).ok());
  // GPU: the same on two stages.
  const float scale = static_cast<float>(1.0 / static_cast<double>(n));
  for (GpuLlama* g : {fused.get(), split.get()}) {
    const absl::StatusOr<double> sum =
        g->Forward(0, embedding ? tokens.data() : nullptr, head ? targets.data() : nullptr,
                   embedding ? nullptr : in_d.data(), head ? nullptr : out_d.data(), scale, true);
    ASSERT_TRUE(sum.ok()) << sum.status();
    if (head) {
      EXPECT_NEAR(*sum / static_cast<double>(n), cpu_out[0], tol * cpu_out[0]) << "loss";
    } else {
      ExpectClose("output", Down(out_d).data(), cpu_out.data(), act, tol);
    }
  }
  ASSERT_TRUE(
      fused->Backward(0, head ? nullptr : dout_d.data(), embedding ? nullptr : din_fused.data())
          .ok());
  ASSERT_TRUE(
      split
          ->BackwardInput(0, head ? nullptr : dout_d.data(), embedding ? nullptr : din_split.data())
          .ok());
  EXPECT_EQ(split->BackwardInput(0, nullptr, nullptr).code(), absl::StatusCode::kInternal);
  ASSERT_TRUE(split->BackwardWeight(0).ok());
  EXPECT_EQ(split->SavedBytes(0), 0u);
  if (!embedding) {
    ExpectClose("din (B)", Down(din_fused).data(), cpu_din.data(), act, tol);
    ExpectClose("din (I)", Down(din_split).data(), cpu_din_split.data(), act, tol);
  }
  ExpectGradients(*fused, cpu_fused.matching, tol, "B");
  ExpectGradients(*split, cpu_split.matching, tol, "I+W");
}

TEST(GpuLlamaTest, EachLayerMatchesTheCpuLayerInFp32) {
  SKIP_WITHOUT_DEVICE();
  for (bool tied : {false, true}) {
    SCOPED_TRACE(tied ? "tied" : "untied");
    const GpuLlamaConfig c = TinyLlama(GpuPrecision::kFp32, tied);
    for (int layer = 0; layer < c.n_layer + 2; ++layer) CheckOneLayer(c, layer, kLayerTol);
  }
}

TEST(GpuLlamaTest, EachLayerMatchesTheCpuLayerInBf16) {
  SKIP_WITHOUT_DEVICE();
  const GpuLlamaConfig c = TinyLlama(GpuPrecision::kBf16);
  for (int layer = 0; layer < c.n_layer + 2; ++layer) CheckOneLayer(c, layer, kBf16LayerTol);
}

// SmolLM2-135M's shapes: one block (d 576, 9 heads, 3 kv heads, hd 64, H 1536, T 2048).
TEST(GpuLlamaTest, SmolLm2BlockMatchesTheCpuBlock) {
  SKIP_WITHOUT_DEVICE();
  CheckOneLayer(SmolLm2(GpuPrecision::kFp32), 1, kSmolTol);
}

TEST(GpuLlamaTest, WholeModelAndThreeAdamWStepsMatchTheCpuInFp32) {
  SKIP_WITHOUT_DEVICE();
  for (bool tied : {false, true}) {
    SCOPED_TRACE(tied ? "tied" : "untied");
    const GpuLlamaConfig c = TinyLlama(GpuPrecision::kFp32, tied);
    AdamWHyper hyper;
    hyper.beta1 = 0.9f;
    hyper.beta2 = 0.95f;
    hyper.eps = 1e-8f;
    hyper.weight_decay = 0.1f;
    constexpr float kLr = 1e-3f;
    std::unique_ptr<GpuLlama> gpu = MakeGpu(c, hyper);
    ASSERT_NE(gpu, nullptr);
    CpuStage cpu(c, 0, static_cast<int>(c.n_layer) + 2);
    AdamWOptions options;
    options.beta1 = hyper.beta1;
    options.beta2 = hyper.beta2;
    options.eps = hyper.eps;
    options.weight_decay = hyper.weight_decay;
    AdamW cpu_opt(cpu.params, options);
    for (int step = 0; step < 4; ++step) {
      IntTensor tokens, targets;
      RandomIds(100 + step, c.batch, c.seq, c.vocab, tokens);
      RandomIds(200 + step, c.batch, c.seq, c.vocab, targets);
      const absl::StatusOr<float> loss = gpu->ForwardBackward(tokens.data(), targets.data());
      ASSERT_TRUE(loss.ok()) << loss.status();
      // The CPU layers in order.
      MicroBatchData data;
      data.tokens = &tokens;
      data.targets = &targets;
      data.loss_normalizer = c.batch * c.seq;
      std::vector<SavedContext> ctx(cpu.layers.size());
      Tensor xin, xout;
      for (size_t i = 0; i < cpu.layers.size(); ++i) {
        ASSERT_TRUE(cpu.layers[i]->Forward(xin, data, ctx[i], xout).ok());
        xin = std::move(xout);
      }
      const float want = xin[0];
      Tensor gout, gin;
      for (size_t i = cpu.layers.size(); i-- > 0;) {
        ASSERT_TRUE(cpu.layers[i]->Backward(gout, ctx[i], gin).ok());
        gout = std::move(gin);
      }
      EXPECT_NEAR(*loss, want, (step == 0 ? kLossTol : kStepTol) * want) << "step " << step;
      if (step == 3) break;  // the loss after three updates
      cpu.TieGradients();
      if (step == 0) ExpectGradients(*gpu, cpu.matching, kLayerTol, "whole model");
      const double cpu_norm = cpu.GradNorm();
      cpu_opt.Step(kLr);
      const absl::StatusOr<float> norm = gpu->Step(kLr);
      ASSERT_TRUE(norm.ok()) << norm.status();
      EXPECT_NEAR(*norm, cpu_norm, kStepTol * cpu_norm) << "step " << step;
    }
    EXPECT_EQ(gpu->steps(), 3);
  }
}

TEST(GpuLlamaTest, Bf16TrainingTracksTheCpuFp32) {
  SKIP_WITHOUT_DEVICE();
  GpuLlamaConfig c = TinyLlama(GpuPrecision::kBf16);
  c.d_model = 128;
  c.d_hidden = 384;
  c.seq_len = 64;
  c.seq = 64;
  c.batch = 8;
  AdamWHyper hyper;
  hyper.beta1 = 0.9f;
  hyper.beta2 = 0.95f;
  hyper.eps = 1e-8f;
  hyper.weight_decay = 0.1f;
  constexpr float kLr = 1e-3f;
  std::unique_ptr<GpuLlama> gpu = MakeGpu(c, hyper);
  ASSERT_NE(gpu, nullptr);
  CpuStage cpu(c, 0, static_cast<int>(c.n_layer) + 2);
  AdamWOptions options;
  options.beta1 = hyper.beta1;
  options.beta2 = hyper.beta2;
  options.eps = hyper.eps;
  options.weight_decay = hyper.weight_decay;
  AdamW cpu_opt(cpu.params, options);
  for (int step = 0; step < 4; ++step) {
    IntTensor tokens, targets;
    RandomIds(300 + step, c.batch, c.seq, c.vocab, tokens);
    RandomIds(400 + step, c.batch, c.seq, c.vocab, targets);
    const absl::StatusOr<float> loss = gpu->ForwardBackward(tokens.data(), targets.data());
    ASSERT_TRUE(loss.ok()) << loss.status();
    MicroBatchData data;
    data.tokens = &tokens;
    data.targets = &targets;
    data.loss_normalizer = c.batch * c.seq;
    std::vector<SavedContext> ctx(cpu.layers.size());
    Tensor xin, xout;
    for (size_t i = 0; i < cpu.layers.size(); ++i) {
      ASSERT_TRUE(cpu.layers[i]->Forward(xin, data, ctx[i], xout).ok());
      xin = std::move(xout);
    }
    const float want = xin[0];
    Tensor gout, gin;
    for (size_t i = cpu.layers.size(); i-- > 0;) {
      ASSERT_TRUE(cpu.layers[i]->Backward(gout, ctx[i], gin).ok());
      gout = std::move(gin);
    }
    EXPECT_NEAR(*loss, want, kBf16StepLossTol * want) << "step " << step;
    if (step == 3) break;
    cpu.TieGradients();
    const double cpu_norm = cpu.GradNorm();
    cpu_opt.Step(kLr);
    const absl::StatusOr<float> norm = gpu->Step(kLr);
    ASSERT_TRUE(norm.ok()) << norm.status();
    EXPECT_NEAR(*norm, cpu_norm, kBf16NormTol * cpu_norm) << "step " << step;
  }
}

// A pipeline of three stages [0, 2), [2, 3), [3, 4) computes what the whole model computes.
// Selective recomputation rebuilds the probabilities with the forward's own calls on the
// same saved q, k and v: the loss and every gradient are the plain model's bit for bit (the
// token embedding's to its atomics' rounding).
TEST(GpuLlamaTest, SelectiveRecomputationGivesTheSameGradientsBitForBit) {
  SKIP_WITHOUT_DEVICE();
  for (GpuPrecision p : {GpuPrecision::kFp32, GpuPrecision::kBf16}) {
    SCOPED_TRACE(p == GpuPrecision::kFp32 ? "fp32" : "bf16");
    GpuLlamaConfig c = TinyLlama(p, /*tied=*/true);
    std::unique_ptr<GpuLlama> plain = MakeGpu(c);
    c.selective_recompute = true;
    std::unique_ptr<GpuLlama> selective = MakeGpu(c);
    ASSERT_TRUE(plain && selective);
    EXPECT_LT(selective->memory().activations, plain->memory().activations);
    IntTensor tokens, targets;
    RandomIds(800, c.batch, c.seq, c.vocab, tokens);
    RandomIds(801, c.batch, c.seq, c.vocab, targets);
    const absl::StatusOr<float> a = plain->ForwardBackward(tokens.data(), targets.data());
    const absl::StatusOr<float> b = selective->ForwardBackward(tokens.data(), targets.data());
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(*a, *b);
    ExpectSameGradients(*plain, *selective, "embed_tokens");
  }
}

TEST(GpuLlamaTest, StagesComposeToTheWholeModel) {
  SKIP_WITHOUT_DEVICE();
  const GpuLlamaConfig c = TinyLlama(GpuPrecision::kFp32, /*tied=*/true);
  std::unique_ptr<GpuLlama> whole = MakeGpu(c), s0 = MakeGpu(Stage(c, 0, 2)),
                            s1 = MakeGpu(Stage(c, 2, 3)), s2 = MakeGpu(Stage(c, 3, 4));
  ASSERT_TRUE(whole && s0 && s1 && s2);
  IntTensor tokens, targets;
  RandomIds(500, c.batch, c.seq, c.vocab, tokens);
  RandomIds(501, c.batch, c.seq, c.vocab, targets);
  const absl::StatusOr<float> loss = whole->ForwardBackward(tokens.data(), targets.data());
  ASSERT_TRUE(loss.ok()) << loss.status();
  const size_t act = static_cast<size_t>(c.batch * c.seq * c.d_model);
  DeviceBuffer<float> a0 = Up(std::vector<float>(act)), a1 = Up(std::vector<float>(act)),
                      g1 = Up(std::vector<float>(act)), g0 = Up(std::vector<float>(act));
  const float scale = 1.0f / static_cast<float>(c.batch * c.seq);
  ASSERT_TRUE(s0->Forward(0, tokens.data(), nullptr, nullptr, a0.data(), scale, true).ok());
  ASSERT_TRUE(s1->Forward(0, nullptr, nullptr, a0.data(), a1.data(), scale, true).ok());
  const absl::StatusOr<double> sum =
      s2->Forward(0, nullptr, targets.data(), a1.data(), nullptr, scale, true);
  ASSERT_TRUE(sum.ok()) << sum.status();
  EXPECT_NEAR(*sum * scale, *loss, 1e-6 * *loss);
  ASSERT_TRUE(s2->Backward(0, nullptr, g1.data()).ok());
  ASSERT_TRUE(s1->Backward(0, g1.data(), g0.data()).ok());
  ASSERT_TRUE(s0->Backward(0, g0.data(), nullptr).ok());
  // The tied embedding: the sum of the two stages' copies.
  ASSERT_TRUE(s0->layout()[0].tied && s2->layout().back().tied_copy);
  ASSERT_TRUE(s0->AddToGradient(0, s2->DeviceGradient(s2->layout().size() - 1)).ok());
  std::vector<const GpuLlama*> stages = {s0.get(), s1.get(), s2.get()};
  size_t i = 0;
  for (const GpuLlama* s : stages) {
    for (size_t j = 0; j < s->layout().size(); ++j) {
      if (s->layout()[j].tied_copy) continue;
      ASSERT_LT(i, whole->layout().size());
      ASSERT_EQ(s->layout()[j].name, whole->layout()[i].name);
      std::vector<float> got(s->layout()[j].count), want(got.size());
      ASSERT_TRUE(s->GetGradient(j, got.data(), got.size()).ok());
      ASSERT_TRUE(whole->GetGradient(i, want.data(), want.size()).ok());
      ExpectClose("stages " + s->layout()[j].name, got.data(), want.data(), got.size(), 1e-5);
      ++i;
    }
  }
  EXPECT_EQ(i, whole->layout().size());
}

}  // namespace
}  // namespace tandem::worker::cuda
