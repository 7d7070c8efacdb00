#include "common/pipeline_plan.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "common/model_desc.h"
#include "common/partitioner.h"
#include "common/schedule.h"
#include "common/schedule_check.h"
#include "common/spec.h"

namespace tandem {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// A GPT of 6 blocks (8 layers: embedding, blocks, head) on `stages` workers, defaults filled.
v1::JobSpec Spec(const std::string& schedule, int stages, int micro_batches) {
  v1::JobSpec spec;
  spec.set_name("plan");
  spec.mutable_model()->set_n_layer(6);
  spec.mutable_pipeline()->set_schedule(schedule);
  spec.mutable_pipeline()->set_stages(stages);
  spec.mutable_pipeline()->set_micro_batches(micro_batches);
  return WithDefaults(spec);
}

// Every layer costs forward 1 s, backward 2 s (I 1 + W 1), and its optimizer step 0.5 s.
v1::ModelProfile UnitProfile(const v1::JobSpec& spec) {
  v1::ModelProfile p;
  for (int g = 0; g < NumLayers(spec.model()); ++g) {
    v1::LayerProfile* l = p.add_layers();
    l->set_layer(g);
    l->set_forward_seconds(1.0);
    l->set_backward_seconds(2.0);
    l->set_backward_input_seconds(1.0);
    l->set_backward_weight_seconds(1.0);
    l->set_apply_seconds(0.5);
    l->set_static_bytes(1 << 20);
    l->set_activation_bytes(1 << 10);
  }
  return p;
}

// The ranges cover the model's layers in order, each stage non-empty.
void ExpectContiguousCover(const std::vector<LayerRange>& ranges, int num_layers) {
  ASSERT_FALSE(ranges.empty());
  EXPECT_EQ(ranges.front().begin, 0);
  EXPECT_EQ(ranges.back().end, num_layers);
  for (size_t s = 0; s < ranges.size(); ++s) {
    EXPECT_LT(ranges[s].begin, ranges[s].end) << "stage " << s;
    if (s > 0) {
      EXPECT_EQ(ranges[s].begin, ranges[s - 1].end) << "stage " << s;
    }
  }
}

int Count(const std::vector<Action>& actions, ActionKind kind) {
  int n = 0;
  for (const Action& a : actions) n += a.kind == kind ? 1 : 0;
  return n;
}

TEST(PlanPipelineTest, OneStagePerWorkerCutUniformly) {
  v1::JobSpec spec = Spec("1f1b", 4, 8);
  spec.mutable_pipeline()->set_partition("uniform");
  absl::StatusOr<PipelinePlan> plan = PlanPipeline(spec);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->num_ranks(), 4);
  EXPECT_EQ(plan->num_stages(), 4);
  EXPECT_EQ(plan->schedule.name, "1f1b");
  EXPECT_EQ(plan->schedule.num_micro_batches, 8);
  EXPECT_EQ(plan->partition, "uniform");
  ASSERT_EQ(plan->ranges.size(), 4u);
  ExpectContiguousCover(plan->ranges, 8);
  absl::StatusOr<std::vector<LayerRange>> uniform = UniformPartition(spec.model(), 4);
  ASSERT_TRUE(uniform.ok()) << uniform.status();
  EXPECT_EQ(plan->ranges, *uniform);
  // Without a profile there are no measured figures.
  EXPECT_TRUE(plan->stage_costs.empty());
  EXPECT_TRUE(plan->stage_bytes.empty());
  EXPECT_EQ(plan->predicted_step_seconds, 0.0);
}

TEST(PlanPipelineTest, InterleavedPlacesSeveralStagesPerWorker) {
  v1::JobSpec spec = Spec("interleaved_1f1b", 2, 4);
  spec.mutable_pipeline()->set_chunks(2);
  absl::StatusOr<PipelinePlan> plan = PlanPipeline(spec);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->num_ranks(), 2);
  EXPECT_EQ(plan->num_stages(), 4);
  EXPECT_EQ(plan->schedule.placement, InterleavedPlacement(2, 2));
  ASSERT_EQ(plan->ranges.size(), 4u);
  ExpectContiguousCover(plan->ranges, 8);
}

TEST(PlanPipelineTest, ScheduleIsLoweredWithTransfersAndValid) {
  const int p = 4, m = 8;
  absl::StatusOr<PipelinePlan> plan = PlanPipeline(Spec("gpipe", p, m));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(ValidateSchedule(plan->schedule).ok());
  ASSERT_EQ(plan->schedule.program.size(), static_cast<size_t>(p));
  for (int r = 0; r < p; ++r) {
    const std::vector<Action>& actions = plan->schedule.program[r];
    EXPECT_EQ(Count(actions, v1::ACTION_F), m) << "rank " << r;
    EXPECT_EQ(Count(actions, v1::ACTION_B), m) << "rank " << r;
    // Every stage but the first receives its inputs and sends back their gradients; every
    // stage but the last sends its outputs and receives their gradients.
    EXPECT_EQ(Count(actions, v1::ACTION_RECV_F), r > 0 ? m : 0) << "rank " << r;
    EXPECT_EQ(Count(actions, v1::ACTION_SEND_B), r > 0 ? m : 0) << "rank " << r;
    EXPECT_EQ(Count(actions, v1::ACTION_SEND_F), r < p - 1 ? m : 0) << "rank " << r;
    EXPECT_EQ(Count(actions, v1::ACTION_RECV_B), r < p - 1 ? m : 0) << "rank " << r;
  }
  // No evaluation program without eval.every.
  EXPECT_TRUE(plan->eval.program.empty());
}

