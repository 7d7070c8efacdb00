// Gradient checks of the mlp_lm layers against central finite differences, the cross-entropy
// value against a hand computation, and initialisation determinism.
#include <cblas.h>
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <vector>

#include "common/model_desc.h"
#include "tests/worker/grad_check.h"
#include "worker/model/kernels.h"
#include "worker/model/mlp_lm.h"
#include "worker/model/random.h"

namespace tandem::worker {
namespace {

// fp32 forward, central differences with step kEps on a smooth function: truncation error
// O(eps^2) ~ 1e-4 relative, rounding error ~ 1e-7 / eps ~ 1e-5 relative of the function value.
// An element passes when |analytic - numeric| <= kRelTol * max(|a|, |n|) + kAbsTol.
constexpr double kEps = 1e-2;
constexpr double kRelTol = 1e-2;
constexpr double kAbsTol = 2e-4;

v1::ModelSpec TinyModel() {
  v1::ModelSpec m;
  m.set_arch("mlp_lm");
  m.set_n_layer(2);
  m.set_d_model(8);
  m.set_d_hidden(12);
  m.set_d_embed(3);
  m.set_context(4);
  m.set_vocab_size(11);
  return m;
}

MlpLmConfig TinyConfig() { return *MlpLmConfigFromSpec(TinyModel()); }

using testing::Perturb;
using testing::RandomTensor;

void GradCheck(Layer& layer, Tensor input, const MicroBatchData& data, int64_t out_rows,
               int64_t out_cols, bool check_input) {
  testing::GradCheck(layer, std::move(input), data, {out_rows, out_cols}, check_input,
                     {kEps, kRelTol, kAbsTol});
}

class LayersTest : public ::testing::Test {
 protected:
  void SetUp() override { openblas_set_num_threads(1); }
};

TEST_F(LayersTest, BlockGradients) {
  const MlpLmConfig cfg = TinyConfig();
  MlpBlockLayer block(cfg, 0, 7);
  Perturb(block, 1);
  GradCheck(block, RandomTensor({3, cfg.d_model}, 2), MicroBatchData{}, 3, cfg.d_model, true);
}

TEST_F(LayersTest, EmbeddingGradients) {
  const MlpLmConfig cfg = TinyConfig();
  EmbeddingLayer emb(cfg, 7);
  Perturb(emb, 3);
  IntTensor tokens({3, cfg.context}, {1, 2, 3, 1, 0, 10, 5, 5, 4, 9, 2, 1});  // repeats on purpose
  MicroBatchData data;
  data.tokens = &tokens;
  GradCheck(emb, Tensor(), data, 3, cfg.d_model, false);
}

TEST_F(LayersTest, HeadGradients) {
  const MlpLmConfig cfg = TinyConfig();
  LmHeadLayer head(cfg, 7);
  Perturb(head, 4);
  IntTensor targets({3}, {0, 10, 4});
  MicroBatchData data;
  data.targets = &targets;
  data.loss_normalizer = 5;
  GradCheck(head, RandomTensor({3, cfg.d_model}, 5), data, 1, 1, true);
}

TEST_F(LayersTest, CrossEntropyMatchesHandComputation) {
  // logits (2, 3); targets {2, 0}.
  const float logits[] = {1.0f, 2.0f, 3.0f, 0.5f, -1.0f, 0.0f};
  const int32_t targets[] = {2, 0};
  float probs[6], losses[2];
  const double total = kernels::SoftmaxCrossEntropyForward(logits, targets, probs, losses, 2, 3);
  const double l0 = -std::log(std::exp(3.0) / (std::exp(1.0) + std::exp(2.0) + std::exp(3.0)));
  const double l1 = -std::log(std::exp(0.5) / (std::exp(0.5) + std::exp(-1.0) + std::exp(0.0)));
  EXPECT_NEAR(losses[0], l0, 1e-6);
  EXPECT_NEAR(losses[1], l1, 1e-6);
  EXPECT_NEAR(total, l0 + l1, 1e-6);
  EXPECT_NEAR(probs[2], std::exp(-l0), 1e-6);
  float d[6] = {};
  kernels::SoftmaxCrossEntropyBackward(probs, targets, 0.5f, d, 2, 3);
  EXPECT_NEAR(d[2], 0.5 * (probs[2] - 1.0), 1e-7);
  EXPECT_NEAR(d[1], 0.5 * probs[1], 1e-7);
}

TEST_F(LayersTest, HeadLossIsNormalizedByGlobalCount) {
  const MlpLmConfig cfg = TinyConfig();
  LmHeadLayer head(cfg, 7);
  IntTensor targets({4}, {1, 2, 3, 4});
  MicroBatchData data;
  data.targets = &targets;
  data.loss_normalizer = 4;
  SavedContext ctx;
  Tensor out;
  ASSERT_TRUE(head.Forward(RandomTensor({4, cfg.d_model}, 1), data, ctx, out).ok());
  // Fresh init: logits near zero, so each CE is close to ln V and the mean over 4 is too.
  EXPECT_NEAR(out[0], std::log(static_cast<double>(cfg.vocab)), 0.05);
  data.loss_normalizer = 8;
  SavedContext ctx2;
  Tensor out2;
  ASSERT_TRUE(head.Forward(RandomTensor({4, cfg.d_model}, 1), data, ctx2, out2).ok());
  EXPECT_NEAR(out2[0], out[0] / 2, 1e-6);
}

TEST_F(LayersTest, ForwardRejectsBadInput) {
  const MlpLmConfig cfg = TinyConfig();
  EmbeddingLayer emb(cfg, 1);
  IntTensor tokens({1, cfg.context}, {0, 1, 2, 11});  // 11 >= V
  MicroBatchData data;
  data.tokens = &tokens;
  SavedContext ctx;
  Tensor out;
  EXPECT_EQ(emb.Forward(Tensor(), data, ctx, out).code(), absl::StatusCode::kInvalidArgument);
  MlpBlockLayer block(cfg, 0, 1);
  EXPECT_EQ(block.Forward(Tensor({2, cfg.d_model + 1}), data, ctx, out).code(),
            absl::StatusCode::kInvalidArgument);
}

std::vector<std::vector<float>> Weights(const std::vector<std::unique_ptr<Layer>>& layers) {
  std::vector<std::vector<float>> w;
  for (const auto& l : layers) {
    for (Parameter* p : l->Parameters()) w.push_back(p->value.values());
  }
  return w;
}

TEST_F(LayersTest, InitDependsOnlyOnSeedAndGlobalIndex) {
  const v1::ModelSpec model = TinyModel();
  const int n = NumLayers(model);
  auto whole = BuildMlpLmLayers(model, 42, 0, n);
  ASSERT_TRUE(whole.ok());
  auto front = BuildMlpLmLayers(model, 42, 0, 2);
  auto back = BuildMlpLmLayers(model, 42, 2, n);
  ASSERT_TRUE(front.ok() && back.ok());
  std::vector<std::vector<float>> split = Weights(*front);
  for (auto& w : Weights(*back)) split.push_back(w);
  EXPECT_EQ(Weights(*whole), split);

  auto other_seed = BuildMlpLmLayers(model, 43, 0, n);
  EXPECT_NE(Weights(*whole), Weights(*other_seed));

  // Conventions: biases zero, gains one, weights ~ N(0, 0.02), decay flags.
  auto& block = *(*whole)[1];
  for (Parameter* p : block.Parameters()) {
    EXPECT_EQ(p->decay, p->value.rank() == 2) << p->name;
    if (p->name.find("gain") != std::string::npos) {
      EXPECT_EQ(p->value[0], 1.0f);
    }
    if (p->name.find("bias") != std::string::npos) {
      EXPECT_EQ(p->value[0], 0.0f);
    }
  }
  // Blocks' two matrices come from the same stream but are distinct draws.
  EXPECT_NE(block.Parameters()[2]->value[0], block.Parameters()[4]->value[0]);
  double sum2 = 0;
  const Tensor& tok = (*whole)[0]->Parameters()[0]->value;
  for (size_t i = 0; i < tok.size(); ++i) sum2 += tok[i] * tok[i];
  EXPECT_NEAR(std::sqrt(sum2 / tok.size()), 0.02, 0.01);
}

TEST_F(LayersTest, BuildRejectsBadRangesAndModels) {
  const v1::ModelSpec model = TinyModel();
  EXPECT_FALSE(BuildMlpLmLayers(model, 1, 2, 2).ok());
  EXPECT_FALSE(BuildMlpLmLayers(model, 1, 0, NumLayers(model) + 1).ok());
  v1::ModelSpec bad = model;
  bad.set_d_model(0);
  auto r = BuildMlpLmLayers(bad, 1, 0, 1);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("model.d_model"), std::string::npos);
  bad = model;
  bad.set_arch("gpt");
  EXPECT_FALSE(BuildMlpLmLayers(bad, 1, 0, 1).ok());
  bad = model;
  bad.set_vocab_size(1 << 20);
  bad.set_d_model(1 << 20);
  EXPECT_NE(MlpLmConfigFromSpec(bad).status().message().find("too large"), std::string::npos);
}

}  // namespace
// The gradient norm's pass: any length (the eight partial sums and the tail), against a long
// double sum in order, to double rounding; NaN and infinity come through.
TEST(SumOfSquaresTest, MatchesAnOrderedSumAndPropagatesNonFinite) {
  std::vector<float> x(1000);
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.7f * i) * (1.0f + i);
  for (int64_t n : {0, 1, 7, 8, 9, 17, 1000}) {
    long double ref = 0;
    for (int64_t i = 0; i < n; ++i) ref += static_cast<long double>(x[i]) * x[i];
    EXPECT_NEAR(kernels::SumOfSquares(x.data(), n), static_cast<double>(ref),
                1e-14 * static_cast<double>(ref))
        << n;
  }
  x[13] = std::numeric_limits<float>::infinity();
  EXPECT_TRUE(std::isinf(kernels::SumOfSquares(x.data(), 100)));
  x[13] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(std::isnan(kernels::SumOfSquares(x.data(), 100)));
  EXPECT_FALSE(std::isnan(kernels::SumOfSquares(x.data(), 13)));
  // The largest float squared is far inside double's range.
  std::vector<float> big(64, std::numeric_limits<float>::max());
  EXPECT_TRUE(std::isfinite(kernels::SumOfSquares(big.data(), 64)));
}

}  // namespace tandem::worker
