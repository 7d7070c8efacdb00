#include "coordinator/prediction_check.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace tandem::coordinator {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// A 2-stage job predicted at 10 s a step (9.8 s of pipeline, each stage 1 s per micro-batch),
// with `steps` steps of the given step, pipeline and replayed times, the stages at `stage` s.
v1::Job JobWithSteps(int steps, double step_s, double exec_s, double replayed_s, double stage_s) {
  v1::Job job;
  job.set_state(v1::RUNNING);
  job.set_total_steps(100);
  job.set_predicted_step_seconds(10.0);
  job.set_predicted_update_seconds(0.2);
  for (int s = 0; s < 2; ++s) {
    v1::StageAssignment* a = job.add_stages();
    a->set_stage(s);
    a->set_predicted_seconds(1.0);
  }
  for (int i = 0; i < steps; ++i) {
    v1::StepSummary* h = job.add_history();
    h->set_step(i);
    h->set_step_seconds(step_s);
    h->set_max_worker_exec_seconds(exec_s);
    h->set_exec_replayed_seconds(replayed_s);
    h->add_stage_seconds(stage_s);
    h->add_stage_seconds(stage_s);
  }
  return job;
}

TEST(CheckPrediction, NeedsAPredictionAndTwoSteadySteps) {
  EXPECT_FALSE(CheckPrediction(v1::Job()).has_value());
  v1::Job none = JobWithSteps(6, 10, 9.8, 9.8, 1);
  none.set_predicted_step_seconds(0);
  EXPECT_FALSE(CheckPrediction(none).has_value());
  // Steps 0 and 1: step 0 warms up, which leaves one.
  EXPECT_FALSE(CheckPrediction(JobWithSteps(2, 10, 9.8, 9.8, 1)).has_value());
  EXPECT_TRUE(CheckPrediction(JobWithSteps(3, 10, 9.8, 9.8, 1)).has_value());
}

TEST(CheckPrediction, CountsOnlyTheSteadySteps) {
  v1::Job job = JobWithSteps(8, 10, 9.8, 9.8, 1);
  job.mutable_history(0)->set_step_seconds(30);  // warm-up
  job.mutable_history(3)->set_step_seconds(40);  // followed by a validation pass
  job.mutable_history(3)->set_has_val_loss(true);
  job.mutable_history(7)->set_step_seconds(50);  // the last step of a finished job
  job.mutable_history(1)->set_step_seconds(11);
  job.mutable_history(2)->set_step_seconds(12);
  job.set_state(v1::SUCCEEDED);
  job.set_total_steps(8);
  std::optional<v1::PredictionCheck> c = CheckPrediction(job);
  ASSERT_TRUE(c.has_value());
  // Steps 1, 2, 4, 5, 6 (shown as 2..7): 11, 12, 10, 10, 10.
  EXPECT_EQ(c->steps(), 5);
  EXPECT_EQ(c->first_step(), 1);
  EXPECT_EQ(c->last_step(), 6);
  EXPECT_EQ(c->tolerance(), kPredictionTolerance);
  EXPECT_EQ(c->miss(), v1::PREDICTION_WITHIN);
  EXPECT_THAT(c->summary(), HasSubstr("median of steps 2-7: x1.000 the prediction (within 3%)"));
  EXPECT_DOUBLE_EQ(c->measured_seconds(), 10);
  EXPECT_DOUBLE_EQ(c->predicted_seconds(), 10);
  EXPECT_DOUBLE_EQ(c->pipeline_measured_seconds(), 9.8);
  EXPECT_DOUBLE_EQ(c->pipeline_replayed_seconds(), 9.8);
  EXPECT_DOUBLE_EQ(c->stage_ratio_low(), 1);
  EXPECT_DOUBLE_EQ(c->stage_ratio_high(), 1);

  // While the job runs, its latest step counts; the first step of a resumed run does not.
  job.set_state(v1::RUNNING);
  job.set_first_step(4);
  c = CheckPrediction(job);
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->steps(), 5);  // 1, 2, 5, 6, 7
  EXPECT_EQ(c->last_step(), 7);
  EXPECT_DOUBLE_EQ(c->measured_seconds(), 11);  // 10, 10, 11, 12, 50
}