TEST(PlanPipelineTest, EvalProgramIsForwardOnlyOverTheEvalMicroBatches) {
  v1::JobSpec spec = Spec("1f1b", 2, 4);
  spec.mutable_eval()->set_every(10);
  spec.mutable_eval()->set_micro_batches(3);
  absl::StatusOr<PipelinePlan> plan = PlanPipeline(spec);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->eval.num_micro_batches, 3);
  EXPECT_EQ(plan->eval.placement, plan->schedule.placement);
  ASSERT_EQ(plan->eval.program.size(), 2u);
  for (int r = 0; r < 2; ++r) {
    const std::vector<Action>& actions = plan->eval.program[r];
    EXPECT_EQ(Count(actions, v1::ACTION_F), 3) << "rank " << r;
    for (ActionKind k :
         {v1::ACTION_B, v1::ACTION_I, v1::ACTION_W, v1::ACTION_SEND_B, v1::ACTION_RECV_B}) {
      EXPECT_EQ(Count(actions, k), 0) << "rank " << r << " " << ActionKindName(k);
    }
  }
  EXPECT_EQ(Count(plan->eval.program[0], v1::ACTION_SEND_F), 3);
  EXPECT_EQ(Count(plan->eval.program[1], v1::ACTION_RECV_F), 3);
}

// pipeline.recompute: full puts an R right before every backward of the training program
// (after the gradient's receive: it runs inside the backward), none in the eval program; a
// CSV's own R's are kept.
TEST(PlanPipelineTest, FullRecomputationAddsAnRBeforeEveryBackward) {
  v1::JobSpec spec = Spec("zb_h1", 2, 4);
  spec.mutable_pipeline()->set_recompute("full");
  spec.mutable_eval()->set_every(10);
  absl::StatusOr<PipelinePlan> plan = PlanPipeline(spec);
  ASSERT_TRUE(plan.ok()) << plan.status();
  for (int r = 0; r < 2; ++r) {
    const std::vector<Action>& actions = plan->schedule.program[r];
    EXPECT_EQ(Count(actions, v1::ACTION_R), 4) << "rank " << r;
    for (size_t i = 0; i < actions.size(); ++i) {
      if (actions[i].kind != v1::ACTION_I) continue;
      // (Rank 0: the gradient's receive,) R, then I.
      ASSERT_GE(i, 1u);
      EXPECT_EQ(actions[i - 1], (Action{r, v1::ACTION_R, actions[i].micro_batch})) << i;
      if (r == 0) {
        EXPECT_EQ(actions[i - 2].kind, v1::ACTION_RECV_B) << i;
      }
    }
    EXPECT_EQ(Count(plan->eval.program[r], v1::ACTION_R), 0);
  }
  v1::JobSpec csv = Spec("1f1b", 1, 2);
  csv.mutable_pipeline()->set_schedule_csv("0F0,0F1,0R1,0B1,0R0,0B0\n");
  plan = PlanPipeline(csv);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(ActionsToString(plan->schedule.program[0]), "0F0 0F1 0R1 0B1 0R0 0B0");
}

// With unit costs the simulator's bubble is the textbook (P-1)/(M+P-1) for GPipe and 1F1B.
TEST(PlanPipelineTest, UnitCostBubbleIsTheTextbookOne) {
  for (const char* schedule : {"gpipe", "1f1b"}) {
    for (auto [p, m] : std::vector<std::pair<int, int>>{{2, 4}, {4, 8}, {4, 16}}) {
      absl::StatusOr<PipelinePlan> plan = PlanPipeline(Spec(schedule, p, m));
      ASSERT_TRUE(plan.ok()) << plan.status();
      const double ideal = static_cast<double>(p - 1) / (m + p - 1);
      EXPECT_NEAR(PredictedBubble(*plan), ideal, 1e-12) << schedule << " P" << p << " M" << m;
      EXPECT_NEAR(PredictedBubble(Spec(schedule, p, m)), ideal, 1e-12)
          << schedule << " P" << p << " M" << m;
    }
  }
  // One stage has no bubble.
  EXPECT_NEAR(PredictedBubble(Spec("1f1b", 1, 4)), 0.0, 1e-12);
}

