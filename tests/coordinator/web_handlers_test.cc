// The coordinator's HTTP routes, called without a socket: the JSON the dashboard polls, the
// timeline SVG, the page and its assets, and what a bad path or method gets.
#include "coordinator/web_handlers.h"

#include "absl/strings/str_cat.h"
#include "common/schedule.h"
#include "common/spec.h"
#include "coordinator/step_timings.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/exposition_parser.h"

namespace tandem::coordinator {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

// Every action of every rank of a lowered 1F1B step, back to back, 10 us each.
std::vector<v1::StepReport> Reports(const Schedule& lowered, int64_t step) {
  std::vector<v1::StepReport> out;
  for (int r = 0; r < lowered.placement.num_ranks; ++r) {
    v1::StepReport& rep = out.emplace_back();
    rep.set_step(step);
    rep.set_rank(r);
    rep.set_bytes_sent(100);
    int64_t t = 1000 * step;
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

class WebHandlersTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto store = JobStore::Open("", /*checkpoints=*/nullptr);
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = *std::move(store);
    auto spec =
        LoadJobSpecYaml("name: web\nsteps: 10\npipeline:\n  stages: 2\n  micro_batches: 4\n");
    ASSERT_TRUE(spec.ok()) << spec.status();
    job_ = *store_->Add(*spec);
    idle_ = *store_->Add(*spec);
    std::vector<v1::StageAssignment> stages;
    for (int s = 0; s < 2; ++s) {
      v1::StageAssignment& a = stages.emplace_back();
      a.set_stage(s);
      a.set_rank(s);
      a.set_worker_id(absl::StrCat("w-", s + 1));
      a.set_address(absl::StrCat("127.0.0.1:500", s));
      a.set_layer_begin(s * 2);
      a.set_layer_end(s * 2 + 2);
      if (s == 0) {  // stage 0 lists its two replicas' workers (the grid's row)
        for (int r = 0; r < 2; ++r) {
          v1::ReplicaWorker* w = a.add_replicas();
          w->set_replica(r);
          w->set_worker_id(absl::StrCat("w-", 1 + 2 * r));
          w->set_address(absl::StrCat("127.0.0.1:600", r));
        }
      }
    }
    store_->SetStages(job_, stages);
    ASSERT_TRUE(store_->Transition(job_, v1::RUNNING, "").ok());
    auto generated = Generate1F1B(2, 4);
    ASSERT_TRUE(generated.ok()) << generated.status();
    const Schedule lowered = LowerWithTransfers(*generated);
    store_->SetTraceProgram(job_, TraceProgramOf(lowered));
    for (int64_t step = 0; step < 3; ++step) {
      store_->RecordStepTimings(job_, StepTimingsOf(step, Reports(lowered, step), {0, 0}));
      v1::StepSummary s;
      s.set_step(step);
      s.set_loss(5.0 - static_cast<double>(step));
      s.set_step_seconds(0.5);
      s.set_tokens_per_second(2000);
      s.add_stage_busy_seconds(0.25);
      s.add_stage_busy_seconds(0.1);
      s.add_stage_seconds(0.01);
      s.add_stage_seconds(0.02);
      for (int st = 0; st < 2; ++st) {
        v1::StageMemory* m = s.add_stage_memory();
        m->set_stage(st);
        m->set_parameter_bytes(1000 * (st + 1));
        m->set_workspace_bytes(7);
        m->set_peak_activation_bytes(500);
      }
      if (step == 1) {
        s.set_has_val_loss(true);
        s.set_val_loss(4.5);
      }
      store_->RecordStep(job_, s);
    }
    v1::RegisterRequest req;
    req.set_address("127.0.0.1:5000");
    req.set_device("cpu");
    req.set_threads(2);
    ASSERT_TRUE(registry_.Register(req).ok());
    metrics_ = std::make_unique<CoordinatorMetrics>(store_.get(), &registry_);
    web_ = std::make_unique<WebHandlers>(WebEnv{store_.get(), &registry_, metrics_.get()});
  }

  HttpResponse Get(const std::string& path, std::map<std::string, std::string> query = {}) {
    HttpRequest r;
    r.path = path;
    r.query = std::move(query);
    return web_->Handle(r);
  }
  json GetJson(const std::string& path, std::map<std::string, std::string> query = {}) {
    HttpResponse r = Get(path, std::move(query));
    EXPECT_EQ(r.status, 200) << path << ": " << r.body;
    EXPECT_EQ(r.content_type, "application/json");
    return json::parse(r.body, nullptr, /*allow_exceptions=*/false);
  }

  std::unique_ptr<JobStore> store_;
  WorkerRegistry registry_{std::chrono::seconds(60)};
  std::unique_ptr<CoordinatorMetrics> metrics_;
  std::unique_ptr<WebHandlers> web_;
  std::string job_, idle_;
};

TEST_F(WebHandlersTest, JobsListsEveryJobWithItsState) {
  const json j = GetJson("/api/jobs");
  ASSERT_EQ(j["jobs"].size(), 2u);
  EXPECT_EQ(j["jobs"][0]["id"], job_);
  EXPECT_EQ(j["jobs"][0]["name"], "web");
  EXPECT_EQ(j["jobs"][0]["state"], "RUNNING");
  EXPECT_EQ(j["jobs"][0]["steps_done"], 3);
  EXPECT_EQ(j["jobs"][0]["total_steps"], 10);
  EXPECT_EQ(j["jobs"][0]["last_loss"], 3.0);
  EXPECT_EQ(j["jobs"][0]["has_loss"], true);
  EXPECT_EQ(j["jobs"][0]["last_val_loss"], 4.5);
  EXPECT_EQ(j["jobs"][0]["stages"], 2);
  EXPECT_EQ(j["jobs"][0]["restarts"], 0);
  EXPECT_EQ(j["jobs"][0]["resizes"], 0);
  EXPECT_EQ(j["jobs"][0]["steps_redone"], 0);
  EXPECT_EQ(j["jobs"][0]["peer_recoveries"], 0);
  EXPECT_EQ(j["jobs"][1]["state"], "QUEUED");
  EXPECT_EQ(j["jobs"][1]["has_loss"], false);
}

// A restart that resumed from the state its survivors kept after step 3 (index 2): shown with
// nothing redone.
TEST_F(WebHandlersTest, AJobShowsItsRestartsAndPeerRecoveries) {
  v1::PeerState peers;
  peers.set_step(2);
  peers.add_holders()->set_address("127.0.0.1:1");
  store_->RecordRestart(job_, "worker lost", absl::InfinitePast(), 1, &peers);
  store_->RecordPeerRecovery(job_);
  const json j = GetJson("/api/jobs/" + job_);
  EXPECT_EQ(j["job"]["restarts"], 1);
  EXPECT_EQ(j["job"]["steps_redone"], 0);
  EXPECT_EQ(j["job"]["peer_recoveries"], 1);
  EXPECT_EQ(j["job"]["steps_done"], 3);
  EXPECT_EQ(j["job"]["checkpoint_failures"], 0);
}

TEST_F(WebHandlersTest, AJobShowsItsCheckpointsNotStored) {
  store_->RecordCheckpointFailure(job_, "checkpoint after step 2 not stored (disk full)");
  const json j = GetJson("/api/jobs/" + job_);
  EXPECT_EQ(j["job"]["checkpoint_failures"], 1);
  EXPECT_EQ(j["job"]["last_checkpoint_failure"], "checkpoint after step 2 not stored (disk full)");
}

TEST_F(WebHandlersTest, AJobHasItsSeriesStagesAndLatestStep) {
  const json j = GetJson("/api/jobs/" + job_);
  EXPECT_EQ(j["job"]["id"], job_);
  EXPECT_EQ(j["job"]["state"], "RUNNING");
  // Step numbers, from 1 (the store's indices 0, 1, 2).
  EXPECT_EQ(j["series"]["step"], json::array({1, 2, 3}));
  EXPECT_EQ(j["series"]["loss"], json::array({5.0, 4.0, 3.0}));
  EXPECT_EQ(j["series"]["tokens_per_second"], json::array({2000.0, 2000.0, 2000.0}));
  EXPECT_EQ(j["validation"]["step"], json::array({2}));
  EXPECT_EQ(j["validation"]["loss"], json::array({4.5}));
  EXPECT_EQ(j["last_step"]["step"], 3);
  ASSERT_EQ(j["stages"].size(), 2u);
  EXPECT_EQ(j["stages"][0]["worker_id"], "w-1");
  EXPECT_EQ(j["stages"][1]["layer_begin"], 2);
  EXPECT_DOUBLE_EQ(j["stages"][0]["busy_seconds"].get<double>(), 0.25);
  EXPECT_DOUBLE_EQ(j["stages"][0]["utilisation"].get<double>(), 0.5);
  EXPECT_DOUBLE_EQ(j["stages"][1]["utilisation"].get<double>(), 0.2);
  EXPECT_DOUBLE_EQ(j["stages"][1]["microbatch_seconds"].get<double>(), 0.02);
  EXPECT_EQ(j["stages"][1]["memory"]["parameters"], 2000);
  EXPECT_EQ(j["stages"][1]["memory"]["workspace"], 7);
  EXPECT_EQ(j["stages"][1]["memory"]["activations_peak"], 500);
  ASSERT_EQ(j["stages"][0]["replicas"].size(), 2u);
  EXPECT_EQ(j["stages"][0]["replicas"][1]["replica"], 1);
  EXPECT_EQ(j["stages"][0]["replicas"][1]["worker_id"], "w-3");
  EXPECT_EQ(j["stages"][1]["replicas"].size(), 0u);
  EXPECT_EQ(j["job"]["replicas"], 1);
}

// A predicted job carries the coordinator's check of its prediction, as `tandem status` says it:
// of the fixture's steps 0-2, step 0 warms up and step 1 had a validation pass, so one more
// step makes the two steady steps a check needs.
TEST_F(WebHandlersTest, APredictedJobCarriesTheCheckOfItsPrediction) {
  EXPECT_FALSE(GetJson("/api/jobs/" + job_)["job"].contains("prediction_check"));
  store_->SetPredictedStep(job_, 0.4, 0.01);
  v1::StepSummary s;
  s.set_step(3);
  s.set_loss(2.0);
  s.set_step_seconds(0.5);
  store_->RecordStep(job_, s);
  const json j = GetJson("/api/jobs/" + job_);
  ASSERT_TRUE(j["job"].contains("prediction_check")) << j.dump();
  const json& c = j["job"]["prediction_check"];
  EXPECT_EQ(c["steps"], 2);
  EXPECT_DOUBLE_EQ(c["ratio"].get<double>(), 1.25);
  EXPECT_EQ(c["miss"], "unknown");  // neither a replay nor per-stage predictions to tell
  EXPECT_EQ(c["summary"], "0.500 s per step, median of steps 3-4: x1.250 the prediction");
}

TEST_F(WebHandlersTest, AfterGivesOnlyNewerStepsButStillTheLatestStep) {
  json j = GetJson("/api/jobs/" + job_, {{"after", "2"}});
  EXPECT_EQ(j["series"]["step"], json::array({3}));
  EXPECT_EQ(j["validation"]["step"], json::array());
  j = GetJson("/api/jobs/" + job_, {{"after", "3"}});
  EXPECT_EQ(j["series"]["step"], json::array());
  EXPECT_EQ(j["last_step"]["step"], 3);
  EXPECT_DOUBLE_EQ(j["stages"][0]["utilisation"].get<double>(), 0.5);

  EXPECT_EQ(Get("/api/jobs/" + job_, {{"after", "two"}}).status, 400);
  EXPECT_EQ(Get("/api/jobs/" + job_, {{"after", "1x"}}).status, 400);
  // A job without steps has empty series and no latest step.
  j = GetJson("/api/jobs/" + idle_);
  EXPECT_EQ(j["series"]["step"], json::array());
  EXPECT_TRUE(j["last_step"].is_null());
}

TEST_F(WebHandlersTest, LongHistoriesAreThinnedKeepingTheLatestStep) {
  for (int64_t step = 3; step < 5000; ++step) {
    v1::StepSummary s;
    s.set_step(step);
    s.set_loss(1.0);
    store_->RecordStep(job_, s);
  }
  const json j = GetJson("/api/jobs/" + job_);
  EXPECT_LE(j["series"]["step"].size(), kMaxSeriesPoints + 1);
  EXPECT_GE(j["series"]["step"].size(), kMaxSeriesPoints / 2);
  EXPECT_EQ(j["series"]["step"].back(), 5000);
  EXPECT_EQ(j["series"]["step"].size(), j["series"]["loss"].size());
  EXPECT_EQ(j["validation"]["step"], json::array({2}));
}

TEST_F(WebHandlersTest, TraceIsTheLatestStepsSvgWithARowPerStage) {
  HttpResponse r = Get("/api/jobs/" + job_ + "/trace.svg");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.content_type, "image/svg+xml");
  EXPECT_THAT(r.body, StartsWith("<?xml"));
  EXPECT_THAT(r.body, HasSubstr("step 3:"));
  size_t rows = 0;
  for (size_t pos = 0; (pos = r.body.find("<g class=\"row\"", pos)) != std::string::npos; ++pos) {
    ++rows;
  }
  EXPECT_EQ(rows, 2u);
  EXPECT_THAT(r.headers,
              ::testing::Contains(std::pair<std::string, std::string>("X-Tandem-Step", "3")));
  EXPECT_THAT(Get("/api/jobs/" + job_ + "/trace.svg", {{"step", "2"}}).body, HasSubstr("step 2:"));
  // Not kept, not a number, no timings at all.
  EXPECT_EQ(Get("/api/jobs/" + job_ + "/trace.svg", {{"step", "7"}}).status, 404);
  EXPECT_EQ(Get("/api/jobs/" + job_ + "/trace.svg", {{"step", "-"}}).status, 400);
  EXPECT_EQ(Get("/api/jobs/" + idle_ + "/trace.svg").status, 404);
}