TEST(CheckPrediction, StagesAreEachSetAgainstTheirOwnPrediction) {
  v1::Job job = JobWithSteps(5, 12, 11.8, 11.6, 1.2);
  job.mutable_stages(1)->set_predicted_seconds(1.0 / 1.1);  // stage 1 at 1.0 s: x1.1
  for (v1::StepSummary& h : *job.mutable_history()) h.set_stage_seconds(1, 1.0);
  std::optional<v1::PredictionCheck> c = CheckPrediction(job);
  ASSERT_TRUE(c.has_value());
  EXPECT_DOUBLE_EQ(c->stage_ratio_low(), 1.1);
  EXPECT_DOUBLE_EQ(c->stage_ratio_high(), 1.2);
  // A stage without a measurement in every step: no per-stage figure at all.
  job.mutable_history(2)->clear_stage_seconds();
  c = CheckPrediction(job);
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->stage_ratio_low(), 0);
  EXPECT_EQ(c->stage_ratio_high(), 0);
  // Nor a replay unless every steady step has one.
  job.mutable_history(3)->set_exec_replayed_seconds(0);
  EXPECT_EQ(CheckPrediction(job)->pipeline_replayed_seconds(), 0);
}

TEST(FormatPredictionCheck, WithinTheToleranceSaysSo) {
  const std::string out =
      FormatPredictionCheck(*CheckPrediction(JobWithSteps(8, 10.2, 10, 9.9, 1)));
  EXPECT_EQ(out, "10.200 s per step, median of steps 2-8: x1.020 the prediction (within 3%)");
}

TEST(FormatPredictionCheck, ACostMissIsTheCostsNotTheSchedule) {
  // The bench's first job on a host that slowed under it: the schedule on its own costs gives
  // the pipeline it measured, and both stages ran about 1.2x of their predicted times.
  v1::Job job = JobWithSteps(8, 11.9, 11.7, 11.5, 1.2);
  job.mutable_history(4)->set_stage_seconds(1, 1.22);
  job.mutable_history(5)->set_stage_seconds(1, 1.22);
  job.mutable_history(6)->set_stage_seconds(1, 1.22);
  job.mutable_history(7)->set_stage_seconds(1, 1.22);
  EXPECT_EQ(CheckPrediction(job)->miss(), v1::PREDICTION_MISS_COSTS);
  EXPECT_EQ(FormatPredictionCheck(*CheckPrediction(job)),
            "11.900 s per step, median of steps 2-8: x1.190 the prediction; the schedule "
            "replayed on those steps' own costs 11.500 s against 11.700 s measured (within 3%), "
            "the stages ran x1.200-1.220 of their predicted times: the costs moved, not the "
            "schedule (a busier or slower host, or a stale profile)");
}

TEST(FormatPredictionCheck, AScheduleMissIsTheSchedule) {
  // The stages ran as predicted, yet the pipeline took 1.15x of its replay.
  v1::Job job = JobWithSteps(6, 11.5, 11.3, 9.8, 1.0);
  EXPECT_EQ(CheckPrediction(job)->miss(), v1::PREDICTION_MISS_SCHEDULE);
  std::string out = FormatPredictionCheck(*CheckPrediction(job));
  EXPECT_THAT(out, HasSubstr("x1.150 the prediction; the schedule replayed on those steps' own "
                             "costs 9.800 s against 11.300 s measured (x1.153), the stages ran "
                             "x1.000 of their predicted times: the time went to the schedule "
                             "beyond its compute (waits, transfers, per-action overheads)"));
  EXPECT_THAT(out, Not(HasSubstr("costs moved")));
  // With data parallelism the reduction is one of the suspects; with the stages off too, both.
  job.mutable_spec()->mutable_pipeline()->set_replicas(2);
  for (v1::StepSummary& h : *job.mutable_history()) h.set_stage_seconds(0, 1.1);
  EXPECT_EQ(CheckPrediction(job)->miss(), v1::PREDICTION_MISS_SCHEDULE_AND_COSTS);
  out = FormatPredictionCheck(*CheckPrediction(job));
  EXPECT_THAT(out, HasSubstr("x1.000-1.100 of their predicted times: the time went to the "
                             "schedule beyond its compute (waits, transfers, the gradient "
                             "reduction, per-action overheads), and the costs moved"));
}

