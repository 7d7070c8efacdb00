#include "common/schedule.h"

#include <algorithm>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/schedule_check.h"
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
  // Every schedule, in the order the planner tries them and plan --compare lists them.
  EXPECT_THAT(AllScheduleNames(),
              ElementsAre("gpipe", "1f1b", "interleaved_1f1b", "zb_h1", "zb_v", "looped_bfs",
                          "interleaved_zb", "zb_h2", "dualpipe_v", "v_half", "v_min", "zb_auto"));
  EXPECT_EQ(DefaultChunks("zb_auto"), 1);
  EXPECT_FALSE(TakesChunks("zb_auto"));
  // Without a profile, zb_auto is built for equal stages within 1F1B's memory.
  absl::StatusOr<Schedule> automatic = GenerateSchedule("zbauto", 4, 8);
  ASSERT_TRUE(automatic.ok()) << automatic.status();
  EXPECT_EQ(automatic->name, "zb_auto");
  EXPECT_TRUE(ValidateSchedule(LowerWithTransfers(*automatic)).ok());
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

// Full recomputation: an R right before each backward, after its RECV_B once lowered, so that
// every R runs inside its backward (RecomputeAtBackward).
TEST(AddRecomputation, PutsAnRRightBeforeEachBackward) {
  const Program compute = ProgramOf(Generate1F1B(2, 2));
  EXPECT_THAT(ToStrings(AddRecomputation(compute)),
              ElementsAre("0F0 0F1 0R0 0B0 0R1 0B1", "1F0 1R0 1B0 1F1 1R1 1B1"));
  // Lowering after: the receive of the gradient goes before the R, which stays right before
  // its backward; recomputing a lowered program gives the same.
  const Program lowered = LowerWithTransfers(compute, OneStagePerRank(2));
  EXPECT_THAT(ToStrings(AddRecomputation(lowered)),
              ElementsAre("0F0 0SEND_F0 0F1 0SEND_F1 0RECV_B0 0R0 0B0 0RECV_B1 0R1 0B1",
                          "1RECV_F0 1F0 1R0 1B0 1SEND_B0 1RECV_F1 1F1 1R1 1B1 1SEND_B1"));
  EXPECT_EQ(LowerWithTransfers(AddRecomputation(compute), OneStagePerRank(2)),
            AddRecomputation(lowered));
  // A second pass changes nothing; every R is recomputed inside its backward.
  EXPECT_EQ(AddRecomputation(AddRecomputation(lowered)), AddRecomputation(lowered));
  for (const auto& list : AddRecomputation(lowered)) {
    const std::vector<bool> inside = RecomputeAtBackward(list);
    for (size_t i = 0; i < list.size(); ++i) {
      EXPECT_EQ(inside[i], list[i].kind == v1::ACTION_R) << ActionsToString(list) << " at " << i;
    }
  }
  // An R with anything between it and its backward (here its RECV_B) recomputes at once.
  const std::vector<Action> early = {
      {0, v1::ACTION_F, 0}, {0, v1::ACTION_R, 0}, {0, v1::ACTION_RECV_B, 0}, {0, v1::ACTION_B, 0}};
  EXPECT_THAT(RecomputeAtBackward(early), ElementsAre(false, false, false, false));
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

// ---------------------------------------------------------------------------------------------
// DualPipeV and the overlapped pair: torch.distributed.pipelining's orders and CSV files

// Made once with PyPI torch 2.15.0: the compute-only `pipeline_order` of ScheduleDualPipeV,
// rank by rank, as torch prints its actions (overlapped pairs as "(a;b)OVERLAP_F_B"), by
//   /tmp/torch2/bin/python tests/common/testdata/make_torch_schedules.py /tmp --orders
struct TorchDualPipeVOrder {
  int p, m;
  std::vector<std::string> ranks;
};

const std::vector<TorchDualPipeVOrder>& TorchDualPipeVOrders() {
  static const auto* kOrders = new std::vector<TorchDualPipeVOrder>{
      {1, 2, {"0F0 1F0 0F1 1B0 (1F1;0B0)OVERLAP_F_B 1B1 0I1 0W1"}},
      {2,
       4,
       {"0F0 0F1 0F2 3F0 3I0 3W0 3F1 (0F3;3B1)OVERLAP_F_B (3F2;0B0)OVERLAP_F_B 3B2 "
        "(3F3;0B1)OVERLAP_F_B 3B3 0I2 0W2 0I3 0W3",
        "1F0 2F0 1F1 2F1 1F2 2B0 (2F2;1B0)OVERLAP_F_B (1F3;2B1)OVERLAP_F_B (2F3;1B1)OVERLAP_F_B "
        "2B2 1B2 2I3 1I3 2W3 1W3"}},
      {2,
       5,
       {"0F0 0F1 0F2 3F0 3I0 3W0 3F1 (0F3;3B1)OVERLAP_F_B (3F2;0B0)OVERLAP_F_B "
        "(0F4;3B2)OVERLAP_F_B (3F3;0B1)OVERLAP_F_B 3B3 (3F4;0B2)OVERLAP_F_B 3B4 0I3 0W3 0I4 0W4",
        "1F0 2F0 1F1 2F1 1F2 2B0 (2F2;1B0)OVERLAP_F_B (1F3;2B1)OVERLAP_F_B (2F3;1B1)OVERLAP_F_B "
        "(1F4;2B2)OVERLAP_F_B (2F4;1B2)OVERLAP_F_B 2B3 1B3 2I4 1I4 2W4 1W4"}},
      {3,
       6,
       {"0F0 0F1 0F2 0F3 0F4 5F0 5I0 5W0 5F1 5I1 5W1 5F2 (0F5;5B2)OVERLAP_F_B (5F3;0B0)OVERLAP_F_B "
        "5B3 (5F4;0B1)OVERLAP_F_B 5B4 (5F5;0B2)OVERLAP_F_B 5B5 0I3 0W3 0I4 0W4 0I5 0W5",
        "1F0 1F1 1F2 4F0 1F3 4F1 4I0 4W0 4F2 (1F4;4B1)OVERLAP_F_B (4F3;1B0)OVERLAP_F_B "
        "(1F5;4B2)OVERLAP_F_B (4F4;1B1)OVERLAP_F_B 4B3 (4F5;1B2)OVERLAP_F_B 4B4 1B3 4I5 1I4 4W5 "
        "1I5 1W4 1W5",
        "2F0 3F0 2F1 3F1 2F2 3F2 2F3 3B0 (3F3;2B0)OVERLAP_F_B (2F4;3B1)OVERLAP_F_B "
        "(3F4;2B1)OVERLAP_F_B (2F5;3B2)OVERLAP_F_B (3F5;2B2)OVERLAP_F_B 3B3 2B3 3B4 2I4 3I5 2I5 "
        "2W4 3W5 2W5"}},
      {4,
       8,
       {"0F0 0F1 0F2 0F3 0F4 0F5 0F6 7F0 7I0 7W0 7F1 7I1 7W1 7F2 7I2 7W2 7F3 (0F7;7B3)OVERLAP_F_B "
        "(7F4;0B0)OVERLAP_F_B 7B4 (7F5;0B1)OVERLAP_F_B 7B5 (7F6;0B2)OVERLAP_F_B 7B6 "
        "(7F7;0B3)OVERLAP_F_B 7B7 0I4 0W4 0I5 0W5 0I6 0W6 0I7 0W7",
        "1F0 1F1 1F2 1F3 1F4 6F0 1F5 6F1 6I0 6W0 6F2 6I1 6W1 6F3 (1F6;6B2)OVERLAP_F_B "
        "(6F4;1B0)OVERLAP_F_B (1F7;6B3)OVERLAP_F_B (6F5;1B1)OVERLAP_F_B 6B4 (6F6;1B2)OVERLAP_F_B "
        "6B5 (6F7;1B3)OVERLAP_F_B 6B6 1B4 6I7 1I5 6W7 1I6 1W5 1I7 1W6 1W7",
        "2F0 2F1 2F2 5F0 2F3 5F1 2F4 5F2 5I0 5W0 5F3 (2F5;5B1)OVERLAP_F_B (5F4;2B0)OVERLAP_F_B "
        "(2F6;5B2)OVERLAP_F_B (5F5;2B1)OVERLAP_F_B (2F7;5B3)OVERLAP_F_B (5F6;2B2)OVERLAP_F_B 5B4 "
        "(5F7;2B3)OVERLAP_F_B 5B5 2B4 5B6 2I5 5I7 2I6 2W5 2I7 5W7 2W6 2W7",
        "3F0 4F0 3F1 4F1 3F2 4F2 3F3 4F3 3F4 4B0 (4F4;3B0)OVERLAP_F_B (3F5;4B1)OVERLAP_F_B "
        "(4F5;3B1)OVERLAP_F_B (3F6;4B2)OVERLAP_F_B (4F6;3B2)OVERLAP_F_B (3F7;4B3)OVERLAP_F_B "
        "(4F7;3B3)OVERLAP_F_B 4B4 3B4 4B5 3B5 4I6 3I6 4I7 3I7 4W6 3W6 4W7 3W7"}},
      {4,
       10,
       {"0F0 0F1 0F2 0F3 0F4 0F5 0F6 7F0 7I0 7W0 7F1 7I1 7W1 7F2 7I2 7W2 7F3 (0F7;7B3)OVERLAP_F_B "
        "(7F4;0B0)OVERLAP_F_B (0F8;7B4)OVERLAP_F_B (7F5;0B1)OVERLAP_F_B (0F9;7B5)OVERLAP_F_B "
        "(7F6;0B2)OVERLAP_F_B 7B6 (7F7;0B3)OVERLAP_F_B 7B7 (7F8;0B4)OVERLAP_F_B 7B8 "
        "(7F9;0B5)OVERLAP_F_B 7B9 0I6 0W6 0I7 0W7 0I8 0W8 0I9 0W9",
        "1F0 1F1 1F2 1F3 1F4 6F0 1F5 6F1 6I0 6W0 6F2 6I1 6W1 6F3 (1F6;6B2)OVERLAP_F_B "
        "(6F4;1B0)OVERLAP_F_B (1F7;6B3)OVERLAP_F_B (6F5;1B1)OVERLAP_F_B (1F8;6B4)OVERLAP_F_B "
        "(6F6;1B2)OVERLAP_F_B (1F9;6B5)OVERLAP_F_B (6F7;1B3)OVERLAP_F_B 6B6 (6F8;1B4)OVERLAP_F_B "
        "6B7 (6F9;1B5)OVERLAP_F_B 6B8 1B6 6I9 1I7 6W9 1I8 1W7 1I9 1W8 1W9",
        "2F0 2F1 2F2 5F0 2F3 5F1 2F4 5F2 5I0 5W0 5F3 (2F5;5B1)OVERLAP_F_B (5F4;2B0)OVERLAP_F_B "
        "(2F6;5B2)OVERLAP_F_B (5F5;2B1)OVERLAP_F_B (2F7;5B3)OVERLAP_F_B (5F6;2B2)OVERLAP_F_B "
        "(2F8;5B4)OVERLAP_F_B (5F7;2B3)OVERLAP_F_B (2F9;5B5)OVERLAP_F_B (5F8;2B4)OVERLAP_F_B 5B6 "
        "(5F9;2B5)OVERLAP_F_B 5B7 2B6 5B8 2I7 5I9 2I8 2W7 2I9 5W9 2W8 2W9",
        "3F0 4F0 3F1 4F1 3F2 4F2 3F3 4F3 3F4 4B0 (4F4;3B0)OVERLAP_F_B (3F5;4B1)OVERLAP_F_B "
        "(4F5;3B1)OVERLAP_F_B (3F6;4B2)OVERLAP_F_B (4F6;3B2)OVERLAP_F_B (3F7;4B3)OVERLAP_F_B "
        "(4F7;3B3)OVERLAP_F_B (3F8;4B4)OVERLAP_F_B (4F8;3B4)OVERLAP_F_B (3F9;4B5)OVERLAP_F_B "
        "(4F9;3B5)OVERLAP_F_B 4B6 3B6 4B7 3B7 4I8 3I8 4I9 3I9 4W8 3W8 4W9 3W9"}},
      {8,
       16,
       {"0F0 0F1 0F2 0F3 0F4 0F5 0F6 0F7 0F8 0F9 0F10 0F11 0F12 0F13 0F14 15F0 15I0 15W0 15F1 15I1 "
        "15W1 15F2 15I2 15W2 15F3 15I3 15W3 15F4 15I4 15W4 15F5 15I5 15W5 15F6 15I6 15W6 15F7 "
        "(0F15;15B7)OVERLAP_F_B (15F8;0B0)OVERLAP_F_B 15B8 (15F9;0B1)OVERLAP_F_B 15B9 "
        "(15F10;0B2)OVERLAP_F_B 15B10 (15F11;0B3)OVERLAP_F_B 15B11 (15F12;0B4)OVERLAP_F_B 15B12 "
        "(15F13;0B5)OVERLAP_F_B 15B13 (15F14;0B6)OVERLAP_F_B 15B14 (15F15;0B7)OVERLAP_F_B 15B15 "
        "0I8 0W8 0I9 0W9 0I10 0W10 0I11 0W11 0I12 0W12 0I13 0W13 0I14 0W14 0I15 0W15",
        "1F0 1F1 1F2 1F3 1F4 1F5 1F6 1F7 1F8 1F9 1F10 1F11 1F12 14F0 1F13 14F1 14I0 14W0 14F2 14I1 "
        "14W1 14F3 14I2 14W2 14F4 14I3 14W3 14F5 14I4 14W4 14F6 14I5 14W5 14F7 "
        "(1F14;14B6)OVERLAP_F_B (14F8;1B0)OVERLAP_F_B (1F15;14B7)OVERLAP_F_B (14F9;1B1)OVERLAP_F_B "
        "14B8 (14F10;1B2)OVERLAP_F_B 14B9 (14F11;1B3)OVERLAP_F_B 14B10 (14F12;1B4)OVERLAP_F_B "
        "14B11 (14F13;1B5)OVERLAP_F_B 14B12 (14F14;1B6)OVERLAP_F_B 14B13 (14F15;1B7)OVERLAP_F_B "
        "14B14 1B8 14I15 1I9 14W15 1I10 1W9 1I11 1W10 1I12 1W11 1I13 1W12 1I14 1W13 1I15 1W14 1W15",
        "2F0 2F1 2F2 2F3 2F4 2F5 2F6 2F7 2F8 2F9 2F10 13F0 2F11 13F1 2F12 13F2 13I0 13W0 13F3 13I1 "
        "13W1 13F4 13I2 13W2 13F5 13I3 13W3 13F6 13I4 13W4 13F7 (2F13;13B5)OVERLAP_F_B "
        "(13F8;2B0)OVERLAP_F_B (2F14;13B6)OVERLAP_F_B (13F9;2B1)OVERLAP_F_B (2F15;13B7)OVERLAP_F_B "
        "(13F10;2B2)OVERLAP_F_B 13B8 (13F11;2B3)OVERLAP_F_B 13B9 (13F12;2B4)OVERLAP_F_B 13B10 "
        "(13F13;2B5)OVERLAP_F_B 13B11 (13F14;2B6)OVERLAP_F_B 13B12 (13F15;2B7)OVERLAP_F_B 13B13 "
        "2B8 13B14 2I9 13I15 2I10 2W9 2I11 13W15 2I12 2W10 2I13 2W11 2I14 2W12 2I15 2W13 2W14 2W15",
        "3F0 3F1 3F2 3F3 3F4 3F5 3F6 3F7 3F8 12F0 3F9 12F1 3F10 12F2 3F11 12F3 12I0 12W0 12F4 12I1 "
        "12W1 12F5 12I2 12W2 12F6 12I3 12W3 12F7 (3F12;12B4)OVERLAP_F_B (12F8;3B0)OVERLAP_F_B "
        "(3F13;12B5)OVERLAP_F_B (12F9;3B1)OVERLAP_F_B (3F14;12B6)OVERLAP_F_B "
        "(12F10;3B2)OVERLAP_F_B (3F15;12B7)OVERLAP_F_B (12F11;3B3)OVERLAP_F_B 12B8 "
        "(12F12;3B4)OVERLAP_F_B 12B9 (12F13;3B5)OVERLAP_F_B 12B10 (12F14;3B6)OVERLAP_F_B 12B11 "
        "(12F15;3B7)OVERLAP_F_B 12B12 3B8 12B13 3B9 12I14 3I10 12I15 3I11 12W14 3I12 3W10 3I13 "
        "12W15 3I14 3W11 3I15 3W12 3W13 3W14 3W15",
        "4F0 4F1 4F2 4F3 4F4 4F5 4F6 11F0 4F7 11F1 4F8 11F2 4F9 11F3 4F10 11F4 11I0 11W0 11F5 11I1 "
        "11W1 11F6 11I2 11W2 11F7 (4F11;11B3)OVERLAP_F_B (11F8;4B0)OVERLAP_F_B "
        "(4F12;11B4)OVERLAP_F_B (11F9;4B1)OVERLAP_F_B (4F13;11B5)OVERLAP_F_B "
        "(11F10;4B2)OVERLAP_F_B (4F14;11B6)OVERLAP_F_B (11F11;4B3)OVERLAP_F_B "
        "(4F15;11B7)OVERLAP_F_B (11F12;4B4)OVERLAP_F_B 11B8 (11F13;4B5)OVERLAP_F_B 11B9 "
        "(11F14;4B6)OVERLAP_F_B 11B10 (11F15;4B7)OVERLAP_F_B 11B11 4B8 11B12 4B9 11B13 4I10 11I14 "
        "4I11 11I15 4I12 4W10 4I13 11W14 4I14 4W11 4I15 11W15 4W12 4W13 4W14 4W15",
        "5F0 5F1 5F2 5F3 5F4 10F0 5F5 10F1 5F6 10F2 5F7 10F3 5F8 10F4 5F9 10F5 10I0 10W0 10F6 10I1 "
        "10W1 10F7 (5F10;10B2)OVERLAP_F_B (10F8;5B0)OVERLAP_F_B (5F11;10B3)OVERLAP_F_B "
        "(10F9;5B1)OVERLAP_F_B (5F12;10B4)OVERLAP_F_B (10F10;5B2)OVERLAP_F_B "
        "(5F13;10B5)OVERLAP_F_B (10F11;5B3)OVERLAP_F_B (5F14;10B6)OVERLAP_F_B "
        "(10F12;5B4)OVERLAP_F_B (5F15;10B7)OVERLAP_F_B (10F13;5B5)OVERLAP_F_B 10B8 "
        "(10F14;5B6)OVERLAP_F_B 10B9 (10F15;5B7)OVERLAP_F_B 10B10 5B8 10B11 5B9 10B12 5B10 10I13 "
        "5I11 10I14 5I12 10I15 5I13 10W13 5I14 5W11 5I15 10W14 5W12 10W15 5W13 5W14 5W15",
        "6F0 6F1 6F2 9F0 6F3 9F1 6F4 9F2 6F5 9F3 6F6 9F4 6F7 9F5 6F8 9F6 9I0 9W0 9F7 "
        "(6F9;9B1)OVERLAP_F_B (9F8;6B0)OVERLAP_F_B (6F10;9B2)OVERLAP_F_B (9F9;6B1)OVERLAP_F_B "
        "(6F11;9B3)OVERLAP_F_B (9F10;6B2)OVERLAP_F_B (6F12;9B4)OVERLAP_F_B (9F11;6B3)OVERLAP_F_B "
        "(6F13;9B5)OVERLAP_F_B (9F12;6B4)OVERLAP_F_B (6F14;9B6)OVERLAP_F_B (9F13;6B5)OVERLAP_F_B "
        "(6F15;9B7)OVERLAP_F_B (9F14;6B6)OVERLAP_F_B 9B8 (9F15;6B7)OVERLAP_F_B 9B9 6B8 9B10 6B9 "
        "9B11 6B10 9B12 6I11 9I13 6I12 9I14 6I13 9I15 6I14 6W11 6I15 9W13 6W12 9W14 6W13 9W15 6W14 "
        "6W15",
        "7F0 8F0 7F1 8F1 7F2 8F2 7F3 8F3 7F4 8F4 7F5 8F5 7F6 8F6 7F7 8F7 7F8 8B0 "
        "(8F8;7B0)OVERLAP_F_B (7F9;8B1)OVERLAP_F_B (8F9;7B1)OVERLAP_F_B (7F10;8B2)OVERLAP_F_B "
        "(8F10;7B2)OVERLAP_F_B (7F11;8B3)OVERLAP_F_B (8F11;7B3)OVERLAP_F_B (7F12;8B4)OVERLAP_F_B "
        "(8F12;7B4)OVERLAP_F_B (7F13;8B5)OVERLAP_F_B (8F13;7B5)OVERLAP_F_B (7F14;8B6)OVERLAP_F_B "
        "(8F14;7B6)OVERLAP_F_B (7F15;8B7)OVERLAP_F_B (8F15;7B7)OVERLAP_F_B 8B8 7B8 8B9 7B9 8B10 "
        "7B10 8B11 7B11 8I12 7I12 8I13 7I13 8I14 7I14 8I15 7I15 8W12 7W12 8W13 7W13 8W14 7W14 8W15 "
        "7W15"}},
  };
  return *kOrders;
}

TEST(GenerateDualPipeV, SameOrderAsTorch) {
  for (const TorchDualPipeVOrder& t : TorchDualPipeVOrders()) {
    absl::StatusOr<Schedule> s = GenerateSchedule("dualpipe_v", t.p, t.m);
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_EQ(s->name, "dualpipe_v");
    EXPECT_EQ(s->placement, VShapePlacement(t.p));
    EXPECT_EQ(ToStrings(s->program), t.ranks) << "P=" << t.p << " M=" << t.m;
  }
}

TEST(GenerateDualPipeV, RefusesFewerMicroBatchesThanStages) {
  absl::StatusOr<Schedule> s = GenerateSchedule("dualpipe_v", 4, 7);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.status().message(),
              AllOf(HasSubstr("dualpipe_v"), HasSubstr("M >= 2P"), HasSubstr("M=7"),
                    HasSubstr("P=4"), HasSubstr("at least 8")));
  EXPECT_FALSE(GenerateDualPipeV(0, 4).ok());
  // Two chunks per rank, no other count.
  EXPECT_EQ(DefaultChunks("dualpipe_v"), 2);
  EXPECT_TRUE(GenerateSchedule("DualPipeV", 2, 4, 2).ok());
  absl::StatusOr<Schedule> three = GenerateSchedule("dualpipe_v", 2, 4, 3);
  ASSERT_FALSE(three.ok());
  EXPECT_THAT(three.status().message(), HasSubstr("runs 2 chunks per rank"));
  const std::vector<std::string> all = AllScheduleNames();
  EXPECT_NE(std::find(all.begin(), all.end(), "dualpipe_v"), all.end());
  const std::vector<std::string> planned = ScheduleNames();
  EXPECT_EQ(std::find(planned.begin(), planned.end(), "dualpipe_v"), planned.end());
}

