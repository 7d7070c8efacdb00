#include "coordinator/web_handlers.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/step_number.h"
#include "coordinator/dashboard_assets.h"
#include "coordinator/prediction_check.h"
#include "coordinator/step_timings.h"
#include "nlohmann/json.hpp"

namespace tandem::coordinator {
namespace {

using nlohmann::json;

constexpr absl::string_view kJobsPrefix = "/jobs/";
constexpr absl::string_view kApiJobsPrefix = "/api/jobs/";
constexpr absl::string_view kStaticPrefix = "/static/";
constexpr absl::string_view kTraceSuffix = "/trace.svg";

void NoCache(HttpResponse* r) { r->headers.emplace_back("Cache-Control", "no-store"); }

HttpResponse Text(int status, std::string message) {
  HttpResponse r;
  r.status = status;
  r.body = std::move(message);
  r.body += '\n';
  NoCache(&r);
  return r;
}

HttpResponse NotFound(absl::string_view what) { return Text(404, std::string(what)); }

HttpResponse Json(const json& value) {
  HttpResponse r;
  r.content_type = "application/json";
  // Replace invalid UTF-8 (a job name is the user's) rather than fail.
  r.body = value.dump(-1, ' ', false, json::error_handler_t::replace);
  NoCache(&r);
  return r;
}

HttpResponse FromStatus(const absl::Status& s) {
  switch (s.code()) {
    case absl::StatusCode::kNotFound:
      return Text(404, std::string(s.message()));
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
      return Text(400, std::string(s.message()));
    case absl::StatusCode::kResourceExhausted:
      return Text(413, std::string(s.message()));
    default:
      return Text(500, s.ToString());
  }
}

// "job-12": what the job store hands out. Anything else is no job of ours, and is not echoed.
bool IsJobId(absl::string_view id) {
  if (id.size() < 5 || id.size() > 24 || !absl::StartsWith(id, "job-")) return false;
  return std::all_of(id.begin() + 4, id.end(), [](char c) { return absl::ascii_isdigit(c); });
}

// The query parameter `name` as an integer; nullopt when absent. INVALID_ARGUMENT when it is
// not one.
absl::StatusOr<std::optional<int64_t>> IntParam(const HttpRequest& request,
                                                const std::string& name) {
  auto it = request.query.find(name);
  if (it == request.query.end()) return std::optional<int64_t>();
  int64_t v = 0;
  if (!absl::SimpleAtoi(it->second, &v)) {
    return absl::InvalidArgumentError(absl::StrCat("?", name, "= takes an integer"));
  }
  return std::optional<int64_t>(v);
}

std::string StateName(v1::JobState s) { return v1::JobState_Name(s); }

// JSON numbers must be finite; a non-finite loss is shown as null.
json Num(double v) { return std::isfinite(v) ? json(v) : json(nullptr); }

json JobSummaryJson(const v1::Job& job) {
  json j;
  j["id"] = job.id();
  j["name"] = job.name();
  j["state"] = StateName(job.state());
  j["reason"] = job.reason();
  j["steps_done"] = job.steps_done();
  j["total_steps"] = job.total_steps();
  j["first_step"] = job.first_step();
  j["has_loss"] = job.steps_done() > job.first_step();
  j["last_loss"] = Num(job.last_loss());
  j["has_val_loss"] = job.has_val_loss();
  j["last_val_loss"] = Num(job.last_val_loss());
  j["created_unix_ms"] = job.created_unix_ms();
  j["started_unix_ms"] = job.started_unix_ms();
  j["finished_unix_ms"] = job.finished_unix_ms();
  const v1::PipelineSpec& p = job.spec().pipeline();
  j["schedule"] = p.schedule();
  j["stages"] = p.stages();
  j["replicas"] = std::max(1, p.replicas());
  j["micro_batches"] = p.micro_batches();
  j["micro_batch_size"] = p.micro_batch_size();
  j["model"] = job.spec().model().arch();
  // Faults and resizes: restarts, changes of layout, steps trained again, and the runs that
  // resumed from the state their workers kept (peer recovery).
  j["restarts"] = job.restarts();
  j["resizes"] = job.resizes_size();
  j["steps_redone"] = job.steps_redone();
  j["peer_recoveries"] = job.peer_recoveries();
  // Checkpoints the coordinator could not store (the job trained on), and the latest's cause.
  j["checkpoint_failures"] = job.checkpoint_failures();
  j["last_checkpoint_failure"] = job.last_checkpoint_failure();
  return j;
}

json StepJson(const v1::StepSummary& s) {
  json j;
  j["step"] = StepNumber(s.step());
  j["loss"] = Num(s.loss());
  j["step_seconds"] = s.step_seconds();
  j["tokens_per_second"] = s.tokens_per_second();
  j["bubble_measured"] = s.bubble_measured();
  j["bubble_predicted"] = s.bubble_predicted();
  j["grad_norm"] = Num(s.grad_norm());
  j["learning_rate"] = s.learning_rate();
  j["skipped"] = s.skipped();
  j["bytes_sent"] = s.bytes_sent();
  j["peak_activation_bytes"] = s.peak_activation_bytes();
  j["max_worker_exec_seconds"] = s.max_worker_exec_seconds();
  j["coordinator_overhead_seconds"] = s.coordinator_overhead_seconds();
  j["max_worker_update_seconds"] = s.max_worker_update_seconds();
  return j;
}

// Every index of `n` points when there are at most `max`, else about `max` evenly spaced ones
// and always the last.
std::vector<size_t> Thin(size_t n, size_t max) {
  std::vector<size_t> out;
  if (n == 0) return out;
  const size_t stride = n <= max ? 1 : (n + max - 1) / max;
  for (size_t i = 0; i < n; i += stride) out.push_back(i);
  if (out.back() != n - 1) out.push_back(n - 1);
  return out;
}

}  // namespace

HttpResponse WebHandlers::Handle(const HttpRequest& request) const {
  if (request.method != "GET" && request.method != "HEAD") {
    HttpResponse r = Text(405, absl::StrCat("method not allowed: this server only reads (GET)"));
    r.headers.emplace_back("Allow", "GET, HEAD");
    return r;
  }
  const std::string& path = request.path;
  if (path == "/metrics") {
    HttpResponse r;
    r.content_type = kExpositionContentType;
    r.body = env_.metrics->Render();
    NoCache(&r);
    return r;
  }
  if (path == "/" || (absl::StartsWith(path, kJobsPrefix) &&
                      IsJobId(absl::string_view(path).substr(kJobsPrefix.size())))) {
    // The page reads the job from its own address.
    const DashboardAsset* page = FindDashboardAsset("index.html");
    if (page == nullptr) return NotFound("the dashboard was not built in");
    HttpResponse r;
    r.content_type = std::string(page->content_type);
    r.body = std::string(page->data);
    NoCache(&r);
    // The page may load and fetch from this server only, and run no inline code.
    r.headers.emplace_back("Content-Security-Policy",
                           "default-src 'none'; script-src 'self'; style-src 'self'; "
                           "connect-src 'self'; img-src 'self' data:; base-uri 'none'; "
                           "form-action 'none'; frame-ancestors 'none'");
    return r;
  }
  if (absl::StartsWith(path, kStaticPrefix)) {
    const std::string name = path.substr(kStaticPrefix.size());
    const DashboardAsset* asset = FindDashboardAsset(std::string_view(name));
    if (asset == nullptr) return NotFound("no such file");
    HttpResponse r;
    r.content_type = std::string(asset->content_type);
    r.body = std::string(asset->data);
    NoCache(&r);
    return r;
  }
  if (path == "/api/jobs") return Jobs();
  if (path == "/api/workers") return Workers();
  if (absl::StartsWith(path, kApiJobsPrefix)) {
    absl::string_view rest = absl::string_view(path).substr(kApiJobsPrefix.size());
    const bool trace = absl::EndsWith(rest, kTraceSuffix);
    if (trace) rest.remove_suffix(kTraceSuffix.size());
    if (!IsJobId(rest)) return NotFound("no such job: job ids look like job-12");
    return trace ? Trace(std::string(rest), request) : Job(std::string(rest), request);
  }
  return NotFound(
      "no such page; the dashboard is at /, metrics at /metrics, the JSON API under /api/jobs "
      "and /api/workers");
}

HttpResponse WebHandlers::Jobs() const {
  json jobs = json::array();
  for (const v1::Job& job : env_.store->List()) jobs.push_back(JobSummaryJson(job));
  return Json(json{{"jobs", jobs}});
}

HttpResponse WebHandlers::Job(const std::string& id, const HttpRequest& request) const {
  auto after = IntParam(request, "after");
  if (!after.ok()) return FromStatus(after.status());
  auto job = env_.store->Get(id, /*with_history=*/false);
  if (!job.ok()) return FromStatus(job.status());
  // ?after=N: the steps after step number N (numbers from 1, as the series gives them).
  const int64_t since = StepIndex(after->value_or(0));
  auto steps = env_.store->StepsAfter(id, since);
  if (!steps.ok()) return FromStatus(steps.status());
  // The latest step, for the per-stage figures: the last of the new ones, or else looked up.
  std::optional<v1::StepSummary> last;
  if (!steps->empty()) {
    last = steps->back();
  } else if (auto tail = env_.store->StepsAfter(id, job->steps_done() - 2);
             tail.ok() && !tail->empty()) {
    last = tail->back();
  }

  json out;
  json j = JobSummaryJson(*job);
  j["effective_batch"] = job->effective_batch();
  j["tokens_per_step"] = job->tokens_per_step();
  j["bubble_fraction_ideal"] = job->bubble_fraction_ideal();
  j["predicted_step_seconds"] = job->predicted_step_seconds();
  // The coordinator's check of the prediction over the latest steps (Job.prediction_check).
  if (job->has_prediction_check()) {
    const v1::PredictionCheck& c = job->prediction_check();
    j["prediction_check"] = {{"steps", c.steps()},
                             {"ratio", Num(c.measured_seconds() / c.predicted_seconds())},
                             {"miss", MissName(c.miss())},
                             {"summary", c.summary()}};
  }
  j["skipped_steps"] = job->skipped_steps();
  j["checkpoint_step"] = job->checkpoint_step();
  j["plan"] = job->plan();
  out["job"] = j;

  json stages = json::array();
  for (const v1::StageAssignment& s : job->stages()) {
    json st;
    st["stage"] = s.stage();
    st["rank"] = s.rank();
    st["worker_id"] = s.worker_id();
    st["address"] = s.address();
    // Data parallelism: the stage's worker in every replica (the grid's row).
    json replicas = json::array();
    for (const v1::ReplicaWorker& w : s.replicas()) {
      replicas.push_back(
          {{"replica", w.replica()}, {"worker_id", w.worker_id()}, {"address", w.address()}});
    }
    st["replicas"] = replicas;
    st["layer_begin"] = s.layer_begin();
    st["layer_end"] = s.layer_end();
    st["predicted_microbatch_seconds"] = s.predicted_seconds();
    st["predicted_bytes"] = s.predicted_bytes();
    if (last.has_value() && s.stage() >= 0) {
      if (s.stage() < last->stage_busy_seconds_size()) {
        const double busy = last->stage_busy_seconds(s.stage());
        st["busy_seconds"] = busy;
        // The share of the step's wall time the stage spent computing.
        st["utilisation"] = last->step_seconds() > 0 ? busy / last->step_seconds() : 0.0;
      }
      if (s.stage() < last->stage_seconds_size()) {
        st["microbatch_seconds"] = last->stage_seconds(s.stage());
      }
      if (s.stage() < last->stage_reduce_seconds_size()) {
        st["reduce_seconds"] = last->stage_reduce_seconds(s.stage());
      }
      if (s.stage() < last->stage_peak_bytes_size()) {
        st["peak_bytes"] = last->stage_peak_bytes(s.stage());
      }
      if (s.stage() < last->stage_memory_size()) {
        const v1::StageMemory& m = last->stage_memory(s.stage());
        st["memory"] = {{"parameters", m.parameter_bytes()},
                        {"gradients", m.gradient_bytes()},
                        {"optimizer", m.optimizer_bytes()},
                        {"workspace", m.workspace_bytes()},
                        {"activations_peak", m.peak_activation_bytes()}};
      }
    }
    stages.push_back(st);
  }
  out["stages"] = stages;
  out["last_step"] = last.has_value() ? StepJson(*last) : json(nullptr);

  // Series, thinned to kMaxSeriesPoints; every validation point is kept.
  json series;
  series["after"] = since;
  for (const char* key : {"step", "loss", "step_seconds", "tokens_per_second", "bubble_measured"}) {
    series[key] = json::array();
  }
  json validation{{"step", json::array()}, {"loss", json::array()}};
  for (size_t i : Thin(steps->size(), kMaxSeriesPoints)) {
    const v1::StepSummary& s = (*steps)[i];
    series["step"].push_back(StepNumber(s.step()));
    series["loss"].push_back(Num(s.loss()));
    series["step_seconds"].push_back(s.step_seconds());
    series["tokens_per_second"].push_back(s.tokens_per_second());
    series["bubble_measured"].push_back(s.bubble_measured());
  }
  for (const v1::StepSummary& s : *steps) {
    if (!s.has_val_loss()) continue;
    validation["step"].push_back(StepNumber(s.step()));
    validation["loss"].push_back(Num(s.val_loss()));
  }
  out["series"] = series;
  out["validation"] = validation;
  return Json(out);
}

HttpResponse WebHandlers::Trace(const std::string& id, const HttpRequest& request) const {
  auto step = IntParam(request, "step");
  if (!step.ok()) return FromStatus(step.status());
  auto job = env_.store->Get(id, /*with_history=*/false);
  if (!job.ok()) return FromStatus(job.status());
  auto timings = env_.store->GetTimings(
      id, step->has_value() ? JobStore::TimingSteps::kAll : JobStore::TimingSteps::kLatest);
  if (!timings.ok()) return FromStatus(timings.status());
  v1::GetJobTraceRequest req;
  req.set_job_id(id);
  req.set_format(v1::TRACE_FORMAT_SVG);
  if (step->has_value()) req.set_step(StepIndex(**step));  // ?step=N: the N-th step, from 1
  auto trace = RenderJobTrace(*job, *timings, req);
  if (!trace.ok()) return FromStatus(trace.status());
  HttpResponse r;
  r.content_type = "image/svg+xml";
  r.body = std::move(*trace->mutable_content());
  if (!trace->steps().empty())
    r.headers.emplace_back("X-Tandem-Step", absl::StrCat(StepNumber(trace->steps(0))));
  NoCache(&r);
  return r;
}

HttpResponse WebHandlers::Workers() const {
  json workers = json::array();
  const auto now = Clock::now();
  for (const WorkerRecord& w : env_.registry->List()) {
    json j;
    j["id"] = w.id;
    j["address"] = w.address;
    j["device"] = w.device;
    j["threads"] = w.threads;
    j["hostname"] = w.hostname;
    j["version"] = w.version;
    j["state"] = v1::WorkerState_Name(w.state);
    j["job_id"] = w.job_id;
    j["stage"] = w.stage;
    j["heartbeat_age_seconds"] = std::chrono::duration<double>(now - w.last_heartbeat).count();
    workers.push_back(j);
  }
  return Json(json{{"workers", workers}});
}

}  // namespace tandem::coordinator