TEST(PlanPipelineTest, UnitCostsAreSharedByTheChunksOfAWorker) {
  const ActionCosts one = UnitCosts(OneStagePerRank(4));
  EXPECT_DOUBLE_EQ(one.forward, 1.0);
  EXPECT_DOUBLE_EQ(one.backward, 2.0);
  EXPECT_DOUBLE_EQ(one.backward_input, 1.0);
  EXPECT_DOUBLE_EQ(one.backward_weight, 1.0);
  const ActionCosts two = UnitCosts(InterleavedPlacement(2, 2));
  EXPECT_DOUBLE_EQ(two.forward, 0.5);
  EXPECT_DOUBLE_EQ(two.backward, 1.0);
  EXPECT_DOUBLE_EQ(two.backward_input, 0.5);
  EXPECT_DOUBLE_EQ(two.backward_weight, 0.5);
}

// With a profile each stage's costs are its layers' summed, and the predicted step is the
// simulated pipeline plus the slowest worker's optimizer phase.
TEST(PlanPipelineTest, ProfileGivesPerStageCostsAndAPredictedStep) {
  const int p = 2, m = 4;
  v1::JobSpec spec = Spec("gpipe", p, m);
  spec.mutable_pipeline()->set_partition("uniform");
  const v1::ModelProfile profile = UnitProfile(spec);
  absl::StatusOr<PipelinePlan> plan = PlanPipeline(spec, &profile);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->ranges.size(), 2u);
  ASSERT_EQ(plan->stage_costs.size(), 2u);
  ASSERT_EQ(plan->stage_bytes.size(), 2u);
  int most_layers = 0;
  for (int s = 0; s < p; ++s) {
    const int layers = plan->ranges[s].end - plan->ranges[s].begin;
    most_layers = std::max(most_layers, layers);
    EXPECT_DOUBLE_EQ(plan->stage_costs[s].forward, layers * 1.0) << "stage " << s;
    EXPECT_DOUBLE_EQ(plan->stage_costs[s].backward, layers * 2.0) << "stage " << s;
    EXPECT_DOUBLE_EQ(plan->stage_costs[s].transfer, 0.0) << "stage " << s;  // no link measured
    EXPECT_GT(plan->stage_bytes[s], 0) << "stage " << s;
  }
  // 8 layers cut in two equal stages of 4: the unit-cost step scaled by 4 layers, (M+P-1) x
  // (F+B) = 5 x 12 s, plus the optimizer phase of one stage's 4 layers, 2 s.
  ASSERT_EQ(most_layers, 4);
  EXPECT_DOUBLE_EQ(plan->predicted_step_seconds, (m + p - 1) * 3.0 * 4 + 4 * 0.5);
  EXPECT_NEAR(plan->predicted_bubble, static_cast<double>(p - 1) / (m + p - 1), 1e-12);
}

