#include "common/schedule_check.h"

#include <algorithm>
#include <numeric>
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

// The lowered schedule of a generator call that must succeed.
Schedule Lowered(const std::string& schedule, int p, int m, int chunks = 0) {
  absl::StatusOr<Schedule> s = GenerateSchedule(schedule, p, m, chunks);
  EXPECT_TRUE(s.ok()) << schedule << " P=" << p << " M=" << m << ": " << s.status();
  return s.ok() ? LowerWithTransfers(*s) : Schedule{};
}

SimulationResult Simulate(const Schedule& s, const ActionCosts& costs = {}) {
  absl::StatusOr<SimulationResult> r = SimulateSchedule(s, costs);
  EXPECT_TRUE(r.ok()) << s.name << ": " << r.status();
  return r.ok() ? *r : SimulationResult{};
}

double TotalIdle(const SimulationResult& r) {
  return std::accumulate(r.idle.begin(), r.idle.end(), 0.0);
}
int MaxPeak(const SimulationResult& r) {
  return *std::max_element(r.peak_live_micro_batches.begin(), r.peak_live_micro_batches.end());
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
      if (end > start) {
        absl::StatusOr<Action> a = ParseAction(r.substr(start, end - start));
        EXPECT_TRUE(a.ok()) << a.status();
        if (a.ok()) out.back().push_back(*a);
      }
      start = end + 1;
    }
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// ValidateProgram

// Every generated schedule whose constraints hold is complete and deadlock-free once lowered.
TEST(ValidateProgramTest, GeneratedSchedulesAreValid) {
  int checked = 0;
  for (int p = 1; p <= 8; ++p) {
    for (int m = 1; m <= 4 * p + 1; ++m) {
      for (const std::string& name : ScheduleNames()) {
        for (int v : {0, 3, 4}) {
          if (v != 0 && name != "interleaved_1f1b") continue;
          absl::StatusOr<Schedule> s = GenerateSchedule(name, p, m, v);
          if (!s.ok()) continue;  // a constraint that does not hold (tested in schedule_test)
          const absl::Status valid = ValidateSchedule(LowerWithTransfers(*s));
          EXPECT_TRUE(valid.ok()) << name << " P=" << p << " M=" << m << " v=" << v << ": "
                                  << valid;
          ++checked;
        }
      }
    }
  }
  EXPECT_EQ(checked, 623);
}

// The newer schedules (not planner candidates yet, so not in ScheduleNames) are complete and
// deadlock-free, and simulate, for P in {2, 4, 8} and M from P to 4P; each accepts every such
// shape but interleaved_zb's M that its rounds do not divide.
TEST(ValidateProgramTest, NewerSchedulesAreValidAndSimulate) {
  int checked = 0;
  for (int p : {2, 4, 8}) {
    for (int m = p; m <= 4 * p; ++m) {
      for (const auto& [name, v] : std::vector<std::pair<std::string, int>>{{"looped_bfs", 1},
                                                                            {"looped_bfs", 2},
                                                                            {"looped_bfs", 3},
                                                                            {"interleaved_zb", 2},
                                                                            {"interleaved_zb", 3},
                                                                            {"interleaved_zb", 4},
                                                                            {"zb_h2", 1}}) {
        const std::string label = absl::StrCat(name, " P=", p, " M=", m, " v=", v);
        absl::StatusOr<Schedule> s = GenerateSchedule(name, p, m, v);
        if (name == "interleaved_zb" && m % std::max(1, m / p) != 0) {
          EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << label;
          continue;
        }
        ASSERT_TRUE(s.ok()) << label << ": " << s.status();
        const Schedule lowered = LowerWithTransfers(*s);
        const absl::Status valid = ValidateSchedule(lowered);
        EXPECT_TRUE(valid.ok()) << label << ": " << valid;
        EXPECT_TRUE(SimulateSchedule(lowered).ok()) << label;
        ++checked;
      }
    }
  }
  EXPECT_EQ(checked, 270);
}

// A compute-only program is not valid by itself across ranks: it needs its transfers.
TEST(ValidateProgramTest, ComputeOnlyProgramsNeedLowering) {
  absl::StatusOr<Schedule> s = GenerateSchedule("1f1b", 2, 2);
  ASSERT_TRUE(s.ok());
  const absl::Status unlowered = ValidateSchedule(*s);
  EXPECT_THAT(std::string(unlowered.message()), HasSubstr("backward before its gradient arrives"));
}

struct BrokenCase {
  std::string what;
  std::vector<std::string> ranks;
  Placement placement;
  int micro_batches;
  std::string message;
  std::vector<std::string> marked;  // what the grid must show in brackets
};

