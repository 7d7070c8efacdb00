#include "common/schedule.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

std::vector<std::string> ToStrings(const Program& program) {
  std::vector<std::string> out;
  for (const auto& actions : program) out.push_back(ActionsToString(actions));
  return out;
}

// Written out by hand from the definition: rank r runs P-r-1 warm-up forwards, then one
// forward and one backward alternately, then drains the backwards.
TEST(Generate1F1B, FourStagesEightMicroBatches) {
  absl::StatusOr<Program> program = Generate1F1B(4, 8);
  ASSERT_TRUE(program.ok()) << program.status();
  EXPECT_THAT(
      ToStrings(*program),
      ::testing::ElementsAre("0F0 0F1 0F2 0F3 0B0 0F4 0B1 0F5 0B2 0F6 0B3 0F7 0B4 0B5 0B6 0B7",
                             "1F0 1F1 1F2 1B0 1F3 1B1 1F4 1B2 1F5 1B3 1F6 1B4 1F7 1B5 1B6 1B7",
                             "2F0 2F1 2B0 2F2 2B1 2F3 2B2 2F4 2B3 2F5 2B4 2F6 2B5 2F7 2B6 2B7",
                             "3F0 3B0 3F1 3B1 3F2 3B2 3F3 3B3 3F4 3B4 3F5 3B5 3F6 3B6 3F7 3B7"));
}

TEST(Generate1F1B, EqualStagesAndMicroBatches) {
  absl::StatusOr<Program> program = Generate1F1B(2, 2);
  ASSERT_TRUE(program.ok()) << program.status();
  EXPECT_THAT(ToStrings(*program), ::testing::ElementsAre("0F0 0F1 0B0 0B1", "1F0 1B0 1F1 1B1"));
}

TEST(Generate1F1B, SingleStageAlternates) {
  absl::StatusOr<Program> program = Generate1F1B(1, 3);
  ASSERT_TRUE(program.ok()) << program.status();
  EXPECT_THAT(ToStrings(*program), ::testing::ElementsAre("0F0 0B0 0F1 0B1 0F2 0B2"));
}

TEST(Generate1F1B, RefusesFewerMicroBatchesThanStages) {
  absl::StatusOr<Program> program = Generate1F1B(4, 3);
  ASSERT_FALSE(program.ok());
  EXPECT_EQ(program.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(program.status().message(),
              AllOf(HasSubstr("M=3"), HasSubstr("P=4"), HasSubstr("gpipe")));
}

TEST(Generate1F1B, RefusesEmptySizes) {
  EXPECT_FALSE(Generate1F1B(0, 4).ok());
  EXPECT_FALSE(Generate1F1B(2, 0).ok());
}

TEST(GenerateGPipe, AllForwardsThenBackwardsInReverse) {
  absl::StatusOr<Program> program = GenerateGPipe(2, 3);
  ASSERT_TRUE(program.ok()) << program.status();
  EXPECT_THAT(ToStrings(*program),
              ::testing::ElementsAre("0F0 0F1 0F2 0B2 0B1 0B0", "1F0 1F1 1F2 1B2 1B1 1B0"));
}

TEST(GenerateGPipe, AllowsFewerMicroBatchesThanStages) {
  absl::StatusOr<Program> program = GenerateGPipe(4, 1);
  ASSERT_TRUE(program.ok()) << program.status();
  EXPECT_THAT(ToStrings(*program),
              ::testing::ElementsAre("0F0 0B0", "1F0 1B0", "2F0 2B0", "3F0 3B0"));
  EXPECT_FALSE(GenerateGPipe(0, 1).ok());
  EXPECT_FALSE(GenerateGPipe(1, 0).ok());
}

// Every generated program runs each forward and each backward exactly once per rank, a
// backward only after its forward.
TEST(GenerateSchedule, EveryMicroBatchOnceForwardBeforeBackward) {
  for (const char* name : {"1f1b", "gpipe"}) {
    for (int p = 1; p <= 6; ++p) {
      for (int m = p; m <= 9; ++m) {
        absl::StatusOr<Program> program = GenerateSchedule(name, p, m);
        ASSERT_TRUE(program.ok()) << name << " P=" << p << " M=" << m;
        ASSERT_EQ(program->size(), static_cast<size_t>(p));
        for (int r = 0; r < p; ++r) {
          std::vector<int> forwards(m, 0), backwards(m, 0);
          for (const Action& a : (*program)[r]) {
            EXPECT_EQ(a.stage, r);
            ASSERT_GE(a.micro_batch, 0);
            ASSERT_LT(a.micro_batch, m);
            if (a.kind == v1::ACTION_F) {
              ++forwards[a.micro_batch];
            } else {
              ASSERT_EQ(a.kind, v1::ACTION_B);
              EXPECT_EQ(forwards[a.micro_batch], 1) << name << " rank " << r;
              ++backwards[a.micro_batch];
            }
          }
          EXPECT_THAT(forwards, ::testing::Each(1));
          EXPECT_THAT(backwards, ::testing::Each(1));
        }
      }
    }
  }
}

TEST(GenerateSchedule, ByName) {
  absl::StatusOr<Program> gpipe = GenerateSchedule("gpipe", 2, 2);
  ASSERT_TRUE(gpipe.ok());
  EXPECT_EQ(ActionsToString((*gpipe)[0]), "0F0 0F1 0B1 0B0");
  absl::StatusOr<Program> one = GenerateSchedule("1f1b", 2, 2);
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(ActionsToString((*one)[0]), "0F0 0F1 0B0 0B1");
  absl::StatusOr<Program> bad = GenerateSchedule("zero_bubble", 2, 2);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), AllOf(HasSubstr("zero_bubble"), HasSubstr("1f1b")));
}

