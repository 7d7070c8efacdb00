// What a Kubernetes deployment relies on, checked against the real daemons on 127.0.0.1: the
// plaintext health port (--health-listen) and what it reports, finding the coordinator through
// $TANDEM_COORDINATOR, and workers that advertise a host name instead of an IP address.
#include <grpcpp/generic/generic_stub.h>
#include <signal.h>

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/rpc.h"
#include "gtest/gtest.h"
#include "tests/integration/harness.h"

namespace tandem::testing {
namespace {

using namespace std::chrono_literals;

constexpr int kServing = 1;
constexpr int kNotServing = 2;

bool HealthIs(const std::string& address, const std::string& service, grpc::StatusCode code,
              int status = 0) {
  const HealthAnswer a = CheckHealth(MakeInsecureChannel(address), service);
  return a.code == code && a.status == status;
}

std::string ReadPort(const std::string& path) {
  return std::string(absl::StripAsciiWhitespace(ReadFile(path)));
}

class DeployTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir_template[] = "/tmp/tandem-deploy-XXXXXX";
    dir_ = mkdtemp(dir_template);
  }
  void TearDown() override {
    if (HasFailure()) {
      for (const char* log : {"coordinator.log", "worker.log"}) {
        std::cerr << log << ":\n" << ReadFile(dir_ + "/" + log);
      }
    }
    coordinator_.reset();
    worker_.reset();
    (void)!std::system(("rm -rf '" + dir_ + "'").c_str());
  }
  // Starts the coordinator on `listen` with a health port; returns "HOST:PORT" of each.
  void StartCoordinator(const std::string& listen) {
    std::remove((dir_ + "/c.port").c_str());
    std::remove((dir_ + "/c.health").c_str());
    coordinator_ = std::make_unique<Process>(
        std::string(TANDEM_BIN_DIR) + "/tandem-coordinator",
        std::vector<std::string>{"--listen=" + listen, "--port-file=" + dir_ + "/c.port",
                                 "--health-listen=127.0.0.1:0",
                                 "--health-port-file=" + dir_ + "/c.health", "--heartbeat-ms=200",
                                 "--worker-timeout-ms=1500"},
        dir_ + "/coordinator.log");
    ASSERT_TRUE(WaitFor([&] { return !ReadFile(dir_ + "/c.port").empty(); }, 20s));
    api_ = "127.0.0.1:" + ReadPort(dir_ + "/c.port");
    health_ = "127.0.0.1:" + ReadPort(dir_ + "/c.health");
  }

  std::string dir_;
  std::unique_ptr<Process> coordinator_;
  std::unique_ptr<Process> worker_;
  std::string api_, health_;
};

TEST_F(DeployTest, CoordinatorHealthPortServesOnceReady) {
  StartCoordinator("127.0.0.1:0");
  // The port file is written once the API serves; readiness follows at once.
  EXPECT_TRUE(WaitFor([&] { return HealthIs(health_, "", grpc::StatusCode::OK, kServing); }, 5s));
  EXPECT_TRUE(HealthIs(health_, "tandem.v1.Coordinator", grpc::StatusCode::OK, kServing));
  EXPECT_TRUE(HealthIs(health_, "liveness", grpc::StatusCode::OK, kServing));
  EXPECT_TRUE(HealthIs(health_, "no.such.Service", grpc::StatusCode::NOT_FOUND));
  // The health port is its own: it serves nothing but health.
  EXPECT_NE(health_, api_);
  coordinator_->Kill(SIGTERM);
  EXPECT_EQ(coordinator_->Wait(), 0);
}