TEST(ValidateProgramTest, BrokenProgramsAreRejectedWithTheRightMessage) {
  const Placement one = OneStagePerRank(1);
  const Placement two = OneStagePerRank(2);
  const Placement two_on_one = {1, {0, 0}};  // two stages on a single rank
  const std::vector<BrokenCase> cases = {
      {"a missing backward",
       {"0F0 0SEND_F0 0RECV_B0 0B0 0F1 0SEND_F1", "1RECV_F0 1F0 1B0 1SEND_B0 1RECV_F1 1F1 1B1"},
       two,
       2,
       "stage 0, micro-batch 1 has no backward",
       {"[end]"}},
      {"a missing forward",
       {"0F0 0B0"},
       one,
       2,
       "stage 0, micro-batch 1 has no forward",
       {"[end]"}},
      {"a backward before its forward",
       {"0B0 0F0"},
       one,
       1,
       "backward before its forward",
       {"[0B0]"}},
      {"an I before its forward",
       {"0I0 0F0 0W0"},
       one,
       1,
       "backward (I) before its forward",
       {"[0I0]"}},
      {"a forward whose input is never received",
       {"0F0 0SEND_F0 0RECV_B0 0B0", "1F0 1B0 1SEND_B0"},
       two,
       1,
       "forward before its input arrives",
       {"[1F0]"}},
      {"a backward whose gradient is never received",
       {"0F0 0SEND_F0 0B0", "1RECV_F0 1F0 1B0 1SEND_B0"},
       two,
       1,
       "backward before its gradient arrives",
       {"[0B0]"}},
      {"a send with no receive",
       {"0F0 0SEND_F0 0SEND_F0 0RECV_B0 0B0", "1RECV_F0 1F0 1B0 1SEND_B0"},
       two,
       1,
       "this send is never received by stage 1 (rank 1)",
       {"0F0 0SEND_F0 [0SEND_F0]"}},
      {"two ranks that both block on a receive first",
       {"0RECV_B0 0F0 0SEND_F0 0B0", "1RECV_F0 1F0 1B0 1SEND_B0"},
       two,
       1,
       "deadlock: rank 0 action 0 (0RECV_B0), rank 1 action 0 (1RECV_F0) wait in a receive",
       {"[0RECV_B0]", "[1RECV_F0]"}},
      {"a receive whose send is missing",
       {"0F0 0SEND_F0 0RECV_B0 0B0", "1RECV_F0 1F0 1B0"},
       two,
       1,
       "deadlock: rank 0 action 2 (0RECV_B0) waits",
       {"[0RECV_B0]"}},
      {"a send of something not computed yet",
       {"0SEND_F0 0F0 0RECV_B0 0B0", "1RECV_F0 1F0 1B0 1SEND_B0"},
       two,
       1,
       "sends an activation not computed yet",
       {"[0SEND_F0]"}},
      {"a gradient sent before the backward",
       {"0F0 0SEND_F0 0RECV_B0 0B0", "1RECV_F0 1F0 1SEND_B0 1B0"},
       two,
       1,
       "sends a gradient not computed yet",
       {"[1SEND_B0]"}},
      {"W before I", {"0F0 0W0 0I0"}, one, 1, "W before its I", {"[0W0]"}},
      {"an I without its W",
       {"0F0 0I0"},
       one,
       1,
       "stage 0, micro-batch 0 has an I but no W",
       {"[end]"}},
      {"both B and I for one micro-batch",
       {"0F0 0B0 0I0 0W0"},
       one,
       1,
       "both B and I/W for micro-batch 0 of stage 0",
       {"[0I0]"}},
      {"both B and W for one micro-batch",
       {"0F0 0I0 0W0 0B0"},
       one,
       1,
       "both B and I/W for micro-batch 0 of stage 0",
       {"[0B0]"}},
      {"a repeated forward", {"0F0 0F0 0B0"}, one, 1, "repeated forward", {"0F0 [0F0]"}},
      {"a repeated W", {"0F0 0I0 0W0 0W0"}, one, 1, "repeated W", {"0W0 [0W0]"}},
      {"a transfer between two stages of the same rank",
       {"0F0 0SEND_F0 1RECV_F0 1F0 1B0 1SEND_B0 0RECV_B0 0B0"},
       two_on_one,
       1,
       "a transfer between stages 0 and 1, which are both on rank 0",
       {"[0SEND_F0]"}},
      {"a local hand-off in the wrong order",
       {"1F0 0F0 1B0 0B0"},
       two_on_one,
       1,
       "forward before its input arrives",
       {"[1F0]"}},
      {"an action on a stage not placed on that rank",
       {"0F0 0SEND_F0 0RECV_B0 0B0 1F0", "1RECV_F0 1F0 1B0 1SEND_B0"},
       two,
       1,
       "stage 1 is placed on rank 1, not on rank 0",
       {"[1F0]"}},
      {"a stage that does not exist", {"0F0 2F0 0B0"}, one, 1, "stage 2 does not exist", {"[2F0]"}},
      {"a micro-batch out of range",
       {"0F0 0B0 0F1 0B1"},
       one,
       1,
       "micro-batch 1 out of range [0, 1)",
       {"[0F1]"}},
      {"a receive on the first stage",
       {"0RECV_F0 0F0 0B0"},
       one,
       1,
       "the first stage has no previous stage",
       {"[0RECV_F0]"}},
      {"a send from the last stage",
       {"0F0 0SEND_F0 0B0"},
       one,
       1,
       "the last stage has no next stage",
       {"[0SEND_F0]"}},
  };
  for (const BrokenCase& c : cases) {
    const absl::Status s = ValidateProgram(Parse(c.ranks), c.placement, c.micro_batches);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.what;
    EXPECT_THAT(std::string(s.message()), HasSubstr(c.message)) << c.what;
    for (const std::string& mark : c.marked) {
      EXPECT_THAT(std::string(s.message()), HasSubstr(mark)) << c.what;
    }
  }
}

TEST(ValidateProgramTest, ErrorPrintsThePerRankGrid) {
  const absl::Status s = ValidateProgram(Parse({"0F0 0SEND_F0 0RECV_B0 0B0", "1F0 1B0 1SEND_B0"}),
                                         OneStagePerRank(2), 1);
  EXPECT_EQ(std::string(s.message()),
            "invalid schedule: rank 1 action 0 (1F0): forward before its input arrives\n"
            "  rank 0: 0F0 0SEND_F0 0RECV_B0 0B0\n"
            "  rank 1: [1F0] 1B0 1SEND_B0");
}