TEST(GenerateDualPipeV, ValidAndSimulatedForEveryRankCountAndMicroBatches) {
  for (int p : {1, 2, 4, 8}) {
    for (int m = 2 * p; m <= 4 * p; ++m) {
      SCOPED_TRACE(absl::StrCat("P=", p, " M=", m));
      absl::StatusOr<Schedule> s = GenerateDualPipeV(p, m);
      ASSERT_TRUE(s.ok()) << s.status();
      const Schedule lowered = LowerWithTransfers(*s);
      ASSERT_TRUE(ValidateSchedule(lowered).ok()) << ValidateSchedule(lowered);
      absl::StatusOr<SimulationResult> sim = SimulateSchedule(lowered);
      ASSERT_TRUE(sim.ok()) << sim.status();
      // Every rank's list keeps its pairs through lowering: each flagged F still starts one.
      for (const auto& list : lowered.program) {
        for (size_t i = 0; i < list.size(); ++i) {
          if (list[i].overlap_with_next) {
            EXPECT_TRUE(StartsOverlappedPair(list, i));
          }
        }
      }
    }
  }
}

// The most idle time of any rank, with `costs`.
double MaxIdle(const Schedule& compute, const ActionCosts& costs) {
  absl::StatusOr<SimulationResult> sim = SimulateSchedule(LowerWithTransfers(compute), costs);
  EXPECT_TRUE(sim.ok()) << sim.status();
  return sim.ok() ? *std::max_element(sim->idle.begin(), sim->idle.end()) : -1.0;
}

