// Unit tests of the coordinator's domain components, with a fake worker client in place of
// the network.
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "common/pipeline_plan.h"
#include "common/spec.h"
#include "coordinator/checkpoint_store.h"
#include "coordinator/hf_export.h"
#include "coordinator/job_runner.h"
#include "coordinator/job_store.h"
#include "coordinator/model_profiler.h"
#include "coordinator/profile_store.h"
#include "coordinator/rendezvous_store.h"
#include "coordinator/scheduler.h"
#include "coordinator/worker_registry.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem::coordinator {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;

v1::RegisterRequest Worker(const std::string& address, const std::string& device = "cpu") {
  v1::RegisterRequest r;
  r.set_address(address);
  r.set_device(device);
  r.set_threads(1);
  return r;
}

TEST(WorkerRegistryTest, GangAllocationIsAllOrNothing) {
  WorkerRegistry registry(1000ms);
  ASSERT_TRUE(registry.Register(Worker("a:1")).ok());
  ASSERT_TRUE(registry.Register(Worker("b:1")).ok());
  ASSERT_TRUE(registry.Register(Worker("c:1", "cuda:0")).ok());
  EXPECT_FALSE(registry.Allocate("cpu", 3, "job-1").ok());
  for (const auto& w : registry.List()) EXPECT_EQ(w.state, v1::IDLE);
  EXPECT_EQ(registry.AvailabilityText("cpu", 3),
            "waiting for 3 idle cpu workers: 2 registered and alive, 2 idle");
  auto gang = registry.Allocate("cpu", 2, "job-1");
  ASSERT_TRUE(gang.ok());
  EXPECT_EQ((*gang)[0].address, "a:1");
  EXPECT_EQ((*gang)[1].stage, 1);
  EXPECT_FALSE(registry.Allocate("cpu", 1, "job-2").ok());
  registry.Release("job-1");
  EXPECT_TRUE(registry.Allocate("cpu", 1, "job-2").ok());
}

