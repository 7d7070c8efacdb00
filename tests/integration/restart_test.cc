// A coordinator killed with SIGKILL and started again on the same data root and port: its jobs
// survive (finished ones with their history, queued ones queued, in order), workers register
// again, and no second coordinator can take the data root meanwhile.
#include <signal.h>

#include <chrono>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/harness.h"

namespace tandem::testing {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;

class RestartTest : public ::testing::Test {
 protected:
  void TearDown() override {
    if (HasFailure() && cluster_) {
      for (const char* log :
           {"coordinator.log", "coordinator.1.log", "worker0.log", "worker1.log", "worker2.log"}) {
        std::cerr << log << ":\n" << ReadFile(cluster_->dir() + "/" + log);
      }
    }
  }
  std::unique_ptr<Cluster> cluster_;
};

TEST_F(RestartTest, QueuedAndFinishedJobsSurviveASigkilledCoordinator) {
  Cluster::Options options;
  options.workers = 2;
  cluster_ = std::make_unique<Cluster>(options);
  ASSERT_TRUE(cluster_->Start().ok());

  auto done_id = cluster_->Submit(TinyJobYaml(2, 4, 6, "1f1b", "checkpoint:\n  every: 3\n"));
  ASSERT_TRUE(done_id.ok()) << done_id.status();
  auto done = cluster_->WaitForEnd(*done_id, 120s);
  ASSERT_TRUE(done.ok()) << done.status();
  ASSERT_EQ(done->state(), v1::SUCCEEDED) << done->reason();
  // Two jobs that need three workers wait in the queue.
  auto first = cluster_->Submit(TinyJobYaml(3, 4, 4));
  auto second = cluster_->Submit(TinyJobYaml(3, 4, 4));
  ASSERT_TRUE(first.ok() && second.ok());
  ASSERT_EQ(cluster_->GetJob(*second)->state(), v1::QUEUED);

  ASSERT_TRUE(cluster_->RestartCoordinator(SIGKILL).ok());

  // The finished job, as it was.
  auto after = cluster_->GetJob(*done_id);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->state(), v1::SUCCEEDED);
  EXPECT_EQ(after->steps_done(), 6);
  EXPECT_EQ(after->checkpoint_step(), 5);
  EXPECT_EQ(Losses(*after), Losses(*done));
  EXPECT_EQ(after->finished_unix_ms(), done->finished_unix_ms());
  ASSERT_EQ(after->stages_size(), 2);
  EXPECT_EQ(after->stages(1).worker_id(), done->stages(1).worker_id());
  // The queued ones, queued in their order, with a fresh reason from the new scheduler.
  auto jobs = cluster_->client().ListJobs();
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  ASSERT_EQ(jobs->jobs_size(), 3);
  EXPECT_EQ(jobs->jobs(1).id(), *first);
  EXPECT_EQ(jobs->jobs(2).id(), *second);
  EXPECT_EQ(jobs->jobs(1).state(), v1::QUEUED);
  EXPECT_EQ(jobs->jobs(2).state(), v1::QUEUED);
  EXPECT_TRUE(WaitFor(
      [&] {
        auto j = cluster_->GetJob(*first);
        return j.ok() && absl::StrContains(j->reason(), "waiting for 3 idle cpu workers: 2");
      },
      10s));
  CommandResult status = cluster_->Cli({"status", *done_id});
  EXPECT_EQ(status.exit_code, 0) << status.err;
  EXPECT_THAT(status.out, HasSubstr("SUCCEEDED"));

  // Both workers registered again (with ids of the new coordinator's own).
  auto workers = cluster_->Workers();
  ASSERT_TRUE(workers.ok());
  ASSERT_EQ(workers->size(), 2u);
  for (const auto& w : *workers) EXPECT_NE(w.state(), v1::LOST) << w.worker_id();

  // A second coordinator on the same data root is refused, naming why.
  CommandResult second_coordinator =
      RunCommand({std::string(TANDEM_BIN_DIR) + "/tandem-coordinator", "--listen=127.0.0.1:0",
                  "--data-root=" + cluster_->data_root()},
                 30s);
  EXPECT_NE(second_coordinator.exit_code, 0);
  EXPECT_THAT(second_coordinator.err + second_coordinator.out,
              HasSubstr("is in use by another coordinator"));

  // Ids continue, and the queue runs once a third worker comes.
  auto next = cluster_->Submit(TinyJobYaml(1, 2, 2));
  ASSERT_TRUE(next.ok());
  EXPECT_EQ(*next, "job-4");
  ASSERT_TRUE(cluster_->AddWorker().ok());
  for (const std::string& id : {*first, *second, *next}) {
    auto end = cluster_->WaitForEnd(id, 120s);
    ASSERT_TRUE(end.ok()) << end.status();
    EXPECT_EQ(end->state(), v1::SUCCEEDED) << id << ": " << end->reason();
    EXPECT_EQ(end->history_size(), end->total_steps());
  }
}