TEST(ValidateProgramTest, RejectsShapeMismatches) {
  EXPECT_THAT(std::string(ValidateProgram(Parse({"0F0 0B0"}), OneStagePerRank(2), 1).message()),
              HasSubstr("1 rank lists for 2 ranks"));
  EXPECT_THAT(std::string(ValidateProgram(Parse({"0F0 0B0"}), OneStagePerRank(1), 0).message()),
              HasSubstr("micro-batches must be at least 1"));
  EXPECT_THAT(std::string(ValidateProgram(Parse({"0F0 0B0"}), Placement{1, {1}}, 1).message()),
              HasSubstr("stage 0 is on rank 1"));
}

// ---------------------------------------------------------------------------------------------
// SimulateProgram

// With unit costs a flush schedule's bubble is (P-1)/(vM+P-1). For GPipe and 1F1B (v = 1):
// F = 1, B = 2 per stage, step (M+P-1)(F+B). For interleaved 1F1B the costs are per chunk
// (every action costs the same whatever its chunk; here F = 1, B = 2 per chunk, so a stage of
// v chunks costs vF + vB and the step is (vM+P-1)(F+B)). The fraction does not depend on the
// scale, and the formula is exact for any F:B ratio (checked at B = 2F and B = F).
TEST(SimulateProgramTest, UnitCostBubbleMatchesTheFormula) {
  for (const char* s : {"gpipe", "1f1b"}) {
    for (auto [p, m] : std::vector<std::pair<int, int>>{
             {1, 4}, {2, 2}, {2, 5}, {4, 4}, {4, 16}, {4, 64}, {8, 8}, {8, 64}}) {
      const SimulationResult r = Simulate(Lowered(s, p, m));
      EXPECT_NEAR(r.bubble_fraction, IdealBubbleFraction(p, m), 1e-12)
          << s << " P" << p << " M" << m;
      EXPECT_DOUBLE_EQ(r.step_time, (m + p - 1) * 3.0) << s << " P" << p << " M" << m;
    }
  }
  ActionCosts equal;  // F = B
  equal.backward = 1.0;
  for (auto [p, m, v] : std::vector<std::tuple<int, int, int>>{{1, 3, 2},
                                                               {2, 2, 2},
                                                               {2, 4, 3},
                                                               {3, 6, 2},
                                                               {4, 4, 2},
                                                               {4, 8, 2},
                                                               {4, 8, 4},
                                                               {4, 16, 3},
                                                               {8, 16, 2},
                                                               {8, 8, 4}}) {
    const Schedule s = Lowered("interleaved_1f1b", p, m, v);
    const SimulationResult r = Simulate(s);
    EXPECT_NEAR(r.bubble_fraction, IdealBubbleFraction(p, m, v), 1e-12)
        << "P" << p << " M" << m << " v" << v;
    EXPECT_DOUBLE_EQ(r.step_time, (v * m + p - 1) * 3.0) << "P" << p << " M" << m << " v" << v;
    EXPECT_NEAR(Simulate(s, equal).bubble_fraction, IdealBubbleFraction(p, m, v), 1e-12)
        << "F = B, P" << p << " M" << m << " v" << v;
  }
}

TEST(SimulateProgramTest, OneFOneBKeepsPMicroBatchesLiveAndGPipeKeepsM) {
  const int p = 4, m = 16;
  const SimulationResult gpipe = Simulate(Lowered("gpipe", p, m));
  const SimulationResult ofob = Simulate(Lowered("1f1b", p, m));
  EXPECT_THAT(gpipe.peak_live_micro_batches, ElementsAre(m, m, m, m));
  EXPECT_THAT(ofob.peak_live_micro_batches, ElementsAre(4, 3, 2, 1));
  // Same bubble: 1F1B saves memory, not time.
  EXPECT_DOUBLE_EQ(gpipe.step_time, ofob.step_time);
}

// Interleaving counts (stage, micro-batch) pairs: more live chunk activations than 1F1B's.
TEST(SimulateProgramTest, InterleavedPeakCountsChunkActivations) {
  const SimulationResult r = Simulate(Lowered("interleaved_1f1b", 4, 8, 2));
  // Rank r: its warm-up 2(P-r-1) + (v-1)P forwards, plus the steady state's one more.
  EXPECT_THAT(r.peak_live_micro_batches, ElementsAre(11, 9, 7, 5));
}

// ZB-H1 with F = I = W = 1 against 1F1B with F = 1, B = 2 (the same work): a third of the idle
// time (P-1 per rank instead of 3(P-1)), at 1F1B's peak memory.
TEST(SimulateProgramTest, ZBH1HasAThirdOfOneFOneBsBubbleAtItsPeakMemory) {
  for (auto [p, m] : std::vector<std::pair<int, int>>{
           {2, 2}, {2, 8}, {3, 3}, {3, 7}, {4, 4}, {4, 8}, {4, 16}, {6, 9}, {8, 8}, {8, 32}}) {
    const std::string label = absl::StrCat("P", p, " M", m);
    const SimulationResult ofob = Simulate(Lowered("1f1b", p, m));
    const SimulationResult zb = Simulate(Lowered("zb_h1", p, m));
    const double ratio = TotalIdle(zb) / TotalIdle(ofob);
    EXPECT_GE(ratio, 0.25) << label;
    EXPECT_LE(ratio, 0.45) << label;
    EXPECT_LT(zb.bubble_fraction, ofob.bubble_fraction) << label;
    EXPECT_DOUBLE_EQ(zb.step_time, 3.0 * m + p - 1) << label;  // idle P-1 per rank exactly
    EXPECT_EQ(MaxPeak(zb), MaxPeak(ofob)) << label;
    for (int live : zb.peak_live_micro_batches) EXPECT_LE(live, p) << label;
  }
}

