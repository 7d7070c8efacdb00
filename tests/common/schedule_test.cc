#include "common/schedule.h"

#include <algorithm>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::vector<std::string> ToStrings(const Program& program) {
  std::vector<std::string> out;
  for (const auto& actions : program) out.push_back(ActionsToString(actions));
  return out;
}

// The program of a generator that must succeed.
Program ProgramOf(const absl::StatusOr<Schedule>& schedule) {
  EXPECT_TRUE(schedule.ok()) << schedule.status();
  return schedule.ok() ? schedule->program : Program{};
}

// ---------------------------------------------------------------------------------------------
// Placement

TEST(Placement, OneStagePerRank) {
  const Placement p = OneStagePerRank(3);
  EXPECT_EQ(p.num_ranks, 3);
  EXPECT_THAT(p.rank_of_stage, ElementsAre(0, 1, 2));
  EXPECT_THAT(p.StagesOf(1), ElementsAre(1));
  EXPECT_TRUE(ValidatePlacement(p).ok());
}

TEST(Placement, InterleavedPutsStageSOnRankSModP) {
  const Placement p = InterleavedPlacement(3, 2);
  EXPECT_EQ(p.num_stages(), 6);
  EXPECT_THAT(p.rank_of_stage, ElementsAre(0, 1, 2, 0, 1, 2));
  EXPECT_THAT(p.StagesOf(0), ElementsAre(0, 3));
  EXPECT_THAT(p.StagesOf(2), ElementsAre(2, 5));
  EXPECT_THAT(InterleavedPlacement(2, 3).StagesOf(1), ElementsAre(1, 3, 5));
  EXPECT_TRUE(ValidatePlacement(p).ok());
}

TEST(Placement, VShapeHoldsTheFirstAndLastStageOnRankZero) {
  const Placement p = VShapePlacement(3);
  EXPECT_THAT(p.rank_of_stage, ElementsAre(0, 1, 2, 2, 1, 0));
  EXPECT_THAT(p.StagesOf(0), ElementsAre(0, 5));
  EXPECT_THAT(p.StagesOf(2), ElementsAre(2, 3));
  EXPECT_TRUE(ValidatePlacement(p).ok());
  EXPECT_THAT(VShapePlacement(1).rank_of_stage, ElementsAre(0, 0));
}

TEST(Placement, ValidateRejectsBadPlacements) {
  struct Case {
    int num_ranks;
    std::vector<int> rank_of_stage;
    std::string message;
  };
  const std::vector<Case> cases = {
      {0, {}, "ranks must be at least 1, got 0"},
      {2, {}, "no stages"},
      {2, {0, 2}, "stage 1 is on rank 2, outside [0, 2)"},
      {2, {0, -1}, "stage 1 is on rank -1"},
      {3, {0, 1, 1}, "rank 2 holds no stage"},
  };
  for (const Case& c : cases) {
    Placement placement;
    placement.num_ranks = c.num_ranks;
    placement.rank_of_stage = c.rank_of_stage;
    const absl::Status s = ValidatePlacement(placement);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.message;
    EXPECT_THAT(std::string(s.message()), HasSubstr(c.message));
  }
}

// ---------------------------------------------------------------------------------------------
// GPipe and 1F1B

// Written out by hand from the definition: all forwards, then all backwards in reverse.
TEST(GenerateGPipe, FourRanksEightMicroBatches) {
  absl::StatusOr<Schedule> s = GenerateGPipe(4, 8);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->name, "gpipe");
  EXPECT_EQ(s->placement, OneStagePerRank(4));
  EXPECT_EQ(s->num_micro_batches, 8);
  EXPECT_THAT(ToStrings(s->program),
              ElementsAre("0F0 0F1 0F2 0F3 0F4 0F5 0F6 0F7 0B7 0B6 0B5 0B4 0B3 0B2 0B1 0B0",
                          "1F0 1F1 1F2 1F3 1F4 1F5 1F6 1F7 1B7 1B6 1B5 1B4 1B3 1B2 1B1 1B0",
                          "2F0 2F1 2F2 2F3 2F4 2F5 2F6 2F7 2B7 2B6 2B5 2B4 2B3 2B2 2B1 2B0",
                          "3F0 3F1 3F2 3F3 3F4 3F5 3F6 3F7 3B7 3B6 3B5 3B4 3B3 3B2 3B1 3B0"));
}

TEST(GenerateGPipe, AllowsFewerMicroBatchesThanRanks) {
  EXPECT_THAT(ToStrings(ProgramOf(GenerateGPipe(4, 1))),
              ElementsAre("0F0 0B0", "1F0 1B0", "2F0 2B0", "3F0 3B0"));
  EXPECT_THAT(ToStrings(ProgramOf(GenerateGPipe(2, 3))),
              ElementsAre("0F0 0F1 0F2 0B2 0B1 0B0", "1F0 1F1 1F2 1B2 1B1 1B0"));
  EXPECT_FALSE(GenerateGPipe(0, 1).ok());
  EXPECT_FALSE(GenerateGPipe(1, 0).ok());
}

// Written out by hand from the definition: rank r runs P-r-1 warm-up forwards, then one
// forward and one backward alternately, then drains the backwards.
TEST(Generate1F1B, FourRanksEightMicroBatches) {
  absl::StatusOr<Schedule> s = Generate1F1B(4, 8);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->name, "1f1b");
  EXPECT_EQ(s->placement, OneStagePerRank(4));
  EXPECT_EQ(s->num_micro_batches, 8);
  EXPECT_THAT(ToStrings(s->program),
              ElementsAre("0F0 0F1 0F2 0F3 0B0 0F4 0B1 0F5 0B2 0F6 0B3 0F7 0B4 0B5 0B6 0B7",
                          "1F0 1F1 1F2 1B0 1F3 1B1 1F4 1B2 1F5 1B3 1F6 1B4 1F7 1B5 1B6 1B7",
                          "2F0 2F1 2B0 2F2 2B1 2F3 2B2 2F4 2B3 2F5 2B4 2F6 2B5 2F7 2B6 2B7",
                          "3F0 3B0 3F1 3B1 3F2 3B2 3F3 3B3 3F4 3B4 3F5 3B5 3F6 3B6 3F7 3B7"));
}

TEST(Generate1F1B, EqualRanksAndMicroBatches) {
  EXPECT_THAT(ToStrings(ProgramOf(Generate1F1B(2, 2))),
              ElementsAre("0F0 0F1 0B0 0B1", "1F0 1B0 1F1 1B1"));
}

TEST(Generate1F1B, SingleRankAlternates) {
  EXPECT_THAT(ToStrings(ProgramOf(Generate1F1B(1, 3))), ElementsAre("0F0 0B0 0F1 0B1 0F2 0B2"));
}

TEST(Generate1F1B, RefusesFewerMicroBatchesThanRanks) {
  absl::StatusOr<Schedule> s = Generate1F1B(4, 3);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.status().message(), AllOf(HasSubstr("M=3"), HasSubstr("P=4"), HasSubstr("gpipe")));
}

TEST(Generate1F1B, RefusesEmptySizes) {
  EXPECT_FALSE(Generate1F1B(0, 4).ok());
  EXPECT_FALSE(Generate1F1B(2, 0).ok());
}

// ---------------------------------------------------------------------------------------------
// Interleaved 1F1B

