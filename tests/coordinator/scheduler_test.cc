// The scheduler: a job that is still planning is not started twice; a restarted job waits
// out its backoff.
#include "coordinator/scheduler.h"

#include <chrono>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/coordinator/runner_fixture.h"

namespace tandem::coordinator {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;

// Regression: a job stays QUEUED while its runner profiles it; the scheduler ticking meanwhile
// must not allocate it a second time (it did, and ran the job twice on four workers).
TEST(SchedulerTest, AJobThatIsStillPlanningIsNotStartedAgain) {
  RunnerFixture f;
  f.factory.configure = [](FakeWorker* w) { w->profile_delay = absl::Milliseconds(300); };
  for (int i = 0; i < 4; ++i) {
    (void)f.registry.Register(RegistrationOf(absl::StrCat("127.0.0.1:", 2000 + i)));
  }
  Scheduler scheduler(f.env, absl::Milliseconds(10));
  scheduler.Start();
  const std::string id = *f.store->Add(JobSpecOf(2, 2));  // partition: profile, the default
  scheduler.Notify();
  for (int i = 0; i < 500; ++i) {
    auto job = f.store->Get(id);
    if (job.ok() && job->state() == v1::SUCCEEDED) break;
    std::this_thread::sleep_for(10ms);
  }
  EXPECT_EQ(f.store->Get(id)->state(), v1::SUCCEEDED);
  scheduler.Stop();
  EXPECT_EQ(f.factory.made.size(), 2u) << "the job was started more than once";
}

// A job requeued after a fault is not allocated again before its backoff has passed, then is.
TEST(SchedulerTest, ARestartedJobWaitsOutItsBackoff) {
  RunnerFixture f;
  f.env.options.restart_backoff = absl::Milliseconds(400);
  absl::Mutex mu;
  std::vector<absl::Time> connected;  // when each worker client was made (configure hook)
  f.factory.configure = [&](FakeWorker* w) {
    absl::MutexLock lock(&mu);
    connected.push_back(absl::Now());
    if (connected.size() <= 2) w->fail_at_step = 2;  // the first run's workers fail once
  };
  for (int i = 0; i < 2; ++i) {
    (void)f.registry.Register(RegistrationOf(absl::StrCat("127.0.0.1:", 2000 + i)));
  }
  Scheduler scheduler(f.env, absl::Milliseconds(10));
  scheduler.Start();
  v1::JobSpec spec = JobSpecOf(2, 4, /*max_restarts=*/1);
  spec.mutable_pipeline()->set_partition("uniform");
  const std::string id = *f.store->Add(spec);
  scheduler.Notify();
  absl::Time requeued;
  for (int i = 0; i < 500 && requeued == absl::Time(); ++i) {
    auto job = f.store->Get(id);
    if (job.ok() && job->restarts() == 1) requeued = absl::Now();
    std::this_thread::sleep_for(1ms);
  }
  ASSERT_NE(requeued, absl::Time()) << "the job was not restarted";
  for (int i = 0; i < 500; ++i) {
    auto job = f.store->Get(id);
    if (job.ok() && IsTerminal(job->state())) break;
    std::this_thread::sleep_for(10ms);
  }
  scheduler.Stop();
  auto job = f.store->Get(id);
  EXPECT_EQ(job->state(), v1::SUCCEEDED) << job->reason();
  absl::MutexLock lock(&mu);
  ASSERT_EQ(connected.size(), 4u);
  EXPECT_GE(connected[2] - requeued, absl::Milliseconds(350)) << "the second run came too soon";
}

}  // namespace
}  // namespace tandem::coordinator
