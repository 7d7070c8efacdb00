// The speed check of a cached profile, judged: the layer it times, the ratio of now to then
// (the median over the workers), the verdict (stands, scaled, measured again), and the
// profile scaled.
#include "coordinator/profile_speed_check.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem::coordinator {
namespace {

using ::testing::HasSubstr;

v1::LayerProfile Layer(int g, double forward, double backward) {
  v1::LayerProfile l;
  l.set_layer(g);
  l.set_forward_seconds(forward);
  l.set_backward_seconds(backward);
  return l;
}

// Embedding, a block of 0.1 + 0.2 s, head.
v1::ModelProfile Profile() {
  v1::ModelProfile p;
  *p.add_layers() = Layer(0, 0.001, 0.001);
  *p.add_layers() = Layer(1, 0.1, 0.2);
  *p.add_layers() = Layer(2, 0.4, 0.8);
  return p;
}

TEST(SpeedCheckLayerTest, OneBlockElseTheLastLayer) {
  v1::ModelSpec gpt;
  gpt.set_arch("gpt");
  gpt.set_n_layer(6);
  EXPECT_EQ(SpeedCheckLayer(gpt), 1);  // the embedding is 0, the head 7
  v1::ModelSpec no_blocks = gpt;
  no_blocks.set_n_layer(0);
  EXPECT_EQ(SpeedCheckLayer(no_blocks), 1);  // no block: the head
}

TEST(JudgeSpeedTest, TheMedianOverTheWorkersAgainstTheProfile) {
  // Three workers: 0.33, 0.30 and 0.36 s against 0.3 s; the median 0.33 s is 10% slow.
  absl::StatusOr<SpeedCheck> c =
      JudgeSpeed(Profile(), 1, {Layer(1, 0.11, 0.22), Layer(1, 0.1, 0.2), Layer(1, 0.12, 0.24)});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->layer, 1);
  EXPECT_NEAR(c->then_seconds, 0.3, 1e-12);
  EXPECT_NEAR(c->now_seconds, 0.33, 1e-12);
  EXPECT_NEAR(c->ratio, 1.1, 1e-12);
  EXPECT_NEAR(c->scale, 1.1, 1e-12);
  EXPECT_FALSE(c->remeasure);
  EXPECT_THAT(DescribeSpeedCheck(*c),
              HasSubstr("layer 1 ran 330.0 ms against 300.0 ms when profiled (x1.100): "
                        "priced at x1.100"));
  c->round_seconds = {0.3312, 0.3288};
  EXPECT_THAT(DescribeSpeedCheck(*c), HasSubstr("(x1.100; rounds 331.2, 328.8 ms): priced"));
  // Two workers: the mean of the two.
  c = JudgeSpeed(Profile(), 1, {Layer(1, 0.09, 0.18), Layer(1, 0.1, 0.2)});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_NEAR(c->now_seconds, 0.285, 1e-12);
  EXPECT_NEAR(c->scale, 0.95, 1e-12);
}

TEST(JudgeSpeedTest, WithinTheNoiseTheProfileStandsAndFarOffItIsMeasuredAgain) {
  absl::StatusOr<SpeedCheck> c = JudgeSpeed(Profile(), 1, {Layer(1, 0.102, 0.204)});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_NEAR(c->ratio, 1.02, 1e-12);  // at the edge of kSpeedCheckNoise: stands
  EXPECT_EQ(c->scale, 1.0);
  EXPECT_FALSE(c->remeasure);
  EXPECT_THAT(DescribeSpeedCheck(*c), HasSubstr("within 2%: the profile stands"));
  c = JudgeSpeed(Profile(), 1, {Layer(1, 0.0975, 0.195)});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_NEAR(c->scale, 0.975, 1e-12);  // 2.5% fast: priced so
  for (const double k : {1.3, 1 / 1.3}) {
    c = JudgeSpeed(Profile(), 1, {Layer(1, 0.1 * k, 0.2 * k)});
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_TRUE(c->remeasure) << k;
    EXPECT_THAT(DescribeSpeedCheck(*c), HasSubstr("beyond 25%: measuring the profile again"));
  }
  c = JudgeSpeed(Profile(), 1, {Layer(1, 0.1 * 1.24, 0.2 * 1.24)});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->remeasure);
}

TEST(JudgeSpeedTest, RefusesWhatCannotBeCompared) {
  EXPECT_THAT(JudgeSpeed(Profile(), 5, {Layer(5, 0.1, 0.2)}).status().message(),
              HasSubstr("the profile has no layer 5"));
  EXPECT_THAT(JudgeSpeed(Profile(), 1, {}).status().message(),
              HasSubstr("no worker timed the layer"));
  EXPECT_THAT(JudgeSpeed(Profile(), 1, {Layer(2, 0.1, 0.2)}).status().message(),
              HasSubstr("timed layer 2"));
  EXPECT_THAT(JudgeSpeed(Profile(), 1, {Layer(1, 0, 0)}).status().message(),
              HasSubstr("not layer 1 at > 0 s"));
  v1::ModelProfile empty_layer = Profile();
  empty_layer.mutable_layers(1)->set_forward_seconds(0);
  empty_layer.mutable_layers(1)->set_backward_seconds(0);
  EXPECT_THAT(JudgeSpeed(empty_layer, 1, {Layer(1, 0.1, 0.2)}).status().message(),
              HasSubstr("in the profile is 0"));
}

TEST(ScaleProfileComputeTest, ScalesEveryComputeTimeAndNothingElse) {
  v1::ModelProfile p = Profile();
  p.set_key("k");
  p.set_created_unix_ms(42);
  p.mutable_link()->set_latency_seconds(1e-5);
  v1::LayerProfile* l = p.mutable_layers(1);
  l->set_backward_input_seconds(0.12);
  l->set_backward_weight_seconds(0.08);
  l->set_recompute_seconds(0.09);
  l->set_apply_seconds(0.01);
  l->set_static_bytes(1000);
  l->set_activation_bytes(200);
  l->set_parameter_count(250);
  const v1::ModelProfile s = ScaleProfileCompute(p, 1.5);
  const v1::LayerProfile& m = s.layers(1);
  EXPECT_DOUBLE_EQ(m.forward_seconds(), 0.15);
  EXPECT_DOUBLE_EQ(m.backward_seconds(), 0.3);
  EXPECT_DOUBLE_EQ(m.backward_input_seconds(), 0.18);
  EXPECT_DOUBLE_EQ(m.backward_weight_seconds(), 0.12);
  EXPECT_DOUBLE_EQ(m.recompute_seconds(), 0.135);
  EXPECT_DOUBLE_EQ(m.apply_seconds(), 0.015);
  EXPECT_EQ(m.static_bytes(), 1000);
  EXPECT_EQ(m.activation_bytes(), 200);
  EXPECT_EQ(m.parameter_count(), 250);
  EXPECT_DOUBLE_EQ(s.layers(2).forward_seconds(), 0.6);
  EXPECT_EQ(s.key(), "k");
  EXPECT_EQ(s.created_unix_ms(), 42);
  EXPECT_DOUBLE_EQ(s.link().latency_seconds(), 1e-5);
}

}  // namespace
}  // namespace tandem::coordinator
