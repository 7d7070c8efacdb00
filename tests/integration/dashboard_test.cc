// The coordinator's HTTP port end to end: a real coordinator (--metrics-listen) and two real
// workers on 127.0.0.1. /metrics is scraped over HTTP after a job and its counters checked
// against GetJob; the dashboard is loaded in headless Chromium while a job trains, its DOM
// checked after the page's scripts ran, and a screenshot kept under the build directory.
#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <regex>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/exposition_parser.h"
#include "tests/http_client.h"
#include "tests/integration/harness.h"

namespace tandem::testing {
namespace {

using namespace std::chrono_literals;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::Optional;

class HttpPortTest : public ::testing::Test {
 protected:
  void StartCluster() {
    Cluster::Options options;
    options.workers = 2;
    options.http = true;
    cluster_ = std::make_unique<Cluster>(options);
    absl::Status s = cluster_->Start();
    ASSERT_TRUE(s.ok()) << s;
    ASSERT_GT(cluster_->http_port(), 0);
  }
  void TearDown() override {
    if (HasFailure() && cluster_) {
      std::cerr << "coordinator log:\n" << ReadFile(cluster_->dir() + "/coordinator.log");
    }
  }
  Exposition Scrape() {
    auto r = HttpGet(cluster_->http_port(), "/metrics");
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) return {};
    EXPECT_EQ(r->status, 200);
    EXPECT_EQ(r->headers["content-type"], "text/plain; version=0.0.4; charset=utf-8");
    auto e = ParseExposition(r->body);
    EXPECT_TRUE(e.ok()) << e.status() << "\n" << r->body;
    return e.ok() ? *e : Exposition{};
  }
  std::unique_ptr<Cluster> cluster_;
};

TEST_F(HttpPortTest, MetricsCountWhatTheJobDid) {
  StartCluster();
  constexpr int kSteps = 6;
  auto id = cluster_->Submit(TinyJobYaml(2, 4, kSteps, "1f1b", "eval:\n  every: 3\n"));
  ASSERT_TRUE(id.ok()) << id.status();
  auto job = cluster_->WaitForEnd(*id, 120s);
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_EQ(job->state(), v1::SUCCEEDED) << job->reason();
  ASSERT_EQ(job->history_size(), kSteps);

  const Exposition e = Scrape();
  const std::map<std::string, std::string> j = {{"job", *id}};
  EXPECT_THAT(e.Value("tandem_job_steps_completed_total", j), Optional(kSteps));
  EXPECT_THAT(e.Value("tandem_job_step_duration_seconds_count", j), Optional(kSteps));
  EXPECT_THAT(e.Value("tandem_job_tokens_total", j),
              Optional(static_cast<double>(kSteps * job->tokens_per_step())));
  EXPECT_THAT(e.Value("tandem_job_loss", j), Optional(job->last_loss()));
  ASSERT_TRUE(job->has_val_loss());
  EXPECT_THAT(e.Value("tandem_job_validation_loss", j), Optional(job->last_val_loss()));
  EXPECT_THAT(e.Value("tandem_job_info", {{"job", *id}, {"state", "succeeded"}}), Optional(1.0));
  EXPECT_THAT(e.Value("tandem_jobs", {{"state", "succeeded"}}), Optional(1.0));
  EXPECT_THAT(e.Value("tandem_jobs", {{"state", "running"}}), Optional(0.0));
  double step_seconds = 0, busy0 = 0;
  int64_t bytes = 0;
  for (const v1::StepSummary& s : job->history()) {
    step_seconds += s.step_seconds();
    busy0 += s.stage_busy_seconds(0);
    bytes += s.bytes_sent();
  }
  const auto sum = e.Value("tandem_job_step_duration_seconds_sum", j);
  ASSERT_TRUE(sum.has_value());
  EXPECT_NEAR(*sum, step_seconds, 1e-9 * step_seconds);
  const auto busy = e.Value("tandem_job_stage_busy_seconds_total",
                            {{"job", *id}, {"stage", "0"}, {"worker", job->stages(0).worker_id()}});
  ASSERT_TRUE(busy.has_value());
  EXPECT_NEAR(*busy, busy0, 1e-9);
  EXPECT_THAT(e.Value("tandem_job_last_step_duration_seconds", j),
              Optional(job->history(kSteps - 1).step_seconds()));
  EXPECT_THAT(e.Value("tandem_job_bubble_measured_ratio", j),
              Optional(job->history(kSteps - 1).bubble_measured()));

  // Bytes per worker: both sent, and together what the steps report.
  double sent = 0;
  for (const v1::StageAssignment& s : job->stages()) {
    const auto w =
        e.Value("tandem_worker_bytes_sent_total", {{"job", *id}, {"worker", s.worker_id()}});
    ASSERT_TRUE(w.has_value()) << s.worker_id();
    EXPECT_GT(*w, 0) << s.worker_id();
    sent += *w;
  }
  EXPECT_EQ(sent, static_cast<double>(bytes));

  // Both workers up, idle again after the job.
  auto workers = cluster_->Workers();
  ASSERT_TRUE(workers.ok()) << workers.status();
  ASSERT_EQ(workers->size(), 2u);
  for (const v1::WorkerInfo& w : *workers) {
    EXPECT_THAT(e.Value("tandem_worker_up", {{"worker", w.worker_id()}}), Optional(1.0));
  }
  EXPECT_THAT(e.Value("tandem_workers", {{"state", "idle"}}), Optional(2.0));

  // The JSON API serves the same job.
  auto api = HttpGet(cluster_->http_port(), "/api/jobs/" + *id);
  ASSERT_TRUE(api.ok()) << api.status();
  ASSERT_EQ(api->status, 200) << api->body;
  const nlohmann::json doc = nlohmann::json::parse(api->body);
  EXPECT_EQ(doc["job"]["state"], "SUCCEEDED");
  EXPECT_EQ(doc["series"]["step"].size(), static_cast<size_t>(kSteps));
  EXPECT_EQ(doc["validation"]["step"].size(), 2u);  // after steps 3 and 6
  auto svg = HttpGet(cluster_->http_port(), "/api/jobs/" + *id + "/trace.svg");
  ASSERT_TRUE(svg.ok()) << svg.status();
  EXPECT_EQ(svg->status, 200);
  EXPECT_EQ(svg->headers["content-type"], "image/svg+xml");
  auto missing = HttpGet(cluster_->http_port(), "/no/such/page");
  ASSERT_TRUE(missing.ok());
  EXPECT_EQ(missing->status, 404);
}

// Chromium's path: $TANDEM_CHROMIUM, else `chromium` on the PATH; empty when there is none.
std::string FindChromium() {
  if (const char* env = std::getenv("TANDEM_CHROMIUM"); env != nullptr && *env != '\0') {
    return env;
  }
  const char* path = std::getenv("PATH");
  for (const auto& dir : absl::StrSplit(path != nullptr ? path : "/usr/bin", ':')) {
    for (const char* name : {"chromium", "chromium-browser"}) {
      const std::string candidate = absl::StrCat(dir, "/", name);
      if (access(candidate.c_str(), X_OK) == 0) return candidate;
    }
  }
  return "";
}

// The value of attribute `attr` on the first element with `id="..."`, or "".
std::string AttributeOf(const std::string& dom, const std::string& id, const std::string& attr) {
  const std::regex tag("<[a-z]+ [^>]*id=\"" + id + "\"[^>]*>");
  std::smatch m;
  if (!std::regex_search(dom, m, tag)) return "";
  const std::string t = m.str();
  const std::regex a(attr + "=\"([^\"]*)\"");
  std::smatch v;
  return std::regex_search(t, v, a) ? v[1].str() : "";
}

int CountOf(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

TEST_F(HttpPortTest, DashboardInChromiumShowsARunningJob) {
  const std::string chromium = FindChromium();
  if (chromium.empty()) {
    GTEST_SKIP() << "chromium is not installed (scripts/install-deps.sh --test installs it); "
                    "the dashboard's browser test needs it";
  }
  StartCluster();
  // Profiled (the tail continues the pipeline block), so that the page has a predicted step.
  auto id = cluster_->Submit(
      TinyJobYaml(2, 4, 100000, "1f1b", "  partition: profile\neval:\n  every: 10\n"));
  ASSERT_TRUE(id.ok()) << id.status();
  ASSERT_TRUE(WaitFor(
      [&] {
        auto j = cluster_->GetJob(*id);
        return j.ok() && j->steps_done() >= 25;
      },
      60s))
      << "the job did not train";

  const std::string url = absl::StrCat("http://127.0.0.1:", cluster_->http_port(), "/jobs/", *id);
  const std::string profile = cluster_->dir() + "/chromium-profile";
  auto browse = [&](const std::vector<std::string>& what) {
    std::vector<std::string> argv{
        chromium, "--headless",
        "--no-sandbox",  // root in CI containers
        "--disable-gpu",
        // Containers' /dev/shm is small.
        "--disable-dev-shm-usage", "--no-first-run", "--no-default-browser-check",
        // No crash handler: crashpad forks a daemon of its own that outlives the browser.
        "--disable-crash-reporter", "--disable-breakpad", "--disable-extensions",
        "--disable-background-networking", "--disable-component-update",
        "--user-data-dir=" + profile, "--window-size=1280,1700",
        // The page's polls run on virtual time: 6 refreshes.
        "--virtual-time-budget=12000"};
    argv.insert(argv.end(), what.begin(), what.end());
    argv.push_back(url);
    // Two of these run in the test; with the job's minute they stay inside ctest's 300 s.
    // A browser that has not finished by then is killed with everything it started.
    return RunCommand(argv, 75s);
  };

  CommandResult dump = browse({"--dump-dom"});
  ASSERT_EQ(dump.exit_code, 0) << dump.err;
  const std::string& dom = dump.out;
  ASSERT_THAT(dom, HasSubstr("<title>Tandem</title>")) << dump.err;

  // The job's page, refreshed more than once.
  EXPECT_EQ(AttributeOf(dom, "job", "data-job-id"), *id) << dom;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(dom, m, std::regex("<body[^>]*data-refreshes=\"([0-9]+)\"")))
      << dom;
  EXPECT_GE(std::stoi(m[1].str()), 2);
  // The jobs list has the job, running; the workers table both workers.
  EXPECT_THAT(dom, HasSubstr(absl::StrCat("<tr data-job-id=\"", *id, "\"")));
  EXPECT_THAT(dom, HasSubstr("<span class=\"state RUNNING\">RUNNING</span>"));
  EXPECT_EQ(CountOf(dom, "<tr data-worker-id="), 2);
  // The loss curve has points, and so has the validation curve.
  ASSERT_TRUE(std::regex_search(
      dom, m,
      std::regex("<polyline class=\"series loss\" points=\"[^\"]*\" data-points=\"([0-9]+)\"")))
      << dom;
  EXPECT_GE(std::stoi(m[1].str()), 20);
  ASSERT_TRUE(std::regex_search(
      dom, m,
      std::regex(
          "<polyline class=\"series val-loss\" points=\"[^\"]*\" data-points=\"([0-9]+)\"")));
  EXPECT_GE(std::stoi(m[1].str()), 2);
  // Throughput and per-stage utilisation.
  EXPECT_THAT(dom, HasSubstr("<polyline class=\"series throughput\""));
  EXPECT_EQ(CountOf(dom, "<tr class=\"stage\""), 2);
  // The step its plan predicted, with the steady steps against it and whose miss a miss is
  // (the coordinator's check over the latest steps).
  ASSERT_TRUE(std::regex_search(
      dom, m,
      std::regex("<dt>step time predicted</dt><dd>[0-9.]+ [a-z]+ \\(measured x([0-9.]+)\\)</dd>")))
      << dom;
  EXPECT_GT(std::stod(m[1].str()), 0.0);
  EXPECT_TRUE(std::regex_search(
      dom, std::regex("<dt>against the prediction</dt><dd>[0-9.]+ s per step, median of steps "
                      "[0-9]+-[0-9]+: x[0-9.]+ the prediction[^<]*</dd>")))
      << dom;
  // The latest step's timeline, a row per stage.
  EXPECT_EQ(AttributeOf(dom, "timeline", "data-rows"), "2") << dom;
  EXPECT_EQ(CountOf(dom, "<g class=\"row\""), 2);
  EXPECT_THAT(dom, Not(HasSubstr("<p id=\"error\" class=\"error\">")));

  // A screenshot for people to look at (CI keeps the build directory's test-artifacts/).
  const std::string artifacts = TANDEM_ARTIFACTS_DIR;
  std::filesystem::create_directories(artifacts);
  const std::string png = artifacts + "/dashboard.png";
  std::filesystem::remove(png);
  CommandResult shot = browse({"--hide-scrollbars", "--screenshot=" + png});
  ASSERT_EQ(shot.exit_code, 0) << shot.err;
  ASSERT_TRUE(std::filesystem::exists(png)) << shot.err;
  const std::string bytes = ReadFile(png);
  EXPECT_EQ(bytes.substr(0, 8), "\x89PNG\r\n\x1a\n");
  EXPECT_GT(bytes.size(), 10000u);

  EXPECT_TRUE(cluster_->Cancel(*id).ok());
}

}  // namespace
}  // namespace tandem::testing
