#include "coordinator/metrics.h"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/version.h"
#include "coordinator/prediction_check.h"

namespace tandem::coordinator {
namespace {

using Labels = ExpositionWriter::Labels;
using Type = ExpositionWriter::Type;

void AppendEscaped(absl::string_view text, bool quotes, std::string* out) {
  for (char c : text) {
    if (c == '\\') {
      *out += "\\\\";
    } else if (c == '\n') {
      *out += "\\n";
    } else if (c == '"' && quotes) {
      *out += "\\\"";
    } else {
      *out += c;
    }
  }
}

std::string Lower(absl::string_view name) { return absl::AsciiStrToLower(name); }

std::string JobStateLabel(v1::JobState state) { return Lower(v1::JobState_Name(state)); }
std::string WorkerStateLabel(v1::WorkerState state) { return Lower(v1::WorkerState_Name(state)); }

constexpr v1::JobState kJobStates[] = {v1::QUEUED, v1::RUNNING, v1::SUCCEEDED, v1::FAILED,
                                       v1::CANCELLED};
constexpr v1::WorkerState kWorkerStates[] = {v1::IDLE, v1::BUSY, v1::LOST};

// The worker serving each stage of the job, "" where none is assigned.
std::string StageWorker(const v1::Job& job, int stage) {
  for (const v1::StageAssignment& s : job.stages()) {
    if (s.stage() == stage) return s.worker_id();
  }
  return "";
}
std::string RankWorker(const v1::Job& job, int rank) {
  for (const v1::StageAssignment& s : job.stages()) {
    if (s.rank() == rank) return s.worker_id();
  }
  return "";
}

Labels JobLabels(const JobMetrics& j) { return {{"job", j.job.id()}}; }
Labels StageLabels(const JobMetrics& j, int stage) {
  return {
      {"job", j.job.id()}, {"stage", absl::StrCat(stage)}, {"worker", StageWorker(j.job, stage)}};
}

// Steps this job ran itself (a resumed job starts at first_step).
int64_t StepsRun(const v1::Job& job) {
  return std::max<int64_t>(0, job.steps_done() - job.first_step());
}

// One gauge or counter family with a sample per job, for the jobs `value` gives one for.
template <typename F>
void PerJob(ExpositionWriter& w, const MetricsSnapshot& s, absl::string_view name, Type type,
            absl::string_view help, F value) {
  bool any = false;
  for (const JobMetrics& j : s.jobs) {
    double v = 0.0;
    if (!value(j, &v)) continue;
    if (!any) w.Family(name, type, help);
    any = true;
    w.Sample(JobLabels(j), v);
  }
}

// Per stage of each job's latest step.
template <typename F>
void PerStage(ExpositionWriter& w, const MetricsSnapshot& s, absl::string_view name, Type type,
              absl::string_view help, F values) {
  bool any = false;
  for (const JobMetrics& j : s.jobs) {
    const std::vector<double> v = values(j);
    for (size_t stage = 0; stage < v.size(); ++stage) {
      if (!any) w.Family(name, type, help);
      any = true;
      w.Sample(StageLabels(j, static_cast<int>(stage)), v[stage]);
    }
  }
}

void RenderCoordinator(ExpositionWriter& w, const MetricsSnapshot& s) {
  w.Family("tandem_build_info", Type::kGauge,
           "The coordinator's version and the control-plane protocol it speaks (always 1).");
  w.Sample({{"version", kVersion}, {"protocol", absl::StrCat(kProtocolVersion)}}, 1);

  w.Family("tandem_jobs", Type::kGauge, "Jobs in the job store by state.");
  for (v1::JobState state : kJobStates) {
    int64_t n = 0;
    for (const JobMetrics& j : s.jobs) n += j.job.state() == state;
    w.Sample({{"state", JobStateLabel(state)}}, static_cast<double>(n));
  }

  w.Family("tandem_workers", Type::kGauge, "Registered workers by state.");
  for (v1::WorkerState state : kWorkerStates) {
    int64_t n = 0;
    for (const WorkerRecord& r : s.workers) n += r.state == state;
    w.Sample({{"state", WorkerStateLabel(state)}}, static_cast<double>(n));
  }
}

void RenderWorkers(ExpositionWriter& w, const MetricsSnapshot& s) {
  if (s.workers.empty()) return;
  w.Family("tandem_worker_up", Type::kGauge,
           "1 while the worker heartbeats, 0 once it is LOST (no heartbeat for the timeout).");
  for (const WorkerRecord& r : s.workers) w.Sample({{"worker", r.id}}, r.state != v1::LOST);
  w.Family("tandem_worker_info", Type::kGauge,
           "A registered worker's address, device, host and version (always 1).");
  for (const WorkerRecord& r : s.workers) {
    w.Sample({{"worker", r.id},
              {"address", r.address},
              {"device", r.device},
              {"hostname", r.hostname},
              {"version", r.version}},
             1);
  }
  w.Family("tandem_worker_state", Type::kGauge,
           "1 for the worker's current state (idle, busy, lost), 0 for the others.");
  for (const WorkerRecord& r : s.workers) {
    for (v1::WorkerState state : kWorkerStates) {
      w.Sample({{"worker", r.id}, {"state", WorkerStateLabel(state)}}, r.state == state);
    }
  }
  w.Family("tandem_worker_heartbeat_age_seconds", Type::kGauge,
           "Seconds since the worker's last heartbeat.");
  for (const WorkerRecord& r : s.workers) {
    w.Sample({{"worker", r.id}},
             std::max(0.0, std::chrono::duration<double>(s.now - r.last_heartbeat).count()));
  }
}

void RenderJobs(ExpositionWriter& w, const MetricsSnapshot& s) {
  if (s.jobs.empty()) return;
  w.Family("tandem_job_info", Type::kGauge,
           "A job's name, state and schedule (always 1); the state label follows the job.");
  for (const JobMetrics& j : s.jobs) {
    w.Sample({{"job", j.job.id()},
              {"name", j.job.name()},
              {"state", JobStateLabel(j.job.state())},
              {"schedule", j.job.spec().pipeline().schedule()}},
             1);
  }
  PerJob(w, s, "tandem_job_steps_completed_total", Type::kCounter,
         "Training steps the job has completed (a resumed job counts from its first step).",
         [](const JobMetrics& j, double* v) {
           *v = static_cast<double>(StepsRun(j.job));
           return true;
         });
  PerJob(w, s, "tandem_job_steps_planned", Type::kGauge,
         "The step the job trains up to (its spec's steps).", [](const JobMetrics& j, double* v) {
           *v = static_cast<double>(j.job.total_steps());
           return true;
         });
  PerJob(w, s, "tandem_job_skipped_steps_total", Type::kCounter,
         "Steps whose non-finite gradient was not applied.", [](const JobMetrics& j, double* v) {
           *v = static_cast<double>(j.job.skipped_steps());
           return true;
         });
  PerJob(w, s, "tandem_job_restarts_total", Type::kCounter,
         "Runs of the job that ended in a fault and were restarted.",
         [](const JobMetrics& j, double* v) {
           *v = static_cast<double>(j.job.restarts());
           return true;
         });
  PerJob(w, s, "tandem_job_checkpoint_failures_total", Type::kCounter,
         "Checkpoints the coordinator could not store (a full disk); the job trained on.",
         [](const JobMetrics& j, double* v) {
           *v = static_cast<double>(j.job.checkpoint_failures());
           return true;
         });
  PerJob(w, s, "tandem_job_resizes_total", Type::kCounter,
         "Changes of an elastic job's layout (shrinks after faults, grows at checkpoints).",
         [](const JobMetrics& j, double* v) {
           *v = static_cast<double>(j.job.resizes_size());
           return true;
         });
  PerJob(w, s, "tandem_job_peer_recoveries_total", Type::kCounter,
         "Runs that resumed from the state the workers before kept instead of a checkpoint.",
         [](const JobMetrics& j, double* v) {
           *v = static_cast<double>(j.job.peer_recoveries());
           return true;
         });
  PerJob(w, s, "tandem_job_last_recovery_seconds", Type::kGauge,
         "From the latest fault's detection to the first step the job completed after it.",
         [](const JobMetrics& j, double* v) {
           *v = j.job.last_recovery_seconds();
           return j.job.restarts() > 0 && j.job.recovering_since_unix_ms() == 0;
         });
  PerJob(w, s, "tandem_job_recovery_seconds_total", Type::kCounter,
         "Seconds from faults' detection to the first step completed after each.",
         [](const JobMetrics& j, double* v) {
           *v = j.job.recovery_seconds_total();
           return true;
         });
  PerJob(w, s, "tandem_job_steps_redone_total", Type::kCounter,
         "Steps trained again because a run ended after the state it resumed from.",
         [](const JobMetrics& j, double* v) {
           *v = static_cast<double>(j.job.steps_redone());
           return true;
         });
  PerJob(w, s, "tandem_job_tokens_total", Type::kCounter,
         "Training tokens the job has processed (tokens per step x steps completed).",
         [](const JobMetrics& j, double* v) {
           *v = static_cast<double>(j.job.tokens_per_step() * StepsRun(j.job));
           return true;
         });
  PerJob(w, s, "tandem_job_tokens_per_second", Type::kGauge,
         "Training tokens per second in the latest step.", [](const JobMetrics& j, double* v) {
           *v = j.totals.last.tokens_per_second();
           return j.totals.has_last;
         });
  PerJob(w, s, "tandem_job_last_step_duration_seconds", Type::kGauge,
         "Wall time of the latest step on the coordinator (RunStep and ApplyStep).",
         [](const JobMetrics& j, double* v) {
           *v = j.totals.last.step_seconds();
           return j.totals.has_last;
         });
  // The prediction beside the step, and the step's pipeline phase beside the schedule replayed
  // on its own costs: a step far over its prediction with the replay near the pipeline is the
  // costs moving (the host, a stale profile); with the replay far under it, the schedule.
  PerJob(w, s, "tandem_job_predicted_step_duration_seconds", Type::kGauge,
         "The step the job's plan predicted from its profile (Job.predicted_step_seconds).",
         [](const JobMetrics& j, double* v) {
           *v = j.job.predicted_step_seconds();
           return *v > 0;
         });
  PerJob(w, s, "tandem_job_last_step_pipeline_seconds", Type::kGauge,
         "The latest step's pipeline phase on its slowest worker "
         "(StepSummary.max_worker_exec_seconds).",
         [](const JobMetrics& j, double* v) {
           *v = j.totals.last.max_worker_exec_seconds();
           return j.totals.has_last && *v > 0;
         });
  PerJob(w, s, "tandem_job_last_step_replayed_seconds", Type::kGauge,
         "The schedule replayed on the latest step's own measured action costs "
         "(StepSummary.exec_replayed_seconds).",
         [](const JobMetrics& j, double* v) {
           *v = j.totals.last.exec_replayed_seconds();
           return j.totals.has_last && *v > 0;
         });
  // The coordinator's check over the latest steady steps (Job.prediction_check): a median, so
  // that one slow step does not page anyone, and whose miss a miss is.
  PerJob(w, s, "tandem_job_step_over_prediction_ratio", Type::kGauge,
         "The median of the job's latest steady steps over its predicted step "
         "(Job.prediction_check; 1 is on the prediction).",
         [](const JobMetrics& j, double* v) {
           const v1::PredictionCheck& c = j.job.prediction_check();
           *v = c.predicted_seconds() > 0 ? c.measured_seconds() / c.predicted_seconds() : 0;
           return j.job.has_prediction_check() && *v > 0;
         });
  bool checked = false;
  for (const JobMetrics& j : s.jobs) {
    if (!j.job.has_prediction_check()) continue;
    if (!checked) {
      w.Family("tandem_job_prediction_miss", Type::kGauge,
               "Whose miss the job's miss of its predicted step is, beyond the check's "
               "tolerance (always 1): within, costs, schedule, schedule_and_costs, "
               "transfers, transfers_and_costs, update_or_calls, unknown.");
      checked = true;
    }
    std::string miss = MissName(j.job.prediction_check().miss());
    std::replace(miss.begin(), miss.end(), ' ', '_');
    w.Sample({{"job", j.job.id()}, {"miss", miss.empty() ? "within" : miss}}, 1);
  }

  bool any = false;
  for (const JobMetrics& j : s.jobs) {
    if (j.totals.steps == 0) continue;
    if (!any) {
      w.Family("tandem_job_step_duration_seconds", Type::kHistogram,
               "Wall time of the job's steps on the coordinator.");
    }
    any = true;
    w.Histogram(JobLabels(j),
                std::vector<double>(std::begin(kStepSecondsBuckets), std::end(kStepSecondsBuckets)),
                j.totals.bucket_counts, j.totals.seconds_sum);
  }

  PerJob(w, s, "tandem_job_loss", Type::kGauge,
         "Training loss of the latest step (mean cross-entropy per token, nats).",
         [](const JobMetrics& j, double* v) {
           *v = j.job.last_loss();
           return StepsRun(j.job) > 0 || j.totals.has_last;
         });
  PerJob(w, s, "tandem_job_validation_loss", Type::kGauge,
         "Loss of the latest validation pass (nats per token).",
         [](const JobMetrics& j, double* v) {
           *v = j.job.last_val_loss();
           return j.job.has_val_loss();
         });
  PerJob(w, s, "tandem_job_grad_norm", Type::kGauge,
         "Global gradient norm of the latest step, before clipping.",
         [](const JobMetrics& j, double* v) {
           *v = j.totals.last.grad_norm();
           return j.totals.has_last;
         });
  PerJob(w, s, "tandem_job_learning_rate", Type::kGauge, "Learning rate of the latest step.",
         [](const JobMetrics& j, double* v) {
           *v = j.totals.last.learning_rate();
           return j.totals.has_last;
         });
  PerJob(w, s, "tandem_job_bubble_measured_ratio", Type::kGauge,
         "Idle share of the workers' time in the latest step, as measured.",
         [](const JobMetrics& j, double* v) {
           *v = j.totals.last.bubble_measured();
           return j.totals.has_last;
         });
  PerJob(w, s, "tandem_job_bubble_predicted_ratio", Type::kGauge,
         "The bubble the simulator predicts for the schedule from the latest step's measured "
         "action costs.",
         [](const JobMetrics& j, double* v) {
           *v = j.totals.last.bubble_predicted();
           return j.totals.has_last;
         });
  PerJob(w, s, "tandem_job_bubble_ideal_ratio", Type::kGauge,
         "The textbook bubble of the job's pipeline shape, (P - 1) / (M + P - 1).",
         [](const JobMetrics& j, double* v) {
           *v = j.job.bubble_fraction_ideal();
           return true;
         });
  PerJob(w, s, "tandem_job_peak_activation_bytes", Type::kGauge,
         "Peak activation bytes of the latest step, the maximum over stages.",
         [](const JobMetrics& j, double* v) {
           *v = static_cast<double>(j.totals.last.peak_activation_bytes());
           return j.totals.has_last;
         });

  PerStage(w, s, "tandem_job_stage_busy_seconds_total", Type::kCounter,
           "Seconds each stage spent in compute actions (F, B, I, W) over the job's steps.",
           [](const JobMetrics& j) { return j.totals.stage_busy_seconds; });
  PerStage(w, s, "tandem_job_stage_last_step_busy_seconds", Type::kGauge,
           "Seconds each stage spent in compute actions in the latest step.",
           [](const JobMetrics& j) {
             const auto& b = j.totals.last.stage_busy_seconds();
             return std::vector<double>(b.begin(), b.end());
           });
  PerStage(w, s, "tandem_job_stage_microbatch_seconds", Type::kGauge,
           "Measured forward + backward seconds per micro-batch of each stage, latest step.",
           [](const JobMetrics& j) {
             const auto& b = j.totals.last.stage_seconds();
             return std::vector<double>(b.begin(), b.end());
           });
  PerStage(w, s, "tandem_job_stage_peak_memory_bytes", Type::kGauge,
           "Peak memory of each stage in the latest step: parameters, gradients, optimizer "
           "state and the peak of its saved activations.",
           [](const JobMetrics& j) {
             const auto& b = j.totals.last.stage_peak_bytes();
             return std::vector<double>(b.begin(), b.end());
           });
  // What each stage's memory holds, by part, on its worker's device.
  any = false;
  for (const JobMetrics& j : s.jobs) {
    for (const v1::StageMemory& m : j.totals.last.stage_memory()) {
      if (!any) {
        w.Family("tandem_job_stage_memory_bytes", Type::kGauge,
                 "Memory of each stage by part in the latest step: parameters (with a GPU's "
                 "compute copies), gradients, optimizer state, workspace, and the step's peak "
                 "of saved activations and micro-batch buffers.");
      }
      any = true;
      const std::pair<const char*, int64_t> parts[] = {{"parameters", m.parameter_bytes()},
                                                       {"gradients", m.gradient_bytes()},
                                                       {"optimizer", m.optimizer_bytes()},
                                                       {"workspace", m.workspace_bytes()},
                                                       {"activations", m.peak_activation_bytes()}};
      for (const auto& [part, bytes] : parts) {
        Labels labels = StageLabels(j, m.stage());
        labels.emplace_back("part", part);
        w.Sample(labels, static_cast<double>(bytes));
      }
    }
  }
  PerStage(w, s, "tandem_job_stage_predicted_microbatch_seconds", Type::kGauge,
           "Forward + backward seconds per micro-batch of each stage, as the layer profile "
           "predicts (jobs with a profile).",
           [](const JobMetrics& j) {
             std::vector<double> out;
             bool any = false;
             for (const v1::StageAssignment& st : j.job.stages()) {
               if (st.stage() < 0 || st.stage() >= (1 << 16)) continue;
               if (out.size() <= static_cast<size_t>(st.stage())) out.resize(st.stage() + 1);
               out[st.stage()] = st.predicted_seconds();
               any = any || st.predicted_seconds() > 0;
             }
             return any ? out : std::vector<double>{};
           });

  for (const bool sent : {true, false}) {
    any = false;
    for (const JobMetrics& j : s.jobs) {
      const std::vector<int64_t>& bytes = sent ? j.rank_bytes_sent : j.rank_bytes_received;
      for (size_t rank = 0; rank < bytes.size(); ++rank) {
        if (!any) {
          w.Family(sent ? "tandem_worker_bytes_sent_total" : "tandem_worker_bytes_received_total",
                   Type::kCounter,
                   sent ? "Bytes a job's worker sent to the other workers (activations, "
                          "gradients, tied weights' gradients)."
                        : "Bytes a job's worker received from the other workers.");
        }
        any = true;
        w.Sample({{"job", j.job.id()}, {"worker", RankWorker(j.job, static_cast<int>(rank))}},
                 static_cast<double>(bytes[rank]));
      }
    }
  }
}

}  // namespace

std::string FormatMetricValue(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), value);
  if (ec != std::errc()) return absl::StrCat(value);
  return std::string(buf, end);
}

