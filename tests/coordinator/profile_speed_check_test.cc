// The speed check of a cached profile, judged: the layers it times, each kind's ratio of now to
// then and the model's, the verdict (stands, stands on jittery rounds, scaled, measured again),
// and the profile scaled.
#include "coordinator/profile_speed_check.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem::coordinator {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

v1::LayerProfile Layer(int g, double forward, double backward) {
  v1::LayerProfile l;
  l.set_layer(g);
  l.set_forward_seconds(forward);
  l.set_backward_seconds(backward);
  return l;
}

// A GPT of 2 blocks: the embedding (layer 0), blocks 1 and 2, the head (layer 3).
v1::ModelSpec Model() {
  v1::ModelSpec m;
  m.set_arch("gpt");
  m.set_n_layer(2);
  return m;
}

// Its expanded profile: embedding 0.01 s, each block 0.1 + 0.2 s, head 0.4 + 0.8 s (the model:
// 1.81 s of forward + backward).
v1::ModelProfile Profile() {
  v1::ModelProfile p;
  *p.add_layers() = Layer(0, 0.005, 0.005);
  *p.add_layers() = Layer(1, 0.1, 0.2);
  *p.add_layers() = Layer(2, 0.1, 0.2);
  *p.add_layers() = Layer(3, 0.4, 0.8);
  return p;
}

// The check's answer: each kind x its factor.
std::vector<v1::LayerProfile> Now(double embedding, double block, double head) {
  return {Layer(0, 0.005 * embedding, 0.005 * embedding), Layer(1, 0.1 * block, 0.2 * block),
          Layer(3, 0.4 * head, 0.8 * head)};
}

TEST(SpeedCheckLayersTest, TheLayersTheProfileTimed) {
  v1::ModelSpec gpt = Model();
  gpt.set_n_layer(6);
  EXPECT_THAT(SpeedCheckLayers(gpt), ElementsAre(0, 1, 7));  // embedding, a block, the head
  v1::ModelSpec no_blocks = gpt;
  no_blocks.set_n_layer(0);
  EXPECT_THAT(SpeedCheckLayers(no_blocks), ElementsAre(0, 1));
}

TEST(JudgeSpeedTest, EachKindAgainstTheProfileAndTheModelOverAllItsLayers) {
  // The blocks 5% fast, the head 10% slow, the embedding as profiled.
  absl::StatusOr<SpeedCheck> c = JudgeSpeed(Model(), Profile(), Now(1.0, 0.95, 1.1));
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_EQ(c->kinds.size(), 3u);
  EXPECT_EQ(c->kinds[1].layer, 1);
  EXPECT_EQ(c->kinds[1].count, 2);
  EXPECT_NEAR(c->kinds[1].then_seconds, 0.3, 1e-12);
  EXPECT_NEAR(c->kinds[1].now_seconds, 0.285, 1e-12);
  EXPECT_NEAR(c->kinds[1].ratio, 0.95, 1e-12);
  EXPECT_EQ(c->kinds[2].layer, 3);
  EXPECT_EQ(c->kinds[2].count, 1);
  EXPECT_NEAR(c->kinds[2].ratio, 1.1, 1e-12);
  EXPECT_NEAR(c->kinds[0].ratio, 1.0, 1e-12);
  // The model: each kind by its share (the head two thirds of it).
  EXPECT_NEAR(c->then_seconds, 1.81, 1e-12);
  EXPECT_NEAR(c->now_seconds, 0.01 + 2 * 0.285 + 1.32, 1e-12);
  EXPECT_NEAR(c->ratio, 1.9 / 1.81, 1e-12);
  EXPECT_TRUE(c->scaled);  // no rounds: the merged ratio decides
  EXPECT_FALSE(c->remeasure);
  EXPECT_THAT(DescribeSpeedCheck(*c),
              HasSubstr("layer 1 285.0/300.0 ms (x0.950), layer 3 1320.0/1200.0 ms (x1.100); "
                        "the model x1.050: priced at x1.050"));
}

