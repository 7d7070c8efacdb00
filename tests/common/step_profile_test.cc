#include "common/step_profile.h"

#include <algorithm>
#include <cmath>

#include "gtest/gtest.h"

namespace tandem {
namespace {

// Reports as workers would send them for a step that ran exactly as simulated with `costs`
// (seconds): timings from the simulation, exec time = the step.
std::vector<v1::StepReport> ReportsOf(const Schedule& s, const SimulationResult& sim) {
  std::vector<v1::StepReport> out(s.placement.num_ranks);
  for (int r = 0; r < s.placement.num_ranks; ++r) {
    for (size_t i = 0; i < s.program[r].size(); ++i) {
      v1::ActionTiming* t = out[r].add_timings();
      t->set_index(static_cast<int>(i));
      t->set_start_us(std::llround(sim.start[r][i] * 1e6));
      t->set_end_us(std::llround(sim.end[r][i] * 1e6));
    }
    out[r].set_exec_us(std::llround(sim.step_time * 1e6));
  }
  return out;
}

std::vector<const v1::StepReport*> Pointers(const std::vector<v1::StepReport>& reports) {
  std::vector<const v1::StepReport*> out;
  for (const auto& r : reports) out.push_back(&r);
  return out;
}

// A step that ran as the simulator says is measured with the simulator's bubble, and the
// costs recovered from its timings predict that bubble again, for every schedule.
TEST(ProfileStep, RecoversCostsAndTheBubble) {
  for (const char* name : {"gpipe", "1f1b", "interleaved_1f1b", "zb_h1", "zb_v"}) {
    SCOPED_TRACE(name);
    absl::StatusOr<Schedule> compute = GenerateSchedule(name, 2, 4);
    ASSERT_TRUE(compute.ok()) << compute.status();
    const Schedule lowered = LowerWithTransfers(*compute);
    std::vector<ActionCosts> costs(lowered.placement.num_stages());
    for (size_t st = 0; st < costs.size(); ++st) {
      costs[st] =
          ActionCosts{0.010 * (st + 1), 0.020 * (st + 1), 0.011 * (st + 1), 0.009 * (st + 1), 0.0};
    }
    absl::StatusOr<SimulationResult> sim = SimulateSchedule(lowered, ActionCosts{}, costs);
    ASSERT_TRUE(sim.ok()) << sim.status();
    const std::vector<v1::StepReport> reports = ReportsOf(lowered, *sim);
    absl::StatusOr<StepProfile> profile = ProfileStep(lowered, Pointers(reports));
    ASSERT_TRUE(profile.ok()) << profile.status();
    EXPECT_NEAR(profile->measured_bubble, sim->bubble_fraction, 1e-4);
    EXPECT_NEAR(profile->predicted_bubble, sim->bubble_fraction, 1e-4);
    EXPECT_NEAR(profile->predicted_step_seconds, sim->step_time, 1e-4);
    for (size_t st = 0; st < costs.size(); ++st) {
      EXPECT_NEAR(profile->stage_costs[st].forward, costs[st].forward, 1e-6) << st;
    }
    for (int r = 0; r < 2; ++r) EXPECT_NEAR(profile->busy_seconds[r], sim->busy[r], 1e-4);
  }
}

// A GPU worker's compute intervals also hold the host's launches and synchronisation; where
// it reports the device's own time (ActionTiming.device_us), the profile costs and the busy
// time are the device's, so that the planner balances GPU stages by GPU time and the bubble
// counts the host's share as idle. A device time is never taken as longer than its interval.
TEST(ProfileStep, DeviceTimesReplaceTheHostIntervalsOfComputeActions) {
  const Schedule lowered = LowerWithTransfers(*GenerateSchedule("1f1b", 2, 4));
  std::vector<ActionCosts> costs(2, ActionCosts{0.010, 0.020, 0.0, 0.0, 0.0});
  absl::StatusOr<SimulationResult> sim = SimulateSchedule(lowered, ActionCosts{}, costs);
  ASSERT_TRUE(sim.ok()) << sim.status();
  std::vector<v1::StepReport> reports = ReportsOf(lowered, *sim);
  // The device ran 60% of each forward and backward interval; the host the rest.
  for (int r = 0; r < 2; ++r) {
    for (v1::ActionTiming& t : *reports[r].mutable_timings()) {
      if (!IsComputeAction(lowered.program[r][t.index()].kind)) continue;
      t.set_device_us(std::llround(0.6 * static_cast<double>(t.end_us() - t.start_us())));
    }
  }
  absl::StatusOr<StepProfile> profile = ProfileStep(lowered, Pointers(reports));
  ASSERT_TRUE(profile.ok()) << profile.status();
  for (int st = 0; st < 2; ++st) {
    EXPECT_NEAR(profile->stage_costs[st].forward, 0.6 * 0.010, 1e-6) << st;
    EXPECT_NEAR(profile->stage_costs[st].backward, 0.6 * 0.020, 1e-6) << st;
  }
  for (int r = 0; r < 2; ++r) EXPECT_NEAR(profile->busy_seconds[r], 0.6 * sim->busy[r], 1e-4);
  const double max_exec = sim->step_time;
  const double busy = 0.6 * (sim->busy[0] + sim->busy[1]);
  EXPECT_NEAR(profile->measured_bubble, 1.0 - busy / (2 * max_exec), 1e-4);
  EXPECT_GT(profile->measured_bubble, sim->bubble_fraction);

  // A device time longer than its interval (clock noise) counts as the interval.
  for (v1::ActionTiming& t : *reports[0].mutable_timings()) {
    if (t.device_us() > 0) t.set_device_us(10 * (t.end_us() - t.start_us()));
  }
  profile = ProfileStep(lowered, Pointers(reports));
  ASSERT_TRUE(profile.ok()) << profile.status();
  EXPECT_NEAR(profile->busy_seconds[0], sim->busy[0], 1e-4);
}

// A data-parallel step: each stage's gradient reduction is reported from its first bucket, handed
// over inside the last backward, to its end. The replay charges it the part past the compute
// before it, so that a step whose reduction outlasts the backward replays to its measured length.
TEST(ProfileStep, AReductionIsChargedWhatItRanPastTheBackward) {
  const Schedule lowered = AddGradReductions(LowerWithTransfers(*GenerateSchedule("1f1b", 2, 4)));
  std::vector<ActionCosts> costs(2, ActionCosts{0.010, 0.020, 0.0, 0.0, 0.0});
  costs[0].reduce = 0.050;
  costs[1].reduce = 0.004;
  absl::StatusOr<SimulationResult> sim = SimulateSchedule(lowered, ActionCosts{}, costs);
  ASSERT_TRUE(sim.ok()) << sim.status();
  std::vector<v1::StepReport> reports = ReportsOf(lowered, *sim);
  // As a worker reports it: from the first bucket, posted halfway through the last backward.
  for (int r = 0; r < 2; ++r) {
    for (v1::ActionTiming& t : *reports[r].mutable_timings()) {
      if (IsReductionAction(lowered.program[r][t.index()].kind)) {
        t.set_start_us(t.start_us() - 10000);
      }
    }
  }
  absl::StatusOr<StepProfile> profile = ProfileStep(lowered, Pointers(reports));
  ASSERT_TRUE(profile.ok()) << profile.status();
  EXPECT_NEAR(profile->stage_costs[0].reduce, 0.050, 1e-6);
  EXPECT_NEAR(profile->stage_costs[1].reduce, 0.004, 1e-6);
  EXPECT_NEAR(profile->predicted_step_seconds, sim->step_time, 1e-4);
  // Without the reductions the replay would end at the last backward.
  EXPECT_GT(sim->step_time, *std::max_element(sim->busy.begin(), sim->busy.end()) + 0.04);
  for (int r = 0; r < 2; ++r) EXPECT_NEAR(profile->busy_seconds[r], sim->busy[r], 1e-4);
}

// Messages priced as the plan priced them: a step whose transfers took what the plan's link
// model said replays to its own length, while a replay with free transfers falls short of it by
// the transfers on the critical path, which a prediction check would wrongly lay at the
// schedule's door.
TEST(ProfileStep, MessagesArePricedAsThePlanPricedThem) {
  for (const char* name : {"1f1b", "zb_h1", "interleaved_1f1b"}) {
    SCOPED_TRACE(name);
    const Schedule lowered = LowerWithTransfers(*GenerateSchedule(name, 2, 4));
    const int stages = lowered.placement.num_stages();
    std::vector<ActionCosts> costs(stages, ActionCosts{0.010, 0.020, 0.011, 0.009, 0.004});
    absl::StatusOr<SimulationResult> sim = SimulateSchedule(lowered, ActionCosts{}, costs);
    ASSERT_TRUE(sim.ok()) << sim.status();
    const std::vector<v1::StepReport> reports = ReportsOf(lowered, *sim);
    absl::StatusOr<StepProfile> priced =
        ProfileStep(lowered, Pointers(reports), std::vector<double>(stages, 0.004));
    ASSERT_TRUE(priced.ok()) << priced.status();
    EXPECT_NEAR(priced->predicted_step_seconds, sim->step_time, 1e-4);
    EXPECT_NEAR(priced->stage_costs[0].transfer, 0.004, 1e-12);
    absl::StatusOr<StepProfile> free = ProfileStep(lowered, Pointers(reports));
    ASSERT_TRUE(free.ok()) << free.status();
    EXPECT_LT(free->predicted_step_seconds, sim->step_time - 0.004);
  }
  // One cost per stage, or none.
  const Schedule two = LowerWithTransfers(*GenerateSchedule("1f1b", 2, 2));
  absl::StatusOr<SimulationResult> sim =
      SimulateSchedule(two, ActionCosts{}, std::vector<ActionCosts>(2, ActionCosts{}));
  ASSERT_TRUE(sim.ok());
  const std::vector<v1::StepReport> reports = ReportsOf(two, *sim);
  EXPECT_EQ(ProfileStep(two, Pointers(reports), {0.001}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ProfileStep, RejectsReportsThatDoNotMatch) {
  const Schedule lowered = LowerWithTransfers(*GenerateSchedule("1f1b", 2, 2));
  std::vector<v1::StepReport> reports(2);
  reports[1].add_timings()->set_index(999);
  EXPECT_EQ(ProfileStep(lowered, Pointers(reports)).status().code(),
            absl::StatusCode::kInvalidArgument);
  reports.pop_back();
  EXPECT_FALSE(ProfileStep(lowered, Pointers(reports)).ok());
}

}  // namespace
}  // namespace tandem