// recompute: full with a profile: the stage costs carry the memory model (the working set,
// the checkpoints, the largest layer), the partition counts the R's forward and keeps only
// checkpoints plus one layer per stage; and with a memory budget that leaves room, R's of
// the worker that waits for a slower neighbour move into those waits, which shortens the
// predicted step, with the predicted bytes still within the budget.
// recompute: auto. Without a budget, or where the plan fits without, nothing recomputes.
// Over it, R's only on the stages that do not fit without: 1F1B's stage 0 holds two micro-batches,
// its last stage one, so at a budget of 9 MiB (8 layers of 1 MiB static and 1 MiB of activations,
// 4 | 4; two 64 KiB messages per stage) stage 0 needs 4 + 2 x 4 MiB without and recomputes, stage 1
// 4 + 4 MiB and keeps its activations (no working set: it does not recompute), and the step is
// shorter than with every R inside its backward. At 10 MiB stage 0 has room for one
// micro-batch's activations beside the other's checkpoints and a layer's working set (a
// recomputing backward's, or a forward's that keeps only its inputs): every other micro-batch
// keeps its F's, and only the rest are recomputed (DropRecomputation).
TEST(PlanPipelineTest, AutoRecomputesOnlyTheStagesThatDoNotFitWithout) {
  v1::JobSpec spec = Spec("1f1b", 2, 8);
  spec.mutable_pipeline()->set_recompute("auto");
  v1::ModelProfile profile = UnitProfile(spec);
  for (v1::LayerProfile& l : *profile.mutable_layers()) {
    l.set_activation_bytes(1 << 20);
    l.set_output_bytes(1 << 16);
    l.set_recompute_seconds(0.75);
  }
  auto count_rs = [](const PipelinePlan& plan, int rank) {
    int n = 0;
    for (const Action& a : plan.schedule.program[rank]) n += a.kind == v1::ACTION_R ? 1 : 0;
    return n;
  };
  absl::StatusOr<PipelinePlan> unbounded = PlanPipeline(spec, &profile);
  ASSERT_TRUE(unbounded.ok()) << unbounded.status();
  EXPECT_FALSE(unbounded->recomputes());
  EXPECT_EQ(count_rs(*unbounded, 0) + count_rs(*unbounded, 1), 0);

  spec.mutable_pipeline()->set_memory_budget_mb(9);
  v1::JobSpec none = spec;
  none.mutable_pipeline()->set_recompute("none");
  EXPECT_EQ(PlanPipeline(none, &profile).status().code(), absl::StatusCode::kResourceExhausted);
  absl::StatusOr<PipelinePlan> mixed = PlanPipeline(spec, &profile);
  ASSERT_TRUE(mixed.ok()) << mixed.status();
  EXPECT_THAT(mixed->recompute_stages, ElementsAre(true, false));
  EXPECT_EQ(mixed->ranges[0].end, 4);
  EXPECT_EQ(count_rs(*mixed, 0), 8);
  EXPECT_EQ(count_rs(*mixed, 1), 0);
  EXPECT_TRUE(ValidateSchedule(mixed->schedule).ok());
  for (int64_t b : mixed->stage_bytes) EXPECT_LE(b, int64_t{9} << 20);
  // 4 static + 4 activations, and two messages.
  EXPECT_EQ(mixed->stage_bytes[1], (int64_t{8} << 20) + 2 * (1 << 16));
  // Every R inside its backward (full recomputation, no budget: nothing may raise a peak).
  v1::JobSpec full = spec;
  full.mutable_pipeline()->set_recompute("full");
  full.mutable_pipeline()->clear_memory_budget_mb();
  absl::StatusOr<PipelinePlan> everywhere = PlanPipeline(full, &profile);
  ASSERT_TRUE(everywhere.ok()) << everywhere.status();
  EXPECT_THAT(everywhere->recompute_stages, ElementsAre(true, true));
  EXPECT_EQ(everywhere->recompute_dropped, 0);
  EXPECT_LT(mixed->predicted_step_seconds, everywhere->predicted_step_seconds);
  // Full recomputation under the same budget comes to the same plan: stage 1's R's go.
  full.mutable_pipeline()->set_memory_budget_mb(9);
  absl::StatusOr<PipelinePlan> budgeted = PlanPipeline(full, &profile);
  ASSERT_TRUE(budgeted.ok()) << budgeted.status();
  EXPECT_THAT(budgeted->recompute_stages, ElementsAre(true, false));
  EXPECT_EQ(budgeted->recompute_dropped, 8);
  EXPECT_DOUBLE_EQ(budgeted->predicted_step_seconds, mixed->predicted_step_seconds);

  spec.mutable_pipeline()->set_memory_budget_mb(10);
  absl::StatusOr<PipelinePlan> roomier = PlanPipeline(spec, &profile);
  ASSERT_TRUE(roomier.ok()) << roomier.status();
  EXPECT_THAT(roomier->recompute_stages, ElementsAre(true, false));
  std::vector<int> recomputed;
  for (const Action& a : roomier->schedule.program[0]) {
    if (a.kind == v1::ACTION_R) recomputed.push_back(a.micro_batch);
  }
  EXPECT_THAT(recomputed, ElementsAre(1, 3, 5, 7));
  for (int64_t b : roomier->stage_bytes) EXPECT_LE(b, int64_t{10} << 20);
  EXPECT_GT(roomier->stage_bytes[0], mixed->stage_bytes[0]);
  EXPECT_LT(roomier->predicted_step_seconds, mixed->predicted_step_seconds);

  // A budget even full recomputation does not fit: its refusal, naming the smallest budget.
  spec.mutable_pipeline()->set_memory_budget_mb(2);
  absl::StatusOr<PipelinePlan> none_fits = PlanPipeline(spec, &profile);
  EXPECT_EQ(none_fits.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_GT(SmallestBudgetBytes(none_fits.status()), int64_t{2} << 20);
}

// recompute: auto chooses the cut with the recomputing stages' own costs: 8 layers of 1 MiB
// static and 4 MiB of activations (F 1, B 2, R 1 s), 1F1B on 2 cuda workers (stage 0 keeps two
// micro-batches, stage 1 one; a recomputing cuda stage brings its whole working set back), a
// budget of 26 MiB. Without recomputation no cut fits (stage 0 holds at most 2 layers, stage 1
// at most 5). Recomputing stage 0 only, the cut moves a layer off it, 3 | 5 (12 | 15 s per
// micro-batch), where full recomputation's cut, 4 | 4, would keep 4 layers on it (16 | 12 s):
// the predicted step is shorter than that cut's. (On cuda no micro-batch of stage 0 can keep
// its activations at 26 MiB: beside a recomputing one's working set, that would be two.)
TEST(PlanPipelineTest, AutoCutsForTheStagesItRecomputes) {
  v1::JobSpec spec = Spec("1f1b", 2, 8);
  spec.set_device("cuda");
  spec.mutable_pipeline()->set_recompute("auto");
  spec.mutable_pipeline()->set_memory_budget_mb(26);
  v1::ModelProfile profile = UnitProfile(spec);
  for (v1::LayerProfile& l : *profile.mutable_layers()) {
    l.set_activation_bytes(4 << 20);
    l.set_output_bytes(1 << 16);
    l.set_recompute_seconds(1.0);
  }
  v1::JobSpec none = spec;
  none.mutable_pipeline()->set_recompute("none");
  EXPECT_EQ(PlanPipeline(none, &profile).status().code(), absl::StatusCode::kResourceExhausted);
  absl::StatusOr<PipelinePlan> joint = PlanPipeline(spec, &profile);
  ASSERT_TRUE(joint.ok()) << joint.status();
  EXPECT_THAT(joint->recompute_stages, ElementsAre(true, false));
  EXPECT_THAT(joint->ranges, ElementsAre(LayerRange{0, 3}, LayerRange{3, 8}));
  for (int64_t b : joint->stage_bytes) EXPECT_LE(b, int64_t{26} << 20);
  EXPECT_TRUE(ValidateSchedule(joint->schedule).ok());
  // Full recomputation's cut with the same stage recomputing (auto on that fixed cut).
  v1::JobSpec at_full_cut = spec;
  at_full_cut.mutable_pipeline()->set_partition("manual");
  at_full_cut.mutable_pipeline()->add_cuts(4);
  absl::StatusOr<PipelinePlan> fixed = PlanPipeline(at_full_cut, &profile);
  ASSERT_TRUE(fixed.ok()) << fixed.status();
  EXPECT_THAT(fixed->recompute_stages, ElementsAre(true, false));
  EXPECT_LT(joint->predicted_step_seconds, fixed->predicted_step_seconds);
  v1::JobSpec full = spec;
  full.mutable_pipeline()->set_recompute("full");
  absl::StatusOr<PipelinePlan> everywhere = PlanPipeline(full, &profile);
  ASSERT_TRUE(everywhere.ok()) << everywhere.status();
  EXPECT_EQ(everywhere->ranges[0].end, 4);
  EXPECT_LT(joint->predicted_step_seconds, everywhere->predicted_step_seconds);
}

// Full recomputation is not always the set that needs the least memory: on cuda a recomputing
// stage holds its whole working set beside its checkpoints, so 1F1B's last stage (one
// micro-batch live) needs more recomputing than not. 8 layers of 1 MiB static, 4 MiB of
// activations and 1 MiB messages, a budget of 27 MiB: without recomputation stage 0 holds at
// most 2 layers and stage 1 at most 5; with it everywhere, stage 1 at most 4 and stage 0 at
// most 3, so neither fits, while recomputing stage 0 alone fits at 3 | 5. Below any set, the
// refusal names the smallest budget over them all.
TEST(PlanPipelineTest, AutoFindsASetThatFitsWhereFullRecomputationDoesNot) {
  v1::JobSpec spec = Spec("1f1b", 2, 8);
  spec.set_device("cuda");
  spec.mutable_pipeline()->set_recompute("auto");
  spec.mutable_pipeline()->set_memory_budget_mb(27);
  v1::ModelProfile profile = UnitProfile(spec);
  for (v1::LayerProfile& l : *profile.mutable_layers()) {
    l.set_activation_bytes(4 << 20);
    l.set_output_bytes(1 << 20);
  }
  v1::JobSpec full = spec;
  full.mutable_pipeline()->set_recompute("full");
  EXPECT_EQ(PlanPipeline(full, &profile).status().code(), absl::StatusCode::kResourceExhausted);
  absl::StatusOr<PipelinePlan> some = PlanPipeline(spec, &profile);
  ASSERT_TRUE(some.ok()) << some.status();
  EXPECT_THAT(some->recompute_stages, ElementsAre(true, false));
  EXPECT_THAT(some->ranges, ElementsAre(LayerRange{0, 3}, LayerRange{3, 8}));
  for (int64_t b : some->stage_bytes) EXPECT_LE(b, int64_t{27} << 20);

  spec.mutable_pipeline()->set_memory_budget_mb(10);
  absl::StatusOr<PipelinePlan> none_fits = PlanPipeline(spec, &profile);
  ASSERT_EQ(none_fits.status().code(), absl::StatusCode::kResourceExhausted);
  // The smallest budget over every set is that of recomputing stage 0 alone.
  int64_t smallest = INT64_MAX;
  for (const char* mode : {"none", "full"}) {
    v1::JobSpec s = spec;
    s.mutable_pipeline()->set_recompute(mode);
    smallest = std::min(smallest, SmallestBudgetBytes(PlanPipeline(s, &profile).status()));
  }
  EXPECT_GT(SmallestBudgetBytes(none_fits.status()), int64_t{10} << 20);
  EXPECT_LT(SmallestBudgetBytes(none_fits.status()), smallest);
  EXPECT_LE(SmallestBudgetBytes(none_fits.status()), int64_t{27} << 20);
}

TEST(PlanPipelineTest, RecomputationIsCostedAndHiddenInIdleTimeWithinTheBudget) {
  v1::JobSpec spec = Spec("1f1b", 2, 8);
  spec.mutable_pipeline()->set_recompute("full");
  spec.mutable_pipeline()->set_partition("manual");
  spec.mutable_pipeline()->add_cuts(3);  // 3 layers | 5 layers: stage 1 is the slower
  v1::ModelProfile profile = UnitProfile(spec);
  for (v1::LayerProfile& l : *profile.mutable_layers()) {
    l.set_activation_bytes(1 << 20);  // a layer's working set: 16x its output, as in a block
    l.set_output_bytes(1 << 16);
  }
  absl::StatusOr<PipelinePlan> plain = PlanPipeline(spec, &profile);
  ASSERT_TRUE(plain.ok()) << plain.status();
  ASSERT_EQ(plain->stage_costs.size(), 2u);
  EXPECT_DOUBLE_EQ(plain->stage_costs[0].activation_bytes, 3 << 20);
  EXPECT_DOUBLE_EQ(plain->stage_costs[1].activation_bytes, 5 << 20);
  // Stage 0: the tokens (micro_batch_size x seq_len int32) and two layers' outputs.
  const double tokens =
      static_cast<double>(spec.pipeline().micro_batch_size()) * spec.model().seq_len() * 4;
  EXPECT_DOUBLE_EQ(plain->stage_costs[0].input_bytes, tokens + 2 * (1 << 16));
  EXPECT_DOUBLE_EQ(plain->stage_costs[1].input_bytes, 5 * (1 << 16));
  EXPECT_DOUBLE_EQ(plain->stage_costs[0].layer_bytes, 1 << 20);
  // The R's cost: the profile has no recompute_seconds, so each layer's forward.
  EXPECT_DOUBLE_EQ(plain->stage_costs[0].recompute, 3.0);
  EXPECT_DOUBLE_EQ(plain->stage_costs[1].recompute, 5.0);
  // Without a budget nothing may raise a worker's peak: every R stays in its backward.
  EXPECT_EQ(plain->recompute_moved, 0);
  EXPECT_EQ(plain->recompute_dropped, 0);
  for (const auto& list : plain->schedule.program) {
    const std::vector<bool> inside = RecomputeAtBackward(list);
    for (size_t i = 0; i < list.size(); ++i) {
      if (list[i].kind == v1::ACTION_R) {
        EXPECT_TRUE(inside[i]) << i;
      }
    }
  }
  // 7 MiB: room on stage 0 (4.4 MiB planned) for a working set from an early R on, not for a
  // micro-batch's from its F on beside a recomputing backward's: R's move into the waits.
  spec.mutable_pipeline()->set_memory_budget_mb(7);
  absl::StatusOr<PipelinePlan> hidden = PlanPipeline(spec, &profile);
  ASSERT_TRUE(hidden.ok()) << hidden.status();
  EXPECT_GT(hidden->recompute_moved, 0);
  EXPECT_LT(hidden->predicted_step_seconds, plain->predicted_step_seconds);
  EXPECT_GT(hidden->stage_bytes[0], plain->stage_bytes[0]);  // the price, on stage 0
  for (int64_t b : hidden->stage_bytes) EXPECT_LE(b, int64_t{7} << 20);
  EXPECT_TRUE(ValidateSchedule(hidden->schedule).ok());
  // 64 MiB holds every micro-batch's activations: no R is left, and the step is the plain one.
  spec.mutable_pipeline()->set_memory_budget_mb(64);
  absl::StatusOr<PipelinePlan> roomy = PlanPipeline(spec, &profile);
  ASSERT_TRUE(roomy.ok()) << roomy.status();
  EXPECT_EQ(roomy->recompute_dropped, 2 * 8);
  EXPECT_FALSE(roomy->recomputes());
  v1::JobSpec none = spec;
  none.mutable_pipeline()->set_recompute("none");
  absl::StatusOr<PipelinePlan> without = PlanPipeline(none, &profile);
  ASSERT_TRUE(without.ok()) << without.status();
  EXPECT_DOUBLE_EQ(roomy->predicted_step_seconds, without->predicted_step_seconds);
  EXPECT_EQ(roomy->stage_bytes, without->stage_bytes);
  // A measured recomputation (a block's skips its last GEMM) is what the plan charges.
  for (v1::LayerProfile& l : *profile.mutable_layers()) l.set_recompute_seconds(0.75);
  spec.mutable_pipeline()->clear_memory_budget_mb();
  absl::StatusOr<PipelinePlan> measured = PlanPipeline(spec, &profile);
  ASSERT_TRUE(measured.ok()) << measured.status();
  EXPECT_DOUBLE_EQ(measured->stage_costs[1].recompute, 5 * 0.75);
  EXPECT_LT(measured->predicted_step_seconds, plain->predicted_step_seconds);
}

// zb_auto: with a profile the program is rebuilt from the measured stage costs (here uneven:
// 3 layers | 5), so its predicted step is no longer than the hand-crafted schedules' at the
// same memory; a budget caps the live micro-batches it plans per worker.
TEST(PlanPipelineTest, ZBAutoIsBuiltFromTheProfile) {
  v1::JobSpec spec = Spec("zb_auto", 2, 8);
  spec.mutable_pipeline()->set_partition("manual");
  spec.mutable_pipeline()->add_cuts(3);
  const v1::ModelProfile profile = UnitProfile(spec);
  absl::StatusOr<PipelinePlan> automatic = PlanPipeline(spec, &profile);
  ASSERT_TRUE(automatic.ok()) << automatic.status();
  EXPECT_EQ(automatic->schedule.name, "zb_auto");
  EXPECT_TRUE(ValidateSchedule(automatic->schedule).ok());
  for (const char* other : {"1f1b", "zb_h1"}) {
    absl::StatusOr<PipelinePlan> hand = PlanPipeline(WithSchedule(spec, other, 0), &profile);
    ASSERT_TRUE(hand.ok()) << hand.status();
    EXPECT_LE(automatic->predicted_step_seconds, hand->predicted_step_seconds + 1e-9) << other;
  }
  // A budget of 8 MiB with 256 KiB of activations per layer and micro-batch: stage 0 (3 MiB
  // static, 0.75 MiB per micro-batch) may hold 6 live micro-batches, stage 1 (5 MiB, 1.25 MiB)
  // two.
  v1::ModelProfile heavy = profile;
  for (v1::LayerProfile& l : *heavy.mutable_layers()) l.set_activation_bytes(256 << 10);
  spec.mutable_pipeline()->set_memory_budget_mb(8);
  absl::StatusOr<PipelinePlan> tight = PlanPipeline(spec, &heavy);
  ASSERT_TRUE(tight.ok()) << tight.status();
  absl::StatusOr<SimulationResult> sim = SimulateSchedule(tight->schedule);
  ASSERT_TRUE(sim.ok());
  EXPECT_LE(sim->peak_live_micro_batches[0], 6);
  EXPECT_LE(sim->peak_live_micro_batches[1], 2);
  for (int64_t b : tight->stage_bytes) EXPECT_LE(b, int64_t{8} << 20);
}

// Sharded optimizer state: each stage's predicted static memory keeps 1/R of AdamW's moments
// (8 bytes per parameter), the rest as before; with one replica nothing changes.
TEST(PlanPipelineTest, ShardedStateShrinksThePredictedMemory) {
  v1::JobSpec spec = Spec("1f1b", 2, 4);
  spec.mutable_pipeline()->set_partition("uniform");
  spec.mutable_pipeline()->set_replicas(2);
  const v1::ModelProfile profile = UnitProfile(spec);
  absl::StatusOr<PipelinePlan> whole = PlanPipeline(spec, &profile);
  spec.mutable_optimizer()->set_shard_state(true);
  absl::StatusOr<PipelinePlan> sharded = PlanPipeline(spec, &profile);
  ASSERT_TRUE(whole.ok() && sharded.ok());
  ASSERT_EQ(whole->stage_bytes.size(), 2u);
  ASSERT_EQ(sharded->stage_bytes.size(), 2u);
  const std::vector<int64_t> params = LayerParameterCounts(spec.model());
  for (int s = 0; s < 2; ++s) {
    int64_t stage_params = 0;
    for (int g = whole->ranges[s].begin; g < whole->ranges[s].end; ++g) stage_params += params[g];
    EXPECT_EQ(whole->stage_bytes[s] - sharded->stage_bytes[s], stage_params * 4) << "stage " << s;
  }
  spec.mutable_pipeline()->set_replicas(1);
  absl::StatusOr<PipelinePlan> one = PlanPipeline(spec, &profile);
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(one->stage_bytes, whole->stage_bytes);
}

TEST(PlanPipelineTest, PartitionProfileWithoutAProfileCutsByParameters) {
  v1::JobSpec spec = Spec("1f1b", 2, 4);
  spec.mutable_pipeline()->set_partition("profile");
  absl::StatusOr<PipelinePlan> plan = PlanPipeline(spec);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->partition, "parameters");
  ExpectContiguousCover(plan->ranges, 8);
}

