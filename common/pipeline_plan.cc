#include "common/pipeline_plan.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/schedule_check.h"

namespace tandem {

absl::StatusOr<Schedule> ScheduleForSpec(const v1::JobSpec& spec) {
  const v1::PipelineSpec& p = spec.pipeline();
  if (!p.schedule_csv().empty()) {
    return ScheduleFromCsv(p.schedule_csv(), p.stages(), p.micro_batches());
  }
  return GenerateSchedule(p.schedule(), p.stages(), p.micro_batches(), p.chunks());
}

absl::StatusOr<PipelinePlan> PlanPipeline(const v1::JobSpec& spec) {
  absl::StatusOr<Schedule> compute = ScheduleForSpec(spec);
  if (!compute.ok()) return compute.status();
  PipelinePlan plan;
  plan.schedule = LowerWithTransfers(*compute);
  // Every program is proved complete and deadlock-free before any worker sees it.
  if (absl::Status s = ValidateSchedule(plan.schedule); !s.ok()) return s;
  absl::StatusOr<std::vector<LayerRange>> ranges =
      UniformPartition(spec.model(), plan.num_stages());
  if (!ranges.ok()) return ranges.status();
  plan.ranges = *std::move(ranges);
  if (spec.eval().every() > 0) {
    absl::StatusOr<Schedule> forward =
        GenerateForwardOnly(plan.schedule.placement, spec.eval().micro_batches());
    if (!forward.ok()) return forward.status();
    plan.eval = LowerWithTransfers(*forward);
  }
  return plan;
}

ActionCosts UnitCosts(const Placement& placement) {
  const double v = static_cast<double>(placement.num_stages()) / std::max(1, placement.num_ranks);
  ActionCosts c;
  c.forward = 1.0 / v;
  c.backward = 2.0 / v;
  c.backward_input = 1.0 / v;
  c.backward_weight = 1.0 / v;
  return c;
}

double PredictedBubble(const PipelinePlan& plan) {
  absl::StatusOr<SimulationResult> sim =
      SimulateSchedule(plan.schedule, UnitCosts(plan.schedule.placement));
  return sim.ok() ? sim->bubble_fraction : 0.0;
}

double PredictedBubble(const v1::JobSpec& spec) {
  absl::StatusOr<PipelinePlan> plan = PlanPipeline(spec);
  return plan.ok() ? PredictedBubble(*plan) : 0.0;
}

v1::StageProgram StageProgramFor(const PipelinePlan& plan, const v1::JobSpec& spec, int rank,
                                 const std::string& job_id, const std::string& rendezvous_prefix) {
  const Placement& placement = plan.schedule.placement;
  v1::StageProgram prog;
  prog.set_job_id(job_id);
  prog.set_rank(rank);
  prog.set_num_ranks(placement.num_ranks);
  prog.set_num_stages(placement.num_stages());
  for (int r : placement.rank_of_stage) prog.add_stage_ranks(r);
  for (int s : placement.StagesOf(rank)) {
    v1::StageChunk* c = prog.add_chunks();
    c->set_stage(s);
    c->set_layer_begin(plan.ranges[s].begin);
    c->set_layer_end(plan.ranges[s].end);
  }
  for (const Action& a : plan.schedule.program[rank]) *prog.add_actions() = ToProto(a);
  *prog.mutable_spec() = spec;
  prog.set_rendezvous_prefix(rendezvous_prefix);
  prog.set_micro_batches(plan.schedule.num_micro_batches);
  if (!plan.eval.program.empty()) {
    for (const Action& a : plan.eval.program[rank]) *prog.add_eval_actions() = ToProto(a);
    prog.set_eval_micro_batches(plan.eval.num_micro_batches);
  }
  return prog;
}

}  // namespace tandem