TEST_F(WebHandlersTest, WorkersListsTheRegistry) {
  const json j = GetJson("/api/workers");
  ASSERT_EQ(j["workers"].size(), 1u);
  EXPECT_EQ(j["workers"][0]["id"], "w-1");
  EXPECT_EQ(j["workers"][0]["state"], "IDLE");
  EXPECT_EQ(j["workers"][0]["threads"], 2);
}

TEST_F(WebHandlersTest, MetricsAreTheExposition) {
  HttpResponse r = Get("/metrics");
  ASSERT_EQ(r.status, 200);
  EXPECT_EQ(r.content_type, "text/plain; version=0.0.4; charset=utf-8");
  auto e = testing::ParseExposition(r.body);
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->Value("tandem_job_steps_completed_total", {{"job", job_}}), 3.0);
  EXPECT_EQ(e->Value("tandem_worker_bytes_sent_total", {{"job", job_}, {"worker", "w-2"}}), 300.0);
}

TEST_F(WebHandlersTest, ThePageAndItsAssetsAreBuiltIn) {
  for (const std::string& path : std::vector<std::string>{"/", "/jobs/" + job_, "/jobs/job-999"}) {
    HttpResponse r = Get(path);
    EXPECT_EQ(r.status, 200) << path;
    EXPECT_EQ(r.content_type, "text/html; charset=utf-8") << path;
    EXPECT_THAT(r.body, HasSubstr("<title>Tandem</title>"));
    EXPECT_THAT(r.headers, ::testing::Contains(::testing::Pair("Content-Security-Policy",
                                                               HasSubstr("script-src 'self'"))));
  }
  HttpResponse js = Get("/static/app.js");
  EXPECT_EQ(js.status, 200);
  EXPECT_EQ(js.content_type, "text/javascript; charset=utf-8");
  EXPECT_THAT(js.body, HasSubstr("/api/jobs"));
  HttpResponse css = Get("/static/style.css");
  EXPECT_EQ(css.status, 200);
  EXPECT_EQ(css.content_type, "text/css; charset=utf-8");
  // Nothing is fetched from elsewhere at run time (the SVG namespace is a name, not a fetch).
  for (const HttpResponse& r : {Get("/"), js, css}) {
    std::string body = r.body;
    for (size_t at; (at = body.find("http://www.w3.org/2000/svg")) != std::string::npos;) {
      body.erase(at, 26);
    }
    EXPECT_THAT(body, Not(HasSubstr("http://"))) << r.content_type;
    EXPECT_THAT(body, Not(HasSubstr("https://"))) << r.content_type;
    EXPECT_THAT(body, Not(HasSubstr("src=\"//"))) << r.content_type;
    EXPECT_THAT(body, Not(HasSubstr("@import"))) << r.content_type;
  }
}

