// The llama layers: finite-difference gradient checks of the embedding, head and tied head,
// and of the block (MHA, GQA, MQA) both in fp32 and against a double-precision reference; the RoPE
// and grouped-query attention kernels against double-precision references (HF's rotate_half
// formula, a naive multi-head attention, GQA as MHA on repeated keys and values); RMSNorm; causal
// masking; the split backward bit for bit; initialisation determinism and names; loss at init;
// partition invariance of a whole tiny model; the vectorised exp's error bound, the fast SwiGLU
// against its reference, and bit-identical results at any thread count; config validation naming
// the field; and a tiny model that learns a repeating pattern.
#include <cblas.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "tests/worker/grad_check.h"
#include "worker/model/kernels.h"
#include "worker/model/llama.h"
#include "worker/model/llama_kernels.h"
#include "worker/model/optimizer.h"
#include "worker/model/random.h"
#include "worker/model/simd.h"

namespace tandem::worker {
namespace {

// fp32 forward, central differences with step kEps: truncation error O(eps^2) ~ 1e-4
// relative; rounding error ~ 1e-7 |f| / eps. An element passes when
// |analytic - numeric| <= kRelTol * max(|a|, |n|) + kAbsTol (as gpt_layers_test.cc).
constexpr double kEps = 1e-2;
constexpr double kRelTol = 1e-2;
constexpr double kAbsTol = 3e-4;

// hd = kC / kNh = 4: two RoPE frequencies per head.
constexpr int64_t kB = 2, kT = 5, kC = 16, kNh = 4, kH = 24, kV = 11;

LlamaConfig TinyConfig(int64_t n_kv_head = 2, bool tied = false) {
  LlamaConfig cfg;
  cfg.n_layer = 2;
  cfg.n_head = kNh;
  cfg.n_kv_head = n_kv_head;
  cfg.d_model = kC;
  cfg.d_hidden = kH;
  cfg.seq_len = 6;
  cfg.vocab = kV;
  cfg.tie_embeddings = tied;
  return cfg;
}

using testing::ExpectBitIdenticalBackwards;
using testing::ExpectForwardWithoutSavingIsForwards;
using testing::ExpectRecomputedContextIsForwards;
using testing::Perturb;
using testing::RandomTensor;
using testing::RunSameForwards;
namespace simd = kernels::simd;

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

// d f / d x[i] of f(x) = sum(r * g(x)) for a double reference g, by central differences with a
// step that is an exact float, so only truncation error (O(step^2)) remains.
template <typename F>
double NumericGradient(Tensor& x, size_t i, const Tensor& r, F g) {
  const float saved = x[i];
  double f[2];
  for (int s = 0; s < 2; ++s) {
    x[i] = saved + (s == 0 ? 1e-2f : -1e-2f);
    const std::vector<double> o = g(x);
    f[s] = 0;
    for (size_t k = 0; k < o.size(); ++k) f[s] += r[k] * o[k];
  }
  x[i] = saved;
  return (f[0] - f[1]) / (static_cast<double>(saved + 1e-2f) - (saved - 1e-2f));
}

class LlamaLayersTest : public ::testing::Test {
 protected:
  void SetUp() override { openblas_set_num_threads(1); }
};

// ---- gradient checks of the layers

TEST_F(LlamaLayersTest, EmbeddingGradients) {
  LlamaEmbedding emb(TinyConfig(), 7);
  Perturb(emb, 1);
  // Repeated tokens on purpose (the scatter must add); T = 5 < seq_len = 6.
  IntTensor tokens({kB, kT}, {1, 2, 3, 1, 0, 10, 5, 5, 4, 1});
  MicroBatchData data;
  data.tokens = &tokens;
  GradCheck(emb, Tensor(), data, false);
}

TEST_F(LlamaLayersTest, HeadGradients) {
  for (bool tied : {false, true}) {
    SCOPED_TRACE(tied ? "tied" : "untied");
    LlamaHead head(TinyConfig(2, tied), 7);
    // The head's W is small at init (std 0.02): scale it up so the loss is far from uniform.
    Perturb(head, 4, 0.5);
    IntTensor targets = RandomTokens(kB, kT, kV, 5);
    MicroBatchData data;
    data.targets = &targets;
    data.loss_normalizer = 3 * kB * kT;  // as if 3 micro-batches
    GradCheck(head, RandomTensor({kB, kT, kC}, 6), data, true);
  }
}

// The split backward (I then W) computes exactly what B does, bit for bit: the same GEMMs on
// the same operands, split in time. Also: I frees what only it needed, W empties the context.
TEST_F(LlamaLayersTest, SplitBackwardIsBitIdenticalToFullBackward) {
  const LlamaConfig cfg = TinyConfig(/*n_kv_head=*/2, /*tied=*/false);
  IntTensor targets = RandomTokens(kB, kT, kV, 5);
  MicroBatchData data{nullptr, &targets, 2 * kB * kT};
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
    // forward (the attention probabilities, q, k, v and the MLP's pre-activations are gone).
    EXPECT_GT(b.Bytes(), 0u) << full.name();
    EXPECT_LT(b.Bytes(), saved + saved / 2) << full.name();
    ASSERT_TRUE(split.BackwardWeight(b).ok());
    EXPECT_EQ(b.Bytes(), 0u);
    std::vector<Parameter*> pa = full.Parameters(), pb = split.Parameters();
    ASSERT_EQ(pa.size(), pb.size());
    for (size_t i = 0; i < pa.size(); ++i) {
      EXPECT_EQ(pa[i]->grad.vec(), pb[i]->grad.vec()) << pa[i]->name;
      EXPECT_GT(*std::max_element(pa[i]->grad.vec().begin(), pa[i]->grad.vec().end()), 0.0f)
          << pa[i]->name << ": a zero gradient would make the comparison vacuous";
    }
    // W without I is an error, not a crash.
    SavedContext empty;
    EXPECT_FALSE(split.BackwardWeight(empty).ok()) << full.name();
  };
  LlamaBlock block_a(cfg, 0, 7), block_b(cfg, 0, 7);
  Perturb(block_a, 2);
  Perturb(block_b, 2);
  run(block_a, block_b, RandomTensor({kB, kT, kC}, 3), RandomTensor({kB, kT, kC}, 4));
  LlamaHead head_a(cfg, 7), head_b(cfg, 7);
  Perturb(head_a, 4, 0.5);
  Perturb(head_b, 4, 0.5);
  run(head_a, head_b, RandomTensor({kB, kT, kC}, 6), Tensor({1}, {0.75f}));
}

// Changing token tp of sequence 1 changes the block's outputs at (1, t >= tp) only: exactly
// unchanged before tp (masked probabilities are exact zeros) and in the other sequence.
// Selective recomputation (LlamaConfig::selective_recompute): the block keeps no attention
// probabilities, exactly NH T floats per token less, and its backward, B or I then W,
// recomputes them with the forward's kernel: the output, the input gradient and every
// parameter gradient are bit for bit those of the plain block.
TEST_F(LlamaLayersTest, SelectiveRecomputationKeepsLessAndIsBitIdentical) {
  const LlamaConfig plain_cfg = TinyConfig(/*n_kv_head=*/2);
  LlamaConfig selective_cfg = plain_cfg;
  selective_cfg.selective_recompute = true;
  const int64_t n = kB * kT, kvd = 2 * (kC / kNh);
  const Tensor x = RandomTensor({kB, kT, kC}, 3), dout = RandomTensor({kB, kT, kC}, 4);
  LlamaBlock plain(plain_cfg, 0, 7), full(selective_cfg, 0, 7), split(selective_cfg, 0, 7);
  SavedContext a, b, c;
  RunSameForwards(plain, a, full, b, split, c, x);
  if (HasFatalFailure()) return;
  // Per token (llama.h): 6 C + 2 KVD + 2 H + 2, and without selective NH T more.
  const size_t kept = static_cast<size_t>(n * (6 * kC + 2 * kvd + 2 * kH + 2)) * sizeof(float);
  EXPECT_EQ(b.Bytes(), kept);
  EXPECT_EQ(a.Bytes(), kept + static_cast<size_t>(n * kNh * kT) * sizeof(float));
  ExpectBitIdenticalBackwards(plain, a, full, b, split, c, dout);
}

// Full recomputation's RecomputeContext skips down_proj and the residual add but leaves
// exactly Forward's context, with and without selective recomputation (and GQA).
TEST_F(LlamaLayersTest, RecomputedContextIsTheForwardsBitForBit) {
  LlamaConfig cfg = TinyConfig(/*n_kv_head=*/2);
  for (bool selective : {false, true}) {
    cfg.selective_recompute = selective;
    LlamaBlock block(cfg, 0, 7);
    Perturb(block, 2);
    ExpectRecomputedContextIsForwards(block, RandomTensor({kB, kT, kC}, 3));
  }
}

// The forward of a micro-batch the program recomputes keeps nothing: a block's output is
// Forward's bit for bit (GQA), holding at most its larger half's intermediates: the
// attention's (x1, rms_1's output and statistics, q, k, v, the probabilities, the heads'
// output) or the MLP's (x1, rms_2's, gate, up and their product).
TEST_F(LlamaLayersTest, ForwardWithoutSavingIsTheForwardsOutputInLessMemory) {
  const LlamaConfig cfg = TinyConfig(/*n_kv_head=*/2);
  LlamaBlock block(cfg, 0, 7);
  Perturb(block, 2);
  const Tensor x = RandomTensor({kB, kT, kC}, 3);
  const auto [peak, context] = ExpectForwardWithoutSavingIsForwards(block, x);
  EXPECT_LT(peak, context);
  const size_t n = static_cast<size_t>(kB * kT);
  const size_t kvd = static_cast<size_t>(cfg.n_kv_head * (kC / kNh));
  const size_t attention =
      (n * (4 * kC + 1 + 2 * kvd) + static_cast<size_t>(kB * kNh * kT * kT)) * sizeof(float);
  const size_t mlp = n * (2 * kC + 1 + 3 * kH) * sizeof(float);
  EXPECT_EQ(peak, std::max(attention, mlp));
}

TEST_F(LlamaLayersTest, BlockIsCausal) {
  LlamaBlock block(TinyConfig(), 0, 7);
  Perturb(block, 2);
  const Tensor x = RandomTensor({kB, kT, kC}, 3);
  SavedContext ctx;
  Tensor base;
  ASSERT_TRUE(block.Forward(x, MicroBatchData{}, ctx, base).ok());
  for (int64_t tp = 0; tp < kT; ++tp) {
    Tensor x2 = x;
    for (int64_t j = 0; j < kC; ++j) x2[(kT + tp) * kC + j] += 0.5f * static_cast<float>(j);
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
        EXPECT_EQ(changed, bi == 1 && t >= tp) << "b " << bi << " t " << t << " tp " << tp;
      }
    }
  }
}

