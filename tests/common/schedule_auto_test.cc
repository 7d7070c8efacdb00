#include "common/schedule_auto.h"

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <iostream>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

using ::testing::HasSubstr;

// One stage's costs in units of a forward: F, I, W (B = I + W, as 1F1B runs it) and the time
// its messages take to arrive.
ActionCosts Stage(double scale = 1.0, double transfer = 0.0) {
  ActionCosts c;
  c.forward = c.backward_input = c.backward_weight = scale;
  c.backward = 2 * scale;
  c.transfer = transfer;
  return c;
}

std::vector<ActionCosts> Uniform(int p, double transfer = 0.0) {
  return std::vector<ActionCosts>(p, Stage(1.0, transfer));
}

struct Figures {
  std::string name;
  double step = 0.0;
  double bubble = 0.0;
  std::vector<int> peak;  // live micro-batches per rank
  int max_peak() const { return *std::max_element(peak.begin(), peak.end()); }
};

// Lowers, validates and simulates a compute-only schedule under `costs`.
Figures Measure(const Schedule& compute, const std::vector<ActionCosts>& costs,
                const std::string& name = "") {
  const Schedule lowered = LowerWithTransfers(compute);
  EXPECT_TRUE(ValidateSchedule(lowered).ok()) << compute.name << ": " << ValidateSchedule(lowered);
  absl::StatusOr<SimulationResult> sim = SimulateSchedule(lowered, {}, costs);
  EXPECT_TRUE(sim.ok()) << compute.name << ": " << sim.status();
  if (!sim.ok()) return {};
  return {name.empty() ? compute.name : name, sim->step_time, sim->bubble_fraction,
          sim->peak_live_micro_batches};
}

Figures Handcrafted(const std::string& name, int p, int m, const std::vector<ActionCosts>& costs) {
  absl::StatusOr<Schedule> s = GenerateSchedule(name, p, m);
  EXPECT_TRUE(s.ok()) << name << ": " << s.status();
  return s.ok() ? Measure(*s, costs) : Figures{};
}

Figures Auto(int p, int m, const std::vector<ActionCosts>& costs, int limit,
             const ZBAutoOptions& options = {}, const std::string& name = "zb_auto") {
  absl::StatusOr<Schedule> s = GenerateZBAuto(p, m, costs, std::vector<int>(p, limit), options);
  EXPECT_TRUE(s.ok()) << s.status();
  if (!s.ok()) return {};
  EXPECT_EQ(s->name, "zb_auto");
  Figures f = Measure(*s, costs, name);
  if (limit > 0) {
    for (int r = 0; r < p; ++r) EXPECT_LE(f.peak[r], limit) << name << " rank " << r;
  }
  return f;
}

void Print(const std::string& title, const std::vector<Figures>& rows) {
  std::cout << title << "\n";
  for (const Figures& f : rows) {
    std::cout << "  " << std::left << std::setw(22) << f.name << " step " << std::setw(8) << f.step
              << " bubble " << std::setw(10) << std::setprecision(4) << f.bubble
              << " peak live per rank [" << absl::StrJoin(f.peak, " ") << "]\n"
              << std::setprecision(6);
  }
}

