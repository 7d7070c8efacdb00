// The Prometheus exposition of a synthetic job store and worker registry, parsed line by
// line: every family's name, type, help and labels, and the values they must carry.
#include "coordinator/metrics.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/spec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/exposition_parser.h"

namespace tandem::coordinator {
namespace {

using ::tandem::testing::Exposition;
using ::tandem::testing::ParseExposition;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Optional;

// Some value within 1e-9 relative of `v`.
::testing::Matcher<std::optional<double>> Near(double v) {
  return Optional(::testing::DoubleNear(v, 1e-9 * std::max(1.0, std::abs(v))));
}

v1::StepSummary Step(int64_t step, double seconds, double loss) {
  v1::StepSummary s;
  s.set_step(step);
  s.set_step_seconds(seconds);
  s.set_loss(loss);
  s.set_tokens_per_second(1000.0 / seconds);
  s.set_bubble_measured(0.25 + 0.01 * static_cast<double>(step));
  s.set_bubble_predicted(0.2);
  s.set_grad_norm(1.5);
  s.set_learning_rate(0.01f);
  s.set_peak_activation_bytes(4096);
  s.add_stage_busy_seconds(0.5 * seconds);
  s.add_stage_busy_seconds(0.25 * seconds);
  s.add_stage_seconds(0.001);
  s.add_stage_seconds(0.002);
  s.set_max_worker_exec_seconds(0.9 * seconds);
  s.set_exec_replayed_seconds(0.85 * seconds);
  s.add_stage_peak_bytes(3 << 20);
  s.add_stage_peak_bytes(5 << 20);
  for (int st = 0; st < 2; ++st) {
    v1::StageMemory* m = s.add_stage_memory();
    m->set_stage(st);
    m->set_parameter_bytes((st + 1) << 20);
    m->set_gradient_bytes((st + 1) << 20);
    m->set_optimizer_bytes((st + 1) << 21);
    m->set_workspace_bytes(st << 10);
    m->set_peak_activation_bytes(12345 + st);
    m->set_static_bytes(m->parameter_bytes() + m->gradient_bytes() + m->optimizer_bytes() +
                        m->workspace_bytes());
  }
  return s;
}

// Rank r sent (r + 1) KiB and received 2 KiB in the step.
v1::StepTimings BytesOnly(int64_t step) {
  v1::StepTimings t;
  t.set_step(step);
  for (int r = 0; r < 2; ++r) {
    v1::RankTimings* rank = t.add_ranks();
    rank->set_rank(r);
    rank->set_bytes_sent((r + 1) * 1024);
    rank->set_bytes_received(2048);
  }
  return t;
}

class CoordinatorMetricsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto store = JobStore::Open("", /*checkpoints=*/nullptr);
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = *std::move(store);
    auto spec = LoadJobSpecYaml(
        "name: tiny\nsteps: 30\npipeline:\n  stages: 2\n  micro_batches: 4\n"
        "  micro_batch_size: 8\n");
    ASSERT_TRUE(spec.ok()) << spec.status();
    running_ = *store_->Add(*spec);
    queued_ = *store_->Add(*spec);

    // w-1 is replaced by w-2 at its address (and so LOST); w-2 and w-3 serve the job.
    for (const char* address : {"127.0.0.1:5001", "127.0.0.1:5001", "127.0.0.1:5002"}) {
      v1::RegisterRequest req;
      req.set_address(address);
      req.set_device("cpu");
      req.set_threads(1);
      req.set_hostname("host-a");
      req.set_version("0.1.0");
      ASSERT_TRUE(registry_.Register(req).ok());
    }
    auto gang = registry_.Allocate("cpu", 2, running_);
    ASSERT_TRUE(gang.ok()) << gang.status();
    std::vector<v1::StageAssignment> stages;
    for (int s = 0; s < 2; ++s) {
      v1::StageAssignment& a = stages.emplace_back();
      a.set_stage(s);
      a.set_rank(s);
      a.set_worker_id((*gang)[s].id);
      a.set_address((*gang)[s].address);
      a.set_predicted_seconds(s == 0 ? 0.0011 : 0.0);
    }
    store_->SetStages(running_, stages);
    store_->SetPredictedStep(running_, 2.5, 0.1);
    ASSERT_TRUE(store_->Transition(running_, v1::RUNNING, "").ok());
    RecordSteps({0.02, 0.2, 3.0});
    metrics_ = std::make_unique<CoordinatorMetrics>(store_.get(), &registry_);
  }