// ---- RMSNorm

TEST_F(LlamaLayersTest, RmsNormNormalisesEachRowAndMatchesFiniteDifferences) {
  const int64_t n = 3, c = 10;
  const float eps = 1e-5f;
  Tensor x = RandomTensor({n, c}, 31, 3.0);
  const Tensor gain = RandomTensor({c}, 32);
  Tensor ones({c}), y({n, c}), rstd({n});
  ones.Fill(1.0f);
  kernels::RmsNormForward(x.data(), ones.data(), y.data(), rstd.data(), n, c, eps);
  for (int64_t i = 0; i < n; ++i) {
    double ss = 0;
    for (int64_t j = 0; j < c; ++j) ss += static_cast<double>(y[i * c + j]) * y[i * c + j];
    EXPECT_NEAR(ss / c, 1.0, 1e-5) << "row " << i;
  }
  // Backward against the double reference y = x / sqrt(mean(x^2) + eps) * g.
  auto ref = [&](const Tensor& in) {
    std::vector<double> out(in.size());
    for (int64_t i = 0; i < n; ++i) {
      double ss = 0;
      for (int64_t j = 0; j < c; ++j) ss += static_cast<double>(in[i * c + j]) * in[i * c + j];
      const double s = 1.0 / std::sqrt(ss / c + eps);
      for (int64_t j = 0; j < c; ++j) out[i * c + j] = in[i * c + j] * s * gain[j];
    }
    return out;
  };
  kernels::RmsNormForward(x.data(), gain.data(), y.data(), rstd.data(), n, c, eps);
  const std::vector<double> expect = ref(x);
  for (size_t i = 0; i < y.size(); ++i) EXPECT_NEAR(y[i], expect[i], 1e-5) << i;
  const Tensor r = RandomTensor({n, c}, 33);
  Tensor dx({n, c}), dgain({c});
  kernels::RmsNormBackward(r.data(), x.data(), gain.data(), rstd.data(), dx.data(), dgain.data(), n,
                           c);
  for (size_t i = 0; i < x.size(); ++i) {
    const double numeric = NumericGradient(x, i, r, ref);
    EXPECT_NEAR(dx[i], numeric, 1e-3 * std::abs(numeric) + 1e-4) << i;
  }
}

// ---- RoPE

// HF's formulation in double: with cos = cat(c, c), sin = cat(s, s) over the head,
// out = x * cos + rotate_half(x) * sin, rotate_half(x) = cat(-x[half:], x[:half]).
template <typename Vec>  // Tensor or std::vector<double>
std::vector<double> NaiveRope(const Vec& x, int64_t b, int64_t t, int64_t nhx, int64_t hd,
                              double theta) {
  const int64_t half = hd / 2;
  std::vector<double> out(x.size());
  for (int64_t bi = 0; bi < b; ++bi) {
    for (int64_t p = 0; p < t; ++p) {
      for (int64_t h = 0; h < nhx; ++h) {
        const size_t base = static_cast<size_t>(((bi * t + p) * nhx + h) * hd);
        for (int64_t d = 0; d < hd; ++d) {
          const int64_t j = d % half;
          const double angle = static_cast<double>(p) * std::pow(theta, -2.0 * j / hd);
          const double rot = d < half ? -static_cast<double>(x[base + d + half])
                                      : static_cast<double>(x[base + d - half]);
          out[base + d] =
              static_cast<double>(x[base + d]) * std::cos(angle) + rot * std::sin(angle);
        }
      }
    }
  }
  return out;
}

// (T, head size, theta): T = 150 reaches angles where float32 rounding of the angle shows.
class RopeTest : public ::testing::TestWithParam<std::tuple<int64_t, int64_t, double>> {};

