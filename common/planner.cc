#include "common/planner.h"

#include <algorithm>
#include <map>
#include <optional>
#include <utility>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/limits.h"
#include "common/model_desc.h"
#include "common/partitioner.h"
#include "common/pipeline_plan.h"
#include "common/schedule.h"
#include "common/spec.h"

namespace tandem {
namespace {

int Replicas(const v1::JobSpec& spec) { return std::max(1, spec.pipeline().replicas()); }

// Sequences per step over every replica, and per replica.
int64_t GlobalBatch(const v1::JobSpec& spec) {
  return int64_t{spec.pipeline().micro_batch_size()} * spec.pipeline().micro_batches() *
         Replicas(spec);
}
int64_t ReplicaBatch(const v1::JobSpec& spec) {
  return int64_t{spec.pipeline().micro_batch_size()} * spec.pipeline().micro_batches();
}

// The fullest worker's bytes of a plan (its stages' together), 0 without a profile.
int64_t PeakWorkerBytes(const PipelinePlan& plan) {
  int64_t peak = 0;
  for (int64_t b : WorkerBytes(plan)) peak = std::max(peak, b);
  return peak;
}

}  // namespace

std::vector<std::pair<int, int>> Factorizations(const v1::JobSpec& spec) {
  const int workers = GangSize(spec);
  const int64_t batch = GlobalBatch(spec);
  std::vector<std::pair<int, int>> out;
  for (int p = workers; p >= 1; --p) {
    if (workers % p != 0) continue;
    const int r = workers / p;
    if (p > NumLayers(spec.model())) continue;  // every stage needs a layer
    if (r > kMaxReplicas || batch % r != 0) continue;
    // Sharded optimizer state runs on cpu workers only (spec validation says why).
    if (r > 1 && spec.device() == "cuda" && spec.optimizer().shard_state()) continue;
    out.push_back({p, r});
  }
  return out;
}

v1::JobSpec WithFactorization(const v1::JobSpec& spec, int stages, int replicas) {
  const int64_t per_replica = GlobalBatch(spec) / replicas;
  v1::JobSpec s = spec;
  s.mutable_pipeline()->set_stages(stages);
  s.mutable_pipeline()->set_replicas(replicas);
  // Whole micro-batches of the size as written where they divide the replica's share, else
  // one micro-batch of all of it (the search splits it again).
  const int64_t size = spec.pipeline().micro_batch_size();
  if (per_replica % size == 0) {
    s.mutable_pipeline()->set_micro_batches(static_cast<int>(per_replica / size));
  } else {
    s.mutable_pipeline()->set_micro_batch_size(static_cast<int>(per_replica));
    s.mutable_pipeline()->set_micro_batches(1);
  }
  return s;
}

std::vector<int> MicroBatchSplits(const v1::JobSpec& spec) {
  const int64_t batch = ReplicaBatch(spec);
  const int64_t eval_sequences = spec.eval().every() > 0 ? int64_t{spec.eval().micro_batches()} *
                                                               spec.pipeline().micro_batch_size()
                                                         : 0;
  // Fewer micro-batches than workers leave a worker idle during every micro-batch; such a
  // split is only tried when the batch allows no other.
  const int least = batch >= spec.pipeline().stages() ? spec.pipeline().stages() : 1;
  std::vector<int> out;
  for (int m = least; m <= kMaxPlannedMicroBatches && m <= batch; ++m) {
    if (batch % m != 0) continue;
    const int64_t size = batch / m;
    if (eval_sequences > 0 && eval_sequences % size != 0) continue;
    out.push_back(m);
  }
  return out;
}

v1::JobSpec WithSplit(const v1::JobSpec& spec, int micro_batches) {
  const int64_t batch = ReplicaBatch(spec);
  const int size = static_cast<int>(batch / micro_batches);
  v1::JobSpec s = spec;
  if (spec.eval().every() > 0) {
    const int64_t eval_sequences =
        int64_t{spec.eval().micro_batches()} * spec.pipeline().micro_batch_size();
    s.mutable_eval()->set_micro_batches(static_cast<int>(eval_sequences / size));
  }
  s.mutable_pipeline()->set_micro_batch_size(size);
  s.mutable_pipeline()->set_micro_batches(micro_batches);
  return s;
}

std::vector<PlanCandidate> SearchPlans(const v1::JobSpec& written, const ProfileSource& profiles) {
  std::vector<PlanCandidate> out;
  // A profile per micro-batch size, shared by every factorization that uses it.
  std::map<int, absl::StatusOr<v1::ModelProfile>> by_size;
  // The factorization as written first: its profiles say whether a link was measured before
  // any other factorization asks for a profile of its own.
  std::vector<std::pair<int, int>> ways = Factorizations(written);
  const std::pair<int, int> written_way = {written.pipeline().stages(), Replicas(written)};
  std::stable_partition(ways.begin(), ways.end(),
                        [&](const std::pair<int, int>& w) { return w == written_way; });
  std::optional<bool> has_link;  // known once a profile was fetched
  for (const std::pair<int, int>& way : ways) {
    const int stages = way.first;
    const int replicas = way.second;
    const v1::JobSpec spec = WithFactorization(written, stages, replicas);
    const bool as_written = std::pair{stages, replicas} == written_way;
    for (int m : MicroBatchSplits(spec)) {
      const v1::JobSpec split = WithSplit(spec, m);
      const int size = split.pipeline().micro_batch_size();
      for (const std::string& name : AllScheduleNames()) {
        // One stage: every schedule does the same work on one worker; 1F1B stands for them.
        if (stages == 1 && replicas > 1 && name != "1f1b") continue;
        for (int chunks :
             name == "interleaved_1f1b" ? std::vector<int>{2, 3, 4} : std::vector<int>{0}) {
          // Candidates the generator refuses (M < P, M not a multiple of P, ...) are not plans.
          absl::StatusOr<Schedule> compute =
              GenerateSchedule(name, spec.pipeline().stages(), m, chunks);
          if (!compute.ok()) continue;
          if (compute->placement.num_stages() > NumLayers(spec.model())) continue;
          PlanCandidate c;
          c.schedule = name;
          c.chunks = compute->placement.num_stages() / compute->placement.num_ranks;
          c.micro_batches = m;
          c.micro_batch_size = split.pipeline().micro_batch_size();
          c.stages = stages;
          c.replicas = replicas;
          c.spec = WithSchedule(split, name, chunks);
          // Another split of the workers trades the pipeline's bubble for the gradient
          // reduction (or back): without a measured link that trade cannot be priced, so only
          // the factorization as written is planned (and no profile is asked for the others).
          auto unpriced = [&] {
            return absl::FailedPreconditionError(absl::StrCat(
                stages, " stages x ", replicas,
                " replicas: the profile has no measured link to price the gradient reduction "
                "and the transfers with (it needs two idle workers when profiled)"));
          };
          if (!as_written && has_link.has_value() && !*has_link) {
            c.status = unpriced();
            out.push_back(std::move(c));
            continue;
          }
          auto it = by_size.find(size);
          if (it == by_size.end()) it = by_size.emplace(size, profiles(split)).first;
          const absl::StatusOr<v1::ModelProfile>& profile = it->second;
          if (!profile.ok()) {
            c.status = profile.status();
            out.push_back(std::move(c));
            continue;
          }
          if (!has_link.has_value()) has_link = profile->has_link();
          if (!as_written && !profile->has_link()) {
            c.status = unpriced();
            out.push_back(std::move(c));
            continue;
          }
          absl::StatusOr<PipelinePlan> plan = PlanPipeline(c.spec, &*profile);
          // Over the budget without recomputation: recomputation trades time for memory.
          if (!plan.ok() && plan.status().code() == absl::StatusCode::kResourceExhausted &&
              c.spec.pipeline().recompute() == "none") {
            // auto: only the stages that do not fit without it recompute.
            v1::JobSpec recomputed = c.spec;
            recomputed.mutable_pipeline()->set_recompute("auto");
            absl::StatusOr<PipelinePlan> with = PlanPipeline(recomputed, &*profile);
            // It fits so; or, when nothing fits, it needs the smaller budget (what the
            // refusal then names).
            const int64_t needed = SmallestBudgetBytes(with.status());
            if (with.ok() || (needed > 0 && needed < SmallestBudgetBytes(plan.status()))) {
              plan = std::move(with);
              c.spec = std::move(recomputed);
              c.recompute = true;
            }
          }
          if (!plan.ok()) {
            c.status = plan.status();
            out.push_back(std::move(c));
            continue;
          }
          c.step_seconds = plan->predicted_step_seconds;
          c.bubble = plan->predicted_bubble;
          for (bool r : plan->recompute_stages) c.recompute_stages += r ? 1 : 0;
          for (const ActionCosts& s : plan->stage_costs) {
            c.slowest_stage_seconds = std::max(c.slowest_stage_seconds, s.forward + s.backward);
          }
          c.peak_stage_bytes = PeakWorkerBytes(*plan);
          c.reduce_exposed_seconds = plan->predicted_reduce_exposed_seconds;
          if (c.step_seconds > 0) {
            c.tokens_per_second =
                static_cast<double>(GlobalBatch(spec)) * spec.model().seq_len() / c.step_seconds;
          }
          out.push_back(std::move(c));
        }
      }
    }
  }
  std::stable_sort(out.begin(), out.end(), [](const PlanCandidate& a, const PlanCandidate& b) {
    if (a.status.ok() != b.status.ok()) return a.status.ok();
    if (!a.status.ok()) return false;
    if (a.step_seconds != b.step_seconds) return a.step_seconds < b.step_seconds;
    if (a.peak_stage_bytes != b.peak_stage_bytes) return a.peak_stage_bytes < b.peak_stage_bytes;
    if (a.replicas != b.replicas) return a.replicas < b.replicas;
    return a.micro_batches < b.micro_batches;
  });
  return out;
}

absl::StatusOr<PlanCandidate> ChoosePlan(const std::vector<PlanCandidate>& candidates) {
  if (candidates.empty()) {
    return absl::InvalidArgumentError(
        "the planner found no schedule and split of the global batch for these stages (every "
        "schedule needs micro_batches >= stages, and stages x chunks <= model.n_layer + 2)");
  }
  if (candidates.front().status.ok() && candidates.front().step_seconds > 0) {
    return candidates.front();
  }
  // None fits. Over the budget: report the candidate whose cut needs the least memory.
  const PlanCandidate* least = nullptr;
  for (const PlanCandidate& c : candidates) {
    const int64_t bytes = SmallestBudgetBytes(c.status);
    if (bytes > 0 && (least == nullptr || bytes < SmallestBudgetBytes(least->status))) least = &c;
  }
  if (least != nullptr) {
    absl::Status status = absl::ResourceExhaustedError(absl::StrCat(
        "no schedule or split of the global batch fits pipeline.memory_budget_mb; the least "
        "demanding is ",
        least->schedule, " with ", least->micro_batches, " micro-batches of ",
        least->micro_batch_size, least->recompute ? " and recomputation" : "", ": ",
        least->status.message()));
    status.SetPayload(kSmallestBudgetPayload,
                      absl::Cord(absl::StrCat(SmallestBudgetBytes(least->status))));
    return status;
  }
  return candidates.front().status;
}

std::string DescribeChoice(const PlanCandidate& c, double as_written_step_seconds) {
  std::string out = absl::StrFormat(
      "%s%s, %d micro-batch%s of %d, %d stage%s per worker: predicted %.3f s per step (bubble "
      "%.1f%%",
      c.replicas > 1 ? absl::StrFormat("%d stage%s x %d replicas, ", c.stages,
                                       c.stages == 1 ? "" : "s", c.replicas)
                     : "",
      c.schedule, c.micro_batches, c.micro_batches == 1 ? "" : "es", c.micro_batch_size, c.chunks,
      c.chunks == 1 ? "" : "s", c.step_seconds, 100 * c.bubble);
  if (c.replicas > 1) {
    absl::StrAppendFormat(&out, ", gradient reduction exposed %.3f s", c.reduce_exposed_seconds);
  }
  absl::StrAppend(&out, ")");
  if (c.recompute) {
    absl::StrAppendFormat(&out,
                          ", with recomputation on %d of %d stages (it fits the budget only so)",
                          c.recompute_stages, c.stages * c.chunks);
  }
  if (as_written_step_seconds > 0 && c.step_seconds > 0) {
    absl::StrAppendFormat(&out, ", %.2fx the spec as written (%.3f s)",
                          as_written_step_seconds / c.step_seconds, as_written_step_seconds);
  }
  return out;
}

std::string DescribeFactorizations(const std::vector<PlanCandidate>& candidates) {
  // The fastest feasible candidate of each (stages, replicas), in the search's order.
  std::vector<const PlanCandidate*> best;
  for (const PlanCandidate& c : candidates) {
    if (!c.status.ok() || c.step_seconds <= 0) continue;
    const bool seen = std::any_of(best.begin(), best.end(), [&](const PlanCandidate* b) {
      return b->stages == c.stages && b->replicas == c.replicas;
    });
    if (!seen) best.push_back(&c);
  }
  if (best.size() < 2) return "";
  std::vector<std::string> parts;
  for (const PlanCandidate* c : best) {
    std::string why = absl::StrFormat("bubble %.1f%%", 100 * c->bubble);
    if (c->replicas > 1) {
      absl::StrAppendFormat(&why, ", reduction exposed %.3f s", c->reduce_exposed_seconds);
    }
    parts.push_back(absl::StrFormat("%d x %d: %.3f s (%s, %s)", c->stages, c->replicas,
                                    c->step_seconds, c->schedule, why));
  }
  return absl::StrCat("stages x replicas, each at its best: ", absl::StrJoin(parts, "; "));
}

}  // namespace tandem
