#include "common/schedule_check.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

using ::testing::HasSubstr;

Program Lowered(const std::string& schedule, int p, int m) {
  return LowerWithTransfers(*GenerateSchedule(schedule, p, m), p);
}

// Programs written in the text notation, one string per rank.
Program Parse(const std::vector<std::string>& ranks) {
  Program out;
  for (const std::string& r : ranks) {
    out.emplace_back();
    size_t start = 0;
    while (start < r.size()) {
      size_t end = r.find(' ', start);
      if (end == std::string::npos) end = r.size();
      if (end > start) out.back().push_back(*ParseAction(r.substr(start, end - start)));
      start = end + 1;
    }
  }
  return out;
}

TEST(ValidateProgramTest, GeneratedSchedulesAreValid) {
  for (const char* s : {"gpipe", "1f1b"}) {
    for (int p : {1, 2, 3, 4, 8}) {
      for (int m : {8, 9, 16}) {
        EXPECT_TRUE(ValidateProgram(Lowered(s, p, m), p, m).ok()) << s << " P" << p << " M" << m;
      }
    }
  }
}

struct BrokenCase {
  std::vector<std::string> ranks;
  std::string message;
};

TEST(ValidateProgramTest, BrokenProgramsAreRejectedWithTheRightMessage) {
  const std::vector<BrokenCase> cases = {
      // A missing backward.
      {{"0F0 0SEND_F0 0RECV_B0 0B0 0F1 0SEND_F1", "1RECV_F0 1F0 1B0 1SEND_B0 1RECV_F1 1F1 1B1"},
       "micro-batch 1 has no backward"},
      // A backward before its forward.
      {{"0B0 0F0"}, "backward before its forward"},
      // A send with no receive.
      {{"0F0 0SEND_F0 0RECV_B0 0B0", "1F0 1B0 1SEND_B0"}, "forward before its input arrives"},
      {{"0F0 0SEND_F0 0SEND_F0 0RECV_B0 0B0", "1RECV_F0 1F0 1B0 1SEND_B0"}, "is never received"},
      // Both ranks block in a receive first: a cycle of waits.
      {{"0RECV_B0 0F0 0SEND_F0 0B0", "1RECV_F0 1F0 1B0 1SEND_B0"}, "deadlock"},
      // A send of something not computed yet.
      {{"0SEND_F0 0F0 0RECV_B0 0B0", "1RECV_F0 1F0 1B0 1SEND_B0"}, "not computed yet"},
      // Split backward is refused for now.
      {{"0F0 0I0 0W0"}, "split backward"},
  };
  for (const BrokenCase& c : cases) {
    const Program p = Parse(c.ranks);
    absl::Status s = ValidateProgram(p, static_cast<int>(p.size()),
                                     c.message.find("1 has") != std::string::npos ? 2 : 1);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.message;
    EXPECT_THAT(std::string(s.message()), HasSubstr(c.message));
    if (c.message != "is never received") {
      EXPECT_THAT(std::string(s.message()), HasSubstr("["));  // the grid marks the action
    }
  }
}

TEST(SimulateProgramTest, UnitCostBubbleMatchesTheFormula) {
  for (const char* s : {"gpipe", "1f1b"}) {
    for (auto [p, m] :
         std::vector<std::pair<int, int>>{{2, 2}, {4, 4}, {4, 16}, {4, 64}, {8, 64}}) {
      auto r = SimulateProgram(Lowered(s, p, m), p, m);
      ASSERT_TRUE(r.ok()) << r.status();
      EXPECT_NEAR(r->bubble_fraction, IdealBubbleFraction(p, m), 1e-12)
          << s << " P" << p << " M" << m;
      EXPECT_DOUBLE_EQ(r->step_time, (m + p - 1) * 3.0);  // F = 1, B = 2
    }
  }
}

TEST(SimulateProgramTest, OneFOneBKeepsPMicroBatchesLiveAndGPipeKeepsM) {
  const int p = 4, m = 16;
  auto gpipe = SimulateProgram(Lowered("gpipe", p, m), p, m);
  auto ofob = SimulateProgram(Lowered("1f1b", p, m), p, m);
  ASSERT_TRUE(gpipe.ok() && ofob.ok());
  EXPECT_EQ(gpipe->peak_live_micro_batches[0], m);
  EXPECT_EQ(ofob->peak_live_micro_batches[0], p);
  EXPECT_EQ(ofob->peak_live_micro_batches[p - 1], 1);
  // Same bubble: 1F1B saves memory, not time.
  EXPECT_DOUBLE_EQ(gpipe->step_time, ofob->step_time);
}

TEST(SimulateProgramTest, TransfersAndImbalanceLengthenTheStep) {
  const int p = 2, m = 4;
  ActionCosts costs;
  costs.transfer = 0.5;
  auto r = SimulateProgram(Lowered("1f1b", p, m), p, m, costs);
  ASSERT_TRUE(r.ok());
  EXPECT_GT(r->step_time, (m + p - 1) * 3.0);
  EXPECT_GT(r->bubble_fraction, IdealBubbleFraction(p, m));
  // With equal costs and free transfers both stages idle equally: the first waits at the end
  // of the step, the last at its start.
  auto balanced = SimulateProgram(Lowered("1f1b", p, m), p, m);
  ASSERT_TRUE(balanced.ok());
  EXPECT_DOUBLE_EQ(balanced->idle[0], balanced->idle[1]);
}

TEST(ScheduleCsvTest, RoundTripsAndLowersComputeOnlyPrograms) {
  const Program lowered = Lowered("1f1b", 4, 8);
  const std::string csv = ProgramToCsv(lowered);
  EXPECT_EQ(csv.substr(0, csv.find(',')), "0F0");
  auto back = ProgramFromCsv(csv, 4);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, lowered);
  // A compute-only CSV (as PyTorch writes before lowering) is lowered on import.
  auto compute = ProgramFromCsv(ProgramToCsv(*GenerateSchedule("1f1b", 4, 8)), 4);
  ASSERT_TRUE(compute.ok());
  EXPECT_EQ(*compute, lowered);
  EXPECT_TRUE(ValidateProgram(*compute, 4, 8).ok());
  // Trailing commas and blank lines are tolerated.
  auto padded = ProgramFromCsv("0F0,0B0,,\n\n", 1);
  ASSERT_TRUE(padded.ok());
  EXPECT_EQ(padded->at(0).size(), 2u);
}

TEST(ScheduleCsvTest, BadCellsNameRowAndColumn) {
  auto bad = ProgramFromCsv("0F0,0X1\n", 1);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("row 1 column 2"));
  auto wrong_stage = ProgramFromCsv("0F0\n0F0\n", 2);
  EXPECT_THAT(std::string(wrong_stage.status().message()), HasSubstr("belongs to stage 0"));
  EXPECT_THAT(std::string(ProgramFromCsv("0F0\n", 2).status().message()),
              HasSubstr("1 rows, expected one per stage: 2"));
}

}  // namespace
}  // namespace tandem