// Written out by hand from Megatron-LM's rule for P = 4, v = 2, M = 8 (stages 0..7, rank r
// holds stages r and 4 + r). The k-th forward runs chunk (k/4)%2 on micro-batch (k/8)*4 + k%4:
// k 0-3 chunk 0 mb 0-3, k 4-7 chunk 1 mb 0-3, k 8-11 chunk 0 mb 4-7, k 12-15 chunk 1 mb 4-7;
// backwards the same with the chunks swapped. Warm-up 2(P-r-1) + (v-1)P = 10, 8, 6, 4.
TEST(GenerateInterleaved1F1B, FourRanksTwoChunksEightMicroBatches) {
  absl::StatusOr<Schedule> s = GenerateInterleaved1F1B(4, 2, 8);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->name, "interleaved_1f1b");
  EXPECT_EQ(s->placement, InterleavedPlacement(4, 2));
  EXPECT_EQ(s->num_micro_batches, 8);
  EXPECT_THAT(ToStrings(s->program),
              ElementsAre(
                  // rank 0: 10 warm-up, 6 steady pairs, 10 drain
                  "0F0 0F1 0F2 0F3 4F0 4F1 4F2 4F3 0F4 0F5 "
                  "0F6 4B0 0F7 4B1 4F4 4B2 4F5 4B3 4F6 0B0 4F7 0B1 "
                  "0B2 0B3 4B4 4B5 4B6 4B7 0B4 0B5 0B6 0B7",
                  // rank 1: 8 warm-up, 8 steady pairs, 8 drain
                  "1F0 1F1 1F2 1F3 5F0 5F1 5F2 5F3 "
                  "1F4 5B0 1F5 5B1 1F6 5B2 1F7 5B3 5F4 1B0 5F5 1B1 5F6 1B2 5F7 1B3 "
                  "5B4 5B5 5B6 5B7 1B4 1B5 1B6 1B7",
                  // rank 2: 6 warm-up, 10 steady pairs, 6 drain
                  "2F0 2F1 2F2 2F3 6F0 6F1 "
                  "6F2 6B0 6F3 6B1 2F4 6B2 2F5 6B3 2F6 2B0 2F7 2B1 6F4 2B2 6F5 2B3 6F6 6B4 6F7 6B5 "
                  "6B6 6B7 2B4 2B5 2B6 2B7",
                  // rank 3: 4 warm-up, 12 steady pairs, 4 drain
                  "3F0 3F1 3F2 3F3 "
                  "7F0 7B0 7F1 7B1 7F2 7B2 7F3 7B3 3F4 3B0 3F5 3B1 3F6 3B2 3F7 3B3 "
                  "7F4 7B4 7F5 7B5 7F6 7B6 7F7 7B7 "
                  "3B4 3B5 3B6 3B7"));
}

// With M == P rank 0's warm-up min(2(P-1) + (v-1)P, vM) is all of its forwards.
TEST(GenerateInterleaved1F1B, TwoRanksTwoChunksTwoMicroBatches) {
  EXPECT_THAT(ToStrings(ProgramOf(GenerateInterleaved1F1B(2, 2, 2))),
              ElementsAre("0F0 0F1 2F0 2F1 2B0 2B1 0B0 0B1", "1F0 1F1 3F0 3B0 3F1 3B1 1B0 1B1"));
}

TEST(GenerateInterleaved1F1B, RefusesBadShapesNamingTheValues) {
  struct Case {
    int p, v, m;
    std::vector<std::string> parts;
  };
  const std::vector<Case> cases = {
      {4, 1, 8, {"at least 2 chunks", "got 1", "1f1b"}},
      {4, 0, 8, {"at least 2 chunks", "got 0"}},
      {4, 2, 3, {"M >= P", "M=3", "P=4", "micro_batches to at least 4"}},
      {4, 2, 6, {"multiple", "M=6", "P=4", "4 or 8"}},
      {3, 3, 10, {"multiple", "M=10", "P=3", "9 or 12"}},
      {0, 2, 4, {"ranks must be at least 1"}},
      {2, 2, 0, {"micro-batches must be at least 1"}},
  };
  for (const Case& c : cases) {
    absl::StatusOr<Schedule> s = GenerateInterleaved1F1B(c.p, c.v, c.m);
    ASSERT_FALSE(s.ok()) << c.p << " " << c.v << " " << c.m;
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
    for (const std::string& part : c.parts) {
      EXPECT_THAT(std::string(s.status().message()), HasSubstr(part));
    }
  }
}

// ---------------------------------------------------------------------------------------------
// ZB-H1

// Written out by hand from the rule: rank r runs P-r-1 warm-up forwards, then F and I
// alternately, each I followed by the oldest W while more than r W's are pending, then the
// remaining I W pairs and the r deferred W's.
TEST(GenerateZBH1, FourRanksEightMicroBatches) {
  absl::StatusOr<Schedule> s = GenerateZBH1(4, 8);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->name, "zb_h1");
  EXPECT_EQ(s->placement, OneStagePerRank(4));
  EXPECT_THAT(
      ToStrings(s->program),
      ElementsAre(
          // rank 0 defers nothing: 1F1B with every B split into I W
          "0F0 0F1 0F2 0F3 0I0 0W0 0F4 0I1 0W1 0F5 0I2 0W2 0F6 0I3 0W3 0F7 0I4 0W4 "
          "0I5 0W5 0I6 0W6 0I7 0W7",
          "1F0 1F1 1F2 1I0 1F3 1I1 1W0 1F4 1I2 1W1 1F5 1I3 1W2 1F6 1I4 1W3 1F7 1I5 1W4 "
          "1I6 1W5 1I7 1W6 1W7",
          "2F0 2F1 2I0 2F2 2I1 2F3 2I2 2W0 2F4 2I3 2W1 2F5 2I4 2W2 2F6 2I5 2W3 2F7 2I6 2W4 "
          "2I7 2W5 2W6 2W7",
          // the last rank defers P-1 = 3 W's
          "3F0 3I0 3F1 3I1 3F2 3I2 3F3 3I3 3W0 3F4 3I4 3W1 3F5 3I5 3W2 3F6 3I6 3W3 3F7 3I7 3W4 "
          "3W5 3W6 3W7"));
}

TEST(GenerateZBH1, RefusesFewerMicroBatchesThanRanks) {
  absl::StatusOr<Schedule> s = GenerateZBH1(4, 3);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.status().message(),
              AllOf(HasSubstr("zb_h1"), HasSubstr("M=3"), HasSubstr("P=4"), HasSubstr("gpipe")));
  EXPECT_THAT(ToStrings(ProgramOf(GenerateZBH1(1, 2))), ElementsAre("0F0 0I0 0W0 0F1 0I1 0W1"));
}

// ---------------------------------------------------------------------------------------------
// ZB-V