void ExpositionWriter::Family(absl::string_view name, Type type, absl::string_view help) {
  family_ = std::string(name);
  absl::StrAppend(&out_, "# HELP ", name, " ");
  AppendEscaped(help, /*quotes=*/false, &out_);
  absl::StrAppend(&out_, "\n# TYPE ", name, " ",
                  type == Type::kCounter ? "counter"
                  : type == Type::kGauge ? "gauge"
                                         : "histogram",
                  "\n");
}

void ExpositionWriter::Sample(const Labels& labels, double value, absl::string_view suffix) {
  absl::StrAppend(&out_, family_, suffix);
  if (!labels.empty()) {
    out_ += '{';
    for (size_t i = 0; i < labels.size(); ++i) {
      if (i > 0) out_ += ',';
      absl::StrAppend(&out_, labels[i].first, "=\"");
      AppendEscaped(labels[i].second, /*quotes=*/true, &out_);
      out_ += '"';
    }
    out_ += '}';
  }
  absl::StrAppend(&out_, " ", FormatMetricValue(value), "\n");
}

void ExpositionWriter::Histogram(const Labels& labels, const std::vector<double>& bounds,
                                 const std::vector<int64_t>& counts, double sum) {
  int64_t cumulative = 0;
  for (size_t i = 0; i <= bounds.size(); ++i) {
    cumulative += i < counts.size() ? counts[i] : 0;
    Labels with_le = labels;
    with_le.emplace_back("le", i < bounds.size() ? FormatMetricValue(bounds[i]) : "+Inf");
    Sample(with_le, static_cast<double>(cumulative), "_bucket");
  }
  Sample(labels, sum, "_sum");
  Sample(labels, static_cast<double>(cumulative), "_count");
}

