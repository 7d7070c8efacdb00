// GpuGpt (worker/backend/cuda/gpu_gpt.h) against the CPU gpt layers (worker/model/gpt.h) run
// directly through the Layer interface, on a tiny GPT (2 layers, d 64, 4 heads, T 16, V 128).
//
// Tolerances:
//  - fp32 mode, one micro-batch: |loss_gpu - loss_cpu| <= 1e-5 |loss_cpu|; every gradient
//    element within kGradTol = 1e-4 x max |grad| of its tensor (plus 1e-7 absolute, for
//    tensors whose gradient is ~0). cuBLAS and OpenBLAS sum in different orders, and the
//    device's tanhf / expf differ from the CPU's by a few ulps.
//  - fp32 mode, 3 AdamW steps: every step's loss and global gradient norm within 1e-4
//    relative of the CPU's (AdamW's update is ~lr sign(g) at first, so a gradient element that
//    is ~0 on both may move the weights differently by up to lr; with lr 1e-3 the losses still
//    agree far inside that).
//  - bf16 mode (bf16 GEMM operands, fp32 accumulation) against fp32 mode from the same weights:
//    loss within 2e-2 relative; global gradient norm within 5e-2 relative.
// Validation, layout, initialisation and memory-planning tests are host-only and always run;
// the others skip with "no CUDA device: <status>" when CudaAvailable() fails.
#include "worker/backend/cuda/gpu_gpt.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "worker/backend/cuda/cuda_status.h"
#include "worker/backend/cuda/device_buffer.h"
#include "worker/model/gpt.h"
#include "worker/model/optimizer.h"
#include "worker/model/random.h"

namespace tandem::worker::cuda {
namespace {

constexpr double kGradTol = 1e-4;
constexpr double kGradAbsTol = 1e-7;
constexpr double kLossTol = 1e-5;
constexpr double kStepTol = 1e-4;
constexpr double kBf16LossTol = 2e-2;
constexpr double kBf16NormTol = 5e-2;

#define SKIP_WITHOUT_DEVICE()                        \
  do {                                               \
    if (absl::Status s = CudaAvailable(); !s.ok()) { \
      GTEST_SKIP() << "no CUDA device: " << s;       \
    }                                                \
  } while (false)

GpuGptConfig TinyConfig(GpuPrecision precision, bool tied = true) {
  GpuGptConfig c;
  c.n_layer = 2;
  c.n_head = 4;
  c.d_model = 64;
  c.seq_len = 16;
  c.vocab = 128;
  c.tie_embeddings = tied;
  c.batch = 4;
  c.seq = 16;
  c.precision = precision;
  c.seed = 7;
  return c;
}

GptConfig CpuConfig(const GpuGptConfig& c) {
  GptConfig g;
  g.n_layer = c.n_layer;
  g.n_head = c.n_head;
  g.d_model = c.d_model;
  g.d_hidden = c.d_hidden == 0 ? 4 * c.d_model : c.d_hidden;
  g.seq_len = c.seq_len;
  g.vocab = c.vocab;
  g.tie_embeddings = c.tie_embeddings;
  return g;
}

// The CPU model: its layers and their parameters in order.
struct CpuGpt {
  std::vector<std::unique_ptr<Layer>> layers;
  std::vector<Parameter*> params;  // every layer's, the head's tied wte copy included
  // params[i] for the GPU layout's tensor i (the tied head copy has no GPU tensor).
  std::vector<Parameter*> matching;
  Parameter* head_wte = nullptr;  // the head's tied copy, or null

  explicit CpuGpt(const GpuGptConfig& c) {
    const GptConfig g = CpuConfig(c);
    layers.push_back(std::make_unique<GptEmbedding>(g, c.seed));
    for (int i = 0; i < g.n_layer; ++i) layers.push_back(std::make_unique<GptBlock>(g, i, c.seed));
    layers.push_back(std::make_unique<GptHead>(g, c.seed));
    for (auto& l : layers) {
      for (Parameter* p : l->Parameters()) {
        params.push_back(p);
        if (l->is_loss() && p->tied) {
          head_wte = p;
        } else {
          matching.push_back(p);
        }
      }
    }
  }

  // Forward + backward of one micro-batch; returns the loss (sum / normalizer).
  float ForwardBackward(const IntTensor& tokens, const IntTensor& targets, int64_t normalizer) {
    MicroBatchData data;
    data.tokens = &tokens;
    data.targets = &targets;
    data.loss_normalizer = normalizer;
    std::vector<SavedContext> ctx(layers.size());
    Tensor x, y;
    for (size_t i = 0; i < layers.size(); ++i) {
      EXPECT_TRUE(layers[i]->Forward(x, data, ctx[i], y).ok());
      x = std::move(y);
    }
    const float loss = x[0];
    Tensor g, gin;
    for (size_t i = layers.size(); i-- > 0;) {
      EXPECT_TRUE(layers[i]->Backward(g, ctx[i], gin).ok());
      g = std::move(gin);
    }
    return loss;
  }

