#include "common/planner.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/partitioner.h"
#include "common/pipeline_plan.h"
#include "common/schedule.h"

namespace tandem {
namespace {

int64_t GlobalBatch(const v1::JobSpec& spec) {
  return int64_t{spec.pipeline().micro_batch_size()} * spec.pipeline().micro_batches();
}

// The largest stage's bytes of a plan, 0 without a profile.
int64_t PeakStageBytes(const PipelinePlan& plan) {
  int64_t peak = 0;
  for (int64_t b : plan.stage_bytes) peak = std::max(peak, b);
  return peak;
}

}  // namespace

std::vector<int> MicroBatchSplits(const v1::JobSpec& spec) {
  const int64_t batch = GlobalBatch(spec);
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
  const int64_t batch = GlobalBatch(spec);
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

std::vector<PlanCandidate> SearchPlans(const v1::JobSpec& spec, const ProfileSource& profiles) {
  std::vector<PlanCandidate> out;
  for (int m : MicroBatchSplits(spec)) {
    const v1::JobSpec split = WithSplit(spec, m);
    std::optional<absl::StatusOr<v1::ModelProfile>> profile;  // measured on first use
    for (const std::string& name : ScheduleNames()) {
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
        c.spec = WithSchedule(split, name, chunks);
        if (!profile.has_value()) profile = profiles(split);
        if (!profile->ok()) {
          c.status = profile->status();
          out.push_back(std::move(c));
          continue;
        }
        absl::StatusOr<PipelinePlan> plan = PlanPipeline(c.spec, &**profile);
        if (!plan.ok()) {
          c.status = plan.status();
          out.push_back(std::move(c));
          continue;
        }
        c.step_seconds = plan->predicted_step_seconds;
        c.bubble = plan->predicted_bubble;
        for (const ActionCosts& s : plan->stage_costs) {
          c.slowest_stage_seconds = std::max(c.slowest_stage_seconds, s.forward + s.backward);
        }
        c.peak_stage_bytes = PeakStageBytes(*plan);
        if (c.step_seconds > 0) {
          c.tokens_per_second =
              static_cast<double>(GlobalBatch(spec)) * spec.model().seq_len() / c.step_seconds;
        }
        out.push_back(std::move(c));
      }
    }
  }
  std::stable_sort(out.begin(), out.end(), [](const PlanCandidate& a, const PlanCandidate& b) {
    if (a.status.ok() != b.status.ok()) return a.status.ok();
    if (!a.status.ok()) return false;
    if (a.step_seconds != b.step_seconds) return a.step_seconds < b.step_seconds;
    if (a.peak_stage_bytes != b.peak_stage_bytes) return a.peak_stage_bytes < b.peak_stage_bytes;
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
        least->micro_batch_size, ": ", least->status.message()));
    status.SetPayload(kSmallestBudgetPayload,
                      absl::Cord(absl::StrCat(SmallestBudgetBytes(least->status))));
    return status;
  }
  return candidates.front().status;
}

std::string DescribeChoice(const PlanCandidate& c, double as_written_step_seconds) {
  std::string out = absl::StrFormat(
      "%s, %d micro-batch%s of %d, %d stage%s per worker: predicted %.3f s per step (bubble "
      "%.1f%%)",
      c.schedule, c.micro_batches, c.micro_batches == 1 ? "" : "es", c.micro_batch_size, c.chunks,
      c.chunks == 1 ? "" : "s", c.step_seconds, 100 * c.bubble);
  if (as_written_step_seconds > 0 && c.step_seconds > 0) {
    absl::StrAppendFormat(&out, ", %.2fx the spec as written (%.3f s)",
                          as_written_step_seconds / c.step_seconds, as_written_step_seconds);
  }
  return out;
}

}  // namespace tandem
