#include "common/planner.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <map>

#include "common/model_desc.h"
#include "common/partitioner.h"
#include "common/pipeline_plan.h"
#include "common/spec.h"

namespace tandem {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

v1::JobSpec Spec(int stages, int micro_batch_size, int micro_batches) {
  v1::JobSpec spec;
  spec.set_name("plan");
  spec.mutable_model()->set_n_layer(6);
  spec.mutable_pipeline()->set_stages(stages);
  spec.mutable_pipeline()->set_micro_batch_size(micro_batch_size);
  spec.mutable_pipeline()->set_micro_batches(micro_batches);
  spec.mutable_pipeline()->set_partition("profile");
  return WithDefaults(spec);
}

// A synthetic profile: every layer costs `overhead` + `per_sequence` x micro-batch size
// forward (backward twice that, I and W one each), activations 1 MiB per sequence.
v1::ModelProfile LinearProfile(const v1::JobSpec& spec, double overhead, double per_sequence) {
  const int b = spec.pipeline().micro_batch_size();
  v1::ModelProfile p;
  p.set_device("cpu");
  p.set_threads(1);
  for (int g = 0; g < NumLayers(spec.model()); ++g) {
    v1::LayerProfile* l = p.add_layers();
    l->set_layer(g);
    const double f = overhead + per_sequence * b;
    l->set_forward_seconds(f);
    l->set_backward_seconds(2 * f);
    l->set_backward_input_seconds(f);
    l->set_backward_weight_seconds(f);
    l->set_static_bytes(1 << 20);
    l->set_activation_bytes(int64_t{b} << 20);
    l->set_output_bytes(int64_t{b} << 16);
  }
  return p;
}

// Counts the profiles asked for, per micro-batch size.
struct CountingSource {
  double overhead;
  double per_sequence;
  std::map<int, int> calls;
  ProfileSource Source() {
    return [this](const v1::JobSpec& s) -> absl::StatusOr<v1::ModelProfile> {
      ++calls[s.pipeline().micro_batch_size()];
      return LinearProfile(s, overhead, per_sequence);
    };
  }
};

TEST(MicroBatchSplitsTest, DividesTheGlobalBatchAndTheEvaluation) {
  v1::JobSpec spec = Spec(2, 4, 8);                                   // 32 sequences
  EXPECT_THAT(MicroBatchSplits(spec), ElementsAre(2, 4, 8, 16, 32));  // M >= P = 2
  EXPECT_THAT(MicroBatchSplits(Spec(4, 1, 2)), ElementsAre(1, 2));    // a batch below P
  spec.mutable_eval()->set_every(10);
  spec.mutable_eval()->set_micro_batches(2);  // 8 sequences: micro-batches of 1, 2, 4 or 8
  EXPECT_THAT(MicroBatchSplits(spec), ElementsAre(4, 8, 16, 32));
}

TEST(MicroBatchSplitsTest, StopsAtTheLargestPlannedCount) {
  const v1::JobSpec spec = Spec(2, 128, 2);  // 256 sequences
  const std::vector<int> splits = MicroBatchSplits(spec);
  EXPECT_EQ(splits.back(), kMaxPlannedMicroBatches);
}

TEST(WithSplitTest, KeepsTheSequencesOfBothBatches) {
  v1::JobSpec spec = Spec(2, 4, 8);
  spec.mutable_eval()->set_every(10);
  spec.mutable_eval()->set_micro_batches(2);
  const v1::JobSpec s = WithSplit(spec, 16);
  EXPECT_EQ(s.pipeline().micro_batch_size(), 2);
  EXPECT_EQ(s.pipeline().micro_batches(), 16);
  EXPECT_EQ(s.eval().micro_batches(), 4);  // still 8 sequences
}

TEST(SearchPlansTest, EveryCandidateIsThePlanOfItsOwnSpec) {
  const v1::JobSpec spec = Spec(2, 4, 8);
  CountingSource src{0.001, 0.002, {}};
  const std::vector<PlanCandidate> all = SearchPlans(spec, src.Source());
  ASSERT_FALSE(all.empty());
  for (const PlanCandidate& c : all) {
    if (c.replicas > 1) {
      // Without a measured link the 1 x 2 split cannot be priced.
      EXPECT_EQ(c.status.code(), absl::StatusCode::kFailedPrecondition) << c.status;
      EXPECT_THAT(std::string(c.status.message()), HasSubstr("no measured link"));
      continue;
    }
    ASSERT_TRUE(c.status.ok()) << c.schedule << " M=" << c.micro_batches << ": " << c.status;
    EXPECT_EQ(c.micro_batches * c.micro_batch_size, 32);
    EXPECT_GE(c.micro_batches, 2) << "M >= P";
    const v1::ModelProfile profile = LinearProfile(c.spec, 0.001, 0.002);
    absl::StatusOr<PipelinePlan> plan = PlanPipeline(c.spec, &profile);
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_DOUBLE_EQ(c.step_seconds, plan->predicted_step_seconds);
    EXPECT_NEAR(c.tokens_per_second, 32.0 * spec.model().seq_len() / c.step_seconds, 1e-9);
  }
  for (size_t i = 1; i < all.size(); ++i) {
    if (all[i].status.ok()) {
      EXPECT_LE(all[i - 1].step_seconds, all[i].step_seconds);
    }
  }
  // One profile per micro-batch size, however many schedules use it.
  for (const auto& [size, n] : src.calls) EXPECT_EQ(n, 1) << "size " << size;
  EXPECT_EQ(src.calls.size(), 5u);  // M = 2, 4, 8, 16, 32
}

TEST(SearchPlansTest, WithoutPerMicroBatchOverheadMoreMicroBatchesWin) {
  // Cost proportional to the micro-batch: splitting finer only shrinks the bubble.
  CountingSource src{0.0, 0.002, {}};
  absl::StatusOr<PlanCandidate> best = ChoosePlan(SearchPlans(Spec(2, 4, 8), src.Source()));
  ASSERT_TRUE(best.ok()) << best.status();
  EXPECT_EQ(best->micro_batches, 32);
  EXPECT_EQ(best->micro_batch_size, 1);
}

TEST(SearchPlansTest, AHeavyPerMicroBatchOverheadKeepsMicroBatchesLarge) {
  // 1f1b step ~ (M + P - 1) (c + k B/M): with c >> k the fewest micro-batches win.
  CountingSource src{0.010, 0.0001, {}};
  absl::StatusOr<PlanCandidate> best = ChoosePlan(SearchPlans(Spec(2, 4, 8), src.Source()));
  ASSERT_TRUE(best.ok()) << best.status();
  EXPECT_EQ(best->micro_batches, 2);
}

TEST(SearchPlansTest, TheBudgetRulesOutGpipesManyLiveMicroBatches) {
  v1::JobSpec spec = Spec(2, 1, 32);
  CountingSource src{0.0, 0.002, {}};
  // Each stage: 4 layers x 1 MiB static; 1f1b keeps at most 2 micro-batches of 4 x B MiB.
  spec.mutable_pipeline()->set_memory_budget_mb(4 + 2 * 4 + 1);
  const std::vector<PlanCandidate> all = SearchPlans(spec, src.Source());
  bool saw_gpipe_refused = false;
  for (const PlanCandidate& c : all) {
    if (c.schedule == "gpipe" && c.micro_batches == 32) {
      // Refused, or planned only with recomputation (32 micro-batches' layer inputs fit).
      if (c.status.ok()) {
        EXPECT_TRUE(c.recompute);
        EXPECT_EQ(c.spec.pipeline().recompute(), "auto");
      } else {
        EXPECT_EQ(c.status.code(), absl::StatusCode::kResourceExhausted) << c.status;
      }
      saw_gpipe_refused = true;
    }
    if (c.status.ok()) {
      EXPECT_LE(c.peak_stage_bytes, (4 + 2 * 4 + 1) << 20);
    }
  }
  EXPECT_TRUE(saw_gpipe_refused);
  absl::StatusOr<PlanCandidate> best = ChoosePlan(all);
  ASSERT_TRUE(best.ok()) << best.status();
  EXPECT_NE(best->schedule, "gpipe");
}

TEST(SearchPlansTest, NoFeasiblePlanNamesTheSmallestBudget) {
  v1::JobSpec spec = Spec(2, 4, 8);
  spec.mutable_pipeline()->set_memory_budget_mb(1);  // below even one stage's static bytes
  CountingSource src{0.0, 0.002, {}};
  const std::vector<PlanCandidate> all = SearchPlans(spec, src.Source());
  absl::StatusOr<PlanCandidate> best = ChoosePlan(all);
  ASSERT_EQ(best.status().code(), absl::StatusCode::kResourceExhausted) << best.status();
  EXPECT_THAT(std::string(best.status().message()),
              HasSubstr("no schedule or split of the global batch fits"));
  // The least of the candidates' own smallest budgets (each exact, from the partitioner).
  int64_t least = 0;
  for (const PlanCandidate& c : all) {
    if (c.replicas > 1) continue;  // not priced without a link
    const int64_t b = SmallestBudgetBytes(c.status);
    ASSERT_GT(b, int64_t{1} << 20) << c.schedule << " M=" << c.micro_batches;
    if (least == 0 || b < least) least = b;
  }
  EXPECT_EQ(SmallestBudgetBytes(best.status()), least);
  EXPECT_THAT(std::string(best.status().message()), HasSubstr("smallest budget that fits"));
}

// A candidate that fits the budget only with recomputation is planned with it, not refused
// (and the choice says so); every candidate planned stays within the budget.
TEST(SearchPlansTest, ACandidateThatOnlyRecomputationFitsIsPlannedWithIt) {
  v1::JobSpec spec = Spec(2, 4, 8);
  CountingSource src{0.0, 0.002, {}};
  // 1F1B with 8 micro-batches of 4: stage 0 holds about 4 layers x 1 MiB static and two
  // micro-batches of 4 x 4 MiB (36 MiB); with recomputation only their layers' inputs,
  // 4 x 256 KiB each, and one layer's 4 MiB working set (about 10.5 MiB).
  const int64_t budget_mb = 12;
  spec.mutable_pipeline()->set_memory_budget_mb(budget_mb);
  const std::vector<PlanCandidate> all = SearchPlans(spec, src.Source());
  const PlanCandidate* ofob = nullptr;
  for (const PlanCandidate& c : all) {
    if (c.schedule == "1f1b" && c.micro_batches == 8 && c.replicas == 1) ofob = &c;
    if (!c.status.ok()) continue;
    EXPECT_LE(c.peak_stage_bytes, budget_mb << 20) << c.schedule << " M=" << c.micro_batches;
    EXPECT_EQ(c.spec.pipeline().recompute(), c.recompute ? "auto" : "none");
  }
  ASSERT_NE(ofob, nullptr);
  ASSERT_TRUE(ofob->status.ok()) << ofob->status;
  EXPECT_TRUE(ofob->recompute);
  EXPECT_THAT(DescribeChoice(*ofob, 0), HasSubstr("with recomputation on 2 of 2 stages"));
  EXPECT_TRUE(ChoosePlan(all).ok());
  // cuda workers recompute too (a stage at once, so each stage holds its whole working set
  // from its R to its backward): the same candidate fits with it, and within the budget.
  spec.set_device("cuda");
  bool cuda_recomputes = false;
  for (const PlanCandidate& c : SearchPlans(spec, src.Source())) {
    if (!c.status.ok()) continue;
    EXPECT_LE(c.peak_stage_bytes, budget_mb << 20) << c.schedule << " M=" << c.micro_batches;
    cuda_recomputes = cuda_recomputes || c.recompute;
  }
  EXPECT_TRUE(cuda_recomputes);
}

TEST(SearchPlansTest, AProfileThatCannotBeMeasuredMakesItsSplitInfeasible) {
  const v1::JobSpec spec = Spec(2, 4, 8);
  ProfileSource src = [](const v1::JobSpec& s) -> absl::StatusOr<v1::ModelProfile> {
    if (s.pipeline().micro_batch_size() == 1) return absl::UnavailableError("worker w1 is busy");
    return LinearProfile(s, 0.0, 0.002);
  };
  const std::vector<PlanCandidate> all = SearchPlans(spec, src);
  absl::StatusOr<PlanCandidate> best = ChoosePlan(all);
  ASSERT_TRUE(best.ok());
  EXPECT_EQ(best->micro_batches, 16);
  const bool named = std::any_of(all.begin(), all.end(), [](const PlanCandidate& c) {
    return c.micro_batch_size == 1 && c.replicas == 1 &&
           c.status.message().find("w1 is busy") != absl::string_view::npos;
  });
  EXPECT_TRUE(named) << "the size-1 split names the profile's error";
}

// Data parallelism: the workers as stages x replicas.
TEST(FactorizationsTest, EveryWayTheWorkersAndTheBatchAllow) {
  // 4 workers, 8 layers, a global batch of 4 x 4 = 16: 4 x 1, 2 x 2 and 1 x 4.
  EXPECT_THAT(Factorizations(Spec(4, 4, 4)),
              ElementsAre(std::pair{4, 1}, std::pair{2, 2}, std::pair{1, 4}));
  // A batch of 6 sequences does not split over 4 replicas.
  EXPECT_THAT(Factorizations(Spec(4, 3, 2)), ElementsAre(std::pair{4, 1}, std::pair{2, 2}));
  // 16 workers, 8 layers: 16 stages cannot run.
  v1::JobSpec many = Spec(16, 4, 16);
  EXPECT_EQ(Factorizations(many).front(), (std::pair{8, 2}));
  // The global batch is kept: 2 x 2 has 2 micro-batches of 4 per replica.
  const v1::JobSpec two_by_two = WithFactorization(Spec(4, 4, 4), 2, 2);
  EXPECT_EQ(two_by_two.pipeline().stages(), 2);
  EXPECT_EQ(two_by_two.pipeline().replicas(), 2);
  EXPECT_EQ(EffectiveBatch(two_by_two), 16);
  EXPECT_EQ(two_by_two.pipeline().micro_batch_size(), 4);
}

// Replicas have no bubble but pay the all-reduce over the link: on a free link the planner
// takes all replicas, on a slow one it pipelines; it says why.
TEST(SearchPlansTest, TheLinkDecidesBetweenStagesAndReplicas) {
  auto search = [](double seconds_per_byte) {
    return SearchPlans(Spec(4, 4, 4),
                       [&](const v1::JobSpec& s) -> absl::StatusOr<v1::ModelProfile> {
                         v1::ModelProfile p = LinearProfile(s, 0.0, 0.001);
                         for (v1::LayerProfile& l : *p.mutable_layers())
                           l.set_parameter_count(1 << 20);
                         p.mutable_link()->set_worker_a("w-1");
                         p.mutable_link()->set_seconds_per_byte(seconds_per_byte);
                         return p;
                       });
  };
  const std::vector<PlanCandidate> fast = search(1e-12);
  absl::StatusOr<PlanCandidate> best = ChoosePlan(fast);
  ASSERT_TRUE(best.ok()) << best.status();
  EXPECT_EQ(best->stages, 1);
  EXPECT_EQ(best->replicas, 4);
  EXPECT_EQ(best->spec.pipeline().replicas(), 4);
  const std::string why = DescribeFactorizations(fast);
  EXPECT_THAT(why, HasSubstr("stages x replicas, each at its best: 1 x 4: "));
  EXPECT_THAT(why, HasSubstr("; 4 x 1: "));
  // 8 layers x 4 MiB of gradients each at 1 s/MB: replicas cost seconds, stages milliseconds.
  const std::vector<PlanCandidate> slow = search(1e-6);
  best = ChoosePlan(slow);
  ASSERT_TRUE(best.ok()) << best.status();
  EXPECT_EQ(best->replicas, 1);
  EXPECT_EQ(best->stages, 4);
  for (const PlanCandidate& c : slow) {
    if (c.status.ok() && c.replicas > 1) {
      EXPECT_GT(c.reduce_exposed_seconds, 0.5);
    }
  }
}

TEST(ChoosePlanTest, NoCandidatesIsAnError) {
  EXPECT_EQ(ChoosePlan({}).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(DescribeChoiceTest, SaysWhatAndHowMuchFaster) {
  PlanCandidate c;
  c.schedule = "zb_h1";
  c.chunks = 1;
  c.micro_batches = 8;
  c.micro_batch_size = 4;
  c.step_seconds = 1.0;
  c.bubble = 0.061;
  EXPECT_EQ(DescribeChoice(c, 1.31),
            "zb_h1, 8 micro-batches of 4, 1 stage per worker: predicted 1.000 s per step "
            "(bubble 6.1%), 1.31x the spec as written (1.310 s)");
}

}  // namespace
}  // namespace tandem

namespace tandem {
namespace {

TEST(PlanPipelineTest, AMeasuredLinkMakesTransfersCost) {
  const v1::JobSpec spec = Spec(2, 4, 4);
  v1::ModelProfile profile = LinearProfile(spec, 0.0, 0.001);
  absl::StatusOr<PipelinePlan> free = PlanPipeline(spec, &profile);
  ASSERT_TRUE(free.ok()) << free.status();
  v1::LinkProfile* link = profile.mutable_link();
  link->set_latency_seconds(0.001);
  link->set_seconds_per_byte(0.0);
  absl::StatusOr<PipelinePlan> linked = PlanPipeline(spec, &profile);
  ASSERT_TRUE(linked.ok()) << linked.status();
  EXPECT_NEAR(linked->stage_costs[0].transfer, 0.001, 1e-12);
  // The first micro-batch's activation goes up and its gradient comes back on the critical
  // path: at least two transfers longer.
  EXPECT_GE(linked->predicted_step_seconds, free->predicted_step_seconds + 0.002 - 1e-12);
}

TEST(PlanPipelineTest, ProfileKeepsTheUniformCutWithinTheTolerance) {
  const v1::JobSpec spec = Spec(2, 4, 4);  // 8 layers: uniform 4 | 4
  // Relative to a block: embedding 0.1, head `head`. Uniform: 3.1 | 3 + head; moving block_3
  // to the first stage: 4.1 | 2 + head.
  auto plan_with_head = [&](double head) {
    v1::ModelProfile profile = LinearProfile(spec, 0.0, 0.001);
    auto scale = [&](int g, double k) {
      v1::LayerProfile* l = profile.mutable_layers(g);
      l->set_forward_seconds(l->forward_seconds() * k);
      l->set_backward_seconds(l->backward_seconds() * k);
    };
    scale(0, 0.1);
    scale(7, head);
    return PlanPipeline(spec, &profile);
  };
  // head 1.15: the optimum 5 | 3 (4.1) is 1.2% better than uniform (4.15): uniform is kept.
  absl::StatusOr<PipelinePlan> near = plan_with_head(1.15);
  ASSERT_TRUE(near.ok()) << near.status();
  EXPECT_EQ(near->ranges[0].end, 4);
  EXPECT_THAT(near->partition, HasSubstr("uniform (within the tolerance"));
  // head 1.3: 4.1 against 4.3 is 4.9% better: the profile's cut.
  absl::StatusOr<PipelinePlan> far = plan_with_head(1.3);
  ASSERT_TRUE(far.ok()) << far.status();
  EXPECT_EQ(far->ranges[0].end, 5);
  EXPECT_EQ(far->partition, "profile");
}

TEST(PlanPipelineTest, ProfileWithoutAProfileCutsByParameters) {
  const v1::JobSpec spec = Spec(2, 4, 4);
  absl::StatusOr<PipelinePlan> plan = PlanPipeline(spec);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->partition, "parameters");
}

}  // namespace
}  // namespace tandem