// ZB-V with F = I = W = 1 per chunk against 1F1B with F = 2, B = 4 per stage (a stage is two
// chunks: the same work): well under half the bubble, and at most 2P chunk activations live on
// any rank, 1F1B's peak of P micro-batches times two chunks.
TEST(SimulateProgramTest, ZBVBeatsOneFOneBAtEqualWorkAndMemory) {
  ActionCosts stage_costs;
  stage_costs.forward = 2.0;
  stage_costs.backward = 4.0;
  for (int p : {1, 2, 3, 4, 6, 8}) {
    for (int m : {p, p + 1, 2 * p - 1, 2 * p, 3 * p, 8 * p}) {
      const std::string label = absl::StrCat("P", p, " M", m);
      const SimulationResult ofob = Simulate(Lowered("1f1b", p, m), stage_costs);
      const SimulationResult zbv = Simulate(Lowered("zb_v", p, m));
      EXPECT_DOUBLE_EQ(zbv.busy[0], ofob.busy[0]) << label;  // the same work
      if (p > 1) {
        EXPECT_LT(zbv.bubble_fraction, 0.5 * ofob.bubble_fraction) << label;
      }
      for (int live : zbv.peak_live_micro_batches) EXPECT_LE(live, 2 * MaxPeak(ofob)) << label;
      if (m >= 2 * p - 1) {
        // P-1 chunk units idle per rank, against 6(P-1) for 1F1B.
        EXPECT_DOUBLE_EQ(zbv.step_time, 6.0 * m + p - 1) << label;
        EXPECT_DOUBLE_EQ(TotalIdle(ofob), 6.0 * TotalIdle(zbv)) << label;
        EXPECT_THAT(zbv.peak_live_micro_batches, ::testing::Each(2 * p)) << label;
      }
    }
  }
}

// A rank's idle time between its first compute action's start and its last one's end: the
// bubble inside its own span, without the skew at the start and the end of the step that the
// zero-bubble paper's parallelogram leaves to the next step.
std::vector<double> InSpanIdle(const Schedule& lowered, const SimulationResult& r) {
  std::vector<double> out;
  for (size_t rank = 0; rank < lowered.program.size(); ++rank) {
    double first = -1, last = 0;
    for (size_t i = 0; i < lowered.program[rank].size(); ++i) {
      if (!IsComputeAction(lowered.program[rank][i].kind)) continue;
      if (first < 0) first = r.start[rank][i];
      last = r.end[rank][i];
    }
    out.push_back(last - std::max(first, 0.0) - r.busy[rank]);
  }
  return out;
}

// Looped BFS is a looped GPipe: with M >= P the chunks follow each other without a stall, so its
// unit-cost bubble is interleaved 1F1B's (P-1)/(vM+P-1), at M micro-batches of every chunk live.
TEST(SimulateProgramTest, LoopedBFSHasTheInterleavedBubbleAtGPipesMemory) {
  for (int p : {2, 4, 8}) {
    for (int m : {p, 2 * p, 4 * p}) {
      for (int v : {1, 2, 3}) {
        const std::string label = absl::StrCat("P", p, " M", m, " v", v);
        const SimulationResult r = Simulate(Lowered("looped_bfs", p, m, v));
        EXPECT_NEAR(r.bubble_fraction, IdealBubbleFraction(p, m, v), 1e-12) << label;
        EXPECT_THAT(r.peak_live_micro_batches, ::testing::Each(v * m)) << label;
      }
    }
  }
}

// Interleaved zero bubble with F = I = W = 1 per chunk against interleaved 1F1B with F = 1,
// B = 2 (the same work, the same chunks): less idle time on every shape, and rank r's own span
// has no more idle than ZB-H1's (P-1 per rank, the paper's (P-1)(F+B-W)) spread over v chunks.
TEST(SimulateProgramTest, InterleavedZeroBubbleBeatsInterleaved1F1B) {
  for (int p : {2, 4, 8}) {
    for (int m : {p, 2 * p, 4 * p}) {
      for (int v : {2, 3}) {
        const std::string label = absl::StrCat("P", p, " M", m, " v", v);
        const SimulationResult ofob = Simulate(Lowered("interleaved_1f1b", p, m, v));
        const Schedule zb = Lowered("interleaved_zb", p, m, v);
        const SimulationResult r = Simulate(zb);
        EXPECT_DOUBLE_EQ(r.busy[0], ofob.busy[0]) << label;
        EXPECT_LT(TotalIdle(r), TotalIdle(ofob)) << label;
        EXPECT_LE(r.bubble_fraction, 0.5 * ofob.bubble_fraction + 1e-12) << label;
      }
    }
  }
}

// ZB-H2 with F = I = W = 1 (Qi et al. section 3.1, bubble (P-1)(F+B-2W) = 0): for M >= 2P-1 no
// rank idles inside its span and the step is 3M+P-1 (each rank's only idle is its skew, P-1
// in all), against ZB-H1's P-1 inside rank 0's span ((P-1)(F+B-W)) and 1F1B's 3(P-1) per rank;
// at most 2P micro-batches live, twice 1F1B's P.
TEST(SimulateProgramTest, ZBH2HasNoBubbleInsideAnySpanAtTwice1F1BsMemory) {
  for (int p : {2, 3, 4, 6, 8}) {
    for (int m : {p, 2 * p - 1, 2 * p, 3 * p, 4 * p, 8 * p}) {
      const std::string label = absl::StrCat("P", p, " M", m);
      const Schedule h2 = Lowered("zb_h2", p, m);
      const SimulationResult r = Simulate(h2);
      const SimulationResult ofob = Simulate(Lowered("1f1b", p, m));
      EXPECT_DOUBLE_EQ(r.busy[0], ofob.busy[0]) << label;
      EXPECT_LE(MaxPeak(r), 2 * MaxPeak(ofob)) << label;
      if (m >= 2 * p - 1) {
        EXPECT_THAT(InSpanIdle(h2, r), ::testing::Each(0.0)) << label;
        EXPECT_DOUBLE_EQ(r.step_time, 3.0 * m + p - 1) << label;
        EXPECT_EQ(MaxPeak(r), std::min(m, 2 * p)) << label;
        const Schedule h1 = Lowered("zb_h1", p, m);
        EXPECT_DOUBLE_EQ(InSpanIdle(h1, Simulate(h1))[0], p - 1.0) << label;
      }
    }
  }
}