TEST(PlanPipelineTest, ManualCutsAreTaken) {
  v1::JobSpec spec = Spec("1f1b", 2, 4);
  spec.mutable_pipeline()->set_partition("manual");
  spec.mutable_pipeline()->add_cuts(3);
  absl::StatusOr<PipelinePlan> plan = PlanPipeline(spec);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->partition, "manual");
  EXPECT_EQ(plan->ranges, (std::vector<LayerRange>{{0, 3}, {3, 8}}));
}

TEST(PlanPipelineTest, InvalidSpecsAreRefusedWithTheReason) {
  // 1F1B needs at least as many micro-batches as stages: the generator's error.
  absl::StatusOr<PipelinePlan> plan = PlanPipeline(Spec("1f1b", 4, 2));
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(plan.status().message().empty());

  plan = PlanPipeline(Spec("no_such_schedule", 2, 4));
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(plan.status().message()), HasSubstr("no_such_schedule"));

  // Manual cut points out of the model's range: the partitioner's message.
  v1::JobSpec manual = Spec("1f1b", 2, 4);
  manual.mutable_pipeline()->set_partition("manual");
  manual.mutable_pipeline()->add_cuts(9);
  plan = PlanPipeline(manual);
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);

  // A profile of another model.
  const v1::JobSpec spec = Spec("1f1b", 2, 4);
  v1::ModelProfile short_profile = UnitProfile(spec);
  short_profile.mutable_layers()->RemoveLast();
  plan = PlanPipeline(spec, &short_profile);
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(plan.status().message(), "profile has 7 layers, the model 8");
}

