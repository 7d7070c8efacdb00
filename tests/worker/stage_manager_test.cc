// StageManager in-process: two managers (two "workers") configured with the programs of one
// job, Gloo over a shared HashStore standing in for the coordinator's rendezvous.
#include "worker/stage_manager.h"

#include <cblas.h>
#include <gloo/rendezvous/hash_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <future>
#include <limits>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/status_macros.h"
#include "tests/worker/cancellable_store.h"
#include "tests/worker/pipeline_test_util.h"
#include "worker/cpu_stage_compute.h"
#include "worker/transport/gloo_transport.h"

namespace tandem::worker {
namespace {

using testing::MakePrograms;
using testing::TinyJob;

class StageManagerTest : public ::testing::Test {
 protected:
  void SetUp() override { openblas_set_num_threads(1); }

  TransportFactory Factory(std::chrono::milliseconds connect_timeout = std::chrono::seconds(5)) {
    return [this, connect_timeout](
               const v1::StageProgram& p,
               const std::atomic<bool>& cancelled) -> absl::StatusOr<std::unique_ptr<Transport>> {
      gloo::rendezvous::PrefixStore prefixed(p.rendezvous_prefix(), store_);
      GlooTransportOptions o;
      o.rank = p.rank();
      o.size = p.num_ranks();
      o.connect_timeout = connect_timeout;
      ASSIGN_OR_RETURN(auto t, GlooTransport::Connect(o, prefixed));
      return std::unique_ptr<Transport>(std::move(t));
    };
  }

  // As Factory, over a store that gives up when the connect is cancelled (as the daemon's).
  TransportFactory CancellableFactory() {
    return
        [this](const v1::StageProgram& p,
               const std::atomic<bool>& cancelled) -> absl::StatusOr<std::unique_ptr<Transport>> {
          gloo::rendezvous::PrefixStore prefixed(p.rendezvous_prefix(), store_);
          testing::CancellableStore cancellable(prefixed, cancelled);
          GlooTransportOptions o;
          o.rank = p.rank();
          o.size = p.num_ranks();
          o.connect_timeout = std::chrono::seconds(10);
          ASSIGN_OR_RETURN(auto t, GlooTransport::Connect(o, cancellable));
          return std::unique_ptr<Transport>(std::move(t));
        };
  }

  gloo::rendezvous::HashStore store_;
};

// The update of `step` of job-1 (learning rate 0.01, unscaled), of `attempt`'s run.
v1::ApplyStepRequest ApplyOf(int64_t step, int32_t attempt = 0) {
  v1::ApplyStepRequest apply;
  apply.set_job_id("job-1");
  apply.set_step(step);
  apply.set_learning_rate(0.01f);
  apply.set_grad_scale(1.0f);
  apply.set_attempt(attempt);
  return apply;
}

v1::ProbeLinkRequest ProbeRequest(const std::string& prefix, int rank, int64_t timeout_ms) {
  v1::ProbeLinkRequest r;
  r.set_rendezvous_prefix(prefix);
  r.set_rank(rank);
  r.add_sizes(4096);
  r.add_sizes(1 << 16);
  r.set_repeats(3);
  r.set_timeout_ms(timeout_ms);
  return r;
}

// A "cuda" probe asks the transport factory for the device's data plane (the program's
// spec.device) and moves its messages between the device's buffers; a CPU worker refuses it.
TEST_F(StageManagerTest, ADeviceProbeUsesTheDevicesTransportAndBuffers) {
  std::atomic<int> allocated{0};
  std::mutex mu;
  std::vector<std::string> devices_asked;
  auto worker = [&](const std::string& device) {
    WorkerConfig c;
    c.device = device;
    c.device_buffers = [&](size_t bytes) -> absl::StatusOr<StageBufferPtr> {
      ++allocated;
      return NewHostBuffer(bytes);  // host memory posing as the device's
    };
    return c;
  };
  TransportFactory gloo = CancellableFactory();
  TransportFactory factory = [&](const v1::StageProgram& p, const std::atomic<bool>& cancelled) {
    {
      std::lock_guard<std::mutex> lock(mu);
      devices_asked.push_back(p.spec().device());
    }
    return gloo(p, cancelled);
  };
  StageManager w0(worker("cuda:0"), factory), w1(worker("cuda:1"), factory);
  v1::ProbeLinkRequest r0 = ProbeRequest("d1/", 0, 10000), r1 = ProbeRequest("d1/", 1, 10000);
  r0.set_device("cuda");
  r1.set_device("cuda");
  auto f1 = std::async(std::launch::async, [&] { return w1.ProbeLink(r1); });
  auto s0 = w0.ProbeLink(r0);
  auto s1 = f1.get();
  ASSERT_TRUE(s0.ok()) << s0.status();
  ASSERT_TRUE(s1.ok()) << s1.status();
  EXPECT_EQ(allocated.load(), 4);  // two messages' buffers on each worker
  EXPECT_EQ(devices_asked, (std::vector<std::string>{"cuda", "cuda"}));

  // A default probe on the same workers: Gloo between host buffers.
  devices_asked.clear();
  f1 = std::async(std::launch::async, [&] { return w1.ProbeLink(ProbeRequest("d2/", 1, 10000)); });
  ASSERT_TRUE(w0.ProbeLink(ProbeRequest("d2/", 0, 10000)).ok());
  ASSERT_TRUE(f1.get().ok());
  EXPECT_EQ(allocated.load(), 4);
  EXPECT_EQ(devices_asked, (std::vector<std::string>{"cpu", "cpu"}));

  StageManager cpu({}, factory);
  const absl::Status refused = cpu.ProbeLink(r0).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_NE(refused.message().find("device cuda was asked of a cpu worker"), std::string::npos)
      << refused;
}

// A link probe between two managers; refused on bad input and while busy; a peer that never
// comes times out and the manager keeps serving; a profile waits for a running probe, and
// Shutdown cancels it.
TEST_F(StageManagerTest, ProbeLinkMeasuresRefusesWhileBusyAndTimesOut) {
  StageManager w0({}, CancellableFactory()), w1({}, CancellableFactory());
  // With the data-parallel all-reduce timed too.
  v1::ProbeLinkRequest r0 = ProbeRequest("p1/", 0, 10000), r1 = ProbeRequest("p1/", 1, 10000);
  r0.set_allreduce_bytes(1 << 20);
  r1.set_allreduce_bytes(1 << 20);
  auto f1 = std::async(std::launch::async, [&] { return w1.ProbeLink(r1); });
  auto s0 = w0.ProbeLink(r0);
  auto s1 = f1.get();
  ASSERT_TRUE(s0.ok()) << s0.status();
  ASSERT_TRUE(s1.ok()) << s1.status();
  ASSERT_EQ(s0->samples_size(), 2);
  EXPECT_EQ(s0->samples(1).bytes(), 1 << 16);
  EXPECT_GT(s1->samples(0).one_way_seconds(), 0.0);
  EXPECT_EQ(s0->allreduce_seconds_size(), r0.repeats() > 0 ? r0.repeats() : kDefaultProbeRepeats);
  EXPECT_EQ(s1->allreduce_seconds_size(), s0->allreduce_seconds_size());

  v1::ProbeLinkRequest bad = ProbeRequest("p2/", 0, 1000);
  bad.set_sizes(0, (int64_t{1} << 30) + 1);
  absl::Status refused = w0.ProbeLink(bad).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.message().find("sizes[0]"), std::string::npos) << refused;
  EXPECT_EQ(StageManager({}, nullptr).ProbeLink(ProbeRequest("p2/", 0, 1000)).status().code(),
            absl::StatusCode::kFailedPrecondition);