TEST(SimulateProgramTest, TransfersAndImbalanceLengthenTheStep) {
  const int p = 2, m = 4;
  ActionCosts costs;
  costs.transfer = 0.5;
  const SimulationResult r = Simulate(Lowered("1f1b", p, m), costs);
  EXPECT_GT(r.step_time, (m + p - 1) * 3.0);
  EXPECT_GT(r.bubble_fraction, IdealBubbleFraction(p, m));
  // With equal costs and free transfers both ranks idle equally: the first waits at the end
  // of the step, the last at its start.
  const SimulationResult balanced = Simulate(Lowered("1f1b", p, m));
  EXPECT_DOUBLE_EQ(balanced.idle[0], balanced.idle[1]);
}

TEST(SimulateProgramTest, PerStageCostsOverrideTheDefaults) {
  const Schedule s = Lowered("1f1b", 2, 4);
  ActionCosts slow;
  slow.forward = 2.0;
  slow.backward = 4.0;
  absl::StatusOr<SimulationResult> r = SimulateSchedule(s, {}, {ActionCosts{}, slow});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_DOUBLE_EQ(r->busy[0], 4 * 3.0);
  EXPECT_DOUBLE_EQ(r->busy[1], 4 * 6.0);
  // The slow last stage sets the pace: its 24 units plus the first forward it waits for.
  EXPECT_DOUBLE_EQ(r->step_time, 1.0 + 24.0 + 2.0);
  absl::StatusOr<SimulationResult> wrong = SimulateSchedule(s, {}, {slow});
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(wrong.status().message()), HasSubstr("1 entries for 2 stages"));
}

TEST(SimulateProgramTest, RecordsStartAndEndOfEveryAction) {
  // 1F1B, P = 2, M = 2, F = 1, B = 2.
  const Schedule s = Lowered("1f1b", 2, 2);
  const SimulationResult r = Simulate(s);
  ASSERT_EQ(ActionsToString(s.program[1]), "1RECV_F0 1F0 1B0 1SEND_B0 1RECV_F1 1F1 1B1 1SEND_B1");
  EXPECT_THAT(r.start[1], ElementsAre(0, 1, 2, 4, 4, 4, 5, 7));
  EXPECT_THAT(r.end[1], ElementsAre(1, 2, 4, 4, 4, 5, 7, 7));
  ASSERT_EQ(ActionsToString(s.program[0]), "0F0 0SEND_F0 0F1 0SEND_F1 0RECV_B0 0B0 0RECV_B1 0B1");
  EXPECT_THAT(r.start[0], ElementsAre(0, 1, 1, 2, 2, 4, 6, 7));
  EXPECT_THAT(r.end[0], ElementsAre(1, 1, 2, 2, 4, 6, 7, 9));
  EXPECT_DOUBLE_EQ(r.step_time, 9.0);
  EXPECT_THAT(r.busy, ElementsAre(6.0, 6.0));
  EXPECT_THAT(r.idle, ElementsAre(3.0, 3.0));
}

TEST(SimulateProgramTest, RefusesInvalidPrograms) {
  absl::StatusOr<SimulationResult> r = SimulateProgram(Parse({"0B0 0F0"}), OneStagePerRank(1), 1);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("backward before its forward"));
}

TEST(TimestepGridTest, OneLinePerRankOneColumnPerUnit) {
  const Schedule s = Lowered("gpipe", 2, 2);
  const SimulationResult r = Simulate(s);
  EXPECT_EQ(TimestepGrid(s.program, r, 1.0),
            "rank 0: 0F0 0F1 .   .   .   0B1 0B1 0B0 0B0\n"
            "rank 1: .   1F0 1F1 1B1 1B1 1B0 1B0 .   .\n");
  // Coarser columns show the action at each column's midpoint.
  EXPECT_EQ(TimestepGrid(s.program, r, 3.0), "rank 0: 0F1 .   0B0\nrank 1: 1F0 1B1 .\n");
}

TEST(TimestepGridTest, SplitBackwardAndVirtualStages) {
  const Schedule s = Lowered("zb_h1", 2, 2);
  const SimulationResult r = Simulate(s);
  EXPECT_EQ(TimestepGrid(s.program, r, 1.0),
            "rank 0: 0F0 0F1 .   0I0 0W0 0I1 0W1\n"
            "rank 1: .   1F0 1I0 1F1 1I1 1W0 1W1\n");
  const Schedule v = Lowered("zb_v", 1, 1);
  EXPECT_EQ(TimestepGrid(v.program, Simulate(v), 1.0), "rank 0: 0F0 1F0 1I0 1W0 0I0 0W0\n");
}

// ---------------------------------------------------------------------------------------------
// CSV

TEST(ScheduleCsvTest, RoundTripsLoweredPrograms) {
  for (const auto& [name, p, m] : std::vector<std::tuple<std::string, int, int>>{
           {"1f1b", 4, 8}, {"interleaved_1f1b", 4, 8}, {"zb_h1", 3, 5}, {"zb_v", 3, 6}}) {
    const Schedule lowered = Lowered(name, p, m);
    const std::string csv = ProgramToCsv(lowered.program);
    absl::StatusOr<Schedule> back = ScheduleFromCsv(csv, p, m);
    ASSERT_TRUE(back.ok()) << name << ": " << back.status();
    EXPECT_EQ(back->name, "csv");
    EXPECT_EQ(back->num_micro_batches, m);
    EXPECT_EQ(back->program, lowered.program) << name;
    EXPECT_EQ(back->placement, lowered.placement) << name;  // inferred from the rows
    EXPECT_TRUE(ValidateSchedule(*back).ok()) << name;
  }
  EXPECT_EQ(ProgramToCsv(Lowered("1f1b", 2, 2).program),
            "0F0,0SEND_F0,0F1,0SEND_F1,0RECV_B0,0B0,0RECV_B1,0B1\n"
            "1RECV_F0,1F0,1B0,1SEND_B0,1RECV_F1,1F1,1B1,1SEND_B1\n");
}