TEST(WorkerRegistryTest, BadRegistrationIsRefused) {
  WorkerRegistry registry(1000ms);
  EXPECT_EQ(registry.Register(Worker("")).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(registry.Register(Worker("a:1", "tpu")).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(registry.Heartbeat("w-99").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(registry.Heartbeat("garbage").code(), absl::StatusCode::kNotFound);
}

TEST(WorkerRegistryTest, SilentWorkersAreLostAndBusyOnesReported) {
  WorkerRegistry registry(50ms);
  auto a = registry.Register(Worker("a:1"));
  auto b = registry.Register(Worker("b:1"));
  ASSERT_TRUE(registry.Allocate("cpu", 1, "job-1").ok());
  std::this_thread::sleep_for(80ms);
  ASSERT_TRUE(registry.Heartbeat(*b).ok());
  auto lost = registry.SweepLost();
  ASSERT_EQ(lost.size(), 1u);
  EXPECT_EQ(lost[0].id, *a);
  EXPECT_EQ(lost[0].job_id, "job-1");
  EXPECT_EQ(registry.Get(*a)->state, v1::LOST);
  EXPECT_EQ(registry.Get(*b)->state, v1::IDLE);
}

// After a coordinator restart a worker may heartbeat with the id the old coordinator gave it
// before it learns it must register again: the new one must not take it for the worker it
// gave that id to.
TEST(WorkerRegistryTest, IdsOfTheLastStartAreRefusedAfterARestart) {
  EXPECT_EQ(FirstWorkerId(0), 1);
  EXPECT_EQ(FirstWorkerId(1), 1);
  EXPECT_EQ(FirstWorkerId(3), 2000001);
  WorkerRegistry before(1000ms, FirstWorkerId(1));
  EXPECT_EQ(*before.Register(Worker("a:1")), "w-1");
  WorkerRegistry after(1000ms, FirstWorkerId(2));
  EXPECT_EQ(*after.Register(Worker("b:1")), "w-1000001");
  EXPECT_EQ(after.Heartbeat("w-1").code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(after.Heartbeat("w-1000001").ok());
}

v1::JobSpec Spec(int stages, int steps, int max_restarts = 0) {
  auto spec =
      LoadJobSpecYaml(absl::StrCat("steps: ", steps, "\nmax_restarts: ", max_restarts,
                                   "\npipeline:\n  stages: ", stages, "\n  micro_batches: 4\n"));
  EXPECT_TRUE(spec.ok()) << spec.status();
  return *spec;
}

TEST(JobStoreTest, StatesAreFinalAndPersisted) {
  char dir_template[] = "/tmp/tandem-store-XXXXXX";
  const std::string dir = mkdtemp(dir_template);
  std::string running_id, done_id, queued_id;
  {
    auto store = JobStore::Open(dir);
    ASSERT_TRUE(store.ok()) << store.status();
    running_id = *(*store)->Add(Spec(2, 5));
    done_id = *(*store)->Add(Spec(2, 5));
    queued_id = *(*store)->Add(Spec(2, 5));
    ASSERT_TRUE((*store)->Transition(running_id, v1::RUNNING, "").ok());
    ASSERT_TRUE((*store)->Transition(done_id, v1::RUNNING, "").ok());
    ASSERT_TRUE((*store)->Transition(done_id, v1::SUCCEEDED, "").ok());
    EXPECT_EQ((*store)->Transition(done_id, v1::FAILED, "x").code(),
              absl::StatusCode::kFailedPrecondition);
    EXPECT_EQ((*store)->Queued(), std::vector<std::string>{queued_id});
  }
  // Reopen: finished history kept, queued stays queued, running was interrupted and is queued
  // again (job_store_test.cc has the details).
  auto store = JobStore::Open(dir);
  ASSERT_TRUE(store.ok());
  EXPECT_EQ((*store)->Get(done_id)->state(), v1::SUCCEEDED);
  EXPECT_EQ((*store)->Get(queued_id)->state(), v1::QUEUED);
  EXPECT_EQ((*store)->Get(running_id)->state(), v1::QUEUED);
  EXPECT_THAT((*store)->Get(running_id)->reason(), HasSubstr("restarted"));
  auto next = (*store)->Add(Spec(1, 1));
  EXPECT_EQ(*next, "job-4");
  std::filesystem::remove_all(dir);
}

TEST(JobStoreTest, WatchersSeeEveryEventInOrder) {
  auto store = *JobStore::Open("");
  const std::string id = *store->Add(Spec(1, 3));
  std::vector<v1::JobEvent> seen;
  std::thread watcher([&] {
    int64_t cursor = 0;
    while (true) {
      auto batch = store->WaitEvents(id, cursor, absl::Seconds(5));
      ASSERT_TRUE(batch.ok());
      seen.insert(seen.end(), batch->events.begin(), batch->events.end());
      cursor = batch->cursor;
      if (batch->ended) return;
    }
  });
  ASSERT_TRUE(store->Transition(id, v1::RUNNING, "").ok());
  for (int s = 0; s < 3; ++s) {
    v1::StepSummary step;
    step.set_step(s);
    step.set_loss(5.0 - s);
    store->RecordStep(id, step);
  }
  ASSERT_TRUE(store->Transition(id, v1::SUCCEEDED, "").ok());
  watcher.join();
  ASSERT_EQ(seen.size(), 6u);  // QUEUED, RUNNING, 3 steps, SUCCEEDED
  EXPECT_EQ(seen[0].state(), v1::QUEUED);
  EXPECT_EQ(seen[2].step().step(), 0);
  EXPECT_EQ(seen[4].step().loss(), 3.0);
  EXPECT_EQ(seen[5].state(), v1::SUCCEEDED);
  EXPECT_EQ(store->Get(id)->steps_done(), 3);
  EXPECT_EQ(store->Get("job-77").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store->Get("nonsense").status().code(), absl::StatusCode::kNotFound);
}

TEST(RendezvousStoreTest, GetWaitsForKeysAndNamesTheMissing) {
  RendezvousStore kv;
  std::thread setter([&] {
    std::this_thread::sleep_for(30ms);
    ASSERT_TRUE(kv.Set("job-1/a", "1").ok());
  });
  auto got = kv.Get({"job-1/a"}, absl::Seconds(5));
  setter.join();
  ASSERT_TRUE(got.ok());
  EXPECT_EQ((*got)[0], "1");
  auto missing = kv.Get({"job-1/a", "job-1/b"}, absl::Milliseconds(20));
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("job-1/b"));
  EXPECT_EQ(kv.Set("", "x").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(kv.Set("k", std::string(RendezvousStore::kMaxValueBytes + 1, 'x')).code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(kv.Set("job-2/a", "2").ok());
  kv.ErasePrefix("job-1/");
  EXPECT_EQ(kv.size(), 1u);
}

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
  v1::JobSpec spec = Spec(1, 10);
  spec.mutable_eval()->set_every(4);
  std::vector<int64_t> due;
  for (int64_t s = 0; s < 10; ++s) {
    if (EvalDue(spec, s)) due.push_back(s);
  }
  EXPECT_EQ(due, (std::vector<int64_t>{3, 7, 9}));
  spec.mutable_eval()->set_every(0);
  EXPECT_FALSE(EvalDue(spec, 9));
}

// A worker that answers from memory; counts RunStep calls and can be told to fail or hang.
class FakeWorker final : public StageWorkerClient {
 public:
  explicit FakeWorker(int rank) : rank_(rank) {}
  void Configure(const v1::ConfigureRequest& request, v1::ConfigureResponse*, absl::Duration,
                 Done done) override {
    program_ = request.program();
    done(absl::OkStatus());
  }
  void RunStep(const v1::RunStepRequest& request, v1::RunStepResponse* response, absl::Duration,
               Done done) override {
    ++run_steps;
    if (request.step() == fail_at_step) {
      done(absl::InternalError("boom"));
      return;
    }
    if (request.step() == hang_at_step) {
      std::thread([this, done] {
        while (!aborted.load()) std::this_thread::sleep_for(1ms);
        done(absl::AbortedError("aborted"));
      }).detach();
      return;
    }
    v1::StepReport* rep = response->mutable_report();
    rep->set_step(request.step());
    rep->set_exec_us(100);
    rep->set_grad_norm_sq(request.step() == nan_at_step ? NAN : 4.0);  // norm 2 per stage
    rep->set_grads_finite(request.step() != nan_at_step);
    if (program_.rank() == program_.num_ranks() - 1) {
      rep->set_has_loss(true);
      rep->set_loss(5.0 / (1 + request.step()));
    }
    if (timed) {  // every action 10 us, 1 us apart, on a clock of its own
      const int64_t base = 1'700'000'000'000'000 + request.step() * 1'000'000 + rank_ * 333;
      for (int i = 0; i < program_.actions_size(); ++i) {
        v1::ActionTiming* t = rep->add_timings();
        t->set_index(i);
        t->set_start_us(base + i * 11);
        t->set_end_us(base + i * 11 + 10);
      }
    }
    done(absl::OkStatus());
  }
  void ApplyStep(const v1::ApplyStepRequest& request, v1::ApplyStepResponse*, absl::Duration,
                 Done done) override {
    applies.push_back(request);
    done(absl::OkStatus());
  }
  absl::Status SaveCheckpoint(const v1::SaveCheckpointRequest&, absl::Duration,
                              const std::function<absl::Status(const v1::TensorChunk&)>&) override {
    return absl::UnimplementedError("fake");
  }
  absl::Status Abort(const v1::AbortRequest&, absl::Duration) override {
    aborted.store(true);
    ++aborts;
    return absl::OkStatus();
  }
  absl::Status Probe(absl::Duration) override { return absl::OkStatus(); }
  // Layer g costs layer_seconds(g) forward + backward (1 ms each by default).
  absl::StatusOr<v1::ProfileLayersResponse> ProfileLayers(const v1::ProfileLayersRequest& request,
                                                          absl::Duration) override {
    ++profiles;
    if (profile_delay > absl::ZeroDuration()) absl::SleepFor(profile_delay);
    if (!profile_error.ok()) return profile_error;
    v1::ProfileLayersResponse resp;
    for (int g : request.layers()) {
      v1::LayerProfile* p = resp.add_layers();
      p->set_layer(g);
      const double s = layer_seconds_by_size
                           ? layer_seconds_by_size(g, request.spec().pipeline().micro_batch_size())
                       : layer_seconds ? layer_seconds(g)
                                       : 0.001;
      p->set_forward_seconds(s / 3);
      p->set_backward_seconds(2 * s / 3);
      p->set_backward_input_seconds(s / 3);
      p->set_backward_weight_seconds(s / 3);
      p->set_static_bytes(1000);
      p->set_activation_bytes(100);
      p->set_output_bytes(10);
    }
    return resp;
  }
  // One way = link_latency + bytes x link_seconds_per_byte, exactly.
  void ProbeLink(const v1::ProbeLinkRequest& request, v1::ProbeLinkResponse* response,
                 absl::Duration, Done done) override {
    probe_requests.push_back(request);
    if (!probe_error.ok()) {
      done(probe_error);
      return;
    }
    for (int64_t bytes : request.sizes()) {
      v1::LinkSample* s = response->add_samples();
      s->set_bytes(bytes);
      s->set_one_way_seconds(link_latency + static_cast<double>(bytes) * link_seconds_per_byte);
      s->set_rank(request.rank());
    }
    done(absl::OkStatus());
  }
  // As the gRPC client cancels its calls: a hanging step returns.
  void CancelPending() override { aborted.store(true); }

  double link_latency = 20e-6;
  double link_seconds_per_byte = 1e-9;
  absl::Status probe_error;
  std::vector<v1::ProbeLinkRequest> probe_requests;
  std::function<double(int)> layer_seconds;
  std::function<double(int, int)> layer_seconds_by_size;  // (layer, micro_batch_size)
  absl::Duration profile_delay;
  absl::Status profile_error;
  std::atomic<int> profiles{0};

  int rank_;
  v1::StageProgram program_;
  std::atomic<int> run_steps{0};
  std::atomic<int> aborts{0};
  std::atomic<bool> aborted{false};
  int64_t fail_at_step = -1;
  int64_t hang_at_step = -1;
  int64_t nan_at_step = -1;
  bool timed = false;  // report per-action timings
  std::vector<v1::ApplyStepRequest> applies;
};

class FakeFactory final : public StageWorkerClientFactory {
 public:
  std::unique_ptr<StageWorkerClient> Connect(const std::string& address) override {
    auto w = std::make_unique<FakeWorker>(static_cast<int>(made.size()));
    FakeWorker* raw = w.get();
    if (configure) configure(raw);
    made.push_back(raw);
    return w;
  }
  std::function<void(FakeWorker*)> configure;
  std::vector<FakeWorker*> made;
};

struct RunnerFixture {
  RunnerFixture() : registry(10s) {
    store = *JobStore::Open("");
    env.store = store.get();
    env.registry = &registry;
    env.clients = &factory;
    env.options.abort_timeout = absl::Seconds(1);
  }
  std::unique_ptr<JobRunner> Start(const v1::JobSpec& spec) {
    const std::string id = *store->Add(spec);
    for (int i = 0; i < spec.pipeline().stages(); ++i) {
      (void)registry.Register(Worker(absl::StrCat("127.0.0.1:", 1000 + i)));
    }
    auto gang = registry.Allocate("cpu", spec.pipeline().stages(), id);
    EXPECT_TRUE(gang.ok());
    workers = *gang;
    auto runner = std::make_unique<JobRunner>(env, *store->Get(id), *gang);
    runner->Start();
    return runner;
  }
  void WaitFinished(JobRunner& r) {
    for (int i = 0; i < 500 && !r.finished(); ++i) std::this_thread::sleep_for(10ms);
    ASSERT_TRUE(r.finished());
  }
  std::unique_ptr<JobStore> store;
  WorkerRegistry registry;
  FakeFactory factory;
  RunnerEnv env;
  std::vector<WorkerRecord> workers;  // the last gang allocated
};

TEST(JobRunnerTest, OneRunStepPerWorkerPerStepAndProgramsAreLowered) {
  RunnerFixture f;
  auto runner = f.Start(Spec(2, 5));
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
  auto runner = f.Start(Spec(2, 3));
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

// partition: profile: the runner profiles on the first worker (the embedding, one block and
// the head: blocks cost the same), cuts at the exact min-max of the measured times, records
// the predicted per-stage times, and caches the profile, so that the next job of the same shape
// on the same kind of worker is planned without profiling.
TEST(JobRunnerTest, ProfilePartitionBalancesMeasuredTimeAndCachesTheProfile) {
  RunnerFixture f;
  ProfileStore profiles("");
  f.env.profiles = &profiles;
  // 4 blocks of 1 ms and a head of 10 ms: the uniform cut [0, 3) | [3, 6) would run 3 | 12.
  f.factory.configure = [](FakeWorker* w) {
    w->layer_seconds = [](int g) { return g == 5 ? 0.010 : 0.001; };
  };
  v1::JobSpec spec = Spec(2, 2);
  spec.mutable_model()->set_n_layer(4);
  spec.mutable_pipeline()->set_partition("profile");
  auto runner = f.Start(spec);
  f.WaitFinished(*runner);
  auto job = *f.store->Get(runner->job_id());
  ASSERT_EQ(job.state(), v1::SUCCEEDED) << job.reason();
  EXPECT_EQ(f.factory.made[0]->profiles.load(), 1);
  EXPECT_EQ(f.factory.made[1]->profiles.load(), 0);
  ASSERT_EQ(job.stages_size(), 2);
  EXPECT_EQ(job.stages(0).layer_end(), 5);  // embedding + 4 blocks | head
  EXPECT_NEAR(job.stages(0).predicted_seconds(), 0.005, 1e-9);
  EXPECT_NEAR(job.stages(1).predicted_seconds(), 0.010, 1e-9);
  EXPECT_GT(job.predicted_step_seconds(), 0.0);
  EXPECT_EQ(f.factory.made[0]->program_.chunks(0).layer_end(), 5);
  ASSERT_TRUE(profiles.Find(ProfileKey(spec, "cpu", 1)).has_value());
  // The link between the job's two workers was timed at 4 KiB, the embedding's output (10 B
  // in the fake) and 4 x that, under the job's prefix, and fitted.
  const v1::LinkProfile link = profiles.Find(ProfileKey(spec, "cpu", 1))->link();
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

// pipeline.plan: auto: the runner profiles each split of the global batch on the first worker,
// runs the candidate with the shortest predicted step and records the choice.
TEST(JobRunnerTest, AutoPlanRunsThePlannersChoiceAtTheSameGlobalBatch) {
  RunnerFixture f;
  ProfileStore profiles("");
  f.env.profiles = &profiles;
  // Cost proportional to the micro-batch, with a small fixed part: finer splits win.
  f.factory.configure = [](FakeWorker* w) {
    w->layer_seconds_by_size = [](int, int size) { return 0.0001 + 0.001 * size; };
  };
  v1::JobSpec spec = Spec(2, 2);
  spec.mutable_pipeline()->set_micro_batch_size(4);
  spec.mutable_pipeline()->set_micro_batches(2);  // 8 sequences
  spec.mutable_pipeline()->set_plan("auto");
  auto runner = f.Start(spec);
  f.WaitFinished(*runner);
  auto job = *f.store->Get(runner->job_id());
  ASSERT_EQ(job.state(), v1::SUCCEEDED) << job.reason();
  // One profile per split (M = 2, 4, 8: M >= P), all on the first worker, all cached.
  EXPECT_EQ(f.factory.made[0]->profiles.load(), 3);
  EXPECT_EQ(f.factory.made[1]->profiles.load(), 0);
  const v1::PipelineSpec& p = job.spec().pipeline();
  EXPECT_EQ(p.plan(), "auto");
  EXPECT_EQ(p.micro_batch_size() * p.micro_batches(), 8);
  EXPECT_GT(p.micro_batches(), 2);  // a finer split than written shrinks the bubble
  EXPECT_THAT(job.plan(), HasSubstr(absl::StrCat(p.micro_batches(), " micro-batches of ",
                                                 p.micro_batch_size())));
  EXPECT_THAT(job.plan(), HasSubstr("the spec as written"));
  EXPECT_EQ(job.effective_batch(), 8);
  EXPECT_EQ(f.factory.made[0]->program_.micro_batches(), p.micro_batches());
  EXPECT_EQ(f.factory.made[0]->program_.spec().pipeline().micro_batch_size(), p.micro_batch_size());
  EXPECT_EQ(f.factory.made[0]->program_.spec().pipeline().schedule(), p.schedule());
}

// Regression: a job stays QUEUED while its runner profiles it; the scheduler ticking meanwhile
// must not allocate it a second time (it did, and ran the job twice on four workers).
TEST(SchedulerTest, AJobThatIsStillPlanningIsNotStartedAgain) {
  RunnerFixture f;
  f.factory.configure = [](FakeWorker* w) { w->profile_delay = absl::Milliseconds(300); };
  for (int i = 0; i < 4; ++i) {
    (void)f.registry.Register(Worker(absl::StrCat("127.0.0.1:", 2000 + i)));
  }
  Scheduler scheduler(f.env, absl::Milliseconds(10));
  scheduler.Start();
  const std::string id = *f.store->Add(Spec(2, 2));  // partition: profile, the default
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
    (void)f.registry.Register(Worker(absl::StrCat("127.0.0.1:", 2000 + i)));
  }
  Scheduler scheduler(f.env, absl::Milliseconds(10));
  scheduler.Start();
  v1::JobSpec spec = Spec(2, 4, /*max_restarts=*/1);
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

WorkerRecord Record(const std::string& id) {
  WorkerRecord w;
  w.id = id;
  w.address = "127.0.0.1:" + id;
  w.device = "cpu";
  w.threads = 1;
  return w;
}

// MeasureLink probes both ends at once with one prefix, fits the samples of both and drops
// the probe's rendezvous keys.
TEST(MeasureLinkTest, FitsBothEndsAndDropsTheKeys) {
  FakeWorker a(0), b(1);
  b.link_latency = 30e-6;  // the two ends saw different times: the fit is over both
  RendezvousStore rendezvous;
  ASSERT_TRUE(rendezvous.Set("p-1/link/0", "addr").ok());
  ASSERT_TRUE(rendezvous.Set("other/0", "addr").ok());
  auto link = MeasureLink(Record("w-1"), a, Record("w-2"), b, {4096, 65536}, 3, "p-1/link/",
                          absl::Seconds(5), &rendezvous);
  ASSERT_TRUE(link.ok()) << link.status();
  EXPECT_EQ(link->worker_a(), "w-1");
  EXPECT_EQ(link->worker_b(), "w-2");
  ASSERT_EQ(link->samples_size(), 4);
  EXPECT_EQ(link->samples(2).rank(), 1);
  EXPECT_NEAR(link->latency_seconds(), 25e-6, 1e-12);
  EXPECT_NEAR(link->seconds_per_byte(), 1e-9, 1e-15);
  ASSERT_EQ(a.probe_requests.size(), 1u);
  EXPECT_EQ(a.probe_requests[0].rank(), 0);
  EXPECT_EQ(b.probe_requests[0].rank(), 1);
  EXPECT_EQ(b.probe_requests[0].rendezvous_prefix(), "p-1/link/");
  EXPECT_EQ(b.probe_requests[0].repeats(), 3);
  EXPECT_EQ(b.probe_requests[0].timeout_ms(), 5000);
  EXPECT_EQ(b.probe_requests[0].device(), "cpu");
  EXPECT_EQ(rendezvous.size(), 1u);  // only the other prefix's key is left
}

// Two cuda workers are probed over NCCL ("cuda"), as their jobs move tensors; a pair of
// another kind, or a mixed one, over Gloo.
TEST(MeasureLinkTest, ProbesTheDataPlaneOfTheWorkersDeviceKind) {
  for (auto [da, db, want] :
       {std::tuple{"cuda:0", "cuda:1", "cuda"}, {"cuda:0", "cpu", "cpu"}, {"cpu", "cpu", "cpu"}}) {
    FakeWorker a(0), b(1);
    WorkerRecord ra = Record("w-1"), rb = Record("w-2");
    ra.device = da;
    rb.device = db;
    auto link = MeasureLink(ra, a, rb, b, {4096, 65536}, 1, "p/", absl::Seconds(5), nullptr);
    ASSERT_TRUE(link.ok()) << link.status();
    ASSERT_EQ(a.probe_requests.size(), 1u);
    EXPECT_EQ(a.probe_requests[0].device(), want) << da << " " << db;
    EXPECT_EQ(b.probe_requests[0].device(), want) << da << " " << db;
  }
}

// The worker that failed is named, rather than its peer that timed out waiting for it.
TEST(MeasureLinkTest, NamesTheCauseNotThePeerThatTimedOut) {
  FakeWorker a(0), b(1);
  a.probe_error = absl::DeadlineExceededError("peer rank 1 did not show up");
  b.probe_error = absl::UnavailableError("gone");
  auto link =
      MeasureLink(Record("w-1"), a, Record("w-2"), b, {4096}, 1, "p/", absl::Seconds(1), nullptr);
  EXPECT_EQ(link.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(link.status().message(), HasSubstr("worker w-2 at 127.0.0.1:w-2: gone"));
  b.probe_error = absl::OkStatus();
  link =
      MeasureLink(Record("w-1"), a, Record("w-2"), b, {4096}, 1, "p/", absl::Seconds(1), nullptr);
  EXPECT_EQ(link.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(link.status().message(), HasSubstr("worker w-1"));
}

TEST(MeasureLinkTest, SizesFollowTheEmbeddingsActivation) {
  v1::ModelProfile profile;
  profile.add_layers()->set_output_bytes(8 * 64 * 128 * 4);
  EXPECT_EQ(LinkProbeSizes(profile), (std::vector<int64_t>{4096, 262144, 1048576}));
  profile.mutable_layers(0)->set_output_bytes(int64_t{1} << 29);  // 4 x would pass 1 GiB
  EXPECT_EQ(LinkProbeSizes(profile), (std::vector<int64_t>{4096, 1 << 29, int64_t{1} << 30}));
  EXPECT_EQ(LinkProbeSizes(v1::ModelProfile()), (std::vector<int64_t>{4096, 4096, 16384}));
}

// ProfileModel (tandem plan) measures the link when two idle workers exist and leaves it
// empty with one; a link that fails leaves the profile without one; the workers are released.
TEST(ProfileModelTest, MeasuresTheLinkWhenTwoWorkersAreIdle) {
  WorkerRegistry registry(10s);
  FakeFactory factory;
  ProfileStore profiles("");
  RendezvousStore rendezvous;
  v1::JobSpec spec = Spec(2, 2);
  ASSERT_TRUE(registry.Register(Worker("127.0.0.1:1000")).ok());
  auto one = ProfileModel(spec, registry, factory, profiles, absl::Seconds(5), false, &rendezvous);
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_FALSE(one->has_link());
  ASSERT_TRUE(registry.Register(Worker("127.0.0.1:1001")).ok());
  auto cached = ProfileModel(spec, registry, factory, profiles, absl::Seconds(5), false);
  ASSERT_TRUE(cached.ok());
  EXPECT_FALSE(cached->has_link());  // a cached profile without a link is fine
  EXPECT_EQ(factory.made.size(), 1u);
  auto two = ProfileModel(spec, registry, factory, profiles, absl::Seconds(5), true, &rendezvous);
  ASSERT_TRUE(two.ok()) << two.status();
  ASSERT_TRUE(two->has_link());
  EXPECT_GT(two->link().latency_seconds(), 0.0);
  EXPECT_NE(two->link().worker_a(), two->link().worker_b());
  EXPECT_TRUE(profiles.Find(two->key())->has_link());
  for (const WorkerRecord& w : registry.List()) EXPECT_EQ(w.state, v1::IDLE) << w.id;

  factory.configure = [](FakeWorker* w) { w->probe_error = absl::UnimplementedError("old"); };
  auto failed = ProfileModel(spec, registry, factory, profiles, absl::Seconds(5), true);
  ASSERT_TRUE(failed.ok()) << failed.status();
  EXPECT_FALSE(failed->has_link());
  EXPECT_GT(failed->layers_size(), 0);
}

// A worker that cannot profile fails the job with a reason naming it.
TEST(JobRunnerTest, ProfileFailureFailsTheJobNamingTheWorker) {
  RunnerFixture f;
  f.factory.configure = [](FakeWorker* w) { w->profile_error = absl::UnavailableError("gone"); };
  v1::JobSpec spec = Spec(2, 2);
  spec.mutable_pipeline()->set_partition("profile");
  auto runner = f.Start(spec);
  f.WaitFinished(*runner);
  auto job = *f.store->Get(runner->job_id());
  EXPECT_EQ(job.state(), v1::FAILED);
  EXPECT_THAT(job.reason(), HasSubstr("profiling on worker"));
  EXPECT_THAT(job.reason(), HasSubstr("gone"));
}

TEST(JobRunnerTest, ClipsByTheGlobalNormAndSkipsNonFiniteSteps) {
  RunnerFixture f;
  f.factory.configure = [](FakeWorker* w) {
    if (w->rank_ == 1) w->nan_at_step = 2;
  };
  auto runner = f.Start(Spec(2, 4));  // grad_clip defaults to 1.0
  f.WaitFinished(*runner);
  auto job = *f.store->Get(runner->job_id());
  ASSERT_EQ(job.state(), v1::SUCCEEDED) << job.reason();
  for (FakeWorker* w : f.factory.made) {
    ASSERT_EQ(w->applies.size(), 4u);
    // Two stages of norm 2 each: global norm sqrt(8); clipped to 1.
    EXPECT_FLOAT_EQ(w->applies[0].grad_scale(), static_cast<float>(1.0 / std::sqrt(8.0)));
    EXPECT_FALSE(w->applies[0].skip());
    EXPECT_TRUE(w->applies[2].skip());  // one stage's gradient was not finite: all skip
  }
  EXPECT_NEAR(job.history(0).grad_norm(), std::sqrt(8.0), 1e-12);
  EXPECT_TRUE(job.history(2).skipped());
  EXPECT_EQ(job.skipped_steps(), 1);
}

TEST(JobRunnerTest, EvaluatesEveryKSteps) {
  RunnerFixture f;
  v1::JobSpec spec = Spec(2, 5);
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
  auto runner = f.Start(Spec(2, 10));
  f.WaitFinished(*runner);
  auto job = *f.store->Get(runner->job_id());
  EXPECT_EQ(job.state(), v1::FAILED);
  EXPECT_THAT(job.reason(), HasSubstr("step 3: "));  // index 2, numbered from 1
  EXPECT_THAT(job.reason(), HasSubstr("stage 1 (worker w-2 at 127.0.0.1:1001)"));
  EXPECT_THAT(job.reason(), HasSubstr("boom"));
  EXPECT_EQ(job.steps_done(), 2);
}

TEST(JobRunnerTest, CancelAbortsAHangingStep) {
  RunnerFixture f;
  f.factory.configure = [](FakeWorker* w) { w->hang_at_step = 1; };
  auto runner = f.Start(Spec(2, 10));
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
  auto runner = f.Start(Spec(2, 10));
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
  auto runner = f.Start(Spec(2, 10, /*max_restarts=*/1));
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

// A cancelled job is never restarted, whatever max_restarts says.
TEST(JobRunnerTest, ACancelIsNotRestarted) {
  RunnerFixture f;
  f.factory.configure = [](FakeWorker* w) { w->hang_at_step = 1; };
  auto runner = f.Start(Spec(2, 10, /*max_restarts=*/3));
  std::this_thread::sleep_for(50ms);
  runner->Cancel("cancelled by the user");
  f.WaitFinished(*runner);
  EXPECT_EQ(f.store->Get(runner->job_id())->state(), v1::CANCELLED);
}

// A rerun step supersedes its record and every later one; a restart rolls back to the
// checkpoint, so that no step is counted twice.
TEST(JobStoreTest, ARestartRollsBackToTheCheckpointAndRerunStepsReplaceTheirRecords) {
  auto store = *JobStore::Open("");
  const std::string id = *store->Add(Spec(2, 10));
  for (int64_t s = 0; s < 6; ++s) {
    v1::StepSummary step;
    step.set_step(s);
    step.set_loss(10.0 - static_cast<double>(s));
    step.set_skipped(s == 4);
    store->RecordStep(id, step);
  }
  store->SetCheckpoint(id, 2);
  EXPECT_EQ(store->RecordRestart(id, "step 6: boom"), 2) << "resumes after the checkpoint";
  auto job = *store->Get(id);
  EXPECT_EQ(job.restarts(), 1);
  EXPECT_EQ(job.first_failure(), "step 6: boom");
  EXPECT_EQ(job.steps_done(), 3);
  ASSERT_EQ(job.history_size(), 3);
  EXPECT_EQ(job.history(2).step(), 2);
  EXPECT_EQ(job.last_loss(), 8.0);
  EXPECT_EQ(job.skipped_steps(), 0);
  store->RecordRestart(id, "later");
  EXPECT_EQ(store->Get(id)->first_failure(), "step 6: boom") << "the first cause stays";
  // Steps 3.. run again; recording step 1 again (a rerun) drops what came after it.
  v1::StepSummary rerun;
  rerun.set_step(1);
  rerun.set_loss(42.0);
  store->RecordStep(id, rerun);
  job = *store->Get(id);
  ASSERT_EQ(job.history_size(), 2);
  EXPECT_EQ(job.history(1).loss(), 42.0);
  EXPECT_EQ(job.steps_done(), 2);
}

}  // namespace
}  // namespace tandem::coordinator

namespace tandem::coordinator {
namespace {

// Writes a one-tensor stage file of checkpoint (job, step).
void WriteStage(CheckpointStore& store, const std::string& job, int64_t step, int stage) {
  float x = static_cast<float>(step * 10 + stage);
  auto w = store.BeginStage(job, step, stage, {{absl::StrCat("t", stage), "F32", {1}}});
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_TRUE((*w)->Append(&x, sizeof(x)).ok());
  ASSERT_TRUE((*w)->Commit().ok());
}

TEST(CheckpointStoreTest, ATornCheckpointIsNeverLoadedAndRetentionKeepsTheNewest) {
  char dir_template[] = "/tmp/tandem-ckpt-XXXXXX";
  const std::string dir = mkdtemp(dir_template);
  CheckpointStore store(dir);
  EXPECT_EQ(store.Latest("job-1").status().code(), absl::StatusCode::kNotFound);
  WriteStage(store, "job-1", 3, 0);
  WriteStage(store, "job-1", 3, 1);
  ASSERT_TRUE(store.Commit("job-1", 3, 2, /*keep=*/2).ok());
  // Step 7: stage 1 never arrives, so the checkpoint cannot commit and stays invisible.
  WriteStage(store, "job-1", 7, 0);
  EXPECT_EQ(store.Commit("job-1", 7, 2, 2).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(*store.Latest("job-1"), 3);
  EXPECT_EQ(store.Open("job-1", 7).status().code(), absl::StatusCode::kNotFound);
  auto reader = store.Open("job-1", 3);
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ((*reader)->num_stages(), 2);
  auto t1 = (*reader)->Data("t1");
  ASSERT_TRUE(t1.ok());
  EXPECT_EQ(*reinterpret_cast<const float*>(t1->data()), 31.0f);
  EXPECT_EQ((*reader)->Data("t9").status().code(), absl::StatusCode::kNotFound);
  // Two more complete checkpoints: keep=2 drops step 3 and the torn step 7.
  for (int64_t step : {11, 15}) {
    WriteStage(store, "job-1", step, 0);
    WriteStage(store, "job-1", step, 1);
    ASSERT_TRUE(store.Commit("job-1", step, 2, 2).ok());
  }
  EXPECT_EQ(*store.Latest("job-1"), 15);
  EXPECT_FALSE(std::filesystem::exists(dir + "/job-1/step-3"));
  EXPECT_FALSE(std::filesystem::exists(dir + "/job-1/step-7"));
  EXPECT_TRUE(store.Open("job-1", 11).ok());
  // Without a root, checkpoints are refused with a reason.
  CheckpointStore none("");
  EXPECT_EQ(none.Latest("job-1").status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(store.Open("../etc", 1).status().code(), absl::StatusCode::kInvalidArgument);
  std::filesystem::remove_all(dir);
}

// Every stage file's size and CRC-32 are in the manifest and verified on open: a corrupt
// file is DATA_LOSS naming it, and LatestReadable falls back to the newest intact checkpoint.
// A crash between the stage files and the manifest leaves the previous checkpoint the one
// loaded.
TEST(CheckpointStoreTest, ChecksumsCatchACorruptFileAndACrashBeforeTheManifestKeepsThePrevious) {
  char dir_template[] = "/tmp/tandem-ckpt-XXXXXX";
  const std::string dir = mkdtemp(dir_template);
  CheckpointStore store(dir);
  for (int64_t step : {3, 7}) {
    WriteStage(store, "job-1", step, 0);
    WriteStage(store, "job-1", step, 1);
    ASSERT_TRUE(store.Commit("job-1", step, 2, /*keep=*/3).ok());
  }
  // The crash: step 11's files are written, its manifest never is.
  WriteStage(store, "job-1", 11, 0);
  WriteStage(store, "job-1", 11, 1);
  EXPECT_EQ(*store.Latest("job-1"), 7);
  EXPECT_EQ(*store.LatestReadable("job-1"), 7);
  // Flip one byte of step 7's stage 1 (its tensor data, at the end of the file).
  const std::string victim = dir + "/job-1/step-7/stage-1.safetensors";
  {
    std::fstream f(victim, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(-1, std::ios::end);
    char c = 0;
    f.read(&c, 1);
    c = static_cast<char>(c ^ 0x5a);
    f.seekp(-1, std::ios::end);
    f.write(&c, 1);
  }
  auto opened = store.Open("job-1", 7);
  EXPECT_EQ(opened.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(opened.status().message(),
              HasSubstr("stage-1.safetensors does not match its manifest"));
  EXPECT_EQ(*store.LatestReadable("job-1"), 3);
  std::filesystem::resize_file(dir + "/job-1/step-3/stage-0.safetensors", 8);
  EXPECT_EQ(store.LatestReadable("job-1").status().code(), absl::StatusCode::kNotFound);
  std::filesystem::remove_all(dir);
}

TEST(HfExportTest, ExportThenImportIsTheIdentityAndPadsTheVocabulary) {
  char dir_template[] = "/tmp/tandem-hf-XXXXXX";
  const std::string dir = mkdtemp(dir_template);
  CheckpointStore store(dir + "/checkpoints");
  v1::ModelSpec model;
  model.set_arch("gpt");
  model.set_n_layer(1);
  model.set_d_model(4);
  model.set_n_head(2);
  model.set_seq_len(3);
  model.set_vocab_size(5);
  model.set_tie_embeddings(true);
  // A checkpoint with every gpt parameter (Tandem layouts) plus some optimizer state.
  std::vector<TensorInfo> index = {{"transformer.wte.weight", "F32", {5, 4}},
                                   {"transformer.wpe.weight", "F32", {3, 4}}};
  const std::string b = "transformer.h.0.";
  for (const auto& [n, shape] :
       std::vector<std::pair<std::string, std::vector<int64_t>>>{{"ln_1.weight", {4}},
                                                                 {"ln_1.bias", {4}},
                                                                 {"attn.c_attn.weight", {12, 4}},
                                                                 {"attn.c_attn.bias", {12}},
                                                                 {"attn.c_proj.weight", {4, 4}},
                                                                 {"attn.c_proj.bias", {4}},
                                                                 {"ln_2.weight", {4}},
                                                                 {"ln_2.bias", {4}},
                                                                 {"mlp.c_fc.weight", {16, 4}},
                                                                 {"mlp.c_fc.bias", {16}},
                                                                 {"mlp.c_proj.weight", {4, 16}},
                                                                 {"mlp.c_proj.bias", {4}}}) {
    index.push_back({b + n, "F32", shape});
  }
  index.push_back({"transformer.ln_f.weight", "F32", {4}});
  index.push_back({"transformer.ln_f.bias", "F32", {4}});
  index.push_back({"transformer.wte.weight.adam_m", "F32", {5, 4}});
  {
    auto w = store.BeginStage("job-1", 9, 0, index);
    ASSERT_TRUE(w.ok());
    float x = 0;
    for (const auto& t : index) {
      for (int64_t i = 0; i < t.ByteSize() / 4; ++i, x += 1) ASSERT_TRUE((*w)->Append(&x, 4).ok());
    }
    ASSERT_TRUE((*w)->Commit().ok());
    ASSERT_TRUE(store.Commit("job-1", 9, 1, 1).ok());
  }
  auto ckpt = store.Open("job-1", 9);
  ASSERT_TRUE(ckpt.ok());
  const std::string hf = dir + "/hf.safetensors";
  ASSERT_TRUE(ExportGpt2Safetensors(**ckpt, model, hf).ok());
  auto file = SafetensorsFile::Open(hf);
  ASSERT_TRUE(file.ok());
  EXPECT_EQ((*file)->Find(b + "attn.c_attn.weight")->shape, (std::vector<int64_t>{4, 12}));
  EXPECT_EQ((*file)->Find("transformer.wte.weight.adam_m"), nullptr);  // no optimizer state
  // Ours (out, in)[r][k] == HF (in, out)[k][r].
  auto ours = (*ckpt)->Data(b + "mlp.c_fc.weight");
  auto theirs = (*file)->Data(b + "mlp.c_fc.weight");
  const float* o = reinterpret_cast<const float*>(ours->data());
  const float* t = reinterpret_cast<const float*>(theirs->data());
  EXPECT_EQ(o[2 * 4 + 3], t[3 * 16 + 2]);

  // Import back into a model with a padded vocabulary (5 -> 8 rows): identical tensors,
  // zero padding rows.
  v1::ModelSpec padded = model;
  padded.set_vocab_size(8);
  ASSERT_TRUE(ImportGpt2Safetensors(hf, padded, store, "import-job-2").ok());
  auto back = store.Open("import-job-2", 0);
  ASSERT_TRUE(back.ok()) << back.status();
  for (const auto& t : index) {
    if (t.name.find(".adam_") != std::string::npos) continue;
    auto a = (*ckpt)->Data(t.name);
    auto c = (*back)->Data(t.name);
    ASSERT_TRUE(c.ok()) << t.name;
    ASSERT_GE(c->size(), a->size()) << t.name;
    EXPECT_EQ(std::memcmp(a->data(), c->data(), a->size()), 0) << t.name;
  }
  auto wte = (*back)->Data("transformer.wte.weight");
  ASSERT_EQ(wte->size(), 8u * 4 * 4);
  EXPECT_EQ(reinterpret_cast<const float*>(wte->data())[7 * 4], 0.0f);
  // A model that does not fit the file is refused naming the tensor.
  v1::ModelSpec wider = model;
  wider.set_d_model(8);
  absl::Status s = ImportGpt2Safetensors(hf, wider, store, "import-job-3");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("init.hf_file: tensor transformer.wte.weight"));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace tandem::coordinator