TEST_F(WebHandlersTest, BadPathsAre404WithAMessageAndNeverEchoed) {
  for (const std::string path :
       {"/nope", "/api", "/api/jobs/", "/api/jobs/job-", "/api/jobs/job-1x", "/api/jobs/../etc",
        "/api/jobs/<script>", "/api/jobs/job-1/trace.json", "/api/jobs/job-1/trace.svg/x",
        "/static/", "/static/../../etc/passwd", "/static/index.htm", "/jobs/", "/jobs/x",
        "/jobs/job-1/x", "/metrics/", "//", "/etc/passwd"}) {
    HttpResponse r = Get(path);
    EXPECT_EQ(r.status, 404) << path;
    EXPECT_FALSE(r.body.empty()) << path;
    EXPECT_EQ(r.content_type, "text/plain; charset=utf-8") << path;
    EXPECT_THAT(r.body, Not(HasSubstr("<script>"))) << path;
  }
  EXPECT_THAT(Get("/api/jobs/job-77").body, HasSubstr("no job 'job-77'"));
}

TEST_F(WebHandlersTest, OnlyGetAndHead) {
  for (const char* method : {"POST", "PUT", "DELETE", "PATCH", "OPTIONS"}) {
    HttpRequest r;
    r.method = method;
    r.path = "/metrics";
    HttpResponse resp = web_->Handle(r);
    EXPECT_EQ(resp.status, 405) << method;
    EXPECT_THAT(resp.headers,
                ::testing::Contains(std::pair<std::string, std::string>("Allow", "GET, HEAD")));
  }
  HttpRequest head;
  head.method = "HEAD";
  head.path = "/api/jobs";
  EXPECT_EQ(web_->Handle(head).status, 200);
}

}  // namespace
}  // namespace tandem::coordinator
