// The step summary's arithmetic, on hand-made reports: the global norm, clipping and skipping,
// the per-stage memory, busy and timeline figures, and the throughput figures.
#include "coordinator/step_summary.h"

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/schedule_check.h"
#include "coordinator/step_timings.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem::coordinator {
namespace {

using ::testing::DoubleEq;
using ::testing::DoubleNear;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::UnorderedElementsAre;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

TEST(ClipScaleTest, ClipsANormAboveTheLimitToIt) {
  EXPECT_FLOAT_EQ(ClipScale(std::sqrt(8.0), 1.0f), static_cast<float>(1.0 / std::sqrt(8.0)));
  EXPECT_FLOAT_EQ(ClipScale(4.0, 2.0f), 0.5f);
  EXPECT_EQ(ClipScale(0.5, 1.0f), 1.0f);  // below the limit: unscaled
  EXPECT_EQ(ClipScale(1.0, 1.0f), 1.0f);  // at it
  EXPECT_EQ(ClipScale(0.0, 1.0f), 1.0f);
}

TEST(ClipScaleTest, OffOrNonFiniteIsOne) {
  EXPECT_EQ(ClipScale(100.0, 0.0f), 1.0f);  // grad_clip: 0 turns clipping off
  EXPECT_EQ(ClipScale(100.0, -1.0f), 1.0f);
  EXPECT_EQ(ClipScale(kNaN, 1.0f), 1.0f);  // such a step is skipped, not scaled
  EXPECT_EQ(ClipScale(kInf, 1.0f), 1.0f);
}

Schedule Lowered1F1B(int ranks, int micro_batches) {
  absl::StatusOr<Schedule> s = Generate1F1B(ranks, micro_batches);
  EXPECT_TRUE(s.ok()) << s.status();
  return LowerWithTransfers(*s);
}

// Rank r's report of a step of `lowered`: every action 10 us, 1 us apart; the last rank
// carries the loss.
std::vector<v1::StepReport> Reports(const Schedule& lowered, double loss = 2.5) {
  std::vector<v1::StepReport> out;
  const int ranks = lowered.placement.num_ranks;
  for (int r = 0; r < ranks; ++r) {
    v1::StepReport& rep = out.emplace_back();
    rep.set_step(7);
    rep.set_rank(r);
    rep.set_grad_norm_sq(4.0);  // norm 2 per rank
    rep.set_grads_finite(true);
    rep.set_exec_us(1000 + 100 * r);
    rep.set_bytes_sent(10 + r);
    rep.set_peak_activation_bytes(500 - 100 * r);
    v1::StageMemory* m = rep.add_stage_memory();
    m->set_stage(r);
    m->set_static_bytes(1000 * (r + 1));
    m->set_peak_activation_bytes(500 - 100 * r);
    if (r == ranks - 1) {
      rep.set_has_loss(true);
      rep.set_loss(loss);
    }
    int64_t t = 1'000'000;
    for (size_t i = 0; i < lowered.program[r].size(); ++i) {
      v1::ActionTiming* timing = rep.add_timings();
      timing->set_index(static_cast<int>(i));
      timing->set_start_us(t);
      timing->set_end_us(t + 10);
      t += 11;
    }
  }
  return out;
}

StepReports Summarize(const Schedule& lowered, const std::vector<v1::StepReport>& reports,
                      float clip = 1.0f) {
  std::vector<const v1::StepReport*> pointers;
  for (const auto& r : reports) pointers.push_back(&r);
  const v1::StepTimings timings = StepTimingsOf(7, reports, {0, 0});
  return SummarizeReports(7, lowered, lowered.placement.num_stages(), pointers, timings, clip);
}

TEST(SummarizeReportsTest, CombinesTheRanksReports) {
  const Schedule lowered = Lowered1F1B(2, 4);
  const StepReports r = Summarize(lowered, Reports(lowered));
  EXPECT_TRUE(r.warnings.empty()) << r.warnings[0];
  EXPECT_TRUE(r.has_loss);
  EXPECT_EQ(r.summary.step(), 7);
  EXPECT_EQ(r.summary.loss(), 2.5);
  EXPECT_EQ(r.summary.bytes_sent(), 21);
  EXPECT_EQ(r.summary.peak_activation_bytes(), 500);
  EXPECT_THAT(r.summary.rank_peak_activation_bytes(), ElementsAre(500, 400));
  EXPECT_THAT(r.summary.stage_peak_bytes(), ElementsAre(1500, 2400));  // static + activations
  ASSERT_EQ(r.summary.stage_memory_size(), 2);
  EXPECT_EQ(r.summary.stage_memory(1).static_bytes(), 2000);
  EXPECT_EQ(r.max_exec_us, 1100);
  // Two ranks of norm 2: global norm sqrt(8), clipped to 1.
  EXPECT_DOUBLE_EQ(r.grad_norm, std::sqrt(8.0));
  EXPECT_DOUBLE_EQ(r.summary.grad_norm(), std::sqrt(8.0));
  EXPECT_TRUE(r.finite);
  EXPECT_FALSE(r.summary.skipped());
  EXPECT_FLOAT_EQ(r.grad_scale, ClipScale(std::sqrt(8.0), 1.0f));
  // 4 forwards and 4 backwards of 10 us per stage, from the timeline and from the profile.
  EXPECT_THAT(r.summary.stage_busy_seconds(), ElementsAre(DoubleEq(80e-6), DoubleEq(80e-6)));
  EXPECT_EQ(r.summary.stage_comm_seconds_size(), 2);
  EXPECT_EQ(r.summary.busy_seconds_size(), 2);
  EXPECT_EQ(r.summary.stage_seconds_size(), 2);
  EXPECT_GT(r.summary.bubble_predicted(), 0.0);
}

// The step's replay prices its messages at what the plan priced them (its profile's link):
// 1F1B over 2 stages waits for at least two messages on its critical path.
TEST(SummarizeReportsTest, TheReplayPricesMessagesAsThePlanDid) {
  const Schedule lowered = Lowered1F1B(2, 4);
  const std::vector<v1::StepReport> reports = Reports(lowered);
  std::vector<const v1::StepReport*> pointers;
  for (const auto& r : reports) pointers.push_back(&r);
  const v1::StepTimings timings = StepTimingsOf(7, reports, {0, 0});
  const StepReports free = SummarizeReports(7, lowered, 2, pointers, timings, 1.0f);
  const StepReports priced =
      SummarizeReports(7, lowered, 2, pointers, timings, 1.0f, 1, false, {0.001, 0.001});
  EXPECT_GE(priced.summary.exec_replayed_seconds(),
            free.summary.exec_replayed_seconds() + 2 * 0.001 - 1e-9);
  // A plan of another shape is left out of the replay, with a warning, not a wrong figure.
  const StepReports mismatched =
      SummarizeReports(7, lowered, 2, pointers, timings, 1.0f, 1, false, {0.001});
  EXPECT_EQ(mismatched.summary.exec_replayed_seconds(), 0.0);
  EXPECT_FALSE(mismatched.warnings.empty());
}

// A step that ran as the simulator says it would on `costs`, every rank on one clock.
std::vector<v1::StepReport> SimulatedReports(const Schedule& lowered,
                                             const std::vector<ActionCosts>& costs) {
  std::vector<v1::StepReport> out = Reports(lowered);
  absl::StatusOr<SimulationResult> sim = SimulateSchedule(lowered, ActionCosts{}, costs);
  EXPECT_TRUE(sim.ok()) << sim.status();
  if (!sim.ok()) return out;
  for (int r = 0; r < lowered.placement.num_ranks; ++r) {
    for (v1::ActionTiming& t : *out[r].mutable_timings()) {
      t.set_start_us(1'000'000 + std::llround(sim->start[r][t.index()] * 1e6));
      t.set_end_us(1'000'000 + std::llround(sim->end[r][t.index()] * 1e6));
    }
    out[r].set_exec_us(std::llround(sim->step_time * 1e6));
  }
  return out;
}

// The messages' flights, measured from the timings, and the replay on them: a step whose
// messages took 2 ms where the plan priced them at 0.1 ms replays to its own length with its
// flights, and short of it at the price.
TEST(SummarizeReportsTest, TheMessagesFlightsAreMeasuredAndReplayed) {
  const Schedule lowered = Lowered1F1B(2, 4);
  const std::vector<ActionCosts> costs = {{0.010, 0.020, 0, 0, 0.002}, {0.012, 0.024, 0, 0, 0.002}};
  const std::vector<v1::StepReport> reports = SimulatedReports(lowered, costs);
  std::vector<const v1::StepReport*> pointers;
  for (const auto& r : reports) pointers.push_back(&r);
  const v1::StepTimings timings = StepTimingsOf(7, reports, {0, 0});
  const StepReports r =
      SummarizeReports(7, lowered, 2, pointers, timings, 1.0f, 1, false, {0.0001, 0.0001});
  EXPECT_TRUE(r.warnings.empty()) << r.warnings[0];
  EXPECT_THAT(r.summary.stage_flight_seconds(),
              ElementsAre(DoubleNear(0.002, 2e-6), DoubleNear(0.002, 2e-6)));
  const double measured = static_cast<double>(reports[0].exec_us()) * 1e-6;
  EXPECT_NEAR(r.summary.exec_replayed_flights_seconds(), measured, 20e-6);
  // Two messages on the critical path (the first activation, the last gradient), each 1.9 ms
  // over its price.
  EXPECT_NEAR(r.summary.exec_replayed_seconds(), measured - 2 * 0.0019, 20e-6);
  // Without a price the replay on flights still runs; the priced one has free messages.
  const StepReports unpriced = SummarizeReports(7, lowered, 2, pointers, timings, 1.0f);
  EXPECT_NEAR(unpriced.summary.exec_replayed_flights_seconds(), measured, 20e-6);
}

// The once-per-step phase around the actions: the slowest worker's update before the step
// plus its gradient-norm pass, whichever worker it is; and the slowest worker's whole time in
// the call, which the coordinator's overhead is measured against.
TEST(SummarizeReportsTest, TheUpdatePhaseIsTheSlowestWorkersUpdateAndNormPass) {
  const Schedule lowered = Lowered1F1B(2, 4);
  std::vector<v1::StepReport> reports = Reports(lowered);  // exec 1000 and 1100 us
  reports[0].set_update_us(700);
  reports[0].set_grad_norm_us(60);
  reports[1].set_update_us(300);
  reports[1].set_grad_norm_us(500);
  const StepReports r = Summarize(lowered, reports);
  EXPECT_DOUBLE_EQ(r.summary.max_worker_update_seconds(), 800e-6);  // rank 1: 300 + 500
  EXPECT_EQ(r.max_exec_us, 1100);
  EXPECT_EQ(r.max_call_us, 1700);  // rank 0: 700 + 1000

  // Without updates (step 0, or a worker too old to say), the norm passes alone.
  const StepReports plain = Summarize(lowered, Reports(lowered));
  EXPECT_EQ(plain.summary.max_worker_update_seconds(), 0.0);
  EXPECT_EQ(plain.max_call_us, 1100);
}

// Two replicas of a 2-stage 1F1B pipeline (gang ranks 0, 1 and 2, 3): the loss is the sum of
// the replicas' shares, the norm replica 0's (the reduced gradients are the same on every
// replica), finiteness everyone's; the per-stage figures are replica 0's, with the reduction's
// time and its exposed part.
TEST(SummarizeReportsTest, DataParallelReplicasCombine) {
  const Schedule lowered = AddGradReductions(Lowered1F1B(2, 4));
  std::vector<v1::StepReport> reports = Reports(lowered, 1.25);
  std::vector<v1::StepReport> second = Reports(lowered, 1.5);
  for (v1::StepReport& rep : second) {
    rep.set_rank(rep.rank() + 2);
    reports.push_back(rep);
  }
  for (v1::StepReport& rep : reports) rep.set_reduced_bytes(100);
  std::vector<const v1::StepReport*> pointers;
  for (const auto& r : reports) pointers.push_back(&r);
  // Stage 0's reduction (its REDUCE_GRAD, the last action of rank 0) runs 30 us past the end
  // of the rank's last compute.
  for (v1::StepReport& rep : reports) {
    const int p = rep.rank() % 2;
    for (v1::ActionTiming& t : *rep.mutable_timings()) {
      if (!IsReductionAction(lowered.program[p][t.index()].kind)) continue;
      t.set_end_us(t.start_us() + 30);
    }
  }
  const StepReports r =
      SummarizeReports(7, lowered, 2, pointers, StepTimingsOf(7, reports, {0, 0, 0, 0}), 1.0f, 2);
  EXPECT_TRUE(r.warnings.empty()) << r.warnings[0];
  EXPECT_DOUBLE_EQ(r.summary.loss(), 2.75);
  EXPECT_DOUBLE_EQ(r.grad_norm, std::sqrt(8.0)) << "replica 0's two ranks only";
  EXPECT_EQ(r.summary.reduced_bytes(), 400);
  EXPECT_EQ(r.summary.stage_busy_seconds_size(), 2);
  ASSERT_EQ(r.summary.stage_reduce_seconds_size(), 2);
  EXPECT_DOUBLE_EQ(r.summary.stage_reduce_seconds(0), 30e-6);
  EXPECT_GT(r.summary.stage_reduce_exposed_seconds(0), 0.0);
  // Sharded optimizer state: each replica reports the norm of its own segments, so every
  // rank's counts.
  const StepReports sharded = SummarizeReports(
      7, lowered, 2, pointers, StepTimingsOf(7, reports, {0, 0, 0, 0}), 1.0f, 2, true);
  EXPECT_DOUBLE_EQ(sharded.grad_norm, std::sqrt(16.0)) << "all four ranks";
  // A non-finite gradient on any replica skips the step.
  reports[3].set_grads_finite(false);
  const StepReports bad =
      SummarizeReports(7, lowered, 2, pointers, StepTimingsOf(7, reports, {0, 0, 0, 0}), 1.0f, 2);
  EXPECT_FALSE(bad.finite);
}

TEST(SummarizeReportsTest, ClippingOffLeavesTheScaleAtOne) {
  const Schedule lowered = Lowered1F1B(2, 4);
  EXPECT_EQ(Summarize(lowered, Reports(lowered), /*clip=*/0.0f).grad_scale, 1.0f);
  EXPECT_EQ(Summarize(lowered, Reports(lowered), /*clip=*/10.0f).grad_scale, 1.0f);
}

// A rank's non-finite gradient, or a non-finite loss, skips the step on every stage, unscaled.
TEST(SummarizeReportsTest, ANonFiniteGradientOrLossSkipsTheStep) {
  const Schedule lowered = Lowered1F1B(2, 4);
  std::vector<v1::StepReport> reports = Reports(lowered);
  reports[0].set_grads_finite(false);
  StepReports r = Summarize(lowered, reports);
  EXPECT_FALSE(r.finite);
  EXPECT_TRUE(r.summary.skipped());
  EXPECT_EQ(r.grad_scale, 1.0f);

  r = Summarize(lowered, Reports(lowered, /*loss=*/kNaN));  // the norm alone would clip
  EXPECT_FALSE(r.finite);
  EXPECT_EQ(r.grad_scale, 1.0f);

  reports = Reports(lowered);
  reports[1].set_grad_norm_sq(kInf);
  r = Summarize(lowered, reports);
  EXPECT_FALSE(r.finite);
  EXPECT_EQ(r.grad_scale, 1.0f);
}

TEST(SummarizeReportsTest, NoLossIsReported) {
  const Schedule lowered = Lowered1F1B(2, 4);
  std::vector<v1::StepReport> reports = Reports(lowered);
  for (auto& rep : reports) rep.clear_has_loss();
  EXPECT_FALSE(Summarize(lowered, reports).has_loss);
}

// Reports that do not match the schedule (here: of a 2-rank program, for a 3-rank one) leave
// the profile and the timeline out, and say why.
TEST(SummarizeReportsTest, ReportsThatDoNotMatchTheScheduleAreWarnedAbout) {
  const Schedule two = Lowered1F1B(2, 4);
  const Schedule three = Lowered1F1B(3, 4);
  const std::vector<v1::StepReport> reports = Reports(two);
  std::vector<const v1::StepReport*> pointers;
  for (const auto& r : reports) pointers.push_back(&r);
  const StepReports r =
      SummarizeReports(7, three, 3, pointers, StepTimingsOf(7, reports, {}), 1.0f);
  EXPECT_TRUE(r.has_loss);
  EXPECT_THAT(r.warnings, UnorderedElementsAre(HasSubstr("cannot profile the step: "),
                                               HasSubstr("cannot build the step's timeline: ")));
  EXPECT_EQ(r.summary.busy_seconds_size(), 0);
  EXPECT_EQ(r.summary.stage_busy_seconds_size(), 0);
  EXPECT_EQ(r.summary.stage_memory_size(), 3);
}

// A stage memory record of a stage the plan does not have is ignored.
TEST(SummarizeReportsTest, StageMemoryOutsideThePlanIsIgnored) {
  const Schedule lowered = Lowered1F1B(2, 4);
  std::vector<v1::StepReport> reports = Reports(lowered);
  reports[0].add_stage_memory()->set_stage(9);
  reports[0].add_stage_memory()->set_stage(-1);
  const StepReports r = Summarize(lowered, reports);
  EXPECT_EQ(r.summary.stage_memory_size(), 2);
}

TEST(SetThroughputTest, OverheadTokensPerSecondAndMfu) {
  StepThroughput t;
  t.run_seconds = 0.5;
  t.step_seconds = 2.0;
  t.max_exec_us = 400'000;
  t.tokens_per_step = 1000;
  t.model_flops_per_token = 6e6;
  t.peak_flops = {1e9, 2e9};
  v1::StepSummary s;
  SetThroughput(t, &s);
  EXPECT_EQ(s.step_seconds(), 2.0);
  EXPECT_DOUBLE_EQ(s.max_worker_exec_seconds(), 0.4);
  EXPECT_DOUBLE_EQ(s.coordinator_overhead_seconds(), 0.1);  // 0.5 s of RunStep, 0.4 s of it work
  EXPECT_DOUBLE_EQ(s.tokens_per_second(), 500.0);
  EXPECT_DOUBLE_EQ(s.mfu(), 6e6 * 1000 / 2.0 / 3e9);

  // The update a worker ran before the step's actions is its work too, not overhead.
  t.max_call_us = 450'000;
  v1::StepSummary with_update;
  SetThroughput(t, &with_update);
  EXPECT_NEAR(with_update.coordinator_overhead_seconds(), 0.05, 1e-12);
  EXPECT_DOUBLE_EQ(with_update.max_worker_exec_seconds(), 0.4);

  // A worker slower than the phase's wall time (clocks differ): no negative overhead.
  t.max_exec_us = 600'000;
  // One unknown peak leaves the MFU unknown (0).
  t.peak_flops = {1e9, 0};
  v1::StepSummary u;
  SetThroughput(t, &u);
  EXPECT_EQ(u.coordinator_overhead_seconds(), 0.0);
  EXPECT_EQ(u.mfu(), 0.0);

  // A step of no time has no rate.
  t.step_seconds = 0;
  v1::StepSummary z;
  SetThroughput(t, &z);
  EXPECT_EQ(z.tokens_per_second(), 0.0);
  EXPECT_EQ(z.mfu(), 0.0);
}

}  // namespace
}  // namespace tandem::coordinator