ActionCosts ChunkCosts(double f, double i, double w, double overlapped_pair) {
  ActionCosts c;
  c.forward = f;
  c.backward_input = i;
  c.backward_weight = w;
  c.backward = i + w;
  c.overlapped_pair = overlapped_pair;
  return c;
}

// DualPipe's README (deepseek-ai/DualPipe, "Pipeline Bubbles and Memory Usage Comparison")
// gives DualPipeV's bubble as (PP/2-1)(F&B + B - 3W) on PP/2 devices (PP stages), F, B and W
// the times of one chunk's forward, full backward and weight gradient, F&B that of an
// overlapped pair; here P = PP/2 ranks. The simulator's largest per-rank idle time (no
// transfer time) equals it exactly when the forward takes as long as the input gradient
// (F = I = B - W), as with B = 2F, I = W = F: below for a pair run one after the other (F&B =
// F + B, as Tandem's workers run it) and for an ideal overlap (F&B = B). (Measured: with
// F < I it is a little less: 11 against 12 for P = 4, F = W = 1, I = 2, F&B = F + B.)
TEST(GenerateDualPipeV, BubbleAsDualPipeReadmeStates) {
  for (int p : {2, 4, 8}) {
    for (int m : {2 * p, 4 * p}) {
      SCOPED_TRACE(absl::StrCat("P=", p, " M=", m));
      absl::StatusOr<Schedule> s = GenerateDualPipeV(p, m);
      ASSERT_TRUE(s.ok()) << s.status();
      const double F = 1, I = 1, W = 1, B = I + W;
      for (double pair : {F + B, B}) {
        EXPECT_DOUBLE_EQ(MaxIdle(*s, ChunkCosts(F, I, W, pair)), (p - 1) * (pair + B - 3 * W))
            << "F&B=" << pair;
      }
    }
  }
}

