// Planning a job's run (JobPlanner, through the job runner on fake workers): the profiled
// partition, the profile cache, the auto plan, and a profile that fails.
#include "coordinator/job_planning.h"

#include <mutex>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/model_desc.h"
#include "common/pipeline_plan.h"
#include "coordinator/model_profiler.h"
#include "coordinator/profile_store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/coordinator/runner_fixture.h"

namespace tandem::coordinator {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;

// A 2-stage job with partition: profile over 4 blocks of 1 ms and a head of 10 ms, as `f`'s
// fake workers time them: the uniform cut [0, 3) | [3, 6) would run 3 | 12.
v1::JobSpec HeadHeavyProfiledJob(RunnerFixture& f) {
  f.factory.configure = [](FakeWorker* w) {
    w->layer_seconds = [](int g) { return g == 5 ? 0.010 : 0.001; };
  };
  v1::JobSpec spec = JobSpecOf(2, 2);
  spec.mutable_model()->set_n_layer(4);
  spec.mutable_pipeline()->set_partition("profile");
  return spec;
}

// partition: profile: the runner profiles on both workers at once (the embedding, one block
// and the head: blocks cost the same), cuts at the exact min-max of the measured times, records
// the predicted per-stage times, and caches the profile, so that the next job of the same shape
// on the same kind of worker is planned without profiling.
TEST(JobRunnerTest, ProfilePartitionBalancesMeasuredTimeAndCachesTheProfile) {
  RunnerFixture f;
  ProfileStore profiles("");
  f.env.profiles = &profiles;
  const v1::JobSpec spec = HeadHeavyProfiledJob(f);
  auto runner = f.Start(spec);
  f.WaitFinished(*runner);
  auto job = *f.store->Get(runner->job_id());
  ASSERT_EQ(job.state(), v1::SUCCEEDED) << job.reason();
  EXPECT_EQ(f.factory.made[0]->profiles.load(), kProfileRounds);
  EXPECT_EQ(f.factory.made[1]->profiles.load(), kProfileRounds);
  ASSERT_EQ(job.stages_size(), 2);
  EXPECT_EQ(job.stages(0).layer_end(), 5);  // embedding + 4 blocks | head
  EXPECT_NEAR(job.stages(0).predicted_seconds(), 0.005, 1e-9);
  EXPECT_NEAR(job.stages(1).predicted_seconds(), 0.010, 1e-9);
  EXPECT_GT(job.predicted_step_seconds(), 0.0);
  EXPECT_EQ(f.factory.made[0]->program_.chunks(0).layer_end(), 5);
  ASSERT_TRUE(profiles.Find(ProfileKey(spec, "cpu", 1, "")).has_value());
  // The link between the job's two workers was timed at 4 KiB, the embedding's output (10 B
  // in the fake) and 4 x that, under the job's prefix, and fitted.
  const v1::LinkProfile link = profiles.Find(ProfileKey(spec, "cpu", 1, ""))->link();
  const std::vector<WorkerRecord> workers = f.registry.List();
  EXPECT_EQ(link.worker_a(), workers[0].id);
  EXPECT_EQ(link.worker_b(), workers[1].id);
  EXPECT_NEAR(link.latency_seconds(), 20e-6, 1e-12);
  EXPECT_NEAR(link.seconds_per_byte(), 1e-9, 1e-15);
  EXPECT_EQ(link.samples_size(), 6);
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(f.factory.made[r]->probe_requests.size(), 1u) << r;
    const v1::ProbeLinkRequest& req = f.factory.made[r]->probe_requests[0];
    EXPECT_EQ(req.rank(), r);
    EXPECT_EQ(req.rendezvous_prefix(), absl::StrCat(runner->job_id(), "/link-probe/"));
    EXPECT_THAT(req.sizes(), ::testing::ElementsAre(4096, 10, 40));
    EXPECT_EQ(req.repeats(), kLinkProbeRepeats);
  }

