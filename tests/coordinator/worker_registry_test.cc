// The worker registry: registration, heartbeats, gang allocation, lost workers.
#include "coordinator/worker_registry.h"

#include <chrono>
#include <thread>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/coordinator/runner_fixture.h"

namespace tandem::coordinator {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;

TEST(WorkerRegistryTest, GangAllocationIsAllOrNothing) {
  WorkerRegistry registry(1000ms);
  ASSERT_TRUE(registry.Register(RegistrationOf("a:1")).ok());
  ASSERT_TRUE(registry.Register(RegistrationOf("b:1")).ok());
  ASSERT_TRUE(registry.Register(RegistrationOf("c:1", "cuda:0")).ok());
  EXPECT_FALSE(registry.Allocate("cpu", 3, "job-1").ok());
  for (const auto& w : registry.List()) EXPECT_EQ(w.state, v1::IDLE);
  EXPECT_EQ(registry.AvailabilityText("cpu", 3),
            "waiting for 3 idle cpu workers: 2 registered and alive, 2 idle; 1 more must register");
  auto gang = registry.Allocate("cpu", 2, "job-1");
  ASSERT_TRUE(gang.ok());
  EXPECT_EQ((*gang)[0].address, "a:1");
  EXPECT_EQ((*gang)[1].stage, 1);
  EXPECT_FALSE(registry.Allocate("cpu", 1, "job-2").ok());
  registry.Release("job-1");
  EXPECT_TRUE(registry.Allocate("cpu", 1, "job-2").ok());
}

// A worker's node is its --node, else its hostname; a stages x replicas gang is placed by node
// (coordinator/placement.h): here each stage's two replicas on one node, although the two
// nodes' workers registered alternately.
TEST(WorkerRegistryTest, AllocatesAGridByNode) {
  WorkerRegistry registry(1000ms);
  for (int i = 0; i < 4; ++i) {
    v1::RegisterRequest r = RegistrationOf(absl::StrCat("h", i, ":1"));
    r.set_hostname(absl::StrCat("host-", i % 2));
    if (i == 3) r.set_node("node-x");  // given explicitly: wins over the hostname
    ASSERT_TRUE(registry.Register(r).ok());
  }
  std::vector<WorkerRecord> all = registry.List();
  ASSERT_EQ(all.size(), 4u);
  EXPECT_EQ(all[0].node, "host-0");
  EXPECT_EQ(all[3].node, "node-x");
  // host-0 holds h0 and h2: with node-x and host-1 one worker each, stage 0's pair is host-0's.
  auto gang = registry.Allocate("cpu", 4, "job-1", /*stages=*/2);
  ASSERT_TRUE(gang.ok()) << gang.status();
  ASSERT_EQ(gang->size(), 4u);
  // Gang rank = replica x 2 + stage: ranks 0 and 2 are stage 0 of replicas 0 and 1.
  EXPECT_EQ((*gang)[0].node, "host-0");
  EXPECT_EQ((*gang)[2].node, "host-0");
  for (int g = 0; g < 4; ++g) EXPECT_EQ((*gang)[g].stage, g) << "stage field = gang rank";
}

// The heartbeat interval stays at its base for a few workers and grows with them past it (so
// the coordinator's heartbeat load is bounded); the loss timeout grows in proportion.
TEST(WorkerRegistryTest, HeartbeatIntervalGrowsWithTheWorkers) {
  WorkerRegistry registry(5000ms);
  EXPECT_EQ(registry.heartbeat_interval(), 1000ms) << "the default before it is set";
  registry.SetHeartbeatInterval(1000ms, std::chrono::microseconds(10000));
  for (int i = 0; i < 50; ++i) {
    ASSERT_TRUE(registry.Register(RegistrationOf(absl::StrCat("a:", i))).ok());
  }
  EXPECT_EQ(registry.heartbeat_interval(), 1000ms) << "50 x 10 ms is under the base";
  EXPECT_EQ(registry.heartbeat_timeout(), 5000ms);
  for (int i = 50; i < 300; ++i) {
    ASSERT_TRUE(registry.Register(RegistrationOf(absl::StrCat("a:", i))).ok());
  }
  EXPECT_EQ(registry.heartbeat_interval(), 3000ms);
  EXPECT_EQ(registry.heartbeat_timeout(), 15000ms);
  registry.SetHeartbeatInterval(1000ms, std::chrono::microseconds(0));
  EXPECT_EQ(registry.heartbeat_interval(), 1000ms) << "0: fixed";
}

TEST(WorkerRegistryTest, BadRegistrationIsRefused) {
  WorkerRegistry registry(1000ms);
  EXPECT_EQ(registry.Register(RegistrationOf("")).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(registry.Register(RegistrationOf("a:1", "tpu")).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(registry.Heartbeat("w-99").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(registry.Heartbeat("garbage").code(), absl::StatusCode::kNotFound);
}

// A cuda worker's GPU uuid is kept (pipeline.transport tells a shared GPU by it) and listed.
TEST(WorkerRegistryTest, KeepsTheDeviceUuidAndName) {
  WorkerRegistry registry(1000ms);
  v1::RegisterRequest r = RegistrationOf("g:1", "cuda:0");
  r.set_hostname("gpu-box");
  r.set_device_uuid("GPU-8c7f2b1e-0f3a-4c1d-9e2b-5a6b7c8d9e0f");
  r.set_device_name("NVIDIA H100 80GB HBM3");
  absl::StatusOr<std::string> id = registry.Register(r);
  ASSERT_TRUE(id.ok()) << id.status();
  absl::StatusOr<WorkerRecord> w = registry.Get(*id);
  ASSERT_TRUE(w.ok());
  EXPECT_EQ(w->device_uuid, "GPU-8c7f2b1e-0f3a-4c1d-9e2b-5a6b7c8d9e0f");
  EXPECT_EQ(w->device_name, "NVIDIA H100 80GB HBM3");
  EXPECT_EQ(w->hostname, "gpu-box");
  auto gang = registry.Allocate("cuda", 1, "job-1");
  ASSERT_TRUE(gang.ok());
  EXPECT_EQ((*gang)[0].device_uuid, "GPU-8c7f2b1e-0f3a-4c1d-9e2b-5a6b7c8d9e0f");
  // An older worker sends none; a uuid longer than any GPU's is refused.
  EXPECT_TRUE(registry.Register(RegistrationOf("g:2", "cuda:0")).ok());
  r.set_address("g:3");
  r.set_device_uuid(std::string(65, 'x'));
  absl::StatusOr<std::string> bad = registry.Register(r);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("register: device_uuid"));
  // A name longer than the worker ever sends is refused, naming the field.
  r.set_device_uuid("GPU-1");
  r.set_device_name(std::string(257, 'x'));
  bad = registry.Register(r);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("register: device_name is 257"));
  // It is shown in tables and logs: one line of text, no control characters.
  r.set_device_name("Xeon\n| forged row");
  bad = registry.Register(r);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("control character"));
}

// How and when a worker measured its peak is kept with the peak (`tandem workers W` shows it);
// a method longer than any the worker writes, or a negative time, is refused.
TEST(WorkerRegistryTest, KeepsHowAndWhenThePeakWasMeasured) {
  WorkerRegistry registry(1000ms);
  v1::RegisterRequest r = RegistrationOf("p:1");
  r.set_peak_flops(31.5e9);
  r.set_peak_method("fp32 SGEMM 768^3 on 1 thread, best of 8 samples");
  r.set_peak_measured_unix_ms(1'796'000'000'000);
  absl::StatusOr<std::string> id = registry.Register(r);
  ASSERT_TRUE(id.ok()) << id.status();
  absl::StatusOr<WorkerRecord> w = registry.Get(*id);
  ASSERT_TRUE(w.ok());
  EXPECT_EQ(w->peak_method, "fp32 SGEMM 768^3 on 1 thread, best of 8 samples");
  EXPECT_EQ(w->peak_measured_unix_ms, 1'796'000'000'000);
  r.set_address("p:2");
  r.set_peak_method(std::string(513, 'x'));
  absl::StatusOr<std::string> long_method = registry.Register(r);
  EXPECT_EQ(long_method.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(long_method.status().message()), HasSubstr("peak_method"));
  r.set_peak_method("ok");
  r.set_peak_measured_unix_ms(-1);
  EXPECT_EQ(registry.Register(r).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(WorkerRegistryTest, SilentWorkersAreLostAndBusyOnesReported) {
  WorkerRegistry registry(50ms);
  auto a = registry.Register(RegistrationOf("a:1"));
  auto b = registry.Register(RegistrationOf("b:1"));
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
  EXPECT_EQ(*before.Register(RegistrationOf("a:1")), "w-1");
  WorkerRegistry after(1000ms, FirstWorkerId(2));
  EXPECT_EQ(*after.Register(RegistrationOf("b:1")), "w-1000001");
  EXPECT_EQ(after.Heartbeat("w-1").code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(after.Heartbeat("w-1000001").ok());
}

}  // namespace
}  // namespace tandem::coordinator