// With F = B = 2W (F = 2, I = W = 1) the forward is longer than the input gradient, and every
// rank idles (P-1)(F - I) = (P-1)W more than the README's formula: (P-1) F&B in all, 4(P-1)
// for pairs run one after the other, 2(P-1) for an ideal overlap. (Measured over
// F > I >= W: the excess is (P-1)(F - I) each time.) At the same costs ZB-V idles 3P - 4 and
// 1F1B at equal work (one stage of two chunks: F = 4, B = 4) 8(P-1). As fractions of a step
// for P = 4: M = 8, dualpipe_v 15.8% (8.0% with ideal overlap), zb_v 11.1%, 1f1b 27.3%;
// M = 16, 8.6% (5.1%), 5.9%, 15.8%.
TEST(GenerateDualPipeV, BubbleWithForwardAsLongAsTheBackward) {
  const double F = 2, I = 1, W = 1, B = I + W;
  for (int p : {2, 4, 8}) {
    for (int m : {2 * p, 4 * p}) {
      SCOPED_TRACE(absl::StrCat("P=", p, " M=", m));
      absl::StatusOr<Schedule> s = GenerateDualPipeV(p, m);
      ASSERT_TRUE(s.ok()) << s.status();
      for (double pair : {F + B, 3.0, B}) {
        EXPECT_DOUBLE_EQ(MaxIdle(*s, ChunkCosts(F, I, W, pair)),
                         (p - 1) * (pair + B - 3 * W) + (p - 1) * (F - I))
            << "F&B=" << pair;
      }
      // ZB-V (3P - 4 here, measured) idles less than DualPipeV run one pair action at a time.
      absl::StatusOr<Schedule> zbv = GenerateZBV(p, m);
      ASSERT_TRUE(zbv.ok());
      EXPECT_LT(MaxIdle(*zbv, ChunkCosts(F, I, W, 0)), MaxIdle(*s, ChunkCosts(F, I, W, 0)));
      absl::StatusOr<Schedule> one = Generate1F1B(p, m);
      ASSERT_TRUE(one.ok());
      EXPECT_DOUBLE_EQ(MaxIdle(*one, ChunkCosts(2 * F, 2 * I, 2 * W, 0)), 8 * (p - 1));
    }
  }
  // The fractions quoted above.
  auto bubble = [](const absl::StatusOr<Schedule>& s, const ActionCosts& c) {
    absl::StatusOr<SimulationResult> sim = SimulateSchedule(LowerWithTransfers(*s), c);
    return sim.ok() ? sim->bubble_fraction : -1.0;
  };
  const ActionCosts chunk = ChunkCosts(F, I, W, 0);
  EXPECT_NEAR(bubble(GenerateDualPipeV(4, 8), chunk), 12.0 / 76, 1e-12);
  EXPECT_NEAR(bubble(GenerateDualPipeV(4, 8), ChunkCosts(F, I, W, B)), 4.5 / 56, 1e-12);
  EXPECT_NEAR(bubble(GenerateZBV(4, 8), chunk), 8.0 / 72, 1e-12);
  EXPECT_NEAR(bubble(Generate1F1B(4, 8), ChunkCosts(2 * F, 2 * I, 2 * W, 0)), 24.0 / 88, 1e-12);
  EXPECT_NEAR(bubble(GenerateDualPipeV(4, 16), chunk), 12.0 / 140, 1e-12);
  EXPECT_NEAR(bubble(GenerateZBV(4, 16), chunk), 8.0 / 136, 1e-12);
  EXPECT_NEAR(bubble(Generate1F1B(4, 16), ChunkCosts(2 * F, 2 * I, 2 * W, 0)), 24.0 / 152, 1e-12);
}