// A compute-only CSV (as PyTorch writes before lowering) is lowered on import.
TEST(ScheduleCsvTest, LowersComputeOnlyPrograms) {
  for (const auto& [name, p, m] : std::vector<std::tuple<std::string, int, int>>{
           {"1f1b", 4, 8}, {"interleaved_1f1b", 2, 4}, {"zb_v", 4, 8}}) {
    absl::StatusOr<Schedule> compute = GenerateSchedule(name, p, m);
    ASSERT_TRUE(compute.ok());
    absl::StatusOr<Schedule> imported = ScheduleFromCsv(ProgramToCsv(compute->program), p, m);
    ASSERT_TRUE(imported.ok()) << imported.status();
    EXPECT_EQ(imported->placement, compute->placement) << name;
    EXPECT_EQ(imported->program, LowerWithTransfers(*compute).program) << name;
    EXPECT_TRUE(ValidateSchedule(*imported).ok()) << name;
  }
  // Trailing commas and blank lines are tolerated.
  absl::StatusOr<Schedule> padded = ScheduleFromCsv("0F0,0B0,,\n\n", 1, 1);
  ASSERT_TRUE(padded.ok()) << padded.status();
  EXPECT_EQ(padded->program.at(0).size(), 2u);
  // Two stages on one row: placement inferred, the hand-off stays local.
  absl::StatusOr<Schedule> local = ScheduleFromCsv("0F0,1F0,1B0,0B0\n", 1, 1);
  ASSERT_TRUE(local.ok()) << local.status();
  EXPECT_EQ(local->placement, (Placement{1, {0, 0}}));
  EXPECT_EQ(ActionsToString(local->program[0]), "0F0 1F0 1B0 0B0");
}

TEST(ScheduleCsvTest, BadCellsNameRowAndColumn) {
  struct Case {
    std::string csv;
    int ranks, micro_batches;
    std::vector<std::string> parts;
  };
  const std::vector<Case> cases = {
      {"0F0,0X1\n", 1, 2, {"row 1 column 2", "0X1", "unknown kind"}},
      {"0F0,0B0\n1F0,,1Bx\n", 2, 1, {"row 2 column 3", "1Bx"}},
      {"0F0,0B0\n0F1\n", 2, 2, {"row 2 column 1", "belongs to stage 0", "row 1 (rank 0)"}},
      {"0F0,0F5\n", 1, 2, {"row 1 column 2", "micro-batch 5", "0..1"}},
      {"0F0\n", 2, 1, {"1 rows, expected one per rank: 2"}},
      {"0F0\n1F0\n2F0\n", 2, 1, {"3 rows, expected one per rank: 2"}},
      {"0F0,0B0\n2F0,2B0\n", 2, 1, {"stages up to 2 but stage 1 has no actions"}},
      {"0F0,0B0\n2000000000F0\n", 2, 1, {"stage 1 has no actions"}},
      {"0F0,1F0\n,\n", 2, 1, {"rank 1 holds no stage"}},
      {"0F0\n", 0, 1, {"ranks must be at least 1"}},
  };
  for (const Case& c : cases) {
    absl::StatusOr<Schedule> s = ScheduleFromCsv(c.csv, c.ranks, c.micro_batches);
    ASSERT_FALSE(s.ok()) << c.csv;
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << c.csv;
    for (const std::string& part : c.parts) {
      EXPECT_THAT(std::string(s.status().message()), HasSubstr(part)) << c.csv;
    }
  }
}

// A CSV with transfers is taken as written; the validator then judges it.
TEST(ScheduleCsvTest, ProgramsWithTransfersAreNotRelowered) {
  absl::StatusOr<Schedule> s = ScheduleFromCsv("0F0,0SEND_F0,0B0\n1RECV_F0,1F0,1B0\n", 2, 1);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(ActionsToString(s->program[0]), "0F0 0SEND_F0 0B0");
  EXPECT_THAT(std::string(ValidateSchedule(*s).message()),
              AllOf(HasSubstr("backward before its gradient arrives"), HasSubstr("[0B0]")));
}

// ---------------------------------------------------------------------------------------------
// Data parallelism: REDUCE_GRAD

TEST(ValidateProgramTest, ReductionsAfterTheLastWeightGradientAreValid) {
  for (const char* name : {"gpipe", "1f1b", "interleaved_1f1b", "zb_h1", "zb_v"}) {
    SCOPED_TRACE(name);
    const Schedule reduced = AddGradReductions(Lowered(name, 2, 4));
    EXPECT_TRUE(ValidateSchedule(reduced).ok()) << ValidateSchedule(reduced);
  }
}