  // The same shape again: planned from the cache.
  auto again = f.Start(spec);
  f.WaitFinished(*again);
  ASSERT_EQ(f.store->Get(again->job_id())->state(), v1::SUCCEEDED);
  for (size_t i = 2; i < f.factory.made.size(); ++i) {
    EXPECT_EQ(f.factory.made[i]->profiles.load(), 0) << i;
  }
  // Without a profile a uniform job still gets the cached one's predictions.
  v1::JobSpec uniform = spec;
  uniform.mutable_pipeline()->set_partition("uniform");
  auto third = f.Start(uniform);
  f.WaitFinished(*third);
  auto u = *f.store->Get(third->job_id());
  ASSERT_EQ(u.state(), v1::SUCCEEDED) << u.reason();
  EXPECT_EQ(u.stages(0).layer_end(), 3);
  EXPECT_NEAR(u.stages(1).predicted_seconds(), 0.012, 1e-9);
}

// A cached profile past the coordinator's max age does not plan the next job: that job
// measures the layers again on its workers, cuts by the new times, and caches them, and the
// job after it (within the max age) is planned from the new profile without profiling.
TEST(JobRunnerTest, AProfilePastTheMaxAgeIsMeasuredAgainByTheNextJob) {
  RunnerFixture f;
  ProfileStore profiles("", absl::Minutes(10));
  f.env.profiles = &profiles;
  const v1::JobSpec spec = HeadHeavyProfiledJob(f);
  // An hour old, measured when every layer cost the same (its cut would be the uniform one).
  v1::ModelProfile old;
  old.set_key(ProfileKey(spec, "cpu", 1, ""));
  old.set_device("cpu");
  old.set_threads(1);
  old.set_created_unix_ms(absl::ToUnixMillis(absl::Now() - absl::Hours(1)));
  for (int g = 0; g < 6; ++g) {
    v1::LayerProfile* l = old.add_layers();
    l->set_layer(g);
    l->set_forward_seconds(0.001);
    l->set_backward_seconds(0.002);
  }
  ASSERT_TRUE(profiles.Put(old).ok());

  auto runner = f.Start(spec);
  f.WaitFinished(*runner);
  auto job = *f.store->Get(runner->job_id());
  ASSERT_EQ(job.state(), v1::SUCCEEDED) << job.reason();
  EXPECT_EQ(f.factory.made[0]->profiles.load(), kProfileRounds);
  EXPECT_EQ(f.factory.made[1]->profiles.load(), kProfileRounds);
  ASSERT_EQ(job.stages_size(), 2);
  EXPECT_EQ(job.stages(0).layer_end(), 5);  // the new times: embedding + 4 blocks | head
  const std::optional<v1::ModelProfile> fresh = profiles.Find(old.key());
  ASSERT_TRUE(fresh.has_value());
  EXPECT_GT(fresh->created_unix_ms(), old.created_unix_ms());

  auto again = f.Start(spec);
  f.WaitFinished(*again);
  ASSERT_EQ(f.store->Get(again->job_id())->state(), v1::SUCCEEDED);
  for (size_t i = 2; i < f.factory.made.size(); ++i) {
    EXPECT_EQ(f.factory.made[i]->profiles.load(), 0) << i;
  }
}

// HeadHeavyProfiledJob's profile as its fake workers would have timed it `age` ago on a
// machine `slower` times as slow as now.
v1::ModelProfile OldProfile(const v1::JobSpec& spec, absl::Duration age, double slower) {
  v1::ModelProfile p;
  p.set_key(ProfileKey(spec, "cpu", 1, ""));
  p.set_device("cpu");
  p.set_threads(1);
  p.set_created_unix_ms(absl::ToUnixMillis(absl::Now() - age));
  for (int g = 0; g < 6; ++g) {
    const double s = (g == 5 ? 0.010 : 0.001) * slower;
    v1::LayerProfile* l = p.add_layers();
    l->set_layer(g);
    l->set_forward_seconds(s / 3);
    l->set_backward_seconds(2 * s / 3);
  }
  return p;
}

// The ProfileLayers requests worker `w` of `f` got.
std::vector<v1::ProfileLayersRequest> ProfileRequests(RunnerFixture& f, size_t w) {
  std::lock_guard<std::mutex> lock(f.factory.made[w]->profile_mu);
  return f.factory.made[w]->profile_requests;
}