// At most 2P + 1 chunk activations on a rank (the README's PP + 1), one more than ZB-V's 2P.
TEST(GenerateDualPipeV, PeakActivationsArePPPlusOne) {
  for (int p : {2, 4, 8}) {
    absl::StatusOr<Schedule> s = GenerateDualPipeV(p, 3 * p);
    ASSERT_TRUE(s.ok());
    absl::StatusOr<SimulationResult> sim = SimulateSchedule(LowerWithTransfers(*s));
    ASSERT_TRUE(sim.ok()) << sim.status();
    EXPECT_EQ(
        *std::max_element(sim->peak_live_micro_batches.begin(), sim->peak_live_micro_batches.end()),
        2 * p + 1)
        << "P=" << p;
  }
}

// ---------------------------------------------------------------------------------------------
// V-Half and V-Min (controllable memory, Qi et al. 2024)

// The unit-cost simulation of a generated schedule (default costs: F = I = W = 1 per stage,
// here per chunk; B = 2), lowered first.
SimulationResult SimulateLowered(const absl::StatusOr<Schedule>& s, const ActionCosts& costs = {}) {
  EXPECT_TRUE(s.ok()) << s.status();
  if (!s.ok()) return {};
  absl::StatusOr<SimulationResult> sim = SimulateSchedule(LowerWithTransfers(*s), costs);
  EXPECT_TRUE(sim.ok()) << s->name << ": " << sim.status();
  return sim.ok() ? *sim : SimulationResult{};
}

int PeakOf(const SimulationResult& r) {
  return r.peak_live_micro_batches.empty() ? 0
                                           : *std::max_element(r.peak_live_micro_batches.begin(),
                                                               r.peak_live_micro_batches.end());
}

// V-Min's peak: 2 floor((P+4)/3) chunk activations (lifespans of 4P + 4 units per rank, plus
// the W's waits, over a 6-unit period).
int VMinPeak(int p) { return 2 * ((p + 4) / 3); }
// V-Min's idle per rank at unit costs: 4P-5; 4P-3 for the multiples of 3 from 6 on, where
// the rank's forward and input gradient collide modulo 6 and the I chain waits.
int VMinIdle(int p) { return p == 1 ? 0 : 4 * p - 5 + (p % 3 == 0 && p > 3 ? 2 : 0); }

