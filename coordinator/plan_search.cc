#include "coordinator/plan_search.h"

#include <map>
#include <utility>
#include <vector>

#include "common/pipeline_plan.h"

namespace tandem::coordinator {

PlanSearch RunPlanSearch(const v1::JobSpec& spec, const ProfileSource& profiles) {
  // One profile per micro-batch size, also for the spec as written.
  std::map<int, absl::StatusOr<v1::ModelProfile>> by_size;
  auto profile_at = [&](const v1::JobSpec& s) -> const absl::StatusOr<v1::ModelProfile>& {
    const int size = s.pipeline().micro_batch_size();
    auto it = by_size.find(size);
    if (it == by_size.end()) it = by_size.emplace(size, profiles(s)).first;
    return it->second;
  };
  PlanSearch out{SearchPlans(spec, profile_at), absl::UnknownError("not chosen"), 0.0};
  out.best = ChoosePlan(out.candidates);
  if (!out.best.ok()) return out;  // nothing to compare the spec as written with
  if (const absl::StatusOr<v1::ModelProfile>& p = profile_at(spec); p.ok()) {
    if (absl::StatusOr<PipelinePlan> plan = PlanPipeline(spec, &*p); plan.ok()) {
      out.as_written_step_seconds = plan->predicted_step_seconds;
    }
  }
  return out;
}

v1::PlanJobResponse SearchPlanJob(const v1::JobSpec& spec, const ProfileSource& profiles) {
  const PlanSearch search = RunPlanSearch(spec, profiles);
  const std::vector<PlanCandidate>& candidates = search.candidates;
  v1::PlanJobResponse out;
  for (const PlanCandidate& c : candidates) {
    v1::PlanCandidateInfo* info = out.add_candidates();
    info->set_stages(c.stages);
    info->set_replicas(c.replicas);
    info->set_schedule(c.schedule);
    info->set_chunks(c.chunks);
    info->set_micro_batches(c.micro_batches);
    info->set_micro_batch_size(c.micro_batch_size);
    info->set_feasible(c.status.ok());
    if (!c.status.ok()) info->set_reason(std::string(c.status.message()));
    info->set_step_seconds(c.step_seconds);
    info->set_bubble(c.bubble);
    info->set_peak_stage_bytes(c.peak_stage_bytes);
    info->set_tokens_per_second(c.tokens_per_second);
    info->set_reduce_exposed_seconds(c.reduce_exposed_seconds);
  }
  out.set_as_written_step_seconds(search.as_written_step_seconds);
  out.set_chosen(-1);
  const absl::StatusOr<PlanCandidate>& best = search.best;
  if (!best.ok()) {
    out.set_choice(std::string(best.status().message()));
    return out;
  }
  out.set_chosen(0);  // ChoosePlan's choice is the first candidate when any fits
  out.set_choice(DescribeChoice(*best, out.as_written_step_seconds()));
  *out.mutable_chosen_spec() = best->spec;
  return out;
}

}  // namespace tandem::coordinator