// Written out by hand from the rule for P = 2, M = 4 (stages 0..3; rank 0 holds chunk 0 =
// stage 0 and chunk 1 = stage 3, rank 1 holds stages 1 and 2).
TEST(GenerateZBV, TwoRanksFourMicroBatches) {
  absl::StatusOr<Schedule> s = GenerateZBV(2, 4);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->name, "zb_v");
  EXPECT_EQ(s->placement, VShapePlacement(2));
  EXPECT_EQ(s->num_micro_batches, 4);
  EXPECT_THAT(ToStrings(s->program),
              ElementsAre(
                  // 3 x F0 | 0 x (F1 F0) | 2 x (F1 I1 W1) | steady x 2 | 2 x (I0 W0)
                  "0F0 0F1 0F2 "
                  "3F0 3I0 3W0 3F1 3I1 3W1 "
                  "0F3 0I0 0W0 3F2 3I2 3W2 0I1 0W1 3F3 3I3 3W3 "
                  "0I2 0W2 0I3 0W3",
                  // 1 x F0 | 1 x (F1 F0) | 1 x (F1 I1 W1) | steady x 2 | 1 x (I0 I1) |
                  // 1 x (I0 W0) | W1 | W0
                  "1F0 "
                  "2F0 1F1 "
                  "2F1 2I0 2W0 "
                  "1F2 1I0 1W0 2F2 2I1 2W1 1F3 1I1 1W1 2F3 2I2 2W2 "
                  "1I2 2I3 1I3 1W2 2W3 1W3"));
}

// With M < 2P - 1 the schedule for 2P - 1 micro-batches is built and the extra ones dropped.
TEST(GenerateZBV, FewerThanTwoPMinusOneMicroBatchesDropsTheMissingOnes) {
  absl::StatusOr<Schedule> three = GenerateZBV(2, 3);
  absl::StatusOr<Schedule> two = GenerateZBV(2, 2);
  ASSERT_TRUE(three.ok() && two.ok());
  for (size_t r = 0; r < 2; ++r) {
    std::vector<Action> expected;
    for (const Action& a : three->program[r]) {
      if (a.micro_batch < 2) expected.push_back(a);
    }
    EXPECT_EQ(two->program[r], expected) << "rank " << r;
  }
}

TEST(GenerateZBV, RefusesFewerMicroBatchesThanRanks) {
  absl::StatusOr<Schedule> s = GenerateZBV(4, 3);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.status().message(), AllOf(HasSubstr("zb_v"), HasSubstr("M=3"), HasSubstr("P=4")));
  EXPECT_FALSE(GenerateZBV(0, 3).ok());
}

// ---------------------------------------------------------------------------------------------
// Looped BFS and interleaved zero bubble: torch.distributed.pipelining's per-rank orders

// One row of the orders torch's generator gives, rank by rank (its idle slots dropped).
struct TorchOrder {
  int p, v, m;
  std::vector<std::string> ranks;
};

// Made once with PyPI torch 2.15.0 (torch.distributed.pipelining.schedules), building each
// schedule object without a process group and printing its `pipeline_order` without the None
// slots (for ScheduleInterleavedZeroBubble after `_add_bubbles_to_actions`, which only inserts
// None):
//   o = cls.__new__(cls); o.pp_group_size = P; o._n_microbatches = M; o.n_local_stages = v
//   o._stages = [None] * v; o.number_of_rounds = max(1, M // P)
//   o.microbatches_per_round = M // o.number_of_rounds
//   [o._calculate_single_rank_operations(r) for r in range(P)]
const std::vector<TorchOrder>& TorchLoopedBFSOrders() {
  static const auto* kOrders = new std::vector<TorchOrder>{
      {2, 2, 2, {"0F0 0F1 2F0 2F1 2B1 2B0 0B1 0B0", "1F0 1F1 3F0 3F1 3B1 3B0 1B1 1B0"}},
      {3,
       2,
       3,
       {"0F0 0F1 0F2 3F0 3F1 3F2 3B2 3B1 3B0 0B2 0B1 0B0",
        "1F0 1F1 1F2 4F0 4F1 4F2 4B2 4B1 4B0 1B2 1B1 1B0",
        "2F0 2F1 2F2 5F0 5F1 5F2 5B2 5B1 5B0 2B2 2B1 2B0"}},
      {2,
       3,
       4,
       {"0F0 0F1 0F2 0F3 2F0 2F1 2F2 2F3 4F0 4F1 4F2 4F3 4B3 4B2 4B1 4B0 2B3 2B2 2B1 2B0 0B3 0B2 "
        "0B1 0B0",
        "1F0 1F1 1F2 1F3 3F0 3F1 3F2 3F3 5F0 5F1 5F2 5F3 5B3 5B2 5B1 5B0 3B3 3B2 3B1 3B0 1B3 1B2 "
        "1B1 1B0"}},
      {4,
       2,
       4,
       {"0F0 0F1 0F2 0F3 4F0 4F1 4F2 4F3 4B3 4B2 4B1 4B0 0B3 0B2 0B1 0B0",
        "1F0 1F1 1F2 1F3 5F0 5F1 5F2 5F3 5B3 5B2 5B1 5B0 1B3 1B2 1B1 1B0",
        "2F0 2F1 2F2 2F3 6F0 6F1 6F2 6F3 6B3 6B2 6B1 6B0 2B3 2B2 2B1 2B0",
        "3F0 3F1 3F2 3F3 7F0 7F1 7F2 7F3 7B3 7B2 7B1 7B0 3B3 3B2 3B1 3B0"}},
  };
  return *kOrders;
}