// Both generators give, for P in {1..6, 8} and every M from 1 to 4P, a program of the V
// placement that the validator accepts once lowered (complete, dependencies kept, no
// deadlock) and that simulates; every rank runs F, I and W of both its chunks for every
// micro-batch.
TEST(GenerateVSchedules, ValidAndSimulateForEveryShape) {
  int checked = 0;
  for (const char* name : {"v_half", "v_min"}) {
    for (int p : {1, 2, 3, 4, 5, 6, 8}) {
      for (int m = 1; m <= 4 * p; ++m) {
        const std::string label = absl::StrCat(name, " P=", p, " M=", m);
        absl::StatusOr<Schedule> s = GenerateSchedule(name, p, m);
        ASSERT_TRUE(s.ok()) << label << ": " << s.status();
        EXPECT_EQ(s->name, name);
        EXPECT_EQ(s->num_micro_batches, m);
        EXPECT_EQ(s->placement, VShapePlacement(p)) << label;
        ASSERT_EQ(s->program.size(), static_cast<size_t>(p)) << label;
        for (const auto& list : s->program) {
          EXPECT_EQ(list.size(), static_cast<size_t>(6 * m)) << label;
          for (const Action& a : list) EXPECT_NE(a.kind, v1::ACTION_B) << label;
        }
        const Schedule lowered = LowerWithTransfers(*s);
        const absl::Status valid = ValidateSchedule(lowered);
        EXPECT_TRUE(valid.ok()) << label << ": " << valid;
        EXPECT_TRUE(SimulateSchedule(lowered).ok()) << label;
        // Pure: the same call gives the same program.
        EXPECT_EQ(ProgramOf(GenerateSchedule(name, p, m)), s->program) << label;
        ++checked;
      }
    }
  }
  EXPECT_EQ(checked, 2 * 4 * (1 + 2 + 3 + 4 + 5 + 6 + 8));
}

TEST(GenerateVSchedules, RefusesBadSizesAndChunksWithClearErrors) {
  for (const char* name : {"v_half", "v_min"}) {
    for (auto [p, m, field] :
         std::vector<std::tuple<int, int, std::string>>{{0, 4, "ranks"},
                                                        {-1, 4, "ranks"},
                                                        {2, 0, "micro-batches"},
                                                        {2, -3, "micro-batches"}}) {
      absl::StatusOr<Schedule> s = GenerateSchedule(name, p, m);
      ASSERT_FALSE(s.ok()) << name << " P=" << p << " M=" << m;
      EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
      EXPECT_THAT(s.status().message(),
                  AllOf(HasSubstr(name), HasSubstr(field),
                        HasSubstr(absl::StrCat("got ", field == "ranks" ? p : m))));
    }
    EXPECT_EQ(DefaultChunks(name), 2);
    EXPECT_FALSE(TakesChunks(name));
    EXPECT_TRUE(GenerateSchedule(name, 2, 4, 2).ok()) << name;
    for (int chunks : {1, 3}) {
      absl::StatusOr<Schedule> s = GenerateSchedule(name, 2, 4, chunks);
      ASSERT_FALSE(s.ok()) << name;
      EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
      EXPECT_THAT(s.status().message(), AllOf(HasSubstr(name), HasSubstr("2 chunks per rank"),
                                              HasSubstr(absl::StrCat("chunks=", chunks))));
    }
  }
  EXPECT_EQ(ProgramOf(GenerateSchedule("V-Half", 2, 4)), ProgramOf(GenerateVHalf(2, 4)));
  EXPECT_EQ(ProgramOf(GenerateSchedule("vmin", 2, 4)), ProgramOf(GenerateVMin(2, 4)));
  const std::vector<std::string> all = AllScheduleNames(), planned = ScheduleNames();
  for (const char* name : {"v_half", "v_min"}) {
    EXPECT_NE(std::find(all.begin(), all.end(), name), all.end()) << name;
    EXPECT_EQ(std::find(planned.begin(), planned.end(), name), planned.end()) << name;
  }
}

// V-Min at unit costs F = I = W = 1 per chunk: at most 2 floor((P+4)/3) chunk activations live
// on a rank, and every rank idles 4P-5 units (4P-3 for P = 6, 9, 12) for every M: the
// building block repeated with no steady-state bubble, the warm-up and cool-down paying for the
// short lifespans.
TEST(GenerateVMin, PeakAndIdleMatchTheBuildingBlock) {
  for (int p = 1; p <= 12; ++p) {
    std::vector<int> ms;
    for (int m = p; m <= 4 * p; m += p <= 8 ? 1 : p) ms.push_back(m);
    for (int m : ms) {
      const std::string label = absl::StrCat("P=", p, " M=", m);
      const SimulationResult r = SimulateLowered(GenerateVMin(p, m));
      EXPECT_EQ(PeakOf(r), VMinPeak(p)) << label;
      EXPECT_DOUBLE_EQ(r.step_time, 6.0 * m + VMinIdle(p)) << label;
      for (size_t k = 0; k < r.idle.size(); ++k) {
        EXPECT_DOUBLE_EQ(r.busy[k], 6.0 * m) << label;
        EXPECT_DOUBLE_EQ(r.idle[k], VMinIdle(p)) << label << " rank " << k;
      }
    }
  }
}

// V-Half at unit costs: at most P + 2 chunk activations on a rank, reached on some rank once
// M >= 2; its idle per rank stops growing with M (no steady-state bubble).
TEST(GenerateVHalf, PeakIsPPlusTwoAndIdleDoesNotGrowWithM) {
  const std::map<int, int> idle_from_4p = {{2, 1}, {4, 7}, {8, 19}};
  const std::map<int, int> idle_most = {{2, 1}, {4, 7}, {8, 21}};
  for (int p : {2, 4, 8}) {
    for (int m = p; m <= 8 * p; ++m) {
      const std::string label = absl::StrCat("P=", p, " M=", m);
      const SimulationResult r = SimulateLowered(GenerateVHalf(p, m));
      EXPECT_EQ(PeakOf(r), p + 2) << label;
      for (int live : r.peak_live_micro_batches) EXPECT_LE(live, p + 2) << label;
      EXPECT_LE(r.step_time, 6.0 * m + idle_most.at(p)) << label;
      if (m >= 4 * p) {
        EXPECT_DOUBLE_EQ(r.step_time, 6.0 * m + idle_from_4p.at(p)) << label;
      }
    }
  }
}