TEST(ValidateProgramTest, ReductionBeforeALaterWeightGradientIsRejected) {
  // zb_h1 on one rank: the reduction must wait for the last W, not the last I.
  const Placement one = OneStagePerRank(1);
  absl::Status s = ValidateProgram(Parse({"0F0 0I0 0F1 0I1 0W0 0REDUCE_GRAD 0W1"}), one, 2);
  EXPECT_THAT(
      std::string(s.message()),
      AllOf(HasSubstr("REDUCE_GRAD of stage 0 before its last weight gradient"),
            HasSubstr("micro-batch 1 has no B or W before it"), HasSubstr("[0REDUCE_GRAD]")));
  s = ValidateProgram(Parse({"0F0 0B0 0REDUCE_GRAD 0REDUCE_GRAD"}), one, 1);
  EXPECT_THAT(std::string(s.message()), HasSubstr("repeated REDUCE_GRAD"));
  EXPECT_TRUE(ValidateProgram(Parse({"0F0 0I0 0F1 0I1 0W0 0W1 0REDUCE_GRAD"}), one, 2).ok());
}

TEST(ValidateProgramTest, ReductionsAreAllOrNone) {
  Schedule reduced = AddGradReductions(Lowered("1f1b", 2, 2));
  auto& rank1 = reduced.program[1];
  rank1.erase(std::remove_if(rank1.begin(), rank1.end(),
                             [](const Action& a) { return IsReductionAction(a.kind); }),
              rank1.end());
  const absl::Status s = ValidateSchedule(reduced);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("stage 1 has no REDUCE_GRAD, but 1 other stage(s) do"));
}

// The simulator runs a reduction beside the rank's compute: only what runs past the rank's
// last compute is exposed, and the step ends when the last rank's compute and reductions have.
TEST(SimulateProgramTest, ReductionRunsBesideComputeAndOnlyItsTailIsExposed) {
  ActionCosts costs;  // F 1, B 2
  const SimulationResult plain = Simulate(Lowered("1f1b", 2, 4), costs);
  costs.reduce = 0.5;
  const SimulationResult with = Simulate(AddGradReductions(Lowered("1f1b", 2, 4)), costs);
  ASSERT_EQ(with.reduce_exposed.size(), 2u);
  // One stage per rank: each reduction starts after its rank's last compute, all exposed; rank
  // 1's ends while rank 0 still computes, so only rank 0's lengthens the step.
  EXPECT_DOUBLE_EQ(with.reduce_exposed[0], 0.5);
  EXPECT_DOUBLE_EQ(with.reduce_exposed[1], 0.5);
  EXPECT_DOUBLE_EQ(with.step_time, plain.step_time + 0.5);
  // Two chunks per rank: the later chunk's reduction hides under the earlier chunk's last
  // backwards; only the last one's is exposed.
  const SimulationResult interleaved =
      Simulate(AddGradReductions(Lowered("interleaved_1f1b", 2, 4, 2)), costs);
  for (double exposed : interleaved.reduce_exposed) EXPECT_DOUBLE_EQ(exposed, 0.5);
}

// ---------------------------------------------------------------------------------------------
// Recomputation (R)

TEST(ValidateProgramTest, RecomputeMustComeAfterItsForwardAndBeforeItsBackward) {
  const Placement one = OneStagePerRank(1);
  EXPECT_TRUE(ValidateProgram(Parse({"0F0 0R0 0B0"}), one, 1).ok());
  EXPECT_TRUE(ValidateProgram(Parse({"0F0 0F1 0R1 0I1 0R0 0B0 0W1"}), one, 2).ok());
  struct Case {
    std::string program;
    std::string message;
  };
  for (const Case& c : std::vector<Case>{
           {"0F0 0B0 0R0", "rank 0 action 2 (0R0): recompute (R) after its backward"},
           {"0F0 0I0 0R0 0W0", "rank 0 action 2 (0R0): recompute (R) after its backward"},
           {"0R0 0F0 0B0", "rank 0 action 0 (0R0): recompute (R) before its forward"},
           {"0F0 0R0 0R0 0B0", "rank 0 action 2 (0R0): repeated R"},
       }) {
    const absl::Status s = ValidateProgram(Parse({c.program}), one, 1);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.program;
    EXPECT_THAT(s.message(), HasSubstr(c.message)) << c.program;
  }
  // Across ranks: R is local and waits for nothing, so it may run before the gradient's
  // receive; stage 1's R before its forward is still refused.
  const Placement two = OneStagePerRank(2);
  EXPECT_TRUE(ValidateProgram(
                  Parse({"0F0 0SEND_F0 0R0 0RECV_B0 0B0", "1RECV_F0 1F0 1R0 1B0 1SEND_B0"}), two, 1)
                  .ok());
  EXPECT_THAT(ValidateProgram(
                  Parse({"0F0 0SEND_F0 0R0 0RECV_B0 0B0", "1R0 1RECV_F0 1F0 1B0 1SEND_B0"}), two, 1)
                  .message(),
              HasSubstr("recompute (R) before its forward"));
}

// Every schedule with full recomputation stays valid; unit costs count each R as one F.
TEST(SimulateProgramTest, RecomputationCostsOneForwardPerMicroBatch) {
  for (const auto& [name, v] : std::vector<std::pair<std::string, int>>{{"gpipe", 1},
                                                                        {"1f1b", 1},
                                                                        {"interleaved_1f1b", 2},
                                                                        {"zb_h1", 1},
                                                                        {"zb_v", 2},
                                                                        {"looped_bfs", 2},
                                                                        {"interleaved_zb", 2},
                                                                        {"zb_h2", 1}}) {
    for (int p : {1, 2, 4}) {
      const int m = 8;
      const Schedule plain = Lowered(name, p, m);
      const Schedule recomputed = AddRecomputation(plain);
      const std::string label = absl::StrCat(name, " P", p);
      ASSERT_TRUE(ValidateSchedule(recomputed).ok()) << label << ValidateSchedule(recomputed);
      ActionCosts unit;
      unit.forward = unit.backward_input = unit.backward_weight = 1.0;
      const SimulationResult a = Simulate(plain, unit);
      const SimulationResult b = Simulate(recomputed, unit);
      for (int r = 0; r < p; ++r) {
        // Each (stage, micro-batch) of the rank: one more forward.
        EXPECT_DOUBLE_EQ(b.busy[r], a.busy[r] + v * m) << label << " rank " << r;
      }
      EXPECT_GE(b.step_time, a.step_time) << label;
      EXPECT_EQ(b.peak_live_micro_batches, a.peak_live_micro_batches) << label;
    }
  }
}