  // The executor's tie rule: both copies get the summed gradient.
  void TieGradients() {
    if (head_wte == nullptr) return;
    Parameter* wte = matching[0];
    for (size_t j = 0; j < wte->grad.size(); ++j) {
      const float s = wte->grad[j] + head_wte->grad[j];
      wte->grad[j] = s;
      head_wte->grad[j] = s;
    }
  }

  // After TieGradients: the global norm, the tied wte once.
  double GradNorm() const {
    double s = 0.0;
    for (const Parameter* p : matching) {
      for (size_t j = 0; j < p->grad.size(); ++j) s += double{p->grad[j]} * p->grad[j];
    }
    return std::sqrt(s);
  }
};

void RandomBatch(uint64_t seed, const GpuGptConfig& c, IntTensor& tokens, IntTensor& targets) {
  Rng rng(seed);
  tokens.Reset({c.batch, c.seq});
  targets.Reset({c.batch, c.seq});
  for (size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] = static_cast<int32_t>(rng.Below(static_cast<uint64_t>(c.vocab)));
    targets[i] = static_cast<int32_t>(rng.Below(static_cast<uint64_t>(c.vocab)));
  }
}

// ---- Host-only: validation, layout, initialisation, memory plan.

TEST(GpuGptConfigTest, RejectsBadConfigsNamingTheField) {
  struct Case {
    const char* field;
    void (*mutate)(GpuGptConfig&);
  };
  const Case cases[] = {
      {"n_layer", [](GpuGptConfig& c) { c.n_layer = -1; }},
      {"n_head", [](GpuGptConfig& c) { c.n_head = 0; }},
      {"d_model", [](GpuGptConfig& c) { c.d_model = 0; }},
      {"multiple of n_head", [](GpuGptConfig& c) { c.d_model = 66; }},
      {"d_hidden", [](GpuGptConfig& c) { c.d_hidden = -4; }},
      {"vocab", [](GpuGptConfig& c) { c.vocab = 0; }},
      {"seq_len", [](GpuGptConfig& c) { c.seq_len = 0; }},
      {"seq must", [](GpuGptConfig& c) { c.seq = 17; }},
      {"seq must", [](GpuGptConfig& c) { c.seq = 0; }},
      {"batch", [](GpuGptConfig& c) { c.batch = 0; }},
      {"wte",
       [](GpuGptConfig& c) {
         c.vocab = 1 << 20;
         c.d_model = 4096;
       }},
  };
  for (const Case& k : cases) {
    GpuGptConfig c = TinyConfig(GpuPrecision::kFp32);
    k.mutate(c);
    const absl::StatusOr<GpuGptConfig> v = ValidateGpuGptConfig(c);
    ASSERT_FALSE(v.ok()) << k.field;
    EXPECT_EQ(v.status().code(), absl::StatusCode::kInvalidArgument) << v.status();
    EXPECT_NE(v.status().message().find(k.field), std::string::npos) << v.status();
    EXPECT_EQ(PlanGpuGptMemory(c).status().code(), absl::StatusCode::kInvalidArgument);
  }
}

TEST(GpuGptConfigTest, ResolvesHiddenWidth) {
  const absl::StatusOr<GpuGptConfig> v = ValidateGpuGptConfig(TinyConfig(GpuPrecision::kBf16));
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->d_hidden, 256);
}

TEST(GpuGptLayoutTest, MatchesTheCpuLayersTiedAndUntied) {
  for (bool tied : {true, false}) {
    for (GpuPrecision p : {GpuPrecision::kFp32, GpuPrecision::kBf16}) {
      const GpuGptConfig c = *ValidateGpuGptConfig(TinyConfig(p, tied));
      const std::vector<GpuGptTensor> layout = GpuGptParameterLayout(c);
      CpuGpt cpu(c);
      EXPECT_EQ(cpu.head_wte != nullptr, tied);
      ASSERT_EQ(layout.size(), cpu.matching.size());
      size_t offset = 0;
      for (size_t i = 0; i < layout.size(); ++i) {
        const Parameter& q = *cpu.matching[i];
        EXPECT_EQ(layout[i].name, q.name);
        EXPECT_EQ(layout[i].shape, q.value.shape()) << q.name;
        EXPECT_EQ(layout[i].count, q.value.size()) << q.name;
        EXPECT_EQ(layout[i].decay, q.decay) << q.name;
        EXPECT_EQ(layout[i].offset, offset) << q.name;
        offset += layout[i].count;
        // GEMM weights: the blocks' four linears and the LM head's weight.
        const bool gemm = layout[i].name.find("c_attn.weight") != std::string::npos ||
                          layout[i].name.find("c_proj.weight") != std::string::npos ||
                          layout[i].name.find("c_fc.weight") != std::string::npos ||
                          layout[i].name == "lm_head.weight" ||
                          (tied && layout[i].name == "transformer.wte.weight");
        EXPECT_EQ(layout[i].compute_copy, p == GpuPrecision::kBf16 && gemm) << q.name;
      }
    }
  }
}