TEST_P(RopeTest, MatchesHfRotateHalfAndItsGradient) {
  // Plain variables, not a structured binding: lambdas below capture them (C++17).
  const int64_t t = std::get<0>(GetParam()), hd = std::get<1>(GetParam());
  const double theta = std::get<2>(GetParam());
  const int64_t b = 2, nhx = 3, half = hd / 2;
  Tensor cos({t, half}), sin({t, half});
  kernels::RopeTables(t, hd, theta, cos.data(), sin.data());
  Tensor x = RandomTensor({b, t, nhx * hd}, 41);
  Tensor y = x;
  kernels::RopeForward(y.data(), cos.data(), sin.data(), b, t, nhx, hd);
  const std::vector<double> ref = NaiveRope(x, b, t, nhx, hd, theta);
  // The float32 angle p * inv_freq is off by up to ~1 ulp of p (1e-5 rad at p = 150).
  for (size_t i = 0; i < y.size(); ++i) EXPECT_NEAR(y[i], ref[i], 5e-5) << i;
  // f = sum(r * rope(x)): d f / d x = RopeBackward(r), against central differences.
  const Tensor r = RandomTensor({b, t, nhx * hd}, 42);
  Tensor dx = r;
  kernels::RopeBackward(dx.data(), cos.data(), sin.data(), b, t, nhx, hd);
  auto g = [&](const Tensor& in) { return NaiveRope(in, b, t, nhx, hd, theta); };
  const size_t stride = std::max<size_t>(1, x.size() / 256);  // a sample keeps T = 150 fast
  for (size_t i = 0; i < x.size(); i += stride) {
    const double numeric = NumericGradient(x, i, r, g);
    EXPECT_NEAR(dx[i], numeric, 1e-4 * std::abs(numeric) + 5e-5) << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, RopeTest,
                         ::testing::Values(std::tuple<int64_t, int64_t, double>{6, 4, 10000.0},
                                           std::tuple<int64_t, int64_t, double>{9, 8, 500000.0},
                                           std::tuple<int64_t, int64_t, double>{150, 16, 10000.0},
                                           std::tuple<int64_t, int64_t, double>{5, 2, 10.0}));

TEST_F(LlamaLayersTest, RopeIsTheIdentityAtPositionZeroAndPreservesPairNorms) {
  const int64_t b = 2, t = 7, nhx = 2, hd = 8, half = hd / 2;
  Tensor cos({t, half}), sin({t, half});
  kernels::RopeTables(t, hd, 10000.0, cos.data(), sin.data());
  for (int64_t j = 0; j < half; ++j) {
    EXPECT_EQ(cos[j], 1.0f);
    EXPECT_EQ(sin[j], 0.0f);
  }
  const Tensor x = RandomTensor({b, t, nhx * hd}, 51);
  Tensor y = x;
  kernels::RopeForward(y.data(), cos.data(), sin.data(), b, t, nhx, hd);
  for (int64_t bi = 0; bi < b; ++bi) {
    for (int64_t p = 0; p < t; ++p) {
      for (int64_t h = 0; h < nhx; ++h) {
        const size_t base = static_cast<size_t>(((bi * t + p) * nhx + h) * hd);
        for (int64_t j = 0; j < half; ++j) {
          const size_t lo = base + j, hi = base + j + half;
          if (p == 0) {
            EXPECT_EQ(y[lo], x[lo]);
            EXPECT_EQ(y[hi], x[hi]);
          }
          const double before = std::hypot(x[lo], x[hi]), after = std::hypot(y[lo], y[hi]);
          EXPECT_NEAR(after, before, 1e-6 * before + 1e-7) << "p " << p << " j " << j;
        }
      }
    }
  }
  // The rotation by -angle undoes it.
  kernels::RopeBackward(y.data(), cos.data(), sin.data(), b, t, nhx, hd);
  for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(y[i], x[i], 1e-6) << i;
}

// ---- grouped-query attention

// Naive causal GQA in double: out (B, T, NH*hd) from q (B, T, NH*hd), k, v (B, T, KV*hd).
template <typename Vec>  // Tensor or std::vector<double>
std::vector<double> NaiveGqa(const Vec& q, const Vec& k, const Vec& v, int64_t b, int64_t t,
                             int64_t nh, int64_t kv, int64_t hd) {
  const int64_t qd = nh * hd, kd = kv * hd;
  std::vector<double> out(static_cast<size_t>(b * t * qd));
  for (int64_t bi = 0; bi < b; ++bi) {
    for (int64_t h = 0; h < nh; ++h) {
      const int64_t g = h / (nh / kv);
      for (int64_t i = 0; i < t; ++i) {
        std::vector<double> s(static_cast<size_t>(i + 1));
        double m = -1e300;
        for (int64_t j = 0; j <= i; ++j) {
          double dot = 0;
          for (int64_t d = 0; d < hd; ++d) {
            dot += static_cast<double>(q[(bi * t + i) * qd + h * hd + d]) *
                   static_cast<double>(k[(bi * t + j) * kd + g * hd + d]);
          }
          s[j] = dot / std::sqrt(static_cast<double>(hd));
          m = std::max(m, s[j]);
        }
        double z = 0;
        for (double& e : s) z += (e = std::exp(e - m));
        for (int64_t d = 0; d < hd; ++d) {
          double y = 0;
          for (int64_t j = 0; j <= i; ++j) {
            y += s[j] / z * static_cast<double>(v[(bi * t + j) * kd + g * hd + d]);
          }
          out[(bi * t + i) * qd + h * hd + d] = y;
        }
      }
    }
  }
  return out;
}

// (KV, T, stride of the checked elements), NH = 4, hd = 4: T = 13 is one query tile; T = 150
// is three tiles of 64, the last partial.
class GqaAttentionTest : public ::testing::TestWithParam<std::tuple<int64_t, int64_t, size_t>> {};

TEST_P(GqaAttentionTest, MatchesNaiveReferenceAndFiniteDifferences) {
  openblas_set_num_threads(1);
  const int64_t kv = std::get<0>(GetParam()), t = std::get<1>(GetParam());
  const size_t stride = std::get<2>(GetParam());
  const int64_t b = 2, nh = 4, hd = 4, qd = nh * hd, kd = kv * hd;
  Tensor q = RandomTensor({b, t, qd}, 61), k = RandomTensor({b, t, kd}, 62);
  Tensor v = RandomTensor({b, t, kd}, 63);
  Tensor att({b, nh, t, t}), out({b, t, qd});
  kernels::GqaCausalAttentionForward(q.data(), k.data(), v.data(), att.data(), out.data(), b, t, nh,
                                     kv, hd);
  const std::vector<double> ref = NaiveGqa(q, k, v, b, t, nh, kv, hd);
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
  // Backward against central differences of the double reference on f = sum(r * out); the
  // kv gradients sum over the group's query heads.
  const Tensor r = RandomTensor({b, t, qd}, 64);
  Tensor dq({b, t, qd}), dk({b, t, kd}), dv({b, t, kd});
  kernels::GqaCausalAttentionBackward(r.data(), q.data(), k.data(), v.data(), att.data(), dq.data(),
                                      dk.data(), dv.data(), b, t, nh, kv, hd);
  for (auto [x, dx, what] : {std::tuple{&q, &dq, "q"}, {&k, &dk, "k"}, {&v, &dv, "v"}}) {
    auto g = [&](const Tensor&) { return NaiveGqa(q, k, v, b, t, nh, kv, hd); };
    for (size_t i = 0; i < x->size(); i += stride) {  // a sample keeps the test fast
      const double numeric = NumericGradient(*x, i, r, g);
      EXPECT_NEAR((*dx)[i], numeric, 1e-3 * std::abs(numeric) + 2e-4) << what << "[" << i << "]";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(KvHeadsAndTiles, GqaAttentionTest,
                         ::testing::Values(std::tuple<int64_t, int64_t, size_t>{4, 13, 3},
                                           std::tuple<int64_t, int64_t, size_t>{2, 13, 3},
                                           std::tuple<int64_t, int64_t, size_t>{1, 13, 3},
                                           std::tuple<int64_t, int64_t, size_t>{2, 150, 97},
                                           std::tuple<int64_t, int64_t, size_t>{1, 150, 97}));

// Plain multi-head causal attention in double, each head with its own keys and values: the
// textbook formula, without GQA's head mapping.
std::vector<double> NaiveMha(const Tensor& q, const Tensor& k, const Tensor& v, int64_t b,
                             int64_t t, int64_t nh, int64_t hd) {
  const int64_t c = nh * hd;
  std::vector<double> out(static_cast<size_t>(b * t * c), 0.0);
  for (int64_t bi = 0; bi < b; ++bi) {
    for (int64_t h = 0; h < nh; ++h) {
      for (int64_t i = 0; i < t; ++i) {
        auto at = [&](const Tensor& x, int64_t row, int64_t d) {
          return static_cast<double>(x[(bi * t + row) * c + h * hd + d]);
        };
        std::vector<double> w(static_cast<size_t>(i + 1));
        double z = 0;
        for (int64_t j = 0; j <= i; ++j) {
          double dot = 0;
          for (int64_t d = 0; d < hd; ++d) dot += at(q, i, d) * at(k, j, d);
          z += (w[j] = std::exp(dot / std::sqrt(static_cast<double>(hd))));
        }
        for (int64_t j = 0; j <= i; ++j) {
          for (int64_t d = 0; d < hd; ++d) {
            out[(bi * t + i) * c + h * hd + d] += w[j] / z * at(v, j, d);
          }
        }
      }
    }
  }
  return out;
}

TEST_F(LlamaLayersTest, WithAsManyKvHeadsAsHeadsAttentionIsPlainMultiHead) {
  const int64_t b = 2, t = 9, nh = 4, hd = 4, c = nh * hd;
  const Tensor q = RandomTensor({b, t, c}, 71), k = RandomTensor({b, t, c}, 72);
  const Tensor v = RandomTensor({b, t, c}, 73);
  Tensor att({b, nh, t, t}), out({b, t, c});
  kernels::GqaCausalAttentionForward(q.data(), k.data(), v.data(), att.data(), out.data(), b, t, nh,
                                     nh, hd);
  const std::vector<double> ref = NaiveMha(q, k, v, b, t, nh, hd);
  for (size_t i = 0; i < out.size(); ++i) EXPECT_NEAR(out[i], ref[i], 2e-5) << i;
  // And gpt's fused-qkv kernel on the same q | k | v agrees.
  Tensor qkv({b, t, 3 * c}), gatt({b, nh, t, t}), gout({b, t, c});
  for (int64_t row = 0; row < b * t; ++row) {
    std::copy_n(q.data() + row * c, c, qkv.data() + row * 3 * c);
    std::copy_n(k.data() + row * c, c, qkv.data() + row * 3 * c + c);
    std::copy_n(v.data() + row * c, c, qkv.data() + row * 3 * c + 2 * c);
  }
  kernels::CausalAttentionForward(qkv.data(), gatt.data(), gout.data(), b, t, c, nh);
  for (size_t i = 0; i < out.size(); ++i) EXPECT_NEAR(out[i], gout[i], 1e-5) << i;
}

// GQA is MHA on keys and values repeated per query head (HF's repeat_kv): the same output, and
// each kv head's gradient is the sum of its repeats'.
TEST_F(LlamaLayersTest, GqaEqualsMultiHeadOnRepeatedKeysAndValues) {
  for (int64_t kv : {2, 1}) {
    SCOPED_TRACE(kv);
    const int64_t b = 2, t = 11, nh = 4, hd = 4, qd = nh * hd, kd = kv * hd, group = nh / kv;
    const Tensor q = RandomTensor({b, t, qd}, 81), k = RandomTensor({b, t, kd}, 82);
    const Tensor v = RandomTensor({b, t, kd}, 83), dout = RandomTensor({b, t, qd}, 84);
    Tensor kr({b, t, qd}), vr({b, t, qd});  // head h of kr is kv head h / group of k
    for (int64_t row = 0; row < b * t; ++row) {
      for (int64_t h = 0; h < nh; ++h) {
        std::copy_n(k.data() + row * kd + (h / group) * hd, hd, kr.data() + row * qd + h * hd);
        std::copy_n(v.data() + row * kd + (h / group) * hd, hd, vr.data() + row * qd + h * hd);
      }
    }
    Tensor att({b, nh, t, t}), out({b, t, qd}), att_r({b, nh, t, t}), out_r({b, t, qd});
    kernels::GqaCausalAttentionForward(q.data(), k.data(), v.data(), att.data(), out.data(), b, t,
                                       nh, kv, hd);
    kernels::GqaCausalAttentionForward(q.data(), kr.data(), vr.data(), att_r.data(), out_r.data(),
                                       b, t, nh, nh, hd);
    for (size_t i = 0; i < out.size(); ++i) EXPECT_NEAR(out[i], out_r[i], 1e-6) << i;
    Tensor dq({b, t, qd}), dk({b, t, kd}), dv({b, t, kd});
    Tensor dq_r({b, t, qd}), dk_r({b, t, qd}), dv_r({b, t, qd});
    kernels::GqaCausalAttentionBackward(dout.data(), q.data(), k.data(), v.data(), att.data(),
                                        dq.data(), dk.data(), dv.data(), b, t, nh, kv, hd);
    kernels::GqaCausalAttentionBackward(dout.data(), q.data(), kr.data(), vr.data(), att_r.data(),
                                        dq_r.data(), dk_r.data(), dv_r.data(), b, t, nh, nh, hd);
    for (size_t i = 0; i < dq.size(); ++i) EXPECT_NEAR(dq[i], dq_r[i], 1e-5) << i;
    for (int64_t row = 0; row < b * t; ++row) {
      for (int64_t g = 0; g < kv; ++g) {
        for (int64_t d = 0; d < hd; ++d) {
          double sk = 0, sv = 0;
          for (int64_t h = g * group; h < (g + 1) * group; ++h) {
            sk += dk_r[row * qd + h * hd + d];
            sv += dv_r[row * qd + h * hd + d];
          }
          EXPECT_NEAR(dk[row * kd + g * hd + d], sk, 1e-5) << "row " << row;
          EXPECT_NEAR(dv[row * kd + g * hd + d], sv, 1e-5) << "row " << row;
        }
      }
    }
  }
}

// ---- the block against a double-precision reference

// The block in double, from the same (float) parameter values: rms_1, q/k/v projections, RoPE
// (HF's formula), GQA, o_proj and the residual; rms_2, SwiGLU, down_proj and the residual.
// w holds the parameters in LlamaBlock::Parameters() order.
std::vector<double> NaiveBlock(const std::vector<double>& x,
                               const std::vector<std::vector<double>>& w, const LlamaConfig& cfg,
                               int64_t b, int64_t t) {
  const int64_t c = cfg.d_model, nh = cfg.n_head, kv = cfg.n_kv_head, h = cfg.d_hidden;
  const int64_t hd = c / nh, kvd = kv * hd, n = b * t;
  auto rms = [&](const std::vector<double>& in, const std::vector<double>& g) {
    std::vector<double> out(in.size());
    for (int64_t i = 0; i < n; ++i) {
      double ss = 0;
      for (int64_t j = 0; j < c; ++j) ss += in[i * c + j] * in[i * c + j];
      const double s = 1.0 / std::sqrt(ss / static_cast<double>(c) + cfg.rms_eps);
      for (int64_t j = 0; j < c; ++j) out[i * c + j] = in[i * c + j] * s * g[j];
    }
    return out;
  };
  auto linear = [&](const std::vector<double>& in, const std::vector<double>& wt, int64_t ic,
                    int64_t oc) {  // in (N, ic), wt (oc, ic)
    std::vector<double> out(static_cast<size_t>(n * oc), 0.0);
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t o = 0; o < oc; ++o) {
        double acc = 0;
        for (int64_t j = 0; j < ic; ++j) acc += in[i * ic + j] * wt[o * ic + j];
        out[i * oc + o] = acc;
      }
    }
    return out;
  };
  const std::vector<double> xn1 = rms(x, w[0]);
  const std::vector<double> q = NaiveRope(linear(xn1, w[1], c, c), b, t, nh, hd, cfg.rope_theta);
  const std::vector<double> k = NaiveRope(linear(xn1, w[2], c, kvd), b, t, kv, hd, cfg.rope_theta);
  const std::vector<double> v = linear(xn1, w[3], c, kvd);
  std::vector<double> x1 = linear(NaiveGqa(q, k, v, b, t, nh, kv, hd), w[4], c, c);
  for (size_t i = 0; i < x1.size(); ++i) x1[i] += x[i];
  const std::vector<double> xn2 = rms(x1, w[5]);
  const std::vector<double> gate = linear(xn2, w[6], c, h), up = linear(xn2, w[7], c, h);
  std::vector<double> act(gate.size());
  for (size_t i = 0; i < act.size(); ++i) act[i] = gate[i] / (1.0 + std::exp(-gate[i])) * up[i];
  std::vector<double> out = linear(act, w[8], h, c);
  for (size_t i = 0; i < out.size(); ++i) out[i] += x1[i];
  return out;
}

// Every parameter and the input of a block with multi-head (KV = NH), grouped (KV = 2) and
// multi-query (KV = 1) attention: the fp32 layer's output against the double reference, and
// its analytic gradients against central differences of the reference (step 1e-4 in double:
// truncation ~1e-8, no rounding noise to speak of), so the bound only has to cover the fp32
// layer's own error: 1e-3 relative + 1e-4 absolute.
class LlamaBlockGradientsTest : public ::testing::TestWithParam<int64_t> {};

TEST_P(LlamaBlockGradientsTest, MatchDoubleReferenceAndItsFiniteDifferences) {
  openblas_set_num_threads(1);
  const LlamaConfig cfg = TinyConfig(GetParam());
  LlamaBlock block(cfg, 0, 7);
  Perturb(block, 2);
  const Tensor x = RandomTensor({kB, kT, kC}, 3), r = RandomTensor({kB, kT, kC}, 99);
  SavedContext ctx;
  Tensor out, dx;
  for (Parameter* p : block.Parameters()) p->grad.Fill(0.0f);
  ASSERT_TRUE(block.Forward(x, MicroBatchData{}, ctx, out).ok());
  ASSERT_TRUE(block.Backward(r, ctx, dx).ok());

  std::vector<double> xd(x.vec().begin(), x.vec().end());
  std::vector<std::vector<double>> w;
  for (Parameter* p : block.Parameters())
    w.emplace_back(p->value.vec().begin(), p->value.vec().end());
  const std::vector<double> ref = NaiveBlock(xd, w, cfg, kB, kT);
  for (size_t i = 0; i < out.size(); ++i) {
    EXPECT_NEAR(out[i], ref[i], 1e-5 * std::max(1.0, std::abs(ref[i]))) << "out[" << i << "]";
  }
  auto numeric = [&](double& e) {
    const double saved = e, step = 1e-4;
    double f[2];
    for (int s = 0; s < 2; ++s) {
      e = saved + (s == 0 ? step : -step);
      const std::vector<double> o = NaiveBlock(xd, w, cfg, kB, kT);
      f[s] = 0;
      for (size_t k = 0; k < o.size(); ++k) f[s] += r[k] * o[k];
    }
    e = saved;
    return (f[0] - f[1]) / (2 * step);
  };
  auto expect_close = [](double analytic, double num, const std::string& what) {
    EXPECT_NEAR(analytic, num, 1e-3 * std::max(std::abs(analytic), std::abs(num)) + 1e-4) << what;
  };
  ASSERT_EQ(dx.shape(), x.shape());
  for (size_t i = 0; i < xd.size(); ++i) {
    expect_close(dx[i], numeric(xd[i]), "input[" + std::to_string(i) + "]");
  }
  const std::vector<Parameter*> params = block.Parameters();
  for (size_t pi = 0; pi < params.size(); ++pi) {
    for (size_t i = 0; i < w[pi].size(); ++i) {
      expect_close(params[pi]->grad[i], numeric(w[pi][i]),
                   params[pi]->name + "[" + std::to_string(i) + "]");
    }
  }
}

// The same through the shared fp32 harness (grad_check.h), as the other layers. Its numeric
// gradients carry fp32 rounding noise of ~1e-7 |out| sqrt(#outputs) / eps: for the block's 160
// outputs of magnitude ~3 that is up to ~1e-3 at eps = 1e-2 (measured: it shrinks as eps grows
// and grows as eps shrinks, while the analytic value stays put), hence the looser absolute
// bound here; the double-reference test above is the tight check.
TEST_P(LlamaBlockGradientsTest, MatchFp32FiniteDifferences) {
  openblas_set_num_threads(1);
  LlamaBlock block(TinyConfig(GetParam()), 0, 7);
  Perturb(block, 2);
  testing::GradCheck(block, RandomTensor({kB, kT, kC}, 3), MicroBatchData{}, {kB, kT, kC}, true,
                     {kEps, 2e-2, 2e-3});
}

INSTANTIATE_TEST_SUITE_P(KvHeads, LlamaBlockGradientsTest, ::testing::Values(4, 2, 1));

// ---- the vectorised exp, the fast SwiGLU and the threaded kernels

// simd::Exp against std::exp (in double) on every float kExpMin + i 2^-12 up to kExpMax: the
// softmax feeds it [kExpMin, 0] (scores minus their row maximum), the sigmoid all of it.
// Relative error below 1e-7 (measured: 7.9e-8, under one ulp of 1, 1.19e-7). Outside the range
// it clamps: exp(kExpMin) ~ 1.2e-38 (normal, not 0) below, a finite exp(kExpMax) above.
TEST(SimdExpTest, RelativeErrorBelow1e7OnTheClampedRangeAndClampsOutsideIt) {
  const float step = 1.0f / 4096;
  double worst = 0.0;
  float worst_x = 0.0f;
  int64_t checked = 0;
  for (int64_t i = 0;; i += simd::kLanes) {
    simd::F4 x;
    for (int64_t k = 0; k < simd::kLanes; ++k) {
      x[k] = simd::kExpMin + static_cast<float>(i + k) * step;
    }
    const simd::F4 e = simd::Exp(x);
    for (int64_t k = 0; k < simd::kLanes; ++k) {
      if (x[k] > simd::kExpMax) continue;
      const double ref = std::exp(static_cast<double>(x[k]));
      const double rel = std::abs(static_cast<double>(e[k]) - ref) / ref;
      if (rel > worst) worst = rel, worst_x = x[k];
      ++checked;
    }
    if (x[simd::kLanes - 1] > simd::kExpMax) break;
  }
  EXPECT_GT(checked, 700000);
  EXPECT_LT(worst, 1e-7) << "at x = " << worst_x;
  const simd::F4 out = simd::Exp(simd::F4{-1000.0f, 1000.0f, -88.0f, NAN});
  EXPECT_EQ(out[0], simd::Exp(simd::Splat(simd::kExpMin))[0]);
  EXPECT_GT(out[0], 0.0f);
  EXPECT_TRUE(std::isfinite(out[1]));
  EXPECT_EQ(out[2], out[0]);
  EXPECT_TRUE(std::isnan(out[3]));
}

// The fast SwiGLU against the scalar std::exp reference, on gates across [-30, 30] and a count
// that leaves a tail of 3 (the zero-padded vector): 1e-6 relative on the output and dup, and
// on dgate relative to the size of its terms (silu' crosses 0 near a = -1.28, where its two
// terms cancel). The backward's act is bit for bit the forward's output.
TEST(SwiGluFastTest, MatchesTheReferenceAndRecomputesTheForwardExactly) {
  openblas_set_num_threads(1);
  const int64_t count = 4099;
  Tensor gate = RandomTensor({count}, 71, 4.0), up = RandomTensor({count}, 72);
  const Tensor dout = RandomTensor({count}, 73);
  for (int64_t i = 0; i < count; i += 7) gate[i] = -30.0f + 60.0f * i / count;
  Tensor ref({count}), fast({count}), act({count});
  kernels::SwiGluForward(gate.data(), up.data(), ref.data(), count);
  kernels::SwiGluForwardFast(gate.data(), up.data(), fast.data(), count);
  for (int64_t i = 0; i < count; ++i) {
    EXPECT_NEAR(fast[i], ref[i], 1e-6 * std::abs(ref[i]) + 1e-30) << "a = " << gate[i];
  }
  // Backward into non-zero gradients (they accumulate).
  Tensor dg_ref = RandomTensor({count}, 74), du_ref = RandomTensor({count}, 75);
  Tensor dg_fast = dg_ref, du_fast = du_ref, dg_null = dg_ref, du_null = du_ref;
  kernels::SwiGluBackward(gate.data(), up.data(), dout.data(), dg_ref.data(), du_ref.data(), count);
  kernels::SwiGluBackwardFast(gate.data(), up.data(), dout.data(), act.data(), dg_fast.data(),
                              du_fast.data(), count);
  kernels::SwiGluBackwardFast(gate.data(), up.data(), dout.data(), nullptr, dg_null.data(),
                              du_null.data(), count);
  EXPECT_TRUE(act.vec() == fast.vec()) << "act differs from SwiGluForwardFast";
  EXPECT_TRUE(dg_null.vec() == dg_fast.vec() && du_null.vec() == du_fast.vec());
  for (int64_t i = 0; i < count; ++i) {
    const double a = gate[i], s = 1.0 / (1.0 + std::exp(-a));
    const double terms = std::abs(dout[i] * up[i]) * s * (1.0 + std::abs(a) * (1.0 - s));
    const double dg0 = dg_ref[i] - dout[i] * up[i] * s * (1.0 + a * (1.0 - s));  // the start
    EXPECT_NEAR(dg_fast[i], dg_ref[i], 1e-6 * (terms + std::abs(dg0)) + 1e-30) << "a = " << a;
    const double du0 = du_ref[i] - dout[i] * a * s;
    EXPECT_NEAR(du_fast[i], du_ref[i], 1e-6 * (std::abs(dout[i] * a * s) + std::abs(du0)) + 1e-30)
        << "a = " << a;
  }
}

// ParallelFor's parts: consecutive, covering [0, count) exactly once, at most `threads` of
// them, each at least min_per_thread long unless there is only one.
TEST(ParallelForTest, SplitsTheRangeIntoConsecutiveParts) {
  for (int threads : {1, 2, 3, 8}) {
    for (int64_t count : {0, 1, 5, 100, 1001}) {
      for (int64_t min_per_thread : {1, 7, 400}) {
        std::mutex mu;
        std::vector<std::pair<int64_t, int64_t>> parts;
        kernels::ParallelFor(threads, count, min_per_thread, [&](int64_t b, int64_t e) {
          std::lock_guard<std::mutex> lock(mu);
          parts.emplace_back(b, e);
        });
        SCOPED_TRACE(::testing::Message()
                     << threads << " threads, count " << count << ", min " << min_per_thread);
        if (count == 0) {
          EXPECT_TRUE(parts.empty());
          continue;
        }
        std::sort(parts.begin(), parts.end());
        ASSERT_FALSE(parts.empty());
        EXPECT_LE(parts.size(), static_cast<size_t>(threads));
        int64_t next = 0;
        for (auto [b, e] : parts) {
          EXPECT_EQ(b, next);
          EXPECT_LT(b, e);
          if (parts.size() > 1) {
            EXPECT_GE(e - b, min_per_thread);
          }
          next = e;
        }
        EXPECT_EQ(next, count);
      }
    }
  }
}

// Determinism over threads, kernel by kernel: each threaded kernel gives bit-identical results
// at 1, 2 and 3 threads (the attention's GEMMs run on their calling thread either way). The
// sizes make each split its work: 512 rows of 256, 256 K SwiGLU elements, 16 (batch, head) and
// 4 (batch, kv head) attention tasks over four query tiles.
TEST(LlamaThreadsTest, ThreadedKernelsAreBitIdenticalAtAnyThreadCount) {
  const int64_t b = 2, t = 256, nh = 8, kv = 2, hd = 32, c = nh * hd, n = b * t, h = 2 * c;
  const Tensor x = RandomTensor({n, c}, 81), gain = RandomTensor({c}, 82);
  const Tensor dy = RandomTensor({n, c}, 83), gate = RandomTensor({n, h}, 84, 3.0);
  const Tensor up = RandomTensor({n, h}, 85), dact = RandomTensor({n, h}, 86);
  const Tensor q = RandomTensor({n, c}, 87), k = RandomTensor({n, kv * hd}, 88);
  const Tensor v = RandomTensor({n, kv * hd}, 89);
  Tensor cos({t, hd / 2}), sin({t, hd / 2});
  kernels::RopeTables(t, hd, 10000.0, cos.data(), sin.data());
  auto run = [&](int threads) {
    openblas_set_num_threads(threads);
    EXPECT_EQ(kernels::KernelThreads(), threads);
    std::vector<Tensor> r;
    Tensor xn({n, c}), rstd({n}), dx({n, c}), dgain({c}), sum({n, c});
    kernels::RmsNormForward(x.data(), gain.data(), xn.data(), rstd.data(), n, c, 1e-5f);
    kernels::RmsNormBackward(dy.data(), x.data(), gain.data(), rstd.data(), dx.data(), dgain.data(),
                             n, c);
    kernels::Add(x.data(), dy.data(), sum.data(), n * c);
    Tensor rq = q;
    kernels::RopeForward(rq.data(), cos.data(), sin.data(), b, t, nh, hd);
    Tensor drq = rq;
    kernels::RopeBackward(drq.data(), cos.data(), sin.data(), b, t, nh, hd);
    Tensor act({n, h}), act2({n, h}), dgate({n, h}), dup({n, h});
    kernels::SwiGluForwardFast(gate.data(), up.data(), act.data(), n * h);
    kernels::SwiGluBackwardFast(gate.data(), up.data(), dact.data(), act2.data(), dgate.data(),
                                dup.data(), n * h);
    Tensor att({b, nh, t, t}), y({n, c}), dq({n, c}), dk({n, kv * hd}), dv({n, kv * hd});
    kernels::GqaCausalAttentionForward(rq.data(), k.data(), v.data(), att.data(), y.data(), b, t,
                                       nh, kv, hd);
    kernels::GqaCausalAttentionBackward(dy.data(), rq.data(), k.data(), v.data(), att.data(),
                                        dq.data(), dk.data(), dv.data(), b, t, nh, kv, hd);
    for (Tensor* p : {&xn, &rstd, &dx, &dgain, &sum, &rq, &drq, &act, &act2, &dgate, &dup, &att, &y,
                      &dq, &dk, &dv}) {
      r.push_back(std::move(*p));
    }
    return r;
  };
  const char* names[] = {"rms xn", "rms rstd", "rms dx", "rms dgain", "add", "rope",
                         "rope'",  "swiglu",   "act",    "dgate",     "dup", "att",
                         "y",      "dq",       "dk",     "dv"};
  const std::vector<Tensor> one = run(1);
  for (int threads : {2, 3}) {
    const std::vector<Tensor> r = run(threads);
    ASSERT_EQ(r.size(), one.size());
    for (size_t i = 0; i < r.size(); ++i) {
      EXPECT_TRUE(r[i].vec() == one[i].vec()) << names[i] << " at " << threads << " threads";
    }
  }
  openblas_set_num_threads(1);
}

// The whole block, output, input gradient and parameter gradients, full and split backward,
// bit-identical at 1, 2 and 3 threads, its GEMMs included (split by output rows, OpenBLAS on
// each thread alone). T = 150 and 300 rows: parts of 64 rows and a partial one, three query
// tiles. (OpenBLAS's own multi-threaded GEMMs are not invariant: at 3 threads, or a weight
// gradient over 600 rows, their last bits differ from 1 thread's.)
TEST(LlamaThreadsTest, BlockIsBitIdenticalAtAnyThreadCount) {
  LlamaConfig cfg;
  cfg.n_layer = 2;
  cfg.n_head = 8;
  cfg.n_kv_head = 2;
  cfg.d_model = 256;
  cfg.d_hidden = 512;
  cfg.seq_len = 150;
  cfg.vocab = 11;
  const int64_t b = 2, t = 150;
  const Tensor x = RandomTensor({b, t, cfg.d_model}, 81);
  const Tensor dout = RandomTensor({b, t, cfg.d_model}, 82, 0.01);
  struct Result {
    std::vector<float> out, din;
    std::vector<std::vector<float>> grads;
  };
  auto run = [&](int threads, bool split) {
    openblas_set_num_threads(threads);
    LlamaBlock block(cfg, 0, 7);
    Perturb(block, 2, 0.02);
    SavedContext ctx;
    Tensor out, din;
    EXPECT_TRUE(block.Forward(x, MicroBatchData{}, ctx, out).ok());
    if (split) {
      EXPECT_TRUE(block.BackwardInput(dout, ctx, din).ok());
      EXPECT_TRUE(block.BackwardWeight(ctx).ok());
    } else {
      EXPECT_TRUE(block.Backward(dout, ctx, din).ok());
    }
    Result r{out.values(), din.values(), {}};
    for (Parameter* p : block.Parameters()) r.grads.push_back(p->grad.values());
    return r;
  };
  const Result one = run(1, false);
  for (int threads : {1, 2, 3}) {
    for (bool split : {false, true}) {
      SCOPED_TRACE(::testing::Message()
                   << threads << " threads, " << (split ? "split backward" : "full backward"));
      const Result r = run(threads, split);
      EXPECT_TRUE(r.out == one.out) << "output";
      EXPECT_TRUE(r.din == one.din) << "input gradient";
      ASSERT_EQ(r.grads.size(), one.grads.size());
      for (size_t i = 0; i < r.grads.size(); ++i) EXPECT_TRUE(r.grads[i] == one.grads[i]) << i;
    }
  }
  openblas_set_num_threads(1);
}

// ---- initialisation and names

std::map<std::string, std::vector<Tensor>> ParamsByName(
    const std::vector<std::unique_ptr<Layer>>& layers) {
  std::map<std::string, std::vector<Tensor>> m;
  for (const auto& l : layers) {
    for (Parameter* p : l->Parameters()) m[p->name].push_back(p->value);
  }
  return m;
}

TEST_F(LlamaLayersTest, InitIsIndependentOfTheStageRangeAndTiedCopiesAreIdentical) {
  const LlamaConfig cfg = TinyConfig(2, /*tied=*/true);
  auto whole = BuildLlamaLayers(cfg, 42, 0, 4);
  ASSERT_TRUE(whole.ok()) << whole.status();
  const auto all = ParamsByName(*whole);
  for (auto [begin, end] : {std::pair{0, 2}, {2, 4}, {1, 2}, {3, 4}}) {
    auto part = BuildLlamaLayers(cfg, 42, begin, end);
    ASSERT_TRUE(part.ok());
    for (const auto& [name, values] : ParamsByName(*part)) {
      ASSERT_TRUE(all.count(name)) << name;
      for (const Tensor& v : values) EXPECT_EQ(v.vec(), all.at(name)[0].vec()) << name;
    }
  }
  const std::string wte = "model.embed_tokens.weight";
  ASSERT_EQ(all.at(wte).size(), 2u);
  EXPECT_EQ(all.at(wte)[0].vec(), all.at(wte)[1].vec());
  for (const auto& l : *whole) {
    for (Parameter* p : l->Parameters()) EXPECT_EQ(p->tied, p->name == wte) << p->name;
  }
  auto other = BuildLlamaLayers(cfg, 43, 0, 1);
  EXPECT_NE((*other)[0]->Parameters()[0]->value.vec(), all.at(wte)[0].vec());
  auto untied = BuildLlamaLayers(TinyConfig(2, false), 42, 0, 4);
  const auto u = ParamsByName(*untied);
  EXPECT_EQ(u.at(wte).size(), 1u);
  EXPECT_NE(u.at("lm_head.weight")[0].vec(), u.at(wte)[0].vec());
  for (const auto& l : *untied) {
    for (Parameter* p : l->Parameters()) EXPECT_FALSE(p->tied) << p->name;
  }
}

TEST_F(LlamaLayersTest, ParameterNamesShapesDecayAndInit) {
  LlamaConfig cfg = TinyConfig(2, false);
  cfg.n_layer = 8;  // residual std 0.02 / sqrt(16) = 0.005
  cfg.d_model = 64;
  cfg.n_head = 4;
  cfg.n_kv_head = 2;  // KVD = 2 * 16 = 32
  cfg.d_hidden = 96;
  auto layers = BuildLlamaLayers(cfg, 5, 0, 10);
  ASSERT_TRUE(layers.ok()) << layers.status();
  std::vector<std::string> names;
  std::vector<std::vector<int64_t>> shapes;
  for (const auto& l : *layers) {
    for (Parameter* p : l->Parameters()) {
      names.push_back(p->name);
      shapes.push_back(p->value.shape());
    }
  }
  ASSERT_EQ(names.size(), 1u + 8u * 9u + 2u);
  EXPECT_EQ(names[0], "model.embed_tokens.weight");
  const std::vector<std::pair<std::string, std::vector<int64_t>>> block3 = {
      {"input_layernorm.weight", {64}},      {"self_attn.q_proj.weight", {64, 64}},
      {"self_attn.k_proj.weight", {32, 64}}, {"self_attn.v_proj.weight", {32, 64}},
      {"self_attn.o_proj.weight", {64, 64}}, {"post_attention_layernorm.weight", {64}},
      {"mlp.gate_proj.weight", {96, 64}},    {"mlp.up_proj.weight", {96, 64}},
      {"mlp.down_proj.weight", {64, 96}}};
  for (size_t i = 0; i < block3.size(); ++i) {
    EXPECT_EQ(names[1 + 3 * 9 + i], "model.layers.3." + block3[i].first);
    EXPECT_EQ(shapes[1 + 3 * 9 + i], block3[i].second) << block3[i].first;
  }
  EXPECT_EQ(names[names.size() - 2], "model.norm.weight");
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
      if (!is_weight) {  // the norms' gains
        for (float v : p->value.vec()) ASSERT_EQ(v, 1.0f) << p->name;
      } else if (p->name.find("o_proj") != std::string::npos ||
                 p->name.find("down_proj") != std::string::npos) {
        EXPECT_NEAR(stddev(p->value), 0.005, 0.0005) << p->name;
      } else {
        EXPECT_NEAR(stddev(p->value), 0.02, 0.002) << p->name;
      }
    }
  }
}

