#include "coordinator/step_summary.h"

#include <algorithm>
#include <cmath>

#include "absl/status/statusor.h"
#include "common/message_flight.h"
#include "common/schedule_check.h"
#include "common/step_profile.h"
#include "common/trace.h"
#include "coordinator/step_timings.h"

namespace tandem::coordinator {

StepReports SummarizeReports(int64_t step, const Schedule& schedule, int num_stages,
                             const std::vector<const v1::StepReport*>& reports,
                             const v1::StepTimings& timings, float clip, int replicas,
                             bool sharded_state,
                             const std::vector<double>& stage_transfer_seconds) {
  StepReports out;
  v1::StepSummary& summary = out.summary;
  summary.set_step(step);
  bool grads_finite = true;
  double norm_sq = 0.0;
  const size_t ranks = static_cast<size_t>(schedule.placement.num_ranks);
  // Replica 0's reports: the per-stage figures (every replica runs the same program).
  const std::vector<const v1::StepReport*> first(
      reports.begin(),
      reports.begin() + static_cast<std::ptrdiff_t>(std::min(ranks, reports.size())));
  double loss = 0.0;
  for (size_t g = 0; g < reports.size(); ++g) {
    const v1::StepReport* rep = reports[g];
    if (rep->has_loss()) {
      loss += rep->loss();  // each replica's share of the global batch's mean
      out.has_loss = true;
    }
    grads_finite = grads_finite && rep->grads_finite();
    if (g < ranks || sharded_state) norm_sq += rep->grad_norm_sq();
    summary.set_reduced_bytes(summary.reduced_bytes() + rep->reduced_bytes());
    out.max_exec_us = std::max(out.max_exec_us, rep->exec_us());
    out.max_call_us = std::max(out.max_call_us, rep->update_us() + rep->exec_us());
    summary.set_max_worker_update_seconds(
        std::max(summary.max_worker_update_seconds(),
                 static_cast<double>(rep->update_us() + rep->grad_norm_us()) * 1e-6));
    summary.set_bytes_sent(summary.bytes_sent() + rep->bytes_sent());
    summary.set_peak_activation_bytes(
        std::max(summary.peak_activation_bytes(), rep->peak_activation_bytes()));
    summary.add_rank_peak_activation_bytes(rep->peak_activation_bytes());
  }
  summary.set_loss(loss);
  // Per stage: static + peak activations, and their parts, as each stage's worker measured them.
  std::vector<v1::StageMemory> stage_memory(static_cast<size_t>(num_stages));
  for (int s = 0; s < num_stages; ++s) stage_memory[static_cast<size_t>(s)].set_stage(s);
  for (const v1::StepReport* rep : first) {
    for (const v1::StageMemory& m : rep->stage_memory()) {
      if (m.stage() >= 0 && m.stage() < num_stages)
        stage_memory[static_cast<size_t>(m.stage())] = m;
    }
  }
  for (const v1::StageMemory& m : stage_memory) {
    summary.add_stage_peak_bytes(m.static_bytes() + m.peak_activation_bytes());
    *summary.add_stage_memory() = m;
  }
  // The per-stage busy time comes from the same record as the trace, so that they agree.
  absl::StatusOr<StepTimeline> timeline =
      TimelineOf(ReplicatedSchedule(schedule, std::max(1, replicas)), timings);
  if (timeline.ok()) {
    for (int s = 0; s < num_stages && s < static_cast<int>(timeline->stages.size()); ++s) {
      const StageTimes& st = timeline->stages[s];
      summary.add_stage_busy_seconds(static_cast<double>(st.busy_us) * 1e-6);
      summary.add_stage_comm_seconds(static_cast<double>(st.comm_us) * 1e-6);
      summary.add_stage_idle_seconds(static_cast<double>(st.idle_us) * 1e-6);
      if (replicas > 1) {
        summary.add_stage_reduce_seconds(static_cast<double>(st.reduce_us) * 1e-6);
        summary.add_stage_reduce_exposed_seconds(static_cast<double>(st.reduce_exposed_us) * 1e-6);
      }
    }
  } else {
    out.warnings.push_back("cannot build the step's timeline: " + timeline.status().ToString());
  }
  if (absl::StatusOr<StepProfile> profile = ProfileStep(schedule, first, stage_transfer_seconds);
      profile.ok()) {
    summary.set_bubble_measured(profile->measured_bubble);
    summary.set_bubble_predicted(profile->predicted_bubble);
    summary.set_exec_replayed_seconds(profile->predicted_step_seconds);
    for (double b : profile->busy_seconds) summary.add_busy_seconds(b);
    for (const ActionCosts& c : profile->stage_costs) {
      summary.add_stage_seconds(
          c.forward + (c.backward > 0 ? c.backward : c.backward_input + c.backward_weight));
    }
    if (timeline.ok()) {
      // The replay again with each stage's messages as they flew (at the plan's price where
      // none was measured): what is left against the measured pipeline is the schedule's own.
      // The step's own compute costs are the profile's: only the transfers change, so the
      // simulator runs again on them rather than the reports being read twice.
      const MessageFlights flights = MeasureMessageFlights(*timeline, num_stages);
      std::vector<ActionCosts> flown = profile->stage_costs;
      bool timed = false;
      for (int s = 0; s < num_stages; ++s) {
        const size_t i = static_cast<size_t>(s);
        summary.add_stage_flight_seconds(flights.stage_seconds[i]);
        if (flights.stage_counted[i] > 0 && i < flown.size()) {
          flown[i].transfer = flights.stage_seconds[i];
          timed = true;
        }
      }
      if (!timed) {
        summary.set_exec_replayed_flights_seconds(profile->predicted_step_seconds);
      } else if (absl::StatusOr<SimulationResult> replay =
                     SimulateSchedule(schedule, ActionCosts{}, flown);
                 replay.ok()) {
        summary.set_exec_replayed_flights_seconds(replay->step_time);
      }
    }
  } else {
    out.warnings.push_back("cannot profile the step: " + profile.status().ToString());
  }
  // The global gradient norm decides clipping and skipping, the same on every stage.
  out.grad_norm = std::sqrt(norm_sq);
  out.finite = grads_finite && std::isfinite(out.grad_norm) && std::isfinite(summary.loss());
  out.grad_scale = out.finite ? ClipScale(out.grad_norm, clip) : 1.0f;
  summary.set_grad_norm(out.grad_norm);
  summary.set_skipped(!out.finite);
  return out;
}

void SetThroughput(const StepThroughput& t, v1::StepSummary* summary) {
  summary->set_step_seconds(t.step_seconds);
  summary->set_max_worker_exec_seconds(static_cast<double>(t.max_exec_us) * 1e-6);
  summary->set_coordinator_overhead_seconds(std::max(
      0.0, t.run_seconds - static_cast<double>(std::max(t.max_exec_us, t.max_call_us)) * 1e-6));
  summary->set_tokens_per_second(t.step_seconds > 0 ? t.tokens_per_step / t.step_seconds : 0);
  double peak = 0.0;
  bool peaks_known = true;
  for (double p : t.peak_flops) {
    peaks_known = peaks_known && p > 0;
    peak += p;
  }
  if (peaks_known && t.step_seconds > 0) {
    summary->set_mfu(t.model_flops_per_token * static_cast<double>(t.tokens_per_step) /
                     t.step_seconds / peak);
  }
}

}  // namespace tandem::coordinator