TEST(GpuGptLayoutTest, InitIsBitIdenticalToTheCpuLayers) {
  for (bool tied : {true, false}) {
    const GpuGptConfig c = *ValidateGpuGptConfig(TinyConfig(GpuPrecision::kBf16, tied));
    const std::vector<GpuGptTensor> layout = GpuGptParameterLayout(c);
    const std::vector<float> init = InitGpuGptParameters(c, layout);
    CpuGpt cpu(c);
    for (size_t i = 0; i < layout.size(); ++i) {
      const Tensor& q = cpu.matching[i]->value;
      ASSERT_EQ(q.size(), layout[i].count);
      EXPECT_TRUE(std::equal(q.vec().begin(), q.vec().end(), init.begin() + layout[i].offset))
          << layout[i].name;
    }
  }
}

// A pipeline split into stages holds each of the model's tensors exactly once (the tied head's
// wte copy aside), with the whole model's initial values, so that stages on GPUs start where
// the CPU stages and the single-GPU model start.
TEST(GpuGptLayoutTest, StagesSplitTheModelsTensorsWithItsInitialValues) {
  for (bool tied : {true, false}) {
    const GpuGptConfig whole = *ValidateGpuGptConfig(TinyConfig(GpuPrecision::kBf16, tied));
    const std::vector<GpuGptTensor> all = GpuGptParameterLayout(whole);
    const std::vector<float> all_init = InitGpuGptParameters(whole, all);
    std::map<std::string, size_t> by_name;
    for (size_t i = 0; i < all.size(); ++i) by_name[all[i].name] = i;
    // L = 2: layers 0 (embedding), 1, 2 (blocks), 3 (head).
    for (const std::vector<int64_t>& cuts :
         {std::vector<int64_t>{0, 1, 3, 4}, {0, 2, 4}, {0, 3, 4}, {0, 1, 2, 3, 4}}) {
      std::map<std::string, int> seen;
      for (size_t k = 0; k + 1 < cuts.size(); ++k) {
        GpuGptConfig stage = whole;
        stage.layer_begin = cuts[k];
        stage.layer_end = cuts[k + 1];
        const absl::StatusOr<GpuGptConfig> cfg = ValidateGpuGptConfig(stage);
        ASSERT_TRUE(cfg.ok()) << cfg.status();
        const std::vector<GpuGptTensor> layout = GpuGptParameterLayout(*cfg);
        const std::vector<float> init = InitGpuGptParameters(*cfg, layout);
        const bool head = cuts[k + 1] == 4, embedding = cuts[k] == 0;
        for (const GpuGptTensor& t : layout) {
          ASSERT_TRUE(by_name.contains(t.name)) << t.name;
          const GpuGptTensor& w = all[by_name[t.name]];
          EXPECT_EQ(t.shape, w.shape) << t.name;
          EXPECT_TRUE(std::equal(init.begin() + t.offset, init.begin() + t.offset + t.count,
                                 all_init.begin() + w.offset))
              << t.name << " in stage [" << cuts[k] << ", " << cuts[k + 1] << ")";
          const bool wte = t.name == "transformer.wte.weight";
          EXPECT_EQ(t.tied, tied && wte) << t.name;
          EXPECT_EQ(t.tied_copy, tied && wte && head && !embedding) << t.name;
          if (!t.tied_copy) ++seen[t.name];
        }
      }
      EXPECT_EQ(seen.size(), all.size());
      for (const auto& [name, count] : seen) EXPECT_EQ(count, 1) << name;
    }
  }
}

TEST(GpuGptConfigTest, RejectsALayerRangeOutsideTheModel) {
  for (auto [begin, end] : {std::pair<int64_t, int64_t>{-1, 2}, {2, 2}, {3, 1}, {0, 5}}) {
    GpuGptConfig c = TinyConfig(GpuPrecision::kFp32);
    c.layer_begin = begin;
    c.layer_end = end;
    const absl::StatusOr<GpuGptConfig> v = ValidateGpuGptConfig(c);
    ASSERT_FALSE(v.ok()) << begin << ".." << end;
    EXPECT_NE(std::string(v.status().message()).find("layers ["), std::string::npos) << v.status();
  }
}

