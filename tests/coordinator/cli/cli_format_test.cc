#include <sstream>
#include <string>

#include "coordinator/cli/format.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"

namespace tandem::cli {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

v1::StepSummary Step(int64_t step, double loss, double seconds, double tok_per_s) {
  v1::StepSummary s;
  s.set_step(step);
  s.set_loss(loss);
  s.set_step_seconds(seconds);
  s.set_tokens_per_second(tok_per_s);
  return s;
}

TEST(FormatEta, MinutesAndHours) {
  EXPECT_EQ(FormatEta(0), "0:00");
  EXPECT_EQ(FormatEta(6), "0:06");
  EXPECT_EQ(FormatEta(5.6), "0:06");
  EXPECT_EQ(FormatEta(754), "12:34");
  EXPECT_EQ(FormatEta(3723), "1:02:03");
  EXPECT_EQ(FormatEta(-1), "--:--");
  EXPECT_EQ(FormatEta(std::numeric_limits<double>::infinity()), "--:--");
}

TEST(ProgressBar, FillsProportionallyAndClamps) {
  EXPECT_EQ(ProgressBar(12, 50, 20), "[####----------------]");
  EXPECT_EQ(ProgressBar(0, 50, 10), "[----------]");
  EXPECT_EQ(ProgressBar(50, 50, 10), "[##########]");
  EXPECT_EQ(ProgressBar(60, 50, 10), "[##########]");
  EXPECT_EQ(ProgressBar(3, 0, 4), "[----]");
  EXPECT_EQ(Percent(12, 50), 24);
  EXPECT_EQ(Percent(1, 3), 33);
  EXPECT_EQ(Percent(5, 0), 0);
  EXPECT_EQ(Percent(70, 50), 100);
}

TEST(FormatStepLine, Literal) {
  // 38 steps left at 0.15 s/step: 5.7 s.
  EXPECT_EQ(FormatStepLine(Step(11, 3.45123, 0.1421, 1802.4), 50, 0.15),
            "step 12/50  loss 3.4512  142.1 ms/step  1802 tok/s  [####----------------]  24%  "
            "ETA 0:06");
  EXPECT_EQ(FormatStepLine(Step(49, 1.0, 0.1, 100), 50, 0.1),
            "step 50/50  loss 1.0000  100.0 ms/step  100 tok/s  [####################]  100%  "
            "ETA 0:00");
  EXPECT_THAT(FormatStepLine(Step(0, 5.5, 0.2, 10), 10, 0), HasSubstr("ETA --:--"));
}

TEST(LayerRangeName, NamesFirstAndLast) {
  v1::ModelSpec m;
  m.set_n_layer(4);
  EXPECT_EQ(LayerRangeName(m, 0, 3), "embedding..block_1");
  EXPECT_EQ(LayerRangeName(m, 3, 6), "block_2..head");
  EXPECT_EQ(LayerRangeName(m, 5, 6), "head");
  EXPECT_EQ(LayerRangeName(m, 0, 6), "embedding..head");
  EXPECT_EQ(LayerRangeName(m, 2, 2), "-");
}

TEST(Table, AlignsColumnsWithoutTrailingSpaces) {
  Table t({"ID", "NAME", "NOTE"});
  t.AddRow({"job-1", "a", ""});
  t.AddRow({"job-22", "longer", "x"});
  t.AddRow({"j"});
  EXPECT_EQ(t.Render(),
            "ID      NAME    NOTE\n"
            "job-1   a\n"
            "job-22  longer  x\n"
            "j\n");
}

TEST(FormatJobsTable, Literal) {
  v1::ListJobsResponse jobs;
  v1::Job* a = jobs.add_jobs();
  a->set_id("job-1");
  a->set_name("quickstart");
  a->set_state(v1::RUNNING);
  a->set_steps_done(12);
  a->set_total_steps(60);
  a->set_last_loss(3.45123);
  v1::Job* b = jobs.add_jobs();
  b->set_id("job-2");
  b->set_name("big");
  b->set_state(v1::QUEUED);
  b->set_total_steps(50);
  b->set_reason("waiting for 4 idle cpu workers (2 idle)");
  EXPECT_EQ(
      FormatJobsTable(jobs),
      "ID     NAME        STATE    STEP   LOSS    VS PREDICTED  REASON\n"
      "job-1  quickstart  RUNNING  12/60  3.4512  -\n"
      "job-2  big         QUEUED   0/50   -       -             waiting for 4 idle cpu workers "
      "(2 idle)\n");
  // With the coordinator's check of its prediction: the median step over it, and whose miss.
  v1::PredictionCheck* c = a->mutable_prediction_check();
  c->set_predicted_seconds(10);
  c->set_measured_seconds(10.2);
  EXPECT_THAT(FormatJobsTable(jobs),
              HasSubstr("job-1  quickstart  RUNNING  12/60  3.4512  x1.020\n"));
  c->set_measured_seconds(11.9);
  c->set_miss(v1::PREDICTION_MISS_COSTS);
  EXPECT_THAT(FormatJobsTable(jobs), HasSubstr("3.4512  x1.190 costs\n"));
  c->set_miss(v1::PREDICTION_MISS_SCHEDULE_AND_COSTS);
  EXPECT_THAT(FormatJobsTable(jobs), HasSubstr("3.4512  x1.190 schedule+costs\n"));
}

v1::ListWorkersResponse TwoWorkers() {
  v1::ListWorkersResponse workers;
  v1::WorkerInfo* w = workers.add_workers();
  w->set_worker_id("w-1");
  w->set_address("10.0.0.1:7100");
  w->set_device("cpu");
  w->set_threads(2);
  w->set_state(v1::BUSY);
  w->set_job_id("job-1");
  w->set_stage(0);
  w->set_heartbeat_age_seconds(0.42);
  w->set_version("0.1.0");
  w->set_peak_flops(61.25e9);
  w->set_node("rack1-a");
  w = workers.add_workers();
  w->set_worker_id("w-2");
  w->set_address("10.0.0.2:7100");
  w->set_device("cuda:0");
  w->set_threads(8);
  w->set_state(v1::LOST);
  w->set_heartbeat_age_seconds(95);
  return workers;
}

TEST(FormatWorkersTable, Literal) {
  EXPECT_EQ(FormatWorkersTable(TwoWorkers()),
            "ID   ADDRESS        NODE     DEVICE  THREADS  PEAK GFLOP/S  STATE  JOB    STAGE  "
            "HEARTBEAT  VERSION\n"
            "w-1  10.0.0.1:7100  rack1-a  cpu     2        61.2          BUSY   job-1  0      "
            "0.4s       0.1.0\n"
            "w-2  10.0.0.2:7100  -        cuda:0  8        -             LOST   -      -      "
            "1:35 ago   -\n");
  EXPECT_EQ(FormatWorkersSummary(TwoWorkers()), "2 workers: 0 idle, 1 busy, 1 lost");
  EXPECT_EQ(FormatWorkersSummary({}), "0 workers: 0 idle, 0 busy, 0 lost");
}

v1::Job RunningJob() {
  v1::Job job;
  job.set_id("job-7");
  job.set_name("quickstart");
  job.set_state(v1::RUNNING);
  job.set_steps_done(12);
  job.set_total_steps(60);
  job.set_last_loss(3.45123);
  job.set_effective_batch(128);
  job.set_bubble_fraction_ideal(0.2);
  v1::JobSpec* spec = job.mutable_spec();
  spec->mutable_model()->set_arch("mlp_lm");
  spec->mutable_model()->set_n_layer(4);
  spec->mutable_pipeline()->set_stages(2);
  spec->mutable_pipeline()->set_micro_batch_size(32);
  spec->mutable_pipeline()->set_micro_batches(4);
  spec->mutable_pipeline()->set_schedule("1f1b");
  spec->mutable_optimizer()->set_name("adamw");
  v1::StageAssignment* s = job.add_stages();
  s->set_stage(0);
  s->set_worker_id("w-1");
  s->set_address("10.0.0.1:7100");
  s->set_layer_begin(0);
  s->set_layer_end(3);
  s->set_actions("0F0 0SEND_F0 0F1 0SEND_F1");
  s = job.add_stages();
  s->set_stage(1);
  s->set_worker_id("w-2");
  s->set_address("10.0.0.2:7100");
  s->set_layer_begin(3);
  s->set_layer_end(6);
  s->set_actions("1RECV_F0 1F0 1B0 1SEND_B0");
  for (int i = 1; i <= 12; ++i) *job.add_history() = Step(i - 1, 5.0 - 0.1 * i, 0.1, 1280);
  return job;
}

TEST(FormatJobDetails, ShowsBatchBubbleStagesAndRecentSteps) {
  const std::string out = FormatJobDetails(RunningJob());
  EXPECT_THAT(out, HasSubstr("job-7  quickstart"));
  EXPECT_THAT(out, HasSubstr("State      RUNNING"));
  EXPECT_THAT(out, HasSubstr("12/60 steps  [####----------------]  20%"));
  EXPECT_THAT(out, HasSubstr("Last loss  3.4512"));
  EXPECT_THAT(
      out,
      HasSubstr(
          "32 x 4 = 128 sequences, 128 tokens per step (the effective batch the lr applies to)"));
  EXPECT_THAT(out, HasSubstr("ideal bubble 20.0%"));
  EXPECT_THAT(out, HasSubstr("STAGE  WORKER  ADDRESS        LAYERS              ACTIONS\n"
                             "0      w-1     10.0.0.1:7100  embedding..block_1  0F0 0SEND_F0"));
  EXPECT_THAT(out, HasSubstr("1      w-2     10.0.0.2:7100  block_2..head       1RECV_F0"));
  // The last ten steps only.
  EXPECT_THAT(out, HasSubstr("\n3     4.7000"));
  EXPECT_THAT(out, HasSubstr("\n12    3.8000"));
  EXPECT_THAT(out, Not(HasSubstr("\n2     4.8000")));
  EXPECT_THAT(out, Not(HasSubstr("Reason")));
}

// With a profile, each stage shows its predicted and measured time per micro-batch and its
// memory; a stage more than 20% slower than predicted is flagged.
TEST(FormatJobDetails, RestartsShowTheirCountAndFirstCause) {
  v1::Job job = RunningJob();
  EXPECT_THAT(FormatJobDetails(job), Not(HasSubstr("Restarts")));
  job.mutable_spec()->set_max_restarts(3);
  job.set_restarts(2);
  job.set_first_failure("step 36: stage 1 (worker w-2 at 10.0.0.2:7100) is unreachable");
  EXPECT_THAT(FormatJobDetails(job),
              HasSubstr("Restarts   2 of 3 after faults; first cause: step 36: stage 1 (worker "
                        "w-2 at 10.0.0.2:7100) is unreachable"));
}

TEST(FormatJobDetails, CheckpointsNotStoredShowTheirCountAndTheLatestCause) {
  v1::Job job = RunningJob();
  EXPECT_THAT(FormatJobDetails(job), Not(HasSubstr("Not stored")));
  job.set_checkpoint_failures(2);
  job.set_last_checkpoint_failure("checkpoint after step 30 not stored (disk full)");
  EXPECT_THAT(FormatJobDetails(job),
              HasSubstr("Not stored  2 checkpoint(s); the latest: checkpoint after step 30 not "
                        "stored (disk full)"));
}

TEST(FormatJobDetails, PredictedAgainstMeasuredStageTimes) {
  v1::Job job = RunningJob();
  job.mutable_stages(0)->set_predicted_seconds(0.100);
  job.mutable_stages(0)->set_predicted_bytes(int64_t{3} << 29);
  job.mutable_stages(1)->set_predicted_seconds(0.100);
  job.mutable_stages(1)->set_predicted_bytes(int64_t{5} << 20);
  v1::StepSummary* last = job.mutable_history(job.history_size() - 1);
  last->add_stage_seconds(0.105);
  last->add_stage_seconds(0.130);
  const std::string out = FormatJobDetails(job);
  EXPECT_THAT(out, HasSubstr("PREDICTED MS/MB  MEASURED MS/MB  PREDICTED MEM"));
  EXPECT_THAT(out, HasSubstr("100.0            105.0           1.5 GiB"));
  EXPECT_THAT(out, HasSubstr("100.0            130.0 SLOW      5.0 MiB"));
  EXPECT_THAT(out, HasSubstr("warning: stage(s) 1 ran more than 20% slower than the profile"));
  // Once a step reports each stage's peak memory, it stands beside the prediction.
  last->add_stage_peak_bytes(int64_t{1} << 30);
  last->add_stage_peak_bytes(int64_t{6} << 20);
  const std::string with_peaks = FormatJobDetails(job);
  EXPECT_THAT(with_peaks, HasSubstr("MEASURED MS/MB  PEAK / PREDICTED MEM"));
  EXPECT_THAT(with_peaks, HasSubstr("105.0           1.0 GiB / 1.5 GiB"));
  EXPECT_THAT(with_peaks, HasSubstr("130.0 SLOW      6.0 MiB / 5.0 MiB"));
  EXPECT_THAT(with_peaks, Not(HasSubstr("Memory per stage")));
  // With the parts of each stage's memory, a table of them.
  for (int s = 0; s < 2; ++s) {
    v1::StageMemory* m = last->add_stage_memory();
    m->set_stage(s);
    m->set_parameter_bytes(int64_t{256} << 20);
    m->set_gradient_bytes(int64_t{256} << 20);
    m->set_optimizer_bytes(int64_t{512} << 20);
    m->set_workspace_bytes(s == 0 ? int64_t{3} << 20 : 0);
    m->set_peak_activation_bytes(int64_t{2} << 20);
  }
  const std::string parts = FormatJobDetails(job);
  EXPECT_THAT(parts, HasSubstr("Memory per stage (latest step; activations at their peak)"));
  EXPECT_THAT(parts, HasSubstr("PARAMETERS  GRADIENTS  OPTIMIZER  WORKSPACE  ACTIVATIONS"));
  EXPECT_THAT(parts, HasSubstr("256.0 MiB   256.0 MiB  512.0 MiB  3.0 MiB    2.0 MiB"));
}

// The coordinator's check of the prediction (Job.prediction_check) is printed as it says it.
TEST(FormatJobDetails, ShowsTheMeasuredStepUnderThePrediction) {
  v1::Job job = RunningJob();
  job.set_predicted_step_seconds(10.0);
  job.set_predicted_update_seconds(0.2);
  EXPECT_THAT(FormatJobDetails(job), Not(HasSubstr("Measured ")));  // no check made
  job.mutable_prediction_check()->set_summary("11.900 s per step, median of steps 2-8: x1.190");
  EXPECT_THAT(FormatJobDetails(job),
              HasSubstr("Predicted  10.000 s per step (update 0.200 s)\n"
                        "Measured   11.900 s per step, median of steps 2-8: x1.190\n"));
  job.clear_predicted_step_seconds();
  EXPECT_THAT(FormatJobDetails(job), Not(HasSubstr("Measured ")));
}

// The last step's per-stage compute / transfer / idle seconds, its MFU, and the planner's
// choice.
TEST(FormatJobDetails, PerStageTimesMfuAndThePlan) {
  v1::Job job = RunningJob();
  job.set_plan("zb_h1, 8 micro-batches of 4, 1 stage per worker: predicted 1.000 s per step");
  v1::StepSummary* last = job.mutable_history(job.history_size() - 1);
  for (double b : {0.080, 0.090}) last->add_stage_busy_seconds(b);
  for (double c : {0.002, 0.003}) last->add_stage_comm_seconds(c);
  for (double i : {0.018, 0.007}) last->add_stage_idle_seconds(i);
  last->set_mfu(0.4125);
  const std::string out = FormatJobDetails(job);
  EXPECT_THAT(out, HasSubstr("Planned    zb_h1, 8 micro-batches of 4"));
  EXPECT_THAT(out, HasSubstr("BUSY / COMM / IDLE S   ACTIONS"));
  EXPECT_THAT(out, HasSubstr("0.080 / 0.002 / 0.018  0F0"));
  EXPECT_THAT(out, HasSubstr("0.090 / 0.003 / 0.007  1RECV_F0"));
  EXPECT_THAT(out, HasSubstr("MFU"));
  EXPECT_THAT(out, HasSubstr("41.2%"));
}

TEST(FormatJobDetails, QueuedJobShowsReasonAndComputesBubble) {
  v1::Job job = RunningJob();
  job.set_state(v1::QUEUED);
  job.set_reason("waiting for 2 idle cpu workers (1 idle)");
  job.set_steps_done(0);
  job.set_effective_batch(0);
  job.set_bubble_fraction_ideal(0);
  job.clear_stages();
  job.clear_history();
  const std::string out = FormatJobDetails(job);
  EXPECT_THAT(out, HasSubstr("Reason     waiting for 2 idle cpu workers (1 idle)"));
  EXPECT_THAT(out, HasSubstr("Last loss  -"));
  EXPECT_THAT(out, HasSubstr("= 128 sequences"));
  EXPECT_THAT(out, HasSubstr("ideal bubble 20.0%"));  // (2-1)/(4+2-1)
  EXPECT_THAT(out, Not(HasSubstr("STAGE")));
}

TEST(ToJson, ProtoFieldNamesAndDefaults) {
  v1::Job job;
  job.set_id("job-1");
  absl::StatusOr<std::string> json = ToJson(job, /*pretty=*/false);
  ASSERT_TRUE(json.ok()) << json.status();
  EXPECT_THAT(*json, HasSubstr("\"id\":\"job-1\""));
  EXPECT_THAT(*json, HasSubstr("\"steps_done\":\"0\""));
  EXPECT_THAT(*json, HasSubstr("\"state\":\"JOB_STATE_UNSPECIFIED\""));
  EXPECT_EQ(json->find('\n'), std::string::npos);
}

v1::JobEvent Snapshot() {
  v1::JobEvent e;
  e.set_kind(v1::JobEvent::SNAPSHOT);
  e.set_job_id("job-7");
  e.set_total_steps(3);
  e.mutable_job()->set_id("job-7");
  e.mutable_job()->set_name("tiny");
  e.mutable_job()->set_state(v1::RUNNING);
  e.mutable_job()->set_total_steps(3);
  return e;
}

v1::JobEvent StepEvent(int step) {
  v1::JobEvent e;
  e.set_kind(v1::JobEvent::STEP);
  e.set_job_id("job-7");
  e.set_state(v1::RUNNING);
  e.set_total_steps(3);
  *e.mutable_step() = Step(step - 1, 2.0, 0.5, 256);  // `step` counts from 1
  return e;
}

v1::JobEvent StateEvent(v1::JobState state, const std::string& reason) {
  v1::JobEvent e;
  e.set_kind(v1::JobEvent::STATE);
  e.set_job_id("job-7");
  e.set_state(state);
  e.set_reason(reason);
  return e;
}

TEST(WatchPrinter, LinePerStepAndState) {
  std::ostringstream out;
  WatchPrinter printer(out, OutputFormat::kTable, /*live=*/false);
  ASSERT_TRUE(printer.OnEvent(Snapshot()).ok());
  EXPECT_EQ(printer.state(), v1::RUNNING);
  ASSERT_TRUE(printer.OnEvent(StepEvent(1)).ok());
  ASSERT_TRUE(printer.OnEvent(StepEvent(2)).ok());
  ASSERT_TRUE(printer.OnEvent(StateEvent(v1::FAILED, "stage 1 on w-2: worker lost")).ok());
  printer.Finish();
  EXPECT_EQ(printer.state(), v1::FAILED);
  EXPECT_EQ(printer.reason(), "stage 1 on w-2: worker lost");
  EXPECT_EQ(out.str(),
            "job job-7 (tiny): RUNNING\n"
            "step 1/3  loss 2.0000  500.0 ms/step  256 tok/s  [######--------------]  33%  "
            "ETA 0:01\n"
            "step 2/3  loss 2.0000  500.0 ms/step  256 tok/s  [#############-------]  66%  "
            "ETA 0:01\n"
            "job job-7 (tiny): FAILED: stage 1 on w-2: worker lost\n");
}

// A warning (a checkpoint the coordinator could not store) is a line of its own; the job's
// state and reason stay as they were.
TEST(WatchPrinter, AWarningIsALineOfItsOwnAndLeavesTheState) {
  std::ostringstream out;
  WatchPrinter printer(out, OutputFormat::kTable, /*live=*/false);
  ASSERT_TRUE(printer.OnEvent(Snapshot()).ok());
  v1::JobEvent warning = StateEvent(v1::RUNNING, "checkpoint after step 2 not stored (disk full)");
  warning.set_kind(v1::JobEvent::WARNING);
  ASSERT_TRUE(printer.OnEvent(warning).ok());
  printer.Finish();
  EXPECT_EQ(printer.state(), v1::RUNNING);
  EXPECT_EQ(printer.reason(), "");
  EXPECT_EQ(out.str(),
            "job job-7 (tiny): RUNNING\n"
            "job job-7 (tiny): warning: checkpoint after step 2 not stored (disk full)\n");
}

TEST(WatchPrinter, LiveRedrawsTheStepLineInPlace) {
  std::ostringstream out;
  WatchPrinter printer(out, OutputFormat::kTable, /*live=*/true);
  ASSERT_TRUE(printer.OnEvent(StepEvent(1)).ok());
  ASSERT_TRUE(printer.OnEvent(StepEvent(2)).ok());
  ASSERT_TRUE(printer.OnEvent(StateEvent(v1::SUCCEEDED, "")).ok());
  printer.Finish();
  const std::string s = out.str();
  EXPECT_THAT(s, HasSubstr("\r\033[Kstep 1/3"));
  EXPECT_THAT(s, HasSubstr("\r\033[Kstep 2/3"));
  EXPECT_THAT(s, HasSubstr("ETA 0:01\njob job-7: SUCCEEDED\n"));
  EXPECT_EQ(std::count(s.begin(), s.end(), '\n'), 2);
}

TEST(WatchPrinter, JsonLinePerEvent) {
  std::ostringstream out;
  WatchPrinter printer(out, OutputFormat::kJson, /*live=*/true);
  ASSERT_TRUE(printer.OnEvent(Snapshot()).ok());
  ASSERT_TRUE(printer.OnEvent(StepEvent(1)).ok());
  ASSERT_TRUE(printer.OnEvent(StateEvent(v1::SUCCEEDED, "")).ok());
  printer.Finish();
  std::istringstream lines(out.str());
  std::string line;
  int n = 0;
  while (std::getline(lines, line)) {
    v1::JobEvent parsed;
    EXPECT_TRUE(google::protobuf::util::JsonStringToMessage(line, &parsed).ok()) << line;
    ++n;
  }
  EXPECT_EQ(n, 3);
  EXPECT_EQ(printer.state(), v1::SUCCEEDED);
}

}  // namespace
}  // namespace tandem::cli