// The hand count: 1F1B's rank r holds P - r micro-batches at its peak; with full recomputation
// each of them is only its layers' inputs (the checkpoints), and the backward, which
// recomputes one layer at a time, holds one layer's working set beside them:
// (P - r) inputs + one layer. An R moved ahead of its backward (here before its RECV_B)
// brings the micro-batch's whole working set back from the R to its backward.
TEST(SimulateProgramTest, OneFOneBPeakMemoryWithFullRecomputationIsTheHandCount) {
  const int p = 4, m = 8;
  ActionCosts costs;
  costs.activation_bytes = 1000.0;  // one micro-batch's saved activations of a stage
  costs.input_bytes = 10.0;         // its layers' inputs
  costs.layer_bytes = 300.0;        // the largest layer's working set
  const SimulationResult plain = Simulate(Lowered("1f1b", p, m), costs);
  const Schedule recomputed = AddRecomputation(Lowered("1f1b", p, m));
  const SimulationResult full = Simulate(recomputed, costs);
  EXPECT_THAT(plain.peak_activation_bytes, ElementsAre(4000, 3000, 2000, 1000));
  EXPECT_THAT(full.peak_activation_bytes,
              ElementsAre(4 * 10 + 300, 3 * 10 + 300, 2 * 10 + 300, 1 * 10 + 300));
  // GPipe: M micro-batches' inputs in flight, then one layer at a time.
  const SimulationResult gpipe = Simulate(AddRecomputation(Lowered("gpipe", p, m)), costs);
  EXPECT_THAT(gpipe.peak_activation_bytes, ::testing::Each(m * 10 + 300));
  // Rank 0's first R moved before its RECV_B: from there to its B, 1F1B's steady state holds
  // it whole beside the other P - 1 micro-batches' inputs.
  Schedule early = recomputed;
  std::vector<Action>& rank0 = early.program[0];
  const auto r0 = std::find(rank0.begin(), rank0.end(), Action{0, v1::ACTION_R, 0});
  ASSERT_NE(r0, rank0.end());
  ASSERT_EQ((r0 - 1)->kind, v1::ACTION_RECV_B);
  std::iter_swap(r0 - 1, r0);
  ASSERT_TRUE(ValidateSchedule(early).ok()) << ValidateSchedule(early);
  EXPECT_DOUBLE_EQ(Simulate(early, costs).peak_activation_bytes[0], 3 * 10 + 1000);
  // Default costs and no R: the memory is the live micro-batch count.
  const SimulationResult counted = Simulate(Lowered("zb_v", p, m));
  for (int r = 0; r < p; ++r) {
    EXPECT_DOUBLE_EQ(counted.peak_activation_bytes[r], counted.peak_live_micro_batches[r]);
  }
}

// A micro-batch without its R (DropRecomputation's) keeps its whole working set from its F; the
// F of a recomputed one keeps only its inputs but holds a layer's working set while it runs.
// 1F1B on 2 ranks with micro-batch 0's R gone from rank 0: while F1 runs, rank 0 holds
// micro-batch 0 whole, 1's inputs and a layer: 1000 + 10 + 300, more than any backward's
// moment (full recomputation's peak is 2 x 10 + 300).
TEST(SimulateProgramTest, TheForwardOfARecomputedMicroBatchHoldsALayersWorkingSet) {
  ActionCosts costs;
  costs.activation_bytes = 1000.0;
  costs.input_bytes = 10.0;
  costs.layer_bytes = 300.0;
  Schedule mixed = AddRecomputation(Lowered("1f1b", 2, 4));
  std::vector<Action>& rank0 = mixed.program[0];
  const auto r0 = std::find(rank0.begin(), rank0.end(), Action{0, v1::ACTION_R, 0});
  ASSERT_NE(r0, rank0.end());
  rank0.erase(r0);
  ASSERT_TRUE(ValidateSchedule(mixed).ok()) << ValidateSchedule(mixed);
  EXPECT_DOUBLE_EQ(Simulate(mixed, costs).peak_activation_bytes[0], 1000 + 10 + 300);
  EXPECT_DOUBLE_EQ(
      Simulate(AddRecomputation(Lowered("1f1b", 2, 4)), costs).peak_activation_bytes[0],
      2 * 10 + 300);
}

// An R costs its stage's `recompute` where given (a recomputation skips the output's work)
// and the forward otherwise: 1F1B with an R before every B, on equal stages, steps in
// (M + P - 1) x (F + R + B).
TEST(SimulateProgramTest, AnRCostsTheStagesRecomputeOrElseItsForward) {
  const int p = 2, m = 4;
  const Schedule recomputed = AddRecomputation(Lowered("1f1b", p, m));
  ActionCosts costs;  // F 1, B 2, R: the forward
  const double as_forward = Simulate(recomputed, costs).step_time;
  costs.recompute = 0.5;
  const double cheaper = Simulate(recomputed, costs).step_time;
  costs.recompute = 1.0;
  EXPECT_DOUBLE_EQ(Simulate(recomputed, costs).step_time, as_forward);
  EXPECT_DOUBLE_EQ(as_forward, (m + p - 1) * (1.0 + 1.0 + 2.0));
  EXPECT_DOUBLE_EQ(cheaper, (m + p - 1) * (1.0 + 0.5 + 2.0));
}

}  // namespace
}  // namespace tandem