TEST(GpuGptMemoryTest, PlanArithmetic) {
  // B 4, T 16 (N 64), C 64, H 256, NH 4, V 128, L 2: every buffer is a multiple of 256 bytes
  // except the two doubles of the workspace, which are padded to 256.
  const size_t n = 64, c = 64, h = 256, v = 128, l = 2, nh = 4, t = 16, att = 4 * nh * t * t;
  const size_t params =
      v * c + t * c + l * (4 * c + 3 * c * c + 3 * c + c * c + c + h * c + h + c * h + c) + 2 * c;
  for (GpuPrecision p : {GpuPrecision::kFp32, GpuPrecision::kBf16}) {
    const bool b16 = p == GpuPrecision::kBf16;
    const size_t in = b16 ? 2 : 4;  // bytes of a saved GEMM input element
    const absl::StatusOr<GpuGptMemory> m = PlanGpuGptMemory(TinyConfig(p));
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_EQ(m->parameters, params * 4);
    EXPECT_EQ(m->gradients, params * 4);
    EXPECT_EQ(m->optimizer_state, params * 8);
    EXPECT_EQ(m->compute_weights,
              b16 ? 2 * (v * c + l * (3 * c * c + c * c + h * c + c * h)) : size_t{0});
    const size_t per_block = n * c * in + 2 * n * 4 + n * 3 * c * 4 + att * 4 + n * c * in +
                             n * c * 4 + n * c * in + 2 * n * 4 + n * h * 4 + n * h * in;
    // A slot: the residual stream, the blocks', the tokens and the head's input gradient.
    EXPECT_EQ(m->activations, (l + 1) * n * c * 4 + l * per_block + n * 4 + n * c * 4);
    const size_t scratch = b16 ? n * std::max(c, h) * 4 + n * std::max({v, h, 3 * c}) * 2 : 0;
    // Shared: targets, ln_f and its statistics, the logits and losses (the head's), the two
    // doubles, the backward's scratch.
    EXPECT_EQ(m->workspace, n * 4 + n * c * in + 2 * n * 4 + n * v * 4 + n * 4 + 2 * 256 + scratch +
                                2 * n * c * 4 + n * std::max(h, 3 * c) * 4 + n * h * 4 + n * c * 4 +
                                nh * t * t * 4);
    EXPECT_EQ(m->total(), m->parameters + m->compute_weights + m->gradients + m->optimizer_state +
                              m->activations + m->workspace);
    // The split backward's output gradients per block (c_proj, c_fc, ln_2, attn.c_proj, c_attn,
    // ln_1) and the embedding's, fp32 in both modes; not part of total().
    EXPECT_EQ(m->weight_grad_inputs,
              l * (n * c + n * h + n * c + n * c + n * 3 * c + n * c) * 4 + n * c * 4);
  }
}

TEST(GpuGptMemoryTest, Gpt2PresetCounts124MParameters) {
  GpuGptConfig c;
  c.n_layer = 12;
  c.n_head = 12;
  c.d_model = 768;
  c.seq_len = 1024;
  c.vocab = 50304;
  c.batch = 8;
  c.seq = 1024;
  const absl::StatusOr<GpuGptMemory> m = PlanGpuGptMemory(c);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->parameters, size_t{124475904} * 4);
}

TEST(GpuGptTest, CreateWithoutADeviceFails) {
  if (CudaAvailable().ok()) GTEST_SKIP() << "a CUDA device is present; nothing fails here";
  const absl::StatusOr<std::unique_ptr<GpuGpt>> g =
      GpuGpt::Create(TinyConfig(GpuPrecision::kFp32), AdamWHyper{});
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), absl::StatusCode::kFailedPrecondition) << g.status();
}

// ---- On a device.

std::unique_ptr<GpuGpt> MakeGpu(const GpuGptConfig& c, const AdamWHyper& hyper = AdamWHyper{}) {
  absl::StatusOr<std::unique_ptr<GpuGpt>> g = GpuGpt::Create(c, hyper);
  EXPECT_TRUE(g.ok()) << g.status();
  return g.ok() ? std::move(*g) : nullptr;
}

void ExpectGradientsMatch(GpuGpt& gpu, CpuGpt& cpu) {
  const std::vector<GpuGptTensor>& layout = gpu.layout();
  for (size_t i = 0; i < layout.size(); ++i) {
    std::vector<float> got(layout[i].count);
    ASSERT_TRUE(gpu.GetGradient(i, got.data(), got.size()).ok());
    const Tensor& want = cpu.matching[i]->grad;
    double max_ref = 0.0, max_err = 0.0;
    for (size_t j = 0; j < got.size(); ++j) {
      max_ref = std::max(max_ref, std::fabs(double{want[j]}));
      max_err = std::max(max_err, std::fabs(double{got[j]} - want[j]));
    }
    EXPECT_LE(max_err, kGradTol * max_ref + kGradAbsTol)
        << layout[i].name << ": max |grad| " << max_ref;
  }
}

