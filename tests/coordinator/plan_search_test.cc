// SearchPlanJob (coordinator/plan_search.h): the PlanJob RPC's answer from the planner's
// search, on synthetic profiles (no workers): every candidate shown with its figures, the
// choice first, the spec as written costed, and a budget nothing fits explained.
#include "coordinator/plan_search.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>

#include "common/model_desc.h"
#include "common/spec.h"

namespace tandem::coordinator {
namespace {

using ::testing::HasSubstr;

v1::JobSpec Spec() {
  v1::JobSpec spec;
  spec.set_name("plan");
  spec.mutable_model()->set_n_layer(6);
  spec.mutable_pipeline()->set_stages(2);
  spec.mutable_pipeline()->set_micro_batch_size(4);
  spec.mutable_pipeline()->set_micro_batches(4);
  spec.mutable_pipeline()->set_partition("profile");
  return WithDefaults(spec);
}

// Every layer costs 1 ms + 1 ms per sequence forward, backward twice that; 1 MiB of
// activations per sequence. Counts the profiles asked for per micro-batch size.
struct Source {
  std::map<int, int> calls;
  ProfileSource Get() {
    return [this](const v1::JobSpec& s) -> absl::StatusOr<v1::ModelProfile> {
      const int b = s.pipeline().micro_batch_size();
      ++calls[b];
      v1::ModelProfile p;
      p.set_device("cpu");
      p.set_threads(1);
      for (int g = 0; g < NumLayers(s.model()); ++g) {
        v1::LayerProfile* l = p.add_layers();
        l->set_layer(g);
        const double f = 1e-3 * (1 + b);
        l->set_forward_seconds(f);
        l->set_backward_seconds(2 * f);
        l->set_backward_input_seconds(f);
        l->set_backward_weight_seconds(f);
        l->set_static_bytes(1 << 20);
        l->set_activation_bytes(int64_t{b} << 20);
        l->set_output_bytes(int64_t{b} << 16);
      }
      return p;
    };
  }
};

TEST(SearchPlanJob, ListsEveryCandidateWithTheChoiceFirst) {
  Source source;
  const v1::PlanJobResponse r = SearchPlanJob(Spec(), source.Get());
  ASSERT_GT(r.candidates_size(), 3);
  ASSERT_EQ(r.chosen(), 0);
  const v1::PlanCandidateInfo& best = r.candidates(0);
  EXPECT_TRUE(best.feasible());
  EXPECT_GT(best.step_seconds(), 0.0);
  EXPECT_GT(best.tokens_per_second(), 0.0);
  EXPECT_GT(best.peak_stage_bytes(), 0);
  // The global batch is kept: every candidate splits the same 16 sequences.
  for (const v1::PlanCandidateInfo& c : r.candidates()) {
    EXPECT_EQ(c.micro_batches() * c.micro_batch_size() * c.replicas(), 16) << c.schedule();
    if (c.feasible()) {
      EXPECT_GE(c.step_seconds(), best.step_seconds()) << c.schedule();
      EXPECT_TRUE(c.reason().empty());
    } else {
      EXPECT_FALSE(c.reason().empty()) << c.schedule();
    }
  }
  EXPECT_EQ(r.chosen_spec().pipeline().schedule(), best.schedule());
  EXPECT_EQ(r.chosen_spec().pipeline().micro_batches(), best.micro_batches());
  EXPECT_THAT(r.choice(), HasSubstr(best.schedule()));
  EXPECT_GT(r.as_written_step_seconds(), 0.0);
  EXPECT_GE(r.as_written_step_seconds(), best.step_seconds());
  // One profile per micro-batch size, the spec's own size included.
  for (const auto& entry : source.calls) EXPECT_EQ(entry.second, 1) << entry.first;
  EXPECT_EQ(source.calls.count(4), 1u);
}

TEST(SearchPlanJob, ABudgetNothingFitsIsExplainedWithNoChoice) {
  v1::JobSpec spec = Spec();
  spec.mutable_pipeline()->set_memory_budget_mb(1);  // below every stage's parameters
  Source source;
  const v1::PlanJobResponse r = SearchPlanJob(spec, source.Get());
  EXPECT_EQ(r.chosen(), -1);
  EXPECT_FALSE(r.has_chosen_spec());
  EXPECT_THAT(r.choice(), HasSubstr("pipeline.memory_budget_mb"));
  for (const v1::PlanCandidateInfo& c : r.candidates()) EXPECT_FALSE(c.feasible());
}

TEST(SearchPlanJob, AProfileThatCannotBeMeasuredMakesItsCandidatesInfeasible) {
  const v1::PlanJobResponse r =
      SearchPlanJob(Spec(), [](const v1::JobSpec&) -> absl::StatusOr<v1::ModelProfile> {
        return absl::UnavailableError("no idle cpu worker to profile on");
      });
  EXPECT_EQ(r.chosen(), -1);
  EXPECT_EQ(r.as_written_step_seconds(), 0.0);
  ASSERT_GT(r.candidates_size(), 0);
  EXPECT_THAT(r.candidates(0).reason(), HasSubstr("no idle cpu worker"));
}

}  // namespace
}  // namespace tandem::coordinator
