#include "coordinator/job_planning.h"

#include <algorithm>
#include <memory>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/planner.h"
#include "common/schedule.h"
#include "common/spec.h"
#include "common/status_macros.h"
#include "common/step_number.h"
#include "coordinator/hf_export.h"
#include "coordinator/hf_weights.h"
#include "coordinator/model_profiler.h"
#include "coordinator/placement.h"
#include "coordinator/plan_search.h"
#include "coordinator/profile_speed_check.h"
#include "coordinator/transport_choice.h"
#include "spdlog/spdlog.h"

namespace tandem::coordinator {

absl::Status JobPlanner::Plan(RunPlan* plan) {
  const std::vector<WorkerRecord>& workers = gang_.workers();
  // First, so that every rank's program and the link probe of a profile use the same data
  // plane (a pipeline.plan: auto candidate is a copy of this spec).
  ASSIGN_OR_RETURN(const std::string transport, ChooseTransport(plan->spec, workers));
  if (transport != plan->spec.pipeline().transport()) {
    spdlog::info("{}: pipeline.transport {} resolves to {} on its workers", job_.id(),
                 plan->spec.pipeline().transport(), transport);
  }
  plan->spec.mutable_pipeline()->set_transport(transport);
  if (plan->spec.pipeline().plan() == "auto") {
    const int stages = plan->spec.pipeline().stages();
    const int replicas = std::max(1, plan->spec.pipeline().replicas());
    RETURN_IF_ERROR(ChooseAutoPlan(&plan->spec));
    RETURN_IF_ERROR(PlaceForPlan(stages, replicas, plan->spec));
  }
  const v1::JobSpec& spec = plan->spec;
  std::optional<v1::ModelProfile> profile;
  const std::string key = ProfileKeyFor(spec, workers[0]);
  if (env_.profiles != nullptr) profile = env_.profiles->Find(key);
  if (!profile.has_value() && env_.profiles != nullptr &&
      spec.pipeline().partition() != "profile") {
    // A job that does not cut by the profile (uniform, manual) has no reason to measure a
    // fresh one, but past the max age the profile is not found and the job would go without a
    // prediction. It is priced on the expired one when SpeedChecked will check it (old enough
    // for the check; never with checks off, an infinite age), which scales it to the host's
    // speed now or measures it again when its layer kinds moved apart; else it prices nothing.
    std::optional<v1::ModelProfile> expired = env_.profiles->FindAnyAge(key);
    if (expired.has_value() && SpeedCheckDue(ProfileAge(*expired), env_.speed_check_after)) {
      profile = std::move(expired);
    }
  }
  if (profile.has_value()) {
    ASSIGN_OR_RETURN(profile, SpeedChecked(spec, *std::move(profile)));
  }
  if (!profile.has_value() && spec.pipeline().partition() == "profile") {
    ASSIGN_OR_RETURN(profile, ProfileForJob(spec));
  }
  ASSIGN_OR_RETURN(plan->pipeline, PlanPipeline(spec, profile.has_value() ? &*profile : nullptr));
  const PipelinePlan& pipeline = plan->pipeline;
  if (pipeline.predicted_step_seconds > 0) {
    env_.store->SetPredictedStep(job_.id(), pipeline.predicted_step_seconds,
                                 pipeline.predicted_update_seconds);
  }
  if (const std::string& hf = spec.init().hf_file(); !hf.empty()) {
    if (env_.checkpoints == nullptr || !env_.checkpoints->enabled() || env_.models_root.empty()) {
      return absl::FailedPreconditionError("init.hf_file: this coordinator keeps no models");
    }
    const std::string import_id = absl::StrCat("import-", job_.id());
    // Confined to the models root on the file system too (a sharded file's shards as well):
    // no symlink out of it.
    ASSIGN_OR_RETURN(std::unique_ptr<HfWeights> weights,
                     HfWeights::Open(env_.models_root, hf, "the coordinator's <data-root>/models"));
    RETURN_IF_ERROR(ImportHfWeights(*weights, spec.model(), *env_.checkpoints, import_id));
    plan->restore.set_job_id(import_id);
    plan->restore.set_step(0);
    plan->restore.set_weights_only(true);
    spdlog::info("{}: fine-tuning from {}", job_.id(), hf);
  }
  if (const std::string& from = spec.init().from_job(); !from.empty()) {
    if (env_.checkpoints == nullptr) {
      return absl::FailedPreconditionError("init.from_job: this coordinator keeps no checkpoints");
    }
    absl::StatusOr<int64_t> latest = env_.checkpoints->Latest(from);
    if (!latest.ok())
      return absl::FailedPreconditionError(
          absl::StrCat("init.from_job: ", latest.status().message()));
    plan->restore.set_job_id(from);
    plan->restore.set_step(*latest);
    plan->first_step = *latest + 1;
    if (plan->first_step >= spec.steps()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "init.from_job: the checkpoint of ", from, " is after step ", StepNumber(*latest),
          ", but this job has only ", spec.steps(), " steps; raise steps to continue training"));
    }
    env_.store->SetFirstStep(job_.id(), plan->first_step);
    spdlog::info("{}: resuming from the checkpoint of {} after step {}", job_.id(), from,
                 StepNumber(*latest));
  }
  // A restart after a fault of a data-parallel job continues from the state its surviving
  // replicas kept (peer recovery) when that is newer than its checkpoint; otherwise (or after a
  // coordinator restart) from the job's own latest complete checkpoint; without one it starts
  // again as the spec says.
  const v1::PeerState& peers = job_.peer_state();
  if (peers.holders_size() > 0 && peers.step() >= job_.checkpoint_step()) {
    plan->restore.set_job_id(job_.id());
    plan->restore.set_step(peers.step());
    plan->restore.set_weights_only(false);
    plan->first_step = peers.step() + 1;
    plan->peers = peers;
    spdlog::info("{}: attempt {} resumes from the state {} surviving worker(s) kept after step {}",
                 job_.id(), job_.restarts(), peers.holders_size(), StepNumber(peers.step()));
  } else if (job_.checkpoint_step() >= 0 && env_.checkpoints != nullptr &&
             env_.checkpoints->enabled()) {
    absl::StatusOr<int64_t> own = env_.checkpoints->LatestReadable(job_.id());
    if (own.ok()) {
      plan->restore.set_job_id(job_.id());
      plan->restore.set_step(*own);
      plan->restore.set_weights_only(false);
      plan->first_step = *own + 1;
      spdlog::info("{}: attempt {} resumes from its checkpoint after step {}", job_.id(),
                   job_.restarts(), StepNumber(*own));
    } else {
      spdlog::warn("{}: its checkpoint after step {} cannot be read ({}); starting again",
                   job_.id(), StepNumber(job_.checkpoint_step()), own.status().ToString());
    }
  }
  // One row per stage: its worker, its layers and its actions in its worker's order.
  std::vector<v1::StageAssignment> stages;
  for (int s = 0; s < pipeline.num_stages(); ++s) {
    const int r = pipeline.schedule.placement.rank_of_stage[s];
    std::vector<Action> own;
    for (const Action& a : pipeline.schedule.program[r]) {
      if (a.stage == s && IsComputeAction(a.kind)) own.push_back(a);
    }
    v1::StageAssignment a;
    a.set_stage(s);
    a.set_rank(r);
    a.set_worker_id(workers[r].id);
    a.set_address(workers[r].address);
    a.set_layer_begin(pipeline.ranges[s].begin);
    a.set_layer_end(pipeline.ranges[s].end);
    a.set_actions(ActionsToString(own));
    // Data parallelism: the stage's worker in every replica (gang rank replica x P + r).
    if (const int replicas = std::max(1, spec.pipeline().replicas()); replicas > 1) {
      const int P = pipeline.num_ranks();
      for (int k = 0; k < replicas; ++k) {
        const WorkerRecord& w = workers[static_cast<size_t>(k * P + r)];
        v1::ReplicaWorker* rw = a.add_replicas();
        rw->set_replica(k);
        rw->set_rank(k * P + r);
        rw->set_worker_id(w.id);
        rw->set_address(w.address);
      }
    }
    if (!pipeline.stage_costs.empty()) {
      a.set_predicted_seconds(pipeline.stage_costs[s].forward + pipeline.stage_costs[s].backward);
      a.set_predicted_bytes(pipeline.stage_bytes[s]);
      a.set_predicted_transfer_seconds(pipeline.stage_costs[s].transfer);
    }
    stages.push_back(std::move(a));
  }
  env_.store->SetStages(job_.id(), stages);
  return absl::OkStatus();
}