// Every stage's messages priced at `price` s and measured at `flight` s, the replay with
// those flights at `flown_s`.
void SetFlights(v1::Job* job, double price, double flight, double flown_s) {
  for (v1::StageAssignment& a : *job->mutable_stages()) a.set_predicted_transfer_seconds(price);
  for (v1::StepSummary& h : *job->mutable_history()) {
    h.set_exec_replayed_flights_seconds(flown_s);
    h.clear_stage_flight_seconds();
    for (int s = 0; s < job->stages_size(); ++s) h.add_stage_flight_seconds(flight);
  }
}

TEST(FormatPredictionCheck, AMissTheMessagesFlightsExplainIsTheTransfers) {
  // A small model's step: 1.4x its replay on priced messages, which flew at 3x their price;
  // replayed with their flights, the schedule gives the pipeline.
  v1::Job job = JobWithSteps(6, 0.0172, 0.0171, 0.01213, 0.001);
  job.set_predicted_step_seconds(0.0124);
  for (v1::StageAssignment& a : *job.mutable_stages()) a.set_predicted_seconds(0.001);
  SetFlights(&job, 0.0001, 0.0003, 0.0168);
  std::optional<v1::PredictionCheck> c = CheckPrediction(job);
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->miss(), v1::PREDICTION_MISS_TRANSFERS);
  EXPECT_DOUBLE_EQ(c->pipeline_flights_seconds(), 0.0168);
  EXPECT_DOUBLE_EQ(c->flight_ratio_low(), 3);
  EXPECT_DOUBLE_EQ(c->flight_ratio_high(), 3);
  EXPECT_THAT(c->summary(),
              HasSubstr("costs 0.0121 s against 0.0171 s measured (x1.410), and with the "
                        "messages as they flew (x3.0 their price) 0.0168 s (within 3%), the "
                        "stages ran x1.000 of their predicted times: the time went to the "
                        "messages, off the price the profile's idle link probe put on them"));
  EXPECT_EQ(MissName(c->miss()), "transfers");

  // The stages off as well: both.
  for (v1::StepSummary& h : *job.mutable_history()) h.set_stage_seconds(1, 0.0012);
  c = CheckPrediction(job);
  EXPECT_EQ(c->miss(), v1::PREDICTION_MISS_TRANSFERS_AND_COSTS);
  EXPECT_THAT(c->summary(), HasSubstr("put on them (a link shared with the compute, or a "
                                      "slower one), and the costs moved"));
  EXPECT_EQ(MissName(c->miss()), "transfers and costs");
}

TEST(FormatPredictionCheck, FlightsThatDoNotExplainTheMissLeaveTheSchedule) {
  // The messages flew at 1.5-2.5x their price, but even with their flights the replay falls
  // short: what is left is the schedule's own (waits, per-action overheads).
  v1::Job job = JobWithSteps(6, 11.5, 11.3, 9.8, 1.0);
  SetFlights(&job, 0.01, 0.015, 10.0);
  job.mutable_history(2)->set_stage_flight_seconds(1, 0.025);
  job.mutable_history(3)->set_stage_flight_seconds(1, 0.025);
  job.mutable_history(4)->set_stage_flight_seconds(1, 0.025);
  std::optional<v1::PredictionCheck> c = CheckPrediction(job);
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->miss(), v1::PREDICTION_MISS_SCHEDULE);
  EXPECT_DOUBLE_EQ(c->flight_ratio_low(), 1.5);
  EXPECT_DOUBLE_EQ(c->flight_ratio_high(), 2.5);
  EXPECT_THAT(c->summary(),
              HasSubstr("(x1.153), and with the messages as they flew (x1.5-2.5 their price) "
                        "10.000 s (x1.130), the stages ran x1.000 of their predicted times: the "
                        "time went to the schedule beyond its compute and its messages (waits, "
                        "per-action overheads)"));
  // A stage whose messages were never waited for has no flight: the ratio is over the others.
  for (v1::StepSummary& h : *job.mutable_history()) h.set_stage_flight_seconds(1, 0);
  c = CheckPrediction(job);
  EXPECT_DOUBLE_EQ(c->flight_ratio_low(), 1.5);
  EXPECT_DOUBLE_EQ(c->flight_ratio_high(), 1.5);
  // Without a price (no measured link) there is no ratio, and the line says none.
  for (v1::StageAssignment& a : *job.mutable_stages()) a.set_predicted_transfer_seconds(0);
  c = CheckPrediction(job);
  EXPECT_EQ(c->flight_ratio_low(), 0);
  EXPECT_THAT(c->summary(), HasSubstr("(x1.153), and with the messages as they flew 10.000 s "
                                      "(x1.130)"));
}