TEST(GpuGptTest, Fp32LossAndGradientsMatchTheCpuLayers) {
  SKIP_WITHOUT_DEVICE();
  for (bool tied : {true, false}) {
    const GpuGptConfig c = TinyConfig(GpuPrecision::kFp32, tied);
    std::unique_ptr<GpuGpt> gpu = MakeGpu(c);
    ASSERT_NE(gpu, nullptr);
    CpuGpt cpu(c);
    IntTensor tokens, targets;
    RandomBatch(11, c, tokens, targets);
    const absl::StatusOr<float> loss = gpu->ForwardBackward(tokens.data(), targets.data());
    ASSERT_TRUE(loss.ok()) << loss.status();
    const float want = cpu.ForwardBackward(tokens, targets, c.batch * c.seq);
    EXPECT_NEAR(*loss, want, kLossTol * want) << "tied " << tied;
    cpu.TieGradients();
    ExpectGradientsMatch(*gpu, cpu);
    const absl::StatusOr<float> norm = gpu->GradNorm();
    ASSERT_TRUE(norm.ok()) << norm.status();
    EXPECT_NEAR(*norm, cpu.GradNorm(), kStepTol * cpu.GradNorm());
    EXPECT_GT(gpu->last_times().forward_ms, 0.0f);
    EXPECT_GT(gpu->last_times().backward_ms, 0.0f);
  }
}

TEST(GpuGptTest, Fp32ThreeAdamWStepsMatchTheCpu) {
  SKIP_WITHOUT_DEVICE();
  const GpuGptConfig c = TinyConfig(GpuPrecision::kFp32);
  AdamWHyper hyper;
  hyper.beta1 = 0.9f;
  hyper.beta2 = 0.95f;
  hyper.eps = 1e-8f;
  hyper.weight_decay = 0.1f;
  constexpr float kLr = 1e-3f;
  std::unique_ptr<GpuGpt> gpu = MakeGpu(c, hyper);
  ASSERT_NE(gpu, nullptr);
  CpuGpt cpu(c);
  AdamWOptions options;
  options.beta1 = hyper.beta1;
  options.beta2 = hyper.beta2;
  options.eps = hyper.eps;
  options.weight_decay = hyper.weight_decay;
  AdamW cpu_opt(cpu.params, options);
  for (int step = 0; step < 4; ++step) {
    IntTensor tokens, targets;
    RandomBatch(100 + step, c, tokens, targets);
    const absl::StatusOr<float> loss = gpu->ForwardBackward(tokens.data(), targets.data());
    ASSERT_TRUE(loss.ok()) << loss.status();
    const float want = cpu.ForwardBackward(tokens, targets, c.batch * c.seq);
    EXPECT_NEAR(*loss, want, kStepTol * want) << "step " << step;
    if (step == 3) break;  // the loss after three updates
    cpu.TieGradients();
    const double cpu_norm = cpu.GradNorm();
    cpu_opt.Step(kLr);
    const absl::StatusOr<float> norm = gpu->Step(kLr);
    ASSERT_TRUE(norm.ok()) << norm.status();
    EXPECT_NEAR(*norm, cpu_norm, kStepTol * cpu_norm) << "step " << step;
    EXPECT_GT(gpu->last_times().optimizer_ms, 0.0f);
  }
  EXPECT_EQ(gpu->steps(), 3);
}

TEST(GpuGptTest, Bf16StaysCloseToFp32) {
  SKIP_WITHOUT_DEVICE();
  std::unique_ptr<GpuGpt> f32 = MakeGpu(TinyConfig(GpuPrecision::kFp32));
  std::unique_ptr<GpuGpt> b16 = MakeGpu(TinyConfig(GpuPrecision::kBf16));
  ASSERT_NE(f32, nullptr);
  ASSERT_NE(b16, nullptr);
  const GpuGptConfig c = f32->config();
  for (int step = 0; step < 3; ++step) {
    IntTensor tokens, targets;
    RandomBatch(200 + step, c, tokens, targets);
    const absl::StatusOr<float> l32 = f32->ForwardBackward(tokens.data(), targets.data());
    const absl::StatusOr<float> l16 = b16->ForwardBackward(tokens.data(), targets.data());
    ASSERT_TRUE(l32.ok()) << l32.status();
    ASSERT_TRUE(l16.ok()) << l16.status();
    EXPECT_NEAR(*l16, *l32, kBf16LossTol * *l32) << "step " << step;
    const absl::StatusOr<float> n32 = f32->Step(1e-3f);
    const absl::StatusOr<float> n16 = b16->Step(1e-3f);
    ASSERT_TRUE(n32.ok()) << n32.status();
    ASSERT_TRUE(n16.ok()) << n16.status();
    EXPECT_NEAR(*n16, *n32, kBf16NormTol * *n32) << "step " << step;
  }
}