const std::vector<TorchOrder>& TorchInterleavedZeroBubbleOrders() {
  static const auto* kOrders = new std::vector<TorchOrder>{
      {2,
       2,
       2,
       {"0F0 0F1 2F0 2F1 2I0 2W0 2I1 2W1 0I0 0W0 0I1 0W1",
        "1F0 1F1 3F0 3I0 3F1 3I1 3W0 1I0 3W1 1I1 1W0 1W1"}},
      {2,
       2,
       4,
       {"0F0 0F1 2F0 2F1 2I0 2W0 0F2 2I1 2W1 0F3 0I0 0W0 2F2 0I1 0W1 2F3 2I2 2W2 2I3 2W3 0I2 0W2 "
        "0I3 0W3",
        "1F0 1F1 3F0 3I0 3F1 3I1 3W0 1F2 1I0 3W1 1F3 1I1 1W0 3F2 3I2 1W1 3F3 3I3 3W2 1I2 3W3 1I3 "
        "1W2 1W3"}},
      {3,
       2,
       3,
       {"0F0 0F1 0F2 3F0 3F1 3F2 3I0 3W0 3I1 3W1 3I2 3W2 0I0 0W0 0I1 0W1 0I2 0W2",
        "1F0 1F1 1F2 4F0 4F1 4I0 4F2 4I1 4W0 4I2 4W1 1I0 4W2 1I1 1W0 1I2 1W1 1W2",
        "2F0 2F1 2F2 5F0 5I0 5F1 5I1 5F2 5I2 5W0 2I0 5W1 2I1 5W2 2I2 2W0 2W1 2W2"}},
      {2,
       3,
       4,
       {"0F0 0F1 2F0 2F1 4F0 4F1 4I0 4W0 0F2 4I1 4W1 0F3 2I0 2W0 2F2 2I1 2W1 2F3 0I0 0W0 4F2 0I1 "
        "0W1 4F3 4I2 4W2 4I3 4W3 2I2 2W2 2I3 2W3 0I2 0W2 0I3 0W3",
        "1F0 1F1 3F0 3F1 5F0 5I0 5F1 5I1 5W0 1F2 3I0 5W1 1F3 3I1 3W0 3F2 1I0 3W1 3F3 1I1 1W0 5F2 "
        "5I2 1W1 5F3 5I3 5W2 3I2 5W3 3I3 3W2 1I2 3W3 1I3 1W2 1W3"}},
      {4,
       2,
       8,
       {"0F0 0F1 0F2 0F3 4F0 4F1 4F2 4F3 4I0 4W0 0F4 4I1 4W1 0F5 4I2 4W2 0F6 4I3 4W3 0F7 0I0 0W0 "
        "4F4 0I1 0W1 4F5 0I2 0W2 4F6 0I3 0W3 4F7 4I4 4W4 4I5 4W5 4I6 4W6 4I7 4W7 0I4 0W4 0I5 0W5 "
        "0I6 0W6 0I7 0W7",
        "1F0 1F1 1F2 1F3 5F0 5F1 5F2 5I0 5F3 5I1 5W0 1F4 5I2 5W1 1F5 5I3 5W2 1F6 1I0 5W3 1F7 1I1 "
        "1W0 5F4 1I2 1W1 5F5 1I3 1W2 5F6 5I4 1W3 5F7 5I5 5W4 5I6 5W5 5I7 5W6 1I4 5W7 1I5 1W4 1I6 "
        "1W5 1I7 1W6 1W7",
        "2F0 2F1 2F2 2F3 6F0 6F1 6I0 6F2 6I1 6F3 6I2 6W0 2F4 6I3 6W1 2F5 2I0 6W2 2F6 2I1 6W3 2F7 "
        "2I2 2W0 6F4 2I3 2W1 6F5 6I4 2W2 6F6 6I5 2W3 6F7 6I6 6W4 6I7 6W5 2I4 6W6 2I5 6W7 2I6 2W4 "
        "2I7 2W5 2W6 2W7",
        "3F0 3F1 3F2 3F3 7F0 7I0 7F1 7I1 7F2 7I2 7F3 7I3 7W0 3F4 3I0 7W1 3F5 3I1 7W2 3F6 3I2 7W3 "
        "3F7 3I3 3W0 7F4 7I4 3W1 7F5 7I5 3W2 7F6 7I6 3W3 7F7 7I7 7W4 3I4 7W5 3I5 7W6 3I6 7W7 3I7 "
        "3W4 3W5 3W6 3W7"}},
      // M not a multiple of P: one round of 6 micro-batches per chunk.
      {4,
       2,
       6,
       {"0F0 0F1 0F2 0F3 0F4 0F5 4F0 4F1 4F2 4F3 4I0 4W0 4F4 4I1 4W1 4F5 4I2 4W2 4I3 4W3 4I4 4W4 "
        "4I5 4W5 0I0 0W0 0I1 0W1 0I2 0W2 0I3 0W3 0I4 0W4 0I5 0W5",
        "1F0 1F1 1F2 1F3 1F4 1F5 5F0 5F1 5F2 5I0 5F3 5I1 5W0 5F4 5I2 5W1 5F5 5I3 5W2 5I4 5W3 5I5 "
        "5W4 1I0 5W5 1I1 1W0 1I2 1W1 1I3 1W2 1I4 1W3 1I5 1W4 1W5",
        "2F0 2F1 2F2 2F3 2F4 2F5 6F0 6F1 6I0 6F2 6I1 6F3 6I2 6W0 6F4 6I3 6W1 6F5 6I4 6W2 6I5 6W3 "
        "2I0 6W4 2I1 6W5 2I2 2W0 2I3 2W1 2I4 2W2 2I5 2W3 2W4 2W5",
        "3F0 3F1 3F2 3F3 3F4 3F5 7F0 7I0 7F1 7I1 7F2 7I2 7F3 7I3 7W0 7F4 7I4 7W1 7F5 7I5 7W2 3I0 "
        "7W3 3I1 7W4 3I2 7W5 3I3 3W0 3I4 3W1 3I5 3W2 3W3 3W4 3W5"}},
  };
  return *kOrders;
}

TEST(GenerateLoopedBFS, SameOrderAsTorch) {
  for (const TorchOrder& t : TorchLoopedBFSOrders()) {
    absl::StatusOr<Schedule> s = GenerateSchedule("looped_bfs", t.p, t.m, t.v);
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_EQ(s->placement, InterleavedPlacement(t.p, t.v));
    EXPECT_EQ(ToStrings(s->program), t.ranks) << "P=" << t.p << " v=" << t.v << " M=" << t.m;
  }
}

TEST(GenerateLoopedBFS, OneChunkIsGPipeAndFewMicroBatchesAreFine) {
  EXPECT_EQ(ProgramOf(GenerateLoopedBFS(4, 1, 3)), ProgramOf(GenerateGPipe(4, 3)));
  absl::StatusOr<Schedule> none = GenerateLoopedBFS(2, 0, 4);
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(none.status().message(), AllOf(HasSubstr("looped_bfs"), HasSubstr("1 chunk")));
  EXPECT_FALSE(GenerateLoopedBFS(2, 2, 0).ok());
}

TEST(GenerateInterleavedZeroBubble, SameOrderAsTorch) {
  for (const TorchOrder& t : TorchInterleavedZeroBubbleOrders()) {
    absl::StatusOr<Schedule> s = GenerateSchedule("interleaved_zb", t.p, t.m, t.v);
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_EQ(s->placement, InterleavedPlacement(t.p, t.v));
    EXPECT_EQ(ToStrings(s->program), t.ranks) << "P=" << t.p << " v=" << t.v << " M=" << t.m;
  }
}

TEST(GenerateInterleavedZeroBubble, RefusesBadShapesNamingTheRule) {
  absl::StatusOr<Schedule> one = GenerateInterleavedZeroBubble(2, 1, 4);
  ASSERT_FALSE(one.ok());
  EXPECT_EQ(one.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(one.status().message(), AllOf(HasSubstr("interleaved_zb"),
                                            HasSubstr("at least 2 chunks"), HasSubstr("zb_h1")));
  absl::StatusOr<Schedule> few = GenerateInterleavedZeroBubble(4, 2, 3);
  ASSERT_FALSE(few.ok());
  EXPECT_THAT(few.status().message(),
              AllOf(HasSubstr("interleaved_zb"), HasSubstr("M >= P"), HasSubstr("M=3")));
  // M = 9, P = 4: two rounds do not divide 9 micro-batches.
  absl::StatusOr<Schedule> uneven = GenerateInterleavedZeroBubble(4, 2, 9);
  ASSERT_FALSE(uneven.ok());
  EXPECT_THAT(uneven.status().message(),
              AllOf(HasSubstr("interleaved_zb"), HasSubstr("rounds"), HasSubstr("M=9")));
  EXPECT_TRUE(GenerateInterleavedZeroBubble(4, 2, 10).ok());  // two rounds of 5
}

// ---------------------------------------------------------------------------------------------
// ZB-H2

TEST(GenerateZBH2, TwoRanksFourMicroBatches) {
  // Rank 0: 3 warm-up forwards, then I F W, then I W; rank 1 defers 2 W's: 1 forward, then I F
  // (and a W once 3 are pending), then I W and the 2 deferred W's.
  EXPECT_THAT(ToStrings(ProgramOf(GenerateZBH2(2, 4))),
              ElementsAre("0F0 0F1 0F2 0I0 0F3 0W0 0I1 0W1 0I2 0W2 0I3 0W3",
                          "1F0 1I0 1F1 1I1 1F2 1I2 1F3 1W0 1I3 1W1 1W2 1W3"));
}

TEST(GenerateZBH2, RefusesFewerMicroBatchesThanRanks) {
  absl::StatusOr<Schedule> s = GenerateZBH2(4, 3);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.status().message(), AllOf(HasSubstr("zb_h2"), HasSubstr("M=3"), HasSubstr("P=4")));
  absl::StatusOr<Schedule> chunks = GenerateSchedule("zb_h2", 2, 4, 2);
  ASSERT_FALSE(chunks.ok());
  EXPECT_THAT(chunks.status().message(), AllOf(HasSubstr("zb_h2"), HasSubstr("1 chunk per rank")));
}