TEST(FormatPredictionCheck, FlightsAreNotMentionedWhenTheReplayHolds) {
  v1::Job job = JobWithSteps(6, 12, 11.8, 11.7, 1.2);
  SetFlights(&job, 0.01, 0.03, 11.75);
  const std::optional<v1::PredictionCheck> c = CheckPrediction(job);
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->miss(), v1::PREDICTION_MISS_COSTS);
  EXPECT_THAT(c->summary(), Not(HasSubstr("as they flew")));
}

TEST(FormatPredictionCheck, NeitherTheScheduleNorTheStagesLeavesTheUpdateOrTheCalls) {
  const std::optional<v1::PredictionCheck> c = CheckPrediction(JobWithSteps(5, 11, 9.8, 9.8, 1));
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->miss(), v1::PREDICTION_MISS_UPDATE_OR_CALLS);
  const std::string out = c->summary();
  EXPECT_THAT(out, HasSubstr("x1.100 the prediction"));
  EXPECT_THAT(out, HasSubstr(": neither the schedule nor the stages: the update or the calls"));
}

TEST(FormatPredictionCheck, WithoutAReplayOrStageTimesOnlyWhatIsKnown) {
  v1::Job job = JobWithSteps(5, 12, 11.8, 0, 0);
  EXPECT_EQ(CheckPrediction(job)->miss(), v1::PREDICTION_MISS_UNKNOWN);
  EXPECT_EQ(FormatPredictionCheck(*CheckPrediction(job)),
            "12.000 s per step, median of steps 2-5: x1.200 the prediction");
  for (v1::StepSummary& h : *job.mutable_history()) {
    h.set_stage_seconds(0, 1.2);
    h.set_stage_seconds(1, 1.2);
  }
  EXPECT_EQ(FormatPredictionCheck(*CheckPrediction(job)),
            "12.000 s per step, median of steps 2-5: x1.200 the prediction, the stages ran "
            "x1.200 of their predicted times: the costs moved (a busier or slower host, or a "
            "stale profile)");
}

TEST(FormatPredictionCheck, MillisecondStepsKeepTheirDigits) {
  // A small model: 17 ms steps, 12 ms of replay against 17 ms of pipeline.
  v1::Job job = JobWithSteps(6, 0.0172, 0.0171, 0.01213, 0.001);
  job.set_predicted_step_seconds(0.0166);
  for (v1::StageAssignment& a : *job.mutable_stages()) a.set_predicted_seconds(0.0016);
  const std::optional<v1::PredictionCheck> c = CheckPrediction(job);
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->miss(), v1::PREDICTION_MISS_SCHEDULE_AND_COSTS);
  EXPECT_THAT(c->summary(), HasSubstr("0.0172 s per step, median of steps 2-6: x1.036 the "
                                      "prediction; the schedule replayed on those steps' own "
                                      "costs 0.0121 s against 0.0171 s measured (x1.410), the "
                                      "stages ran x0.625 of their predicted times"));
}

}  // namespace
}  // namespace tandem::coordinator
