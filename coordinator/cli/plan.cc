#include "coordinator/cli/plan.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/pipeline_plan.h"
#include "common/schedule_check.h"
#include "coordinator/cli/commands.h"
#include "coordinator/cli/format.h"

namespace tandem::cli {
namespace {

// Widest grid printed; wider ones are summarised (use fewer micro-batches to see them).
constexpr double kMaxGridColumns = 240;

std::string ScheduleLabel(const v1::PipelineSpec& p) {
  return p.schedule_csv().empty() ? absl::AsciiStrToLower(p.schedule()) : "csv";
}

// Peak live activations of a rank in micro-batches of a whole worker's layers: (stage,
// micro-batch) pairs divided by the stages per worker.
double PeakLiveEquivalent(const SimulationResult& sim, const Placement& placement) {
  const double v = static_cast<double>(placement.num_stages()) / placement.num_ranks;
  int peak = 0;
  for (int n : sim.peak_live_micro_batches) peak = std::max(peak, n);
  return peak / v;
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
  return absl::OkStatus();
}

absl::StatusOr<std::string> FormatPlan(const v1::JobSpec& spec, bool print_actions) {
  absl::StatusOr<PipelinePlan> plan = PlanPipeline(spec);
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
  Table stages({"STAGE", "RANK", "LAYERS"});
  for (int s = 0; s < plan->num_stages(); ++s) {
    stages.AddRow({absl::StrCat(s), absl::StrCat(placement.rank_of_stage[s]),
                   LayerRangeName(spec.model(), plan->ranges[s].begin, plan->ranges[s].end)});
  }
  absl::StrAppend(&out, stages.Render(), "\n");

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

std::string FormatScheduleComparison(const v1::JobSpec& spec) {
  Table table({"SCHEDULE", "CHUNKS", "STAGES", "STEP", "BUBBLE", "PEAK LIVE (MB-EQUIV)",
               "SENDS/STEP", "NOTE"});
  for (const std::string& name : ScheduleNames()) {
    v1::JobSpec s = spec;
    s.mutable_pipeline()->set_schedule(name);
    s.mutable_pipeline()->clear_schedule_csv();
    // A spec's chunks apply to the schedules that take a choice; others use their own.
    const int chunks = spec.pipeline().chunks();
    s.mutable_pipeline()->set_chunks(name == "interleaved_1f1b" ? chunks : 0);
    absl::StatusOr<PipelinePlan> plan = PlanPipeline(s);
    if (!plan.ok()) {
      table.AddRow({name, "-", "-", "-", "-", "-", "-",
                    absl::StrCat("does not fit: ", plan.status().message())});
      continue;
    }
    absl::StatusOr<SimulationResult> sim =
        SimulateSchedule(plan->schedule, UnitCosts(plan->schedule.placement));
    if (!sim.ok()) {
      table.AddRow({name, "-", "-", "-", "-", "-", "-", std::string(sim.status().message())});
      continue;
    }
    const int v = plan->num_stages() / plan->num_ranks();
    table.AddRow({name, absl::StrCat(v), absl::StrCat(plan->num_stages()),
                  absl::StrFormat("%.2f", sim->step_time),
                  absl::StrFormat("%.1f%%", 100 * sim->bubble_fraction),
                  absl::StrFormat("%.1f", PeakLiveEquivalent(*sim, plan->schedule.placement)),
                  absl::StrCat(CountSends(plan->schedule.program))});
  }
  return absl::StrCat(
      "Predicted with unit costs (a worker's forward 1, backward 2; transfers free). PEAK "
      "LIVE: the most micro-batches of a worker's activations held at once; SENDS: activations "
      "and gradients sent between workers per step.\n",
      table.Render());
}

}  // namespace tandem::cli