// The acceptance check of the store's side: a job running when the coordinator is SIGKILLed
// goes back to the queue at its checkpoint and runs to the end, and its history has each step
// once with the losses of an uninterrupted run (a step applied twice, or lost, would change
// them). It holds whether the runner restarts the job from its checkpoint or from its first
// step.
TEST_F(RestartTest, ARunningJobSurvivesASigkilledCoordinatorWithEachStepOnce) {
  Cluster::Options options;
  options.workers = 2;
  cluster_ = std::make_unique<Cluster>(options);
  ASSERT_TRUE(cluster_->Start().ok());
  const int kSteps = 200;
  const std::string yaml = TinyJobYaml(2, 4, kSteps, "1f1b", "checkpoint:\n  every: 10\n");
  auto reference_id = cluster_->Submit(yaml);
  ASSERT_TRUE(reference_id.ok()) << reference_id.status();
  auto reference = cluster_->WaitForEnd(*reference_id, 120s);
  ASSERT_TRUE(reference.ok() && reference->state() == v1::SUCCEEDED) << reference->reason();

  auto id = cluster_->Submit(yaml);
  ASSERT_TRUE(id.ok()) << id.status();
  ASSERT_TRUE(WaitFor(
      [&] {
        auto j = cluster_->GetJob(*id);
        return j.ok() && j->steps_done() >= 25;
      },
      60s));
  ASSERT_TRUE(cluster_->RestartCoordinator(SIGKILL).ok());
  // (The scheduler may have started it again already: the log says where it was put back.)
  EXPECT_THAT(ReadFile(cluster_->coordinator().log_path()),
              HasSubstr(*id + " was interrupted by the restart: coordinator restarted; resumes "
                              "from the checkpoint after step "));
  auto end = cluster_->WaitForEnd(*id, 120s);
  ASSERT_TRUE(end.ok()) << end.status();
  ASSERT_EQ(end->state(), v1::SUCCEEDED) << end->reason();
  ASSERT_EQ(end->history_size(), kSteps);
  for (int i = 0; i < kSteps; ++i) {
    ASSERT_EQ(end->history(i).step(), i);
    EXPECT_EQ(end->history(i).loss(), reference->history(i).loss()) << "step " << i;
  }
  EXPECT_EQ(end->steps_done(), kSteps);
  EXPECT_EQ(end->checkpoint_step(), kSteps - 1);
  // The new coordinator resumed it from its checkpoint rather than from the start.
  EXPECT_THAT(ReadFile(cluster_->coordinator().log_path()),
              HasSubstr(*id + ": attempt 0 resumes from its checkpoint after step "));
}

// Regression (issue 26): a job's restart backoff is stored with it, so that a coordinator
// restarted while the job waits out its backoff still waits until the same time (it used to
// start the job at once), and then starts it without further delay.
TEST_F(RestartTest, AJobInItsRestartBackoffWaitsItOutAcrossACoordinatorRestart) {
  constexpr absl::Duration kBackoff = absl::Seconds(8);
  Cluster::Options options;
  options.workers = 2;
  options.coordinator_args = {
      absl::StrCat("--restart-backoff-ms=", absl::ToInt64Milliseconds(kBackoff))};
  options.worker_args = {"--test-fail-at=2:F"};  // every run fails at its second step: a fault
  cluster_ = std::make_unique<Cluster>(options);
  ASSERT_TRUE(cluster_->Start().ok());
  auto id = cluster_->Submit(TinyJobYaml(2, 4, 4, "1f1b", "max_restarts: 1\n"));
  ASSERT_TRUE(id.ok()) << id.status();

  // The job was requeued after `not_before`, the time of the last poll that saw it unrequeued.
  absl::Time not_before = absl::Now();
  ASSERT_TRUE(WaitFor(
      [&] {
        const absl::Time asked = absl::Now();
        auto j = cluster_->GetJob(*id);
        if (j.ok() && j->restarts() == 1) return true;
        not_before = asked;
        return false;
      },
      60s, 5ms));
  const absl::Time backoff_ends = not_before + kBackoff;  // at the earliest
  ASSERT_TRUE(cluster_->RestartCoordinator(SIGKILL).ok());
  ASSERT_LT(absl::Now(), backoff_ends - absl::Seconds(2))
      << "the coordinator took too long to restart for the test to tell anything";

  // The new coordinator keeps the job queued until its backoff ends ...
  while (absl::Now() < backoff_ends - absl::Milliseconds(300)) {
    auto j = cluster_->GetJob(*id);
    ASSERT_TRUE(j.ok()) << j.status();
    ASSERT_EQ(j->state(), v1::QUEUED)
        << "started " << absl::FormatDuration(backoff_ends - absl::Now())
        << " before its backoff ended: " << j->reason();
    EXPECT_EQ(j->restarts(), 1);
    absl::SleepFor(absl::Milliseconds(50));
  }
  // ... and then runs it (it fails at its second step again, with no restart left).
  auto end = cluster_->WaitForEnd(*id, 60s);
  ASSERT_TRUE(end.ok()) << end.status();
  EXPECT_EQ(end->state(), v1::FAILED) << end->reason();
  EXPECT_THAT(end->reason(), HasSubstr("failed after 1 restart(s)"));
  const absl::Time started = absl::FromUnixMillis(end->started_unix_ms());
  EXPECT_GE(started, backoff_ends - absl::Milliseconds(50));
  EXPECT_LT(started, backoff_ends + absl::Seconds(10)) << "its backoff over, it starts at once";
}

}  // namespace
}  // namespace tandem::testing
