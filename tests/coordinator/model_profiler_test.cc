// The model profiler: link probes between two workers and ProfileModel (tandem plan).
#include "coordinator/model_profiler.h"

#include <mutex>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/link_model.h"
#include "coordinator/profile_store.h"
#include "coordinator/rendezvous_store.h"
#include "coordinator/worker_registry.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/coordinator/fake_worker_client.h"
#include "tests/coordinator/runner_fixture.h"

namespace tandem::coordinator {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;

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
  EXPECT_EQ(rendezvous.size(), 1u);                     // only the other prefix's key is left
  EXPECT_EQ(b.probe_requests[0].allreduce_bytes(), 0);  // not asked: none measured
  EXPECT_EQ(link->allreduce_bytes(), 0);
}

// Between cpu workers the data-parallel ring is timed too, and the median of both ends' runs
// prices the reduction (common/link_model.h), copies and sums included.
TEST(MeasureLinkTest, TimesTheAllReduceBetweenCpuWorkers) {
  FakeWorker a(0), b(1);
  a.allreduce_extra_per_byte = b.allreduce_extra_per_byte = 2e-9;  // the sums: 2 ns per byte
  auto link = MeasureLink(Record("w-1"), a, Record("w-2"), b, {4096, 65536}, 3, "p/",
                          absl::Seconds(5), nullptr, "", 1 << 20);
  ASSERT_TRUE(link.ok()) << link.status();
  EXPECT_EQ(a.probe_requests[0].allreduce_bytes(), 1 << 20);
  EXPECT_EQ(b.probe_requests[0].allreduce_bytes(), 1 << 20);
  EXPECT_EQ(link->allreduce_bytes(), 1 << 20);
  const double expected = 2 * (20e-6 + (1 << 19) * 1e-9) + (1 << 20) * 2e-9;
  EXPECT_NEAR(link->allreduce_seconds(), expected, 1e-12);
  // Three times the messages alone: the price follows the measurement, not the fit.
  EXPECT_NEAR(AllReduceSeconds(*link, 1 << 20, 2), expected, 1e-9);
  EXPECT_GT(AllReduceSeconds(*link, 1 << 20, 2), 2.5 * 2 * TransferSeconds(*link, 1 << 19));
  // A profile asks for all of the model's parameter bytes, at least 4 KiB, at most 64 MiB.
  v1::ModelProfile profile;
  profile.add_layers()->set_parameter_count(10);
  EXPECT_EQ(AllReduceProbeBytes(profile), 4096);
  profile.add_layers()->set_parameter_count(4990);
  EXPECT_EQ(AllReduceProbeBytes(profile), 20000);
  profile.add_layers()->set_parameter_count(int64_t{1} << 30);
  EXPECT_EQ(AllReduceProbeBytes(profile), kMaxAllReduceProbeBytes);
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

// Two cuda workers on one GPU cannot be probed over NCCL: the host-staged transport ("gloo"),
// as their job would use; the job's resolved transport, when given, wins.
TEST(MeasureLinkTest, ProbesTwoWorkersOnOneGpuOverTheHostStagedTransport) {
  WorkerRecord ra = Record("w-1"), rb = Record("w-2");
  ra.device = rb.device = "cuda:0";
  ra.hostname = rb.hostname = "h";
  for (auto [given, want] : {std::pair{"", "gloo"}, {"auto", "gloo"}, {"gloo", "gloo"}}) {
    FakeWorker a(0), b(1);
    auto link = MeasureLink(ra, a, rb, b, {4096}, 1, "p/", absl::Seconds(5), nullptr, given);
    ASSERT_TRUE(link.ok()) << link.status();
    EXPECT_EQ(a.probe_requests[0].device(), "cuda");
    EXPECT_EQ(a.probe_requests[0].transport(), want) << given;
    EXPECT_EQ(b.probe_requests[0].transport(), want) << given;
  }
  rb.device = "cuda:1";  // two GPUs: NCCL, unless the job resolved gloo
  FakeWorker a(0), b(1), c(0), d(1);
  ASSERT_TRUE(MeasureLink(ra, a, rb, b, {4096}, 1, "p/", absl::Seconds(5), nullptr).ok());
  EXPECT_EQ(a.probe_requests[0].transport(), "nccl");
  ASSERT_TRUE(MeasureLink(ra, c, rb, d, {4096}, 1, "p/", absl::Seconds(5), nullptr, "gloo").ok());
  EXPECT_EQ(c.probe_requests[0].transport(), "gloo");
  // cpu workers: Gloo, no transport field.
  FakeWorker e(0), g(1);
  ASSERT_TRUE(
      MeasureLink(Record("w-1"), e, Record("w-2"), g, {4096}, 1, "p/", absl::Seconds(5), nullptr)
          .ok());
  EXPECT_EQ(e.probe_requests[0].transport(), "");
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

v1::LayerProfile Timed(int layer, double forward, int64_t bytes) {
  v1::LayerProfile p;
  p.set_layer(layer);
  p.set_forward_seconds(forward);
  p.set_backward_seconds(2 * forward);
  p.set_backward_input_seconds(forward);
  p.set_backward_weight_seconds(forward);
  p.set_recompute_seconds(forward / 2);
  p.set_apply_seconds(forward / 10);
  p.set_activation_bytes(bytes);
  p.set_output_bytes(bytes / 2);
  p.set_static_bytes(3 * bytes);
  p.set_parameter_count(bytes / 4);
  return p;
}

// The workers' times of a layer merge to their median (the mean of the middle two for an even
// count), every time field alike; the bytes are the first's and must agree.
TEST(MergeWorkerProfilesTest, TakesTheMedianTimeAndRefusesDisagreeingBytes) {
  auto one = MergeWorkerProfiles({{Timed(0, 1.0, 400), Timed(1, 2.0, 800)}});
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ((*one)[1].forward_seconds(), 2.0);

  auto three = MergeWorkerProfiles({{Timed(0, 1.0, 400), Timed(1, 2.0, 800)},
                                    {Timed(0, 9.0, 400), Timed(1, 2.2, 800)},
                                    {Timed(0, 1.2, 400), Timed(1, 2.1, 800)}});
  ASSERT_TRUE(three.ok()) << three.status();
  ASSERT_EQ(three->size(), 2u);
  EXPECT_DOUBLE_EQ((*three)[0].forward_seconds(), 1.2);  // the slow outlier does not count
  EXPECT_DOUBLE_EQ((*three)[0].backward_seconds(), 2.4);
  EXPECT_DOUBLE_EQ((*three)[0].backward_input_seconds(), 1.2);
  EXPECT_DOUBLE_EQ((*three)[0].backward_weight_seconds(), 1.2);
  EXPECT_DOUBLE_EQ((*three)[0].recompute_seconds(), 0.6);
  EXPECT_DOUBLE_EQ((*three)[0].apply_seconds(), 0.12);
  EXPECT_DOUBLE_EQ((*three)[1].forward_seconds(), 2.1);
  EXPECT_EQ((*three)[1].activation_bytes(), 800);
  EXPECT_EQ((*three)[1].output_bytes(), 400);
  EXPECT_EQ((*three)[1].layer(), 1);

  auto two = MergeWorkerProfiles({{Timed(0, 1.0, 400)}, {Timed(0, 2.0, 400)}});
  ASSERT_TRUE(two.ok());
  EXPECT_DOUBLE_EQ((*two)[0].forward_seconds(), 1.5);

  EXPECT_THAT(MergeWorkerProfiles({}).status().message(), HasSubstr("no worker"));
  EXPECT_THAT(MergeWorkerProfiles({{Timed(0, 1.0, 400)}, {Timed(0, 1.0, 400), Timed(1, 1, 8)}})
                  .status()
                  .message(),
              HasSubstr("profile 1 has 2 layers, profile 0 1"));
  EXPECT_THAT(MergeWorkerProfiles({{Timed(0, 1.0, 400)}, {Timed(0, 1.0, 404)}}).status().message(),
              HasSubstr("disagrees with profile 0 on layer 0"));
  EXPECT_THAT(MergeWorkerProfiles({{Timed(0, 1.0, 400)}, {Timed(3, 1.0, 400)}}).status().code(),
              absl::StatusCode::kInvalidArgument);
}

// ProfileModel with two idle workers times the layers on both at once and keeps the middle of
// their times; a worker whose profile fails leaves the other's, and both failing fail it, named.
TEST(ProfileModelTest, ProfilesOnBothHeldWorkersAtOnce) {
  WorkerRegistry registry(10s);
  FakeFactory factory;
  ProfileStore profiles("");
  v1::JobSpec spec = JobSpecOf(2, 2);
  ASSERT_TRUE(registry.Register(RegistrationOf("127.0.0.1:1000")).ok());
  ASSERT_TRUE(registry.Register(RegistrationOf("127.0.0.1:1001")).ok());
  // Each worker's profile waits (at most 5 s) until the other's has started too.
  absl::Mutex mu;
  int started = 0;
  int saw_both = 0;
  int made = 0;
  factory.configure = [&](FakeWorker* w) {
    const double s = made++ == 0 ? 0.003 : 0.009;  // the second worker is three times slower
    w->layer_seconds = [s](int) { return s; };
    w->on_profile = [&] {
      absl::MutexLock lock(&mu);
      // The k-th call (1-based) belongs to round (k + 1) / 2, which both workers start.
      const int round = (++started + 1) / 2;
      const auto both = [&] { return started >= 2 * round; };
      if (mu.AwaitWithTimeout(absl::Condition(&both), absl::Seconds(5))) ++saw_both;
    };
  };
  auto profile = ProfileModel(spec, registry, factory, profiles, absl::Seconds(5), true);
  ASSERT_TRUE(profile.ok()) << profile.status();
  ASSERT_EQ(factory.made.size(), 2u);
  // Two rounds (their times agree), each on both workers at once, not one after the other.
  EXPECT_EQ(factory.made[0]->profiles.load(), kProfileRounds);
  EXPECT_EQ(factory.made[1]->profiles.load(), kProfileRounds);
  EXPECT_EQ(saw_both, 2 * kProfileRounds);
  ASSERT_GT(profile->layers_size(), 0);
  EXPECT_NEAR(profile->layers(0).forward_seconds(), 0.002, 1e-12);  // (0.001 + 0.003) / 2

  // One worker failing: the other's times (logged); both failing: the error, named.
  made = 0;
  factory.configure = [&made](FakeWorker* w) {
    if (made++ == 1) {
      w->profile_error = absl::InternalError("out of memory");
    } else {
      w->layer_seconds = [](int) { return 0.003; };
    }
  };
  auto one = ProfileModel(spec, registry, factory, profiles, absl::Seconds(5), true);
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_NEAR(one->layers(0).forward_seconds(), 0.001, 1e-12);
  factory.configure = [](FakeWorker* w) {
    w->profile_error = absl::InternalError("out of memory");
  };
  auto failed = ProfileModel(spec, registry, factory, profiles, absl::Seconds(5), true);
  EXPECT_THAT(failed.status().message(), HasSubstr("out of memory"));
  EXPECT_THAT(failed.status().message(), HasSubstr("127.0.0.1:100"));
  for (const WorkerRecord& w : registry.List()) EXPECT_EQ(w.state, v1::IDLE) << w.id;
}

// Only workers like the first (device kind, threads, hardware: the profile's key) profile with
// it, and of cuda workers on one GPU only the first (two would time each other).
TEST(MeasureProfileTest, ProfilesOnTheWorkersLikeTheFirstOnDistinctDevices) {
  FakeWorker a(0), b(1), c(2), d(3);
  WorkerRecord ra = Record("w-1"), rb = Record("w-2"), rc = Record("w-3"), rd = Record("w-4");
  rb.threads = 2;
  ra.device_name = rb.device_name = rc.device_name = "Xeon / OpenBLAS SkylakeX";
  rd.device_name = "EPYC / OpenBLAS Zen";
  v1::JobSpec spec = JobSpecOf(2, 2);
  auto profile =
      MeasureProfile(spec, {{&ra, &a}, {&rb, &b}, {&rc, &c}, {&rd, &d}}, absl::Seconds(5), nullptr);
  ASSERT_TRUE(profile.ok()) << profile.status();
  EXPECT_EQ(a.profiles.load(), kProfileRounds);
  EXPECT_EQ(b.profiles.load(), 0);  // other threads: another profile key
  EXPECT_EQ(c.profiles.load(), kProfileRounds);
  EXPECT_EQ(d.profiles.load(), 0);  // another processor: another profile key
  EXPECT_EQ(profile->device_name(), "Xeon / OpenBLAS SkylakeX");
  EXPECT_EQ(profile->key(), ProfileKeyFor(spec, ra));
  EXPECT_NE(profile->key(), ProfileKeyFor(spec, rd));
  a.profiles = 0;
  c.profiles = 0;
  for (WorkerRecord* r : {&ra, &rb, &rc, &rd}) {
    r->device_name = "NVIDIA H100 80GB HBM3";
    r->device = "cuda:0";
    r->threads = 1;
    r->hostname = "h";
  }
  ra.device_uuid = rb.device_uuid = "GPU-1";
  rc.device_uuid = "GPU-2";
  rd.device_uuid = "GPU-1";
  profile =
      MeasureProfile(spec, {{&ra, &a}, {&rb, &b}, {&rc, &c}, {&rd, &d}}, absl::Seconds(5), nullptr);
  ASSERT_TRUE(profile.ok()) << profile.status();
  EXPECT_EQ(a.profiles.load(), kProfileRounds);
  EXPECT_EQ(b.profiles.load(), 0);  // on w-1's GPU
  EXPECT_EQ(c.profiles.load(), kProfileRounds);
  EXPECT_EQ(d.profiles.load(), 0);
}

// Two rounds whose times agree (within 3%) are the profile; a round off by more on a layer
// that counts brings a third, and the median over all of them leaves the off round out; a
// negligible layer's noise is no reason for another round.
TEST(DisagreeingLayerTest, ComparesEveryLayerThatCountsWithinTheAgreement) {
  const std::vector<v1::LayerProfile> first = {Timed(0, 0.001, 400), Timed(1, 1.0, 400),
                                               Timed(2, 2.0, 400)};
  EXPECT_EQ(DisagreeingLayer(first, first), -1);
  std::vector<v1::LayerProfile> round = first;
  round[1].set_forward_seconds(1.05);  // F + B 3.05 against 3.0: within 3%
  round[0].set_forward_seconds(0.01);  // 10x, but under 1% of the model's time
  EXPECT_EQ(DisagreeingLayer(first, round), -1);
  round[2].set_backward_weight_seconds(2.2);  // I + W 4.2 against 4.0: 4.8% off
  EXPECT_EQ(DisagreeingLayer(first, round), 2);
  round = first;
  round[1].set_backward_seconds(1.5);  // F + B 2.5 against 3.0, faster: off too
  EXPECT_EQ(DisagreeingLayer(first, round), 1);
}

TEST(MeasureProfileTest, TimesAnotherRoundWhenTwoDisagreeAndTakesTheMedian) {
  FakeWorker a(0), b(1);
  WorkerRecord ra = Record("w-1"), rb = Record("w-2");
  // Both workers' first round 30% slow (the host busy meanwhile), then steady.
  for (FakeWorker* w : {&a, &b}) {
    w->layer_seconds = [w](int) { return w->profiles.load() == 1 ? 0.0039 : 0.003; };
  }
  const v1::JobSpec spec = JobSpecOf(2, 2);
  auto profile = MeasureProfile(spec, {{&ra, &a}, {&rb, &b}}, absl::Seconds(5), nullptr);
  ASSERT_TRUE(profile.ok()) << profile.status();
  EXPECT_EQ(a.profiles.load(), kMaxProfileRounds);
  EXPECT_EQ(b.profiles.load(), kMaxProfileRounds);
  ASSERT_GT(profile->layers_size(), 0);
  EXPECT_NEAR(profile->layers(0).forward_seconds(), 0.001, 1e-12);  // the steady rounds'

  // Steady from the start: two rounds.
  FakeWorker c(2), d(3);
  for (FakeWorker* w : {&c, &d}) w->layer_seconds = [](int) { return 0.003; };
  profile = MeasureProfile(spec, {{&ra, &c}, {&rb, &d}}, absl::Seconds(5), nullptr);
  ASSERT_TRUE(profile.ok()) << profile.status();
  EXPECT_EQ(c.profiles.load(), kProfileRounds);
  EXPECT_EQ(d.profiles.load(), kProfileRounds);
}

// Every round within the timeout: a second only when more is left than the first took; and
// none once the caller stops (its job cancelled).
TEST(MeasureProfileTest, RoundsStayWithinTheTimeoutAndStopWhenAsked) {
  WorkerRecord ra = Record("w-1"), rb = Record("w-2");
  const v1::JobSpec spec = JobSpecOf(2, 2);
  FakeWorker a(0), b(1);
  for (FakeWorker* w : {&a, &b}) w->profile_delay = absl::Milliseconds(300);
  auto profile = MeasureProfile(spec, {{&ra, &a}, {&rb, &b}}, absl::Milliseconds(500), nullptr);
  ASSERT_TRUE(profile.ok()) << profile.status();
  EXPECT_EQ(a.profiles.load(), 1);  // 200 ms left after a 300 ms round
  EXPECT_EQ(b.profiles.load(), 1);

  FakeWorker c(2), d(3);
  int asked = 0;
  profile = MeasureProfile(spec, {{&ra, &c}, {&rb, &d}}, absl::Seconds(5), nullptr, nullptr,
                           [&asked] { return ++asked > 0; });
  ASSERT_TRUE(profile.ok()) << profile.status();
  EXPECT_EQ(c.profiles.load(), 1);
  EXPECT_EQ(asked, 1);
}

// A worker whose profile fails is not asked again in the next round; the other's rounds count.
TEST(MeasureProfileTest, AWorkerThatFailsIsNotAskedAgain) {
  FakeWorker a(0), b(1);
  WorkerRecord ra = Record("w-1"), rb = Record("w-2");
  a.layer_seconds = [](int) { return 0.003; };
  b.profile_error = absl::InternalError("out of memory");
  auto profile = MeasureProfile(JobSpecOf(2, 2), {{&ra, &a}, {&rb, &b}}, absl::Seconds(5), nullptr);
  ASSERT_TRUE(profile.ok()) << profile.status();
  EXPECT_EQ(a.profiles.load(), kProfileRounds);
  EXPECT_EQ(b.profiles.load(), 1);
  EXPECT_NEAR(profile->layers(0).forward_seconds(), 0.001, 1e-12);
}

// ProfileModel (tandem plan) measures the link when two idle workers exist and leaves it
// empty with one; a link that fails leaves the profile without one; the workers are released.
TEST(ProfileModelTest, MeasuresTheLinkWhenTwoWorkersAreIdle) {
  WorkerRegistry registry(10s);
  FakeFactory factory;
  ProfileStore profiles("");
  RendezvousStore rendezvous;
  v1::JobSpec spec = JobSpecOf(2, 2);
  ASSERT_TRUE(registry.Register(RegistrationOf("127.0.0.1:1000")).ok());
  auto one = ProfileModel(spec, registry, factory, profiles, absl::Seconds(5), false, &rendezvous);
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_FALSE(one->has_link());
  ASSERT_TRUE(registry.Register(RegistrationOf("127.0.0.1:1001")).ok());
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

// A cached profile past the store's max age is measured again for `tandem plan`; while no
// worker is idle to measure it, the old one is served rather than none (the plan prints its
// time). Asked to refresh, the answer is then UNAVAILABLE.
TEST(ProfileModelTest, AProfilePastTheMaxAgeIsMeasuredAgainOrServedWhenNoWorkerIsIdle) {
  WorkerRegistry registry(10s);
  FakeFactory factory;
  ProfileStore profiles("", absl::Minutes(10));
  v1::JobSpec spec = JobSpecOf(2, 2);
  ASSERT_TRUE(registry.Register(RegistrationOf("127.0.0.1:1000")).ok());
  auto first = ProfileModel(spec, registry, factory, profiles, absl::Seconds(5), false);
  ASSERT_TRUE(first.ok()) << first.status();
  v1::ModelProfile old = *first;
  old.set_created_unix_ms(absl::ToUnixMillis(absl::Now() - absl::Hours(1)));
  ASSERT_TRUE(profiles.Put(old).ok());

  auto again = ProfileModel(spec, registry, factory, profiles, absl::Seconds(5), false);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_GT(again->created_unix_ms(), old.created_unix_ms());  // measured again
  EXPECT_EQ(factory.made.size(), 2u);

  ASSERT_TRUE(profiles.Put(old).ok());
  ASSERT_TRUE(registry.Allocate("cpu", 1, "job-9").ok());  // the only worker is busy
  auto busy = ProfileModel(spec, registry, factory, profiles, absl::Seconds(5), false);
  ASSERT_TRUE(busy.ok()) << busy.status();
  EXPECT_EQ(busy->created_unix_ms(), old.created_unix_ms());  // the old one, as it is
  EXPECT_EQ(factory.made.size(), 2u);
  auto refresh = ProfileModel(spec, registry, factory, profiles, absl::Seconds(5), true);
  EXPECT_EQ(refresh.status().code(), absl::StatusCode::kUnavailable) << refresh.status();
}

// `profile` as measured `age` ago on a machine `slower` times as slow as now.
v1::ModelProfile Aged(v1::ModelProfile profile, absl::Duration age, double slower) {
  profile.set_created_unix_ms(absl::ToUnixMillis(absl::Now() - age));
  for (v1::LayerProfile& l : *profile.mutable_layers()) {
    l.set_forward_seconds(l.forward_seconds() * slower);
    l.set_backward_seconds(l.backward_seconds() * slower);
  }
  return profile;
}

// With speed checks (the coordinator's --profile-speed-check), a cached profile old enough is
// timed again on idle workers before `tandem plan` is priced on it, as before a job: measured
// when the machine ran 10% slower, it is served at the speed now and says so; the store keeps
// it as measured. The verdict stands for the model at every micro-batch size for the check's
// age, so a plan's search checks once, as a job's plan does. A young profile is not checked.
TEST(ProfileModelTest, AnOldCachedProfileIsServedAtTheSpeedItsCheckMeasuresOnceAPlan) {
  WorkerRegistry registry(10s);
  FakeFactory factory;
  ProfileStore profiles("");
  v1::JobSpec by4 = JobSpecOf(2, 2);
  by4.mutable_pipeline()->set_micro_batch_size(4);
  v1::JobSpec by2 = by4;
  by2.mutable_pipeline()->set_micro_batch_size(2);
  ASSERT_TRUE(registry.Register(RegistrationOf("127.0.0.1:1000")).ok());
  ASSERT_TRUE(registry.Register(RegistrationOf("127.0.0.1:1001")).ok());
  SpeedCheckMemo checks(absl::Seconds(60));
  auto fresh4 = ProfileModel(by4, registry, factory, profiles, absl::Seconds(5), false);
  auto fresh2 = ProfileModel(by2, registry, factory, profiles, absl::Seconds(5), false);
  ASSERT_TRUE(fresh4.ok() && fresh2.ok()) << fresh4.status() << fresh2.status();
  const size_t made = factory.made.size();

  auto young =
      ProfileModel(by4, registry, factory, profiles, absl::Seconds(5), false, nullptr, &checks);
  ASSERT_TRUE(young.ok()) << young.status();
  EXPECT_EQ(young->speed_check(), "");
  EXPECT_EQ(factory.made.size(), made);  // nothing timed

  const v1::ModelProfile old4 = Aged(*fresh4, absl::Minutes(5), 1.1);
  ASSERT_TRUE(profiles.Put(old4).ok());
  ASSERT_TRUE(profiles.Put(Aged(*fresh2, absl::Minutes(5), 1.1)).ok());
  auto checked =
      ProfileModel(by4, registry, factory, profiles, absl::Seconds(5), false, nullptr, &checks);
  ASSERT_TRUE(checked.ok()) << checked.status();
  ASSERT_EQ(factory.made.size(), made + 2);  // both workers timed it, at once
  for (size_t w = made; w < made + 2; ++w) {
    std::lock_guard<std::mutex> lock(factory.made[w]->profile_mu);
    ASSERT_EQ(factory.made[w]->profile_requests.size(), static_cast<size_t>(kProfileRounds));
    for (const v1::ProfileLayersRequest& r : factory.made[w]->profile_requests) {
      EXPECT_TRUE(r.forward_backward_only()) << "a speed check, not a profile";
      EXPECT_EQ(r.repeats(), kSpeedCheckRepeats);
    }
  }
  for (const WorkerRecord& w : registry.List()) EXPECT_EQ(w.state, v1::IDLE) << w.id;
  EXPECT_THAT(checked->speed_check(), HasSubstr("checked now: "));
  EXPECT_THAT(checked->speed_check(), HasSubstr("priced at x0.909"));
  ASSERT_EQ(checked->layers_size(), fresh4->layers_size());
  for (int g = 0; g < checked->layers_size(); ++g) {
    EXPECT_NEAR(checked->layers(g).forward_seconds(), fresh4->layers(g).forward_seconds(), 1e-12);
  }
  const std::optional<v1::ModelProfile> kept = profiles.Find(old4.key());
  ASSERT_TRUE(kept.has_value());
  EXPECT_DOUBLE_EQ(kept->layers(1).forward_seconds(), old4.layers(1).forward_seconds());
  EXPECT_EQ(kept->speed_check(), "");
  // A served profile is never kept as measured.
  EXPECT_EQ(profiles.Put(*checked).code(), absl::StatusCode::kInvalidArgument);

  // The other micro-batch size, within the check's age: the same verdict, nothing timed.
  auto other =
      ProfileModel(by2, registry, factory, profiles, absl::Seconds(5), false, nullptr, &checks);
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_EQ(factory.made.size(), made + 2);
  EXPECT_THAT(other->speed_check(), HasSubstr(" s ago: "));
  EXPECT_NEAR(other->layers(1).forward_seconds(), fresh2->layers(1).forward_seconds(), 1e-12);
}

// No idle worker to time it on: the old profile is served as it is, saying why it was not
// checked; nothing is remembered, so the next call checks. The machine changed beyond the
// check's 25% (every layer kind 2x off): the profile is measured again.
TEST(ProfileModelTest, AnOldProfileIsServedAsItIsWhenNoWorkerIsIdleAndMeasuredAgainWhenFarOff) {
  WorkerRegistry registry(10s);
  FakeFactory factory;
  ProfileStore profiles("");
  const v1::JobSpec spec = JobSpecOf(2, 2);
  ASSERT_TRUE(registry.Register(RegistrationOf("127.0.0.1:1000")).ok());
  SpeedCheckMemo checks(absl::Seconds(60));
  auto fresh = ProfileModel(spec, registry, factory, profiles, absl::Seconds(5), false);
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  const v1::ModelProfile old = Aged(*fresh, absl::Minutes(5), 1.1);
  ASSERT_TRUE(profiles.Put(old).ok());

  ASSERT_TRUE(registry.Allocate("cpu", 1, "job-9").ok());  // the only worker is busy
  auto busy =
      ProfileModel(spec, registry, factory, profiles, absl::Seconds(5), false, nullptr, &checks);
  ASSERT_TRUE(busy.ok()) << busy.status();
  EXPECT_THAT(busy->speed_check(), HasSubstr("not checked (no idle cpu worker"));
  EXPECT_DOUBLE_EQ(busy->layers(1).forward_seconds(), old.layers(1).forward_seconds());
  EXPECT_EQ(factory.made.size(), 1u);
  registry.Release("job-9");

  ASSERT_TRUE(profiles.Put(Aged(*fresh, absl::Minutes(5), 2.0)).ok());
  auto far =
      ProfileModel(spec, registry, factory, profiles, absl::Seconds(5), false, nullptr, &checks);
  ASSERT_TRUE(far.ok()) << far.status();
  EXPECT_THAT(far->speed_check(), HasSubstr("beyond 25%: measuring the profile again"));
  EXPECT_GT(far->created_unix_ms(), old.created_unix_ms());  // measured again
  EXPECT_EQ(profiles.Find(far->key())->speed_check(), "");   // and kept as measured
  EXPECT_NEAR(far->layers(1).forward_seconds(), fresh->layers(1).forward_seconds(), 1e-12);
  EXPECT_EQ(factory.made.size(), 3u);  // the check's worker, then the profile's
}

}  // namespace
}  // namespace tandem::coordinator
