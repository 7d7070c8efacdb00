#include "common/pipeline_plan.h"

#include <algorithm>
#include <limits>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/link_model.h"
#include "common/recompute_placement.h"
#include "common/schedule_auto.h"
#include "common/schedule_check.h"
#include "common/spec.h"
#include "common/status_macros.h"

namespace tandem {

absl::StatusOr<Schedule> ScheduleForSpec(const v1::JobSpec& spec) {
  const v1::PipelineSpec& p = spec.pipeline();
  if (!p.schedule_csv().empty()) {
    return ScheduleFromCsv(p.schedule_csv(), p.stages(), p.micro_batches());
  }
  return GenerateSchedule(p.schedule(), p.stages(), p.micro_batches(), p.chunks());
}

namespace {

// The recomputation of a layer before its backward: measured, or (a profile without it) its
// forward.
double RecomputeSeconds(const v1::LayerProfile& p) {
  return p.recompute_seconds() > 0 ? p.recompute_seconds() : p.forward_seconds();
}

// What recomputation keeps of global layer g per micro-batch: its input, the previous layer's
// output (the embedding's: the micro-batch's int32 tokens).
int64_t LayerInputBytes(const v1::JobSpec& spec, const v1::ModelProfile& profile, int g) {
  if (g > 0) return profile.layers(g - 1).output_bytes();
  const int64_t tokens_per_sequence =
      IsDecoder(spec.model()) ? spec.model().seq_len() : spec.model().context();
  return spec.pipeline().micro_batch_size() * tokens_per_sequence *
         static_cast<int64_t>(sizeof(int32_t));
}

// The partition problem of a plan: per-layer costs (the profile's, or parameter counts for
// `parameters`), the schedule's live micro-batches per stage, and the budget.
// `recomputed`: every layer costed as its stage recomputing it.
PartitionProblem ProblemFor(const v1::JobSpec& spec, const Schedule& lowered,
                            const v1::ModelProfile* profile, bool by_parameters, bool recomputed) {
  PartitionProblem problem;
  problem.num_stages = lowered.placement.num_stages();
  const std::vector<int64_t> params = LayerParameterCounts(spec.model());
  for (size_t g = 0; g < params.size(); ++g) {
    LayerCost c;
    if (profile != nullptr && static_cast<int>(g) < profile->layers_size()) {
      const v1::LayerProfile& p = profile->layers(static_cast<int>(g));
      c.seconds = p.forward_seconds() + p.backward_seconds();
      c.static_bytes = p.static_bytes();
      c.workspace_bytes = p.workspace_bytes();
      c.activation_bytes = p.activation_bytes();
      c.output_bytes = p.output_bytes();
      if (recomputed) {
        // The recomputation (R), and only the layer's input kept per micro-batch; the
        // backward holds one layer's working set beside them.
        c.seconds += RecomputeSeconds(p);
        c.activation_bytes = LayerInputBytes(spec, *profile, static_cast<int>(g));
        c.working_set_bytes = p.activation_bytes();
      }
    } else {
      c.static_bytes = params[g] * 16;  // fp32 value, gradient and AdamW's two moments
    }
    if (ShardsOptimizerState(spec)) {
      // ZeRO stage 1: this worker keeps 1/R of AdamW's two fp32 moments.
      const int64_t moments = params[g] * 8;
      const int64_t replicas = std::max(1, spec.pipeline().replicas());
      c.static_bytes -= moments - moments / replicas;
    }
    if (by_parameters) c.seconds = static_cast<double>(params[g]);
    problem.layers.push_back(c);
  }
  // The schedule's peak live micro-batches per rank, shared by the rank's stages.
  absl::StatusOr<SimulationResult> sim = SimulateSchedule(lowered, UnitCosts(lowered.placement));
  const int v = std::max(1, problem.num_stages / std::max(1, lowered.placement.num_ranks));
  for (int s = 0; s < problem.num_stages; ++s) {
    const int r = lowered.placement.rank_of_stage[s];
    const int live = sim.ok() ? sim->peak_live_micro_batches[r] : 1;
    problem.live_micro_batches.push_back(std::max(1, (live + v - 1) / v));
  }
  problem.memory_budget_bytes = spec.pipeline().memory_budget_mb() << 20;
  // A worker's stages share its budget.
  problem.rank_of_stage = lowered.placement.rank_of_stage;
  // The cuda backend recomputes a stage at once (cuda_stage_compute.h).
  problem.whole_stage_recompute = spec.device() == "cuda";
  // Each cut carries one micro-batch's activation forward and its gradient back, over the
  // measured link (free without one).
  if (profile != nullptr && profile->has_link() && !by_parameters && profile->layers_size() > 0) {
    problem.transfer_seconds =
        2 * TransferSeconds(profile->link(), profile->layers(0).output_bytes());
  }
  return problem;
}

// The measured parameters, gradients, optimizer state and workspace of worker `rank`'s stages
// (unsharded: an upper bound), in bytes.
double RankStaticBytes(const v1::ModelProfile& profile, const PipelinePlan& plan, int rank) {
  double bytes = 0;
  for (int s : plan.schedule.placement.StagesOf(rank)) {
    std::vector<int64_t> workspaces;
    for (int g = plan.ranges[s].begin; g < plan.ranges[s].end; ++g) {
      bytes += static_cast<double>(profile.layers(g).static_bytes());
      workspaces.push_back(profile.layers(g).workspace_bytes());
    }
    bytes += static_cast<double>(StageWorkspaceBytes(workspaces));
  }
  return bytes;
}

// Recomputation only where memory needs it, and hidden in the idle time where it can be
// (common/recompute_placement.h), under the measured costs: each worker's stages may rise up
// to memory_budget_mb from their predicted bytes (without a budget, no more than the plain
// placement's peak). First the R's whose micro-batches can keep their activations within
// that are dropped, then the rest are moved into idle time where that still fits; both raise
// a worker's peak within the limit, and the stages' predicted bytes take their share of the
// rise.
absl::Status PlaceRecomputeInIdleTime(const v1::JobSpec& spec, PipelinePlan* plan) {
  const Placement& placement = plan->schedule.placement;
  ASSIGN_OR_RETURN(SimulationResult plain,
                   SimulateSchedule(plan->schedule, ActionCosts{}, plan->stage_costs));
  std::vector<double> limit = plain.peak_activation_bytes;
  const int64_t budget = spec.pipeline().memory_budget_mb() << 20;
  if (budget > 0) {
    // What the plan counts beside the activations (parameters, gradients and optimizer state,
    // messages) stays: a worker's activations may rise by what its stages leave of the budget.
    const std::vector<int64_t> worker = WorkerBytes(*plan);
    for (int r = 0; r < placement.num_ranks; ++r) {
      const double headroom = static_cast<double>(budget - worker[r]);
      limit[r] = std::max(limit[r], plain.peak_activation_bytes[r] + headroom);
    }
  }
  // Without a measured peak on some worker (a profile without activation bytes) the plan
  // cannot tell what keeping a micro-batch costs there: nothing is dropped.
  const bool measured = std::all_of(limit.begin(), limit.end(), [](double l) { return l > 0; });
  RecomputePlacement kept;
  if (measured) {
    ASSIGN_OR_RETURN(kept,
                     DropRecomputation(plan->schedule, ActionCosts{}, plan->stage_costs, limit));
  } else {
    kept.schedule = plan->schedule;
  }
  ASSIGN_OR_RETURN(RecomputePlacement placed,
                   PlaceRecomputation(kept.schedule, ActionCosts{}, plan->stage_costs, limit));
  plan->schedule = std::move(placed.schedule);
  plan->recompute_dropped = kept.dropped;
  plan->recompute_moved = placed.moved;
  // A stage whose R's all went recomputes nothing.
  std::vector<bool> still(plan->recompute_stages.size(), false);
  for (const auto& list : plan->schedule.program) {
    for (const Action& a : list) {
      if (a.kind == v1::ACTION_R && a.stage < static_cast<int>(still.size())) still[a.stage] = true;
    }
  }
  plan->recompute_stages = std::move(still);
  for (int s = 0; s < plan->num_stages() && s < static_cast<int>(plan->stage_bytes.size()); ++s) {
    const int r = placement.rank_of_stage[s];
    const double rise = placed.after.peak_activation_bytes[r] - plain.peak_activation_bytes[r];
    plan->stage_bytes[s] +=
        static_cast<int64_t>(rise / static_cast<double>(placement.StagesOf(r).size()));
  }
  return absl::OkStatus();
}

// zb_auto (common/schedule_auto.h) built from the measured stage costs instead of equal ones,
// within the memory the worker has: per worker, the live micro-batches its budget holds
// after its static bytes (at least one), or without a budget 1F1B's P. The program is then
// lowered, recomputed and reduced as the spec's was.
absl::Status RebuildZBAuto(const v1::JobSpec& spec, const v1::ModelProfile& profile,
                           PipelinePlan* plan) {
  const int ranks = plan->num_ranks();
  std::vector<int> limit(static_cast<size_t>(ranks), ranks);
  const int64_t budget = spec.pipeline().memory_budget_mb() << 20;
  if (budget > 0) {
    for (int r = 0; r < ranks; ++r) {
      const double fixed = RankStaticBytes(profile, *plan, r);
      const ActionCosts& c = plan->stage_costs[r];
      const bool recomputes = plan->recompute_stages[r];
      const double per_micro_batch = recomputes ? c.input_bytes : c.activation_bytes;
      if (per_micro_batch <= 0) continue;
      const double room = static_cast<double>(budget) - fixed - (recomputes ? c.layer_bytes : 0.0);
      limit[r] = std::max(1, static_cast<int>(std::min<double>(room / per_micro_batch,
                                                               spec.pipeline().micro_batches())));
    }
  }
  ASSIGN_OR_RETURN(Schedule compute, GenerateZBAuto(ranks, spec.pipeline().micro_batches(),
                                                    plan->stage_costs, limit));
  if (plan->recomputes()) compute = AddRecomputation(compute, plan->recompute_stages);
  Schedule lowered = LowerWithTransfers(compute);
  if (std::max(1, spec.pipeline().replicas()) > 1) lowered = AddGradReductions(lowered);
  RETURN_IF_ERROR(ValidateSchedule(lowered));
  plan->schedule = std::move(lowered);
  return absl::OkStatus();
}

}  // namespace

std::vector<int64_t> WorkerBytes(const PipelinePlan& plan) {
  if (plan.stage_bytes.empty()) return {};
  std::vector<int64_t> worker(static_cast<size_t>(plan.num_ranks()), 0);
  for (int s = 0; s < plan.num_stages() && s < static_cast<int>(plan.stage_bytes.size()); ++s) {
    worker[plan.schedule.placement.rank_of_stage[s]] += plan.stage_bytes[s];
  }
  return worker;
}

std::vector<int> LayersToProfile(const v1::ModelSpec& model) {
  const int n = NumLayers(model);
  if (n <= 2) return {0, n - 1};
  return {0, 1, n - 1};
}

int ProfiledLayerOf(const v1::ModelSpec& model, int g) {
  const int n = NumLayers(model);
  // Every block costs what block_0 does.
  return g == 0 || g == n - 1 ? g : 1;
}

absl::StatusOr<v1::ModelProfile> ExpandProfile(const v1::ModelSpec& model,
                                               const std::vector<v1::LayerProfile>& measured) {
  const int n = NumLayers(model);
  auto find = [&](int g) -> const v1::LayerProfile* {
    for (const v1::LayerProfile& p : measured) {
      if (p.layer() == g) return &p;
    }
    return nullptr;
  };
  v1::ModelProfile out;
  for (int g = 0; g < n; ++g) {
    const int source = ProfiledLayerOf(model, g);
    const v1::LayerProfile* p = find(source);
    if (p == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("profile: layer ", source, " (", LayerName(model, source), ") missing"));
    }
    v1::LayerProfile* l = out.add_layers();
    *l = *p;
    l->set_layer(g);
  }
  return out;
}