  // Records the next steps of the running job with these durations (validation at step 2).
  void RecordSteps(const std::vector<double>& seconds) {
    for (double s : seconds) {
      v1::StepSummary step = Step(next_step_, s, 5.0 - 0.1 * static_cast<double>(next_step_));
      if (next_step_ == 2) {
        step.set_has_val_loss(true);
        step.set_val_loss(4.5);
      }
      store_->RecordStepTimings(running_, BytesOnly(next_step_));
      store_->RecordStep(running_, step);
      ++next_step_;
    }
  }

  Exposition Scrape() {
    text_ = metrics_->Render();
    absl::StatusOr<Exposition> parsed = ParseExposition(text_);
    EXPECT_TRUE(parsed.ok()) << parsed.status() << "\n" << text_;
    return parsed.ok() ? *parsed : Exposition{};
  }

  std::unique_ptr<JobStore> store_;
  WorkerRegistry registry_{std::chrono::seconds(60)};
  std::unique_ptr<CoordinatorMetrics> metrics_;
  std::string running_, queued_;
  int64_t next_step_ = 0;
  std::string text_;  // the latest scrape
};

TEST_F(CoordinatorMetricsTest, EveryFamilyHasItsTypeHelpAndPrometheusName) {
  const Exposition e = Scrape();
  const std::map<std::string, std::string> want = {
      {"tandem_build_info", "gauge"},
      {"tandem_jobs", "gauge"},
      {"tandem_workers", "gauge"},
      {"tandem_worker_up", "gauge"},
      {"tandem_worker_info", "gauge"},
      {"tandem_worker_state", "gauge"},
      {"tandem_worker_heartbeat_age_seconds", "gauge"},
      {"tandem_job_info", "gauge"},
      {"tandem_job_steps_completed_total", "counter"},
      {"tandem_job_steps_planned", "gauge"},
      {"tandem_job_skipped_steps_total", "counter"},
      {"tandem_job_restarts_total", "counter"},
      {"tandem_job_checkpoint_failures_total", "counter"},
      {"tandem_job_resizes_total", "counter"},
      {"tandem_job_peer_recoveries_total", "counter"},
      {"tandem_job_recovery_seconds_total", "counter"},
      {"tandem_job_steps_redone_total", "counter"},
      {"tandem_job_tokens_total", "counter"},
      {"tandem_job_tokens_per_second", "gauge"},
      {"tandem_job_last_step_duration_seconds", "gauge"},
      {"tandem_job_predicted_step_duration_seconds", "gauge"},
      {"tandem_job_last_step_pipeline_seconds", "gauge"},
      {"tandem_job_last_step_replayed_seconds", "gauge"},
      {"tandem_job_step_duration_seconds", "histogram"},
      {"tandem_job_loss", "gauge"},
      {"tandem_job_validation_loss", "gauge"},
      {"tandem_job_grad_norm", "gauge"},
      {"tandem_job_learning_rate", "gauge"},
      {"tandem_job_bubble_measured_ratio", "gauge"},
      {"tandem_job_bubble_predicted_ratio", "gauge"},
      {"tandem_job_bubble_ideal_ratio", "gauge"},
      {"tandem_job_peak_activation_bytes", "gauge"},
      {"tandem_job_stage_busy_seconds_total", "counter"},
      {"tandem_job_stage_last_step_busy_seconds", "gauge"},
      {"tandem_job_stage_microbatch_seconds", "gauge"},
      {"tandem_job_stage_peak_memory_bytes", "gauge"},
      {"tandem_job_stage_memory_bytes", "gauge"},
      {"tandem_job_stage_predicted_microbatch_seconds", "gauge"},
      {"tandem_worker_bytes_sent_total", "counter"},
      {"tandem_worker_bytes_received_total", "counter"},
  };
  std::map<std::string, std::string> got;
  for (const auto& [name, family] : e.families) {
    got[name] = family.type;
    EXPECT_THAT(name, ::testing::StartsWith("tandem_"));
    EXPECT_FALSE(family.help.empty()) << name;
    EXPECT_FALSE(family.samples.empty()) << name;
    for (const auto& sample : family.samples) {
      for (const auto& [label, _] : sample.labels) {
        EXPECT_TRUE(label == "job" || label == "stage" || label == "worker" || label == "state" ||
                    label == "le" || label == "name" || label == "schedule" || label == "address" ||
                    label == "device" || label == "hostname" || label == "version" ||
                    label == "protocol" || label == "part")
            << name << " has label " << label;
      }
    }
  }
  EXPECT_EQ(got, want);
  EXPECT_EQ(text_.back(), '\n');
}

