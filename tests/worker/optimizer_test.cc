#include "worker/model/optimizer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <vector>

namespace tandem::worker {
namespace {

TEST(AdamWTest, TwoStepsMatchHandComputation) {
  Parameter w("w", {1, 2}, /*weight_decay=*/true);
  Parameter b("b", {1}, /*weight_decay=*/false);
  AdamWOptions opt;
  opt.beta1 = 0.9f;
  opt.beta2 = 0.95f;
  opt.eps = 1e-8f;
  opt.weight_decay = 0.1f;
  AdamW adam({&w, &b}, opt);
  w.value.vec() = {1.0f, -2.0f};
  b.value.vec() = {1.0f};

  w.grad.vec() = {0.5f, 0.0f};
  b.grad.vec() = {0.5f};
  adam.Step(0.1f);
  // Step 1: m = 0.05, v = 0.0125, mhat = 0.5, vhat = 0.25, update 1 (+ decay on w).
  EXPECT_NEAR(w.value[0], 1.0 - 0.1 * (1.0 + 0.1 * 1.0), 1e-6);    // 0.89
  EXPECT_NEAR(w.value[1], -2.0 - 0.1 * (0.0 + 0.1 * -2.0), 1e-6);  // zero grad: decay only
  EXPECT_NEAR(b.value[0], 1.0 - 0.1, 1e-6);                        // no decay on biases
  EXPECT_EQ(w.grad[0], 0.0f);
  EXPECT_EQ(b.grad[0], 0.0f);

  w.grad.vec() = {0.5f, 0.0f};
  b.grad.vec() = {-1.0f};
  adam.Step(0.1f);
  // Step 2 for w[0]: m = 0.095, v = 0.024375, c1 = 0.19, c2 = 0.0975 -> mhat 0.5, vhat 0.25.
  EXPECT_NEAR(w.value[0], 0.89 - 0.1 * (1.0 + 0.1 * 0.89), 1e-6);
  // b: m = 0.9*0.05 - 0.1 = -0.055, v = 0.95*0.0125 + 0.05 = 0.061875.
  const double mhat = -0.055 / 0.19, vhat = 0.061875 / 0.0975;
  EXPECT_NEAR(b.value[0], 0.9 - 0.1 * mhat / (std::sqrt(vhat) + 1e-8), 1e-6);
  EXPECT_EQ(adam.StateBytes(), 2 * 3 * sizeof(float));
}

// ZeRO stage 1: a shard updates exactly its elements, with the unsharded optimizer's bits, and
// keeps moments for them alone; its slots say where they sit in the parameter.
TEST(AdamWTest, AShardUpdatesItsElementsBitForBit) {
  AdamWOptions opt;
  opt.weight_decay = 0.1f;
  Parameter whole_w("w", {2, 5}, true), shard_w("w", {2, 5}, true);
  for (size_t i = 0; i < 10; ++i) whole_w.value[i] = shard_w.value[i] = 0.1f * i - 0.3f;
  AdamW whole({&whole_w}, opt);
  AdamW shard({&shard_w}, opt, {ElementRange{3, 8}});
  EXPECT_EQ(shard.StateBytes(), 2 * 5 * sizeof(float));
  const std::vector<float> before = shard_w.value.values();
  for (int step = 0; step < 3; ++step) {
    for (size_t i = 0; i < 10; ++i) whole_w.grad[i] = shard_w.grad[i] = 0.05f * (i + step) - 0.2f;
    whole.Step(0.01f);
    shard.Step(0.01f);
    for (size_t i = 0; i < 10; ++i) {
      EXPECT_EQ(shard_w.grad[i], 0.0f) << "every gradient is zeroed";
      if (i >= 3 && i < 8) {
        EXPECT_EQ(shard_w.value[i], whole_w.value[i]) << "element " << i;
      } else {
        EXPECT_EQ(shard_w.value[i], before[i]) << "element " << i << " is another shard's";
      }
    }
  }
  const std::vector<OptimizerSlot> slots = shard.Slots();
  ASSERT_EQ(slots.size(), 3u);
  EXPECT_EQ(slots[0].key, "adam_m");
  EXPECT_EQ(slots[0].offset, 3u);
  EXPECT_EQ(slots[0].f32->size(), 5u);
  EXPECT_EQ(*slots[2].i64, 3);
}

// The update runs four lanes at a time with a scalar tail: every element, whatever its place,
// gets exactly the formula's single-precision result, in the formula's order of operations.
TEST(AdamWTest, EveryElementIsTheFormulaBitForBit) {
  AdamWOptions opt;
  opt.beta1 = 0.9f;
  opt.beta2 = 0.95f;
  opt.eps = 1e-8f;
  opt.weight_decay = 0.1f;
  constexpr size_t kN = 1003;  // not a multiple of four: the tail too
  Parameter w("w", {kN}, /*weight_decay=*/true);
  std::vector<float> ref(kN), m(kN, 0.0f), v(kN, 0.0f);
  for (size_t i = 0; i < kN; ++i) ref[i] = w.value[i] = std::sin(0.37f * i) * 0.5f;
  AdamW adam({&w}, opt);
  const float lr = 3e-3f;
  for (int step = 1; step <= 4; ++step) {
    std::vector<float> g(kN);
    for (size_t i = 0; i < kN; ++i) g[i] = w.grad[i] = std::cos(0.11f * i * step) * 1e-2f;
    adam.Step(lr);
    const float c1 = 1.0f - static_cast<float>(std::pow(static_cast<double>(opt.beta1), step));
    const float c2 = 1.0f - static_cast<float>(std::pow(static_cast<double>(opt.beta2), step));
    for (size_t i = 0; i < kN; ++i) {
      m[i] = opt.beta1 * m[i] + (1.0f - opt.beta1) * g[i];
      v[i] = opt.beta2 * v[i] + (1.0f - opt.beta2) * g[i] * g[i];
      const float mhat = m[i] / c1, vhat = v[i] / c2;
      ref[i] = ref[i] - lr * (mhat / (std::sqrt(vhat) + opt.eps) + opt.weight_decay * ref[i]);
      ASSERT_EQ(w.value[i], ref[i]) << "step " << step << " element " << i;
      ASSERT_EQ(w.grad[i], 0.0f);
    }
  }
}

// Clipping's factor is folded into the update's one pass over the gradients: the result is,
// bit for bit, that of scaling every gradient first and then stepping with a factor of 1 (the
// separate pass the worker used to make), for AdamW (lanes and tail) and SGD alike.
TEST(OptimizerTest, AGradScaleInTheStepIsScalingTheGradientsFirstBitForBit) {
  constexpr size_t kN = 1003;  // not a multiple of four: the tail too
  const float scale = 0.137f;
  v1::OptimizerSpec adamw;
  adamw.set_name("adamw");
  adamw.set_beta1(0.9f);
  adamw.set_beta2(0.95f);
  adamw.set_eps(1e-8f);
  adamw.set_weight_decay(0.1f);
  v1::OptimizerSpec sgd = adamw;
  sgd.set_name("sgd");
  for (const v1::OptimizerSpec& spec : {adamw, sgd}) {
    Parameter folded("w", {kN}, /*weight_decay=*/true), first("w", {kN}, /*weight_decay=*/true);
    for (size_t i = 0; i < kN; ++i) folded.value[i] = first.value[i] = std::sin(0.37f * i) * 0.5f;
    absl::StatusOr<std::unique_ptr<Optimizer>> a = MakeOptimizer(spec, {&folded});
    absl::StatusOr<std::unique_ptr<Optimizer>> b = MakeOptimizer(spec, {&first});
    ASSERT_TRUE(a.ok() && b.ok());
    for (int step = 1; step <= 3; ++step) {
      for (size_t i = 0; i < kN; ++i) {
        const float g = std::cos(0.11f * i * step) * 3.0f;
        folded.grad[i] = g;
        first.grad[i] = g * scale;
      }
      (*a)->Step(2e-3f, scale);
      (*b)->Step(2e-3f, 1.0f);
      for (size_t i = 0; i < kN; ++i) {
        ASSERT_EQ(folded.value[i], first.value[i])
            << spec.name() << " step " << step << " element " << i;
        ASSERT_EQ(folded.grad[i], 0.0f);
      }
    }
  }
}

TEST(SgdTest, StepWithDecoupledDecay) {
  Parameter w("w", {1, 1}, true);
  Parameter b("b", {1}, false);
  Sgd sgd({&w, &b}, 0.1f);
  w.value[0] = 1.0f;
  b.value[0] = 1.0f;
  w.grad[0] = 0.5f;
  b.grad[0] = 0.5f;
  sgd.Step(0.1f);
  EXPECT_NEAR(w.value[0], 1.0 - 0.1 * (0.5 + 0.1), 1e-7);
  EXPECT_NEAR(b.value[0], 1.0 - 0.1 * 0.5, 1e-7);
  EXPECT_EQ(w.grad[0], 0.0f);
}

TEST(MakeOptimizerTest, ValidatesNamesAndHyperParameters) {
  v1::OptimizerSpec spec;
  EXPECT_TRUE(MakeOptimizer(spec, {}).ok());  // adamw by default
  spec.set_name("SGD");
  EXPECT_TRUE(MakeOptimizer(spec, {}).ok());
  spec.set_name("lion");
  auto r = MakeOptimizer(spec, {});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("optimizer.name"), std::string::npos);
  spec.set_name("adamw");
  spec.set_beta2(1.0f);
  EXPECT_NE(MakeOptimizer(spec, {}).status().message().find("optimizer.beta2"), std::string::npos);
}

}  // namespace
}  // namespace tandem::worker