// ---- validation

TEST_F(LlamaLayersTest, RejectsBadConfigsNamingTheField) {
  auto refused = [](LlamaConfig cfg, const std::string& field) {
    const absl::Status s = ValidateLlamaConfig(cfg);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << field;
    EXPECT_NE(s.message().find(field), std::string::npos) << s;
    auto built = BuildLlamaLayers(cfg, 1, 0, 1);
    EXPECT_EQ(built.status().code(), absl::StatusCode::kInvalidArgument) << field;
  };
  EXPECT_TRUE(ValidateLlamaConfig(TinyConfig()).ok());
  LlamaConfig bad = TinyConfig();
  bad.n_kv_head = 3;  // does not divide n_head = 4
  refused(bad, "model.n_kv_head (3) must divide model.n_head (4)");
  bad = TinyConfig();
  bad.n_kv_head = 8;  // more kv heads than heads
  refused(bad, "model.n_kv_head");
  bad = TinyConfig();
  bad.d_model = 12;  // head size 3
  refused(bad, "head size 3 must be even");
  bad = TinyConfig();
  bad.d_model = 10;  // 10 % 4 != 0
  refused(bad, "model.d_model (10) must be a multiple of model.n_head (4)");
  for (auto [field, set] : std::vector<std::pair<std::string, void (*)(LlamaConfig&)>>{
           {"model.n_head", [](LlamaConfig& c) { c.n_head = 0; }},
           {"model.n_kv_head", [](LlamaConfig& c) { c.n_kv_head = 0; }},
           {"model.d_model", [](LlamaConfig& c) { c.d_model = -16; }},
           {"model.d_hidden", [](LlamaConfig& c) { c.d_hidden = 0; }},
           {"model.seq_len", [](LlamaConfig& c) { c.seq_len = 0; }},
           {"model.vocab_size", [](LlamaConfig& c) { c.vocab = 0; }},
           {"model.n_layer", [](LlamaConfig& c) { c.n_layer = -1; }},
           {"model.rope_theta", [](LlamaConfig& c) { c.rope_theta = 0.0; }},
           {"model.rope_theta", [](LlamaConfig& c) { c.rope_theta = std::nan(""); }},
           {"model.rms_eps", [](LlamaConfig& c) { c.rms_eps = -1e-5; }},
           {"too large", [](LlamaConfig& c) {
              c.vocab = 1 << 20;
              c.d_model = 1 << 12;
            }}}) {
    bad = TinyConfig();
    set(bad);
    refused(bad, field);
  }
  EXPECT_FALSE(BuildLlamaLayers(TinyConfig(), 1, 2, 2).ok());
  EXPECT_FALSE(BuildLlamaLayers(TinyConfig(), 1, 0, 5).ok());

  const LlamaConfig cfg = TinyConfig();
  LlamaEmbedding emb(cfg, 1);
  SavedContext ctx;
  Tensor out;
  IntTensor too_long = RandomTokens(1, 7, kV, 1);  // T = 7 > seq_len = 6
  EXPECT_FALSE(emb.Forward(Tensor(), {&too_long, nullptr, 1}, ctx, out).ok());
  IntTensor oov({1, 2}, {0, static_cast<int32_t>(kV)});
  EXPECT_NE(emb.Forward(Tensor(), {&oov, nullptr, 1}, ctx, out).message().find("vocabulary"),
            std::string::npos);
  LlamaBlock block(cfg, 0, 1);
  EXPECT_FALSE(block.Forward(Tensor({kB * kT, kC}), {}, ctx, out).ok());  // rank 2
  EXPECT_FALSE(block.Forward(Tensor({kB, kT, kC + 1}), {}, ctx, out).ok());
  EXPECT_FALSE(block.Forward(Tensor({kB, 7, kC}), {}, ctx, out).ok());  // beyond the RoPE tables
  LlamaHead head(cfg, 1);
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
  EXPECT_EQ(emb.Backward(Tensor({kB, kT, kC}), empty, g).code(), absl::StatusCode::kInternal);
}