// A fault after the checkpoint of step 2 (index 1) redoes step 3; an elastic resize counts.
TEST_F(CoordinatorMetricsTest, RestartsResizesAndRedoneStepsAreCounted) {
  store_->SetCheckpoint(running_, 1);
  store_->RecordRestart(running_, "worker lost", absl::InfinitePast());
  v1::ResizeEvent resize;
  resize.set_cause("worker lost");
  store_->RecordResize(running_, store_->Get(running_)->spec().pipeline(), resize);
  const Exposition e = Scrape();
  const std::map<std::string, std::string> job = {{"job", running_}};
  EXPECT_THAT(e.Value("tandem_job_restarts_total", job), Near(1.0));
  EXPECT_THAT(e.Value("tandem_job_resizes_total", job), Near(1.0));
  EXPECT_THAT(e.Value("tandem_job_steps_redone_total", job), Near(1.0));
  EXPECT_EQ(store_->Get(running_)->resizes(0).steps_redone(), 1);
  EXPECT_EQ(store_->Get(running_)->resizes(0).checkpoint_step(), 1);
  EXPECT_EQ(store_->Get(running_)->resizes(0).state_source(), "checkpoint after step 2");
  EXPECT_THAT(e.Value("tandem_job_peer_recoveries_total", job), Near(0.0));
  EXPECT_THAT(e.Value("tandem_job_checkpoint_failures_total", job), Near(0.0));
  store_->RecordCheckpointFailure(running_, "checkpoint after step 3 not stored (disk full)");
  EXPECT_THAT(Scrape().Value("tandem_job_checkpoint_failures_total", job), Near(1.0));

  // A fault a replica covered: the survivors' state after step 2 (index 1, the last the
  // resumed run completed), nothing redone.
  v1::PeerState peers;
  peers.set_step(1);
  peers.add_holders()->set_address("127.0.0.1:1");
  EXPECT_EQ(store_->RecordRestart(running_, "worker lost", absl::InfinitePast(), 1, &peers), 1);
  EXPECT_EQ(store_->Get(running_)->last_steps_redone(), 0);
  store_->RecordResize(running_, store_->Get(running_)->spec().pipeline(), resize);
  EXPECT_EQ(store_->Get(running_)->resizes(1).state_source(), "kept state after step 2");
  store_->RecordPeerRecovery(running_);
  const Exposition after = Scrape();
  EXPECT_THAT(after.Value("tandem_job_peer_recoveries_total", job), Near(1.0));
  EXPECT_THAT(after.Value("tandem_job_steps_redone_total", job), Near(1.0));
  EXPECT_FALSE(store_->Get(running_)->has_peer_state()) << "consumed by the run that restored";

  // The recovery time: from the restart to the first step completed after it.
  EXPECT_FALSE(after.Value("tandem_job_last_recovery_seconds", job).has_value())
      << "still recovering";
  v1::StepSummary next;
  next.set_step(2);
  next.set_loss(4.0);
  store_->RecordStep(running_, next);
  const Exposition recovered = Scrape();
  const std::optional<double> last = recovered.Value("tandem_job_last_recovery_seconds", job);
  ASSERT_TRUE(last.has_value());
  EXPECT_GE(*last, 0.0);
  EXPECT_LT(*last, 60.0);
  EXPECT_GE(recovered.Value("tandem_job_recovery_seconds_total", job).value_or(-1), *last);
  EXPECT_EQ(store_->Get(running_)->recovering_since_unix_ms(), 0);
}