// A runner fixture with a profile cache and HeadHeavyProfiledJob's spec (the speed-check
// tests).
struct CachedProfileFixture {
  CachedProfileFixture() : spec(HeadHeavyProfiledJob(f)) { f.env.profiles = &profiles; }
  // Runs `spec` to its end: the job as it ended.
  v1::Job Run() {
    auto runner = f.Start(spec);
    f.WaitFinished(*runner);
    return *f.store->Get(runner->job_id());
  }

  RunnerFixture f;
  ProfileStore profiles{""};
  const v1::JobSpec spec;
};

// A cached profile past the speed-check age is checked before it prices the job: the profiled
// layers (embedding, a block, the head) have their forward and backward timed three times on
// both workers at once, in rounds as a profile is. Measured when the machine ran 10% slower, the
// job is priced at the speed now (its stages' predicted times those of the workers now); the cut
// stands (a uniform factor moves no cut), the cache keeps the profile as it was measured, and
// the job records the ratio.
TEST(JobRunnerTest, AnOldProfileIsPricedAtTheSpeedItsSpeedCheckMeasures) {
  CachedProfileFixture c;
  RunnerFixture& f = c.f;
  const v1::JobSpec& spec = c.spec;
  const v1::ModelProfile old = OldProfile(spec, absl::Minutes(5), 1.1);
  ASSERT_TRUE(c.profiles.Put(old).ok());
  const v1::Job job = c.Run();
  ASSERT_EQ(job.state(), v1::SUCCEEDED) << job.reason();
  for (size_t w = 0; w < 2; ++w) {
    // Two rounds, which agree (the fake's times are exact).
    const std::vector<v1::ProfileLayersRequest> requests = ProfileRequests(f, w);
    ASSERT_EQ(requests.size(), static_cast<size_t>(kProfileRounds)) << w;
    for (const v1::ProfileLayersRequest& r : requests) {
      EXPECT_THAT(r.layers(), ::testing::ElementsAre(0, 1, 5));
      EXPECT_EQ(r.repeats(), kSpeedCheckRepeats);
      EXPECT_TRUE(r.forward_backward_only());
    }
  }
  EXPECT_NEAR(job.profile_speed_ratio(), 1 / 1.1, 1e-9);
  ASSERT_EQ(job.stages_size(), 2);
  EXPECT_EQ(job.stages(0).layer_end(), 5);
  EXPECT_NEAR(job.stages(0).predicted_seconds(), 0.005, 1e-9);
  EXPECT_NEAR(job.stages(1).predicted_seconds(), 0.010, 1e-9);
  const std::optional<v1::ModelProfile> kept = c.profiles.Find(old.key());
  ASSERT_TRUE(kept.has_value());
  EXPECT_EQ(kept->created_unix_ms(), old.created_unix_ms());
  EXPECT_DOUBLE_EQ(kept->layers(5).forward_seconds(), old.layers(5).forward_seconds());
}

// The kinds drift apart: profiled when the head ran 10% slower than now and the blocks and
// the embedding as fast as now. The model's ratio weighs each kind by its share (16 ms of
// forward + backward then, 15 ms now: x0.9375, where a block alone would say x1.0), and prices
// every layer with it: the cut stays where the profile put it.
TEST(JobRunnerTest, TheSpeedCheckWeighsEachLayerKindByItsShareOfTheModel) {
  CachedProfileFixture c;
  const v1::JobSpec& spec = c.spec;
  v1::ModelProfile old = OldProfile(spec, absl::Minutes(5), 1.0);
  v1::LayerProfile* head = old.mutable_layers(5);
  head->set_forward_seconds(head->forward_seconds() * 1.1);
  head->set_backward_seconds(head->backward_seconds() * 1.1);
  ASSERT_TRUE(c.profiles.Put(old).ok());
  const v1::Job job = c.Run();
  ASSERT_EQ(job.state(), v1::SUCCEEDED) << job.reason();
  EXPECT_NEAR(job.profile_speed_ratio(), 0.015 / 0.016, 1e-9);
  ASSERT_EQ(job.stages_size(), 2);
  EXPECT_EQ(job.stages(0).layer_end(), 5);
  EXPECT_NEAR(job.stages(0).predicted_seconds(), 0.005 * 0.9375, 1e-9);
  EXPECT_NEAR(job.stages(1).predicted_seconds(), 0.011 * 0.9375, 1e-9);
}