// The four V-shaped or equal-work schedules side by side at unit costs per chunk (1F1B with
// F = 2, B = 4 per stage, the same work): peak chunk activations 1F1B 2P = ZB-V 2P > V-Half
// P + 2 >= V-Min 2 floor((P+4)/3), idle per rank ZB-V P-1 < V-Half < V-Min 4P-5 < 1F1B 6(P-1).
// For P = 4: peaks 8, 8, 6, 4 and idle 18, 3, 7, 11 units; for P = 8: peaks 16, 16, 10, 8 and
// idle 42, 7, 19, 27 (M = 4P and 8P).
TEST(GenerateVSchedules, MemoryAndBubbleAgainstOneFOneBAndZBV) {
  ActionCosts stage_costs;
  stage_costs.forward = 2.0;
  stage_costs.backward = 4.0;
  const std::map<int, int> vhalf_idle = {{2, 1}, {4, 7}, {8, 19}};
  for (int p : {2, 4, 8}) {
    for (int m : {4 * p, 8 * p}) {
      const std::string label = absl::StrCat("P=", p, " M=", m);
      const SimulationResult ofob = SimulateLowered(Generate1F1B(p, m), stage_costs);
      const SimulationResult zbv = SimulateLowered(GenerateZBV(p, m));
      const SimulationResult half = SimulateLowered(GenerateVHalf(p, m));
      const SimulationResult min = SimulateLowered(GenerateVMin(p, m));
      for (const SimulationResult* r : {&zbv, &half, &min}) {
        EXPECT_DOUBLE_EQ(r->busy[0], ofob.busy[0]) << label;  // the same work
      }
      // Memory, in chunk activations (a 1F1B micro-batch holds a whole stage: two chunks).
      EXPECT_EQ(2 * PeakOf(ofob), 2 * p) << label;
      EXPECT_EQ(PeakOf(zbv), 2 * p) << label;
      EXPECT_EQ(PeakOf(half), p + 2) << label;
      EXPECT_EQ(PeakOf(min), VMinPeak(p)) << label;
      EXPECT_LE(PeakOf(min), PeakOf(half)) << label;
      if (p > 2) {
        EXPECT_LT(PeakOf(half), PeakOf(zbv)) << label;
      }
      // Idle per rank (all ranks busy 6M).
      EXPECT_DOUBLE_EQ(ofob.step_time - ofob.busy[0], 6.0 * (p - 1)) << label;
      EXPECT_DOUBLE_EQ(zbv.step_time - zbv.busy[0], p - 1.0) << label;
      EXPECT_DOUBLE_EQ(half.step_time - half.busy[0], vhalf_idle.at(p)) << label;
      EXPECT_DOUBLE_EQ(min.step_time - min.busy[0], 4.0 * p - 5) << label;
      EXPECT_LE(zbv.bubble_fraction, half.bubble_fraction) << label;
      EXPECT_LT(half.bubble_fraction, min.bubble_fraction) << label;
      EXPECT_LT(min.bubble_fraction, ofob.bubble_fraction) << label;
    }
  }
}