// ---------------------------------------------------------------------------------------------
// All generators

struct Shape {
  std::string name;
  int p, m, v;
};

// The (schedule, P, M, chunks) that satisfy each generator's constraints, for sweeps.
std::vector<Shape> ValidShapes() {
  std::vector<Shape> out;
  for (int p = 1; p <= 6; ++p) {
    for (int m = 1; m <= 3 * p + 2; ++m) {
      out.push_back({"gpipe", p, m, 1});
      if (m < p) continue;
      out.push_back({"1f1b", p, m, 1});
      out.push_back({"zb_h1", p, m, 1});
      out.push_back({"zb_v", p, m, 2});
      out.push_back({"zb_h2", p, m, 1});
      for (int v = 1; v <= 3; ++v) out.push_back({"looped_bfs", p, m, v});
      if (m % std::max(1, m / p) == 0) {
        for (int v = 2; v <= 3; ++v) out.push_back({"interleaved_zb", p, m, v});
      }
      if (m % p != 0) continue;
      for (int v = 2; v <= 4; ++v) out.push_back({"interleaved_1f1b", p, m, v});
    }
  }
  return out;
}

// Every generated program runs, for every stage on its rank, each F once and then either B
// once or I and then W once each.
TEST(GenerateSchedule, EveryStageRunsEachMicroBatchOnceForwardBeforeBackward) {
  for (const Shape& sh : ValidShapes()) {
    const std::string label = absl::StrCat(sh.name, " P=", sh.p, " M=", sh.m, " v=", sh.v);
    absl::StatusOr<Schedule> s = GenerateSchedule(sh.name, sh.p, sh.m, sh.v);
    ASSERT_TRUE(s.ok()) << label << ": " << s.status();
    EXPECT_EQ(s->name, sh.name);
    EXPECT_EQ(s->num_micro_batches, sh.m);
    ASSERT_TRUE(ValidatePlacement(s->placement).ok()) << label;
    ASSERT_EQ(s->placement.num_stages(), sh.p * sh.v) << label;
    ASSERT_EQ(s->program.size(), static_cast<size_t>(sh.p)) << label;
    const bool split = sh.name == "zb_h1" || sh.name == "zb_h2" || sh.name == "zb_v" ||
                       sh.name == "interleaved_zb";
    // (stage, mb) -> counts of F, B, I, W
    std::map<std::pair<int, int>, std::vector<int>> seen;
    for (int r = 0; r < sh.p; ++r) {
      for (const Action& a : s->program[r]) {
        ASSERT_EQ(s->placement.rank_of_stage.at(a.stage), r) << label << " " << ActionToString(a);
        ASSERT_GE(a.micro_batch, 0);
        ASSERT_LT(a.micro_batch, sh.m);
        std::vector<int>& n = seen[{a.stage, a.micro_batch}];
        n.resize(4, 0);
        switch (a.kind) {
          case v1::ACTION_F:
            ++n[0];
            break;
          case v1::ACTION_B:
            EXPECT_FALSE(split) << label;
            EXPECT_EQ(n[0], 1) << label << " " << ActionToString(a);
            ++n[1];
            break;
          case v1::ACTION_I:
            EXPECT_TRUE(split) << label;
            EXPECT_EQ(n[0], 1) << label << " " << ActionToString(a);
            ++n[2];
            break;
          case v1::ACTION_W:
            EXPECT_EQ(n[2], 1) << label << " " << ActionToString(a);
            ++n[3];
            break;
          default:
            ADD_FAILURE() << label << ": transfer in a compute-only program";
        }
      }
    }
    ASSERT_EQ(seen.size(), static_cast<size_t>(sh.p * sh.v * sh.m)) << label;
    for (const auto& [key, n] : seen) {
      EXPECT_EQ(n[0], 1) << label;
      EXPECT_EQ(n[1], split ? 0 : 1) << label;
      EXPECT_EQ(n[2], split ? 1 : 0) << label;
      EXPECT_EQ(n[3], split ? 1 : 0) << label;
    }
  }
}

TEST(GenerateSchedule, NamesAndDefaultChunks) {
  EXPECT_THAT(ScheduleNames(), ElementsAre("gpipe", "1f1b", "interleaved_1f1b", "zb_h1", "zb_v"));
  EXPECT_EQ(DefaultChunks("gpipe"), 1);
  EXPECT_EQ(DefaultChunks("1f1b"), 1);
  EXPECT_EQ(DefaultChunks("zb_h1"), 1);
  EXPECT_EQ(DefaultChunks("interleaved_1f1b"), 2);
  EXPECT_EQ(DefaultChunks("Interleaved"), 2);
  EXPECT_EQ(DefaultChunks("zb_v"), 2);
  EXPECT_EQ(DefaultChunks("ZBV"), 2);
  // The newer schedules are selectable, not yet planner candidates.
  EXPECT_THAT(AllScheduleNames(), ElementsAre("gpipe", "1f1b", "interleaved_1f1b", "zb_h1", "zb_v",
                                              "looped_bfs", "interleaved_zb", "zb_h2"));
  EXPECT_EQ(DefaultChunks("looped_bfs"), 2);
  EXPECT_EQ(DefaultChunks("interleaved_zb"), 2);
  EXPECT_EQ(DefaultChunks("zb_h2"), 1);
  EXPECT_TRUE(TakesChunks("looped_bfs"));
  EXPECT_TRUE(TakesChunks("interleaved_zb"));
  EXPECT_FALSE(TakesChunks("zb_h2"));
  EXPECT_FALSE(TakesChunks("zb_v"));
}

TEST(GenerateSchedule, ByNameWithAliases) {
  EXPECT_EQ(ActionsToString(ProgramOf(GenerateSchedule("gpipe", 2, 2))[0]), "0F0 0F1 0B1 0B0");
  EXPECT_EQ(ActionsToString(ProgramOf(GenerateSchedule("1F1B", 2, 2))[0]), "0F0 0F1 0B0 0B1");
  for (const auto& [alias, name] :
       std::vector<std::pair<std::string, std::string>>{{"interleaved", "interleaved_1f1b"},
                                                        {"Interleaved_1F1B", "interleaved_1f1b"},
                                                        {"interleaved-1f1b", "interleaved_1f1b"},
                                                        {"zbh1", "zb_h1"},
                                                        {"ZB-H1", "zb_h1"},
                                                        {"zbv", "zb_v"},
                                                        {"zbh2", "zb_h2"},
                                                        {"ZB-H2", "zb_h2"},
                                                        {"Looped-BFS", "looped_bfs"},
                                                        {"interleaved_zb", "interleaved_zb"},
                                                        {"zb_v", "zb_v"}}) {
    absl::StatusOr<Schedule> s = GenerateSchedule(alias, 2, 4);
    ASSERT_TRUE(s.ok()) << alias << ": " << s.status();
    EXPECT_EQ(s->name, name) << alias;
  }
  absl::StatusOr<Schedule> bad = GenerateSchedule("zero_bubble", 2, 2);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(),
              AllOf(HasSubstr("zero_bubble"), HasSubstr("1f1b"), HasSubstr("zb_v")));
}