// The coordinator's check of the prediction over the steady steps (Job.prediction_check):
// the median over the predicted step, and whose miss it is, once two steady steps exist.
TEST_F(CoordinatorMetricsTest, TheStepOverItsPredictionIsTheCheckOfTheSteadySteps) {
  const std::map<std::string, std::string> job = {{"job", running_}};
  // Steps 0-2: step 0 warms up and step 2 had a validation pass, one steady step: no check.
  Exposition e = Scrape();
  EXPECT_TRUE(e.Find("tandem_job_step_over_prediction_ratio", job).empty());
  EXPECT_TRUE(e.Find("tandem_job_prediction_miss", job).empty());
  RecordSteps({3.0, 2.6});
  // Steady steps 1, 3, 4 (0.2, 3.0, 2.6 s): median 2.6 s over 2.5 predicted. Their pipeline
  // (0.9x each step) against its replay (0.85x): x1.059, the schedule's miss.
  e = Scrape();
  EXPECT_THAT(e.Value("tandem_job_step_over_prediction_ratio", job), Near(2.6 / 2.5));
  EXPECT_THAT(e.Value("tandem_job_prediction_miss", {{"job", running_}, {"miss", "schedule"}}),
              Near(1.0));
  EXPECT_TRUE(e.Find("tandem_job_step_over_prediction_ratio", {{"job", queued_}}).empty());
}

TEST_F(CoordinatorMetricsTest, JobCountersAndGaugesComeFromTheStore) {
  const Exposition e = Scrape();
  const std::map<std::string, std::string> job = {{"job", running_}};
  EXPECT_THAT(e.Value("tandem_job_steps_completed_total", job), Near(3.0));
  EXPECT_THAT(e.Value("tandem_job_steps_planned", job), Near(30.0));
  const double tokens_per_step = static_cast<double>(store_->Get(running_)->tokens_per_step());
  EXPECT_GT(tokens_per_step, 0);
  EXPECT_THAT(e.Value("tandem_job_tokens_total", job), Near(3 * tokens_per_step));
  EXPECT_THAT(e.Value("tandem_job_loss", job), Near(4.8));
  EXPECT_THAT(e.Value("tandem_job_validation_loss", job), Near(4.5));
  EXPECT_THAT(e.Value("tandem_job_last_step_duration_seconds", job), Near(3.0));
  // Against its prediction: 3.0 s for 2.5 predicted; the pipeline 2.7 s, its replay 2.55 s.
  EXPECT_THAT(e.Value("tandem_job_predicted_step_duration_seconds", job), Near(2.5));
  EXPECT_THAT(e.Value("tandem_job_last_step_pipeline_seconds", job), Near(2.7));
  EXPECT_THAT(e.Value("tandem_job_last_step_replayed_seconds", job), Near(2.55));
  EXPECT_THAT(e.Value("tandem_job_tokens_per_second", job), Near(1000.0 / 3.0));
  EXPECT_THAT(e.Value("tandem_job_bubble_measured_ratio", job), Near(0.27));
  EXPECT_THAT(e.Value("tandem_job_bubble_predicted_ratio", job), Near(0.2));
  EXPECT_THAT(e.Value("tandem_job_bubble_ideal_ratio", job), Near(0.2));  // 1 / (4 + 1)
  EXPECT_THAT(e.Value("tandem_job_skipped_steps_total", job), Near(0.0));
  EXPECT_THAT(e.Value("tandem_job_restarts_total", job), Near(0.0));
  EXPECT_THAT(e.Value("tandem_job_resizes_total", job), Near(0.0));
  EXPECT_THAT(e.Value("tandem_job_steps_redone_total", job), Near(0.0));
  EXPECT_THAT(e.Value("tandem_job_info", {{"job", running_}, {"state", "running"}}), Near(1.0));
  EXPECT_THAT(e.Value("tandem_job_info", {{"job", queued_}, {"state", "queued"}, {"name", "tiny"}}),
              Near(1.0));

  // The queued job has no steps: counters at 0, and no loss or step figures at all.
  const std::map<std::string, std::string> queued = {{"job", queued_}};
  EXPECT_THAT(e.Value("tandem_job_steps_completed_total", queued), Near(0.0));
  EXPECT_TRUE(e.Find("tandem_job_loss", queued).empty());
  EXPECT_TRUE(e.Find("tandem_job_validation_loss", queued).empty());
  EXPECT_TRUE(e.Find("tandem_job_step_duration_seconds_count", queued).empty());
  EXPECT_TRUE(e.Find("tandem_job_predicted_step_duration_seconds", queued).empty());
  EXPECT_TRUE(e.Find("tandem_job_last_step_pipeline_seconds", queued).empty());

  EXPECT_THAT(e.Value("tandem_jobs", {{"state", "running"}}), Near(1.0));
  EXPECT_THAT(e.Value("tandem_jobs", {{"state", "queued"}}), Near(1.0));
  EXPECT_THAT(e.Value("tandem_jobs", {{"state", "succeeded"}}), Near(0.0));
  EXPECT_THAT(e.Value("tandem_jobs", {{"state", "failed"}}), Near(0.0));
  EXPECT_THAT(e.Value("tandem_jobs", {{"state", "cancelled"}}), Near(0.0));
}