// Within the check's noise (1% here) the profile prices the job as it is; the ratio is still
// recorded. A profile younger than the check's age is not checked at all.
TEST(JobRunnerTest, AProfileWithinTheSpeedChecksNoiseStandsAndAYoungOneIsNotChecked) {
  CachedProfileFixture c;
  RunnerFixture& f = c.f;
  const v1::JobSpec& spec = c.spec;
  ASSERT_TRUE(c.profiles.Put(OldProfile(spec, absl::Minutes(5), 1.01)).ok());
  const v1::Job job = c.Run();
  ASSERT_EQ(job.state(), v1::SUCCEEDED) << job.reason();
  EXPECT_EQ(f.factory.made[0]->profiles.load(), kProfileRounds);
  EXPECT_NEAR(job.profile_speed_ratio(), 1 / 1.01, 1e-9);
  EXPECT_NEAR(job.stages(1).predicted_seconds(), 0.0101, 1e-9);

  ASSERT_TRUE(c.profiles.Put(OldProfile(spec, absl::Seconds(10), 1.1)).ok());
  const v1::Job y = c.Run();
  ASSERT_EQ(y.state(), v1::SUCCEEDED) << y.reason();
  EXPECT_EQ(f.factory.made[2]->profiles.load(), 0);
  EXPECT_EQ(y.profile_speed_ratio(), 0);
  EXPECT_NEAR(y.stages(1).predicted_seconds(), 0.011, 1e-9);
}

// A kind off by more than 25% (the machine changed, not drifted): the profile is measured again,
// and cut and priced by the new times.
TEST(JobRunnerTest, AProfileFarOffItsSpeedCheckIsMeasuredAgain) {
  CachedProfileFixture c;
  RunnerFixture& f = c.f;
  const v1::JobSpec& spec = c.spec;
  v1::ModelProfile old = OldProfile(spec, absl::Hours(1), 2.0);
  // Measured on other hardware: the head as cheap as a block, so the old cut is the uniform one.
  old.mutable_layers(5)->set_forward_seconds(old.layers(1).forward_seconds());
  old.mutable_layers(5)->set_backward_seconds(old.layers(1).backward_seconds());
  ASSERT_TRUE(c.profiles.Put(old).ok());
  const v1::Job job = c.Run();
  ASSERT_EQ(job.state(), v1::SUCCEEDED) << job.reason();
  EXPECT_EQ(f.factory.made[0]->profiles.load(), 2 * kProfileRounds);
  // The model's ratio (15 ms now against 12 ms then) is at the edge; the head's (x5) and the
  // blocks' (x0.5) are far beyond it.
  EXPECT_NEAR(job.profile_speed_ratio(), 0.015 / 0.012, 1e-9);
  EXPECT_EQ(job.stages(0).layer_end(), 5);  // the new times: embedding + 4 blocks | head
  EXPECT_NEAR(job.stages(1).predicted_seconds(), 0.010, 1e-9);
  const std::optional<v1::ModelProfile> fresh = c.profiles.Find(old.key());
  ASSERT_TRUE(fresh.has_value());
  EXPECT_GT(fresh->created_unix_ms(), old.created_unix_ms());
}

// A speed check that fails (the worker cannot time the layer) leaves the profile as it is:
// the job is priced on it and runs.
TEST(JobRunnerTest, AFailedSpeedCheckPricesTheJobOnTheProfileAsItIs) {
  CachedProfileFixture c;
  RunnerFixture& f = c.f;
  const v1::JobSpec& spec = c.spec;
  f.factory.configure = [](FakeWorker* w) { w->profile_error = absl::UnavailableError("busy"); };
  ASSERT_TRUE(c.profiles.Put(OldProfile(spec, absl::Minutes(5), 1.1)).ok());
  const v1::Job job = c.Run();
  ASSERT_EQ(job.state(), v1::SUCCEEDED) << job.reason();
  EXPECT_EQ(f.factory.made[0]->profiles.load(), 1);
  EXPECT_EQ(job.profile_speed_ratio(), 0);
  EXPECT_NEAR(job.stages(1).predicted_seconds(), 0.011, 1e-9);
}