TEST(GenerateSchedule, ChunksAreChecked) {
  // gpipe, 1f1b and zb_h1 run one chunk; zb_v two; interleaved 2 or more (0 = 2).
  for (const char* name : {"gpipe", "1f1b", "zb_h1"}) {
    EXPECT_TRUE(GenerateSchedule(name, 2, 4, 0).ok()) << name;
    EXPECT_TRUE(GenerateSchedule(name, 2, 4, 1).ok()) << name;
    absl::StatusOr<Schedule> s = GenerateSchedule(name, 2, 4, 2);
    ASSERT_FALSE(s.ok()) << name;
    EXPECT_THAT(s.status().message(), AllOf(HasSubstr("1 chunk per rank"), HasSubstr("chunks=2"),
                                            HasSubstr("interleaved_1f1b")));
  }
  EXPECT_TRUE(GenerateSchedule("zb_v", 2, 4, 0).ok());
  EXPECT_TRUE(GenerateSchedule("zb_v", 2, 4, 2).ok());
  for (int chunks : {1, 3}) {
    absl::StatusOr<Schedule> s = GenerateSchedule("zb_v", 2, 4, chunks);
    ASSERT_FALSE(s.ok());
    EXPECT_THAT(s.status().message(),
                AllOf(HasSubstr("2 chunks per rank"), HasSubstr(absl::StrCat("chunks=", chunks))));
  }
  absl::StatusOr<Schedule> two = GenerateSchedule("interleaved_1f1b", 2, 4, 0);
  ASSERT_TRUE(two.ok());
  EXPECT_EQ(two->placement, InterleavedPlacement(2, 2));
  absl::StatusOr<Schedule> three = GenerateSchedule("interleaved_1f1b", 2, 4, 3);
  ASSERT_TRUE(three.ok());
  EXPECT_EQ(three->placement, InterleavedPlacement(2, 3));
  EXPECT_THAT(GenerateSchedule("interleaved_1f1b", 2, 4, 1).status().message(),
              HasSubstr("at least 2 chunks"));
  EXPECT_THAT(GenerateSchedule("1f1b", 2, 4, -1).status().message(), HasSubstr("got -1"));
}

TEST(GenerateForwardOnly, EveryStageOfEveryRankAscending) {
  absl::StatusOr<Schedule> s = GenerateForwardOnly(InterleavedPlacement(2, 2), 2);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->name, "forward_only");
  EXPECT_EQ(s->placement, InterleavedPlacement(2, 2));
  EXPECT_THAT(ToStrings(s->program), ElementsAre("0F0 0F1 2F0 2F1", "1F0 1F1 3F0 3F1"));
  EXPECT_THAT(ToStrings(ProgramOf(GenerateForwardOnly(VShapePlacement(2), 1))),
              ElementsAre("0F0 3F0", "1F0 2F0"));
  EXPECT_FALSE(GenerateForwardOnly(OneStagePerRank(2), 0).ok());
  EXPECT_FALSE(GenerateForwardOnly(Placement{2, {0, 0}}, 1).ok());
  // Lowered, the receive of a later chunk comes after the earlier chunks' forwards.
  EXPECT_THAT(ToStrings(LowerWithTransfers(*s).program),
              ElementsAre("0F0 0SEND_F0 0F1 0SEND_F1 2RECV_F0 2F0 2SEND_F0 2RECV_F1 2F1 2SEND_F1",
                          "1RECV_F0 1F0 1SEND_F0 1RECV_F1 1F1 1SEND_F1 3RECV_F0 3F0 3RECV_F1 3F1"));
}

// ---------------------------------------------------------------------------------------------
// Lowering

TEST(LowerWithTransfers, TwoRanksTwoMicroBatches) {
  const Program compute = ProgramOf(Generate1F1B(2, 2));
  EXPECT_THAT(ToStrings(LowerWithTransfers(compute, OneStagePerRank(2))),
              ElementsAre("0F0 0SEND_F0 0F1 0SEND_F1 0RECV_B0 0B0 0RECV_B1 0B1",
                          "1RECV_F0 1F0 1B0 1SEND_B0 1RECV_F1 1F1 1B1 1SEND_B1"));
}

TEST(LowerWithTransfers, MiddleRankReceivesAndSendsBothWays) {
  const Program lowered = LowerWithTransfers(ProgramOf(Generate1F1B(3, 3)), OneStagePerRank(3));
  EXPECT_EQ(ActionsToString(lowered[1]),
            "1RECV_F0 1F0 1SEND_F0 1RECV_F1 1F1 1SEND_F1 1RECV_B0 1B0 1SEND_B0 "
            "1RECV_F2 1F2 1SEND_F2 1RECV_B1 1B1 1SEND_B1 1RECV_B2 1B2 1SEND_B2");
}

TEST(LowerWithTransfers, SingleRankHasNoTransfers) {
  EXPECT_EQ(
      ActionsToString(LowerWithTransfers(ProgramOf(Generate1F1B(1, 2)), OneStagePerRank(1))[0]),
      "0F0 0B0 0F1 0B1");
  // Two chunks on one rank hand off locally.
  EXPECT_EQ(ActionsToString(LowerWithTransfers(ProgramOf(GenerateInterleaved1F1B(1, 2, 1)),
                                               InterleavedPlacement(1, 2))[0]),
            "0F0 1F0 1B0 0B0");
}

// I carries the input gradient (RECV_B before, SEND_B after); W has no transfers.
TEST(LowerWithTransfers, SplitBackwardTransfersOnlyAroundI) {
  const Program lowered = LowerWithTransfers(ProgramOf(GenerateZBH1(2, 2)), OneStagePerRank(2));
  EXPECT_THAT(ToStrings(lowered),
              ElementsAre("0F0 0SEND_F0 0F1 0SEND_F1 0RECV_B0 0I0 0W0 0RECV_B1 0I1 0W1",
                          "1RECV_F0 1F0 1I0 1SEND_B0 1RECV_F1 1F1 1I1 1SEND_B1 1W0 1W1"));
}

// On the V, stages P-1 and P share the last rank: no transfer between them, and the first and
// last stage share rank 0.
TEST(LowerWithTransfers, VShapeHandsOffLocallyAtTheBottomOfTheV) {
  const Program compute = {{{0, v1::ACTION_F, 0},
                            {3, v1::ACTION_F, 0},
                            {3, v1::ACTION_I, 0},
                            {3, v1::ACTION_W, 0},
                            {0, v1::ACTION_I, 0},
                            {0, v1::ACTION_W, 0}},
                           {{1, v1::ACTION_F, 0},
                            {2, v1::ACTION_F, 0},
                            {2, v1::ACTION_I, 0},
                            {2, v1::ACTION_W, 0},
                            {1, v1::ACTION_I, 0},
                            {1, v1::ACTION_W, 0}}};
  EXPECT_THAT(ToStrings(LowerWithTransfers(compute, VShapePlacement(2))),
              ElementsAre("0F0 0SEND_F0 3RECV_F0 3F0 3I0 3SEND_B0 3W0 0RECV_B0 0I0 0W0",
                          "1RECV_F0 1F0 2F0 2SEND_F0 2RECV_B0 2I0 2W0 1I0 1SEND_B0 1W0"));
}