TEST(PlanPipelineTest, NoCutFitsATinyMemoryBudget) {
  v1::JobSpec spec = Spec("1f1b", 2, 4);
  spec.mutable_pipeline()->set_memory_budget_mb(1);
  const v1::ModelProfile profile = UnitProfile(spec);  // 1 MiB of weights per layer
  absl::StatusOr<PipelinePlan> plan = PlanPipeline(spec, &profile);
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kResourceExhausted) << plan.status();
}

// memory_budget_mb is per worker: under an interleaved schedule a worker holds two stages,
// and their bytes count together. 8 layers of 1 MiB of weights on 2 workers: every stage fits
// 3 MiB on its own, but each worker holds at least 4 MiB.
TEST(PlanPipelineTest, TheBudgetIsAWorkersWithSeveralStagesEach) {
  v1::JobSpec spec = Spec("interleaved_1f1b", 2, 4);
  spec.mutable_pipeline()->set_chunks(2);
  const v1::ModelProfile profile = UnitProfile(spec);
  spec.mutable_pipeline()->set_memory_budget_mb(3);
  absl::StatusOr<PipelinePlan> plan = PlanPipeline(spec, &profile);
  ASSERT_EQ(plan.status().code(), absl::StatusCode::kResourceExhausted) << plan.status();
  EXPECT_THAT(plan.status().message(), HasSubstr("a worker's stages together"));
  EXPECT_THAT(plan.status().message(), HasSubstr("worker 0 needs"));
  EXPECT_GE(SmallestBudgetBytes(plan.status()), int64_t{4} << 20);

  spec.mutable_pipeline()->set_memory_budget_mb(5);
  plan = PlanPipeline(spec, &profile);
  ASSERT_TRUE(plan.ok()) << plan.status();
  const std::vector<int64_t> worker = WorkerBytes(*plan);
  ASSERT_EQ(worker.size(), 2u);
  for (int r = 0; r < 2; ++r) {
    EXPECT_LE(worker[r], int64_t{5} << 20) << "worker " << r;
    int64_t sum = 0;
    for (int s : plan->schedule.placement.StagesOf(r)) sum += plan->stage_bytes[s];
    EXPECT_EQ(worker[r], sum);
  }
}

