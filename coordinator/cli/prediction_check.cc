#include "coordinator/cli/prediction_check.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/median.h"
#include "coordinator/cli/format.h"

namespace tandem::cli {
namespace {

bool Within(double got, double want) {
  return want > 0 && std::abs(got / want - 1) <= kPredictionTolerance;
}

}  // namespace

std::optional<PredictionCheck> CheckPrediction(const v1::Job& job) {
  if (job.predicted_step_seconds() <= 0) return std::nullopt;
  std::vector<const v1::StepSummary*> steady;
  for (const v1::StepSummary& s : job.history()) {
    if (s.step() == 0 || s.step() == job.first_step()) continue;                 // warms up
    if (IsTerminal(job.state()) && StepsDone(s) == job.total_steps()) continue;  // own update
    if (s.has_val_loss() || s.step_seconds() <= 0) continue;
    steady.push_back(&s);
  }
  if (steady.size() < 2) return std::nullopt;

  PredictionCheck c;
  c.steps = static_cast<int>(steady.size());
  c.first_step = StepsDone(*steady.front());
  c.last_step = StepsDone(*steady.back());
  c.predicted = job.predicted_step_seconds();
  c.replicated = job.spec().pipeline().replicas() > 1;
  std::vector<double> step, exec, replayed;
  for (const v1::StepSummary* s : steady) {
    step.push_back(s->step_seconds());
    exec.push_back(s->max_worker_exec_seconds());
    if (s->exec_replayed_seconds() > 0) replayed.push_back(s->exec_replayed_seconds());
  }
  c.measured = Median(step);
  c.pipeline_measured = Median(exec);
  // Replayed only where every steady step has it: a median over some steps set against one
  // over all would compare different steps.
  if (replayed.size() == steady.size()) c.pipeline_replayed = Median(replayed);

  // Per stage: its measured forward + backward per micro-batch (the median over the steady
  // steps) over what the profile predicted for it.
  bool first = true;
  for (int i = 0; i < job.stages_size(); ++i) {
    const double want = job.stages(i).predicted_seconds();
    std::vector<double> got;
    for (const v1::StepSummary* s : steady) {
      if (i < s->stage_seconds_size() && s->stage_seconds(i) > 0) {
        got.push_back(s->stage_seconds(i));
      }
    }
    if (want <= 0 || got.size() != steady.size()) {
      c.stage_ratio_low = c.stage_ratio_high = 0;
      break;
    }
    const double r = Median(got) / want;
    c.stage_ratio_low = first ? r : std::min(c.stage_ratio_low, r);
    c.stage_ratio_high = first ? r : std::max(c.stage_ratio_high, r);
    first = false;
  }
  return c;
}

std::string FormatPredictionCheck(const PredictionCheck& c) {
  const std::string steps = c.first_step == c.last_step
                                ? absl::StrCat("step ", c.first_step)
                                : absl::StrCat("steps ", c.first_step, "-", c.last_step);
  std::string out = absl::StrFormat("%.3f s per step, median of %s: x%.3f the prediction",
                                    c.measured, steps, c.measured / c.predicted);
  const int tolerance = static_cast<int>(std::lround(100 * kPredictionTolerance));
  if (Within(c.measured, c.predicted)) {
    absl::StrAppend(&out, absl::StrFormat(" (within %d%%)", tolerance));
    return out;
  }
  // Off: whose miss is it? The schedule's, if replaying it on the steps' own action costs does
  // not give the pipeline phase it measured; the costs', if the stages ran off their profile.
  const bool replayed = c.pipeline_replayed > 0 && c.pipeline_measured > 0;
  const bool schedule_ok = replayed && Within(c.pipeline_measured, c.pipeline_replayed);
  const bool stages = c.stage_ratio_low > 0;
  const bool costs_off = stages && (c.stage_ratio_low < 1 - kPredictionTolerance ||
                                    c.stage_ratio_high > 1 + kPredictionTolerance);
  if (replayed) {
    absl::StrAppend(
        &out, absl::StrFormat("; the schedule replayed on those steps' own costs %.2f s against "
                              "%.2f s measured (%s)",
                              c.pipeline_replayed, c.pipeline_measured,
                              schedule_ok ? absl::StrFormat("within %d%%", tolerance)
                                          : absl::StrFormat("x%.3f", c.pipeline_measured /
                                                                         c.pipeline_replayed)));
  }
  if (stages) {
    absl::StrAppend(
        &out,
        c.stage_ratio_high - c.stage_ratio_low < 0.0005
            ? absl::StrFormat(", the stages ran x%.3f of their predicted times", c.stage_ratio_low)
            : absl::StrFormat(", the stages ran x%.3f-%.3f of their predicted times",
                              c.stage_ratio_low, c.stage_ratio_high));
  }
  if (replayed && !schedule_ok) {
    absl::StrAppend(&out, c.replicated
                              ? ": the time went to the schedule beyond its compute (waits, "
                                "transfers, the gradient reduction, per-action overheads)"
                              : ": the time went to the schedule beyond its compute (waits, "
                                "transfers, per-action overheads)");
    if (costs_off) absl::StrAppend(&out, ", and the costs moved");
  } else if (costs_off) {
    absl::StrAppend(&out, replayed ? ": the costs moved, not the schedule (a busier or slower "
                                     "host, or a stale profile)"
                                   : ": the costs moved (a busier or slower host, or a stale "
                                     "profile)");
  } else if (replayed && stages) {
    absl::StrAppend(&out, ": neither the schedule nor the stages: the update or the calls");
  }
  return out;
}

}  // namespace tandem::cli