absl::Status JobPlanner::PlaceForPlan(int placed_stages, int placed_replicas,
                                      const v1::JobSpec& spec) {
  const int stages = spec.pipeline().stages();
  const int replicas = std::max(1, spec.pipeline().replicas());
  if ((stages == placed_stages && replicas == placed_replicas) || !env_.reorder_gang) {
    return absl::OkStatus();
  }
  std::vector<std::string> nodes;
  for (const WorkerRecord& w : gang_.workers()) nodes.push_back(w.node);
  const std::vector<int> order = PlaceGang(nodes, stages, replicas);
  if (order.size() != nodes.size()) {
    return absl::InternalError(absl::StrCat("pipeline.plan: auto chose ", stages, " x ", replicas,
                                            " for a gang of ", nodes.size()));
  }
  bool identity = true;
  for (size_t r = 0; r < order.size(); ++r) identity = identity && order[r] == static_cast<int>(r);
  if (!identity) RETURN_IF_ERROR(env_.reorder_gang(order));
  std::vector<std::string> placed;
  for (const WorkerRecord& w : gang_.workers()) placed.push_back(w.node);
  spdlog::info("{}: the gang was placed for {} x {} and plan: auto chose {} x {}: {}{}", job_.id(),
               placed_stages, placed_replicas, stages, replicas,
               identity ? "the placement stands; " : "re-placed; ",
               DescribePlacement(placed, stages, replicas));
  return absl::OkStatus();
}

