// Elastic training with real processes on 127.0.0.1 (JobSpec.elastic): a 4-stage job loses two
// of its four workers, resumes from its checkpoint on the two left (2 stages, the same global
// batch), grows back to 4 stages from its workers' kept state once two new workers register
// (no checkpoint needed), and ends with
// every step's loss within 1e-5 relative of a fault-free run; each resize is in the job's
// record with its cause, its layouts, the checkpoint it resumed from and the steps it redid.
// A job that cannot get its min_workers waits QUEUED saying so.
#include <signal.h>

#include <chrono>
#include <cmath>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/harness.h"

namespace tandem::testing {
namespace {

using ::testing::AnyOf;
using ::testing::HasSubstr;
using namespace std::chrono_literals;

constexpr int kSteps = 120;

// mlp_lm on 4 stages of 8 micro-batches, a checkpoint every 10 steps; `elastic` appended.
std::string ElasticJob(const std::string& elastic) {
  return absl::StrCat(
      "name: elastic\nsteps: ", kSteps,
      "\nseed: 7\nmodel:\n  arch: mlp_lm\n  n_layer: 4\n  d_model: 256\n  d_embed: 32\n"
      "  context: 8\noptimizer:\n  lr: 0.01\npipeline:\n  stages: 4\n  micro_batch_size: 32\n"
      "  micro_batches: 8\n  schedule: 1f1b\n  partition: uniform\ncheckpoint:\n  every: 10\n"
      "  keep: 2\nmax_restarts: 3\n",
      elastic);
}

class ElasticTest : public ::testing::Test {
 protected:
  void StartCluster(int workers) {
    Cluster::Options options;
    options.workers = workers;
    options.coordinator_args = {"--step-deadline-floor-ms=3000", "--restart-backoff-ms=100"};
    cluster_ = std::make_unique<Cluster>(options);
    ASSERT_TRUE(cluster_->Start().ok());
  }
  void TearDown() override {
    if (HasFailure() && cluster_) {
      std::cerr << "coordinator log:\n" << ReadFile(cluster_->dir() + "/coordinator.log");
    }
  }
  // Polls the job until `done` holds for it (bounded by `timeout`).
  template <typename Pred>
  absl::StatusOr<v1::Job> WaitFor(const std::string& id, Pred done, std::chrono::seconds timeout) {
    const auto until = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < until) {
      absl::StatusOr<v1::Job> job = cluster_->GetJob(id);
      if (job.ok() && done(*job)) return job;
      std::this_thread::sleep_for(20ms);
    }
    return absl::DeadlineExceededError(absl::StrCat("waiting for ", id));
  }
  std::unique_ptr<Cluster> cluster_;
};

TEST_F(ElasticTest, ShrinksToTheWorkersLeftAndGrowsBackWithTheFaultFreeLosses) {
  StartCluster(4);
  auto ref_id = cluster_->Submit(ElasticJob(""));
  ASSERT_TRUE(ref_id.ok()) << ref_id.status();
  auto reference = cluster_->WaitForEnd(*ref_id, 300s);
  ASSERT_TRUE(reference.ok() && reference->state() == v1::SUCCEEDED) << reference->reason();

  auto id = cluster_->Submit(ElasticJob("elastic:\n  min_workers: 2\n"));
  ASSERT_TRUE(id.ok()) << id.status();
  ASSERT_TRUE(cluster_->WaitForSteps(*id, 15));
  // Two of the four die at once: no idle worker can replace them.
  cluster_->worker(1).Kill(SIGKILL);
  cluster_->worker(3).Kill(SIGKILL);
  auto shrunk = WaitFor(
      *id, [](const v1::Job& j) { return j.resizes_size() >= 1 && j.state() == v1::RUNNING; },
      120s);
  ASSERT_TRUE(shrunk.ok()) << shrunk.status();
  EXPECT_EQ(shrunk->spec().pipeline().stages(), 2);
  // Two new workers: the job grows back at its next checkpoint.
  ASSERT_TRUE(cluster_->AddWorker().ok());
  ASSERT_TRUE(cluster_->AddWorker().ok());

  auto end = cluster_->WaitForEnd(*id, 300s);
  ASSERT_TRUE(end.ok()) << end.status();
  ASSERT_EQ(end->state(), v1::SUCCEEDED) << end->reason();
  ASSERT_EQ(end->history_size(), kSteps);
  for (int i = 0; i < kSteps; ++i) {
    ASSERT_EQ(end->history(i).step(), i);
    const double want = reference->history(i).loss();
    EXPECT_NEAR(end->history(i).loss(), want, 1e-5 * std::fabs(want)) << "step " << i + 1;
  }
  EXPECT_EQ(end->restarts(), 1);
  // The shrink, then one grow per worker that registered while it ran (the two may register
  // between the same two steps: one grow, or each in its own: two).
  ASSERT_GE(end->resizes_size(), 2) << end->DebugString();
  ASSERT_LE(end->resizes_size(), 3) << end->DebugString();
  const v1::ResizeEvent& shrink = end->resizes(0);
  EXPECT_EQ(shrink.from_workers(), 4);
  EXPECT_EQ(shrink.to_workers(), 2);
  EXPECT_EQ(shrink.to_stages(), 2);
  EXPECT_EQ(shrink.to_micro_batches(), 8);  // the same global batch
  EXPECT_THAT(shrink.cause(), AnyOf(HasSubstr("unreachable"), HasSubstr("lost")));
  EXPECT_GE(shrink.checkpoint_step(), 9);
  EXPECT_GE(shrink.steps_redone(), 0);
  EXPECT_LT(shrink.steps_redone(), 10 + 1);  // at most the steps since its checkpoint
  EXPECT_THAT(shrink.state_source(), HasSubstr("checkpoint after step "));  // no replica
  // Each grow comes after the step the worker registered in, from the state the workers kept
  // (each new stage reads its layers from whichever of them held them): no checkpoint waited
  // for, nothing redone.
  for (int g = 1; g < end->resizes_size(); ++g) {
    const v1::ResizeEvent& grow = end->resizes(g);
    EXPECT_EQ(grow.from_workers(), end->resizes(g - 1).to_workers());
    EXPECT_GT(grow.to_workers(), grow.from_workers());
    EXPECT_THAT(grow.cause(), HasSubstr("grow: "));
    EXPECT_THAT(grow.cause(), HasSubstr("from its workers' state after step "));
    EXPECT_THAT(grow.state_source(), HasSubstr("kept state after step "));
    EXPECT_EQ(grow.steps_redone(), 0);
  }
  const v1::ResizeEvent& last = end->resizes(end->resizes_size() - 1);
  EXPECT_EQ(last.to_workers(), 4);
  EXPECT_EQ(last.to_stages(), 4);
  EXPECT_EQ(end->peer_recoveries(), end->resizes_size() - 1);
  EXPECT_EQ(end->steps_redone(), shrink.steps_redone());
  EXPECT_EQ(end->spec().pipeline().stages(), 4);
  EXPECT_EQ(end->written_pipeline().stages(), 4);
}

TEST_F(ElasticTest, BelowMinWorkersTheJobWaitsSayingSo) {
  StartCluster(1);
  auto id = cluster_->Submit(ElasticJob("elastic:\n  min_workers: 2\n"));
  ASSERT_TRUE(id.ok()) << id.status();
  auto waiting = WaitFor(
      *id,
      [](const v1::Job& j) {
        return j.reason().find("the job needs at least 2") != std::string::npos;
      },
      30s);
  ASSERT_TRUE(waiting.ok()) << waiting.status();
  EXPECT_EQ(waiting->state(), v1::QUEUED);
  EXPECT_THAT(waiting->reason(), HasSubstr("elastic: 1 worker(s) available"));
  ASSERT_TRUE(cluster_->AddWorker().ok());
  auto end = cluster_->WaitForEnd(*id, 300s);
  ASSERT_TRUE(end.ok()) << end.status();
  EXPECT_EQ(end->state(), v1::SUCCEEDED) << end->reason();
  EXPECT_EQ(end->spec().pipeline().stages(), 2);
}

}  // namespace
}  // namespace tandem::testing