// Past the max age a job that does not cut by the profile (uniform) measures no new one: it is
// priced on the expired profile after its speed check, which scales it to the speed now; the
// cache keeps the old profile. Without speed checks it goes without a prediction.
TEST(JobRunnerTest, AUniformJobIsPricedOnAnExpiredProfileAfterItsSpeedCheck) {
  RunnerFixture f;
  ProfileStore profiles("", absl::Minutes(10));
  f.env.profiles = &profiles;
  v1::JobSpec spec = HeadHeavyProfiledJob(f);
  spec.mutable_pipeline()->set_partition("uniform");
  const v1::ModelProfile old = OldProfile(spec, absl::Hours(1), 1.1);
  ASSERT_TRUE(profiles.Put(old).ok());
  ASSERT_FALSE(profiles.Find(old.key()).has_value());

  auto runner = f.Start(spec);
  f.WaitFinished(*runner);
  const v1::Job job = *f.store->Get(runner->job_id());
  ASSERT_EQ(job.state(), v1::SUCCEEDED) << job.reason();
  for (size_t w = 0; w < 2; ++w) {
    const std::vector<v1::ProfileLayersRequest> requests = ProfileRequests(f, w);
    ASSERT_EQ(requests.size(), static_cast<size_t>(kProfileRounds)) << w;
    for (const v1::ProfileLayersRequest& r : requests) {
      EXPECT_TRUE(r.forward_backward_only()) << "a speed check, not a profile";
    }
  }
  EXPECT_NEAR(job.profile_speed_ratio(), 1 / 1.1, 1e-9);
  ASSERT_EQ(job.stages_size(), 2);
  EXPECT_EQ(job.stages(0).layer_end(), 3);  // the uniform cut
  EXPECT_NEAR(job.stages(0).predicted_seconds(), 0.003, 1e-9);
  EXPECT_NEAR(job.stages(1).predicted_seconds(), 0.012, 1e-9);
  EXPECT_GT(job.predicted_step_seconds(), 0.0);
  const std::optional<v1::ModelProfile> kept = profiles.FindAnyAge(old.key());
  ASSERT_TRUE(kept.has_value());
  EXPECT_EQ(kept->created_unix_ms(), old.created_unix_ms());

  // Speed checks off: nothing to price it with, and nothing measured.
  f.env.options.profile_speed_check_after = absl::InfiniteDuration();
  auto unchecked = f.Start(spec);
  f.WaitFinished(*unchecked);
  const v1::Job u = *f.store->Get(unchecked->job_id());
  ASSERT_EQ(u.state(), v1::SUCCEEDED) << u.reason();
  EXPECT_EQ(u.predicted_step_seconds(), 0.0);
  EXPECT_EQ(u.stages(1).predicted_seconds(), 0.0);
  for (size_t w = 2; w < f.factory.made.size(); ++w) {
    EXPECT_EQ(f.factory.made[w]->profiles.load(), 0) << w;
  }
}

// pipeline.plan: auto: the runner profiles each split of the global batch on both workers,
// runs the candidate with the shortest predicted step and records the choice.
TEST(JobRunnerTest, AutoPlanRunsThePlannersChoiceAtTheSameGlobalBatch) {
  RunnerFixture f;
  ProfileStore profiles("");
  f.env.profiles = &profiles;
  // Cost proportional to the micro-batch, with a small fixed part: finer splits win.
  f.factory.configure = [](FakeWorker* w) {
    w->layer_seconds_by_size = [](int, int size) { return 0.0001 + 0.001 * size; };
  };
  v1::JobSpec spec = JobSpecOf(2, 2);
  spec.mutable_pipeline()->set_micro_batch_size(4);
  spec.mutable_pipeline()->set_micro_batches(2);  // 8 sequences
  spec.mutable_pipeline()->set_plan("auto");
  auto runner = f.Start(spec);
  f.WaitFinished(*runner);
  auto job = *f.store->Get(runner->job_id());
  ASSERT_EQ(job.state(), v1::SUCCEEDED) << job.reason();
  // One profile per split (M = 2, 4, 8: M >= P), each on both workers at once (its rounds),
  // all cached.
  EXPECT_EQ(f.factory.made[0]->profiles.load(), 3 * kProfileRounds);
  EXPECT_EQ(f.factory.made[1]->profiles.load(), 3 * kProfileRounds);
  const v1::PipelineSpec& p = job.spec().pipeline();
  EXPECT_EQ(p.plan(), "auto");
  // The same global batch on the same two workers: a finer split than written, or two
  // replicas (no bubble; the fake's link makes the reduction cheap) shrinks the step.
  EXPECT_EQ(p.replicas() * p.micro_batch_size() * p.micro_batches(), 8);
  EXPECT_EQ(p.stages() * p.replicas(), 2);
  EXPECT_TRUE(p.micro_batches() > 2 || p.replicas() == 2) << job.plan();
  EXPECT_THAT(job.plan(), HasSubstr(absl::StrCat(p.micro_batches(), " micro-batch")));
  EXPECT_THAT(job.plan(), HasSubstr("stages x replicas, each at its best: "));
  EXPECT_THAT(job.plan(), HasSubstr("the spec as written"));
  EXPECT_EQ(job.effective_batch(), 8);
  EXPECT_EQ(f.factory.made[0]->program_.micro_batches(), p.micro_batches());
  EXPECT_EQ(f.factory.made[0]->program_.spec().pipeline().micro_batch_size(), p.micro_batch_size());
  EXPECT_EQ(f.factory.made[0]->program_.spec().pipeline().schedule(), p.schedule());
}