  const auto t0 = std::chrono::steady_clock::now();
  absl::Status alone = w0.ProbeLink(ProbeRequest("p3/", 0, 500)).status();
  EXPECT_EQ(alone.code(), absl::StatusCode::kDeadlineExceeded) << alone;
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(2500));
  EXPECT_EQ(w0.GetStatus().state(), v1::IDLE);

  // While a probe waits for its peer the worker is busy for profiles and other probes.
  auto waiting =
      std::async(std::launch::async, [&] { return w0.ProbeLink(ProbeRequest("p4/", 0, 20000)); });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  absl::Status busy = w0.ProbeLink(ProbeRequest("p5/", 1, 1000)).status();
  EXPECT_EQ(busy.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(busy.message().find("a link probe"), std::string::npos) << busy;
  v1::JobSpec spec = testing::TinyGptJob(/*tie_embeddings=*/false);
  spec.mutable_pipeline()->set_stages(1);
  EXPECT_EQ(w0.ProfileLayers(spec, {0}, 1).status().code(), absl::StatusCode::kFailedPrecondition);
  const auto t1 = std::chrono::steady_clock::now();
  w0.Shutdown();
  EXPECT_EQ(waiting.get().status().code(), absl::StatusCode::kAborted);
  EXPECT_LT(std::chrono::steady_clock::now() - t1, std::chrono::milliseconds(1000));

  // A configured job holds the device.
  ASSERT_TRUE(w1.Configure(MakePrograms(TinyJob(), 1, "gpipe")[0]).ok());
  absl::Status held = w1.ProbeLink(ProbeRequest("p6/", 0, 1000)).status();
  EXPECT_EQ(held.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(held.message().find("job "), std::string::npos) << held;
}

// Profiling measures what the layers are: the head's parameters and saved bytes, positive
// times for F, B, I and W; and refuses while a job holds the worker.
TEST_F(StageManagerTest, ProfileLayersMeasuresAndRefusesWhileBusy) {
  StageManager w({}, Factory());
  v1::JobSpec spec = testing::TinyGptJob(/*tie_embeddings=*/false);
  spec.mutable_pipeline()->set_stages(1);
  auto profile = w.ProfileLayers(spec, {0, 1, 3}, 2);
  ASSERT_TRUE(profile.ok()) << profile.status();
  ASSERT_EQ(profile->size(), 3u);
  const v1::LayerProfile& head = (*profile)[2];
  EXPECT_EQ(head.layer(), 3);
  EXPECT_EQ(head.parameter_count(), 2 * 16 + 256 * 16);            // ln_f + lm_head
  EXPECT_EQ(head.static_bytes(), head.parameter_count() * 4 * 4);  // value, grad, 2 moments
  EXPECT_EQ(head.output_bytes(), 0);
  for (const v1::LayerProfile& p : *profile) {
    EXPECT_GT(p.forward_seconds(), 0.0) << p.layer();
    EXPECT_GT(p.backward_seconds(), 0.0) << p.layer();
    EXPECT_GT(p.activation_bytes(), 0) << p.layer();
    EXPECT_GT(p.apply_seconds(), 0.0) << p.layer();
    EXPECT_GT(p.recompute_seconds(), 0.0) << p.layer();  // RecomputeContext, timed
  }
  EXPECT_EQ((*profile)[1].output_bytes(), 8 * 8 * 16 * 4);  // (B, T, C) fp32
  EXPECT_EQ(w.ProfileLayers(spec, {7}, 1).status().code(), absl::StatusCode::kInvalidArgument);
  v1::JobSpec bad = spec;
  bad.mutable_model()->set_d_model(-1);
  EXPECT_EQ(w.ProfileLayers(bad, {}, 1).status().code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(w.Configure(MakePrograms(TinyJob(), 1, "gpipe")[0]).ok());
  EXPECT_EQ(w.ProfileLayers(spec, {0}, 1).status().code(), absl::StatusCode::kFailedPrecondition);
}

// A worker whose device compute (as a cuda:N worker's) is the CPU compute, counting into
// `built` (optional) each compute it builds, and failing every build while `*fail` (optional)
// holds. A profile's program has no actions and runs two micro-batches (slots 0 and 1).
WorkerConfig CpuDeviceComputeConfig(int* built = nullptr, const std::atomic<bool>* fail = nullptr) {
  WorkerConfig config;
  config.compute =
      [built, fail](const v1::StageProgram& p) -> absl::StatusOr<std::unique_ptr<StageCompute>> {
    if (fail != nullptr && *fail) {
      return absl::ResourceExhaustedError("no memory for the stage (test)");
    }
    if (built != nullptr) ++*built;
    ASSIGN_OR_RETURN(
        auto c, CpuStageCompute::Create(p, std::max<size_t>(2, StageExecutor::MicroBatchSlots(p))));
    return std::unique_ptr<StageCompute>(std::move(c));
  };
  return config;
}

// An idle worker hands its free heap back (WorkerConfig::release_heap, ReleaseFreeHeap in the
// daemon): after a job's stage is dropped and after a layer profile; never while a job holds
// the worker, and not for a refused profile or an abort that dropped nothing; and after a
// configure whose build failed.
TEST_F(StageManagerTest, TheHeapIsReleasedWhenTheWorkerGoesIdle) {
  std::atomic<int> calls{0}, while_busy{0};
  std::atomic<bool> fail_build{false};
  StageManager* worker = nullptr;
  WorkerConfig config = CpuDeviceComputeConfig(/*built=*/nullptr, &fail_build);
  config.release_heap = [&] {
    ++calls;
    if (worker->GetStatus().state() != v1::IDLE) ++while_busy;
    return HeapRelease{};
  };
  StageManager w(config, Factory());
  worker = &w;
  ASSERT_TRUE(w.Configure(MakePrograms(TinyJob(), 1, "gpipe")[0]).ok());
  ASSERT_TRUE(w.RunStep("job-1", 0).ok());
  v1::JobSpec spec = testing::TinyGptJob(/*tie_embeddings=*/false);
  spec.mutable_pipeline()->set_stages(1);
  EXPECT_EQ(w.ProfileLayers(spec, {0}, 1).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(calls.load(), 0);
  ASSERT_TRUE(w.Abort("job-1", "test").ok());
  EXPECT_EQ(calls.load(), 1);
  ASSERT_TRUE(w.Abort("job-1", "again").ok());  // nothing left to drop
  EXPECT_EQ(calls.load(), 1);
  ASSERT_TRUE(w.ProfileLayers(spec, {0}, 1).ok());
  EXPECT_EQ(calls.load(), 2);
  // An abort that keeps the stage's state for peer recovery drops the stage too.
  ASSERT_TRUE(w.Configure(MakePrograms(TinyJob(), 1, "gpipe")[0]).ok());
  ASSERT_TRUE(w.RunStep("job-1", 0).ok());
  ASSERT_TRUE(w.ApplyStep(ApplyOf(0)).ok());
  ASSERT_TRUE(w.Abort("job-1", "lost a peer", /*retain_step=*/0).ok());
  EXPECT_EQ(calls.load(), 3);
  // A configure that fails leaves the worker idle, and says why.
  fail_build = true;
  absl::StatusOr<v1::ConfigureResponse> failed =
      w.Configure(MakePrograms(TinyJob(), 1, "gpipe")[0]);
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(failed.status().message()),
              ::testing::HasSubstr("no memory for the stage"));
  EXPECT_EQ(calls.load(), 4);
  EXPECT_EQ(w.GetStatus().state(), v1::IDLE);
  EXPECT_EQ(while_busy.load(), 0);
}

// A llama profiles as a gpt does, with its own layers' sizes: the block's nine tensors (no
// biases, k and v at the kv width), the head's RMSNorm gain and LM head, and the per-layer
// bytes the partitioner and the memory model read.
TEST_F(StageManagerTest, ProfileLayersMeasuresALlama) {
  StageManager w({}, Factory());
  v1::JobSpec spec = testing::TinyLlamaJob(/*tie_embeddings=*/false);
  spec.mutable_pipeline()->set_stages(1);
  const int head_index = spec.model().n_layer() + 1;
  auto profile = w.ProfileLayers(spec, {0, 1, head_index}, 2);
  ASSERT_TRUE(profile.ok()) << profile.status();
  ASSERT_EQ(profile->size(), 3u);
  // C 16, KVD 8, H 32: norms 32, q and o 512, k and v 256, gate, up and down 1536.
  EXPECT_EQ((*profile)[1].parameter_count(), 2336);
  EXPECT_EQ((*profile)[2].parameter_count(), 16 + 256 * 16);  // model.norm + lm_head
  EXPECT_EQ((*profile)[0].parameter_count(), 256 * 16);       // embed_tokens only
  for (const v1::LayerProfile& p : *profile) {
    EXPECT_GT(p.forward_seconds(), 0.0) << p.layer();
    EXPECT_GT(p.backward_input_seconds(), 0.0) << p.layer();
    EXPECT_GT(p.activation_bytes(), 0) << p.layer();
  }
  EXPECT_EQ((*profile)[1].output_bytes(), 8 * 8 * 16 * 4);  // (B, T, C) fp32
}

// A worker runs jobs of its own device kind only, and builds their compute through its
// device's factory (main.cc gives cuda:N workers the CUDA one; a CPU compute stands in here).
TEST_F(StageManagerTest, AJobOfAnotherDeviceKindIsRefusedAndTheDevicesComputeIsUsed) {
  v1::JobSpec spec = TinyJob();
  spec.set_device("cuda");
  const auto programs = MakePrograms(spec, 1, "1f1b");
  StageManager cpu({}, Factory());
  const auto refused = cpu.Configure(programs[0]);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find("device cuda"), std::string::npos) << refused.status();
  EXPECT_NE(refused.status().message().find("this worker is cpu"), std::string::npos)
      << refused.status();
  EXPECT_EQ(cpu.GetStatus().state(), v1::IDLE);

  int built = 0;
  WorkerConfig config;
  config.device = "cuda:0";
  config.compute =
      [&built](const v1::StageProgram& p) -> absl::StatusOr<std::unique_ptr<StageCompute>> {
    ++built;
    ASSIGN_OR_RETURN(auto c, CpuStageCompute::Create(p, StageExecutor::MicroBatchSlots(p)));
    return std::unique_ptr<StageCompute>(std::move(c));
  };
  StageManager gpu(config, Factory());
  const auto configured = gpu.Configure(programs[0]);
  ASSERT_TRUE(configured.ok()) << configured.status();
  EXPECT_EQ(built, 1);
  auto step = gpu.RunStep(programs[0].job_id(), 0);
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_TRUE(step->has_loss());
  v1::JobSpec cpu_spec = TinyJob();
  EXPECT_EQ(gpu.Configure(MakePrograms(cpu_spec, 1, "1f1b")[0]).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

// A worker with a device compute (cuda:N) profiles through it (ProfileLayersOn). Through the
// CPU compute the figures are the Layer profiler's: the same parameters, bytes and a time for
// every phase.
TEST_F(StageManagerTest, ADevicesComputeProfilesTheLayersAsTheLayerProfilerDoes) {
  v1::JobSpec spec = testing::TinyGptJob(/*tie_embeddings=*/false);
  spec.mutable_pipeline()->set_stages(1);
  int built = 0;
  StageManager device(CpuDeviceComputeConfig(&built), Factory());
  StageManager layers({}, Factory());
  auto got = device.ProfileLayers(spec, {0, 1, 3}, 2);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(built, 3);
  auto want = layers.ProfileLayers(spec, {0, 1, 3}, 2);
  ASSERT_TRUE(want.ok()) << want.status();
  ASSERT_EQ(got->size(), want->size());
  for (size_t i = 0; i < got->size(); ++i) {
    const v1::LayerProfile& g = (*got)[i];
    const v1::LayerProfile& w = (*want)[i];
    EXPECT_EQ(g.layer(), w.layer());
    EXPECT_EQ(g.parameter_count(), w.parameter_count()) << g.layer();
    EXPECT_EQ(g.static_bytes(), w.static_bytes()) << g.layer();
    EXPECT_EQ(g.activation_bytes(), w.activation_bytes()) << g.layer();
    EXPECT_EQ(g.output_bytes(), w.output_bytes()) << g.layer();
    EXPECT_GT(g.forward_seconds(), 0.0) << g.layer();
    EXPECT_GT(g.backward_seconds(), 0.0) << g.layer();
    EXPECT_GT(g.backward_input_seconds(), 0.0) << g.layer();
    EXPECT_GT(g.apply_seconds(), 0.0) << g.layer();
  }
  EXPECT_EQ(device.ProfileLayers(spec, {7}, 1).status().code(), absl::StatusCode::kInvalidArgument);
}

// A speed check's request (ProfilePasses::kForwardBackward) times only the forward and the
// full backward, through the layer profiler and through a device's compute alike: the split
// backward, the recomputation and the apply answer 0, the bytes are those of a full profile.
TEST_F(StageManagerTest, AForwardAndBackwardOnlyProfileTimesThoseTwoPassesAndNothingElse) {
  v1::JobSpec spec = testing::TinyGptJob(/*tie_embeddings=*/false);
  spec.mutable_pipeline()->set_stages(1);
  StageManager device(CpuDeviceComputeConfig(), Factory());
  StageManager layers({}, Factory());
  auto full = layers.ProfileLayers(spec, {0, 1, 3}, 1);
  ASSERT_TRUE(full.ok()) << full.status();
  for (StageManager* w : {&layers, &device}) {
    auto fb = w->ProfileLayers(spec, {0, 1, 3}, 2, ProfilePasses::kForwardBackward);
    ASSERT_TRUE(fb.ok()) << fb.status();
    ASSERT_EQ(fb->size(), 3u);
    for (size_t i = 0; i < fb->size(); ++i) {
      const v1::LayerProfile& p = (*fb)[i];
      EXPECT_EQ(p.layer(), (*full)[i].layer());
      EXPECT_GT(p.forward_seconds(), 0.0) << p.layer();
      EXPECT_GT(p.backward_seconds(), 0.0) << p.layer();
      EXPECT_EQ(p.backward_input_seconds(), 0.0) << p.layer();
      EXPECT_EQ(p.backward_weight_seconds(), 0.0) << p.layer();
      EXPECT_EQ(p.recompute_seconds(), 0.0) << p.layer();
      EXPECT_EQ(p.apply_seconds(), 0.0) << p.layer();
      EXPECT_EQ(p.parameter_count(), (*full)[i].parameter_count()) << p.layer();
      EXPECT_EQ(p.activation_bytes(), (*full)[i].activation_bytes()) << p.layer();
      EXPECT_EQ(p.output_bytes(), (*full)[i].output_bytes()) << p.layer();
    }
  }
}

TEST_F(StageManagerTest, ConfigureRunAbortLifecycle) {
  const v1::JobSpec spec = TinyJob();
  const auto programs = MakePrograms(spec, 2, "1f1b");
  StageManager w0({}, Factory()), w1({}, Factory());
  EXPECT_EQ(w0.GetStatus().state(), v1::IDLE);

  auto c1 = std::async(std::launch::async, [&] { return w1.Configure(programs[1]); });
  auto r0 = w0.Configure(programs[0]);
  auto r1 = c1.get();
  ASSERT_TRUE(r0.ok()) << r0.status();
  ASSERT_TRUE(r1.ok()) << r1.status();
  EXPECT_GT(r0->parameter_count(), 0);
  EXPECT_EQ(r0->parameter_bytes(), 4 * r0->parameter_count());
  EXPECT_EQ(w1.GetStatus().state(), v1::BUSY);
  EXPECT_EQ(w1.GetStatus().job_id(), "job-1");
  EXPECT_EQ(w1.GetStatus().stage(), 1);
  EXPECT_EQ(w1.GetSnapshot().state, v1::BUSY);

  for (int step = 0; step < 2; ++step) {
    auto s1 = std::async(std::launch::async, [&] { return w1.RunStep("job-1", step); });
    auto s0 = w0.RunStep("job-1", step);
    auto rep1 = s1.get();
    ASSERT_TRUE(s0.ok()) << s0.status();
    ASSERT_TRUE(rep1.ok()) << rep1.status();
    v1::ApplyStepRequest apply;
    apply.set_job_id("job-1");
    apply.set_step(step);
    apply.set_learning_rate(0.01f);
    apply.set_grad_scale(1.0f);
    ASSERT_TRUE(w0.ApplyStep(apply).ok());
    ASSERT_TRUE(w1.ApplyStep(apply).ok());
    EXPECT_TRUE(rep1->has_loss());
    EXPECT_GT(rep1->loss(), 0.0);
  }
  EXPECT_EQ(w0.GetStatus().last_step(), 1);

  // Wrong job: refused, nothing changes.
  EXPECT_EQ(w0.RunStep("job-2", 2).status().code(), absl::StatusCode::kFailedPrecondition);

  // Abort while stage 1 waits for a forward that never comes.
  auto blocked = std::async(std::launch::async, [&] { return w1.RunStep("job-1", 2); });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(w1.RunStep("job-1", 2).status().code(), absl::StatusCode::kFailedPrecondition);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_TRUE(w1.Abort("job-1", "test").ok());
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(1));
  EXPECT_EQ(blocked.get().status().code(), absl::StatusCode::kAborted);
  EXPECT_EQ(w1.GetStatus().state(), v1::IDLE);
  EXPECT_TRUE(w1.Abort("job-1", "again").ok());  // idempotent
  EXPECT_TRUE(w1.Abort("unknown", "").ok());     // unknown job
  EXPECT_EQ(w1.Abort("", "").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(w1.RunStep("job-1", 3).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(w0.Abort("job-1", "test").ok());
}

// The coordinator folds a step's update into the next RunStep (apply_first): the same
// parameters as a separate ApplyStep; one of another job, or not of an earlier step, refuses
// the call before anything runs.
TEST_F(StageManagerTest, RunStepAppliesTheFoldedUpdateFirst) {
  const v1::JobSpec spec = TinyJob();
  const auto programs = MakePrograms(spec, 1, "1f1b");
  StageManager folded({}, Factory()), separate({}, Factory());
  ASSERT_TRUE(folded.Configure(programs[0]).ok());
  ASSERT_TRUE(separate.Configure(programs[0]).ok());
  std::vector<double> a, b;
  for (int step = 0; step < 3; ++step) {
    const v1::ApplyStepRequest previous = ApplyOf(step - 1);
    const auto t0 = std::chrono::steady_clock::now();
    auto r = folded.RunStep("job-1", step, v1::STEP_MODE_TRAIN, 0, step > 0 ? &previous : nullptr);
    const int64_t call_us =
        std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0)
            .count();
    ASSERT_TRUE(r.ok()) << r.status();
    a.push_back(r->loss());
    // The folded update is timed apart from the step's execution, and the norm pass within it.
    EXPECT_LE(r->update_us() + r->exec_us(), call_us);
    EXPECT_GE(r->update_us(), 0);
    if (step == 0) {
      EXPECT_EQ(r->update_us(), 0);
    }
    EXPECT_LE(r->grad_norm_us(), r->exec_us());
    auto q = separate.RunStep("job-1", step);
    ASSERT_TRUE(q.ok()) << q.status();
    EXPECT_EQ(q->update_us(), 0) << "no update folded into the call";
    b.push_back(q->loss());
    ASSERT_TRUE(separate.ApplyStep(ApplyOf(step)).ok());
  }
  EXPECT_EQ(a, b) << "the same updates, bit for bit";
  EXPECT_LT(a[2], a[0]);
  // Step 3 with step 2's update for another job, or for step 3 itself: refused, nothing runs.
  v1::ApplyStepRequest wrong = ApplyOf(2);
  wrong.set_job_id("job-2");
  auto r = folded.RunStep("job-1", 3, v1::STEP_MODE_TRAIN, 0, &wrong);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  wrong = ApplyOf(3);
  r = folded.RunStep("job-1", 3, v1::STEP_MODE_TRAIN, 0, &wrong);
  EXPECT_THAT(std::string(r.status().message()),
              ::testing::HasSubstr("expected an earlier step of the same job"));
  // The pending update of step 2 is still there: a correct fold runs step 3.
  const v1::ApplyStepRequest right = ApplyOf(2);
  EXPECT_TRUE(folded.RunStep("job-1", 3, v1::STEP_MODE_TRAIN, 0, &right).ok());
  EXPECT_TRUE(folded.Abort("job-1", "test").ok());
  EXPECT_TRUE(separate.Abort("job-1", "test").ok());
}

// Steps are idempotent by (job, attempt, step): a call from an earlier run of the job is
// refused, and a step once applied can neither run nor apply again.
TEST_F(StageManagerTest, LateOrRepeatedCallsAreRefused) {
  const v1::JobSpec spec = TinyJob();
  auto programs = MakePrograms(spec, 2, "1f1b");
  for (auto& p : programs) p.set_attempt(2);
  StageManager w0({}, Factory()), w1({}, Factory());
  auto c1 = std::async(std::launch::async, [&] { return w1.Configure(programs[1]); });
  ASSERT_TRUE(w0.Configure(programs[0]).ok());
  ASSERT_TRUE(c1.get().ok());

  auto stale = w0.RunStep("job-1", 0, v1::STEP_MODE_TRAIN, /*attempt=*/1);
  EXPECT_EQ(stale.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(stale.status().message()),
              ::testing::HasSubstr("the call is for attempt 1, but this worker runs attempt 2"));

  auto s1 = std::async(std::launch::async,
                       [&] { return w1.RunStep("job-1", 0, v1::STEP_MODE_TRAIN, 2); });
  ASSERT_TRUE(w0.RunStep("job-1", 0, v1::STEP_MODE_TRAIN, 2).ok());
  ASSERT_TRUE(s1.get().ok());
  v1::ApplyStepRequest apply;
  apply.set_job_id("job-1");
  apply.set_step(0);
  apply.set_learning_rate(0.01f);
  apply.set_grad_scale(1.0f);
  apply.set_attempt(1);
  EXPECT_EQ(w0.ApplyStep(apply).code(), absl::StatusCode::kFailedPrecondition);
  apply.set_attempt(2);
  ASSERT_TRUE(w0.ApplyStep(apply).ok());
  ASSERT_TRUE(w1.ApplyStep(apply).ok());
  // A duplicate apply, and a late RunStep of the applied step: refused, nothing changes.
  EXPECT_EQ(w0.ApplyStep(apply).code(), absl::StatusCode::kFailedPrecondition);
  auto again = w0.RunStep("job-1", 0, v1::STEP_MODE_TRAIN, 2);
  EXPECT_EQ(again.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(again.status().message()),
              ::testing::HasSubstr("step 1 was already applied"));
  EXPECT_EQ(w0.GetStatus().last_step(), 0);
  EXPECT_TRUE(w0.Abort("job-1", "test").ok());
  EXPECT_TRUE(w1.Abort("job-1", "test").ok());
}

// Peer recovery: a worker aborted after a fault keeps its state after the last completed step
// (not the step in flight); the next run's workers restore from it (a replacement through
// ReadState, the keeper from its own copy) and train on exactly as an unbroken run does; the
// copy goes with the next run's first step, or with a Configure of another job.
TEST_F(StageManagerTest, AnAbortedWorkerKeepsItsStateForTheNextRunsPeers) {
  const v1::JobSpec spec = TinyJob();
  const v1::StageProgram program = MakePrograms(spec, 1, "1f1b")[0];
  // The fault-free run: steps 0..4.
  StageManager reference({}, Factory());
  ASSERT_TRUE(reference.Configure(program).ok());
  std::vector<double> losses;
  for (int step = 0; step < 5; ++step) {
    auto r = reference.RunStep("job-1", step);
    ASSERT_TRUE(r.ok()) << r.status();
    losses.push_back(r->loss());
    ASSERT_TRUE(reference.ApplyStep(ApplyOf(step)).ok());
  }
  // The keeper trains steps 0..2, runs step 3 (in flight: its gradients never applied) and is
  // aborted keeping its state after step 2. A worker whose state is another step keeps none.
  StageManager keeper({}, Factory()), other({}, Factory());
  ASSERT_TRUE(keeper.Configure(program).ok());
  ASSERT_TRUE(other.Configure(program).ok());
  for (int step = 0; step < 3; ++step) {
    ASSERT_TRUE(keeper.RunStep("job-1", step).ok());
    ASSERT_TRUE(keeper.ApplyStep(ApplyOf(step)).ok());
  }
  ASSERT_TRUE(keeper.RunStep("job-1", 3).ok());
  ASSERT_TRUE(keeper.Abort("job-1", "a peer died", /*retain_step=*/2).ok());
  ASSERT_TRUE(other.Abort("job-1", "a peer died", /*retain_step=*/2).ok());
  EXPECT_EQ(keeper.GetStatus().state(), v1::IDLE);
  const std::vector<std::string> names = {"head.weight", "no.such.tensor"};
  int served = 0;
  auto count = [&](const std::vector<StageExecutor::StateTensor>& t) {
    served = static_cast<int>(t.size());
    return absl::OkStatus();
  };
  EXPECT_TRUE(keeper.ReadState("job-1", 2, names, count).ok());
  EXPECT_EQ(served, 1) << "only what it holds";
  EXPECT_EQ(keeper.ReadState("job-1", 3, names, count).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(other.ReadState("job-1", 2, names, count).code(), absl::StatusCode::kFailedPrecondition)
      << "its state was after no step";
  // A worker that never got the RunStep carrying (apply_first) the update of the kept step
  // applies the update the abort carries, and keeps the same state as the keeper.
  StageManager late({}, Factory());
  ASSERT_TRUE(late.Configure(program).ok());
  for (int step = 0; step < 3; ++step) {
    ASSERT_TRUE(late.RunStep("job-1", step).ok());
    if (step < 2) {
      ASSERT_TRUE(late.ApplyStep(ApplyOf(step)).ok());
    }
  }
  const v1::ApplyStepRequest update = ApplyOf(2);
  ASSERT_TRUE(late.Abort("job-1", "a peer died", /*retain_step=*/2, &update).ok());
  auto bytes_of = [&](StageManager& m) {
    std::string bytes;
    EXPECT_TRUE(m.ReadState("job-1", 2, {"head.weight"},
                            [&](const std::vector<StageExecutor::StateTensor>& t) {
                              if (t.size() == 1) {
                                bytes.assign(static_cast<const char*>(t[0].data), t[0].bytes);
                              }
                              return absl::OkStatus();
                            })
                    .ok());
    return bytes;
  };
  EXPECT_FALSE(bytes_of(late).empty());
  EXPECT_EQ(bytes_of(late), bytes_of(keeper));

  // The next run (attempt 1) restores after step 2 from peers: "dead" dies mid-transfer, the
  // keeper serves. In-process reads stand in for gRPC.
  WorkerConfig config;
  config.read_peer_state = [&](const std::string& address, const v1::CheckpointRef& state,
                               const std::vector<std::string>& wanted,
                               std::map<std::string, std::string>* out) -> absl::Status {
    if (address != "keeper") {
      (*out)[wanted[0]] = "torn";
      return absl::UnavailableError("connection reset");
    }
    return keeper.ReadState(state.job_id(), state.step(), wanted,
                            [&](const std::vector<StageExecutor::StateTensor>& tensors) {
                              for (const auto& t : tensors) {
                                (*out)[t.name].assign(static_cast<const char*>(t.data), t.bytes);
                              }
                              return absl::OkStatus();
                            });
  };
  v1::StageProgram next = program;
  next.set_attempt(1);
  next.mutable_restore()->set_job_id("job-1");
  next.mutable_restore()->set_step(2);
  next.mutable_restore()->add_peers("dead");
  next.mutable_restore()->add_peers("keeper");
  StageManager replacement(config, Factory());
  ASSERT_TRUE(replacement.Configure(next).ok());
  // The keeper restores from its own copy (its peers are unreachable).
  v1::StageProgram own = next;
  own.mutable_restore()->clear_peers();
  own.mutable_restore()->add_peers("dead");
  ASSERT_TRUE(keeper.Configure(own).ok());
  for (int step = 3; step < 5; ++step) {
    auto a = replacement.RunStep("job-1", step, v1::STEP_MODE_TRAIN, 1);
    auto b = keeper.RunStep("job-1", step, v1::STEP_MODE_TRAIN, 1);
    ASSERT_TRUE(a.ok()) << a.status();
    ASSERT_TRUE(b.ok()) << b.status();
    EXPECT_EQ(a->loss(), losses[step]) << "step " << step << ": bit for bit the unbroken run's";
    EXPECT_EQ(b->loss(), losses[step]) << "step " << step;
    const v1::ApplyStepRequest apply = ApplyOf(step, /*attempt=*/1);
    ASSERT_TRUE(replacement.ApplyStep(apply).ok());
    ASSERT_TRUE(keeper.ApplyStep(apply).ok());
  }
  // A late call of the aborted run is refused; the next run's first step dropped the copy.
  EXPECT_EQ(keeper.RunStep("job-1", 5, v1::STEP_MODE_TRAIN, 0).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(keeper.ReadState("job-1", 2, names, count).code(),
            absl::StatusCode::kFailedPrecondition);

  // No worker holds the state: UNAVAILABLE (a fault; the coordinator falls back to the
  // checkpoint), and the worker stays idle.
  StageManager stranded(config, Factory());
  v1::StageProgram unreachable = next;
  unreachable.mutable_restore()->clear_peers();
  unreachable.mutable_restore()->add_peers("dead");
  const auto failed = stranded.Configure(unreachable);
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kUnavailable) << failed.status();
  EXPECT_THAT(std::string(failed.status().message()), ::testing::HasSubstr("held by none"));
  EXPECT_EQ(stranded.GetStatus().state(), v1::IDLE);

  // A kept copy goes with a Configure of another job, and with an abort that keeps nothing.
  ASSERT_TRUE(keeper.Abort("job-1", "again", /*retain_step=*/4).ok());
  EXPECT_TRUE(keeper.ReadState("job-1", 4, names, count).ok());
  ASSERT_TRUE(keeper.Configure(MakePrograms(spec, 1, "1f1b", "job-2")[0]).ok());
  EXPECT_EQ(keeper.ReadState("job-1", 4, names, count).code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(keeper.Abort("job-2", "done").ok());
  ASSERT_TRUE(replacement.Abort("job-1", "again", /*retain_step=*/4).ok());
  ASSERT_TRUE(replacement.Abort("job-1", "finished").ok());
  EXPECT_EQ(replacement.ReadState("job-1", 4, names, count).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(reference.Abort("job-1", "done").ok());
}

TEST_F(StageManagerTest, AbortCancelsConfigureInProgress) {
  const auto programs = MakePrograms(TinyJob(), 2, "1f1b", "job-9");
  StageManager w0({}, Factory(std::chrono::milliseconds(1000)));
  // Rank 1 never shows up: the configure waits for it until aborted.
  auto c = std::async(std::launch::async, [&] { return w0.Configure(programs[0]); });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_EQ(w0.GetStatus().state(), v1::BUSY);
  EXPECT_TRUE(w0.Abort("job-9", "cancelled").ok());
  EXPECT_EQ(w0.GetStatus().state(), v1::IDLE);
  // The HashStore wait cannot be interrupted; the configure ends at its connect timeout and
  // must not install the stage.
  auto r = c.get();
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kAborted) << r.status();
  EXPECT_EQ(w0.GetStatus().state(), v1::IDLE);
}

TEST_F(StageManagerTest, ConfigureRejectsBadPrograms) {
  StageManager w({}, Factory());
  v1::StageProgram p = MakePrograms(TinyJob(), 1, "gpipe")[0];
  p.mutable_chunks(0)->set_layer_end(1000);
  auto r = w.Configure(p);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  p = MakePrograms(TinyJob(), 1, "gpipe")[0];
  p.mutable_spec()->mutable_data()->set_source("file");
  p.mutable_spec()->mutable_data()->set_path("../etc/passwd");
  r = w.Configure(p);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("data.path"), std::string::npos) << r.status();
  EXPECT_EQ(w.GetStatus().state(), v1::IDLE);
  // A good single-stage program then works, and a second configure replaces it.
  ASSERT_TRUE(w.Configure(MakePrograms(TinyJob(), 1, "gpipe")[0]).ok());
  ASSERT_TRUE(w.RunStep("job-1", 0).ok());
  v1::ApplyStepRequest wrong_job;
  wrong_job.set_job_id("job-9");
  wrong_job.set_step(0);
  EXPECT_EQ(w.ApplyStep(wrong_job).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(w.Configure(MakePrograms(TinyJob(), 1, "gpipe", "job-2")[0]).ok());
  EXPECT_EQ(w.GetStatus().job_id(), "job-2");
  EXPECT_EQ(w.RunStep("job-1", 1).status().code(), absl::StatusCode::kFailedPrecondition);
  w.Shutdown();
  EXPECT_EQ(w.RunStep("job-2", 0).status().code(), absl::StatusCode::kUnavailable);
}

// Out-of-order and misdirected calls get their code and the manager keeps serving: a step
// or an apply before any Configure, for another job, with a negative, repeated or earlier
// step index, an apply of a step that has no pending gradients.
TEST_F(StageManagerTest, OutOfOrderCallsAreRefusedAndTheWorkerKeepsServing) {
  StageManager w({}, Factory());
  v1::ApplyStepRequest apply;
  apply.set_job_id("job-1");
  apply.set_step(0);
  apply.set_learning_rate(0.01f);
  apply.set_grad_scale(1.0f);
  // Before Configure.
  auto r = w.RunStep("job-1", 0);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition) << r.status();
  EXPECT_NE(r.status().message().find("holds no job"), std::string::npos) << r.status();
  EXPECT_EQ(w.ApplyStep(apply).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(w.Abort("job-1", "nothing to abort").code(), absl::StatusCode::kOk);
  EXPECT_EQ(w.Abort("", "").code(), absl::StatusCode::kInvalidArgument);

  ASSERT_TRUE(w.Configure(MakePrograms(TinyJob(), 1, "gpipe")[0]).ok());
  // Another job's step: FAILED_PRECONDITION naming both jobs.
  r = w.RunStep("job-7", 0);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("job job-7 is not configured"), std::string::npos);
  EXPECT_NE(r.status().message().find("it holds job job-1"), std::string::npos);
  // Apply before the step ran: nothing pending.
  absl::Status a = w.ApplyStep(apply);
  EXPECT_EQ(a.code(), absl::StatusCode::kFailedPrecondition) << a;
  EXPECT_NE(a.message().find("no gradients are pending"), std::string::npos) << a;
  // A negative step.
  r = w.RunStep("job-1", -1);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  EXPECT_NE(r.status().message().find("step must be >= 0"), std::string::npos);
  // Step 3, then its apply; applying it twice is refused.
  ASSERT_TRUE(w.RunStep("job-1", 3).ok());
  // A second step while step 3's gradients wait for their apply.
  r = w.RunStep("job-1", 4);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition) << r.status();
  apply.set_step(2);  // the wrong step's apply
  a = w.ApplyStep(apply);
  EXPECT_EQ(a.code(), absl::StatusCode::kFailedPrecondition) << a;
  EXPECT_NE(a.message().find("step 4's, not step 3's"), std::string::npos) << a;  // 1-based
  apply.set_step(3);
  ASSERT_TRUE(w.ApplyStep(apply).ok());
  EXPECT_EQ(w.ApplyStep(apply).code(), absl::StatusCode::kFailedPrecondition);
  // Duplicate and earlier steps.
  for (int64_t step : {3, 1}) {
    r = w.RunStep("job-1", step);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition) << step;
    EXPECT_NE(r.status().message().find("was already applied (the stage is at step 4)"),
              std::string::npos)
        << r.status();
  }
  // Bad apply arguments.
  apply.set_step(4);
  ASSERT_TRUE(w.RunStep("job-1", 4).ok());
  apply.set_learning_rate(std::numeric_limits<float>::quiet_NaN());
  EXPECT_EQ(w.ApplyStep(apply).code(), absl::StatusCode::kInvalidArgument);
  apply.set_learning_rate(0.01f);
  apply.set_grad_scale(-std::numeric_limits<float>::infinity());
  EXPECT_EQ(w.ApplyStep(apply).code(), absl::StatusCode::kInvalidArgument);
  apply.set_grad_scale(1.0f);
  // After all that the worker still serves the job: the pending step applies, the next runs.
  ASSERT_TRUE(w.ApplyStep(apply).ok());
  auto ok = w.RunStep("job-1", 5);
  ASSERT_TRUE(ok.ok()) << ok.status();
  // An evaluation after step 5 is not a training step: it may name the last step.
  EXPECT_EQ(w.GetStatus().last_step(), 5);
}

// Malformed programs in Configure are INVALID_ARGUMENT; the worker stays idle and a good
// program configures after each.
TEST_F(StageManagerTest, MalformedProgramsAreInvalidArgument) {
  StageManager w({}, Factory());
  const v1::StageProgram good = MakePrograms(TinyJob(), 1, "gpipe")[0];
  const std::vector<std::pair<const char*, std::function<void(v1::StageProgram&)>>> cases = {
      {"negative rank", [](auto& p) { p.set_rank(-1); }},
      {"rank past num_ranks", [](auto& p) { p.set_rank(1); }},
      {"zero ranks", [](auto& p) { p.set_num_ranks(0); }},
      {"stage index", [](auto& p) { p.mutable_chunks(0)->set_stage(7); }},
      {"negative stage", [](auto& p) { p.mutable_chunks(0)->set_stage(-1); }},
      {"layers reversed", [](auto& p) { p.mutable_chunks(0)->set_layer_end(0); }},
      {"no actions", [](auto& p) { p.clear_actions(); }},
      {"action micro-batch", [](auto& p) { p.mutable_actions(0)->set_micro_batch(-2); }},
      {"action stage", [](auto& p) { p.mutable_actions(0)->set_stage(3); }},
      {"action kind",
       [](auto& p) { p.mutable_actions(0)->set_kind(static_cast<v1::ActionKind>(99)); }},
      {"micro_batches", [](auto& p) { p.set_micro_batches(-3); }},
      {"no job id", [](auto& p) { p.clear_job_id(); }},
      {"eval micro-batches",
       [](auto& p) {
         *p.add_eval_actions() = p.actions(0);
         p.set_eval_micro_batches(-1);
       }},
      {"model", [](auto& p) { p.mutable_spec()->mutable_model()->set_n_layer(-5); }},
  };
  for (const auto& [name, mutate] : cases) {
    v1::StageProgram p = good;
    mutate(p);
    auto r = w.Configure(p);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << name << ": " << r.status();
    EXPECT_EQ(w.GetStatus().state(), v1::IDLE) << name;
  }
  auto r = w.Configure(good);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(w.RunStep("job-1", 0).ok());
}

// A stage that cannot fit the worker's memory is refused before anything is allocated,
// naming both figures; the worker keeps serving smaller programs.
TEST_F(StageManagerTest, StageLargerThanTheWorkerMemoryIsResourceExhausted) {
  WorkerConfig config;
  config.memory_bytes = 1 << 20;  // 1 MiB
  StageManager w(config, Factory());
  v1::JobSpec big = TinyJob();
  big.mutable_model()->set_d_model(512);
  auto r = w.Configure(MakePrograms(big, 1, "gpipe")[0]);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted) << r.status();
  EXPECT_NE(r.status().message().find("this worker has 1048576 bytes"), std::string::npos)
      << r.status();
  EXPECT_NE(r.status().message().find("needs at least"), std::string::npos);
  EXPECT_EQ(w.GetStatus().state(), v1::IDLE);
  EXPECT_TRUE(w.Configure(MakePrograms(TinyJob(), 1, "gpipe")[0]).ok());
  // A layer profile is refused the same way, before building the layer.
  StageManager idle(config, Factory());
  v1::JobSpec wide = testing::TinyGptJob(/*tie_embeddings=*/false);
  wide.mutable_pipeline()->set_stages(1);
  wide.mutable_model()->set_d_model(1024);
  wide.mutable_model()->set_n_head(8);
  auto profile = idle.ProfileLayers(wide, {1}, 1);
  EXPECT_EQ(profile.status().code(), absl::StatusCode::kResourceExhausted) << profile.status();
  EXPECT_NE(profile.status().message().find("profile: layer 1 needs at least"), std::string::npos)
      << profile.status();
  // The estimate counts 16 bytes per parameter: a wide model's stage is tens of GiB.
  v1::StageProgram huge = MakePrograms(TinyJob(), 1, "gpipe")[0];
  huge.mutable_spec()->mutable_model()->set_d_model(16384);
  EXPECT_GT(EstimateStageBytes(huge), int64_t{1} << 34);
}

}  // namespace
}  // namespace tandem::worker
