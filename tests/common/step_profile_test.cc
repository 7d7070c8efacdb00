#include "common/step_profile.h"

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