// pipeline.plan: auto on cached profiles past the speed-check age: one check for the plan (on
// the first profile it prices), whose verdict prices every split; none is measured again.
TEST(JobRunnerTest, AutoPlanChecksItsCachedProfilesSpeedOnce) {
  RunnerFixture f;
  ProfileStore profiles("");
  f.env.profiles = &profiles;
  const auto seconds = [](int, int size) { return 0.0001 + 0.001 * size; };
  f.factory.configure = [seconds](FakeWorker* w) { w->layer_seconds_by_size = seconds; };
  v1::JobSpec spec = JobSpecOf(2, 2);
  spec.mutable_pipeline()->set_micro_batch_size(4);
  spec.mutable_pipeline()->set_micro_batches(2);  // 8 sequences: micro-batches of 4, 2 or 1
  spec.mutable_pipeline()->set_plan("auto");
  for (const int size : {1, 2, 4}) {
    v1::JobSpec at = spec;
    at.mutable_pipeline()->set_micro_batch_size(size);
    v1::ModelProfile p;
    p.set_key(ProfileKey(at, "cpu", 1, ""));
    p.set_device("cpu");
    p.set_threads(1);
    p.set_created_unix_ms(absl::ToUnixMillis(absl::Now() - absl::Minutes(5)));
    for (int g = 0; g < NumLayers(spec.model()); ++g) {
      v1::LayerProfile* l = p.add_layers();
      l->set_layer(g);
      l->set_forward_seconds(1.1 * seconds(g, size) / 3);
      l->set_backward_seconds(1.1 * 2 * seconds(g, size) / 3);
    }
    ASSERT_TRUE(profiles.Put(p).ok());
  }
  auto runner = f.Start(spec);
  f.WaitFinished(*runner);
  auto job = *f.store->Get(runner->job_id());
  ASSERT_EQ(job.state(), v1::SUCCEEDED) << job.reason();
  EXPECT_EQ(f.factory.made[0]->profiles.load(), kProfileRounds);
  EXPECT_EQ(f.factory.made[1]->profiles.load(), kProfileRounds);
  EXPECT_NEAR(job.profile_speed_ratio(), 1 / 1.1, 1e-9);
  EXPECT_EQ(job.spec().pipeline().plan(), "auto");
}

// A worker that cannot profile fails the job with a reason naming it.
TEST(JobRunnerTest, ProfileFailureFailsTheJobNamingTheWorker) {
  RunnerFixture f;
  f.factory.configure = [](FakeWorker* w) { w->profile_error = absl::UnavailableError("gone"); };
  v1::JobSpec spec = JobSpecOf(2, 2);
  spec.mutable_pipeline()->set_partition("profile");
  auto runner = f.Start(spec);
  f.WaitFinished(*runner);
  auto job = *f.store->Get(runner->job_id());
  EXPECT_EQ(job.state(), v1::FAILED);
  EXPECT_THAT(job.reason(), HasSubstr("profiling on worker"));
  EXPECT_THAT(job.reason(), HasSubstr("gone"));
}

}  // namespace
}  // namespace tandem::coordinator