// The worker finds the coordinator through $TANDEM_COORDINATOR (no --coordinator flag), and
// its health port says SERVING exactly while it is registered: not before the coordinator
// is up, not while the coordinator is gone, and again once it has re-registered.
TEST_F(DeployTest, WorkerHealthFollowsRegistrationWithTheCoordinatorFromTheEnvironment) {
  // A port the coordinator will use, free for now: start one to pick it, then stop it.
  StartCoordinator("127.0.0.1:0");
  const std::string port = ReadPort(dir_ + "/c.port");
  coordinator_->Kill(SIGKILL);
  coordinator_->Wait();

  worker_ = std::make_unique<Process>(
      "/usr/bin/env",
      std::vector<std::string>{
          "TANDEM_COORDINATOR=127.0.0.1:" + port, std::string(TANDEM_BIN_DIR) + "/tandem-worker",
          "--listen=127.0.0.1:0", "--device=cpu", "--data-root=" + dir_,
          "--health-listen=127.0.0.1:0", "--health-port-file=" + dir_ + "/w.health"},
      dir_ + "/worker.log");
  ASSERT_TRUE(WaitFor([&] { return !ReadFile(dir_ + "/w.health").empty(); }, 20s));
  const std::string whealth = "127.0.0.1:" + ReadPort(dir_ + "/w.health");
  EXPECT_TRUE(HealthIs(whealth, "liveness", grpc::StatusCode::OK, kServing));
  EXPECT_TRUE(HealthIs(whealth, "", grpc::StatusCode::OK, kNotServing));
  EXPECT_TRUE(HealthIs(whealth, "tandem.v1.StageWorker", grpc::StatusCode::NOT_FOUND));

  StartCoordinator("127.0.0.1:" + port);
  // Registration retries back off up to 5 s.
  ASSERT_TRUE(WaitFor(
      [&] { return HealthIs(whealth, "tandem.v1.StageWorker", grpc::StatusCode::OK, kServing); },
      15s));
  EXPECT_TRUE(HealthIs(whealth, "", grpc::StatusCode::OK, kServing));

  coordinator_->Kill(SIGKILL);
  coordinator_->Wait();
  EXPECT_TRUE(WaitFor(
      [&] { return HealthIs(whealth, "tandem.v1.StageWorker", grpc::StatusCode::OK, kNotServing); },
      10s));
  EXPECT_TRUE(HealthIs(whealth, "", grpc::StatusCode::OK, kNotServing));
  EXPECT_TRUE(HealthIs(whealth, "liveness", grpc::StatusCode::OK, kServing));

  StartCoordinator("127.0.0.1:" + port);
  EXPECT_TRUE(WaitFor(
      [&] { return HealthIs(whealth, "tandem.v1.StageWorker", grpc::StatusCode::OK, kServing); },
      15s));
  worker_->Kill(SIGTERM);
  EXPECT_EQ(worker_->Wait(), 0);
}

TEST_F(DeployTest, WorkerWithoutACoordinatorAddressRefusesToStart) {
  worker_ = std::make_unique<Process>(
      "/usr/bin/env",
      std::vector<std::string>{"-u", "TANDEM_COORDINATOR",
                               std::string(TANDEM_BIN_DIR) + "/tandem-worker",
                               "--listen=127.0.0.1:0"},
      dir_ + "/worker.log");
  EXPECT_EQ(worker_->Wait(), 2);
  EXPECT_TRUE(absl::StrContains(ReadFile(dir_ + "/worker.log"), "TANDEM_COORDINATOR"));
}

// --device names a device this worker must be able to use, or it does not start: on a machine
// without a GPU, cuda:N fails with the reason (no CUDA device, or a build without CUDA).
TEST_F(DeployTest, WorkerRefusesADeviceItCannotUse) {
  const std::string bin = std::string(TANDEM_BIN_DIR) + "/tandem-worker";
  const CommandResult bad =
      RunCommand({bin, "--coordinator=127.0.0.1:1", "--listen=127.0.0.1:0", "--device=tpu"}, 30s);
  EXPECT_EQ(bad.exit_code, 2) << bad.err;
  EXPECT_TRUE(absl::StrContains(bad.err + bad.out, "--device=tpu")) << bad.err;
  const CommandResult gpu =
      RunCommand({bin, "--coordinator=127.0.0.1:1", "--listen=127.0.0.1:0", "--device=cuda:0"}, 5s);
  if (gpu.exit_code == 128 + SIGKILL) GTEST_SKIP() << "a usable GPU: the worker started";
  EXPECT_EQ(gpu.exit_code, 2) << gpu.err;
  const std::string said = gpu.err + gpu.out;
  EXPECT_TRUE(absl::StrContains(said, "no usable CUDA device") ||
              absl::StrContains(said, "no CUDA support"))
      << said;
}

// Workers registered under a host name (as pods register under their DNS names): the
// coordinator dials them by name, and the Gloo data plane binds to and connects through it.
TEST(HostnameTest, WorkersAdvertisingAHostNameRunAPipelineJob) {
  Cluster::Options options;
  options.workers = 2;
  options.worker_args = {"--advertise=localhost:0"};
  Cluster cluster(options);
  ASSERT_TRUE(cluster.Start().ok());
  auto workers = cluster.Workers();
  ASSERT_TRUE(workers.ok());
  ASSERT_EQ(workers->size(), 2u);
  for (const auto& w : *workers) EXPECT_TRUE(absl::StartsWith(w.address(), "localhost:"));
  auto id = cluster.Submit(TinyJobYaml(2, 4, 3));
  ASSERT_TRUE(id.ok()) << id.status();
  auto job = cluster.WaitForEnd(*id, 120s);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->state(), v1::SUCCEEDED) << job->reason() << "\n"
                                         << ReadFile(cluster.dir() + "/worker0.log");
}

}  // namespace
}  // namespace tandem::testing