TEST(LowerWithTransfers, InterleavedSendsBetweenEveryNeighbourPair) {
  const Program lowered =
      LowerWithTransfers(ProgramOf(GenerateInterleaved1F1B(2, 2, 2)), InterleavedPlacement(2, 2));
  EXPECT_THAT(ToStrings(lowered),
              ElementsAre("0F0 0SEND_F0 0F1 0SEND_F1 2RECV_F0 2F0 2SEND_F0 2RECV_F1 2F1 2SEND_F1 "
                          "2RECV_B0 2B0 2SEND_B0 2RECV_B1 2B1 2SEND_B1 0RECV_B0 0B0 0RECV_B1 0B1",
                          "1RECV_F0 1F0 1SEND_F0 1RECV_F1 1F1 1SEND_F1 3RECV_F0 3F0 3B0 3SEND_B0 "
                          "3RECV_F1 3F1 3B1 3SEND_B1 1RECV_B0 1B0 1SEND_B0 1RECV_B1 1B1 1SEND_B1"));
}

TEST(LowerWithTransfers, IsIdempotentForEveryGeneratedSchedule) {
  for (const Shape& sh : ValidShapes()) {
    absl::StatusOr<Schedule> s = GenerateSchedule(sh.name, sh.p, sh.m, sh.v);
    ASSERT_TRUE(s.ok());
    const Schedule once = LowerWithTransfers(*s);
    EXPECT_EQ(once.placement, s->placement);
    EXPECT_EQ(once.name, s->name);
    EXPECT_EQ(LowerWithTransfers(once).program, once.program)
        << sh.name << " P=" << sh.p << " M=" << sh.m << " v=" << sh.v;
  }
}

// A transfer already present (here: moved away from its compute) stays where it is.
TEST(LowerWithTransfers, KeepsTransfersAlreadyThere) {
  const Program partly = {
      {{0, v1::ACTION_F, 0},
       {0, v1::ACTION_F, 1},
       {0, v1::ACTION_SEND_F, 0},
       {0, v1::ACTION_SEND_F, 1},
       {0, v1::ACTION_B, 0},
       {0, v1::ACTION_B, 1}},
      {{1, v1::ACTION_F, 0}, {1, v1::ACTION_B, 0}, {1, v1::ACTION_F, 1}, {1, v1::ACTION_B, 1}}};
  EXPECT_THAT(ToStrings(LowerWithTransfers(partly, OneStagePerRank(2))),
              ElementsAre("0F0 0F1 0SEND_F0 0SEND_F1 0RECV_B0 0B0 0RECV_B1 0B1",
                          "1RECV_F0 1F0 1B0 1SEND_B0 1RECV_F1 1F1 1B1 1SEND_B1"));
}

// Both ends of every lowered message name it alike: each send's message is received exactly
// once, on the rank of the receiving stage, and names that stage.
TEST(MessageOf, EverySendHasExactlyOneReceiveWithItsMessage) {
  for (const Shape& sh : ValidShapes()) {
    absl::StatusOr<Schedule> s = GenerateSchedule(sh.name, sh.p, sh.m, sh.v);
    ASSERT_TRUE(s.ok());
    const Schedule lowered = LowerWithTransfers(*s);
    std::map<TransferMessage, int> sends, receives;
    for (int r = 0; r < lowered.placement.num_ranks; ++r) {
      for (const Action& a : lowered.program[r]) {
        if (!IsTransferAction(a.kind)) continue;
        const TransferMessage m = MessageOf(a);
        const bool send = a.kind == v1::ACTION_SEND_F || a.kind == v1::ACTION_SEND_B;
        EXPECT_EQ(send ? m.from_stage : m.to_stage, a.stage) << ActionToString(a);
        if (!send) {
          EXPECT_EQ(lowered.placement.rank_of_stage[m.to_stage], r) << ActionToString(a);
        }
        ++(send ? sends : receives)[m];
      }
    }
    EXPECT_EQ(sends, receives) << sh.name << " P=" << sh.p << " M=" << sh.m << " v=" << sh.v;
    for (const auto& [m, n] : sends) EXPECT_EQ(n, 1);
  }
}

TEST(MessageOf, ForwardGoesUpAndGradientGoesDown) {
  EXPECT_EQ(MessageOf({2, v1::ACTION_SEND_F, 5}), (TransferMessage{v1::ACTION_SEND_F, 2, 3, 5}));
  EXPECT_EQ(MessageOf({3, v1::ACTION_RECV_F, 5}), (TransferMessage{v1::ACTION_SEND_F, 2, 3, 5}));
  EXPECT_EQ(MessageOf({2, v1::ACTION_SEND_B, 1}), (TransferMessage{v1::ACTION_SEND_B, 2, 1, 1}));
  EXPECT_EQ(MessageOf({1, v1::ACTION_RECV_B, 1}), (TransferMessage{v1::ACTION_SEND_B, 2, 1, 1}));
}

// ---------------------------------------------------------------------------------------------
// Notation

TEST(ParseAction, RoundTrips) {
  for (const char* text : {"2F0", "0B3", "1I2", "1W2", "3SEND_F1", "1RECV_B0", "4RECV_F12",
                           "5SEND_B7", "12I3", "7W0", "10F10"}) {
    absl::StatusOr<Action> a = ParseAction(text);
    ASSERT_TRUE(a.ok()) << text << ": " << a.status();
    EXPECT_EQ(ActionToString(*a), text);
  }
}

TEST(ParseAction, Fields) {
  const std::vector<std::pair<std::string, Action>> cases = {
      {"2F0", {2, v1::ACTION_F, 0}},
      {"0B3", {0, v1::ACTION_B, 3}},
      {"1I2", {1, v1::ACTION_I, 2}},
      {"1W2", {1, v1::ACTION_W, 2}},
      {"3SEND_F1", {3, v1::ACTION_SEND_F, 1}},
      {"1RECV_B0", {1, v1::ACTION_RECV_B, 0}},
      {" 4RECV_F5 ", {4, v1::ACTION_RECV_F, 5}},
      {"0SEND_B9", {0, v1::ACTION_SEND_B, 9}},
  };
  for (const auto& [text, action] : cases) {
    absl::StatusOr<Action> a = ParseAction(text);
    ASSERT_TRUE(a.ok()) << text;
    EXPECT_EQ(*a, action) << text;
  }
}

