#include "coordinator/cli/format.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/time/time.h"
#include "common/elastic_layout.h"
#include "common/format_bytes.h"
#include "common/format_seconds.h"
#include "common/model_desc.h"
#include "common/pipeline_plan.h"
#include "common/schedule.h"
#include "common/spec.h"
#include "common/status_macros.h"
#include "google/protobuf/util/json_util.h"

namespace tandem::cli {
namespace {

constexpr int kBarWidth = 20;

std::string StateName(v1::JobState state) {
  if (state == v1::JOB_STATE_UNSPECIFIED) return "UNKNOWN";
  return v1::JobState_Name(state);
}

std::string WorkerStateName(v1::WorkerState state) {
  if (state == v1::WORKER_STATE_UNSPECIFIED) return "UNKNOWN";
  return v1::WorkerState_Name(state);
}

std::string FormatLoss(double loss) { return absl::StrFormat("%.4f", loss); }

std::string FormatAge(double seconds) {
  if (seconds < 0 || !std::isfinite(seconds)) return "-";
  if (seconds < 60) return absl::StrFormat("%.1fs", seconds);
  return absl::StrCat(FormatEta(seconds), " ago");
}

}  // namespace

std::string FormatTimestamp(int64_t unix_ms) {
  if (unix_ms <= 0) return "-";
  return absl::FormatTime("%Y-%m-%d %H:%M:%S", absl::FromUnixMillis(unix_ms),
                          absl::LocalTimeZone());
}

Table::Table(std::vector<std::string> header) { rows_.push_back(std::move(header)); }

void Table::AddRow(std::vector<std::string> cells) {
  cells.resize(rows_[0].size());
  rows_.push_back(std::move(cells));
}

std::string Table::Render() const {
  const size_t columns = rows_[0].size();
  std::vector<size_t> width(columns, 0);
  for (const auto& row : rows_) {
    for (size_t c = 0; c < columns; ++c) width[c] = std::max(width[c], row[c].size());
  }
  std::string out;
  for (const auto& row : rows_) {
    std::string line;
    for (size_t c = 0; c < columns; ++c) {
      line += row[c];
      if (c + 1 < columns) line.append(width[c] - row[c].size() + 2, ' ');
    }
    absl::StrAppend(&out, absl::StripTrailingAsciiWhitespace(line), "\n");
  }
  return out;
}

absl::StatusOr<std::string> ToJson(const google::protobuf::Message& message, bool pretty) {
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = pretty;
  options.always_print_primitive_fields = true;
  options.preserve_proto_field_names = true;
  std::string out;
  auto status = google::protobuf::util::MessageToJsonString(message, &out, options);
  if (!status.ok()) {
    return absl::InternalError(
        absl::StrCat("cannot print ", message.GetTypeName(), " as JSON: ", status.ToString()));
  }
  // The pretty printer ends with a newline and the compact one does not; callers add one.
  absl::StripTrailingAsciiWhitespace(&out);
  return out;
}

std::string WithThousands(int64_t n) {
  std::string digits = absl::StrCat(n < 0 ? -(n + 1) + uint64_t{1} : static_cast<uint64_t>(n));
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return n < 0 ? "-" + out : out;
}

std::string FormatEta(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "--:--";
  const int64_t total = static_cast<int64_t>(std::llround(seconds));
  const int64_t h = total / 3600, m = (total % 3600) / 60, s = total % 60;
  if (h > 0) return absl::StrFormat("%d:%02d:%02d", h, m, s);
  return absl::StrFormat("%d:%02d", m, s);
}

int Percent(int64_t done, int64_t total) {
  if (total <= 0) return 0;
  return static_cast<int>(std::clamp<int64_t>(done * 100 / total, 0, 100));
}

std::string ProgressBar(int64_t done, int64_t total, int width) {
  int filled = 0;
  if (total > 0) {
    filled = static_cast<int>(std::clamp<int64_t>(done * width / total, 0, width));
  }
  return absl::StrCat("[", std::string(filled, '#'), std::string(width - filled, '-'), "]");
}

std::string LayerRangeName(const v1::ModelSpec& model, int begin, int end) {
  if (end <= begin) return "-";
  if (end - begin == 1) return LayerName(model, begin);
  return absl::StrCat(LayerName(model, begin), "..", LayerName(model, end - 1));
}

std::string FormatStepLine(const v1::StepSummary& step, int64_t total_steps,
                           double seconds_per_step) {
  const int64_t done = StepsDone(step);
  const double eta =
      seconds_per_step > 0
          ? seconds_per_step * static_cast<double>(std::max<int64_t>(0, total_steps - done))
          : -1;
  std::string extra;
  if (step.has_val_loss()) absl::StrAppend(&extra, absl::StrFormat("  val %.4f", step.val_loss()));
  if (step.skipped()) absl::StrAppend(&extra, "  SKIPPED (non-finite gradient)");
  return absl::StrFormat("step %d/%d  loss %.4f  %.1f ms/step  %.0f tok/s  %s  %d%%  ETA %s%s",
                         done, total_steps, step.loss(), step.step_seconds() * 1000,
                         step.tokens_per_second(), ProgressBar(done, total_steps, kBarWidth),
                         Percent(done, total_steps), FormatEta(eta), extra);
}

namespace {

// "job <id>", and " (<name>)" when the name is known: how a watch line names its job.
std::string JobLabel(const v1::JobEvent& event, const std::string& job_name) {
  std::string label = absl::StrCat("job ", event.job_id());
  if (!job_name.empty()) absl::StrAppend(&label, " (", job_name, ")");
  return label;
}

}  // namespace

std::string FormatStateLine(const v1::JobEvent& event, const std::string& job_name) {
  std::string line = JobLabel(event, job_name);
  absl::StrAppend(&line, ": ", StateName(event.state()));
  if (!event.reason().empty()) absl::StrAppend(&line, ": ", event.reason());
  return line;
}

namespace {

// The coordinator's check of a job's prediction in a few characters: "x1.024", or "x1.146
// costs" beyond its tolerance (whose miss; `tandem status JOB` says more); "-" without one.
std::string FormatCheckBrief(const v1::Job& job) {
  if (!job.has_prediction_check()) return "-";
  const v1::PredictionCheck& c = job.prediction_check();
  std::string out = absl::StrFormat("x%.3f", c.measured_seconds() / c.predicted_seconds());
  switch (c.miss()) {
    case v1::PREDICTION_WITHIN:
      break;
    case v1::PREDICTION_MISS_SCHEDULE:
      absl::StrAppend(&out, " schedule");
      break;
    case v1::PREDICTION_MISS_COSTS:
      absl::StrAppend(&out, " costs");
      break;
    case v1::PREDICTION_MISS_SCHEDULE_AND_COSTS:
      absl::StrAppend(&out, " schedule+costs");
      break;
    case v1::PREDICTION_MISS_UPDATE_OR_CALLS:
      absl::StrAppend(&out, " update/calls");
      break;
    case v1::PREDICTION_MISS_TRANSFERS:
      absl::StrAppend(&out, " transfers");
      break;
    case v1::PREDICTION_MISS_TRANSFERS_AND_COSTS:
      absl::StrAppend(&out, " transfers+costs");
      break;
    default:
      absl::StrAppend(&out, " ?");
      break;
  }
  return out;
}

}  // namespace

std::string FormatJobsTable(const v1::ListJobsResponse& jobs) {
  Table table({"ID", "NAME", "STATE", "STEP", "LOSS", "VS PREDICTED", "REASON"});
  for (const v1::Job& job : jobs.jobs()) {
    table.AddRow({job.id(), job.name(), StateName(job.state()),
                  absl::StrCat(job.steps_done(), "/", job.total_steps()),
                  job.steps_done() > 0 ? FormatLoss(job.last_loss()) : "-", FormatCheckBrief(job),
                  job.reason()});
  }
  return table.Render();
}

std::string FormatWorkersTable(const v1::ListWorkersResponse& workers) {
  Table table({"ID", "ADDRESS", "NODE", "DEVICE", "THREADS", "PEAK GFLOP/S", "STATE", "JOB",
               "STAGE", "HEARTBEAT", "VERSION"});
  for (const v1::WorkerInfo& w : workers.workers()) {
    const bool has_job = !w.job_id().empty();
    table.AddRow({w.worker_id(), w.address(), w.node().empty() ? "-" : w.node(), w.device(),
                  absl::StrCat(w.threads()),
                  w.peak_flops() > 0 ? absl::StrFormat("%.1f", w.peak_flops() / 1e9) : "-",
                  WorkerStateName(w.state()), has_job ? w.job_id() : "-",
                  has_job ? absl::StrCat(w.stage()) : "-", FormatAge(w.heartbeat_age_seconds()),
                  w.version().empty() ? "-" : w.version()});
  }
  return table.Render();
}

// "45.0 GFLOP/s, fp32 SGEMM 768^3 on 1 thread, best of 8 samples 20ms apart, one worker of
// this host at a time (...); measured at start, 2026-12-04 12:40:01 UTC". An older worker
// sends no method: then what it measured is known, but not how.
std::string FormatPeak(const v1::WorkerInfo& w) {
  if (w.peak_flops() <= 0) return "-";
  std::string out = absl::StrFormat("%.1f GFLOP/s", w.peak_flops() / 1e9);
  absl::StrAppend(&out, ", ", w.peak_method().empty() ? "GEMM" : w.peak_method(),
                  "; measured at start");
  if (w.peak_measured_unix_ms() > 0) {
    absl::StrAppend(
        &out, ", ",
        absl::FormatTime("%Y-%m-%d %H:%M:%S UTC", absl::FromUnixMillis(w.peak_measured_unix_ms()),
                         absl::UTCTimeZone()));
  }
  return out;
}

std::string FormatWorkerDetails(const v1::WorkerInfo& w) {
  Table info({"Worker", w.worker_id()});
  info.AddRow({"Address", w.address()});
  info.AddRow({"Device", absl::StrCat(w.device(), ", ", w.threads(), " thread",
                                      w.threads() == 1 ? "" : "s")});
  if (!w.device_name().empty()) info.AddRow({"Hardware", w.device_name()});
  if (!w.device_uuid().empty()) info.AddRow({"GPU", w.device_uuid()});
  info.AddRow({"Peak", FormatPeak(w)});
  info.AddRow({"State", WorkerStateName(w.state())});
  if (!w.job_id().empty()) info.AddRow({"Job", absl::StrCat(w.job_id(), ", stage ", w.stage())});
  info.AddRow({"Heartbeat", FormatAge(w.heartbeat_age_seconds())});
  info.AddRow({"Version", w.version().empty() ? "-" : w.version()});
  if (!w.hostname().empty()) info.AddRow({"Host", w.hostname()});
  if (!w.node().empty()) info.AddRow({"Node", w.node()});
  info.AddRow({"Clock", w.clock_uncertainty_us() >= 0
                            ? absl::StrFormat("%+d us from the coordinator's (+/- %d us)",
                                              w.clock_offset_us(), w.clock_uncertainty_us())
                            : absl::StrFormat("%+d us from the coordinator's (one-way estimate)",
                                              w.clock_offset_us())});
  return info.Render();
}

std::string FormatWorkersSummary(const v1::ListWorkersResponse& workers) {
  int idle = 0, busy = 0, lost = 0;
  for (const v1::WorkerInfo& w : workers.workers()) {
    idle += w.state() == v1::IDLE;
    busy += w.state() == v1::BUSY;
    lost += w.state() == v1::LOST;
  }
  const int n = workers.workers_size();
  return absl::StrCat(n, n == 1 ? " worker" : " workers", ": ", idle, " idle, ", busy, " busy, ",
                      lost, " lost");
}

std::string FormatJobDetails(const v1::Job& job) {
  const v1::JobSpec& spec = job.spec();
  const v1::PipelineSpec& p = spec.pipeline();
  const v1::ModelSpec& m = spec.model();
  Table info({"Job", absl::StrCat(job.id(), "  ", job.name())});
  info.AddRow({"State", StateName(job.state())});
  if (!job.reason().empty()) info.AddRow({"Reason", job.reason()});
  info.AddRow({"Progress", absl::StrCat(job.steps_done(), "/", job.total_steps(), " steps  ",
                                        ProgressBar(job.steps_done(), job.total_steps(), kBarWidth),
                                        "  ", Percent(job.steps_done(), job.total_steps()), "%")});
  info.AddRow({"Last loss", job.steps_done() > 0 ? FormatLoss(job.last_loss()) : "-"});
  if (job.has_val_loss()) info.AddRow({"Val loss", FormatLoss(job.last_val_loss())});
  if (job.restarts() > 0) {
    info.AddRow({"Restarts", absl::StrCat(job.restarts(), " of ", job.spec().max_restarts(),
                                          " after faults; first cause: ", job.first_failure())});
    if (job.last_recovery_seconds() > 0) {
      info.AddRow(
          {"Recovery", absl::StrFormat("%.2f s from the latest fault to the next step; "
                                       "%.2f s in all",
                                       job.last_recovery_seconds(), job.recovery_seconds_total())});
    }
  }
  if (job.steps_redone() > 0) {
    info.AddRow({"Redone", absl::StrCat(job.steps_redone(),
                                        " steps trained again (after faults, since checkpoints)")});
  }
  if (job.peer_recoveries() > 0) {
    info.AddRow(
        {"Peer recovery", absl::StrCat(job.peer_recoveries(),
                                       " run(s) resumed from the state the workers before kept")});
  }
  if (IsElastic(spec)) {
    const v1::PipelineSpec& w = job.written_pipeline();
    info.AddRow({"Elastic",
                 absl::StrCat(spec.elastic().min_workers(), " to ", ElasticMaxWorkers(spec),
                              " workers; as written ", w.stages(), " x ", std::max(1, w.replicas()),
                              "; now ", GangSize(spec), " (", p.stages(), " x ",
                              std::max(1, p.replicas()), "); ", job.resizes_size(), " resize(s)")});
    if (job.resizes_size() > 0) {
      const v1::ResizeEvent& r = job.resizes(job.resizes_size() - 1);
      info.AddRow(
          {"Last resize",
           absl::StrCat(r.from_stages(), " x ", r.from_replicas(), " -> ", r.to_stages(), " x ",
                        r.to_replicas(), " (M ", r.to_micro_batches(), ") from ",
                        !r.state_source().empty() ? r.state_source()
                        : r.checkpoint_step() >= 0
                            ? absl::StrCat("the checkpoint after step ", r.checkpoint_step() + 1)
                            : std::string("the start"),
                        ", ", r.steps_redone(), " step(s) redone: ", r.cause())});
    }
  }
  if (job.skipped_steps() > 0) {
    info.AddRow({"Skipped", absl::StrCat(job.skipped_steps(), " steps (non-finite gradient)")});
  }
  const int64_t batch = job.effective_batch() > 0 ? job.effective_batch() : EffectiveBatch(spec);
  const int64_t tokens = job.tokens_per_step() > 0 ? job.tokens_per_step() : TokensPerStep(spec);
  const std::string replicas_x = p.replicas() > 1 ? absl::StrCat(p.replicas(), " replicas x ") : "";
  info.AddRow({"Batch", absl::StrCat(replicas_x, p.micro_batch_size(), " x ", p.micro_batches(),
                                     " = ", batch, " sequences, ", tokens,
                                     " tokens per step (the effective batch the lr applies to)")});
  const double bubble = job.bubble_fraction_ideal() > 0 || p.stages() <= 1
                            ? job.bubble_fraction_ideal()
                            : PredictedBubble(spec);
  const std::string workers = p.replicas() > 1
                                  ? absl::StrCat(p.stages(), " stages x ", p.replicas(),
                                                 " replicas = ", GangSize(spec), " workers")
                                  : absl::StrCat(p.stages(), " workers");
  info.AddRow({"Pipeline", absl::StrFormat("%s, %s, %s partition; ideal bubble %.1f%%", workers,
                                           p.schedule_csv().empty() ? p.schedule() : "csv",
                                           p.partition(), 100 * bubble)});
  if (!job.plan().empty()) info.AddRow({"Planned", job.plan()});
  if (job.predicted_step_seconds() > 0) {
    std::string predicted =
        absl::StrFormat("%s s per step (update %s s)", FormatSeconds(job.predicted_step_seconds()),
                        FormatSeconds(job.predicted_update_seconds()));
    // The planner's speed check of a cached profile (Job.profile_speed_ratio says what it did).
    if (const double r = job.profile_speed_ratio(); r > 0) {
      absl::StrAppend(&predicted, absl::StrFormat("; layers timed at x%.3f of their profile", r));
    }
    info.AddRow({"Predicted", predicted});
    // The coordinator's verdict over the steps this status carries (the recent ones).
    if (job.has_prediction_check()) info.AddRow({"Measured", job.prediction_check().summary()});
  }
  info.AddRow(
      {"Model",
       m.arch() == "gpt"
           ? absl::StrFormat("gpt  n_layer %d  n_head %d  d_model %d  seq_len %d  vocab %d%s",
                             m.n_layer(), m.n_head(), m.d_model(), m.seq_len(), m.vocab_size(),
                             m.tie_embeddings() ? "  tied" : "")
       : m.arch() == "llama"
           ? absl::StrFormat("llama  n_layer %d  n_head %d  n_kv_head %d  d_model %d  d_hidden %d  "
                             "seq_len %d  vocab %d  rope_theta %g%s",
                             m.n_layer(), m.n_head(), m.n_kv_head(), m.d_model(), m.d_hidden(),
                             m.seq_len(), m.vocab_size(), m.rope_theta(),
                             m.tie_embeddings() ? "  tied" : "")
           : absl::StrFormat("%s  n_layer %d  d_model %d  context %d  vocab %d", m.arch(),
                             m.n_layer(), m.d_model(), m.context(), m.vocab_size())});
  const v1::OptimizerSpec& o = spec.optimizer();
  info.AddRow(
      {"Optimizer", absl::StrFormat("%s  lr %g  warmup %d steps  %s  clip %g", o.name(), o.lr(),
                                    o.warmup_steps(), o.lr_schedule(), o.grad_clip())});
  if (job.checkpoint_step() >= 0 && job.created_unix_ms() > 0 && job.steps_done() > 0) {
    info.AddRow({"Checkpoint", absl::StrCat("after step ", job.checkpoint_step() + 1)});
  }
  if (job.checkpoint_failures() > 0) {
    info.AddRow({"Not stored",
                 absl::StrCat(job.checkpoint_failures(),
                              " checkpoint(s); the latest: ", job.last_checkpoint_failure())});
  }
  info.AddRow({"Created", FormatTimestamp(job.created_unix_ms())});
  if (job.started_unix_ms() > 0) info.AddRow({"Started", FormatTimestamp(job.started_unix_ms())});
  if (job.finished_unix_ms() > 0) {
    info.AddRow({"Finished", FormatTimestamp(job.finished_unix_ms())});
  }
  // The first "row" is the header of a two-column table; render without a separate header.
  std::string out = info.Render();

  if (job.stages_size() > 0) {
    // With a profile: the predicted forward + backward time per micro-batch of each stage, the
    // one the last step measured, and a flag on a stage more than 20% slower than predicted.
    const v1::StepSummary* last =
        job.history_size() > 0 ? &job.history(job.history_size() - 1) : nullptr;
    const bool predicted = job.stages(0).predicted_seconds() > 0;
    std::vector<std::string> header = {"STAGE", "WORKER", "ADDRESS", "LAYERS"};
    if (predicted) {
      for (const char* h : {"PREDICTED MS/MB", "MEASURED MS/MB"}) header.push_back(h);
    }
    // Memory: the last step's peak (static + activations) against the plan's prediction.
    const bool peaks = last != nullptr && last->stage_peak_bytes_size() == job.stages_size();
    if (predicted || peaks)
      header.push_back(predicted && peaks ? "PEAK / PREDICTED MEM" : "PEAK MEM");
    if (predicted && !peaks) header.back() = "PREDICTED MEM";
    // The last step's time per stage: in compute, in transfers, and idle (its bubble).
    const bool timed = last != nullptr && last->stage_busy_seconds_size() == job.stages_size() &&
                       last->stage_comm_seconds_size() == job.stages_size() &&
                       last->stage_idle_seconds_size() == job.stages_size();
    if (timed) header.push_back("BUSY / COMM / IDLE S");
    header.push_back("ACTIONS");
    Table stages(header);
    std::vector<std::string> slow;
    for (const v1::StageAssignment& s : job.stages()) {
      std::vector<std::string> row = {absl::StrCat(s.stage()), s.worker_id(), s.address(),
                                      LayerRangeName(m, s.layer_begin(), s.layer_end())};
      if (predicted) {
        const bool measured = last != nullptr && s.stage() < last->stage_seconds_size();
        const double got = measured ? last->stage_seconds(s.stage()) : 0.0;
        const bool flag = measured && got > 1.2 * s.predicted_seconds();
        if (flag) slow.push_back(absl::StrCat(s.stage()));
        row.push_back(absl::StrFormat("%.1f", 1000 * s.predicted_seconds()));
        row.push_back(measured ? absl::StrFormat("%.1f%s", 1000 * got, flag ? " SLOW" : "") : "-");
      }
      if (predicted || peaks) {
        std::string mem = peaks ? FormatBytes(last->stage_peak_bytes(s.stage())) : "";
        if (predicted) {
          absl::StrAppend(&mem, peaks ? " / " : "", FormatBytes(s.predicted_bytes()));
        }
        row.push_back(mem);
      }
      if (timed) {
        const int i = s.stage();
        row.push_back(absl::StrFormat("%.3f / %.3f / %.3f", last->stage_busy_seconds(i),
                                      last->stage_comm_seconds(i), last->stage_idle_seconds(i)));
      }
      row.push_back(s.actions());
      stages.AddRow(row);
    }
    absl::StrAppend(&out, "\n", stages.Render());
    // Data parallelism: the grid of workers, stage x replica, and what the reduction cost.
    if (job.stages(0).replicas_size() > 1) {
      std::vector<std::string> grid_header = {"STAGE"};
      for (const v1::ReplicaWorker& w : job.stages(0).replicas()) {
        grid_header.push_back(absl::StrCat("REPLICA ", w.replica()));
      }
      Table grid(grid_header);
      for (const v1::StageAssignment& st : job.stages()) {
        std::vector<std::string> row = {absl::StrCat(st.stage())};
        for (const v1::ReplicaWorker& w : st.replicas()) {
          row.push_back(absl::StrCat(w.worker_id(), " (", w.address(), ")"));
        }
        grid.AddRow(row);
      }
      absl::StrAppend(&out, "\nWorkers (stage x replica)\n", grid.Render());
      if (last != nullptr && last->stage_reduce_seconds_size() > 0) {
        double total = 0, exposed = 0;
        for (int i = 0; i < last->stage_reduce_seconds_size(); ++i) {
          total += last->stage_reduce_seconds(i);
          if (i < last->stage_reduce_exposed_seconds_size()) {
            exposed += last->stage_reduce_exposed_seconds(i);
          }
        }
        absl::StrAppend(
            &out,
            absl::StrFormat("Gradient reduction (latest step): %s per worker on average, %.3f s "
                            "over all stages, %.3f s of it exposed (%.0f%%)\n",
                            FormatBytes(last->reduced_bytes() / std::max(1, GangSize(spec))), total,
                            exposed, total > 0 ? 100 * exposed / total : 0.0));
      }
    }
    // What the peak is made of, per stage, on its worker's device.
    if (last != nullptr && last->stage_memory_size() == job.stages_size()) {
      Table mem({"STAGE", "PARAMETERS", "GRADIENTS", "OPTIMIZER", "WORKSPACE", "ACTIVATIONS"});
      for (const v1::StageMemory& m : last->stage_memory()) {
        mem.AddRow({absl::StrCat(m.stage()), FormatBytes(m.parameter_bytes()),
                    FormatBytes(m.gradient_bytes()), FormatBytes(m.optimizer_bytes()),
                    FormatBytes(m.workspace_bytes()), FormatBytes(m.peak_activation_bytes())});
      }
      absl::StrAppend(&out, "\nMemory per stage (latest step; activations at their peak)\n",
                      mem.Render());
    }
    if (!slow.empty()) {
      absl::StrAppend(&out, "warning: stage(s) ", absl::StrJoin(slow, ", "),
                      " ran more than 20% slower than the profile predicts (a busier or slower "
                      "worker, or a stale profile)\n");
    }
  }

  if (job.history_size() > 0) {
    // BUBBLE: the workers' measured idle share, and in brackets what the simulator predicts
    // from the same step's measured action costs.
    // UPDATE MS: the slowest worker's optimizer update and gradient-norm pass; OVERHEAD MS: what
    // the calls and the coordinator added beyond the slowest worker's time.
    Table steps({"STEP", "LOSS", "MS/STEP", "TOK/S", "MFU", "UPDATE MS", "OVERHEAD MS",
                 "BUBBLE (PREDICTED)"});
    const int first = std::max(0, job.history_size() - kRecentSteps);
    for (int i = first; i < job.history_size(); ++i) {
      const v1::StepSummary& s = job.history(i);
      steps.AddRow({absl::StrCat(StepsDone(s)), FormatLoss(s.loss()),
                    absl::StrFormat("%.1f", s.step_seconds() * 1000),
                    absl::StrFormat("%.0f", s.tokens_per_second()),
                    s.mfu() > 0 ? absl::StrFormat("%.1f%%", 100 * s.mfu()) : "-",
                    absl::StrFormat("%.1f", s.max_worker_update_seconds() * 1000),
                    absl::StrFormat("%.1f", s.coordinator_overhead_seconds() * 1000),
                    s.busy_seconds_size() == 0
                        ? "-"
                        : absl::StrFormat("%.1f%% (%.1f%%)", 100 * s.bubble_measured(),
                                          100 * s.bubble_predicted())});
    }
    absl::StrAppend(&out, "\n", steps.Render());
  }
  return out;
}

WatchPrinter::WatchPrinter(std::ostream& out, OutputFormat format, bool live)
    : out_(out), format_(format), live_(live && format == OutputFormat::kTable) {}

absl::Status WatchPrinter::OnEvent(const v1::JobEvent& event) {
  if (event.kind() == v1::JobEvent::SNAPSHOT) {
    job_name_ = event.job().name();
    state_ = event.job().state();
    reason_ = event.job().reason();
    total_steps_ = event.job().total_steps();
  }
  if (event.total_steps() > 0) total_steps_ = event.total_steps();
  if (event.kind() == v1::JobEvent::STATE) {
    state_ = event.state();
    reason_ = event.reason();
  } else if (event.kind() == v1::JobEvent::STEP && event.state() != v1::JOB_STATE_UNSPECIFIED) {
    state_ = event.state();
  }

  if (format_ == OutputFormat::kJson) {
    ASSIGN_OR_RETURN(const std::string json, ToJson(event, /*pretty=*/false));
    out_ << json << "\n";
    out_.flush();
    return absl::OkStatus();
  }

  switch (event.kind()) {
    case v1::JobEvent::SNAPSHOT: {
      v1::JobEvent as_state;
      as_state.set_job_id(event.job().id().empty() ? event.job_id() : event.job().id());
      as_state.set_state(state_);
      as_state.set_reason(reason_);
      std::string line = FormatStateLine(as_state, job_name_);
      if (event.job().steps_done() > 0) {
        absl::StrAppend(&line, " (step ", event.job().steps_done(), "/", total_steps_, ")");
      }
      PrintLine(line);
      break;
    }
    case v1::JobEvent::STEP: {
      recent_step_seconds_.push_back(event.step().step_seconds());
      if (recent_step_seconds_.size() > kRateWindow) recent_step_seconds_.pop_front();
      double sum = 0;
      for (double s : recent_step_seconds_) sum += s;
      const std::string line = FormatStepLine(
          event.step(), total_steps_, sum / static_cast<double>(recent_step_seconds_.size()));
      if (live_) {
        out_ << "\r\033[K" << line;
        line_open_ = true;
      } else {
        out_ << line << "\n";
      }
      break;
    }
    case v1::JobEvent::STATE:
      PrintLine(FormatStateLine(event, job_name_));
      break;
    case v1::JobEvent::WARNING:
      PrintLine(absl::StrCat(JobLabel(event, job_name_), ": warning: ", event.reason()));
      break;
    default:
      break;  // a newer server's event kind: nothing to show
  }
  out_.flush();
  return absl::OkStatus();
}

void WatchPrinter::Finish() {
  EndLiveLine();
  out_.flush();
}

void WatchPrinter::EndLiveLine() {
  if (line_open_) out_ << "\n";
  line_open_ = false;
}

void WatchPrinter::PrintLine(const std::string& line) {
  EndLiveLine();
  out_ << line << "\n";
}

}  // namespace tandem::cli
