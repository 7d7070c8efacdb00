// The gpt layers: finite-difference gradient checks of the embedding, block, head and tied
// head; the attention, GELU and cross-entropy kernels against double-precision references;
// causal masking; initialisation determinism and names; loss at init; and a tiny model that
// learns a repeating pattern when its layers are driven directly (no executor).
#include <cblas.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tests/worker/grad_check.h"
#include "worker/model/gpt.h"
#include "worker/model/kernels.h"
#include "worker/model/optimizer.h"
#include "worker/model/random.h"

namespace tandem::worker {
namespace {

// fp32 forward, central differences with step kEps: truncation error O(eps^2) ~ 1e-4
// relative; rounding error ~ 1e-7 |f| / eps. An element passes when
// |analytic - numeric| <= kRelTol * max(|a|, |n|) + kAbsTol (as layers_test.cc).
constexpr double kEps = 1e-2;
constexpr double kRelTol = 1e-2;
constexpr double kAbsTol = 3e-4;

constexpr int64_t kB = 2, kT = 5, kC = 8, kNh = 2, kV = 11;

v1::ModelSpec TinyGpt(bool tied = true) {
  v1::ModelSpec m;
  m.set_arch("gpt");
  m.set_n_layer(2);
  m.set_n_head(kNh);
  m.set_d_model(kC);
  m.set_seq_len(6);
  m.set_vocab_size(kV);
  m.set_tie_embeddings(tied);
  return m;
}

GptConfig TinyConfig(bool tied = true) { return *GptConfigFromSpec(TinyGpt(tied)); }

using testing::ExpectBitIdenticalBackwards;
using testing::ExpectForwardWithoutSavingIsForwards;
using testing::ExpectRecomputedContextIsForwards;
using testing::Perturb;
using testing::RandomTensor;
using testing::RunSameForwards;

IntTensor RandomTokens(int64_t b, int64_t t, int64_t v, uint64_t seed) {
  IntTensor x({b, t});
  Rng rng(seed);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<int32_t>(rng.Below(v));
  return x;
}

// Checks d f / d input (when check_input) and d f / d every parameter element.
void GradCheck(Layer& layer, Tensor input, const MicroBatchData& data, bool check_input) {
  testing::GradCheck(layer, std::move(input), data, {kB, kT, kC}, check_input,
                     {kEps, kRelTol, kAbsTol});
}

class GptLayersTest : public ::testing::Test {
 protected:
  void SetUp() override { openblas_set_num_threads(1); }
};

// ---- gradient checks

TEST_F(GptLayersTest, EmbeddingGradients) {
  GptEmbedding emb(TinyConfig(), 7);
  Perturb(emb, 1);
  // Repeated tokens on purpose (the scatter must add); T = 5 < seq_len = 6.
  IntTensor tokens({kB, kT}, {1, 2, 3, 1, 0, 10, 5, 5, 4, 1});
  MicroBatchData data;
  data.tokens = &tokens;
  GradCheck(emb, Tensor(), data, false);
}

TEST_F(GptLayersTest, BlockGradients) {
  GptBlock block(TinyConfig(), 0, 7);
  Perturb(block, 2);
  GradCheck(block, RandomTensor({kB, kT, kC}, 3), MicroBatchData{}, true);
}

TEST_F(GptLayersTest, HeadGradients) {
  for (bool tied : {false, true}) {
    SCOPED_TRACE(tied ? "tied" : "untied");
    GptHead head(TinyConfig(tied), 7);
    // The head's W is small at init (std 0.02): scale it up so the loss is far from uniform.
    Perturb(head, 4, 0.5);
    IntTensor targets = RandomTokens(kB, kT, kV, 5);
    MicroBatchData data;
    data.targets = &targets;
    data.loss_normalizer = 3 * kB * kT;  // as if 3 micro-batches
    GradCheck(head, RandomTensor({kB, kT, kC}, 6), data, true);
  }
}

TEST_F(GptLayersTest, HeadScalesByUpstreamGradient) {
  GptHead head(TinyConfig(), 7);
  IntTensor targets = RandomTokens(kB, kT, kV, 5);
  MicroBatchData data{nullptr, &targets, kB * kT};
  const Tensor x = RandomTensor({kB, kT, kC}, 6);
  Tensor g1, g3;
  for (auto [dloss, g] : {std::pair{1.0f, &g1}, std::pair{3.0f, &g3}}) {
    SavedContext ctx;
    Tensor out;
    ASSERT_TRUE(head.Forward(x, data, ctx, out).ok());
    ASSERT_TRUE(head.Backward(Tensor({1}, {dloss}), ctx, *g).ok());
  }
  for (size_t i = 0; i < g1.size(); ++i) EXPECT_NEAR(g3[i], 3.0f * g1[i], 1e-6f + 1e-5f * g3[i]);
}

// The split backward (I then W) computes exactly what B does, bit for bit: the same GEMMs on
// the same operands, split in time. Also: I frees what only it needed, W empties the context.
TEST_F(GptLayersTest, SplitBackwardIsBitIdenticalToFullBackward) {
  const GptConfig cfg = TinyConfig(/*tied=*/false);
  IntTensor tokens = RandomTokens(kB, kT, kV, 3);
  IntTensor targets = RandomTokens(kB, kT, kV, 5);
  MicroBatchData data{&tokens, &targets, 2 * kB * kT};
  auto run = [&](Layer& full, Layer& split, const Tensor& x, const Tensor& dout) {
    SavedContext a, b;
    Tensor ya, yb;
    ASSERT_TRUE(full.Forward(x, data, a, ya).ok());
    ASSERT_TRUE(split.Forward(x, data, b, yb).ok());
    const size_t saved = b.Bytes();
    Tensor ga, gb;
    ASSERT_TRUE(full.Backward(dout, a, ga).ok());
    ASSERT_TRUE(split.BackwardInput(dout, b, gb).ok());
    EXPECT_EQ(ga.vec(), gb.vec()) << full.name() << ": input gradient";
    // What W still needs: the linears' inputs and output gradients, not much above the saved
    // forward (the attention probabilities and pre-activations are gone).
    EXPECT_GT(b.Bytes(), 0u) << full.name();
    EXPECT_LT(b.Bytes(), saved + saved / 2) << full.name();
    ASSERT_TRUE(split.BackwardWeight(b).ok());
    EXPECT_EQ(b.Bytes(), 0u);
    std::vector<Parameter*> pa = full.Parameters(), pb = split.Parameters();
    ASSERT_EQ(pa.size(), pb.size());
    for (size_t i = 0; i < pa.size(); ++i) {
      EXPECT_EQ(pa[i]->grad.vec(), pb[i]->grad.vec()) << pa[i]->name;
    }
    // W without I is an error, not a crash.
    SavedContext empty;
    EXPECT_FALSE(split.BackwardWeight(empty).ok()) << full.name();
  };
  GptBlock block_a(cfg, 0, 7), block_b(cfg, 0, 7);
  run(block_a, block_b, RandomTensor({kB, kT, kC}, 3), RandomTensor({kB, kT, kC}, 4));
  GptHead head_a(cfg, 7), head_b(cfg, 7);
  Perturb(head_a, 4, 0.5);
  Perturb(head_b, 4, 0.5);
  run(head_a, head_b, RandomTensor({kB, kT, kC}, 6), Tensor({1}, {0.75f}));
}

// Selective recomputation (GptConfig::selective_recompute): the block keeps neither the
// attention probabilities nor the GELU output, exactly (NH T + H) floats per token less, and
// its backward, B or I then W, recomputes them with the forward's kernels: the output, the
// input gradient and every parameter gradient are bit for bit those of the plain block.
TEST_F(GptLayersTest, SelectiveRecomputationKeepsLessAndIsBitIdentical) {
  const GptConfig plain_cfg = TinyConfig();
  GptConfig selective_cfg = plain_cfg;
  selective_cfg.selective_recompute = true;
  const int64_t h = plain_cfg.d_hidden, n = kB * kT;
  ASSERT_EQ(h, 4 * kC);
  const Tensor x = RandomTensor({kB, kT, kC}, 3), dout = RandomTensor({kB, kT, kC}, 4);
  GptBlock plain(plain_cfg, 0, 7), full(selective_cfg, 0, 7), split(selective_cfg, 0, 7);
  SavedContext a, b, c;
  RunSameForwards(plain, a, full, b, split, c, x);
  if (HasFatalFailure()) return;
  // Per token: x, ln1, y, x1, ln2 (C each), qkv (3C), pre (H), the norms' means and rstds
  // (4), and without selective the probabilities (NH T) and the GELU output (H).
  const size_t kept = static_cast<size_t>(n * (8 * kC + h + 4)) * sizeof(float);
  EXPECT_EQ(b.Bytes(), kept);
  EXPECT_EQ(a.Bytes(), kept + static_cast<size_t>(n * (kNh * kT + h)) * sizeof(float));
  ExpectBitIdenticalBackwards(plain, a, full, b, split, c, dout);
  // And the recomputing block's gradients against finite differences.
  GptBlock checked(selective_cfg, 0, 7);
  Perturb(checked, 2);
  GradCheck(checked, RandomTensor({kB, kT, kC}, 3), MicroBatchData{}, true);
}

// Full recomputation's RecomputeContext skips the block's last GEMM and residual add but
// leaves exactly the context of Forward, with and without selective recomputation; the
// embedding and the head recompute through Forward.
TEST_F(GptLayersTest, RecomputedContextIsTheForwardsBitForBit) {
  GptConfig cfg = TinyConfig();
  for (bool selective : {false, true}) {
    cfg.selective_recompute = selective;
    GptBlock block(cfg, 0, 7);
    Perturb(block, 2);
    ExpectRecomputedContextIsForwards(block, RandomTensor({kB, kT, kC}, 3));
  }
  GptHead head(cfg, 7);
  IntTensor targets({kB, kT});
  for (size_t i = 0; i < targets.size(); ++i) targets[i] = static_cast<int32_t>(i % cfg.vocab);
  MicroBatchData data;
  data.targets = &targets;
  ExpectRecomputedContextIsForwards(head, RandomTensor({kB, kT, kC}, 5), data);
}

// The forward of a micro-batch the program recomputes keeps nothing: a block's output is
// Forward's bit for bit, and it holds at most about half its context at once (each half's
// intermediates freed as the half ends); the head, through the default, its context.
TEST_F(GptLayersTest, ForwardWithoutSavingIsTheForwardsOutputInLessMemory) {
  GptConfig cfg = TinyConfig();
  GptBlock block(cfg, 0, 7);
  Perturb(block, 2);
  const Tensor x = RandomTensor({kB, kT, kC}, 3);
  const auto [peak, context] = ExpectForwardWithoutSavingIsForwards(block, x);
  EXPECT_LT(peak, context);
  // The larger half: x1, ln_2 and its statistics, c_fc's output and its GELU, (4 + 2H/C) C
  // floats per token at the most (the attention half, 6C + NH T + 2, is smaller here).
  const size_t n = static_cast<size_t>(kB * kT);
  const size_t mlp = n * (2 * cfg.d_model + 2 * cfg.d_hidden + 2) * sizeof(float);
  const size_t attention =
      (n * (6 * cfg.d_model + 2) + static_cast<size_t>(kB * cfg.n_head * kT * kT)) * sizeof(float);
  EXPECT_EQ(peak, std::max(mlp, attention));
  GptHead head(cfg, 7);
  IntTensor targets({kB, kT});
  for (size_t i = 0; i < targets.size(); ++i) targets[i] = static_cast<int32_t>(i % cfg.vocab);
  MicroBatchData data;
  data.targets = &targets;
  const Tensor h = RandomTensor({kB, kT, kC}, 5);
  const auto head_bytes = ExpectForwardWithoutSavingIsForwards(head, h, data);
  EXPECT_EQ(head_bytes.peak, head_bytes.context);
}

// ---- kernels against double-precision references

// Naive causal attention in double: out (B, T, C) from qkv (B, T, 3C).
std::vector<double> NaiveAttention(const Tensor& qkv, int64_t b, int64_t t, int64_t c, int64_t nh) {
  const int64_t hd = c / nh;
  std::vector<double> out(static_cast<size_t>(b * t * c));
  for (int64_t bi = 0; bi < b; ++bi) {
    for (int64_t h = 0; h < nh; ++h) {
      for (int64_t i = 0; i < t; ++i) {
        std::vector<double> s(static_cast<size_t>(i + 1));
        double m = -1e300;
        for (int64_t j = 0; j <= i; ++j) {
          double dot = 0;
          for (int64_t d = 0; d < hd; ++d) {
            dot += static_cast<double>(qkv[(bi * t + i) * 3 * c + h * hd + d]) *
                   qkv[(bi * t + j) * 3 * c + c + h * hd + d];
          }
          s[j] = dot / std::sqrt(static_cast<double>(hd));
          m = std::max(m, s[j]);
        }
        double z = 0;
        for (double& v : s) z += (v = std::exp(v - m));
        for (int64_t d = 0; d < hd; ++d) {
          double y = 0;
          for (int64_t j = 0; j <= i; ++j) {
            y += s[j] / z * qkv[(bi * t + j) * 3 * c + 2 * c + h * hd + d];
          }
          out[(bi * t + i) * c + h * hd + d] = y;
        }
      }
    }
  }
  return out;
}

// (T, stride of the checked qkv elements): T = 13 is one query tile with vector tails in the
// softmax; T = 150 is three tiles of 64, the last partial.
class CausalAttentionTest : public ::testing::TestWithParam<std::pair<int64_t, size_t>> {};

TEST_P(CausalAttentionTest, MatchesNaiveReference) {
  openblas_set_num_threads(1);
  const auto [t, stride] = GetParam();
  const int64_t b = 2, c = 12, nh = 2;  // hd = 6
  const Tensor qkv = RandomTensor({b, t, 3 * c}, 11);
  Tensor att({b, nh, t, t}), out({b, t, c});
  kernels::CausalAttentionForward(qkv.data(), att.data(), out.data(), b, t, c, nh);
  const std::vector<double> ref = NaiveAttention(qkv, b, t, c, nh);
  for (size_t i = 0; i < out.size(); ++i) EXPECT_NEAR(out[i], ref[i], 2e-5) << i;
  // Masked probabilities are exactly zero; visible rows sum to 1.
  for (int64_t r = 0; r < b * nh; ++r) {
    for (int64_t i = 0; i < t; ++i) {
      double sum = 0;
      for (int64_t j = 0; j < t; ++j) {
        const float p = att[(r * t + i) * t + j];
        if (j > i) {
          EXPECT_EQ(p, 0.0f);
        }
        sum += p;
      }
      EXPECT_NEAR(sum, 1.0, 1e-5);
    }
  }
  // Backward against central differences of the double reference on f = sum(r * out).
  const Tensor r = RandomTensor({b, t, c}, 12);
  Tensor dqkv({b, t, 3 * c});
  kernels::CausalAttentionBackward(r.data(), qkv.data(), att.data(), dqkv.data(), b, t, c, nh);
  Tensor x = qkv;
  for (size_t i = 0; i < x.size(); i += stride) {  // a sample keeps the test fast
    const float saved = x[i];
    double f[2];
    for (int s = 0; s < 2; ++s) {
      x[i] = saved + (s == 0 ? 1e-2f : -1e-2f);
      const std::vector<double> o = NaiveAttention(x, b, t, c, nh);
      f[s] = 0;
      for (size_t k = 0; k < o.size(); ++k) f[s] += r[k] * o[k];
    }
    x[i] = saved;
    // The step is an exact float, so only truncation error (O(eps^2)) remains.
    const double numeric = (f[0] - f[1]) / (static_cast<double>(saved + 1e-2f) - (saved - 1e-2f));
    EXPECT_NEAR(dqkv[i], numeric, 1e-3 * std::abs(numeric) + 2e-4) << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Tiles, CausalAttentionTest,
                         ::testing::Values(std::pair<int64_t, size_t>{13, 5},
                                           std::pair<int64_t, size_t>{150, 97}));

TEST_F(GptLayersTest, FastGeluMatchesReference) {
  // 1003 values over [-12, 12) (a tail of 3 lanes) plus extremes.
  std::vector<float> x;
  for (int i = 0; i < 1000; ++i) x.push_back(-12.0f + 0.024f * static_cast<float>(i));
  for (float e : {-100.0f, 0.0f, 100.0f}) x.push_back(e);
  const int64_t n = static_cast<int64_t>(x.size());
  std::vector<float> ref(n), fast(n), dref(n, 0.5f), dfast(n, 0.5f), dout(n);
  for (int64_t i = 0; i < n; ++i) dout[i] = 1.0f + 0.001f * static_cast<float>(i);
  kernels::GeluForward(x.data(), ref.data(), n);
  kernels::GeluForwardFast(x.data(), fast.data(), n);
  kernels::GeluBackward(x.data(), dout.data(), dref.data(), n);  // adds onto 0.5
  kernels::GeluBackwardFast(x.data(), dout.data(), dfast.data(), n);
  for (int64_t i = 0; i < n; ++i) {
    EXPECT_NEAR(fast[i], ref[i], 1e-6f * std::max(1.0f, std::abs(x[i]))) << x[i];
    EXPECT_NEAR(dfast[i], dref[i], 1e-5f * std::abs(dref[i]) + 1e-6f) << x[i];
  }
  // In place.
  std::vector<float> y = x;
  kernels::GeluForwardFast(y.data(), y.data(), n);
  EXPECT_EQ(y, fast);
}

TEST_F(GptLayersTest, InPlaceCrossEntropyMatchesReference) {
  const int64_t n = 5, v = 1001;  // 1001: a vector tail
  Tensor logits = RandomTensor({n, v}, 21, 3.0);
  logits[7] = 80.0f;  // a dominant logit: the shift by the row max must keep exp finite
  const IntTensor targets({n}, {0, 1000, 7, 500, 3});
  Tensor probs({n, v}), losses({n}), ref_grad({n, v});
  const double ref = kernels::SoftmaxCrossEntropyForward(logits.data(), targets.data(),
                                                         probs.data(), losses.data(), n, v);
  kernels::SoftmaxCrossEntropyBackward(probs.data(), targets.data(), 1.0f, ref_grad.data(), n, v);
  Tensor z = logits;
  const double got = kernels::SoftmaxCrossEntropyInPlace(z.data(), targets.data(), n, v);
  EXPECT_NEAR(got, ref, 1e-5 * std::abs(ref));
  for (size_t i = 0; i < z.size(); ++i) EXPECT_NEAR(z[i], ref_grad[i], 1e-6f) << i;
}

// ---- masking, init, names

TEST_F(GptLayersTest, AttentionIsCausal) {
  GptBlock block(TinyConfig(), 1, 7);
  Perturb(block, 8);
  const Tensor x = RandomTensor({kB, kT, kC}, 9);
  SavedContext ctx;
  Tensor base;
  ASSERT_TRUE(block.Forward(x, MicroBatchData{}, ctx, base).ok());
  for (int64_t tp = 0; tp < kT; ++tp) {
    Tensor x2 = x;
    // Sequence 1, position tp; not a constant shift, which ln_1 would remove.
    for (int64_t j = 0; j < kC; ++j) x2[(1 * kT + tp) * kC + j] += 0.5f * static_cast<float>(j);
    SavedContext ctx2;
    Tensor out;
    ASSERT_TRUE(block.Forward(x2, MicroBatchData{}, ctx2, out).ok());
    for (int64_t bi = 0; bi < kB; ++bi) {
      for (int64_t t = 0; t < kT; ++t) {
        bool changed = false;
        for (int64_t j = 0; j < kC; ++j) {
          const size_t k = static_cast<size_t>((bi * kT + t) * kC + j);
          changed |= out[k] != base[k];
        }
        // Exactly unchanged before tp (masked probabilities are exact zeros) and in the other
        // sequence; changed from tp on.
        EXPECT_EQ(changed, bi == 1 && t >= tp) << "b " << bi << " t " << t << " tp " << tp;
      }
    }
  }
}

std::map<std::string, std::vector<Tensor>> ParamsByName(
    const std::vector<std::unique_ptr<Layer>>& layers) {
  std::map<std::string, std::vector<Tensor>> m;
  for (const auto& l : layers) {
    for (Parameter* p : l->Parameters()) m[p->name].push_back(p->value);
  }
  return m;
}

TEST_F(GptLayersTest, InitIsIndependentOfTheStageRangeAndTiedCopiesAreIdentical) {
  const v1::ModelSpec model = TinyGpt(true);
  auto whole = BuildGptLayers(model, 42, 0, 4);
  ASSERT_TRUE(whole.ok()) << whole.status();
  const auto all = ParamsByName(*whole);
  // Every parameter of a 2-stage cut equals the whole model's, bit for bit.
  for (auto [begin, end] : {std::pair{0, 2}, {2, 4}, {1, 2}, {3, 4}}) {
    auto part = BuildGptLayers(model, 42, begin, end);
    ASSERT_TRUE(part.ok());
    for (const auto& [name, values] : ParamsByName(*part)) {
      ASSERT_TRUE(all.count(name)) << name;
      for (const Tensor& v : values) EXPECT_EQ(v.vec(), all.at(name)[0].vec()) << name;
    }
  }
  // The tied W: one name, two copies (embedding, head), identical, both flagged.
  ASSERT_EQ(all.at("transformer.wte.weight").size(), 2u);
  EXPECT_EQ(all.at("transformer.wte.weight")[0].vec(), all.at("transformer.wte.weight")[1].vec());
  for (const auto& l : *whole) {
    for (Parameter* p : l->Parameters()) {
      EXPECT_EQ(p->tied, p->name == "transformer.wte.weight") << p->name;
    }
  }
  // A different seed gives different weights; the untied head draws its own lm_head.
  auto other = BuildGptLayers(model, 43, 0, 1);
  EXPECT_NE((*other)[0]->Parameters()[0]->value.vec(), all.at("transformer.wte.weight")[0].vec());
  auto untied = BuildGptLayers(TinyGpt(false), 42, 0, 4);
  const auto u = ParamsByName(*untied);
  EXPECT_EQ(u.at("transformer.wte.weight").size(), 1u);
  EXPECT_NE(u.at("lm_head.weight")[0].vec(), u.at("transformer.wte.weight")[0].vec());
  for (const auto& l : *untied) {
    for (Parameter* p : l->Parameters()) EXPECT_FALSE(p->tied) << p->name;
  }
}

TEST_F(GptLayersTest, ParameterNamesShapesDecayAndInit) {
  v1::ModelSpec model = TinyGpt(false);
  model.set_n_layer(8);  // residual std 0.02 / sqrt(16) = 0.005
  model.set_d_model(64);
  model.set_n_head(4);
  auto layers = BuildGptLayers(model, 5, 0, 10);
  ASSERT_TRUE(layers.ok());
  std::vector<std::string> names;
  for (const auto& l : *layers) {
    for (Parameter* p : l->Parameters()) names.push_back(p->name);
  }
  ASSERT_EQ(names.size(), 2u + 8u * 12u + 3u);
  EXPECT_EQ(names[0], "transformer.wte.weight");
  EXPECT_EQ(names[1], "transformer.wpe.weight");
  const std::vector<std::string> block3 = {
      "ln_1.weight",        "ln_1.bias",        "attn.c_attn.weight", "attn.c_attn.bias",
      "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight",        "ln_2.bias",
      "mlp.c_fc.weight",    "mlp.c_fc.bias",    "mlp.c_proj.weight",  "mlp.c_proj.bias"};
  for (size_t i = 0; i < block3.size(); ++i) {
    EXPECT_EQ(names[2 + 3 * 12 + i], "transformer.h.3." + block3[i]);
  }
  EXPECT_EQ(names[names.size() - 3], "transformer.ln_f.weight");
  EXPECT_EQ(names[names.size() - 2], "transformer.ln_f.bias");
  EXPECT_EQ(names[names.size() - 1], "lm_head.weight");

  auto stddev = [](const Tensor& t) {
    double s = 0;
    for (float v : t.vec()) s += static_cast<double>(v) * v;
    return std::sqrt(s / static_cast<double>(t.size()));
  };
  for (const auto& l : *layers) {
    for (Parameter* p : l->Parameters()) {
      const bool is_weight = p->value.rank() == 2;
      EXPECT_EQ(p->decay, is_weight) << p->name;
      EXPECT_EQ(p->grad.shape(), p->value.shape()) << p->name;
      const bool is_gain =
          p->name.find("ln_") != std::string::npos && p->name.find(".weight") != std::string::npos;
      if (!is_weight) {
        for (float v : p->value.vec()) ASSERT_EQ(v, is_gain ? 1.0f : 0.0f) << p->name;
      } else if (p->name.find("c_proj") != std::string::npos) {
        EXPECT_NEAR(stddev(p->value), 0.005, 0.0005) << p->name;
      } else {
        EXPECT_NEAR(stddev(p->value), 0.02, 0.002) << p->name;
      }
    }
  }
  // Layouts: (out, in) as nn.Linear.
  const auto& block = *(*layers)[1];
  EXPECT_EQ(const_cast<Layer&>(block).Parameters()[2]->value.shape(),
            (std::vector<int64_t>{192, 64}));
  EXPECT_EQ(const_cast<Layer&>(block).Parameters()[8]->value.shape(),
            (std::vector<int64_t>{256, 64}));
}

// ---- validation

TEST_F(GptLayersTest, RejectsBadModelsRangesAndInputs) {
  v1::ModelSpec bad = TinyGpt();
  bad.set_n_head(3);  // 8 % 3 != 0
  auto r = BuildGptLayers(bad, 1, 0, 1);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("model.n_head"), std::string::npos) << r.status();
  bad = TinyGpt();
  bad.set_seq_len(0);
  EXPECT_NE(GptConfigFromSpec(bad).status().message().find("model.seq_len"), std::string::npos);
  bad = TinyGpt();
  bad.set_arch("mlp_lm");
  EXPECT_FALSE(GptConfigFromSpec(bad).ok());
  bad = TinyGpt();
  bad.set_vocab_size(1 << 20);
  bad.set_d_model(1 << 12);
  bad.set_n_head(1);
  EXPECT_NE(GptConfigFromSpec(bad).status().message().find("too large"), std::string::npos);
  EXPECT_FALSE(BuildGptLayers(TinyGpt(), 1, 2, 2).ok());
  EXPECT_FALSE(BuildGptLayers(TinyGpt(), 1, 0, 5).ok());

  const GptConfig cfg = TinyConfig();
  GptEmbedding emb(cfg, 1);
  SavedContext ctx;
  Tensor out;
  IntTensor too_long = RandomTokens(1, 7, kV, 1);  // T = 7 > seq_len = 6
  EXPECT_FALSE(emb.Forward(Tensor(), {&too_long, nullptr, 1}, ctx, out).ok());
  IntTensor oov({1, 2}, {0, static_cast<int32_t>(kV)});
  EXPECT_NE(emb.Forward(Tensor(), {&oov, nullptr, 1}, ctx, out).message().find("vocabulary"),
            std::string::npos);
  GptBlock block(cfg, 0, 1);
  EXPECT_FALSE(block.Forward(Tensor({kB * kT, kC}), {}, ctx, out).ok());  // rank 2
  EXPECT_FALSE(block.Forward(Tensor({kB, kT, kC + 1}), {}, ctx, out).ok());
  GptHead head(cfg, 1);
  IntTensor flat_targets({kB * kT});
  EXPECT_FALSE(head.Forward(Tensor({kB, kT, kC}), {nullptr, &flat_targets, 1}, ctx, out).ok());
  IntTensor neg({kB, kT});
  neg[3] = -1;
  EXPECT_FALSE(head.Forward(Tensor({kB, kT, kC}), {nullptr, &neg, 1}, ctx, out).ok());
  // Backward without a forward is an internal error, not a crash.
  SavedContext empty;
  Tensor g;
  EXPECT_EQ(block.Backward(Tensor({kB, kT, kC}), empty, g).code(), absl::StatusCode::kInternal);
  EXPECT_EQ(head.Backward(Tensor(), empty, g).code(), absl::StatusCode::kInternal);
}

// ---- whole model

// Runs every layer forward then backward on one micro-batch; returns the loss.
float ForwardBackward(std::vector<std::unique_ptr<Layer>>& layers, const MicroBatchData& data,
                      bool backward) {
  std::vector<SavedContext> ctx(layers.size());
  Tensor act;
  for (size_t i = 0; i < layers.size(); ++i) {
    Tensor out;
    EXPECT_TRUE(layers[i]->Forward(act, data, ctx[i], out).ok());
    act = std::move(out);
  }
  const float loss = act[0];
  if (backward) {
    Tensor grad;
    for (size_t i = layers.size(); i-- > 0;) {
      Tensor grad_in;
      EXPECT_TRUE(layers[i]->Backward(grad, ctx[i], grad_in).ok());
      grad = std::move(grad_in);
    }
  }
  return loss;
}

TEST_F(GptLayersTest, LossAtInitIsNearLogVocab) {
  v1::ModelSpec model = TinyGpt();
  model.set_vocab_size(256);
  model.set_d_model(32);
  model.set_seq_len(16);
  auto layers = BuildGptLayers(model, 3, 0, 4);
  ASSERT_TRUE(layers.ok());
  const IntTensor tokens = RandomTokens(4, 16, 256, 1), targets = RandomTokens(4, 16, 256, 2);
  const float loss = ForwardBackward(*layers, {&tokens, &targets, 4 * 16}, false);
  EXPECT_NEAR(loss, std::log(256.0), 0.05);
}

// A 2-layer model on a repeating pattern, the executor's duties done by hand: the two copies
// of the tied wte get the sum of their gradients before each AdamW step, so they stay equal.
TEST_F(GptLayersTest, TinyModelLearnsARepeatingPattern) {
  v1::ModelSpec model = TinyGpt();
  model.set_vocab_size(16);
  model.set_d_model(32);
  model.set_n_head(4);
  model.set_seq_len(16);
  auto built = BuildGptLayers(model, 11, 0, 4);
  ASSERT_TRUE(built.ok());
  auto& layers = *built;
  std::vector<Parameter*> params;
  std::vector<Parameter*> tied;
  for (auto& l : layers) {
    for (Parameter* p : l->Parameters()) {
      params.push_back(p);
      if (p->tied) tied.push_back(p);
    }
  }
  ASSERT_EQ(tied.size(), 2u);
  AdamW opt(params, AdamWOptions{0.9f, 0.95f, 1e-8f, 0.01f});

  const std::vector<int32_t> pattern = {3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5};  // period 11
  const int64_t b = 4, t = 16;
  Rng rng(5);
  float first = 0, last = 0;
  for (int step = 0; step < 40; ++step) {
    IntTensor tokens({b, t}), targets({b, t});
    for (int64_t i = 0; i < b; ++i) {
      const uint64_t start = rng.Below(pattern.size());
      for (int64_t j = 0; j < t; ++j) {
        tokens[i * t + j] = pattern[(start + j) % pattern.size()];
        targets[i * t + j] = pattern[(start + j + 1) % pattern.size()];
      }
    }
    const float loss = ForwardBackward(layers, {&tokens, &targets, b * t}, true);
    if (step == 0) first = loss;
    last = loss;
    for (size_t i = 0; i < tied[0]->grad.size(); ++i) {
      const float sum = tied[0]->grad[i] + tied[1]->grad[i];
      tied[0]->grad[i] = sum;
      tied[1]->grad[i] = sum;
    }
    opt.Step(1e-2f);
  }
  // Near ln 16 = 2.77 (a little above: with tied weights the input token's own logit is
  // correlated with the residual stream).
  EXPECT_NEAR(first, std::log(16.0), 0.3);
  EXPECT_LT(last, 0.3f * first) << "first " << first << " last " << last;
  EXPECT_EQ(tied[0]->value.vec(), tied[1]->value.vec());
}

}  // namespace
}  // namespace tandem::worker
