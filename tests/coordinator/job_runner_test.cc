// The job runner on fake workers: the step loop, clipping, validation, failures, cancels,
// lost workers and restarts; and the learning-rate, eval and backoff arithmetic and the
// classification of failures (restart or fail) it uses.
#include "coordinator/job_runner.h"

#include <stdlib.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "coordinator/checkpoint_store.h"
#include "coordinator/step_summary.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/coordinator/runner_fixture.h"

namespace tandem::coordinator {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;

TEST(LearningRateTest, LinearWarmupThenConstant) {
  v1::OptimizerSpec opt;
  opt.set_lr(1.0f);
  opt.set_warmup_steps(4);
  opt.set_lr_schedule("constant");
  EXPECT_FLOAT_EQ(LearningRateAt(opt, 0, 100), 0.25f);
  EXPECT_FLOAT_EQ(LearningRateAt(opt, 3, 100), 1.0f);
  EXPECT_FLOAT_EQ(LearningRateAt(opt, 99, 100), 1.0f);
}

TEST(LearningRateTest, WarmupThenCosineToMinRatioAtTheLastStep) {
  v1::OptimizerSpec opt;
  opt.set_lr(1.0f);
  opt.set_warmup_steps(10);
  opt.set_lr_schedule("cosine");
  opt.set_min_lr_ratio(0.1f);
  EXPECT_FLOAT_EQ(LearningRateAt(opt, 4, 111), 0.5f);
  EXPECT_FLOAT_EQ(LearningRateAt(opt, 10, 111), 1.0f);   // first step after warm-up
  EXPECT_FLOAT_EQ(LearningRateAt(opt, 60, 111), 0.55f);  // half way: (1 + 0.1) / 2
  EXPECT_FLOAT_EQ(LearningRateAt(opt, 110, 111), 0.1f);  // last step
  EXPECT_FLOAT_EQ(LearningRateAt(opt, 500, 111), 0.1f);
}

TEST(EvalDueTest, EveryKStepsAndAfterTheLast) {
  v1::JobSpec spec = JobSpecOf(1, 10);
  spec.mutable_eval()->set_every(4);
  std::vector<int64_t> due;
  for (int64_t s = 0; s < 10; ++s) {
    if (EvalDue(spec, s)) due.push_back(s);
  }
  EXPECT_EQ(due, (std::vector<int64_t>{3, 7, 9}));
  spec.mutable_eval()->set_every(0);
  EXPECT_FALSE(EvalDue(spec, 9));
}

TEST(JobRunnerTest, OneRunStepPerWorkerPerStepAndProgramsAreLowered) {
  RunnerFixture f;
  auto runner = f.Start(JobSpecOf(2, 5));
  f.WaitFinished(*runner);
  auto job = *f.store->Get(runner->job_id());
  EXPECT_EQ(job.state(), v1::SUCCEEDED) << job.reason();
  ASSERT_EQ(f.factory.made.size(), 2u);
  for (FakeWorker* w : f.factory.made) {
    EXPECT_EQ(w->run_steps.load(), 5);  // O(1) RPCs per worker per step, not O(M)
    EXPECT_EQ(w->aborts.load(), 1);     // the stage is dropped at the end
  }
  // Rank 0 of a 2-stage 1F1B with M=4, lowered: sends after forwards, receives before B.
  const v1::StageProgram& p0 = f.factory.made[0]->program_;
  EXPECT_EQ(p0.actions(0).kind(), v1::ACTION_F);
  EXPECT_EQ(p0.actions(1).kind(), v1::ACTION_SEND_F);
  EXPECT_EQ(job.history_size(), 5);
  EXPECT_DOUBLE_EQ(job.history(4).loss(), 1.0);
  EXPECT_EQ(job.stages(0).actions(), "0F0 0F1 0B0 0F2 0B1 0F3 0B2 0B3");
  EXPECT_EQ(f.registry.List()[0].state, v1::IDLE);
}

// Each step's timings go to the store (with the lowered program, once), and the summary's
// per-stage busy time is summed from the same record.
TEST(JobRunnerTest, StepTimingsAreKeptAndGiveThePerStageBusyTime) {
  RunnerFixture f;
  f.factory.configure = [](FakeWorker* w) { w->timed = true; };
  auto runner = f.Start(JobSpecOf(2, 3));
  f.WaitFinished(*runner);
  auto job = *f.store->Get(runner->job_id());
  ASSERT_EQ(job.state(), v1::SUCCEEDED) << job.reason();
  absl::StatusOr<v1::JobTimings> timings = f.store->GetTimings(job.id());
  ASSERT_TRUE(timings.ok()) << timings.status();
  EXPECT_EQ(timings->program().schedule(), "1f1b");
  ASSERT_EQ(timings->steps_size(), 3);
  EXPECT_EQ(timings->steps(2).step(), 2);
  EXPECT_EQ(timings->steps(2).clock_offsets_us_size(), 2);
  EXPECT_EQ(timings->steps(2).ranks(1).rank(), 1);
  ASSERT_EQ(job.history(2).stage_busy_seconds_size(), 2);
  // 4 forwards and 4 backwards of 10 us per stage.
  EXPECT_DOUBLE_EQ(job.history(2).stage_busy_seconds(0), 80e-6);
  EXPECT_DOUBLE_EQ(job.history(2).stage_busy_seconds(1), 80e-6);
}

TEST(RestartBackoffTest, DoublesFromTheBaseUpToTheCap) {
  RunnerOptions o;
  o.restart_backoff = absl::Seconds(1);
  o.restart_backoff_max = absl::Seconds(5);
  EXPECT_EQ(RestartBackoff(o, 0), absl::ZeroDuration());
  EXPECT_EQ(RestartBackoff(o, 1), absl::Seconds(1));
  EXPECT_EQ(RestartBackoff(o, 2), absl::Seconds(2));
  EXPECT_EQ(RestartBackoff(o, 3), absl::Seconds(4));
  EXPECT_EQ(RestartBackoff(o, 4), absl::Seconds(5));
  EXPECT_EQ(RestartBackoff(o, 1000), absl::Seconds(5));
  o.restart_backoff = absl::ZeroDuration();
  EXPECT_EQ(RestartBackoff(o, 3), absl::ZeroDuration());
}

// Which failures fail a job at once and which restart it (issue 26).
TEST(RunFailureTest, AWorkerRefusingItsConfigurationIsPermanentAndEverythingElseAFault) {
  using Code = absl::StatusCode;
  for (Code code : {Code::kInvalidArgument, Code::kNotFound, Code::kPermissionDenied,
                    Code::kFailedPrecondition, Code::kResourceExhausted}) {
    EXPECT_EQ(ClassifyRunFailure(RunPhase::kConfigure, code), FailureKind::kPermanent)
        << absl::StatusCodeToString(code);
    // The same code from a step is a fault: a restarted worker refuses a run it no longer holds.
    EXPECT_EQ(ClassifyRunFailure(RunPhase::kTrain, code), FailureKind::kFault)
        << absl::StatusCodeToString(code);
  }
  for (Code code : {Code::kUnavailable, Code::kDeadlineExceeded, Code::kAborted, Code::kCancelled,
                    Code::kDataLoss, Code::kInternal, Code::kUnknown}) {
    EXPECT_EQ(ClassifyRunFailure(RunPhase::kConfigure, code), FailureKind::kFault)
        << absl::StatusCodeToString(code);
    EXPECT_EQ(ClassifyRunFailure(RunPhase::kTrain, code), FailureKind::kFault)
        << absl::StatusCodeToString(code);
  }
  // No worker's own answer (unreachable, lost, interrupted): a fault, but at planning.
  EXPECT_EQ(ClassifyRunFailure(RunPhase::kConfigure, std::nullopt), FailureKind::kFault);
  EXPECT_EQ(ClassifyRunFailure(RunPhase::kTrain, std::nullopt), FailureKind::kFault);
  EXPECT_EQ(ClassifyRunFailure(RunPhase::kPlan, std::nullopt), FailureKind::kPermanent);
  EXPECT_EQ(ClassifyRunFailure(RunPhase::kPlan, Code::kUnavailable), FailureKind::kPermanent);
}

TEST(JobRunnerTest, ClipsByTheGlobalNormAndSkipsNonFiniteSteps) {
  RunnerFixture f;
  f.factory.configure = [](FakeWorker* w) {
    if (w->rank_ == 1) w->nan_at_step = 2;
  };
  auto runner = f.Start(JobSpecOf(2, 4));  // grad_clip defaults to 1.0
  f.WaitFinished(*runner);
  auto job = *f.store->Get(runner->job_id());
  ASSERT_EQ(job.state(), v1::SUCCEEDED) << job.reason();
  for (FakeWorker* w : f.factory.made) {
    ASSERT_EQ(w->applies.size(), 4u);
    // Two stages of norm 2 each: global norm sqrt(8); clipped to 1.
    EXPECT_FLOAT_EQ(w->applies[0].grad_scale(), ClipScale(std::sqrt(8.0), 1.0f));
    EXPECT_FALSE(w->applies[0].skip());
    EXPECT_TRUE(w->applies[2].skip());  // one stage's gradient was not finite: all skip
  }
  EXPECT_NEAR(job.history(0).grad_norm(), std::sqrt(8.0), 1e-12);
  EXPECT_TRUE(job.history(2).skipped());
  EXPECT_EQ(job.skipped_steps(), 1);
}

TEST(JobRunnerTest, EvaluatesEveryKSteps) {
  RunnerFixture f;
  v1::JobSpec spec = JobSpecOf(2, 5);
  spec.mutable_eval()->set_every(2);
  auto runner = f.Start(spec);
  f.WaitFinished(*runner);
  auto job = *f.store->Get(runner->job_id());
  ASSERT_EQ(job.state(), v1::SUCCEEDED) << job.reason();
  // Steps 1, 3 and the last (4) are followed by a validation pass: 5 + 3 RunStep calls.
  for (FakeWorker* w : f.factory.made) EXPECT_EQ(w->run_steps.load(), 8);
  EXPECT_FALSE(job.history(0).has_val_loss());
  EXPECT_TRUE(job.history(1).has_val_loss());
  EXPECT_TRUE(job.history(4).has_val_loss());
  EXPECT_TRUE(job.has_val_loss());
  const v1::StageProgram& p1 = f.factory.made[1]->program_;
  EXPECT_EQ(p1.eval_micro_batches(), spec.eval().micro_batches());
  EXPECT_EQ(p1.eval_actions(0).kind(), v1::ACTION_RECV_F);
}

TEST(JobRunnerTest, AStepErrorFailsTheJobNamingStageAndWorker) {
  RunnerFixture f;
  f.factory.configure = [](FakeWorker* w) {
    if (w->rank_ == 1) w->fail_at_step = 2;
    if (w->rank_ == 0) w->hang_at_step = 2;  // blocked until aborted, as a real peer would be
  };
  auto runner = f.Start(JobSpecOf(2, 10));
  f.WaitFinished(*runner);
  auto job = *f.store->Get(runner->job_id());
  EXPECT_EQ(job.state(), v1::FAILED);
  EXPECT_THAT(job.reason(), HasSubstr("step 3: "));  // index 2, numbered from 1
  EXPECT_THAT(job.reason(), HasSubstr("stage 1 (worker w-2 at 127.0.0.1:1001)"));
  EXPECT_THAT(job.reason(), HasSubstr("boom"));
  EXPECT_EQ(job.steps_done(), 2);
}

// The step relay (step_relay_plan.h): with 4 workers and the relay on from 2, the coordinator
// calls ranks 0 and 2, which forward to 1 and 3; every rank still runs every step once, and
// every report reaches the summary.
TEST(JobRunnerTest, TheStepRelayCallsOneWorkerPerGroupAndGathersEveryReport) {
  RunnerFixture f;
  f.env.options.step_relay_min_workers = 2;
  auto runner = f.Start(JobSpecOf(4, 5));
  f.WaitFinished(*runner);
  auto job = *f.store->Get(runner->job_id());
  ASSERT_EQ(job.state(), v1::SUCCEEDED) << job.reason();
  ASSERT_EQ(f.factory.made.size(), 4u);
  for (FakeWorker* w : f.factory.made) EXPECT_EQ(w->run_steps.load(), 5);
  EXPECT_EQ(f.factory.made[0]->relay_requests.load(), 5);
  EXPECT_EQ(f.factory.made[1]->relay_requests.load(), 0);
  EXPECT_EQ(f.factory.made[2]->relay_requests.load(), 5);
  EXPECT_EQ(f.factory.made[3]->relay_requests.load(), 0);
  ASSERT_EQ(job.history_size(), 5);
  EXPECT_DOUBLE_EQ(job.history(4).loss(), 1.0);       // the last stage's (rank 3), relayed
  EXPECT_DOUBLE_EQ(job.history(4).grad_norm(), 4.0);  // sqrt(4 stages x 4.0): every rank's
}

// A failure behind the relay is the failed worker's: the reason names it, not the worker that
// relayed it, and the rest of the gang is aborted.
TEST(JobRunnerTest, ARelayedFailureNamesTheWorkerThatFailed) {
  RunnerFixture f;
  f.env.options.step_relay_min_workers = 2;
  f.factory.configure = [](FakeWorker* w) {
    if (w->rank_ == 3) w->fail_at_step = 2;
  };
  auto runner = f.Start(JobSpecOf(4, 10));
  f.WaitFinished(*runner);
  auto job = *f.store->Get(runner->job_id());
  EXPECT_EQ(job.state(), v1::FAILED);
  EXPECT_THAT(job.reason(), HasSubstr("step 3: stage 3 (worker w-4 at 127.0.0.1:1003)"));
  EXPECT_THAT(job.reason(), HasSubstr("boom"));
  EXPECT_GE(f.factory.made[0]->aborts.load(), 1);
  EXPECT_EQ(job.steps_done(), 2);
}

TEST(JobRunnerTest, CancelAbortsAHangingStep) {
  RunnerFixture f;
  f.factory.configure = [](FakeWorker* w) { w->hang_at_step = 1; };
  auto runner = f.Start(JobSpecOf(2, 10));
  std::this_thread::sleep_for(50ms);
  runner->Cancel("cancelled by the user");
  f.WaitFinished(*runner);
  auto job = *f.store->Get(runner->job_id());
  EXPECT_EQ(job.state(), v1::CANCELLED);
  EXPECT_EQ(job.reason(), "cancelled by the user");
}

TEST(JobRunnerTest, ALostWorkerFailsTheJob) {
  RunnerFixture f;
  f.factory.configure = [](FakeWorker* w) { w->hang_at_step = 0; };
  auto runner = f.Start(JobSpecOf(2, 10));
  std::this_thread::sleep_for(50ms);
  WorkerRecord lost = *f.registry.Get("w-2");
  runner->OnWorkerLost(lost);
  f.WaitFinished(*runner);
  auto job = *f.store->Get(runner->job_id());
  EXPECT_EQ(job.state(), v1::FAILED);
  EXPECT_THAT(job.reason(), HasSubstr("worker w-2 (127.0.0.1:1001, stage 1) was lost"));
}

// A fault after planning ends the run; with restarts left the job goes back to the queue
// (the scheduler starts it again), its progress rolled back to its checkpoint (none here).
TEST(JobRunnerTest, AFaultWithRestartsLeftRequeuesTheJob) {
  RunnerFixture f;
  f.factory.configure = [](FakeWorker* w) {
    if (w->rank_ % 2 == 1) w->fail_at_step = 2;  // stage 1 of every run (clients are per run)
  };
  auto runner = f.Start(JobSpecOf(2, 10, /*max_restarts=*/1));
  f.WaitFinished(*runner);
  auto job = *f.store->Get(runner->job_id());
  EXPECT_EQ(job.state(), v1::QUEUED);
  EXPECT_EQ(job.restarts(), 1);
  EXPECT_THAT(job.first_failure(), HasSubstr("step 3: stage 1"));
  EXPECT_THAT(job.reason(), HasSubstr("restart 1 of 1 after: step 3: stage 1"));
  EXPECT_THAT(job.reason(), HasSubstr("resumes from the start (no checkpoint yet)"));
  EXPECT_EQ(job.steps_done(), 0) << "the steps after the checkpoint run again";
  EXPECT_EQ(job.history_size(), 0);

  // The second run fails the same way and has no restart left: FAILED with the first cause.
  auto again = std::make_unique<JobRunner>(f.env, job, f.workers);
  again->Start();
  f.WaitFinished(*again);
  job = *f.store->Get(runner->job_id());
  EXPECT_EQ(job.state(), v1::FAILED);
  EXPECT_THAT(job.reason(), HasSubstr("failed after 1 restart(s); first cause: step 3: stage 1"));
}

// A worker that fails step 6 (index 5) and is gone: unreachable from then on.
void DiesAtStep6(FakeWorker* w) {
  w->fail_at_step = 5;
  w->liveness_error = absl::UnavailableError("connection refused");
}

// Peer recovery: a 2 x 2 job (gang ranks: replica 0 = {0, 1}, replica 1 = {2, 3}).
struct PeerRun {
  explicit PeerRun(RunnerFixture& f, int workers = 5) : f(f) {
    auto spec = LoadJobSpecYaml(
        "steps: 10\nmax_restarts: 2\npipeline:\n  stages: 2\n  replicas: 2\n  micro_batches: 4\n");
    EXPECT_TRUE(spec.ok()) << spec.status();
    id = *f.store->Add(*spec);
    for (int i = 0; i < workers; ++i) {
      (void)f.registry.Register(RegistrationOf(absl::StrCat("127.0.0.1:", 1000 + i)));
    }
  }
  // One run on 4 of the idle workers, to its end.
  v1::Job Run() {
    auto gang = f.registry.Allocate("cpu", 4, id);
    EXPECT_TRUE(gang.ok()) << gang.status();
    return RunOn(*gang);
  }
  // One run on `gang`, to its end.
  v1::Job RunOn(const std::vector<WorkerRecord>& gang) {
    gang_of_run.push_back(gang);
    first_fake.push_back(static_cast<int>(f.factory.made.size()));
    {
      JobRunner runner(f.env, *f.store->Get(id), gang);
      runner.Start();
      f.WaitFinished(runner);
      // The runner owns its fakes: what the test reads of them is copied before they go.
      for (size_t i = seen.size(); i < f.factory.made.size(); ++i) {
        FakeWorker* w = f.factory.made[i];
        std::lock_guard<std::mutex> lock(w->abort_mu);
        seen.push_back({w->program_, w->run_steps.load(),
                        w->abort_requests.empty() ? v1::AbortRequest() : w->abort_requests.back()});
      }
    }
    return *f.store->Get(id);
  }
  struct Seen {
    v1::StageProgram program;
    int run_steps = 0;
    v1::AbortRequest last_abort;
  };
  RunnerFixture& f;
  std::string id;
  std::vector<std::vector<WorkerRecord>> gang_of_run;
  std::vector<int> first_fake;  // the index of each run's first fake worker
  std::vector<Seen> seen;       // by fake worker, in the order made
};

TEST(JobRunnerTest, AFaultAReplicaCoversResumesFromTheSurvivorsWithNoStepRedone) {
  RunnerFixture f;
  f.env.options.restart_backoff = absl::ZeroDuration();
  // The first run's rank 3 (stage 1 of replica 1) fails step 6 and is gone.
  f.factory.configure = [](FakeWorker* w) {
    if (w->rank_ == 3) DiesAtStep6(w);
  };
  PeerRun run(f);
  v1::Job job = run.Run();
  ASSERT_EQ(job.state(), v1::QUEUED) << job.reason();
  EXPECT_EQ(job.restarts(), 1);
  EXPECT_THAT(job.reason(), HasSubstr("from the state 3 surviving worker(s) kept after step 5 "
                                      "(peer recovery)"));
  EXPECT_EQ(job.steps_done(), 5) << "steps 1-5 stand: only the step in flight runs again";
  EXPECT_EQ(job.last_steps_redone(), 0);
  ASSERT_EQ(job.peer_state().holders_size(), 3);
  EXPECT_EQ(job.peer_state().step(), 4);
  for (const v1::StateHolder& h : job.peer_state().holders()) {
    EXPECT_NE(h.address(), run.gang_of_run[0][3].address) << "the lost worker holds nothing";
  }
  for (int r = 0; r < 3; ++r) {
    const v1::AbortRequest& a = run.seen[r].last_abort;
    EXPECT_TRUE(a.retain_state()) << "rank " << r;
    EXPECT_EQ(a.retain_step(), 4);
    EXPECT_EQ(a.retain_apply().step(), 4) << "step 5's update, for a worker step 6 missed";
  }

  // The next run (the spare in the lost worker's place) restores from the holders of each
  // worker's layers first, trains steps 6-10 only, and its final aborts keep nothing.
  job = run.Run();
  EXPECT_EQ(job.state(), v1::SUCCEEDED) << job.reason();
  EXPECT_EQ(job.peer_recoveries(), 1);
  EXPECT_FALSE(job.has_peer_state());
  EXPECT_EQ(job.steps_redone(), 0);
  for (int r = 0; r < 4; ++r) {
    const PeerRun::Seen& w = run.seen[run.first_fake[1] + r];
    EXPECT_EQ(w.program.restore().step(), 4);
    ASSERT_EQ(w.program.restore().peers_size(), 3);
    EXPECT_EQ(w.run_steps, 5) << "steps 6-10";
    EXPECT_FALSE(w.last_abort.retain_state());
  }
  // A stage-1 worker asks a holder of stage 1 first (the surviving rank 1).
  EXPECT_EQ(run.seen[run.first_fake[1] + 1].program.restore().peers(0),
            run.gang_of_run[0][1].address);
}

// A holder that the next gang leaves out (here the surviving rank 2, replaced by spares) is
// told, once the gang has restored, to drop the copy it kept: an Abort of the job that keeps
// nothing. The holders in the gang drop theirs at their first step.
TEST(JobRunnerTest, AHolderLeftOutOfTheNextGangIsToldToDropWhatItKept) {
  RunnerFixture f;
  f.env.options.restart_backoff = absl::ZeroDuration();
  f.factory.configure = [](FakeWorker* w) {
    if (w->rank_ == 3) DiesAtStep6(w);
  };
  PeerRun run(f, 6);
  v1::Job job = run.Run();
  ASSERT_EQ(job.state(), v1::QUEUED) << job.reason();
  ASSERT_EQ(job.peer_state().holders_size(), 3);
  const std::vector<WorkerRecord>& first = run.gang_of_run[0];
  std::vector<WorkerRecord> next = {first[0], first[1]};
  for (const WorkerRecord& w : f.registry.List()) {
    if (next.size() < 4 && std::none_of(first.begin(), first.end(),
                                        [&](const WorkerRecord& g) { return g.id == w.id; })) {
      next.push_back(w);
    }
  }
  ASSERT_EQ(next.size(), 4u);
  const size_t made_before = f.factory.made.size();
  job = run.RunOn(next);
  EXPECT_EQ(job.state(), v1::SUCCEEDED) << job.reason();
  EXPECT_EQ(job.peer_recoveries(), 1);
  // The run's four workers, then one connection more: the release of the left-out holder.
  ASSERT_EQ(run.seen.size(), made_before + 5);
  const v1::AbortRequest& release = run.seen[made_before + 4].last_abort;
  EXPECT_EQ(release.job_id(), run.id);
  EXPECT_FALSE(release.retain_state());
  EXPECT_THAT(release.reason(), HasSubstr("restored the state this worker kept"));
}

TEST(JobRunnerTest, AStageWithNoSurvivingReplicaResumesFromTheCheckpoint) {
  RunnerFixture f;
  f.env.options.restart_backoff = absl::ZeroDuration();
  // Both replicas of stage 1 are gone.
  f.factory.configure = [](FakeWorker* w) {
    if (w->rank_ == 1 || w->rank_ == 3) DiesAtStep6(w);
  };
  PeerRun run(f, 6);
  const v1::Job job = run.Run();
  ASSERT_EQ(job.state(), v1::QUEUED) << job.reason();
  EXPECT_FALSE(job.has_peer_state());
  EXPECT_THAT(job.reason(), HasSubstr("from the start (no checkpoint yet)"));
  EXPECT_EQ(job.last_steps_redone(), 5);
  EXPECT_FALSE(run.seen[0].last_abort.retain_state()) << "the survivors drop what they kept";
  EXPECT_FALSE(run.seen[2].last_abort.retain_state());
}

// The holders cannot serve (one died mid-transfer, and no other holds its tensors): the
// restore fails as a fault, and the run after it starts from the checkpoint, the steps since
// it counted as redone.
TEST(JobRunnerTest, APeerRestoreThatFailsFallsBackToTheCheckpoint) {
  RunnerFixture f;
  f.env.options.restart_backoff = absl::ZeroDuration();
  f.factory.configure = [](FakeWorker* w) {
    if (w->rank_ == 3) DiesAtStep6(w);
    if (w->rank_ == 5) {
      w->configure_error = absl::UnavailableError(
          "peer recovery of job j after step 5: 4 of 4 tensors held by none of the 3 workers");
    }
  };
  PeerRun run(f);
  ASSERT_TRUE(run.Run().has_peer_state());
  v1::Job job = run.Run();
  ASSERT_EQ(job.state(), v1::QUEUED) << job.reason();
  EXPECT_EQ(job.restarts(), 2);
  EXPECT_FALSE(job.has_peer_state());
  EXPECT_EQ(job.peer_recoveries(), 0);
  EXPECT_THAT(job.reason(), HasSubstr("held by none"));
  EXPECT_THAT(job.reason(), HasSubstr("from the start (no checkpoint yet)"));
  EXPECT_EQ(job.steps_done(), 0);
  EXPECT_EQ(job.last_steps_redone(), 5);
  EXPECT_EQ(job.steps_redone(), 5);
}

// An elastic job that idle workers let grow ends its run after the step it saw them at, its
// workers keeping their state (with that step's update, not sent yet) for the bigger gang: no
// checkpoint waited for, no restart counted, nothing redone.
TEST(JobRunnerTest, AnElasticJobGrowsAfterAnyStepFromItsWorkersState) {
  RunnerFixture f;
  auto spec = LoadJobSpecYaml(
      "steps: 10\nmax_restarts: 1\npipeline:\n  stages: 2\n  micro_batches: 4\n"
      "elastic:\n  min_workers: 1\n  max_workers: 3\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  const std::string id = *f.store->Add(*spec);
  for (int i = 0; i < 3; ++i) {
    (void)f.registry.Register(RegistrationOf(absl::StrCat("127.0.0.1:", 1000 + i)));
  }
  auto gang = f.registry.Allocate("cpu", 2, id);
  ASSERT_TRUE(gang.ok()) << gang.status();
  std::vector<v1::AbortRequest> aborts;
  {
    JobRunner runner(f.env, *f.store->Get(id), *gang);
    runner.Start();
    f.WaitFinished(runner);
    for (FakeWorker* w : f.factory.made) {
      std::lock_guard<std::mutex> lock(w->abort_mu);
      ASSERT_FALSE(w->abort_requests.empty());
      aborts.push_back(w->abort_requests.back());
    }
  }
  const v1::Job job = *f.store->Get(id);
  EXPECT_EQ(job.state(), v1::QUEUED) << job.reason();
  EXPECT_THAT(job.reason(), HasSubstr("grow: 1 idle worker(s); from 2 to 3 workers (3 x 1) from "
                                      "its workers' state after step 1"));
  EXPECT_EQ(job.restarts(), 0);
  EXPECT_EQ(job.steps_done(), 1);
  EXPECT_EQ(job.peer_state().step(), 0);
  EXPECT_EQ(job.peer_state().holders_size(), 2) << "every worker of the gang";
  ASSERT_EQ(aborts.size(), 2u);
  for (const v1::AbortRequest& a : aborts) {
    EXPECT_TRUE(a.retain_state());
    EXPECT_EQ(a.retain_step(), 0);
    EXPECT_EQ(a.retain_apply().step(), 0);
  }
}

// Regression (issue 26): a configuration error that no restart can fix (INVALID_ARGUMENT from a
// worker's Configure: a checkpoint of another shape) fails the job at once with the worker's
// error, restarts untouched; it used to be restarted max_restarts times, failing identically.
TEST(JobRunnerTest, AConfigurationErrorFailsTheJobAtOnce) {
  RunnerFixture f;
  f.factory.configure = [](FakeWorker* w) {
    if (w->rank_ == 1) {
      w->configure_error = absl::InvalidArgumentError(
          "configure of job job-1 rank 1: restore: tensor h.0.w has 12 bytes, this stage needs 16 "
          "(a different model shape?)");
    }
  };
  auto runner = f.Start(JobSpecOf(2, 10, /*max_restarts=*/3));
  f.WaitFinished(*runner);
  auto job = *f.store->Get(runner->job_id());
  EXPECT_EQ(job.state(), v1::FAILED) << job.reason();
  EXPECT_EQ(job.restarts(), 0);
  EXPECT_EQ(job.first_failure(), "");
  EXPECT_THAT(job.reason(), HasSubstr("configure: stage 1 (worker w-2 at 127.0.0.1:1001): "
                                      "INVALID_ARGUMENT: configure of job job-1 rank 1: restore: "
                                      "tensor h.0.w has 12 bytes"));
  for (FakeWorker* w : f.factory.made) {
    EXPECT_EQ(w->run_steps.load(), 0);
    EXPECT_GE(w->aborts.load(), 1) << "its stage is dropped";
  }
  EXPECT_EQ(f.registry.List()[0].state, v1::IDLE);
}

// A fault at configure (a worker's UNAVAILABLE: a peer out of reach; or a worker unreachable,
// which outranks another's refusal) requeues the job with its restart backoff stored with it,
// for the scheduler to honour across a coordinator restart (issue 26).
TEST(JobRunnerTest, AFaultAtConfigureRequeuesTheJobWithItsBackoffStored) {
  struct Case {
    std::string name;
    std::function<void(FakeWorker*)> configure;
    std::string cause;
  };
  const std::vector<Case> cases = {
      {"unavailable",
       [](FakeWorker* w) {
         if (w->rank_ % 2 == 1) {
           w->configure_error = absl::UnavailableError("connecting the transport failed");
         }
       },
       "configure: stage 1 (worker w-2 at 127.0.0.1:1001): UNAVAILABLE: connecting the "
       "transport failed"},
      {"unreachable",
       [](FakeWorker* w) {
         if (w->rank_ % 2 == 0) w->liveness_error = absl::UnavailableError("connection refused");
         if (w->rank_ % 2 == 1) w->configure_error = absl::InvalidArgumentError("bad shape");
       },
       "configure: stage 0 (worker w-1 at 127.0.0.1:1000) is unreachable"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    RunnerFixture f;
    f.env.options.restart_backoff = absl::Seconds(30);
    f.factory.configure = c.configure;
    const absl::Time before = absl::Now();
    auto runner = f.Start(JobSpecOf(2, 10, /*max_restarts=*/3));
    f.WaitFinished(*runner);
    const absl::Time after = absl::Now();
    auto job = *f.store->Get(runner->job_id());
    EXPECT_EQ(job.state(), v1::QUEUED) << job.reason();
    EXPECT_EQ(job.restarts(), 1);
    EXPECT_THAT(job.first_failure(), HasSubstr(c.cause));
    EXPECT_THAT(job.reason(), HasSubstr("; waits 30s before its next run"));
    const absl::Time not_before = absl::FromUnixMillis(job.not_before_unix_ms());
    EXPECT_GE(not_before, before + absl::Seconds(30) - absl::Milliseconds(1));
    EXPECT_LE(not_before, after + absl::Seconds(30));
  }
}

// The backoff doubles with the restarts since a run last trained a step: a run that trained
// waits the base again; runs that fail before their first step double it.
TEST(JobRunnerTest, TheBackoffDoublesOnlyWithRestartsInARow) {
  RunnerFixture f;
  f.env.options.restart_backoff = absl::Seconds(30);
  f.env.options.restart_backoff_max = absl::Seconds(600);
  f.factory.configure = [](FakeWorker* w) {
    if (w->rank_ == 1) w->fail_at_step = 2;  // after two steps trained
  };
  auto runner = f.Start(JobSpecOf(2, 10, /*max_restarts=*/5));
  f.WaitFinished(*runner);
  const std::string id = runner->job_id();
  auto job = *f.store->Get(id);
  ASSERT_EQ(job.state(), v1::QUEUED) << job.reason();
  EXPECT_EQ(job.restarts_in_a_row(), 1);
  EXPECT_THAT(job.reason(), HasSubstr("; waits 30s before its next run"));
  // Two more runs, each failing at its Configure (no step trained): 60 s, then 120 s.
  for (int run = 2; run <= 3; ++run) {
    f.factory.configure = [](FakeWorker* w) {
      w->configure_error = absl::UnavailableError("peer gone");
    };
    auto gang = f.registry.Allocate("cpu", 2, id);
    ASSERT_TRUE(gang.ok()) << gang.status();
    JobRunner again(f.env, *f.store->Get(id), *gang);
    again.Start();
    f.WaitFinished(again);
    job = *f.store->Get(id);
    ASSERT_EQ(job.state(), v1::QUEUED) << job.reason();
    EXPECT_EQ(job.restarts(), run);
    EXPECT_EQ(job.restarts_in_a_row(), run);
    EXPECT_THAT(job.reason(), HasSubstr(absl::StrCat("; waits ", run == 2 ? "1m" : "2m",
                                                     " before its next run")));
  }
}

// A cancelled job is never restarted, whatever max_restarts says.
// A cuda job on two workers that share a GPU (same host, same uuid): started like
// RunnerFixture::Start, on cuda workers.
std::unique_ptr<JobRunner> StartOnOneGpu(RunnerFixture& f, const std::string& transport) {
  absl::StatusOr<v1::JobSpec> spec = LoadJobSpecYaml(absl::StrCat(
      "device: cuda\nsteps: 3\nmax_restarts: 3\npipeline:\n  stages: 2\n  micro_batches: 4\n"
      "  transport: ",
      transport, "\n"));
  EXPECT_TRUE(spec.ok()) << spec.status();
  const std::string id = *f.store->Add(*spec);
  for (int i = 0; i < 2; ++i) {
    v1::RegisterRequest r = RegistrationOf(absl::StrCat("127.0.0.1:", 1000 + i), "cuda:0");
    r.set_hostname("h");
    r.set_device_uuid("GPU-8c7f2b1e-0f3a-4c1d-9e2b-5a6b7c8d9e0f");
    EXPECT_TRUE(f.registry.Register(r).ok());
  }
  auto gang = f.registry.Allocate("cuda", 2, id);
  EXPECT_TRUE(gang.ok()) << gang.status();
  f.workers = *gang;
  auto runner = std::make_unique<JobRunner>(f.env, *f.store->Get(id), *gang);
  runner->Start();
  return runner;
}

// pipeline.transport: nccl on two workers of one GPU fails at planning, before any worker is
// configured, and is not restarted: it would fail the same way again.
TEST(JobRunnerTest, NcclOnASharedGpuFailsAtOnceNamingTheWorkersAndTheGpu) {
  RunnerFixture f;
  auto runner = StartOnOneGpu(f, "nccl");
  f.WaitFinished(*runner);
  auto job = *f.store->Get(runner->job_id());
  EXPECT_EQ(job.state(), v1::FAILED) << job.reason();
  EXPECT_EQ(job.reason(),
            "pipeline.transport: nccl: workers w-1 and w-2 share "
            "GPU-8c7f2b1e-0f3a-4c1d-9e2b-5a6b7c8d9e0f (cuda:0 on host h); NCCL cannot put two "
            "ranks on one device: use pipeline.transport: gloo or auto");
  EXPECT_EQ(job.restarts(), 0);
  for (FakeWorker* w : f.factory.made) {
    EXPECT_EQ(w->program_.num_ranks(), 0) << "configured";
    EXPECT_EQ(w->run_steps.load(), 0);
  }
}

// auto on two workers of one GPU: every rank's program carries "gloo" (the host-staged
// transport), and so did the profile's link probe.
TEST(JobRunnerTest, AutoOnASharedGpuGivesEveryRankTheHostStagedTransport) {
  RunnerFixture f;
  auto runner = StartOnOneGpu(f, "auto");
  f.WaitFinished(*runner);
  auto job = *f.store->Get(runner->job_id());
  EXPECT_EQ(job.state(), v1::SUCCEEDED) << job.reason();
  ASSERT_GE(f.factory.made.size(), 2u);
  int configured = 0, probes = 0;
  for (FakeWorker* w : f.factory.made) {
    for (const v1::ProbeLinkRequest& probe : w->probe_requests) {
      ++probes;
      EXPECT_EQ(probe.device(), "cuda");
      EXPECT_EQ(probe.transport(), "gloo");
    }
    if (w->program_.num_ranks() == 0) continue;
    ++configured;
    EXPECT_EQ(w->program_.spec().pipeline().transport(), "gloo");
  }
  EXPECT_EQ(configured, 2);
  EXPECT_EQ(probes, 2);  // partition: profile measured the link, from both ends
}

TEST(JobRunnerTest, ACancelIsNotRestarted) {
  RunnerFixture f;
  f.factory.configure = [](FakeWorker* w) { w->hang_at_step = 1; };
  auto runner = f.Start(JobSpecOf(2, 10, /*max_restarts=*/3));
  std::this_thread::sleep_for(50ms);
  runner->Cancel("cancelled by the user");
  f.WaitFinished(*runner);
  EXPECT_EQ(f.store->Get(runner->job_id())->state(), v1::CANCELLED);
}

// Checkpoints into a real store under a temporary data root, which a test can make refuse a
// step's checkpoint: a regular file where its directory goes (create_directories fails, even
// as root), or a directory where its manifest's temporary file goes (open fails: EISDIR).
struct CheckpointRun {
  explicit CheckpointRun(CheckpointStoreOptions options = {}) {
    char dir_template[] = "/tmp/tandem-ckpt-runner-XXXXXX";
    root = mkdtemp(dir_template);
    store = std::make_unique<CheckpointStore>(root + "/checkpoints", std::move(options));
    f.env.checkpoints = store.get();
    f.env.options.checkpoint_retry_delay = absl::ZeroDuration();
  }
  ~CheckpointRun() {
    std::error_code ec;
    std::filesystem::remove_all(root, ec);
  }
  // Runs a 2-stage job of `steps` steps, checkpointed after every step, job-1 (the fixture's
  // first), to the end of its run; its record then.
  v1::Job Run(int steps, int max_restarts = 0) {
    auto spec = LoadJobSpecYaml(absl::StrCat("steps: ", steps, "\nmax_restarts: ", max_restarts,
                                             "\ncheckpoint:\n  every: 1\n  keep: 2\n"
                                             "pipeline:\n  stages: 2\n  micro_batches: 4\n"));
    EXPECT_TRUE(spec.ok()) << spec.status();
    std::unique_ptr<JobRunner> runner = f.Start(*spec);
    f.WaitFinished(*runner);
    return *f.store->Get(runner->job_id());
  }
  // The checkpoint after step index `step` of job-1 cannot start its stage files.
  void BlockDirectory(int64_t step) {
    std::filesystem::create_directories(root + "/checkpoints/job-1");
    std::ofstream(store->Dir("job-1", step)) << "in the way";
  }
  // ... or cannot write its manifest (its stage files are written first).
  void BlockManifest(int64_t step) {
    std::filesystem::create_directories(store->Dir("job-1", step) + "/manifest.json.tmp");
  }
  std::vector<v1::JobEvent> Warnings(const std::string& id) {
    std::vector<v1::JobEvent> out;
    auto log = f.store->WaitEvents(id, 0, absl::ZeroDuration());
    EXPECT_TRUE(log.ok()) << log.status();
    if (!log.ok()) return out;
    for (const v1::JobEvent& e : log->events) {
      if (e.kind() == v1::JobEvent::WARNING) out.push_back(e);
    }
    return out;
  }
  RunnerFixture f;
  std::string root;
  std::unique_ptr<CheckpointStore> store;
};

TEST(JobRunnerTest, CheckpointsEveryStageAfterTheStepsItIsDueAndKeepsTheNewest) {
  CheckpointRun c;
  const v1::Job job = c.Run(3);
  EXPECT_EQ(job.state(), v1::SUCCEEDED) << job.reason();
  EXPECT_EQ(job.checkpoint_step(), 2);
  EXPECT_EQ(job.checkpoint_failures(), 0);
  EXPECT_EQ(c.store->CompleteSteps("job-1"), (std::vector<int64_t>{1, 2}));  // keep: 2
  auto reader = c.store->Open("job-1", 2);
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_NE((*reader)->Find("w0"), nullptr);
  EXPECT_NE((*reader)->Find("w1"), nullptr);
}

// The coordinator's own storage failing (a full disk, say) is not the gang's fault: before the
// last step the checkpoint is skipped, counted and warned about, and the job trains on with no
// restart and no step redone; its latest checkpoint stays the one before.
TEST(JobRunnerTest, ACheckpointTheCoordinatorCannotStoreIsSkippedAndTheJobTrainsOn) {
  CheckpointRun c;
  c.BlockDirectory(1);  // after step 2: no stage file can start
  c.BlockManifest(2);   // after step 3: the stage files are written, the manifest is not
  const v1::Job job = c.Run(5, /*max_restarts=*/2);
  EXPECT_EQ(job.state(), v1::SUCCEEDED) << job.reason();
  EXPECT_EQ(job.restarts(), 0);
  EXPECT_EQ(job.steps_done(), 5);
  EXPECT_EQ(job.steps_redone(), 0);
  EXPECT_EQ(job.checkpoint_step(), 4);
  EXPECT_EQ(job.checkpoint_failures(), 2);
  EXPECT_THAT(job.last_checkpoint_failure(), HasSubstr("checkpoint after step 3 not stored ("));
  EXPECT_THAT(job.last_checkpoint_failure(), HasSubstr("manifest.json"));
  EXPECT_THAT(job.last_checkpoint_failure(),
              HasSubstr("the job trains on, its latest checkpoint after step 1"));
  EXPECT_EQ(c.store->CompleteSteps("job-1"), (std::vector<int64_t>{3, 4}));
  // What the refused checkpoint wrote is gone at once (its stage files, on a full disk).
  EXPECT_FALSE(std::filesystem::exists(c.store->Dir("job-1", 2)));
  const std::vector<v1::JobEvent> warnings = c.Warnings(job.id());
  ASSERT_EQ(warnings.size(), 2u);
  EXPECT_THAT(warnings[0].reason(), HasSubstr("checkpoint after step 2 not stored ("));
  EXPECT_THAT(warnings[0].reason(), HasSubstr("its latest checkpoint after step 1"));
  EXPECT_EQ(warnings[1].reason(), job.last_checkpoint_failure());
  // The worker's stream is read to its end, not cancelled, so that its call has ended before the
  // next step's reaches it.
  for (FakeWorker* w : c.f.factory.made) {
    EXPECT_EQ(w->checkpoints.load(), 5);
    EXPECT_EQ(w->checkpoint_chunks_taken.load(), 3 * 5);
  }
}

// A checkpoint the disk has no room for is refused before any of it is written (and counted as
// the coordinator's storage failing, not the gang's), with what it needed and what was free.
TEST(JobRunnerTest, ACheckpointTheDiskHasNoRoomForIsRefusedBeforeItIsWritten) {
  std::atomic<int> asked{0};
  // Each checkpoint asks once per stage file: the second checkpoint finds the disk full.
  CheckpointRun c({.free_bytes = [&](const std::string&) -> absl::StatusOr<int64_t> {
    const int n = asked++;
    return n == 2 || n == 3 ? int64_t{1} << 20 : int64_t{1} << 40;
  }});
  const v1::Job job = c.Run(4, /*max_restarts=*/2);
  EXPECT_EQ(job.state(), v1::SUCCEEDED) << job.reason();
  EXPECT_EQ(job.restarts(), 0);
  EXPECT_EQ(job.checkpoint_failures(), 1);
  EXPECT_THAT(job.last_checkpoint_failure(), HasSubstr("checkpoint after step 2 not stored ("));
  EXPECT_THAT(job.last_checkpoint_failure(),
              HasSubstr(" and the disk has 1.0 MiB free, and keeps 64.0 MiB"));
  EXPECT_THAT(job.last_checkpoint_failure(), HasSubstr("--checkpoint-min-free-mb"));
  EXPECT_EQ(asked.load(), 8);
  EXPECT_EQ(c.store->CompleteSteps("job-1"), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(c.store->promised_bytes(), 0);
  for (FakeWorker* w : c.f.factory.made) EXPECT_EQ(w->checkpoint_chunks_taken.load(), 3 * 4);
}

// The final checkpoint holds what the job trained: where the coordinator cannot store it, it is
// tried again, and then the job fails at once (a restart would train the same steps again into
// the same disk), saying what was lost and how to resume from the latest checkpoint.
TEST(JobRunnerTest, AFinalCheckpointTheCoordinatorCannotStoreFailsTheJobWithoutRestarts) {
  CheckpointRun c;
  c.BlockDirectory(2);
  const v1::Job job = c.Run(3, /*max_restarts=*/2);
  EXPECT_EQ(job.state(), v1::FAILED);
  EXPECT_EQ(job.restarts(), 0);
  EXPECT_THAT(job.reason(),
              HasSubstr("the final checkpoint (after step 3) was not stored after 3 tries ("));
  EXPECT_THAT(job.reason(), HasSubstr("the trained state is lost with the run"));
  EXPECT_THAT(job.reason(), HasSubstr("its latest checkpoint is after step 2"));
  EXPECT_THAT(job.reason(), HasSubstr("init.from_job: job-1"));
  EXPECT_EQ(job.checkpoint_step(), 1);
  EXPECT_EQ(job.checkpoint_failures(), 1);
  for (FakeWorker* w : c.f.factory.made)
    EXPECT_EQ(w->checkpoints.load(), 2 + kFinalCheckpointTries);
}

// A worker whose checkpoint stream breaks is the gang's fault, as a failed step is: the run ends
// and the job restarts from its latest checkpoint; nothing is counted as a storage failure.
TEST(JobRunnerTest, ACheckpointStreamThatBreaksIsAFaultAndRestartsTheJob) {
  CheckpointRun c;
  c.f.factory.configure = [](FakeWorker* w) {
    if (w->rank_ == 1) w->checkpoint_error = absl::UnavailableError("stream reset");
  };
  const v1::Job job = c.Run(3, /*max_restarts=*/1);
  EXPECT_EQ(job.state(), v1::QUEUED) << job.reason();
  EXPECT_EQ(job.restarts(), 1);
  EXPECT_THAT(job.first_failure(), HasSubstr("stream reset"));
  EXPECT_THAT(job.reason(), HasSubstr("resumes from the start (no checkpoint yet)"));
  EXPECT_EQ(job.checkpoint_failures(), 0);
  EXPECT_TRUE(c.store->CompleteSteps("job-1").empty());
  EXPECT_FALSE(std::filesystem::exists(c.store->Dir("job-1", 0)));
}

}  // namespace
}  // namespace tandem::coordinator