std::string ProfileKey(const v1::JobSpec& spec, const std::string& device, int threads,
                       const std::string& device_name) {
  const v1::ModelSpec& m = spec.model();
  return absl::StrCat(m.arch(), "-L", m.n_layer(), "-H", m.n_head(), "-C", m.d_model(), "-F",
                      m.d_hidden(), "-E", m.d_embed(), "-K", m.context(), "-T", m.seq_len(), "-V",
                      m.vocab_size(), m.tie_embeddings() ? "-tied" : "-untied",
                      m.arch() == "llama" ? absl::StrCat("-KV", m.n_kv_head()) : "", "-B",
                      spec.pipeline().micro_batch_size(), "-", spec.optimizer().name(), "-", device,
                      "-t", threads,
                      // Selective recomputation's blocks keep less and recompute in backward.
                      spec.pipeline().recompute() == "selective" ? "-selective" : "",
                      device_name.empty() ? "" : absl::StrCat("-on-", device_name));
}

namespace {

// The plan of `spec` with the stages `recompute` flags recomputing (empty: every stage under
// pipeline.recompute full, none otherwise). Flags for some stages only need the cut fixed
// (partition: manual), since they name stages of it.
absl::StatusOr<PipelinePlan> PlanWith(const v1::JobSpec& spec, const v1::ModelProfile* profile,
                                      std::vector<bool> recompute) {
  ASSIGN_OR_RETURN(Schedule compute, ScheduleForSpec(spec));
  const int num_stages = compute.placement.num_stages();
  if (recompute.empty()) recompute.assign(num_stages, spec.pipeline().recompute() == "full");
  if (static_cast<int>(recompute.size()) != num_stages) {
    return absl::InternalError(absl::StrCat("recomputation flags for ", recompute.size(),
                                            " stages, the schedule has ", num_stages));
  }
  const bool mixed = std::any_of(recompute.begin(), recompute.end(), [](bool b) { return b; }) &&
                     !std::all_of(recompute.begin(), recompute.end(), [](bool b) { return b; });
  PipelinePlan plan;
  plan.recompute_stages = recompute;
  // Recomputation: every F of a recomputing stage keeps only its layers' inputs, and an R
  // before each backward recomputes the rest.
  if (plan.recomputes()) compute = AddRecomputation(compute, recompute);
  plan.schedule = LowerWithTransfers(compute);
  const int replicas = std::max(1, spec.pipeline().replicas());
  if (replicas > 1) plan.schedule = AddGradReductions(plan.schedule);
  // Every program is proved complete and deadlock-free before any worker sees it.
  RETURN_IF_ERROR(ValidateSchedule(plan.schedule));
  if (profile != nullptr && profile->layers_size() != NumLayers(spec.model())) {
    return absl::InvalidArgumentError(absl::StrCat("profile has ", profile->layers_size(),
                                                   " layers, the model ", NumLayers(spec.model())));
  }
  const std::string& requested = spec.pipeline().partition();
  // Without a profile, partition: profile cuts by the best estimate there is: parameters.
  const std::string method =
      requested == "profile" && profile == nullptr ? "parameters" : requested;
  // The partition problem: every layer recomputed or none, or, when only some stages
  // recompute, both variants of every layer and which stages take the recomputed one, so
  // that the cut is chosen with each stage's own costs.
  const auto problem_for = [&](bool by_parameters) {
    PartitionProblem pr =
        ProblemFor(spec, plan.schedule, profile, by_parameters, plan.recomputes() && !mixed);
    if (mixed) {
      pr.recomputed_layers = ProblemFor(spec, plan.schedule, profile, by_parameters, true).layers;
      pr.stage_recomputes = recompute;
    }
    return pr;
  };
  const PartitionProblem problem = problem_for(method == "parameters");
  absl::StatusOr<std::vector<LayerRange>> ranges;
  plan.partition = method;
  if (method == "profile" || method == "parameters") {
    ASSIGN_OR_RETURN(Partition best, MinMaxPartition(problem));
    ranges = best.ranges;
    if (method == "profile") {
      // A near-tie with the uniform cut goes to the uniform cut: profiles are timings, and a
      // cut that moved with their noise would make a job's numbers run-dependent.
      absl::StatusOr<std::vector<LayerRange>> uniform = UniformPartition(spec.model(), num_stages);
      if (uniform.ok() && *uniform != best.ranges) {
        absl::StatusOr<Partition> u = EvaluatePartition(problem, *uniform);
        if (u.ok() && u->bottleneck_seconds <= best.bottleneck_seconds * (1 + kUniformTolerance)) {
          ranges = *uniform;
          plan.partition = "uniform (within the tolerance of the profile's optimum)";
        }
      }
    }
  } else if (method == "manual") {
    ranges = RangesFromCuts({spec.pipeline().cuts().begin(), spec.pipeline().cuts().end()},
                            NumLayers(spec.model()), num_stages);
  } else {
    ranges = UniformPartition(spec.model(), num_stages);
  }
  if (!ranges.ok()) return ranges.status();
  plan.ranges = *std::move(ranges);
  if (profile != nullptr) {
    // The chosen cut's figures under the measured costs (and its budget check for uniform and
    // manual cuts).
    // The parameters method costed the problem by parameter counts; the figures need time.
    const PartitionProblem timed = method == "parameters" ? problem_for(false) : problem;
    ASSIGN_OR_RETURN(Partition figures, EvaluatePartition(timed, plan.ranges));
    plan.stage_bytes = figures.stage_bytes;
    for (const LayerRange& r : plan.ranges) {
      ActionCosts c{0, 0, 0, 0, 0};
      c.activation_bytes = 0;
      c.recompute = 0;
      for (int g = r.begin; g < r.end; ++g) {
        const v1::LayerProfile& p = profile->layers(g);
        c.forward += p.forward_seconds();
        c.recompute += RecomputeSeconds(p);
        c.backward += p.backward_seconds();
        c.backward_input += p.backward_input_seconds();
        c.backward_weight += p.backward_weight_seconds();
        // Memory (common/schedule_check.h): the stage's working set per micro-batch, what
        // recomputation keeps of it, and its largest layer's.
        c.activation_bytes += static_cast<double>(p.activation_bytes());
        c.input_bytes += static_cast<double>(LayerInputBytes(spec, *profile, g));
        c.layer_bytes = std::max(c.layer_bytes, static_cast<double>(p.activation_bytes()));
      }
      // The cuda backend recomputes a stage at once: its R brings the whole working set back.
      if (spec.device() == "cuda") c.layer_bytes = c.activation_bytes;
      // A message from this stage: its activation forward, or its input gradient back.
      if (profile->has_link()) {
        int64_t bytes = profile->layers(r.end - 1).output_bytes();
        if (r.begin > 0) bytes = std::max(bytes, profile->layers(r.begin - 1).output_bytes());
        c.transfer = TransferSeconds(profile->link(), bytes);
      }
      // Its gradients summed across the replicas (fp32, one per parameter).
      int64_t parameters = 0;
      for (int g = r.begin; g < r.end; ++g) parameters += profile->layers(g).parameter_count();
      c.reduce = AllReduceSeconds(profile->link(), parameters * 4, replicas);
      plan.stage_costs.push_back(c);
    }
    if (spec.pipeline().schedule_csv().empty() && plan.schedule.name == "zb_auto") {
      RETURN_IF_ERROR(RebuildZBAuto(spec, *profile, &plan));
    }
    if (plan.recomputes()) {
      RETURN_IF_ERROR(PlaceRecomputeInIdleTime(spec, &plan));
    }
    absl::StatusOr<SimulationResult> sim =
        SimulateSchedule(plan.schedule, ActionCosts{}, plan.stage_costs);
    if (sim.ok()) {
      // The step's second phase runs on every worker at once after the pipeline drains: its
      // gradient-norm pass and optimizer update. The slowest worker's sets the pace.
      std::vector<double> apply(plan.num_ranks(), 0.0);
      for (int s = 0; s < plan.num_stages(); ++s) {
        for (int g = plan.ranges[s].begin; g < plan.ranges[s].end; ++g) {
          apply[plan.schedule.placement.rank_of_stage[s]] += profile->layers(g).apply_seconds();
        }
      }
      plan.predicted_update_seconds = *std::max_element(apply.begin(), apply.end());
      plan.predicted_step_seconds = sim->step_time + plan.predicted_update_seconds;
      plan.predicted_bubble = sim->bubble_fraction;
      for (double e : sim->reduce_exposed) {
        plan.predicted_reduce_exposed_seconds = std::max(plan.predicted_reduce_exposed_seconds, e);
      }
    }
  } else if (problem.memory_budget_bytes > 0 && method != "parameters") {
    RETURN_IF_ERROR(EvaluatePartition(problem, plan.ranges));
  }
  if (spec.eval().every() > 0) {
    ASSIGN_OR_RETURN(Schedule forward,
                     GenerateForwardOnly(plan.schedule.placement, spec.eval().micro_batches()));
    plan.eval = LowerWithTransfers(forward);
  }
  return plan;
}

// pipeline.recompute auto: no recomputation where the plan fits memory_budget_mb without;
// otherwise the fastest predicted plan that fits among the sets of recomputing stages tried,
// each with the cut chosen for it (the partitioner costs each stage its own variant). Tried:
// full recomputation; every set for up to kAutoRecomputeExhaustive stages; beyond, the first
// k stages for every k (under 1F1B the earlier stages keep more micro-batches) and the stages
// of the workers that do not fit without recomputation at full recomputation's cut. Full
// recomputation need not be the set that needs the least memory (a recomputing stage holds a
// working set beside its checkpoints, and on cuda the stage's whole one), so a job is refused only
// when no set fits, naming the smallest budget over every set tried.
absl::StatusOr<PipelinePlan> PlanAutoRecompute(const v1::JobSpec& spec,
                                               const v1::ModelProfile* profile) {
  v1::JobSpec none = spec;
  none.mutable_pipeline()->set_recompute("none");
  absl::StatusOr<PipelinePlan> plain = PlanWith(none, profile, {});
  if (plain.ok() || plain.status().code() != absl::StatusCode::kResourceExhausted) return plain;
  v1::JobSpec full = spec;
  full.mutable_pipeline()->set_recompute("full");
  absl::StatusOr<PipelinePlan> all = PlanWith(full, profile, {});
  if (!all.ok() && all.status().code() != absl::StatusCode::kResourceExhausted) {
    return all.status();
  }
  if (profile == nullptr) return all;
  ASSIGN_OR_RETURN(const Schedule compute, ScheduleForSpec(spec));
  const int p = compute.placement.num_stages();
  std::set<std::vector<bool>> tried;
  if (all.ok()) {
    // The stages that would not fit without recomputation at full recomputation's cut.
    v1::JobSpec unbounded = none;
    unbounded.mutable_pipeline()->set_partition("manual");
    unbounded.mutable_pipeline()->clear_cuts();
    for (size_t s = 1; s < all->ranges.size(); ++s) {
      unbounded.mutable_pipeline()->add_cuts(all->ranges[s].begin);
    }
    unbounded.mutable_pipeline()->set_memory_budget_mb(0);
    ASSIGN_OR_RETURN(PipelinePlan at_cut, PlanWith(unbounded, profile, {}));
    const int64_t budget = spec.pipeline().memory_budget_mb() << 20;
    // The stages of every worker over the budget there.
    const std::vector<int64_t> worker = WorkerBytes(at_cut);
    std::vector<bool> needs(static_cast<size_t>(p), false);
    for (int s = 0; s < p && s < static_cast<int>(at_cut.stage_bytes.size()); ++s) {
      needs[s] = worker[at_cut.schedule.placement.rank_of_stage[s]] > budget;
    }
    tried.insert(needs);
  }
  if (p <= kAutoRecomputeExhaustive) {
    for (uint32_t mask = 1; mask + 1 < (uint32_t{1} << p); ++mask) {
      std::vector<bool> flags(static_cast<size_t>(p));
      for (int s = 0; s < p; ++s) flags[s] = (mask >> s) & 1;
      tried.insert(flags);
    }
  } else {
    for (int k = 1; k < p; ++k) {
      std::vector<bool> flags(static_cast<size_t>(p), false);
      std::fill(flags.begin(), flags.begin() + k, true);
      tried.insert(flags);
    }
  }
  // A plan without a predicted step (its simulation failed) ranks last.
  const auto step = [](const PipelinePlan& x) {
    return x.predicted_step_seconds > 0 ? x.predicted_step_seconds
                                        : std::numeric_limits<double>::infinity();
  };
  const auto count = [](const PipelinePlan& x) {
    return std::count(x.recompute_stages.begin(), x.recompute_stages.end(), true);
  };
  std::optional<PipelinePlan> best;
  if (all.ok()) best = *std::move(all);
  // Without any plan: the refusal that names the smallest budget.
  absl::Status refusal = plain.status();
  const auto keep_smaller = [&](const absl::Status& s) {
    const int64_t need = SmallestBudgetBytes(s);
    const int64_t kept = SmallestBudgetBytes(refusal);
    if (need > 0 && (kept <= 0 || need < kept)) refusal = s;
  };
  if (!best.has_value()) keep_smaller(all.status());
  for (const std::vector<bool>& flags : tried) {
    if (std::none_of(flags.begin(), flags.end(), [](bool b) { return b; }) ||
        std::all_of(flags.begin(), flags.end(), [](bool b) { return b; })) {
      continue;  // the plain plan and the full one were planned above
    }
    absl::StatusOr<PipelinePlan> some = PlanWith(full, profile, flags);
    if (!some.ok()) {
      if (some.status().code() != absl::StatusCode::kResourceExhausted) return some.status();
      keep_smaller(some.status());  // does not fit with only these stages recomputing
      continue;
    }
    // Strictly faster, or as fast with fewer recomputing stages.
    if (!best.has_value() || step(*some) < step(*best) ||
        (step(*some) == step(*best) && count(*some) < count(*best))) {
      best = *std::move(some);
    }
  }
  if (best.has_value()) return *std::move(best);
  return refusal;
}

}  // namespace