TEST_F(CoordinatorMetricsTest, StepDurationHistogramHasCumulativeBuckets) {
  const Exposition e = Scrape();
  auto bucket = [&](const std::string& le) {
    return e.Value("tandem_job_step_duration_seconds_bucket", {{"job", running_}, {"le", le}});
  };
  EXPECT_THAT(bucket("0.01"), Near(0.0));
  EXPECT_THAT(bucket("0.025"), Near(1.0));
  EXPECT_THAT(bucket("0.25"), Near(2.0));
  EXPECT_THAT(bucket("2.5"), Near(2.0));
  EXPECT_THAT(bucket("5"), Near(3.0));
  EXPECT_THAT(bucket("+Inf"), Near(3.0));
  EXPECT_EQ(e.Find("tandem_job_step_duration_seconds_bucket", {{"job", running_}}).size(),
            kNumStepSecondsBuckets + 1);
  EXPECT_THAT(e.Value("tandem_job_step_duration_seconds_count", {{"job", running_}}), Near(3.0));
  const auto sum = e.Value("tandem_job_step_duration_seconds_sum", {{"job", running_}});
  ASSERT_TRUE(sum.has_value());
  EXPECT_NEAR(*sum, 3.22, 1e-12);
}

TEST_F(CoordinatorMetricsTest, PerStageAndPerWorkerFiguresNameTheirWorker) {
  const Exposition e = Scrape();
  const std::string w0 = store_->Get(running_)->stages(0).worker_id();
  const std::string w1 = store_->Get(running_)->stages(1).worker_id();
  EXPECT_EQ(w0, "w-2");
  EXPECT_EQ(w1, "w-3");
  const auto busy0 = e.Value("tandem_job_stage_busy_seconds_total",
                             {{"job", running_}, {"stage", "0"}, {"worker", w0}});
  ASSERT_TRUE(busy0.has_value());
  EXPECT_NEAR(*busy0, 0.5 * 3.22, 1e-12);
  const auto busy1 = e.Value("tandem_job_stage_busy_seconds_total",
                             {{"job", running_}, {"stage", "1"}, {"worker", w1}});
  ASSERT_TRUE(busy1.has_value());
  EXPECT_NEAR(*busy1, 0.25 * 3.22, 1e-12);
  EXPECT_THAT(
      e.Value("tandem_job_stage_last_step_busy_seconds", {{"job", running_}, {"stage", "0"}}),
      Near(1.5));
  EXPECT_THAT(e.Value("tandem_job_stage_microbatch_seconds", {{"job", running_}, {"stage", "1"}}),
              Near(0.002));
  EXPECT_THAT(e.Value("tandem_job_stage_peak_memory_bytes", {{"job", running_}, {"stage", "1"}}),
              Near(5 << 20));
  const std::pair<const char*, double> parts[] = {{"parameters", 2 << 20},
                                                  {"gradients", 2 << 20},
                                                  {"optimizer", 2 << 21},
                                                  {"workspace", 1 << 10},
                                                  {"activations", 12346}};
  for (const auto& [part, bytes] : parts) {
    EXPECT_THAT(e.Value("tandem_job_stage_memory_bytes",
                        {{"job", running_}, {"stage", "1"}, {"part", part}}),
                Near(bytes))
        << part;
  }
  EXPECT_THAT(
      e.Value("tandem_job_stage_predicted_microbatch_seconds", {{"job", running_}, {"stage", "0"}}),
      Near(0.0011));

  EXPECT_THAT(e.Value("tandem_worker_bytes_sent_total", {{"job", running_}, {"worker", w0}}),
              Near(3.0 * 1024));
  EXPECT_THAT(e.Value("tandem_worker_bytes_sent_total", {{"job", running_}, {"worker", w1}}),
              Near(3.0 * 2048));
  EXPECT_THAT(e.Value("tandem_worker_bytes_received_total", {{"job", running_}, {"worker", w1}}),
              Near(3.0 * 2048));
}