// The check of issue 23: at a memory limit of `limit` live micro-batches per rank, zb_auto's
// step (and so its bubble: every schedule does the same work) is no longer than that of each
// hand-crafted schedule whose peak fits the same limit, and at least one does. Returns the
// rows printed: 1f1b, zb_h1, zb_h2, zb_auto's greedy orders alone, the greedy orders improved
// by the local search (neither seeded with the hand-crafted orders), and zb_auto.
std::vector<Figures> ExpectNoWorseThanHandcrafted(const std::string& title, int p, int m,
                                                  const std::vector<ActionCosts>& costs,
                                                  int limit) {
  std::vector<Figures> rows;
  for (const char* name : {"1f1b", "zb_h1", "zb_h2"})
    rows.push_back(Handcrafted(name, p, m, costs));
  ZBAutoOptions greedy_only;
  greedy_only.seed_with_handcrafted = false;
  greedy_only.local_search_evaluations = 0;
  ZBAutoOptions without_seeds;
  without_seeds.seed_with_handcrafted = false;
  rows.push_back(Auto(p, m, costs, limit, greedy_only, "zb_auto greedy only"));
  rows.push_back(Auto(p, m, costs, limit, without_seeds, "zb_auto greedy + search"));
  const Figures automatic = Auto(p, m, costs, limit);
  rows.push_back(automatic);
  Print(absl::StrCat(title, " (P=", p, ", M=", m, ", limit ", limit, " live micro-batches)"), rows);
  int compared = 0;
  for (size_t i = 0; i < 3; ++i) {
    if (rows[i].max_peak() > limit) continue;
    ++compared;
    EXPECT_LE(automatic.step, rows[i].step * (1 + 1e-9)) << title << ": vs " << rows[i].name;
    EXPECT_LE(automatic.bubble, rows[i].bubble + 1e-9) << title << ": vs " << rows[i].name;
  }
  EXPECT_GT(compared, 0) << title << ": no hand-crafted schedule fits " << limit;
  return rows;
}
constexpr int kZBH1 = 1, kSearched = 4;

// (a) Equal unit costs: ZB-H1's memory (P) and bubble, ZB-H2's (2P) and bubble.
TEST(GenerateZBAuto, UniformCostsMatchZBH1AndZBH2AtTheirMemory) {
  for (int p : {4, 8}) {
    const int m = 3 * p;
    const std::vector<ActionCosts> costs = Uniform(p);
    // The construction alone (no hand-crafted seed) already finds ZB-H1's step.
    const std::vector<Figures> rows = ExpectNoWorseThanHandcrafted("uniform", p, m, costs, p);
    EXPECT_LE(rows[kSearched].step, rows[kZBH1].step * (1 + 1e-9));
    ExpectNoWorseThanHandcrafted("uniform", p, m, costs, 2 * p);
    const Figures h1 = Handcrafted("zb_h1", p, m, costs);
    const Figures at_p = Auto(p, m, costs, p);
    EXPECT_LE(at_p.max_peak(), h1.max_peak());
    const Figures h2 = Handcrafted("zb_h2", p, m, costs);
    const Figures at_2p = Auto(p, m, costs, 2 * p);
    EXPECT_LE(at_2p.step, h2.step * (1 + 1e-9));
    EXPECT_LE(at_2p.max_peak(), 2 * p);
  }
}

// (b) Stage 1 of 4 (and of 8) 30% slower in F, I and W.
TEST(GenerateZBAuto, SlowStageNoWorseThanHandcrafted) {
  for (int p : {4, 8}) {
    std::vector<ActionCosts> costs = Uniform(p);
    costs[1] = Stage(1.3);
    for (int m : {2 * p, 4 * p}) {
      // Here too without the seeds, at ZB-H1's memory.
      const std::vector<Figures> rows =
          ExpectNoWorseThanHandcrafted("stage 1 30% slower", p, m, costs, p);
      EXPECT_LE(rows[kSearched].step, rows[kZBH1].step * (1 + 1e-9));
      ExpectNoWorseThanHandcrafted("stage 1 30% slower", p, m, costs, 2 * p);
    }
  }
}

// (c) Slow links: every message takes half a forward; or one stage's messages take a whole
// forward (a stage behind a slow link: the simulator charges a message to its sender).
TEST(GenerateZBAuto, SlowLinkNoWorseThanHandcrafted) {
  for (int p : {4, 8}) {
    const int m = 3 * p;
    ExpectNoWorseThanHandcrafted("every link 0.5 F", p, m, Uniform(p, 0.5), p);
    ExpectNoWorseThanHandcrafted("every link 0.5 F", p, m, Uniform(p, 0.5), 2 * p);
    std::vector<ActionCosts> one_slow = Uniform(p);
    one_slow[1].transfer = 1.0;
    ExpectNoWorseThanHandcrafted("stage 1 sends in 1 F", p, m, one_slow, p);
    ExpectNoWorseThanHandcrafted("stage 1 sends in 1 F", p, m, one_slow, 2 * p);
  }
}

