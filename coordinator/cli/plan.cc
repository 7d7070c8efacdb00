#include "coordinator/cli/plan.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/link_model.h"
#include "common/pipeline_plan.h"
#include "common/planner.h"
#include "common/schedule_check.h"
#include "common/spec.h"
#include "coordinator/cli/commands.h"
#include "coordinator/cli/format.h"

namespace tandem::cli {
namespace {

// Widest grid printed; wider ones are summarised (use fewer micro-batches to see them).
constexpr double kMaxGridColumns = 240;

std::string ScheduleLabel(const v1::PipelineSpec& p) {
  return p.schedule_csv().empty() ? absl::AsciiStrToLower(p.schedule()) : "csv";
}

// The textbook bubble of the flush schedules, where there is one.
std::string FormulaNote(const std::string& schedule, const PipelinePlan& plan) {
  const int p = plan.num_ranks();
  const int m = plan.schedule.num_micro_batches;
  const int v = plan.num_stages() / p;
  if (schedule == "gpipe" || schedule == "1f1b") {
    return absl::StrFormat(" (formula (P-1)/(M+P-1) = %.1f%%)", 100 * IdealBubbleFraction(p, m));
  }
  if (schedule == "interleaved_1f1b") {
    return absl::StrFormat(" (formula (P-1)/(vM+P-1) = %.1f%%)",
                           100 * IdealBubbleFraction(p, m, v));
  }
  return "";
}

int CountSends(const Program& program) {
  int n = 0;
  for (const auto& rank : program) {
    for (const Action& a : rank) {
      n += a.kind == v1::ACTION_SEND_F || a.kind == v1::ACTION_SEND_B;
    }
  }
  return n;
}

// The schedule (and chunks) with the shortest predicted step for this job as written (same
// micro-batches, so the same training), among those that fit its layers and memory budget.
std::string Recommendation(const v1::JobSpec& spec, const PipelinePlan& plan,
                           const v1::ModelProfile& profile) {
  std::string best_name;
  int best_chunks = 0;
  double best = 0.0;
  for (const std::string& name : AllScheduleNames()) {
    for (int chunks :
         name == "interleaved_1f1b" ? std::vector<int>{2, 3, 4} : std::vector<int>{0}) {
      v1::JobSpec s = WithSchedule(spec, name, chunks);
      if (s.pipeline().partition() == "manual") s.mutable_pipeline()->set_partition("profile");
      absl::StatusOr<PipelinePlan> p = PlanPipeline(s, &profile);
      if (!p.ok() || p->predicted_step_seconds <= 0) continue;
      if (best_name.empty() || p->predicted_step_seconds < best) {
        best = p->predicted_step_seconds;
        best_name = name;
        best_chunks = p->num_stages() / p->num_ranks();
      }
    }
  }
  if (best_name.empty()) return "";
  const std::string current = ScheduleLabel(spec.pipeline());
  if (best_name == current && best_chunks == plan.num_stages() / plan.num_ranks()) {
    return absl::StrFormat("Recommendation: keep %s: no schedule is predicted faster here\n",
                           current);
  }
  return absl::StrFormat(
      "Recommendation: schedule %s%s is predicted %.3f s per step (%.2fx the plan's %.3f s), "
      "with the same micro-batches: `--schedule %s%s`\n",
      best_name, best_chunks > 1 ? absl::StrCat(" with ", best_chunks, " chunks") : "", best,
      plan.predicted_step_seconds / best, plan.predicted_step_seconds, best_name,
      best_chunks > 1 && best_name == "interleaved_1f1b" ? absl::StrCat(" --chunks ", best_chunks)
                                                         : "");
}

// The figures of a plan made with a measured profile: predicted step and bubble, the uniform
// cut for comparison, communication per step at the cuts, and the planner's warnings.
std::string ProfiledFigures(const v1::JobSpec& spec, const PipelinePlan& plan,
                            const v1::ModelProfile& profile, double slowest, double fastest) {
  const v1::PipelineSpec& p = spec.pipeline();
  std::string out = absl::StrFormat(
      "Predicted from the measured profile (%s, %d thread%s): step %.3f s, bubble %.1f%%, "
      "slowest stage %.1f ms per micro-batch\n",
      profile.device(), profile.threads(), profile.threads() == 1 ? "" : "s",
      plan.predicted_step_seconds, 100 * plan.predicted_bubble, 1000 * slowest);
  absl::StrAppend(&out, "  cut: ", plan.partition, "\n");
  if (p.recompute() == "auto") {
    std::vector<std::string> which;
    for (size_t s = 0; s < plan.recompute_stages.size(); ++s) {
      if (plan.recompute_stages[s]) which.push_back(absl::StrCat(s));
    }
    absl::StrAppend(&out, "  recompute auto: ",
                    which.empty() ? std::string("no stage (the plan fits without)")
                                  : absl::StrCat("stage", which.size() == 1 ? " " : "s ",
                                                 absl::StrJoin(which, ", "), " of ",
                                                 plan.recompute_stages.size(),
                                                 " (the rest fit memory_budget_mb without)"),
                    "\n");
  }
  if (plan.recomputes() || plan.recompute_dropped > 0) {
    int total = 0;
    for (const auto& list : plan.schedule.program) {
      for (const Action& a : list) total += a.kind == v1::ACTION_R ? 1 : 0;
    }
    absl::StrAppendFormat(&out,
                          "  recomputation: %d of %d R's dropped (memory holds their "
                          "micro-batches' activations), %d placed in idle time (ahead of a "
                          "wait), the rest inside their backwards, layer by layer%s\n",
                          plan.recompute_dropped, total + plan.recompute_dropped,
                          plan.recompute_moved,
                          p.memory_budget_mb() > 0 ? " (within memory_budget_mb)"
                                                   : " (no budget: within the plain peak)");
  }
  // When and on what the profile was measured: the coordinator measures one again once it is
  // older than its --profile-max-age.
  if (profile.created_unix_ms() > 0 || !profile.device_name().empty()) {
    absl::StrAppend(
        &out, "  profile: measured",
        profile.created_unix_ms() > 0
            ? absl::StrCat(" ", FormatTimestamp(profile.created_unix_ms()))
            : std::string(),
        profile.device_name().empty() ? std::string() : absl::StrCat(" on ", profile.device_name()),
        "\n");
  }
  // An old profile is timed again before it prices the plan, as before a job
  // (coordinator --profile-speed-check): what that found.
  if (!profile.speed_check().empty()) {
    absl::StrAppend(&out, "  speed check: ", profile.speed_check(), "\n");
  }
  if (profile.has_link()) {
    const v1::LinkProfile& link = profile.link();
    const int64_t activation = profile.layers(0).output_bytes();
    absl::StrAppendFormat(
        &out, "  link %s <-> %s: latency %.1f us, %s; one activation (%.1f KiB) %.2f ms each way\n",
        link.worker_a(), link.worker_b(), 1e6 * link.latency_seconds(),
        link.seconds_per_byte() > 0 ? absl::StrFormat("%.2f GB/s", 1e-9 / link.seconds_per_byte())
                                    : std::string("bandwidth not resolved"),
        activation / 1024.0, 1000 * TransferSeconds(link, activation));
  } else {
    absl::StrAppend(&out, "  link: not measured (transfers planned as free)\n");
  }
  if (p.partition() != "uniform") {
    if (absl::StatusOr<PipelinePlan> u = PlanPipeline(WithUniformCut(spec), &profile); u.ok()) {
      double u_slowest = 0.0;
      for (const ActionCosts& c : u->stage_costs) {
        u_slowest = std::max(u_slowest, c.forward + c.backward);
      }
      absl::StrAppendFormat(&out,
                            "  the uniform cut: step %.3f s, slowest stage %.1f ms: this %s cut "
                            "is predicted %.2fx faster\n",
                            u->predicted_step_seconds, 1000 * u_slowest, p.partition(),
                            plan.predicted_step_seconds > 0
                                ? u->predicted_step_seconds / plan.predicted_step_seconds
                                : 0.0);
    }
  }
  // Each cut between workers carries every micro-batch's activation forward and its gradient
  // back (the source document's count).
  int64_t bytes = 0;
  int cuts = 0;
  for (int s = 0; s + 1 < plan.num_stages(); ++s) {
    if (plan.schedule.placement.rank_of_stage[s] == plan.schedule.placement.rank_of_stage[s + 1]) {
      continue;
    }
    ++cuts;
    bytes += 2 * int64_t{p.micro_batches()} * profile.layers(plan.ranges[s].end - 1).output_bytes();
  }
  absl::StrAppendFormat(&out,
                        "Communication per step: %d cut%s x %d micro-batches x (activation + "
                        "gradient) = %.1f MiB\n",
                        cuts, cuts == 1 ? "" : "s", p.micro_batches(), bytes / 1048576.0);
  // The source document's comparison: tensor parallelism all-reduces 4 activations per block.
  if (spec.model().n_layer() > 0 && profile.layers_size() > 2 && bytes > 0) {
    const int64_t tp =
        int64_t{4} * spec.model().n_layer() * p.micro_batches() * profile.layers(1).output_bytes();
    absl::StrAppendFormat(&out,
                          "  (tensor parallelism would all-reduce 4 activations per block: %d "
                          "blocks x 4 x %.1f MiB = %.1f MiB per step, %.0fx more)\n",
                          spec.model().n_layer(),
                          p.micro_batches() * profile.layers(1).output_bytes() / 1048576.0,
                          tp / 1048576.0, static_cast<double>(tp) / bytes);
  }
  absl::StrAppendFormat(&out,
                        "Effective batch: %d x %d = %d sequences; the learning rate applies to "
                        "it (changing micro_batches changes the batch: retune lr)\n",
                        p.micro_batch_size(), p.micro_batches(),
                        p.micro_batch_size() * p.micro_batches());
  std::vector<std::string> warnings;
  if (p.micro_batches() < 4 * plan.num_ranks()) {
    warnings.push_back(absl::StrFormat(
        "micro_batches %d < 4 x %d workers: the bubble is large (the rule of thumb is M >= 4P, "
        "8P better)",
        p.micro_batches(), plan.num_ranks()));
  }
  if (fastest > 0 && slowest > 1.1 * fastest) {
    warnings.push_back(absl::StrFormat(
        "stages imbalanced by %.0f%% (slowest %.1f ms vs fastest %.1f ms per micro-batch)%s",
        100 * (slowest / fastest - 1), 1000 * slowest, 1000 * fastest,
        p.partition() == "profile" ? "" : "; partition: profile balances measured time"));
  }
  for (const std::string& w : warnings) absl::StrAppend(&out, "warning: ", w, "\n");
  absl::StrAppend(&out, Recommendation(spec, plan, profile));
  return out;
}

}  // namespace

absl::Status ApplyScheduleOverrides(const CliOptions& opts, v1::JobSpec& spec) {
  v1::PipelineSpec* p = spec.mutable_pipeline();
  if (!opts.schedule.empty()) {
    p->set_schedule(opts.schedule);
    p->clear_schedule_csv();
  }
  if (!opts.schedule_csv.empty()) {
    absl::StatusOr<std::string> csv = ReadJobFile(opts.schedule_csv);
    if (!csv.ok()) {
      return absl::Status(csv.status().code(),
                          absl::StrCat("--schedule-csv: ", csv.status().message()));
    }
    p->set_schedule_csv(*csv);
  }
  if (opts.chunks >= 0) p->set_chunks(opts.chunks);
  if (opts.auto_plan) p->set_plan("auto");
  return absl::OkStatus();
}

absl::StatusOr<std::string> FormatPlan(const v1::JobSpec& spec, bool print_actions,
                                       const v1::ModelProfile* profile) {
  absl::StatusOr<PipelinePlan> plan = PlanPipeline(spec, profile);
  if (!plan.ok()) return plan.status();
  const Placement& placement = plan->schedule.placement;
  const ActionCosts costs = UnitCosts(placement);
  absl::StatusOr<SimulationResult> sim = SimulateSchedule(plan->schedule, costs);
  if (!sim.ok()) return sim.status();
  const v1::PipelineSpec& p = spec.pipeline();
  const std::string schedule = ScheduleLabel(p);
  const int v = plan->num_stages() / plan->num_ranks();

  std::string out = absl::StrFormat(
      "Job %s: %d worker%s, schedule %s, %d stage%s (%d per worker), %d micro-batches of %d "
      "sequences\n\n",
      spec.name(), plan->num_ranks(), plan->num_ranks() == 1 ? "" : "s", schedule,
      plan->num_stages(), plan->num_stages() == 1 ? "" : "s", v, p.micro_batches(),
      p.micro_batch_size());
  const bool measured = !plan->stage_costs.empty();
  std::vector<std::string> header = {"STAGE", "RANK", "LAYERS"};
  if (measured) {
    for (const char* h : {"F MS/MB", "B MS/MB", "MEMORY"}) header.push_back(h);
  }
  Table stages(header);
  double slowest = 0.0, fastest = 0.0;
  for (int s = 0; s < plan->num_stages(); ++s) {
    std::vector<std::string> row = {
        absl::StrCat(s), absl::StrCat(placement.rank_of_stage[s]),
        LayerRangeName(spec.model(), plan->ranges[s].begin, plan->ranges[s].end)};
    if (measured) {
      const ActionCosts& c = plan->stage_costs[s];
      row.push_back(absl::StrFormat("%.1f", 1000 * c.forward));
      row.push_back(absl::StrFormat("%.1f", 1000 * c.backward));
      row.push_back(absl::StrFormat("%.1f MiB", plan->stage_bytes[s] / 1048576.0));
      const double t = c.forward + c.backward;
      slowest = s == 0 ? t : std::max(slowest, t);
      fastest = s == 0 ? t : std::min(fastest, t);
    }
    stages.AddRow(row);
  }
  absl::StrAppend(&out, stages.Render(), "\n");
  if (measured) {
    absl::StrAppend(&out, ProfiledFigures(spec, *plan, *profile, slowest, fastest), "\n");
  }

  absl::StrAppendFormat(&out,
                        "Predicted with unit costs (a worker's forward 1, backward 2 = input 1 + "
                        "weights 1; transfers free):\n  step %.2f, bubble %.1f%%%s\n",
                        sim->step_time, 100 * sim->bubble_fraction, FormulaNote(schedule, *plan));
  Table ranks({"RANK", "BUSY", "IDLE", "PEAK LIVE (STAGE, MB)"});
  for (int r = 0; r < plan->num_ranks(); ++r) {
    ranks.AddRow({absl::StrCat(r), absl::StrFormat("%.2f", sim->busy[r]),
                  absl::StrFormat("%.2f", sim->idle[r]),
                  absl::StrCat(sim->peak_live_micro_batches[r])});
  }
  absl::StrAppend(&out, ranks.Render(), "\n");

  const double unit = costs.forward;
  const double columns = sim->step_time / unit;
  if (columns <= kMaxGridColumns) {
    absl::StrAppend(&out, "Timestep grid (one column per stage forward; . idle):\n",
                    TimestepGrid(plan->schedule.program, *sim, unit), "\n");
  } else {
    absl::StrAppendFormat(&out,
                          "Timestep grid omitted: %.0f columns (plan with fewer micro-batches to "
                          "see its shape).\n",
                          columns);
  }
  if (print_actions) {
    absl::StrAppend(&out, "\nActions per rank (lowered):\n");
    for (int r = 0; r < plan->num_ranks(); ++r) {
      absl::StrAppend(&out, "  rank ", r, ": ", ActionsToString(plan->schedule.program[r]), "\n");
    }
  }
  return out;
}

std::string FormatPlannerSearch(const v1::JobSpec& spec,
                                const std::vector<PlanCandidate>& candidates,
                                double as_written_step_seconds, int max_rows) {
  const v1::PipelineSpec& p = spec.pipeline();
  const int64_t batch = EffectiveBatch(spec);
  const int workers = GangSize(spec);
  std::string out = absl::StrFormat(
      "Planner: %d worker%s as stages x replicas, the global batch of %d sequences split every "
      "way (a profile per micro-batch size; the same gradient for every split):\n",
      workers, workers == 1 ? "" : "s", batch);
  Table table({"STAGES x REPLICAS", "SCHEDULE", "CHUNKS", "M x SIZE", "STEP", "TOKENS/S", "BUBBLE",
               "REDUCE EXPOSED", "SLOWEST STAGE", "PEAK WORKER MEMORY"});
  int shown = 0, infeasible = 0;
  for (const PlanCandidate& c : candidates) {
    if (!c.status.ok()) {
      ++infeasible;
      continue;
    }
    if (shown++ >= max_rows) continue;
    table.AddRow({absl::StrCat(c.stages, " x ", c.replicas), c.schedule, absl::StrCat(c.chunks),
                  absl::StrCat(c.micro_batches, " x ", c.micro_batch_size),
                  absl::StrFormat("%.3f s", c.step_seconds),
                  absl::StrFormat("%.0f", c.tokens_per_second),
                  absl::StrFormat("%.1f%%", 100 * c.bubble),
                  c.replicas > 1 ? absl::StrFormat("%.3f s", c.reduce_exposed_seconds) : "-",
                  absl::StrFormat("%.1f ms", 1000 * c.slowest_stage_seconds),
                  absl::StrFormat("%.1f MiB", c.peak_stage_bytes / 1048576.0)});
  }
  absl::StrAppend(&out, table.Render());
  if (shown > max_rows) absl::StrAppend(&out, "  ... and ", shown - max_rows, " slower\n");
  if (infeasible > 0) {
    // Name the first reason of each kind once.
    const PlanCandidate* budget = nullptr;
    const PlanCandidate* other = nullptr;
    for (const PlanCandidate& c : candidates) {
      if (c.status.ok()) continue;
      if (c.status.code() == absl::StatusCode::kResourceExhausted) {
        if (budget == nullptr) budget = &c;
      } else if (other == nullptr) {
        other = &c;
      }
    }
    absl::StrAppendFormat(&out, "  %d candidate%s do not fit", infeasible,
                          infeasible == 1 ? "" : "s");
    if (budget != nullptr) {
      absl::StrAppendFormat(&out, "; e.g. %s with %d x %d is over the memory budget",
                            budget->schedule, budget->micro_batches, budget->micro_batch_size);
    }
    if (other != nullptr) {
      absl::StrAppendFormat(&out, "; %s with %d x %d: %s", other->schedule, other->micro_batches,
                            other->micro_batch_size, other->status.message());
    }
    absl::StrAppend(&out, "\n");
  }
  absl::StatusOr<PlanCandidate> best = ChoosePlan(candidates);
  if (!best.ok()) {
    absl::StrAppend(&out, "Planner: ", best.status().message(), "\n");
    return out;
  }
  absl::StrAppend(&out, "Planner's choice: ", DescribeChoice(*best, as_written_step_seconds), "\n");
  if (const std::string why = DescribeFactorizations(candidates); !why.empty()) {
    absl::StrAppend(&out, "  ", why, "\n");
  }
  const bool other_factorization = best->stages != p.stages() || best->replicas != p.replicas();
  if (other_factorization && p.plan() != "auto") {
    absl::StrAppendFormat(&out, "  it splits the %d workers as pipeline.stages: %d, replicas: %d\n",
                          workers, best->stages, best->replicas);
  }
  if (p.plan() == "auto") {
    absl::StrAppend(&out, "  pipeline.plan is auto: the coordinator runs this choice.\n");
  } else if (best->micro_batches == p.micro_batches()) {
    absl::StrAppendFormat(
        &out,
        "  it keeps the spec's split; run it with `--auto` (pipeline.plan: auto) or "
        "`--schedule %s%s`\n",
        best->schedule,
        best->schedule == "interleaved_1f1b" ? absl::StrCat(" --chunks ", best->chunks) : "");
  } else {
    absl::StrAppendFormat(
        &out,
        "  run it with `--auto` (pipeline.plan: auto), or set schedule: %s%s, "
        "micro_batch_size: %d, micro_batches: %d\n",
        best->schedule,
        best->schedule == "interleaved_1f1b" ? absl::StrCat(", chunks: ", best->chunks) : "",
        best->micro_batch_size, best->micro_batches);
  }
  if (best->stages > 1 && best->micro_batches < 4 * best->stages) {
    absl::StrAppendFormat(&out,
                          "warning: the choice has micro_batches %d < 4 x %d stages: the global "
                          "batch is too small to hide the bubble (the rule of thumb is M >= 4P, 8P "
                          "better); a larger batch would pipeline better\n",
                          best->micro_batches, best->stages);
  }
  return out;
}

std::string FormatScheduleComparison(const v1::JobSpec& spec, const v1::ModelProfile* profile) {
  Table table({"SCHEDULE", "CHUNKS", "STAGES", "STEP", "BUBBLE", "PEAK LIVE PER RANK",
               profile != nullptr ? "PEAK MEM" : "", "SENDS/STEP", "NOTE"});
  // Every schedule Tandem generates; the rows are made first, the fastest that fits marked.
  std::vector<std::vector<std::string>> rows;
  int fastest = -1;
  double fastest_step = 0.0;
  for (const std::string& name : AllScheduleNames()) {
    // A spec's chunks apply to the schedules that take a choice; others use their own.
    const v1::JobSpec s =
        WithSchedule(spec, name, TakesChunks(name) ? spec.pipeline().chunks() : 0);
    absl::StatusOr<PipelinePlan> plan = PlanPipeline(s, profile);
    if (!plan.ok()) {
      rows.push_back({name, "-", "-", "-", "-", "-", "-", "-",
                      absl::StrCat("does not fit: ", plan.status().message())});
      continue;
    }
    absl::StatusOr<SimulationResult> sim =
        SimulateSchedule(plan->schedule, UnitCosts(plan->schedule.placement));
    if (!sim.ok()) {
      rows.push_back(
          {name, "-", "-", "-", "-", "-", "-", "-", std::string(sim.status().message())});
      continue;
    }
    const int v = plan->num_stages() / plan->num_ranks();
    const bool timed = plan->predicted_step_seconds > 0;
    const double step = timed ? plan->predicted_step_seconds : sim->step_time;
    // Per rank: the most micro-batches of its activations held at once (in whole-stage units:
    // a chunk's micro-batch counts 1/v).
    std::vector<std::string> live;
    for (int n : sim->peak_live_micro_batches) {
      live.push_back(absl::StrFormat("%g", static_cast<double>(n) / v));
    }
    int64_t peak_bytes = 0;  // the fullest worker's, its stages' together
    for (int64_t b : WorkerBytes(*plan)) peak_bytes = std::max(peak_bytes, b);
    if (fastest < 0 || step < fastest_step) {
      fastest = static_cast<int>(rows.size());
      fastest_step = step;
    }
    rows.push_back(
        {name, absl::StrCat(v), absl::StrCat(plan->num_stages()),
         timed ? absl::StrFormat("%.3f s", step) : absl::StrFormat("%.2f", step),
         absl::StrFormat("%.1f%%", 100 * (timed ? plan->predicted_bubble : sim->bubble_fraction)),
         absl::StrJoin(live, " "),
         profile != nullptr ? absl::StrFormat("%.1f MiB", peak_bytes / 1048576.0) : "",
         absl::StrCat(CountSends(plan->schedule.program)), ""});
  }
  if (fastest >= 0) {
    rows[fastest].back() =
        spec.pipeline().memory_budget_mb() > 0 ? "fastest within memory_budget_mb" : "fastest";
  }
  for (std::vector<std::string>& row : rows) table.AddRow(std::move(row));
  return absl::StrCat(
      profile != nullptr
          ? absl::StrFormat("Predicted from the measured profile (%s, %d threads; transfers "
                            "free). ",
                            profile->device(), profile->threads())
          : "Predicted with unit costs (a worker's forward 1, backward 2; transfers free). ",
      "PEAK LIVE PER RANK: the most micro-batches of each worker's activations held at once "
      "(a chunk's count 1/chunks); PEAK MEM: the fullest worker's predicted bytes (its stages "
      "together); SENDS: "
      "activations and gradients sent between workers per step. Schedules that do not fit "
      "the job (its micro-batches, layers or memory_budget_mb) say why.\n",
      table.Render());
}

}  // namespace tandem::cli