TEST_F(CoordinatorMetricsTest, WorkersUpAndDownFromTheRegistry) {
  const Exposition e = Scrape();
  EXPECT_THAT(e.Value("tandem_worker_up", {{"worker", "w-1"}}), Near(0.0));
  EXPECT_THAT(e.Value("tandem_worker_up", {{"worker", "w-2"}}), Near(1.0));
  EXPECT_THAT(e.Value("tandem_worker_up", {{"worker", "w-3"}}), Near(1.0));
  EXPECT_THAT(e.Value("tandem_worker_state", {{"worker", "w-1"}, {"state", "lost"}}), Near(1.0));
  EXPECT_THAT(e.Value("tandem_worker_state", {{"worker", "w-2"}, {"state", "busy"}}), Near(1.0));
  EXPECT_THAT(e.Value("tandem_worker_state", {{"worker", "w-2"}, {"state", "idle"}}), Near(0.0));
  EXPECT_THAT(e.Value("tandem_workers", {{"state", "busy"}}), Near(2.0));
  EXPECT_THAT(e.Value("tandem_workers", {{"state", "lost"}}), Near(1.0));
  EXPECT_THAT(e.Value("tandem_workers", {{"state", "idle"}}), Near(0.0));
  EXPECT_THAT(e.Value("tandem_worker_info", {{"worker", "w-3"},
                                             {"address", "127.0.0.1:5002"},
                                             {"device", "cpu"},
                                             {"hostname", "host-a"},
                                             {"version", "0.1.0"}}),
              Near(1.0));
  const auto age = e.Value("tandem_worker_heartbeat_age_seconds", {{"worker", "w-2"}});
  ASSERT_TRUE(age.has_value());
  EXPECT_GE(*age, 0.0);
  EXPECT_LT(*age, 60.0);
}

// The store keeps the last JobStore::kMaxHistory summaries; the histogram and the busy time
// keep counting every step scraped.
TEST_F(CoordinatorMetricsTest, TotalsKeepCountingPastTheStoresHistory) {
  Scrape();
  RecordSteps(std::vector<double>(JobStore::kMaxHistory, 0.001));
  Scrape();
  RecordSteps(std::vector<double>(5, 0.001));
  const Exposition e = Scrape();
  const double steps = 3.0 + static_cast<double>(JobStore::kMaxHistory) + 5.0;
  EXPECT_EQ(store_->Get(running_)->history_size(), static_cast<int>(JobStore::kMaxHistory));
  EXPECT_THAT(e.Value("tandem_job_steps_completed_total", {{"job", running_}}), Near(steps));
  EXPECT_THAT(e.Value("tandem_job_step_duration_seconds_count", {{"job", running_}}), Near(steps));
  EXPECT_THAT(
      e.Value("tandem_job_step_duration_seconds_bucket", {{"job", running_}, {"le", "0.005"}}),
      Near(steps - 3.0));
  EXPECT_THAT(e.Value("tandem_worker_bytes_sent_total", {{"job", running_}, {"worker", "w-2"}}),
              Near(steps * 1024));
}