TEST(ParseAction, RejectsMalformed) {
  for (const char* text : {"", "F0", "-1F0", "2X0", "2F", "2Fx", "2F0x", "2SEND_F", "2SEND_X1",
                           "2f0", "2F-1", "SEND_F1", "2 F0", "1IW2"}) {
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
  for (const Action& a : {Action{2, v1::ACTION_RECV_F, 5}, Action{7, v1::ACTION_W, 1}}) {
    const v1::Action p = ToProto(a);
    EXPECT_EQ(p.stage(), a.stage);
    EXPECT_EQ(p.kind(), a.kind);
    EXPECT_EQ(p.micro_batch(), a.micro_batch);
    EXPECT_EQ(FromProto(p), a);
  }
}

TEST(IdealBubbleFraction, FlushScheduleFormula) {
  EXPECT_DOUBLE_EQ(IdealBubbleFraction(4, 4), 3.0 / 7.0);
  EXPECT_DOUBLE_EQ(IdealBubbleFraction(4, 8), 3.0 / 11.0);
  EXPECT_DOUBLE_EQ(IdealBubbleFraction(2, 4), 1.0 / 5.0);
  EXPECT_DOUBLE_EQ(IdealBubbleFraction(1, 8), 0.0);
  EXPECT_DOUBLE_EQ(IdealBubbleFraction(8, 1), 7.0 / 8.0);
  // v chunks: (P-1) / (v M + P - 1)
  EXPECT_DOUBLE_EQ(IdealBubbleFraction(4, 8, 1), 3.0 / 11.0);
  EXPECT_DOUBLE_EQ(IdealBubbleFraction(4, 8, 2), 3.0 / 19.0);
  EXPECT_DOUBLE_EQ(IdealBubbleFraction(4, 4, 3), 3.0 / 15.0);
  EXPECT_DOUBLE_EQ(IdealBubbleFraction(1, 4, 2), 0.0);
}

// ---------------------------------------------------------------------------------------------
// Data parallelism: REDUCE_GRAD

TEST(ParseAction, ReduceGradHasNoMicroBatch) {
  absl::StatusOr<Action> a = ParseAction("2REDUCE_GRAD");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(*a, (Action{2, v1::ACTION_REDUCE_GRAD, 0}));
  EXPECT_EQ(ActionToString(*a), "2REDUCE_GRAD");
  EXPECT_TRUE(IsReductionAction(a->kind));
  EXPECT_FALSE(IsComputeAction(a->kind));
  EXPECT_FALSE(IsTransferAction(a->kind));
  absl::StatusOr<Action> bad = ParseAction("2REDUCE_GRAD0");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("takes no micro-batch"), std::string::npos);
}

// One REDUCE_GRAD per stage, right after its last weight gradient (B; W when split) and the
// send that follows it; idempotent.
TEST(AddGradReductions, FollowsEachStagesLastWeightGradient) {
  for (const char* name : {"gpipe", "1f1b", "interleaved_1f1b", "zb_h1", "zb_v"}) {
    SCOPED_TRACE(name);
    absl::StatusOr<Schedule> s = GenerateSchedule(name, 2, 4);
    ASSERT_TRUE(s.ok()) << s.status();
    const Schedule lowered = LowerWithTransfers(*s);
    const Schedule reduced = AddGradReductions(lowered);
    EXPECT_EQ(AddGradReductions(reduced).program, reduced.program);
    for (size_t r = 0; r < reduced.program.size(); ++r) {
      const std::vector<Action>& list = reduced.program[r];
      EXPECT_EQ(list.size(),
                lowered.program[r].size() + reduced.placement.StagesOf(static_cast<int>(r)).size());
      for (int stage : reduced.placement.StagesOf(static_cast<int>(r))) {
        size_t last_grad = 0, at = list.size();
        for (size_t i = 0; i < list.size(); ++i) {
          if (list[i].stage != stage) continue;
          if (list[i].kind == v1::ACTION_B || list[i].kind == v1::ACTION_W) last_grad = i;
          if (list[i].kind == v1::ACTION_REDUCE_GRAD) at = i;
        }
        ASSERT_LT(at, list.size()) << "stage " << stage << " has no REDUCE_GRAD";
        EXPECT_GT(at, last_grad);
        for (size_t i = last_grad + 1; i < at; ++i) {
          EXPECT_TRUE(list[i].stage == stage && IsTransferAction(list[i].kind))
              << ActionsToString(list);
        }
      }
    }
  }
}

// Full recomputation: an R just before each backward, before its RECV_B once lowered.
TEST(AddRecomputation, PutsAnRBeforeEachBackward) {
  const Program compute = ProgramOf(Generate1F1B(2, 2));
  EXPECT_THAT(ToStrings(AddRecomputation(compute)),
              ElementsAre("0F0 0F1 0R0 0B0 0R1 0B1", "1F0 1R0 1B0 1F1 1R1 1B1"));
  // Lowering after: the receive of the gradient comes between R and its backward.
  EXPECT_THAT(ToStrings(LowerWithTransfers(AddRecomputation(compute), OneStagePerRank(2))),
              ElementsAre("0F0 0SEND_F0 0F1 0SEND_F1 0R0 0RECV_B0 0B0 0R1 0RECV_B1 0B1",
                          "1RECV_F0 1F0 1R0 1B0 1SEND_B0 1RECV_F1 1F1 1R1 1B1 1SEND_B1"));
  // Recomputing a lowered program gives the same, and a second pass changes nothing.
  const Program lowered = LowerWithTransfers(compute, OneStagePerRank(2));
  EXPECT_EQ(AddRecomputation(lowered),
            LowerWithTransfers(AddRecomputation(compute), OneStagePerRank(2)));
  EXPECT_EQ(AddRecomputation(AddRecomputation(lowered)), AddRecomputation(lowered));
  // The split backward: before I, never before W.
  EXPECT_THAT(ToStrings(AddRecomputation(ProgramOf(GenerateZBH1(1, 2)))),
              ElementsAre("0F0 0R0 0I0 0W0 0F1 0R1 0I1 0W1"));
}

TEST(ParseAction, RecomputeRoundTripsBesideTheOtherRKinds) {
  for (const char* text : {"1R3", "0R0", "12R7", "1RECV_B0", "1RECV_F2", "2REDUCE_GRAD"}) {
    absl::StatusOr<Action> a = ParseAction(text);
    ASSERT_TRUE(a.ok()) << text << ": " << a.status();
    EXPECT_EQ(ActionToString(*a), text);
  }
  absl::StatusOr<Action> r = ParseAction("1R3");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, (Action{1, v1::ACTION_R, 3}));
  EXPECT_TRUE(IsComputeAction(v1::ACTION_R));
  EXPECT_FALSE(IsTransferAction(v1::ACTION_R));
  EXPECT_FALSE(ParseAction("1R").ok());
}

// The gang's picture: replica r's stages renumbered r S + s on ranks r P + p.
TEST(ReplicatedSchedule, RenumbersStagesAndRanksPerReplica) {
  absl::StatusOr<Schedule> s = GenerateSchedule("1f1b", 2, 2);
  ASSERT_TRUE(s.ok());
  const Schedule lowered = LowerWithTransfers(*s);
  EXPECT_EQ(ReplicatedSchedule(lowered, 1).program, lowered.program);
  const Schedule wide = ReplicatedSchedule(lowered, 3);
  EXPECT_EQ(wide.placement.num_ranks, 6);
  EXPECT_EQ(wide.placement.rank_of_stage, (std::vector<int>{0, 1, 2, 3, 4, 5}));
  ASSERT_EQ(wide.program.size(), 6u);
  EXPECT_EQ(ActionsToString(wide.program[3]),
            "3RECV_F0 3F0 3B0 3SEND_B0 3RECV_F1 3F1 3B1 3SEND_B1");
  // Transfers pair within a replica: replica 1's first stage sends to its own second.
  EXPECT_EQ(MessageOf(Action{2, v1::ACTION_SEND_F, 0}).to_stage, 3);
}

}  // namespace
}  // namespace tandem
