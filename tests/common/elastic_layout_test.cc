// Elastic layouts: the most workers that can be used, the stage count nearest the one as
// written, fewer replicas at a tie, at the same global batch; below min_workers, or where no
// layout runs, a FAILED_PRECONDITION that says why.
#include "common/elastic_layout.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "common/spec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

using ::testing::HasSubstr;

// gpt, 6 layers (n_layer 4 + embedding and head), `stages` x `replicas`, micro-batches of 2.
v1::JobSpec Written(int stages, int replicas, int micro_batches, int min_workers,
                    int max_workers = 0) {
  auto spec = LoadJobSpecYaml(absl::StrCat(
      "model:\n  n_layer: 4\npipeline:\n  stages: ", stages, "\n  replicas: ", replicas,
      "\n  micro_batch_size: 2\n  micro_batches: ", micro_batches,
      "\nelastic:\n  min_workers: ", min_workers, "\n  max_workers: ", max_workers, "\n"));
  EXPECT_TRUE(spec.ok()) << spec.status();
  return *spec;
}

std::string Layout(const absl::StatusOr<v1::JobSpec>& spec) {
  if (!spec.ok()) return spec.status().ToString();
  const v1::PipelineSpec& p = spec->pipeline();
  return absl::StrCat(p.stages(), "x", p.replicas(), " M", p.micro_batches(), " B",
                      p.micro_batch_size());
}

TEST(ElasticLayoutTest, AllTheWorkersKeepTheLayoutAsWritten) {
  const v1::JobSpec written = Written(4, 1, 4, 2);
  EXPECT_EQ(Layout(ElasticLayoutFor(written, 4)), "4x1 M4 B2");
  // More available than the job takes (max_workers 0: the gang as written).
  EXPECT_EQ(Layout(ElasticLayoutFor(written, 9)), "4x1 M4 B2");
  EXPECT_EQ(ElasticMaxWorkers(written), 4);
}

TEST(ElasticLayoutTest, FewerWorkersTakeTheStageCountNearestTheWritten) {
  const v1::JobSpec written = Written(4, 1, 4, 2);
  EXPECT_EQ(Layout(ElasticLayoutFor(written, 3)), "3x1 M4 B2");
  // 2 workers: 2 stages (distance 2) before 1 stage x 2 replicas (distance 3).
  EXPECT_EQ(Layout(ElasticLayoutFor(written, 2)), "2x1 M4 B2");
  for (int n : {1, 2, 3, 4}) {
    auto s = ElasticLayoutFor(written, n);
    if (s.ok()) {
      EXPECT_EQ(EffectiveBatch(*s), 8) << n;  // the global batch is kept
    }
  }
}

TEST(ElasticLayoutTest, BelowMinWorkersItWaitsSayingSo) {
  const absl::StatusOr<v1::JobSpec> s = ElasticLayoutFor(Written(4, 1, 4, 2), 1);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.status().message(), HasSubstr("1 worker(s) available, the job needs at least 2"));
}

// 2 x 2 with 2 micro-batches of 2 per replica (a global batch of 8).
TEST(ElasticLayoutTest, ReplicasGoFirstWhenTheStagesCannotChangeLess) {
  const v1::JobSpec written = Written(2, 2, 2, 1, 8);
  EXPECT_EQ(Layout(ElasticLayoutFor(written, 4)), "2x2 M2 B2");
  // 3 workers: 3 x 1 (distance 1) runs; 1 x 3 would not split the batch of 8.
  EXPECT_EQ(Layout(ElasticLayoutFor(written, 3)), "3x1 M4 B2");
  // 2 workers: 2 x 1 at distance 0, the whole batch in 4 micro-batches.
  EXPECT_EQ(Layout(ElasticLayoutFor(written, 2)), "2x1 M4 B2");
  EXPECT_EQ(Layout(ElasticLayoutFor(written, 1)), "1x1 M4 B2");
  // Grown past the layout as written (max_workers 8): 8 = 2 x 4 leaves one micro-batch per
  // replica, which 1F1B on 2 stages cannot run; 1 x 8 can.
  // (a replica's share is one sequence: one micro-batch of 1).
  EXPECT_EQ(Layout(ElasticLayoutFor(written, 8)), "1x8 M1 B1");
}

// Manual cut points fit their stage count only: such a job changes replicas only.
TEST(ElasticLayoutTest, ManualCutsCannotChangeTheStageCount) {
  v1::JobSpec written = Written(2, 2, 2, 1, 4);
  written.mutable_pipeline()->set_partition("manual");
  written.mutable_pipeline()->add_cuts(3);
  ASSERT_TRUE(ValidateJobSpec(written).ok()) << ValidateJobSpec(written);
  EXPECT_EQ(Layout(ElasticLayoutFor(written, 3)), "2x1 M4 B2");
  const absl::StatusOr<v1::JobSpec> one = ElasticLayoutFor(Written(2, 1, 4, 1), 1);
  EXPECT_EQ(Layout(one), "1x1 M4 B2");  // uniform cuts re-cut freely
}

}  // namespace
}  // namespace tandem