// (d) Valid for every size: lowers, validates, simulates, within its limit, with or without
// the seeds and the search; also below 1F1B's memory and with fewer micro-batches than ranks.
TEST(GenerateZBAuto, ValidForManySizesAndLimits) {
  ZBAutoOptions plain;
  plain.seed_with_handcrafted = false;
  plain.local_search_evaluations = 0;
  ZBAutoOptions quick;
  quick.local_search_evaluations = 300;
  for (int p : {1, 2, 4, 8}) {
    std::vector<ActionCosts> uneven = Uniform(p, 0.2);
    uneven[p / 2] = Stage(1.3, 0.2);
    for (int m = std::max(1, p / 2); m <= 4 * p; ++m) {
      for (int limit : {0, 1, (p + 1) / 2, p, 2 * p}) {
        const std::string what = absl::StrCat("P=", p, " M=", m, " limit=", limit);
        SCOPED_TRACE(what);
        for (const auto& costs : {Uniform(p), uneven}) {
          const Figures g = Auto(p, m, costs, limit, plain);
          const Figures q = Auto(p, m, costs, limit, quick);
          // Every action of every rank runs once: 3 M units of work per rank with unit costs.
          EXPECT_GT(g.step, 0);
          EXPECT_LE(q.step, g.step * (1 + 1e-9));
        }
      }
    }
  }
}

// A limit of one micro-batch serialises the pipeline: each micro-batch goes down and back up
// before the next one starts on rank 0.
TEST(GenerateZBAuto, OneLiveMicroBatchRunsThemOneAtATime) {
  const int p = 4, m = 4;
  const Figures f = Auto(p, m, Uniform(p), 1);
  for (int r = 0; r < p; ++r) EXPECT_EQ(f.peak[r], 1);
  // Each micro-batch takes P F's and P I's in a row (then rank 0's W), before the next starts.
  EXPECT_GE(f.step, m * 2.0 * p);
}

// (e) Refusals, each naming the problem.
TEST(GenerateZBAuto, RefusesBadInput) {
  auto error = [](int p, int m, std::vector<ActionCosts> costs, std::vector<int> limit) {
    absl::StatusOr<Schedule> s = GenerateZBAuto(p, m, costs, limit);
    EXPECT_FALSE(s.ok());
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << s.status();
    return std::string(s.status().message());
  };
  EXPECT_THAT(error(0, 4, {}, {}), HasSubstr("number of ranks must be at least 1, got 0"));
  EXPECT_THAT(error(2, 0, Uniform(2), {0, 0}),
              HasSubstr("number of micro-batches must be at least 1, got 0"));
  EXPECT_THAT(error(4, 8, Uniform(3), {0, 0, 0, 0}), HasSubstr("3 entries for 4 stages"));
  EXPECT_THAT(error(4, 8, Uniform(4), {4, 4, 4}), HasSubstr("3 entries for 4 ranks"));
  EXPECT_THAT(error(2, 4, Uniform(2), {2, -1}),
              HasSubstr("rank 1's memory limit must be at least 1 micro-batch"));
  std::vector<ActionCosts> costs = Uniform(2);
  costs[1].forward = 0;
  EXPECT_THAT(error(2, 4, costs, {0, 0}), HasSubstr("stage 1's forward cost must be positive"));
  costs = Uniform(2);
  costs[0].backward_input = std::numeric_limits<double>::quiet_NaN();
  EXPECT_THAT(error(2, 4, costs, {0, 0}), HasSubstr("stage 0's backward_input cost"));
  costs = Uniform(2);
  costs[0].backward_weight = -1;
  EXPECT_THAT(error(2, 4, costs, {0, 0}), HasSubstr("stage 0's backward_weight cost"));
  costs = Uniform(2);
  costs[1].transfer = -0.5;
  EXPECT_THAT(error(2, 4, costs, {0, 0}),
              HasSubstr("stage 1's transfer cost must be non-negative"));
}

}  // namespace
}  // namespace tandem