TEST(GpuGptTest, AccumulationSumsToTheMeanOverMicroBatches) {
  SKIP_WITHOUT_DEVICE();
  const GpuGptConfig c = TinyConfig(GpuPrecision::kFp32);
  std::unique_ptr<GpuGpt> gpu = MakeGpu(c);
  ASSERT_NE(gpu, nullptr);
  IntTensor tokens, targets;
  RandomBatch(300, c, tokens, targets);
  ASSERT_TRUE(gpu->ForwardBackward(tokens.data(), targets.data(), 1).ok());
  const absl::StatusOr<float> once = gpu->GradNorm();
  ASSERT_TRUE(gpu->ZeroGradients().ok());
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(gpu->ForwardBackward(tokens.data(), targets.data(), 2).ok());
  }
  const absl::StatusOr<float> twice = gpu->GradNorm();
  ASSERT_TRUE(once.ok() && twice.ok());
  EXPECT_NEAR(*twice, *once, 1e-6 * *once);
}

TEST(GpuGptTest, RejectsOutOfRangeIdsAndBadIndices) {
  SKIP_WITHOUT_DEVICE();
  const GpuGptConfig c = TinyConfig(GpuPrecision::kBf16);
  std::unique_ptr<GpuGpt> gpu = MakeGpu(c);
  ASSERT_NE(gpu, nullptr);
  IntTensor tokens, targets;
  RandomBatch(400, c, tokens, targets);
  tokens[5] = static_cast<int32_t>(c.vocab);
  EXPECT_EQ(gpu->ForwardBackward(tokens.data(), targets.data()).status().code(),
            absl::StatusCode::kInvalidArgument);
  tokens[5] = 0;
  targets[3] = -1;
  EXPECT_EQ(gpu->ForwardBackward(tokens.data(), targets.data()).status().code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<float> buf(3);
  EXPECT_EQ(gpu->GetParameter(0, buf.data(), buf.size()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(gpu->GetParameter(gpu->layout().size(), buf.data(), buf.size()).code(),
            absl::StatusCode::kInvalidArgument);
  const absl::StatusOr<GpuGptMemory> plan = PlanGpuGptMemory(c);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(gpu->memory().total(), plan->total());
}

TEST(GpuGptTest, SetParameterRoundTrips) {
  SKIP_WITHOUT_DEVICE();
  std::unique_ptr<GpuGpt> gpu = MakeGpu(TinyConfig(GpuPrecision::kBf16));
  ASSERT_NE(gpu, nullptr);
  const GpuGptTensor& t = gpu->layout()[2];
  std::vector<float> in(t.count), out(t.count);
  for (size_t j = 0; j < in.size(); ++j) in[j] = 0.001f * static_cast<float>(j % 97);
  ASSERT_TRUE(gpu->SetParameter(2, in.data(), in.size()).ok());
  ASSERT_TRUE(gpu->GetParameter(2, out.data(), out.size()).ok());
  EXPECT_EQ(in, out);
}

// The model split into three stages [0, 2), [2, 3), [3, 4), run as a pipeline of Forward and
// Backward calls with the activations handed over in device memory, computes what the whole
// model computes: the same loss, and every tensor's gradient (the tied wte's as the sum of its
// two copies). Two micro-batches are in flight at once (both forwards before either backward,
// as GPipe runs them), each in its own slot.
std::vector<float> ToHostVector(const DeviceBuffer<float>& b) {
  std::vector<float> h(b.size());
  EXPECT_TRUE(b.CopyToHost(h.data(), h.size()).ok());
  return h;
}

// I then W adds the gradients B adds (the same kernels on the same operands, in each
// precision), I's input gradient is B's, the memory between them is accounted, and misuse is
// INTERNAL.
TEST(GpuGptTest, SplitBackwardAddsWhatBackwardAdds) {
  SKIP_WITHOUT_DEVICE();
  for (GpuPrecision p : {GpuPrecision::kFp32, GpuPrecision::kBf16}) {
    SCOPED_TRACE(p == GpuPrecision::kBf16 ? "bf16" : "fp32");
    GpuGptConfig c = TinyConfig(p);
    c.layer_begin = 0;
    c.layer_end = 3;  // embedding and both blocks: tokens in, activation out, weights in W
    std::unique_ptr<GpuGpt> fused = MakeGpu(c), split = MakeGpu(c);
    ASSERT_TRUE(fused && split);
    GpuGptConfig mid = TinyConfig(p);
    mid.layer_begin = 1;
    mid.layer_end = 3;  // blocks only: an input gradient out
    std::unique_ptr<GpuGpt> mid_fused = MakeGpu(mid), mid_split = MakeGpu(mid);
    ASSERT_TRUE(mid_fused && mid_split);
    const size_t act = static_cast<size_t>(c.batch * c.seq * c.d_model);
    auto out = *DeviceBuffer<float>::Create(act), mid_out = *DeviceBuffer<float>::Create(act);
    std::vector<float> host(act);
    Rng rng(7);
    for (float& x : host) x = static_cast<float>(rng.Normal() * 0.1);
    auto dout = *DeviceBuffer<float>::FromHost(host.data(), act);
    auto din_fused = *DeviceBuffer<float>::Create(act),
         din_split = *DeviceBuffer<float>::Create(act);
    IntTensor tokens, targets;
    for (int mb = 0; mb < 2; ++mb) {
      RandomBatch(60 + mb, c, tokens, targets);
      for (GpuGpt* g : {fused.get(), split.get()}) {
        ASSERT_TRUE(g->Forward(mb, tokens.data(), nullptr, nullptr, out.data(), 1.0f, true).ok());
      }
      for (GpuGpt* g : {mid_fused.get(), mid_split.get()}) {
        ASSERT_TRUE(g->Forward(mb, nullptr, nullptr, out.data(), mid_out.data(), 1.0f, true).ok());
      }
    }
    const size_t slot = split->SavedBytes(0);
    const absl::StatusOr<GpuGptMemory> plan = PlanGpuGptMemory(c);
    ASSERT_TRUE(plan.ok());
    EXPECT_EQ(split->BackwardWeight(0).code(), absl::StatusCode::kInternal);  // W before I
    for (int mb = 1; mb >= 0; --mb) {
      ASSERT_TRUE(fused->Backward(mb, dout.data(), nullptr).ok());
      ASSERT_TRUE(split->BackwardInput(mb, dout.data(), nullptr).ok());
      EXPECT_EQ(split->SavedBytes(mb), slot + plan->weight_grad_inputs);
      EXPECT_EQ(split->BackwardInput(mb, dout.data(), nullptr).code(),
                absl::StatusCode::kInternal);  // I twice
      EXPECT_EQ(split->Backward(mb, dout.data(), nullptr).code(),
                absl::StatusCode::kInternal);  // B after I
      ASSERT_TRUE(mid_fused->Backward(mb, dout.data(), din_fused.data()).ok());
      ASSERT_TRUE(mid_split->BackwardInput(mb, dout.data(), din_split.data()).ok());
      EXPECT_EQ(ToHostVector(din_split), ToHostVector(din_fused)) << "mb " << mb;
    }
    // W in another order than I's, as ZB-V may run them.
    for (int mb : {0, 1}) {
      ASSERT_TRUE(split->BackwardWeight(mb).ok());
      ASSERT_TRUE(mid_split->BackwardWeight(mb).ok());
      EXPECT_EQ(split->SavedBytes(mb), 0u);
    }
    for (auto [a, b] : {std::pair{fused.get(), split.get()}, {mid_fused.get(), mid_split.get()}}) {
      for (size_t i = 0; i < a->layout().size(); ++i) {
        std::vector<float> ga(a->layout()[i].count), gb(ga.size());
        ASSERT_TRUE(a->GetGradient(i, ga.data(), ga.size()).ok());
        ASSERT_TRUE(b->GetGradient(i, gb.data(), gb.size()).ok());
        double max_ref = 0.0, max_err = 0.0;
        for (size_t j = 0; j < ga.size(); ++j) {
          max_ref = std::max(max_ref, std::fabs(double{ga[j]}));
          max_err = std::max(max_err, std::fabs(double{gb[j]} - ga[j]));
        }
        // The two sums per parameter run in another order (W of mb 0 first), so allow fp32
        // rounding of a two-term sum.
        EXPECT_LE(max_err, 1e-6 * max_ref + 1e-9) << a->layout()[i].name;
      }
    }
  }
}

TEST(GpuGptTest, Fp32StagesComputeWhatTheWholeModelComputes) {
  SKIP_WITHOUT_DEVICE();
  for (bool tied : {true, false}) {
    const GpuGptConfig c = TinyConfig(GpuPrecision::kFp32, tied);
    std::unique_ptr<GpuGpt> whole = MakeGpu(c);
    ASSERT_NE(whole, nullptr);
    std::vector<std::unique_ptr<GpuGpt>> stages;
    for (auto [begin, end] : {std::pair<int64_t, int64_t>{0, 2}, {2, 3}, {3, 4}}) {
      GpuGptConfig s = c;
      s.layer_begin = begin;
      s.layer_end = end;
      stages.push_back(MakeGpu(s));
      ASSERT_NE(stages.back(), nullptr);
    }
    const size_t act = static_cast<size_t>(c.batch * c.seq * c.d_model);
    std::vector<DeviceBuffer<float>> bufs;
    for (int i = 0; i < 4; ++i) bufs.push_back(*DeviceBuffer<float>::Create(act));
    const int64_t rows = c.batch * c.seq;
    const float scale = 1.0f / static_cast<float>(2 * rows);
    IntTensor tokens[2], targets[2];
    double want = 0.0, got = 0.0;
    for (int mb = 0; mb < 2; ++mb) {
      RandomBatch(40 + mb, c, tokens[mb], targets[mb]);
      absl::StatusOr<float> loss = whole->ForwardBackward(tokens[mb].data(), targets[mb].data(), 2);
      ASSERT_TRUE(loss.ok()) << loss.status();
      want += *loss / 2.0;
    }
    for (int mb = 0; mb < 2; ++mb) {
      // bufs[0], bufs[1]: stage outputs; the micro-batches take turns using them.
      float* out0 = bufs[2 * mb].data();
      float* out1 = bufs[2 * mb + 1].data();
      ASSERT_TRUE(
          stages[0]->Forward(mb, tokens[mb].data(), nullptr, nullptr, out0, scale, true).ok());
      ASSERT_TRUE(stages[1]->Forward(mb, nullptr, nullptr, out0, out1, scale, true).ok());
      absl::StatusOr<double> sum =
          stages[2]->Forward(mb, nullptr, targets[mb].data(), out1, nullptr, scale, true);
      ASSERT_TRUE(sum.ok()) << sum.status();
      got += *sum * scale;
      EXPECT_GT(stages[1]->SavedBytes(mb), 0u);
    }
    EXPECT_EQ(stages[1]->activation_slots(), 2u);
    for (int mb = 1; mb >= 0; --mb) {
      float* g1 = bufs[2 * mb].data();  // d (stage 1's output), then reused
      float* g0 = bufs[2 * mb + 1].data();
      ASSERT_TRUE(stages[2]->Backward(mb, nullptr, g1).ok());
      ASSERT_TRUE(stages[1]->Backward(mb, g1, g0).ok());
      ASSERT_TRUE(stages[0]->Backward(mb, g0, nullptr).ok());
      EXPECT_EQ(stages[1]->SavedBytes(mb), 0u);
    }
    EXPECT_NEAR(got, want, kLossTol * want) << "tied " << tied;
    std::map<std::string, std::vector<float>> grads;
    for (const auto& st : stages) {
      for (size_t i = 0; i < st->layout().size(); ++i) {
        std::vector<float> g(st->layout()[i].count);
        ASSERT_TRUE(st->GetGradient(i, g.data(), g.size()).ok());
        std::vector<float>& sum = grads[st->layout()[i].name];
        if (sum.empty()) sum.assign(g.size(), 0.0f);
        for (size_t j = 0; j < g.size(); ++j) sum[j] += g[j];
      }
    }
    for (size_t i = 0; i < whole->layout().size(); ++i) {
      const GpuGptTensor& t = whole->layout()[i];
      std::vector<float> w(t.count);
      ASSERT_TRUE(whole->GetGradient(i, w.data(), w.size()).ok());
      ASSERT_TRUE(grads.contains(t.name)) << t.name;
      double max_ref = 0.0, max_err = 0.0;
      for (size_t j = 0; j < w.size(); ++j) {
        max_ref = std::max(max_ref, std::fabs(double{w[j]}));
        max_err = std::max(max_err, std::fabs(double{grads[t.name][j]} - w[j]));
      }
      EXPECT_LE(max_err, kGradTol * max_ref + kGradAbsTol) << t.name << " tied " << tied;
    }
    // Misuse: a second forward of a micro-batch in flight, a backward without a forward.
    ASSERT_TRUE(stages[0]
                    ->Forward(5, tokens[0].data(), nullptr, nullptr, bufs[0].data(), scale, true)
                    .ok());
    EXPECT_EQ(stages[0]
                  ->Forward(5, tokens[0].data(), nullptr, nullptr, bufs[0].data(), scale, true)
                  .status()
                  .code(),
              absl::StatusCode::kFailedPrecondition);
    EXPECT_EQ(stages[1]->Backward(9, bufs[0].data(), bufs[1].data()).code(),
              absl::StatusCode::kInternal);
    stages[0]->DropSaved();
    EXPECT_EQ(stages[0]->SavedBytes(5), 0u);
  }
}

}  // namespace
}  // namespace tandem::worker::cuda