TEST(ExpositionWriterTest, EscapesLabelValuesAndHelpAndPrintsValuesExactly) {
  ExpositionWriter w;
  w.Family("tandem_x", ExpositionWriter::Type::kGauge, "a \\ help\nline");
  w.Sample({{"job", "a\"b\\c\nd"}}, 0.1);
  w.Sample({{"job", "inf"}}, INFINITY);
  w.Sample({{"job", "nan"}}, NAN);
  w.Sample({}, 1e21);
  EXPECT_EQ(w.text(),
            "# HELP tandem_x a \\\\ help\\nline\n"
            "# TYPE tandem_x gauge\n"
            "tandem_x{job=\"a\\\"b\\\\c\\nd\"} 0.1\n"
            "tandem_x{job=\"inf\"} +Inf\n"
            "tandem_x{job=\"nan\"} NaN\n"
            "tandem_x 1e+21\n");
  absl::StatusOr<Exposition> e = ParseExposition(w.text());
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_THAT(e->Value("tandem_x", {{"job", "a\"b\\c\nd"}}), Near(0.1));
  EXPECT_EQ(FormatMetricValue(3), "3");
  EXPECT_EQ(FormatMetricValue(-INFINITY), "-Inf");
  EXPECT_EQ(FormatMetricValue(1.0 / 3.0), "0.3333333333333333");
}

TEST(ExpositionWriterTest, TheTestParserRejectsWhatPrometheusWould) {
  EXPECT_FALSE(ParseExposition("x 1\n").ok());                                   // no TYPE
  EXPECT_FALSE(ParseExposition("# HELP x h\n# TYPE x counter\nx 1\n").ok());     // no _total
  EXPECT_FALSE(ParseExposition("# HELP x h\n# TYPE x gauge\nx 1\nx 2\n").ok());  // twice
  EXPECT_FALSE(ParseExposition("# HELP x h\n# TYPE x gauge\nx{a=\"\\t\"} 1\n").ok());
  EXPECT_FALSE(ParseExposition("# HELP x h\n# TYPE x gauge\nx 1").ok());  // no newline
  EXPECT_FALSE(ParseExposition("# HELP x h\n# TYPE x gauge\nx 1\n# HELP y h\n# TYPE y gauge\n"
                               "y 1\nx{a=\"1\"} 1\n")
                   .ok());  // x split
  EXPECT_FALSE(ParseExposition("# HELP h h\n# TYPE h histogram\nh_bucket{le=\"1\"} 2\n"
                               "h_bucket{le=\"+Inf\"} 1\nh_sum 1\nh_count 1\n")
                   .ok());  // not cumulative
}

TEST(JobStepTotalsTest, AddsEachStepOnce) {
  JobStepTotals t;
  t.AddStep(Step(0, 0.3, 1));
  t.AddStep(Step(0, 0.3, 1));
  t.AddStep(Step(1, 0.03, 1));
  EXPECT_EQ(t.steps, 2);
  EXPECT_EQ(t.last_step, 1);
  EXPECT_NEAR(t.seconds_sum, 0.33, 1e-12);
  EXPECT_THAT(t.stage_busy_seconds, ElementsAre(::testing::DoubleNear(0.165, 1e-12),
                                                ::testing::DoubleNear(0.0825, 1e-12)));
  ASSERT_EQ(t.bucket_counts.size(), kNumStepSecondsBuckets + 1);
  EXPECT_EQ(t.bucket_counts[3], 1);  // (0.025, 0.05]
  EXPECT_EQ(t.bucket_counts[6], 1);  // (0.25, 0.5]
}

}  // namespace
}  // namespace tandem::coordinator
