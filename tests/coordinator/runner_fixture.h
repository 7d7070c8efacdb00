// What the coordinator's job tests share: a worker's registration, a job spec of a given shape,
// and RunnerFixture, which runs jobs on fake workers (fake_worker_client.h) with an in-memory
// job store and a real worker registry.
#ifndef TANDEM_TESTS_COORDINATOR_RUNNER_FIXTURE_H_
#define TANDEM_TESTS_COORDINATOR_RUNNER_FIXTURE_H_

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/spec.h"
#include "coordinator/job_runner.h"
#include "coordinator/job_store.h"
#include "coordinator/worker_registry.h"
#include "gtest/gtest.h"
#include "tests/coordinator/fake_worker_client.h"

namespace tandem::coordinator {

// A one-thread worker's registration at `address`.
inline v1::RegisterRequest RegistrationOf(const std::string& address,
                                          const std::string& device = "cpu") {
  v1::RegisterRequest r;
  r.set_address(address);
  r.set_device(device);
  r.set_threads(1);
  return r;
}

// A job of `stages` stages and 4 micro-batches, `steps` steps long.
inline v1::JobSpec JobSpecOf(int stages, int steps, int max_restarts = 0) {
  auto spec =
      LoadJobSpecYaml(absl::StrCat("steps: ", steps, "\nmax_restarts: ", max_restarts,
                                   "\npipeline:\n  stages: ", stages, "\n  micro_batches: 4\n"));
  EXPECT_TRUE(spec.ok()) << spec.status();
  return *spec;
}

struct RunnerFixture {
  RunnerFixture() : registry(std::chrono::seconds(10)) {
    store = *JobStore::Open("", /*checkpoints=*/nullptr);
    env.store = store.get();
    env.registry = &registry;
    env.clients = &factory;
    env.options.abort_timeout = absl::Seconds(1);
  }
  std::unique_ptr<JobRunner> Start(const v1::JobSpec& spec) {
    const std::string id = *store->Add(spec);
    for (int i = 0; i < spec.pipeline().stages(); ++i) {
      (void)registry.Register(RegistrationOf(absl::StrCat("127.0.0.1:", 1000 + i)));
    }
    auto gang = registry.Allocate("cpu", spec.pipeline().stages(), id);
    EXPECT_TRUE(gang.ok());
    workers = *gang;
    auto runner = std::make_unique<JobRunner>(env, *store->Get(id), *gang);
    runner->Start();
    return runner;
  }
  void WaitFinished(JobRunner& r) {
    for (int i = 0; i < 500 && !r.finished(); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    ASSERT_TRUE(r.finished());
  }
  std::unique_ptr<JobStore> store;
  WorkerRegistry registry;
  FakeFactory factory;
  RunnerEnv env;
  std::vector<WorkerRecord> workers;  // the last gang allocated
};

}  // namespace tandem::coordinator

#endif  // TANDEM_TESTS_COORDINATOR_RUNNER_FIXTURE_H_
