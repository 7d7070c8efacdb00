// GpuGpt's host-only half (worker/backend/cuda/gpu_gpt_layout.h) against the CPU gpt layers
// (worker/model/gpt.h), without a device: config validation, the parameter layout, the initial
// values (bit-identical to the CPU layers') and the memory plan's arithmetic. Built and run in
// every build, with CUDA or not.
#include "worker/backend/cuda/gpu_gpt_layout.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "tests/worker/gpu_gpt_test_util.h"
#include "worker/model/gpt.h"

namespace tandem::worker::cuda {
namespace {

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

// Selective recomputation: a slot keeps neither the attention probabilities nor gelu(c_fc)
// of any block; the workspace gains one of each, which the block at hand rebuilds into.
TEST(GpuGptMemoryTest, SelectiveRecomputationMovesAttentionAndGeluToTheWorkspace) {
  const size_t n = 64, h = 256, l = 2, nh = 4, t = 16, att = 4 * nh * t * t;
  for (GpuPrecision p : {GpuPrecision::kFp32, GpuPrecision::kBf16}) {
    const size_t in = p == GpuPrecision::kBf16 ? 2 : 4;
    GpuGptConfig cfg = TinyConfig(p);
    const absl::StatusOr<GpuGptMemory> plain = PlanGpuGptMemory(cfg);
    cfg.selective_recompute = true;
    const absl::StatusOr<GpuGptMemory> selective = PlanGpuGptMemory(cfg);
    ASSERT_TRUE(plain.ok() && selective.ok());
    const size_t per_block = att * 4 + n * h * in;
    EXPECT_EQ(plain->activations - selective->activations, l * per_block);
    EXPECT_EQ(selective->workspace - plain->workspace, per_block);
    EXPECT_EQ(selective->parameters, plain->parameters);
    EXPECT_EQ(selective->weight_grad_inputs, plain->weight_grad_inputs);
    // A stage without blocks (the head alone) keeps nothing of the kind and gains nothing.
    GpuGptConfig head = TinyConfig(p);
    head.layer_begin = 3;
    const absl::StatusOr<GpuGptMemory> head_plain = PlanGpuGptMemory(head);
    head.selective_recompute = true;
    const absl::StatusOr<GpuGptMemory> head_selective = PlanGpuGptMemory(head);
    ASSERT_TRUE(head_plain.ok() && head_selective.ok());
    EXPECT_EQ(head_selective->activations, head_plain->activations);
    EXPECT_EQ(head_selective->workspace, head_plain->workspace);
  }
}

TEST(GpuGptMemoryTest, Gpt2PresetCounts124MParameters) {
  const absl::StatusOr<GpuGptMemory> m = PlanGpuGptMemory(Gpt2Config(GpuPrecision::kBf16, 8));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->parameters, size_t{124475904} * 4);
}

}  // namespace
}  // namespace tandem::worker::cuda