// A profile is kept per hardware: workers that name another GPU or processor (or OpenBLAS
// kernel) get another key; a worker that names none (an older one) keeps the key it had.
TEST(ProfileKeyTest, NamesTheShapeTheDeviceKindThreadsAndHardware) {
  const v1::JobSpec spec = Spec("1f1b", 2, 4);
  const std::string bare = ProfileKey(spec, "cuda", 1, "");
  const std::string h100 = ProfileKey(spec, "cuda", 1, "NVIDIA H100 80GB HBM3");
  const std::string a100 = ProfileKey(spec, "cuda", 1, "NVIDIA A100-SXM4-40GB");
  EXPECT_NE(h100, a100);
  EXPECT_NE(h100, bare);
  EXPECT_EQ(h100, bare + "-on-NVIDIA H100 80GB HBM3");
  EXPECT_NE(ProfileKey(spec, "cpu", 1, "Xeon / OpenBLAS SkylakeX"),
            ProfileKey(spec, "cpu", 1, "Xeon / OpenBLAS Haswell"));
  EXPECT_NE(ProfileKey(spec, "cpu", 1, "x"), ProfileKey(spec, "cpu", 2, "x"));
  v1::JobSpec wider = spec;
  wider.mutable_pipeline()->set_micro_batch_size(spec.pipeline().micro_batch_size() + 1);
  EXPECT_NE(ProfileKey(spec, "cpu", 1, "x"), ProfileKey(wider, "cpu", 1, "x"));
}