TEST(OverlappedPair, PrintsAndParsesAsTorch) {
  absl::StatusOr<std::vector<Action>> pair = ParseActionCell(" (0F7;7B3)OVERLAP_F_B ");
  ASSERT_TRUE(pair.ok()) << pair.status();
  EXPECT_THAT(*pair, ElementsAre(Action{0, v1::ACTION_F, 7, true}, Action{7, v1::ACTION_B, 3}));
  EXPECT_THAT(ActionCells(*pair), ElementsAre("(0F7;7B3)OVERLAP_F_B"));
  // The flag is part of the action: compared, and carried by the proto.
  EXPECT_NE((*pair)[0], (Action{0, v1::ACTION_F, 7}));
  EXPECT_EQ(FromProto(ToProto((*pair)[0])), (*pair)[0]);
  EXPECT_TRUE(ToProto((*pair)[0]).overlap_with_next());
  EXPECT_FALSE(ToProto((*pair)[1]).overlap_with_next());
  // An I as the backward, and single actions beside pairs.
  absl::StatusOr<std::vector<Action>> split = ParseActionCell("(5F0;2I1)OVERLAP_F_B");
  ASSERT_TRUE(split.ok()) << split.status();
  std::vector<Action> list = {{1, v1::ACTION_F, 0}};
  list.insert(list.end(), split->begin(), split->end());
  list.push_back({2, v1::ACTION_W, 1});
  EXPECT_EQ(ActionsToString(list), "1F0 (5F0;2I1)OVERLAP_F_B 2W1");
  absl::StatusOr<std::vector<Action>> one = ParseActionCell("3SEND_F1");
  ASSERT_TRUE(one.ok());
  EXPECT_THAT(*one, ElementsAre(Action{3, v1::ACTION_SEND_F, 1}));
  // A flag without a partner after it is printed as a plain action.
  EXPECT_EQ(ActionsToString({Action{0, v1::ACTION_F, 0, true}}), "0F0");
  EXPECT_FALSE(StartsOverlappedPair({Action{0, v1::ACTION_F, 0, true}}, 0));
  for (const char* bad : {"(0F7;7B3)", "(0F7)OVERLAP_F_B", "(0F7;7B3;1F1)OVERLAP_F_B",
                          "(0F7;0B3)OVERLAP_F_B", "(7B3;0F7)OVERLAP_F_B", "(0F7;7W3)OVERLAP_F_B",
                          "(0F7;7B3)OVERLAP", "(0F7;7X3)OVERLAP_F_B", "0F7;7B3"}) {
    absl::StatusOr<std::vector<Action>> r = ParseActionCell(bad);
    EXPECT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_THAT(ParseActionCell("(0F7;0B3)OVERLAP_F_B").status().message(),
              HasSubstr("backward (B or I) of another"));
}

// Lowering brackets a pair as one unit: the receives of both before it, the sends after it.
TEST(OverlappedPair, LoweringKeepsThePairTogether) {
  absl::StatusOr<Schedule> s = GenerateDualPipeV(2, 4);
  ASSERT_TRUE(s.ok());
  const Schedule lowered = LowerWithTransfers(*s);
  // Rank 0 holds stages 0 and 3, rank 1 stages 1 and 2.
  EXPECT_THAT(ActionsToString(lowered.program[0]),
              HasSubstr("(0F3;3B1)OVERLAP_F_B 0SEND_F3 3SEND_B1 3RECV_F2 0RECV_B0 "
                        "(3F2;0B0)OVERLAP_F_B"));
  EXPECT_THAT(ActionsToString(lowered.program[1]),
              HasSubstr("(2F2;1B0)OVERLAP_F_B 2SEND_F2 1SEND_B0 1RECV_F3 2RECV_B1 "
                        "(1F3;2B1)OVERLAP_F_B"));
  EXPECT_EQ(LowerWithTransfers(lowered).program, lowered.program);
  // A transfer between the two actions of a pair splits it: refused.
  Program split = lowered.program;
  auto& rank1 = split[1];
  const auto at = std::find(rank1.begin(), rank1.end(), Action{1, v1::ACTION_F, 3, true});
  ASSERT_NE(at, rank1.end());
  ASSERT_EQ((at - 1)->kind, v1::ACTION_RECV_B);
  std::iter_swap(at - 1, at);  // ... 1RECV_F3 1F3 2RECV_B1 2B1 ...
  absl::Status bad = ValidateProgram(split, lowered.placement, 4);
  EXPECT_THAT(bad.message(), AllOf(HasSubstr("overlapped pair"), HasSubstr("[1F3]")));
}

// torch 2.15's own CSV files (tests/common/testdata/make_torch_schedules.py made them).
std::string TorchCsv(const std::string& name) {
  const std::string path =
      std::string(TANDEM_SOURCE_DIR) + "/tests/common/testdata/torch_2_15_0_" + name + ".csv";
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << path;
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// The compute actions of a program (what a compute_comms file and ours share).
Program ComputeOnly(const Program& program) {
  Program out(program.size());
  for (size_t r = 0; r < program.size(); ++r) {
    for (const Action& a : program[r]) {
      if (IsComputeAction(a.kind)) out[r].push_back(a);
    }
  }
  return out;
}

TEST(TorchCsv, ImportsDualPipeVInBothFormats) {
  absl::StatusOr<Schedule> ours = GenerateDualPipeV(4, 8);
  ASSERT_TRUE(ours.ok());
  // compute_only: overlapped pairs, B as the full backward; lowered on import.
  absl::StatusOr<Schedule> compute =
      ScheduleFromCsv(TorchCsv("dualpipe_v_P4_M8_compute_only"), 4, 8);
  ASSERT_TRUE(compute.ok()) << compute.status();
  EXPECT_EQ(compute->placement, VShapePlacement(4));
  EXPECT_EQ(compute->program, LowerWithTransfers(*ours).program);
  // compute_comms: torch's own lowering, with its FSDP (UNSHARD, RESHARD), send-wait and
  // reduction cells dropped and its receives (posted as early as torch could) moved to where
  // they are waited for, just before their consumer: then it is our lowering, action for action.
  absl::StatusOr<Schedule> comms = ScheduleFromCsv(TorchCsv("dualpipe_v_P4_M8"), 4, 8);
  ASSERT_TRUE(comms.ok()) << comms.status();
  EXPECT_EQ(comms->placement, VShapePlacement(4));
  ASSERT_TRUE(ValidateSchedule(*comms).ok()) << ValidateSchedule(*comms);
  EXPECT_EQ(ComputeOnly(comms->program), ours->program);
  EXPECT_EQ(comms->program, LowerWithTransfers(*ours).program);
}

TEST(TorchCsv, ImportsZbvAndInterleavedZeroBubble) {
  absl::StatusOr<Schedule> zbv = ScheduleFromCsv(TorchCsv("zb_v_P2_M4"), 2, 4);
  ASSERT_TRUE(zbv.ok()) << zbv.status();
  ASSERT_TRUE(ValidateSchedule(*zbv).ok()) << ValidateSchedule(*zbv);
  EXPECT_EQ(ComputeOnly(zbv->program), ProgramOf(GenerateZBV(2, 4)));
  EXPECT_EQ(zbv->program, LowerWithTransfers(ProgramOf(GenerateZBV(2, 4)), VShapePlacement(2)));
  // compute_only with torch's idle slots as empty cells.
  absl::StatusOr<Schedule> izb =
      ScheduleFromCsv(TorchCsv("interleaved_zb_P2_M4_compute_only"), 2, 4);
  ASSERT_TRUE(izb.ok()) << izb.status();
  absl::StatusOr<Schedule> ours = GenerateInterleavedZeroBubble(2, 2, 4);
  ASSERT_TRUE(ours.ok());
  EXPECT_EQ(izb->placement, InterleavedPlacement(2, 2));
  EXPECT_EQ(izb->program, LowerWithTransfers(*ours).program);
}

// Ours in torch's format: the compute-only DualPipeV is byte for byte the file torch's
// _dump_csv wrote (but for its \r\n line ends), and every schedule round-trips.
TEST(TorchCsv, ExportsInTorchsFormat) {
  std::string torch = TorchCsv("dualpipe_v_P4_M8_compute_only");
  torch.erase(std::remove(torch.begin(), torch.end(), '\r'), torch.end());
  EXPECT_EQ(ProgramToCsv(ProgramOf(GenerateDualPipeV(4, 8))), torch);
  for (const std::string& name : AllScheduleNames()) {
    SCOPED_TRACE(name);
    absl::StatusOr<Schedule> s = GenerateSchedule(name, 2, 4);
    ASSERT_TRUE(s.ok()) << s.status();
    const Schedule lowered = LowerWithTransfers(*s);
    for (const Program* p : std::vector<const Program*>{&s->program, &lowered.program}) {
      absl::StatusOr<Schedule> back = ScheduleFromCsv(ProgramToCsv(*p), 2, 4);
      ASSERT_TRUE(back.ok()) << back.status();
      EXPECT_EQ(back->placement, s->placement);
      EXPECT_EQ(back->program, lowered.program);
    }
  }
}

TEST(TorchCsv, DropsTorchsRuntimeCellsAndRefusesBadPairs) {
  absl::StatusOr<Schedule> s = ScheduleFromCsv(
      "0UNSHARD,0F0,0SEND_F0,0RECV_B0,0B0,0WAIT_SEND_F0,0REDUCE_GRAD,0WAIT_REDUCE_GRAD,0RESHARD\n"
      "1UNSHARD,1RECV_F0,1F0,1B0,1SEND_B0,1REDUCE_GRAD,1WAIT_SEND_B0\n",
      2, 1);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_THAT(ToStrings(s->program),
              ElementsAre("0F0 0SEND_F0 0RECV_B0 0B0", "1RECV_F0 1F0 1B0 1SEND_B0"));
  absl::StatusOr<Schedule> bad = ScheduleFromCsv("0F0,(0F1;0B0)OVERLAP_F_B,0B1\n", 1, 2);
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), AllOf(HasSubstr("row 1 column 2"), HasSubstr("another")));
  absl::StatusOr<Schedule> wait = ScheduleFromCsv("0F0,0WAIT_SEND_Fx,0B0\n", 1, 1);
  EXPECT_FALSE(wait.ok());
}

}  // namespace
}  // namespace tandem
