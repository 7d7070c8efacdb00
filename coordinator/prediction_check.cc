#include "coordinator/prediction_check.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/format_seconds.h"
#include "common/median.h"
#include "coordinator/job_store.h"

namespace tandem::coordinator {
namespace {

bool Within(double got, double want) {
  return want > 0 && std::abs(got / want - 1) <= kPredictionTolerance;
}

bool Replayed(const v1::PredictionCheck& c) {
  return c.pipeline_replayed_seconds() > 0 && c.pipeline_measured_seconds() > 0;
}

bool ScheduleOk(const v1::PredictionCheck& c) {
  return Replayed(c) && Within(c.pipeline_measured_seconds(), c.pipeline_replayed_seconds());
}

// Replayed with the messages at their measured flights, the schedule gives the pipeline time.
bool FlightsExplain(const v1::PredictionCheck& c) {
  return c.pipeline_flights_seconds() > 0 &&
         Within(c.pipeline_measured_seconds(), c.pipeline_flights_seconds());
}

bool CostsOff(const v1::PredictionCheck& c) {
  return c.stage_ratio_low() > 0 && (c.stage_ratio_low() < 1 - kPredictionTolerance ||
                                     c.stage_ratio_high() > 1 + kPredictionTolerance);
}

}  // namespace

std::optional<v1::PredictionCheck> CheckPrediction(
    const v1::Job& job, const std::vector<const v1::StepSummary*>& steps) {
  if (job.predicted_step_seconds() <= 0) return std::nullopt;
  std::vector<const v1::StepSummary*> steady;
  for (const v1::StepSummary* s : steps) {
    if (s->step() == 0 || s->step() == job.first_step()) continue;                // warms up
    if (IsTerminal(job.state()) && s->step() + 1 == job.total_steps()) continue;  // own update
    if (s->has_val_loss() || s->step_seconds() <= 0) continue;
    steady.push_back(s);
  }
  if (steady.size() < 2) return std::nullopt;

  v1::PredictionCheck c;
  c.set_steps(static_cast<int>(steady.size()));
  c.set_first_step(steady.front()->step());
  c.set_last_step(steady.back()->step());
  c.set_predicted_seconds(job.predicted_step_seconds());
  c.set_tolerance(kPredictionTolerance);
  c.set_replicated(job.spec().pipeline().replicas() > 1);
  std::vector<double> step, exec, replayed, flown;
  for (const v1::StepSummary* s : steady) {
    step.push_back(s->step_seconds());
    exec.push_back(s->max_worker_exec_seconds());
    if (s->exec_replayed_seconds() > 0) replayed.push_back(s->exec_replayed_seconds());
    if (s->exec_replayed_flights_seconds() > 0) flown.push_back(s->exec_replayed_flights_seconds());
  }
  c.set_measured_seconds(Median(step));
  c.set_pipeline_measured_seconds(Median(exec));
  // Replayed only where every steady step has it: a median over some steps set against one
  // over all would compare different steps.
  if (replayed.size() == steady.size()) c.set_pipeline_replayed_seconds(Median(replayed));
  if (flown.size() == steady.size()) c.set_pipeline_flights_seconds(Median(flown));

  // Per stage that sends: its messages' measured flight (the median over the steady steps that
  // measured one) over the price the plan put on them.
  bool any_flight = false;
  double flight_low = 0, flight_high = 0;
  for (int i = 0; i < job.stages_size(); ++i) {
    const double price = job.stages(i).predicted_transfer_seconds();
    std::vector<double> got;
    for (const v1::StepSummary* s : steady) {
      if (i < s->stage_flight_seconds_size() && s->stage_flight_seconds(i) > 0) {
        got.push_back(s->stage_flight_seconds(i));
      }
    }
    if (price <= 0 || got.empty()) continue;
    const double r = Median(got) / price;
    flight_low = any_flight ? std::min(flight_low, r) : r;
    flight_high = any_flight ? std::max(flight_high, r) : r;
    any_flight = true;
  }
  c.set_flight_ratio_low(flight_low);
  c.set_flight_ratio_high(flight_high);

  // Per stage: its measured forward + backward per micro-batch (the median over the steady
  // steps) over what the profile predicted for it.
  double low = 0, high = 0;
  for (int i = 0; i < job.stages_size(); ++i) {
    const double want = job.stages(i).predicted_seconds();
    std::vector<double> got;
    for (const v1::StepSummary* s : steady) {
      if (i < s->stage_seconds_size() && s->stage_seconds(i) > 0) {
        got.push_back(s->stage_seconds(i));
      }
    }
    if (want <= 0 || got.size() != steady.size()) {
      low = high = 0;
      break;
    }
    const double r = Median(got) / want;
    low = i == 0 ? r : std::min(low, r);
    high = i == 0 ? r : std::max(high, r);
  }
  c.set_stage_ratio_low(low);
  c.set_stage_ratio_high(high);
  c.set_miss(MissOf(c));
  c.set_summary(FormatPredictionCheck(c));
  return c;
}

std::optional<v1::PredictionCheck> CheckPrediction(const v1::Job& job) {
  std::vector<const v1::StepSummary*> steps;
  for (const v1::StepSummary& s : job.history()) steps.push_back(&s);
  return CheckPrediction(job, steps);
}

v1::PredictionMiss MissOf(const v1::PredictionCheck& c) {
  if (Within(c.measured_seconds(), c.predicted_seconds())) return v1::PREDICTION_WITHIN;
  const bool schedule_off = Replayed(c) && !ScheduleOk(c);
  if (schedule_off && FlightsExplain(c)) {
    return CostsOff(c) ? v1::PREDICTION_MISS_TRANSFERS_AND_COSTS : v1::PREDICTION_MISS_TRANSFERS;
  }
  if (schedule_off) {
    return CostsOff(c) ? v1::PREDICTION_MISS_SCHEDULE_AND_COSTS : v1::PREDICTION_MISS_SCHEDULE;
  }
  if (CostsOff(c)) return v1::PREDICTION_MISS_COSTS;
  return Replayed(c) && c.stage_ratio_low() > 0 ? v1::PREDICTION_MISS_UPDATE_OR_CALLS
                                                : v1::PREDICTION_MISS_UNKNOWN;
}

std::string MissName(v1::PredictionMiss miss) {
  switch (miss) {
    case v1::PREDICTION_WITHIN:
      return "";
    case v1::PREDICTION_MISS_SCHEDULE:
      return "schedule";
    case v1::PREDICTION_MISS_COSTS:
      return "costs";
    case v1::PREDICTION_MISS_SCHEDULE_AND_COSTS:
      return "schedule and costs";
    case v1::PREDICTION_MISS_UPDATE_OR_CALLS:
      return "update or calls";
    case v1::PREDICTION_MISS_TRANSFERS:
      return "transfers";
    case v1::PREDICTION_MISS_TRANSFERS_AND_COSTS:
      return "transfers and costs";
    default:
      return "unknown";
  }
}

std::string FormatPredictionCheck(const v1::PredictionCheck& c) {
  // Steps as `tandem status` numbers them: steps done.
  const std::string steps =
      c.first_step() == c.last_step()
          ? absl::StrCat("step ", c.first_step() + 1)
          : absl::StrCat("steps ", c.first_step() + 1, "-", c.last_step() + 1);
  std::string out = absl::StrFormat("%s s per step, median of %s: x%.3f the prediction",
                                    FormatSeconds(c.measured_seconds()), steps,
                                    c.measured_seconds() / c.predicted_seconds());
  const int tolerance = static_cast<int>(std::lround(100 * kPredictionTolerance));
  const v1::PredictionMiss miss = MissOf(c);
  if (miss == v1::PREDICTION_WITHIN) {
    absl::StrAppend(&out, absl::StrFormat(" (within %d%%)", tolerance));
    return out;
  }
  // Off: whose miss is it? The schedule's, if replaying it on the steps' own action costs does
  // not give the pipeline phase it measured; the costs', if the stages ran off their profile.
  const bool replayed = Replayed(c);
  const bool stages = c.stage_ratio_low() > 0;
  if (replayed) {
    absl::StrAppend(
        &out, absl::StrFormat("; the schedule replayed on those steps' own costs %s s against %s s "
                              "measured (%s)",
                              FormatSeconds(c.pipeline_replayed_seconds()),
                              FormatSeconds(c.pipeline_measured_seconds()),
                              ScheduleOk(c)
                                  ? absl::StrFormat("within %d%%", tolerance)
                                  : absl::StrFormat("x%.3f", c.pipeline_measured_seconds() /
                                                                 c.pipeline_replayed_seconds())));
    // Where that misses: how much of it the messages' flights, off their price, explain.
    if (!ScheduleOk(c) && c.pipeline_flights_seconds() > 0) {
      const std::string ratio = c.flight_ratio_low() <= 0 ? ""
                                : c.flight_ratio_high() - c.flight_ratio_low() < 0.05
                                    ? absl::StrFormat(" (x%.1f their price)", c.flight_ratio_low())
                                    : absl::StrFormat(" (x%.1f-%.1f their price)",
                                                      c.flight_ratio_low(), c.flight_ratio_high());
      absl::StrAppend(
          &out, absl::StrFormat(", and with the messages as they flew%s %s s (%s)", ratio,
                                FormatSeconds(c.pipeline_flights_seconds()),
                                FlightsExplain(c)
                                    ? absl::StrFormat("within %d%%", tolerance)
                                    : absl::StrFormat("x%.3f", c.pipeline_measured_seconds() /
                                                                   c.pipeline_flights_seconds())));
    }
  }
  if (stages) {
    absl::StrAppend(&out,
                    c.stage_ratio_high() - c.stage_ratio_low() < 0.0005
                        ? absl::StrFormat(", the stages ran x%.3f of their predicted times",
                                          c.stage_ratio_low())
                        : absl::StrFormat(", the stages ran x%.3f-%.3f of their predicted times",
                                          c.stage_ratio_low(), c.stage_ratio_high()));
  }
  switch (miss) {
    case v1::PREDICTION_MISS_SCHEDULE:
    case v1::PREDICTION_MISS_SCHEDULE_AND_COSTS:
      // With the messages' measured flights in the replay, what is left is not theirs.
      absl::StrAppend(
          &out, ": the time went to the schedule beyond its compute",
          c.pipeline_flights_seconds() > 0 ? " and its messages (waits, " : " (waits, transfers, ",
          c.replicated() ? "the gradient reduction, " : "", "per-action overheads)");
      if (miss == v1::PREDICTION_MISS_SCHEDULE_AND_COSTS) {
        absl::StrAppend(&out, ", and the costs moved");
      }
      break;
    case v1::PREDICTION_MISS_COSTS:
      absl::StrAppend(&out, replayed ? ": the costs moved, not the schedule (a busier or slower "
                                       "host, or a stale profile)"
                                     : ": the costs moved (a busier or slower host, or a stale "
                                       "profile)");
      break;
    case v1::PREDICTION_MISS_TRANSFERS:
    case v1::PREDICTION_MISS_TRANSFERS_AND_COSTS:
      absl::StrAppend(&out,
                      ": the time went to the messages, off the price the profile's idle link "
                      "probe put on them (a link shared with the compute, or a slower one)");
      if (miss == v1::PREDICTION_MISS_TRANSFERS_AND_COSTS) {
        absl::StrAppend(&out, ", and the costs moved");
      }
      break;
    case v1::PREDICTION_MISS_UPDATE_OR_CALLS:
      absl::StrAppend(&out, ": neither the schedule nor the stages: the update or the calls");
      break;
    default:
      break;
  }
  return out;
}

}  // namespace tandem::coordinator
