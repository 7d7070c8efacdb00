// Finite-difference gradient checks for Layer implementations, shared by the layer tests.
//
// f = sum(r * out) for a fixed random r (or the loss itself for a loss layer), so that
// d f / d out = r and one check covers every output element. fp32 forward, central
// differences with step eps: truncation error O(eps^2), rounding error ~ 1e-7 |f| / eps. An
// element passes when |analytic - numeric| <= rel * max(|a|, |n|) + abs.
#ifndef TANDEM_TESTS_WORKER_GRAD_CHECK_H_
#define TANDEM_TESTS_WORKER_GRAD_CHECK_H_

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "worker/model/layer.h"
#include "worker/model/random.h"
#include "worker/model/tensor.h"

namespace tandem::worker::testing {

struct GradTolerance {
  double eps = 1e-2;
  double rel = 1e-2;
  double abs = 2e-4;
};

inline Tensor RandomTensor(std::vector<int64_t> shape, uint64_t seed, double scale = 1.0) {
  Tensor t(std::move(shape));
  Rng rng(seed);
  for (size_t i = 0; i < t.size(); ++i) t[i] = static_cast<float>(rng.Normal() * scale);
  return t;
}

// Moves every parameter away from its (degenerate) init so that zero biases and unit gains
// do not hide a wrong gradient.
inline void Perturb(Layer& layer, uint64_t seed, double scale = 0.3) {
  Rng rng(seed);
  for (Parameter* p : layer.Parameters()) {
    for (size_t i = 0; i < p->value.size(); ++i) {
      p->value[i] += static_cast<float>(rng.Normal() * scale);
    }
  }
}

// Perturbs `plain`, `other` and `split` alike and runs `x` forward through each into its
// context; `other`'s output must be bit for bit `plain`'s.
inline void RunSameForwards(Layer& plain, SavedContext& a, Layer& other, SavedContext& b,
                            Layer& split, SavedContext& c, const Tensor& x) {
  for (Layer* l : std::vector<Layer*>{&plain, &other, &split}) Perturb(*l, 2);
  Tensor ya, yb, yc;
  ASSERT_TRUE(plain.Forward(x, MicroBatchData{}, a, ya).ok());
  ASSERT_TRUE(other.Forward(x, MicroBatchData{}, b, yb).ok());
  ASSERT_TRUE(split.Forward(x, MicroBatchData{}, c, yc).ok());
  EXPECT_EQ(ya.vec(), yb.vec());
}

// What the recomputation before a backward leaves: `layer`'s RecomputeContext of `x` must
// fill the context Forward fills, tensor for tensor and bit for bit.
inline void ExpectRecomputedContextIsForwards(Layer& layer, const Tensor& x,
                                              const MicroBatchData& data = MicroBatchData{}) {
  SavedContext forward, recomputed;
  Tensor y;
  ASSERT_TRUE(layer.Forward(x, data, forward, y).ok()) << layer.name();
  ASSERT_TRUE(layer.RecomputeContext(x, data, recomputed).ok()) << layer.name();
  ASSERT_EQ(forward.tensors.size(), recomputed.tensors.size()) << layer.name();
  ASSERT_EQ(forward.ints.size(), recomputed.ints.size()) << layer.name();
  for (size_t i = 0; i < forward.tensors.size(); ++i) {
    EXPECT_EQ(forward.tensors[i].shape(), recomputed.tensors[i].shape())
        << layer.name() << " " << i;
    EXPECT_EQ(forward.tensors[i].vec(), recomputed.tensors[i].vec()) << layer.name() << " " << i;
  }
  for (size_t i = 0; i < forward.ints.size(); ++i) {
    EXPECT_EQ(forward.ints[i].vec(), recomputed.ints[i].vec()) << layer.name() << " int " << i;
  }
}

// What ExpectForwardWithoutSavingIsForwards measured: the bytes ForwardWithoutSaving reported
// (0 after a failure) and those of the context Forward filled for the same input.
struct ForwardWithoutSavingBytes {
  size_t peak = 0;
  size_t context = 0;
};

// The forward of a recomputed micro-batch: `layer`'s ForwardWithoutSaving of `x` must give
// Forward's output bit for bit, holding no more than Forward's context.
inline ForwardWithoutSavingBytes ExpectForwardWithoutSavingIsForwards(
    Layer& layer, const Tensor& x, const MicroBatchData& data = MicroBatchData{}) {
  SavedContext ctx;
  Tensor want, got;
  size_t peak = 0;
  EXPECT_TRUE(layer.Forward(x, data, ctx, want).ok()) << layer.name();
  EXPECT_TRUE(layer.ForwardWithoutSaving(x, data, got, &peak).ok()) << layer.name();
  EXPECT_EQ(got.shape(), want.shape()) << layer.name();
  EXPECT_EQ(got.vec(), want.vec()) << layer.name();
  EXPECT_GT(peak, 0u) << layer.name();
  EXPECT_LE(peak, ctx.Bytes()) << layer.name();
  return {peak, ctx.Bytes()};
}

// Runs `dout` back through `plain` (B), `other` (B) and `split` (I then W), each from the
// context its own forward filled, and expects what a recomputing variant must give: split's
// context empty after W, and the input gradient and every parameter gradient of `other` and
// `split` bit for bit those of `plain`.
inline void ExpectBitIdenticalBackwards(Layer& plain, SavedContext& a, Layer& other,
                                        SavedContext& b, Layer& split, SavedContext& c,
                                        const Tensor& dout) {
  Tensor ga, gb, gc;
  ASSERT_TRUE(plain.Backward(dout, a, ga).ok());
  ASSERT_TRUE(other.Backward(dout, b, gb).ok());
  ASSERT_TRUE(split.BackwardInput(dout, c, gc).ok());
  ASSERT_TRUE(split.BackwardWeight(c).ok());
  EXPECT_EQ(c.Bytes(), 0u);
  EXPECT_EQ(ga.vec(), gb.vec());
  EXPECT_EQ(ga.vec(), gc.vec());
  std::vector<Parameter*> pa = plain.Parameters(), pb = other.Parameters(), pc = split.Parameters();
  for (size_t i = 0; i < pa.size(); ++i) {
    EXPECT_EQ(pa[i]->grad.vec(), pb[i]->grad.vec()) << pa[i]->name;
    EXPECT_EQ(pa[i]->grad.vec(), pc[i]->grad.vec()) << pa[i]->name << " (split)";
  }
}

// Checks d f / d input (when check_input; otherwise that no input gradient is produced) and
// d f / d every parameter element. `out_shape` is the layer's output shape (unused for a
// loss layer).
inline void GradCheck(Layer& layer, Tensor input, const MicroBatchData& data,
                      const std::vector<int64_t>& out_shape, bool check_input,
                      const GradTolerance& tol) {
  const Tensor r = layer.is_loss() ? Tensor() : RandomTensor(out_shape, 99);
  auto eval = [&](const Tensor& in) {
    SavedContext ctx;
    Tensor out;
    EXPECT_TRUE(layer.Forward(in, data, ctx, out).ok());
    if (layer.is_loss()) return static_cast<double>(out[0]);
    double f = 0.0;
    for (size_t i = 0; i < out.size(); ++i) f += static_cast<double>(r[i]) * out[i];
    return f;
  };
  auto expect_close = [&](double analytic, double numeric, const std::string& what) {
    const double bound = tol.rel * std::max(std::abs(analytic), std::abs(numeric)) + tol.abs;
    EXPECT_NEAR(analytic, numeric, bound) << what;
  };
  for (Parameter* p : layer.Parameters()) p->grad.Fill(0.0f);
  SavedContext ctx;
  Tensor out, grad_input;
  ASSERT_TRUE(layer.Forward(input, data, ctx, out).ok());
  ASSERT_TRUE(layer.Backward(r, ctx, grad_input).ok());
  const float eps = static_cast<float>(tol.eps);
  if (check_input) {
    ASSERT_EQ(grad_input.shape(), input.shape());
    for (size_t i = 0; i < input.size(); ++i) {
      const float saved = input[i];
      input[i] = saved + eps;
      const double fp = eval(input);
      input[i] = saved - eps;
      const double fm = eval(input);
      input[i] = saved;
      expect_close(grad_input[i], (fp - fm) / (2 * tol.eps),
                   layer.name() + " input[" + std::to_string(i) + "]");
    }
  } else {
    EXPECT_TRUE(grad_input.empty());
  }
  for (Parameter* p : layer.Parameters()) {
    const Tensor analytic = p->grad;
    for (size_t i = 0; i < p->value.size(); ++i) {
      const float saved = p->value[i];
      p->value[i] = saved + eps;
      const double fp = eval(input);
      p->value[i] = saved - eps;
      const double fm = eval(input);
      p->value[i] = saved;
      expect_close(analytic[i], (fp - fm) / (2 * tol.eps), p->name + "[" + std::to_string(i) + "]");
    }
  }
}

}  // namespace tandem::worker::testing

#endif  // TANDEM_TESTS_WORKER_GRAD_CHECK_H_