// ---- whole model

// Runs layers forward from act, leaving their contexts in ctx; returns the last output.
Tensor RunLayers(std::vector<std::unique_ptr<Layer>>& layers, const MicroBatchData& data,
                 Tensor act, std::vector<SavedContext>& ctx) {
  ctx.assign(layers.size(), SavedContext{});
  for (size_t i = 0; i < layers.size(); ++i) {
    Tensor out;
    EXPECT_TRUE(layers[i]->Forward(act, data, ctx[i], out).ok()) << layers[i]->name();
    act = std::move(out);
  }
  return act;
}

// Runs layers backward from grad with the contexts RunLayers left; returns the first
// layer's input gradient.
Tensor BackLayers(std::vector<std::unique_ptr<Layer>>& layers, std::vector<SavedContext>& ctx,
                  Tensor grad) {
  for (size_t i = layers.size(); i-- > 0;) {
    Tensor grad_in;
    EXPECT_TRUE(layers[i]->Backward(grad, ctx[i], grad_in).ok()) << layers[i]->name();
    grad = std::move(grad_in);
  }
  return grad;
}

float ForwardBackward(std::vector<std::unique_ptr<Layer>>& layers, const MicroBatchData& data,
                      bool backward) {
  std::vector<SavedContext> ctx;
  const Tensor loss = RunLayers(layers, data, Tensor(), ctx);
  if (backward) BackLayers(layers, ctx, Tensor());
  return loss[0];
}

