// LayerParameterCounts (common/partitioner.h, computed without building a model) against the
// parameters the workers' real gpt and mlp_lm layers hold, layer by layer, for several shapes:
// tied and untied heads, the default and an explicit d_hidden, no blocks at all.
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "common/model_desc.h"
#include "common/partitioner.h"
#include "worker/model/gpt.h"
#include "worker/model/mlp_lm.h"
#include "worker/model/model_layers.h"

namespace tandem::worker {
namespace {

// Parameter elements of every layer [0, NumLayers(model)) as Build*Layers builds them.
std::vector<int64_t> BuiltCounts(const v1::ModelSpec& model,
                                 absl::StatusOr<std::vector<std::unique_ptr<Layer>>> (*build)(
                                     const v1::ModelSpec&, uint64_t, int, int)) {
  auto layers = build(model, 1, 0, NumLayers(model));
  EXPECT_TRUE(layers.ok()) << layers.status();
  std::vector<int64_t> counts;
  if (!layers.ok()) return counts;
  for (size_t g = 0; g < layers->size(); ++g) {
    const auto& layer = (*layers)[g];
    EXPECT_EQ(layer->global_index(), static_cast<int>(g));
    int64_t n = 0;
    for (Parameter* p : layer->Parameters()) n += static_cast<int64_t>(p->value.size());
    counts.push_back(n);
  }
  return counts;
}

v1::ModelSpec Gpt(int n_layer, int n_head, int d_model, int d_hidden, int seq_len, int vocab,
                  bool tied) {
  v1::ModelSpec m;
  m.set_arch("gpt");
  m.set_n_layer(n_layer);
  m.set_n_head(n_head);
  m.set_d_model(d_model);
  m.set_d_hidden(d_hidden);
  m.set_seq_len(seq_len);
  m.set_vocab_size(vocab);
  m.set_tie_embeddings(tied);
  return m;
}

v1::ModelSpec MlpLm(int n_layer, int vocab, int context, int d_embed, int d_model, int d_hidden) {
  v1::ModelSpec m;
  m.set_arch("mlp_lm");
  m.set_n_layer(n_layer);
  m.set_vocab_size(vocab);
  m.set_context(context);
  m.set_d_embed(d_embed);
  m.set_d_model(d_model);
  m.set_d_hidden(d_hidden);
  return m;
}

TEST(LayerParameterCounts, MatchTheGptLayers) {
  for (const v1::ModelSpec& model : {
           Gpt(2, 2, 8, 0, 6, 11, true),       // d_hidden 4 * C, tied
           Gpt(2, 2, 8, 0, 6, 11, false),      // untied
           Gpt(3, 3, 48, 100, 40, 300, true),  // explicit d_hidden, seq_len != vocab
           Gpt(3, 3, 48, 100, 40, 300, false),
           Gpt(0, 1, 16, 0, 4, 7, true),  // no blocks
           Gpt(1, 4, 32, 24, 1, 50, false),
       }) {
    SCOPED_TRACE(model.ShortDebugString());
    const std::vector<int64_t> counts = LayerParameterCounts(model);
    ASSERT_EQ(static_cast<int>(counts.size()), NumLayers(model));
    EXPECT_EQ(counts, BuiltCounts(model, &BuildGptLayers));
  }
  // By hand for C = 8, H = 32, T = 6, V = 11: wte + wpe = 88 + 48; a block's norms 32,
  // c_attn 192 + 24, attn c_proj 64 + 8, c_fc 256 + 32, mlp c_proj 256 + 8; ln_f + (V, C)
  // = 16 + 88, tied or not.
  EXPECT_EQ(LayerParameterCounts(Gpt(2, 2, 8, 0, 6, 11, true)),
            (std::vector<int64_t>{136, 872, 872, 104}));
  EXPECT_EQ(LayerParameterCounts(Gpt(2, 2, 8, 0, 6, 11, false)),
            (std::vector<int64_t>{136, 872, 872, 104}));
}

TEST(LayerParameterCounts, MatchTheMlpLmLayers) {
  for (const v1::ModelSpec& model : {
           MlpLm(2, 256, 8, 32, 128, 0),  // the spec defaults, d_hidden 4 * D
           MlpLm(3, 17, 3, 5, 12, 20), MlpLm(0, 9, 1, 4, 6, 0),  // no blocks
       }) {
    SCOPED_TRACE(model.ShortDebugString());
    const std::vector<int64_t> counts = LayerParameterCounts(model);
    ASSERT_EQ(static_cast<int>(counts.size()), NumLayers(model));
    EXPECT_EQ(counts, BuiltCounts(model, &BuildMlpLmLayers));
  }
  // V = 17, K = 3, E = 5, D = 12, H = 20: tok 85 + pos 15 + proj 180 + 12; a block's norm 24,
  // fc1 240 + 20, fc2 240 + 12; the head's norm 24 + (V, D) 204 + 17.
  EXPECT_EQ(LayerParameterCounts(MlpLm(3, 17, 3, 5, 12, 20)),
            (std::vector<int64_t>{292, 536, 536, 536, 245}));
}

v1::ModelSpec Llama(int n_layer, int n_head, int n_kv_head, int d_model, int d_hidden, int vocab,
                    bool tied) {
  v1::ModelSpec m = Gpt(n_layer, n_head, d_model, d_hidden, 8, vocab, tied);
  m.set_arch("llama");
  m.set_n_kv_head(n_kv_head);
  m.set_rope_theta(10000);
  m.set_rms_eps(1e-5);
  return m;
}

TEST(LayerParameterCounts, MatchTheLlamaLayers) {
  for (const v1::ModelSpec& model : {
           Llama(2, 4, 2, 16, 32, 11, false),  // GQA, untied
           Llama(2, 4, 2, 16, 32, 11, true),   // tied: the head's own copy
           Llama(3, 4, 4, 16, 0, 20, false),   // MHA, d_hidden from d_model
           Llama(1, 6, 1, 24, 40, 9, false),   // MQA
           Llama(0, 2, 1, 8, 8, 5, true),      // no blocks
       }) {
    SCOPED_TRACE(model.ShortDebugString());
    const std::vector<int64_t> counts = LayerParameterCounts(model);
    ASSERT_EQ(static_cast<int>(counts.size()), NumLayers(model));
    if (model.d_hidden() == 0) continue;  // WithDefaults resolves it first (spec_test)
    EXPECT_EQ(counts, BuiltCounts(model, &BuildModelLayers));
  }
  // By hand for C 16, NH 4, KV 2 (KVD 8), H 32, V 11: embed 176; a block's norms 32, q and o
  // 512, k and v 256, gate, up and down 1536: 2336; norm + lm_head 16 + 176.
  EXPECT_EQ(LayerParameterCounts(Llama(2, 4, 2, 16, 32, 11, false)),
            (std::vector<int64_t>{176, 2336, 2336, 192}));
}

// The published totals of the presets' models (Hugging Face's num_parameters()).
TEST(ModelParameterCount, TheLlamaPresetsHaveTheirPublishedSizes) {
  v1::ModelSpec smol = Llama(30, 9, 3, 576, 1536, 49152, true);
  EXPECT_EQ(ModelParameterCount(smol), 134515008);  // SmolLM2-135M
  v1::ModelSpec tiny = Llama(22, 32, 4, 2048, 5632, 32000, false);
  EXPECT_EQ(ModelParameterCount(tiny), 1100048384);  // TinyLlama-1.1B
  // GPT-2 124M: 124,439,808 with the vocabulary of 50257.
  EXPECT_EQ(ModelParameterCount(Gpt(12, 12, 768, 0, 1024, 50257, true)), 124439808);
}

TEST(LayerParameterCounts, EmptyForAnotherArch) {
  v1::ModelSpec model;
  model.set_arch("rnn");
  EXPECT_TRUE(LayerParameterCounts(model).empty());
}

// 6 per multiplied parameter (blocks and head, not the embedding's lookups) + attention's
// 12 L C T, worked by hand for a small gpt: C 8, 4C hidden, T 16, V 50, 2 blocks.
TEST(ModelFlopsPerToken, SixPerMultipliedParameterPlusAttention) {
  const v1::ModelSpec m = Gpt(2, 2, 8, 0, 16, 50, false);
  // A block: ln_1 16, qkv 8x24 + 24, proj 8x8 + 8, ln_2 16, fc 8x32 + 32, fc2 32x8 + 8 = 872;
  // the head: ln_f 16 + 50 x 8 = 416.
  ASSERT_EQ(LayerParameterCounts(m)[1], 872);
  ASSERT_EQ(LayerParameterCounts(m).back(), 416);
  EXPECT_DOUBLE_EQ(ModelFlopsPerToken(m), 6.0 * (2 * 872 + 416) + 12.0 * 2 * 8 * 16);
  // mlp_lm: no attention term.
  const v1::ModelSpec mlp = MlpLm(3, 17, 3, 5, 12, 20);
  EXPECT_DOUBLE_EQ(ModelFlopsPerToken(mlp), 6.0 * (3 * 536 + 245));
  v1::ModelSpec other;
  other.set_arch("rnn");
  EXPECT_EQ(ModelFlopsPerToken(other), 0.0);
}

// GPT-2 124M at seq 1024: ~0.86 GFLOP per token, the figure nanoGPT and llm.c quote.
TEST(ModelFlopsPerToken, Gpt2SmallIsAboutPointEightSixGigaflops) {
  const double f = ModelFlopsPerToken(Gpt(12, 12, 768, 0, 1024, 50257, true));
  EXPECT_NEAR(f, 0.86e9, 0.02e9);
}

}  // namespace
}  // namespace tandem::worker