absl::Status JobPlanner::ChooseAutoPlan(v1::JobSpec* spec) {
  // Kept here too: the spec as written is costed from the profile the search already got,
  // even when there is no profile store to cache it.
  const PlanSearch search =
      RunPlanSearch(*spec, [this](const v1::JobSpec& s) { return ProfileAt(s); });
  const std::vector<PlanCandidate>& candidates = search.candidates;
  const absl::StatusOr<PlanCandidate>& best = search.best;
  RETURN_IF_ERROR(WithPrefix(best.status(), "pipeline.plan: auto"));
  const double as_written = search.as_written_step_seconds;
  int feasible = 0;
  for (const PlanCandidate& c : candidates) feasible += c.status.ok();
  std::string note = absl::StrCat(DescribeChoice(*best, as_written), "; best of ", feasible,
                                  " feasible of ", candidates.size(), " candidates");
  if (const std::string why = DescribeFactorizations(candidates); !why.empty()) {
    absl::StrAppend(&note, "; ", why);
  }
  *spec = best->spec;
  env_.store->SetPlan(job_.id(), spec->pipeline(), note);
  spdlog::info("{}: planned {}", job_.id(), note);
  return absl::OkStatus();
}

absl::StatusOr<v1::ModelProfile> JobPlanner::ProfileAt(const v1::JobSpec& spec) {
  const std::vector<WorkerRecord>& workers = gang_.workers();
  if (env_.profiles != nullptr) {
    std::optional<v1::ModelProfile> cached = env_.profiles->Find(ProfileKeyFor(spec, workers[0]));
    if (cached.has_value()) return SpeedChecked(spec, *std::move(cached));
  }
  return ProfileForJob(spec);
}

std::vector<ProfiledWorker> JobPlanner::ProfiledWorkers() {
  const std::vector<WorkerRecord>& workers = gang_.workers();
  std::vector<ProfiledWorker> profiled;
  for (size_t i = 0; i < workers.size(); ++i) {
    profiled.push_back({&workers[i], &gang_.client(static_cast<int>(i))});
  }
  return profiled;
}

absl::StatusOr<v1::ModelProfile> JobPlanner::SpeedChecked(const v1::JobSpec& spec,
                                                          v1::ModelProfile cached) {
  const absl::Duration age = ProfileAge(cached);
  if (!SpeedCheckDue(age, env_.speed_check_after)) return cached;
  if (!speed_check_.has_value()) {
    env_.store->SetReason(
        job_.id(), absl::StrCat("planning: timing layers ",
                                absl::StrJoin(SpeedCheckLayers(spec.model()), ", "),
                                " again against their profile, measured ",
                                absl::FormatDuration(absl::Trunc(age, absl::Seconds(1))), " ago"));
    absl::StatusOr<SpeedCheck> check =
        CheckProfileSpeed(spec, cached, ProfiledWorkers(), env_.profile_timeout);
    if (!check.ok()) {
      spdlog::warn("{}: speed check of profile {}: {}; priced on the profile as it is", job_.id(),
                   cached.key(), check.status().ToString());
      speed_check_ = SpeedCheck{};
      return cached;
    }
    speed_check_ = *check;
    spdlog::info("{}: speed check of profile {} (measured {} ago): {}", job_.id(), cached.key(),
                 absl::FormatDuration(absl::Trunc(age, absl::Seconds(1))),
                 DescribeSpeedCheck(*check));
    env_.store->SetProfileSpeedRatio(job_.id(), check->ratio);
  }
  if (speed_check_->remeasure) return ProfileForJob(spec);
  if (!speed_check_->scaled) return cached;
  return ScaleProfileCompute(std::move(cached), speed_check_->ratio);
}

absl::StatusOr<v1::ModelProfile> JobPlanner::ProfileForJob(const v1::JobSpec& spec) {
  const std::vector<WorkerRecord>& workers = gang_.workers();
  // The job's workers time the layers at once, as they compute at once in the job
  // (MeasureProfile takes those like the first, up to kMaxProfiledWorkers).
  const std::vector<ProfiledWorker> profiled = ProfiledWorkers();
  env_.store->SetReason(
      job_.id(), absl::StrCat("planning: profiling micro-batches of ",
                              spec.pipeline().micro_batch_size(), " on worker ", workers[0].id,
                              workers.size() > 1 ? " and the others at once" : ""));
  // With a second worker the link between the first two is measured too (keys under the
  // job's prefix, dropped at its end like the rest).
  std::optional<LinkPeer> peer;
  if (workers.size() >= 2) {
    peer = LinkPeer{&workers[1], &gang_.client(1), absl::StrCat(job_.id(), "/link-probe/"),
                    env_.rendezvous, spec.pipeline().transport()};
  }
  return MeasureProfile(spec, profiled, env_.profile_timeout, env_.profiles,
                        peer.has_value() ? &*peer : nullptr,
                        [this] { return !gang_.InterruptStatus().ok(); });
}

}  // namespace tandem::coordinator