TEST_F(LlamaLayersTest, LossAtInitIsNearLogVocab) {
  for (bool tied : {false, true}) {
    SCOPED_TRACE(tied ? "tied" : "untied");
    LlamaConfig cfg = TinyConfig(2, tied);
    cfg.vocab = 256;
    cfg.d_model = 32;
    cfg.seq_len = 16;
    auto layers = BuildLlamaLayers(cfg, 3, 0, 4);  // embedding, 2 blocks, head
    ASSERT_TRUE(layers.ok()) << layers.status();
    const IntTensor tokens = RandomTokens(4, 16, 256, 1), targets = RandomTokens(4, 16, 256, 2);
    const float loss = ForwardBackward(*layers, {&tokens, &targets, 4 * 16}, false);
    EXPECT_NEAR(loss, std::log(256.0), 0.05);
  }
}

// Layers [0, 2) then [2, 4), the activation and its gradient handed across by hand, compute
// the same loss and the same gradients as [0, 4), bit for bit.
TEST_F(LlamaLayersTest, TwoStagesComputeWhatOneStageDoes) {
  const LlamaConfig cfg = TinyConfig(2, /*tied=*/false);
  const IntTensor tokens = RandomTokens(kB, kT, kV, 1), targets = RandomTokens(kB, kT, kV, 2);
  const MicroBatchData data{&tokens, &targets, kB * kT};
  auto whole = BuildLlamaLayers(cfg, 9, 0, 4);
  auto first = BuildLlamaLayers(cfg, 9, 0, 2);
  auto second = BuildLlamaLayers(cfg, 9, 2, 4);
  ASSERT_TRUE(whole.ok() && first.ok() && second.ok());
  std::vector<SavedContext> cw, c1, c2;
  const Tensor loss = RunLayers(*whole, data, Tensor(), cw);
  const Tensor boundary = RunLayers(*first, data, Tensor(), c1);
  const Tensor loss2 = RunLayers(*second, data, boundary, c2);
  ASSERT_EQ(loss.size(), 1u);
  EXPECT_EQ(loss[0], loss2[0]);
  BackLayers(*whole, cw, Tensor());
  BackLayers(*first, c1, BackLayers(*second, c2, Tensor()));
  std::vector<Parameter*> pw, ps;
  for (auto& l : *whole) {
    for (Parameter* p : l->Parameters()) pw.push_back(p);
  }
  for (auto* part : {&*first, &*second}) {
    for (auto& l : *part) {
      for (Parameter* p : l->Parameters()) ps.push_back(p);
    }
  }
  ASSERT_EQ(pw.size(), ps.size());
  for (size_t i = 0; i < pw.size(); ++i) {
    EXPECT_EQ(pw[i]->name, ps[i]->name);
    EXPECT_EQ(pw[i]->grad.vec(), ps[i]->grad.vec()) << pw[i]->name;
  }
}

// A 2-block model on a repeating pattern, the executor's duties done by hand: the two copies
// of the tied embedding get the sum of their gradients before each AdamW step, so they stay
// equal.
TEST_F(LlamaLayersTest, TinyModelLearnsARepeatingPattern) {
  LlamaConfig cfg = TinyConfig(2, /*tied=*/true);
  cfg.vocab = 16;
  cfg.d_model = 32;
  cfg.d_hidden = 64;
  cfg.seq_len = 16;
  auto built = BuildLlamaLayers(cfg, 11, 0, 4);
  ASSERT_TRUE(built.ok());
  auto& layers = *built;
  std::vector<Parameter*> params, tied;
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
  EXPECT_NEAR(first, std::log(16.0), 0.3);
  EXPECT_LT(last, 0.3f * first) << "first " << first << " last " << last;
  EXPECT_EQ(tied[0]->value.vec(), tied[1]->value.vec());
}

}  // namespace
}  // namespace tandem::worker
