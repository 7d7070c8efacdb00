// The scheduler: a job that is still planning is not started twice; a restarted job waits
// out its backoff, also when it was stored by an earlier coordinator.
#include "coordinator/scheduler.h"

#include <chrono>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/spec.h"
#include "common/spec_validation.h"
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

// Regression (issue 26): the restart backoff is the job's, in the store, not the scheduler's:
// a new scheduler (a restarted coordinator's) does not allocate a job before its stored time,
// and starts one whose time has passed at once. It used to start both at once.
TEST(SchedulerTest, ANewSchedulerHonoursTheBackoffStoredWithAJob) {
  RunnerFixture f;
  for (int i = 0; i < 4; ++i) {
    (void)f.registry.Register(RegistrationOf(absl::StrCat("127.0.0.1:", 2000 + i)));
  }
  v1::JobSpec spec = JobSpecOf(2, 2, /*max_restarts=*/3);
  spec.mutable_pipeline()->set_partition("uniform");
  // Two jobs an earlier coordinator requeued after a fault: one still in its backoff, one past.
  const absl::Time start = absl::Now();
  const absl::Time waiting_until = start + absl::Milliseconds(600);
  const std::string waiting = *f.store->Add(spec);
  const std::string past = *f.store->Add(spec);
  for (const auto& [id, not_before] :
       {std::pair{waiting, waiting_until}, std::pair{past, start - absl::Seconds(1)}}) {
    ASSERT_TRUE(f.store->Transition(id, v1::RUNNING, "").ok());
    f.store->RecordRestart(id, "step 1: boom", not_before);
    ASSERT_TRUE(f.store->Transition(id, v1::QUEUED, "restart 1 of 3 after: step 1: boom").ok());
  }
  Scheduler scheduler(f.env, absl::Milliseconds(10));
  scheduler.Start();
  scheduler.Notify();
  bool past_ran_first = false;
  for (int i = 0; i < 500; ++i) {
    auto w = f.store->Get(waiting, /*with_history=*/false);
    auto p = f.store->Get(past, /*with_history=*/false);
    if (w.ok() && w->state() == v1::QUEUED && p.ok() && p->state() != v1::QUEUED) {
      past_ran_first = true;
    }
    if (w.ok() && IsTerminal(w->state()) && p.ok() && IsTerminal(p->state())) break;
    std::this_thread::sleep_for(5ms);
  }
  scheduler.Stop();
  EXPECT_TRUE(past_ran_first);
  auto w = *f.store->Get(waiting, /*with_history=*/false);
  auto p = *f.store->Get(past, /*with_history=*/false);
  ASSERT_EQ(w.state(), v1::SUCCEEDED) << w.reason();
  ASSERT_EQ(p.state(), v1::SUCCEEDED) << p.reason();
  EXPECT_GE(absl::FromUnixMillis(w.started_unix_ms()), waiting_until - absl::Milliseconds(1))
      << "allocated before its stored backoff ended";
  EXPECT_LT(absl::FromUnixMillis(p.started_unix_ms()), waiting_until)
      << "a job whose backoff has passed starts at once";
}

// An elastic job (4 stages, at least 2 workers) with 3 idle workers runs on 3 stages at the
// same global batch, and says so in its resizes; with 1 it waits, saying how many it needs.
TEST(SchedulerTest, AnElasticJobRunsOnTheWorkersThereAre) {
  RunnerFixture f;
  for (int i = 0; i < 3; ++i) {
    (void)f.registry.Register(RegistrationOf(absl::StrCat("127.0.0.1:", 2000 + i)));
  }
  Scheduler scheduler(f.env, absl::Milliseconds(10));
  scheduler.Start();
  v1::JobSpec spec = JobSpecOf(4, 3);
  spec.mutable_pipeline()->set_partition("uniform");
  spec.mutable_model()->set_n_layer(4);
  spec.mutable_elastic()->set_min_workers(2);
  ASSERT_TRUE(ValidateJobSpec(spec).ok()) << ValidateJobSpec(spec);
  const std::string id = *f.store->Add(spec);
  scheduler.Notify();
  for (int i = 0; i < 500; ++i) {
    auto job = f.store->Get(id);
    if (job.ok() && IsTerminal(job->state())) break;
    std::this_thread::sleep_for(10ms);
  }
  auto job = f.store->Get(id);
  ASSERT_EQ(job->state(), v1::SUCCEEDED) << job->reason();
  EXPECT_EQ(job->spec().pipeline().stages(), 3);
  EXPECT_EQ(job->written_pipeline().stages(), 4);
  EXPECT_EQ(job->effective_batch(), EffectiveBatch(spec));
  ASSERT_EQ(job->resizes_size(), 1);
  const v1::ResizeEvent& r = job->resizes(0);
  EXPECT_EQ(r.from_workers(), 4);
  EXPECT_EQ(r.to_workers(), 3);
  EXPECT_EQ(r.to_stages(), 3);
  EXPECT_EQ(r.checkpoint_step(), -1);
  EXPECT_EQ(r.steps_redone(), 0);
  EXPECT_THAT(r.cause(), HasSubstr("start: 3 idle worker(s)"));
  EXPECT_EQ(f.factory.made.size(), 3u);

  // A job that needs at least 4 of the 3 workers waits, saying so.
  v1::JobSpec two = spec;
  two.mutable_elastic()->set_min_workers(4);
  const std::string waiting = *f.store->Add(two);
  scheduler.Notify();
  std::string reason;
  for (int i = 0; i < 200 && reason.find("needs at least") == std::string::npos; ++i) {
    std::this_thread::sleep_for(10ms);
    reason = f.store->Get(waiting)->reason();
  }
  scheduler.Stop();
  EXPECT_EQ(f.store->Get(waiting)->state(), v1::QUEUED);
  EXPECT_THAT(reason, HasSubstr("elastic: 3 worker(s) available, the job needs at least 4"));
}

}  // namespace
}  // namespace tandem::coordinator