void JobStepTotals::AddStep(const v1::StepSummary& step) {
  if (step.step() <= last_step) return;
  last_step = step.step();
  ++steps;
  bucket_counts.resize(kNumStepSecondsBuckets + 1, 0);
  const double seconds = step.step_seconds();
  const size_t bucket =
      std::lower_bound(std::begin(kStepSecondsBuckets), std::end(kStepSecondsBuckets), seconds) -
      std::begin(kStepSecondsBuckets);
  ++bucket_counts[bucket];
  seconds_sum += seconds;
  if (stage_busy_seconds.size() < static_cast<size_t>(step.stage_busy_seconds_size())) {
    stage_busy_seconds.resize(step.stage_busy_seconds_size(), 0.0);
  }
  for (int i = 0; i < step.stage_busy_seconds_size(); ++i) {
    stage_busy_seconds[i] += step.stage_busy_seconds(i);
  }
  has_last = true;
  last = step;
}

std::string RenderMetrics(const MetricsSnapshot& snapshot) {
  ExpositionWriter w;
  RenderCoordinator(w, snapshot);
  RenderWorkers(w, snapshot);
  RenderJobs(w, snapshot);
  return w.text();
}

MetricsSnapshot CoordinatorMetrics::Snapshot() {
  MetricsSnapshot out;
  out.now = Clock::now();
  out.workers = registry_->List();
  absl::MutexLock lock(&mu_);
  for (v1::Job& job : store_->List()) {
    JobMetrics& j = out.jobs.emplace_back();
    JobStepTotals& totals = totals_[job.id()];
    if (auto steps = store_->StepsAfter(job.id(), totals.last_step); steps.ok()) {
      for (const v1::StepSummary& step : *steps) totals.AddStep(step);
    }
    j.totals = totals;
    if (auto timings = store_->GetTimings(job.id(), JobStore::TimingSteps::kNone); timings.ok()) {
      j.rank_bytes_sent.assign(timings->rank_bytes_sent().begin(),
                               timings->rank_bytes_sent().end());
      j.rank_bytes_received.assign(timings->rank_bytes_received().begin(),
                                   timings->rank_bytes_received().end());
    }
    j.job = std::move(job);
  }
  return out;
}

std::string CoordinatorMetrics::Render() { return RenderMetrics(Snapshot()); }

}  // namespace tandem::coordinator