absl::StatusOr<PipelinePlan> PlanPipeline(const v1::JobSpec& spec,
                                          const v1::ModelProfile* profile) {
  if (spec.pipeline().recompute() == "auto") return PlanAutoRecompute(spec, profile);
  return PlanWith(spec, profile, {});
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

v1::JobSpec WithUniformCut(const v1::JobSpec& spec) {
  v1::JobSpec uniform = spec;
  uniform.mutable_pipeline()->set_partition("uniform");
  uniform.mutable_pipeline()->clear_cuts();
  uniform.mutable_pipeline()->set_memory_budget_mb(0);
  return uniform;
}

v1::JobSpec WithSchedule(const v1::JobSpec& spec, const std::string& schedule, int chunks) {
  v1::JobSpec s = spec;
  s.mutable_pipeline()->set_schedule(schedule);
  s.mutable_pipeline()->clear_schedule_csv();
  s.mutable_pipeline()->set_chunks(chunks);
  return s;
}

double PredictedBubble(const v1::JobSpec& spec) {
  // Unit costs do not depend on the cut: plan with the uniform one (no profile needed).
  absl::StatusOr<PipelinePlan> plan = PlanPipeline(WithUniformCut(spec));
  return plan.ok() ? PredictedBubble(*plan) : 0.0;
}

v1::StageProgram StageProgramFor(const PipelinePlan& plan, const v1::JobSpec& spec, int gang_rank,
                                 const std::string& job_id, const std::string& rendezvous_prefix) {
  const Placement& placement = plan.schedule.placement;
  const int replicas = std::max(1, spec.pipeline().replicas());
  const int rank = gang_rank % placement.num_ranks;
  const int replica = gang_rank / placement.num_ranks;
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
  if (replicas > 1) {
    // Each replica's pipeline meets under its own prefix, each rank's data-parallel group
    // under another.
    prog.set_rendezvous_prefix(absl::StrCat(rendezvous_prefix, "replica-", replica, "/"));
    prog.set_replica(replica);
    prog.set_num_replicas(replicas);
    prog.set_dp_rendezvous_prefix(absl::StrCat(rendezvous_prefix, "dp-rank-", rank, "/"));
  } else {
    prog.set_rendezvous_prefix(rendezvous_prefix);
  }
  prog.set_micro_batches(plan.schedule.num_micro_batches);
  if (!plan.eval.program.empty()) {
    for (const Action& a : plan.eval.program[rank]) *prog.add_eval_actions() = ToProto(a);
    prog.set_eval_micro_batches(plan.eval.num_micro_batches);
  }
  return prog;
}

}  // namespace tandem