TEST(StageProgramForTest, EachRankGetsItsStagesAndActions) {
  const v1::JobSpec spec = Spec("1f1b", 4, 8);
  absl::StatusOr<PipelinePlan> plan = PlanPipeline(spec);
  ASSERT_TRUE(plan.ok()) << plan.status();
  for (int r = 0; r < 4; ++r) {
    const v1::StageProgram prog = StageProgramFor(*plan, spec, r, "job-7", "job-7/a");
    EXPECT_EQ(prog.job_id(), "job-7");
    EXPECT_EQ(prog.rendezvous_prefix(), "job-7/a");
    EXPECT_EQ(prog.rank(), r);
    EXPECT_EQ(prog.num_ranks(), 4);
    EXPECT_EQ(prog.num_stages(), 4);
    EXPECT_EQ(prog.micro_batches(), 8);
    ASSERT_EQ(prog.chunks_size(), 1);
    EXPECT_EQ(prog.chunks(0).stage(), r);
    EXPECT_EQ(prog.chunks(0).layer_begin(), plan->ranges[r].begin);
    EXPECT_EQ(prog.chunks(0).layer_end(), plan->ranges[r].end);
    ASSERT_EQ(prog.actions_size(), static_cast<int>(plan->schedule.program[r].size()));
    for (int i = 0; i < prog.actions_size(); ++i) {
      EXPECT_EQ(FromProto(prog.actions(i)), plan->schedule.program[r][i]);
    }
    EXPECT_EQ(prog.eval_actions_size(), 0);
    EXPECT_EQ(prog.spec().name(), "plan");
  }
}

}  // namespace
}  // namespace tandem