TEST(LowerWithTransfers, TwoStagesTwoMicroBatches) {
  absl::StatusOr<Program> compute = Generate1F1B(2, 2);
  ASSERT_TRUE(compute.ok());
  EXPECT_THAT(ToStrings(LowerWithTransfers(*compute, 2)),
              ::testing::ElementsAre("0F0 0SEND_F0 0F1 0SEND_F1 0RECV_B0 0B0 0RECV_B1 0B1",
                                     "1RECV_F0 1F0 1B0 1SEND_B0 1RECV_F1 1F1 1B1 1SEND_B1"));
}

TEST(LowerWithTransfers, MiddleStageReceivesAndSendsBothWays) {
  absl::StatusOr<Program> compute = Generate1F1B(3, 3);
  ASSERT_TRUE(compute.ok());
  const Program lowered = LowerWithTransfers(*compute, 3);
  EXPECT_EQ(ActionsToString(lowered[1]),
            "1RECV_F0 1F0 1SEND_F0 1RECV_F1 1F1 1SEND_F1 1RECV_B0 1B0 1SEND_B0 "
            "1RECV_F2 1F2 1SEND_F2 1RECV_B1 1B1 1SEND_B1 1RECV_B2 1B2 1SEND_B2");
}

TEST(LowerWithTransfers, SingleStageHasNoTransfers) {
  absl::StatusOr<Program> compute = Generate1F1B(1, 2);
  ASSERT_TRUE(compute.ok());
  EXPECT_EQ(ActionsToString(LowerWithTransfers(*compute, 1)[0]), "0F0 0B0 0F1 0B1");
}

TEST(ParseAction, RoundTrips) {
  for (const char* text :
       {"2F0", "0B3", "3SEND_F1", "1RECV_B0", "4RECV_F12", "5SEND_B7", "12I3", "7W0", "10F10"}) {
    absl::StatusOr<Action> a = ParseAction(text);
    ASSERT_TRUE(a.ok()) << text << ": " << a.status();
    EXPECT_EQ(ActionToString(*a), text);
  }
}

TEST(ParseAction, Fields) {
  absl::StatusOr<Action> a = ParseAction("3SEND_F1");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(*a, (Action{3, v1::ACTION_SEND_F, 1}));
  a = ParseAction("1RECV_B0");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(*a, (Action{1, v1::ACTION_RECV_B, 0}));
  a = ParseAction("0B3");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(*a, (Action{0, v1::ACTION_B, 3}));
}

TEST(ParseAction, RejectsMalformed) {
  for (const char* text : {"", "F0", "-1F0", "2X0", "2F", "2Fx", "2F0x", "2SEND_F", "2SEND_X1",
                           "2f0", "2F-1", "SEND_F1", "2 F0"}) {
    absl::StatusOr<Action> a = ParseAction(text);
    EXPECT_FALSE(a.ok()) << "accepted '" << text << "'";
    if (!a.ok()) {
      EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument) << text;
    }
  }
}

TEST(ActionsToString, JoinsWithSpaces) {
  EXPECT_EQ(ActionsToString({}), "");
  EXPECT_EQ(ActionsToString({{0, v1::ACTION_F, 0}, {0, v1::ACTION_SEND_F, 0}}), "0F0 0SEND_F0");
}

TEST(Proto, RoundTrips) {
  const Action a{2, v1::ACTION_RECV_F, 5};
  const v1::Action p = ToProto(a);
  EXPECT_EQ(p.stage(), 2);
  EXPECT_EQ(p.kind(), v1::ACTION_RECV_F);
  EXPECT_EQ(p.micro_batch(), 5);
  EXPECT_EQ(FromProto(p), a);
}

TEST(IdealBubbleFraction, FlushScheduleFormula) {
  EXPECT_DOUBLE_EQ(IdealBubbleFraction(4, 4), 3.0 / 7.0);
  EXPECT_DOUBLE_EQ(IdealBubbleFraction(4, 8), 3.0 / 11.0);
  EXPECT_DOUBLE_EQ(IdealBubbleFraction(2, 4), 1.0 / 5.0);
  EXPECT_DOUBLE_EQ(IdealBubbleFraction(1, 8), 0.0);
  EXPECT_DOUBLE_EQ(IdealBubbleFraction(8, 1), 7.0 / 8.0);
}

}  // namespace
}  // namespace tandem