TEST(JudgeSpeedTest, ScaledOnlyWhenEveryRoundIsBeyondTheNoiseOnOneSide) {
  // Every round 3-6% slow: the machine drifted; priced at the merged ratio.
  absl::StatusOr<SpeedCheck> c =
      JudgeSpeed(Model(), Profile(), Now(1.05, 1.05, 1.05), {1.03, 1.06, 1.05});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->scaled);
  EXPECT_THAT(c->round_ratios, ElementsAre(1.03, 1.06, 1.05));
  EXPECT_THAT(DescribeSpeedCheck(*c),
              HasSubstr("the model x1.050 (rounds x1.030, x1.060, x1.050): priced at x1.050"));
  // As measured on the 2-vCPU VM: one round within the noise, two 9% slow. The host jitters;
  // the profile stands.
  c = JudgeSpeed(Model(), Profile(), Now(1.09, 1.09, 1.09), {0.997, 1.090, 1.094});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->scaled);
  EXPECT_FALSE(c->remeasure);
  EXPECT_THAT(DescribeSpeedCheck(*c), HasSubstr("a round within 2%: the profile stands"));
  // A round beyond the noise on the other side: stands too.
  c = JudgeSpeed(Model(), Profile(), Now(0.95, 0.95, 0.95), {0.94, 1.03});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->scaled);
  c = JudgeSpeed(Model(), Profile(), Now(0.95, 0.95, 0.95), {0.94, 0.97});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->scaled);
}

TEST(JudgeSpeedTest, WithinTheNoiseTheProfileStandsAndFarOffItIsMeasuredAgain) {
  // The head 1.9% slow and the blocks 1.9% fast: the model within kSpeedCheckNoise. The
  // embedding (a minor kind) 30% slow calls for nothing.
  absl::StatusOr<SpeedCheck> c = JudgeSpeed(Model(), Profile(), Now(1.3, 0.981, 1.019));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->scaled);
  EXPECT_FALSE(c->remeasure);
  EXPECT_THAT(DescribeSpeedCheck(*c), HasSubstr("within 2%: the profile stands"));
  for (const double k : {1.3, 1 / 1.3}) {
    c = JudgeSpeed(Model(), Profile(), Now(k, k, k));
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_TRUE(c->remeasure) << k;
    EXPECT_THAT(DescribeSpeedCheck(*c), HasSubstr("beyond 25%: measuring the profile again"));
  }
  c = JudgeSpeed(Model(), Profile(), Now(1.24, 1.24, 1.24));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->remeasure);
  // One major kind far off, though the model's ratio is not (the machine changed): measured
  // again.
  c = JudgeSpeed(Model(), Profile(), Now(1.0, 1.3, 0.9));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_LT(std::abs(c->ratio - 1), kSpeedCheckMaxDrift);
  EXPECT_TRUE(c->remeasure);
}

TEST(JudgeSpeedTest, RefusesWhatCannotBeCompared) {
  std::vector<v1::LayerProfile> now = Now(1, 1, 1);
  now.pop_back();
  EXPECT_THAT(JudgeSpeed(Model(), Profile(), now).status().message(),
              HasSubstr("no worker timed layer 3"));
  now = Now(1, 1, 1);
  now.push_back(Layer(2, 0.1, 0.2));
  EXPECT_THAT(JudgeSpeed(Model(), Profile(), now).status().message(),
              HasSubstr("layer 2 was timed, but is not one it times"));
  now = Now(1, 1, 1);
  now.push_back(Layer(1, 0.1, 0.2));
  EXPECT_THAT(JudgeSpeed(Model(), Profile(), now).status().message(),
              HasSubstr("layer 1 was timed twice"));
  now = Now(1, 1, 1);
  now[1] = Layer(1, 0, 0);
  EXPECT_THAT(JudgeSpeed(Model(), Profile(), now).status().message(),
              HasSubstr("layer 1 was timed at 0 s"));
  v1::ModelProfile empty_layer = Profile();
  empty_layer.mutable_layers(1)->set_forward_seconds(0);
  empty_layer.mutable_layers(1)->set_backward_seconds(0);
  EXPECT_THAT(JudgeSpeed(Model(), empty_layer, Now(1, 1, 1)).status().message(),
              HasSubstr("layer 1's forward + backward in the profile is 0"));
  v1::ModelProfile short_profile = Profile();
  short_profile.mutable_layers()->RemoveLast();
  EXPECT_THAT(JudgeSpeed(Model(), short_profile, Now(1, 1, 1)).status().message(),
              HasSubstr("the profile has 3 layers, the model 4"));
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
  EXPECT_DOUBLE_EQ(s.layers(0).forward_seconds(), 0.0075);
  EXPECT_DOUBLE_EQ(s.layers(3).forward_seconds(), 0.6);
  EXPECT_EQ(s.key(), "k");
  EXPECT_EQ(s.created_unix_ms(), 42);
  EXPECT_DOUBLE_EQ(s.link().latency_seconds(), 1e-5);
}

}  // namespace
}  // namespace tandem::coordinator
