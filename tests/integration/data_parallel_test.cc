// Data parallelism with real processes on 127.0.0.1: a job of 2 stages x 2 replicas on four
// workers trains to SUCCEEDED with falling loss and names every (stage, replica) in its status
// and its trace; SIGKILL of one of the four (sharded optimizer state) restarts the job from its
// checkpoint, and it ends with the uninterrupted run's losses; a gang that the registered workers
// cannot fill waits with a reason that says how many are missing.
#include <signal.h>

#include <chrono>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/integration/harness.h"

namespace tandem::testing {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;

constexpr int kSteps = 60;

std::string DataParallelJob(int stages, int replicas, int max_restarts, bool shard_state = false) {
  return absl::StrCat(
      "name: dp\nsteps: ", kSteps,
      "\nseed: 7\nmodel:\n  arch: mlp_lm\n  n_layer: 3\n  d_model: 32\n  d_embed: 8\n  context: 4\n"
      "optimizer:\n  lr: 0.01\n  shard_state: ",
      shard_state ? "true" : "false", "\npipeline:\n  stages: ", stages, "\n  replicas: ", replicas,
      "\n  micro_batch_size: 8\n  micro_batches: 2\n  schedule: 1f1b\n  partition: uniform\n"
      "checkpoint:\n  every: 10\n  keep: 2\nmax_restarts: ",
      max_restarts, "\n");
}

class DataParallelClusterTest : public ::testing::Test {
 protected:
  void StartCluster(int workers, const std::vector<std::string>& coordinator_args = {}) {
    Cluster::Options options;
    options.workers = workers;
    options.coordinator_args = {"--step-deadline-floor-ms=3000", "--restart-backoff-ms=100"};
    for (const std::string& a : coordinator_args) options.coordinator_args.push_back(a);
    cluster_ = std::make_unique<Cluster>(options);
    ASSERT_TRUE(cluster_->Start().ok());
  }

  void TearDown() override {
    if (HasFailure() && cluster_) {
      std::cerr << "coordinator log:\n" << ReadFile(cluster_->dir() + "/coordinator.log");
      for (int i = 0; i < cluster_->num_workers(); ++i) {
        std::cerr << "worker " << i << " log:\n" << ReadFile(cluster_->worker(i).log_path());
      }
    }
  }

  // The harness index of the worker at `address`.
  int WorkerAt(const std::string& address) {
    for (int i = 0; i < cluster_->num_workers(); ++i) {
      const std::string port = std::string(absl::StripAsciiWhitespace(
          ReadFile(absl::StrCat(cluster_->dir(), "/worker", i, ".port"))));
      if (!port.empty() && absl::EndsWith(address, ":" + port)) return i;
    }
    return -1;
  }

  std::unique_ptr<Cluster> cluster_;
};

TEST_F(DataParallelClusterTest, TwoStagesByTwoReplicasTrainAndShowTheirGrid) {
  // Two "nodes" (--node labels), their workers registered alternately: placement puts each
  // stage's two replicas on one node.
  StartCluster(0);
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(cluster_->AddWorker({i % 2 == 0 ? "--node=rack-a" : "--node=rack-b"}).ok());
  }
  auto id = cluster_->Submit(DataParallelJob(2, 2, 0));
  ASSERT_TRUE(id.ok()) << id.status();
  auto job = cluster_->WaitForEnd(*id, 180s);
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_EQ(job->state(), v1::SUCCEEDED) << job->reason();
  ASSERT_EQ(job->history_size(), kSteps);
  EXPECT_LT(job->history(kSteps - 1).loss(), job->history(0).loss() - 1.0);
  EXPECT_EQ(job->effective_batch(), 2 * 2 * 8);
  // Every (stage, replica) has its own worker.
  ASSERT_EQ(job->stages_size(), 2);
  std::set<std::string> workers;
  for (const v1::StageAssignment& s : job->stages()) {
    ASSERT_EQ(s.replicas_size(), 2);
    EXPECT_EQ(s.replicas(0).worker_id(), s.worker_id());
    for (const v1::ReplicaWorker& w : s.replicas()) workers.insert(w.worker_id());
  }
  EXPECT_EQ(workers.size(), 4u);
  auto registered = cluster_->Workers();
  ASSERT_TRUE(registered.ok()) << registered.status();
  std::map<std::string, std::string> node_of;
  for (const v1::WorkerInfo& w : *registered) node_of[w.worker_id()] = w.node();
  for (const v1::StageAssignment& s : job->stages()) {
    EXPECT_EQ(node_of[s.replicas(0).worker_id()], node_of[s.replicas(1).worker_id()])
        << "stage " << s.stage() << "'s data-parallel group spans two nodes";
    EXPECT_THAT(node_of[s.worker_id()], ::testing::StartsWith("rack-"));
  }
  EXPECT_NE(node_of[job->stages(0).worker_id()], node_of[job->stages(1).worker_id()]);
  // The gradients were reduced every step, and most of the reduction hid under compute or ran
  // beside it (the figure itself is the benchmark's; here: it is reported).
  const v1::StepSummary& last = job->history(kSteps - 1);
  EXPECT_GT(last.reduced_bytes(), 0);
  EXPECT_EQ(last.stage_reduce_seconds_size(), 2);

  CommandResult status = cluster_->Cli({"status", *id, "-o", "json"});
  ASSERT_EQ(status.exit_code, 0) << status.err;
  const nlohmann::json j = nlohmann::json::parse(status.out);
  ASSERT_EQ(j["stages"].size(), 2u);
  for (const auto& s : j["stages"]) ASSERT_EQ(s["replicas"].size(), 2u) << status.out;
  CommandResult table = cluster_->Cli({"status", *id});
  ASSERT_EQ(table.exit_code, 0) << table.err;
  EXPECT_THAT(table.out, HasSubstr("2 stages x 2 replicas = 4 workers"));
  EXPECT_THAT(table.out, HasSubstr("Workers (stage x replica)"));
  EXPECT_THAT(table.out, HasSubstr("REPLICA 1"));
  EXPECT_THAT(table.out, HasSubstr("Gradient reduction"));

  const std::string trace = cluster_->dir() + "/dp-trace.json";
  CommandResult r = cluster_->Cli({"trace", *id, "-o", trace});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string text = ReadFile(trace);
  for (int replica : {0, 1}) {
    for (int stage : {0, 1}) {
      EXPECT_THAT(text, HasSubstr(absl::StrCat("stage ", stage, " of replica ", replica, ": ")));
    }
  }
  EXPECT_THAT(text, HasSubstr(R"("name":"REDUCE_GRAD","cat":"reduction")"));
}

// With sharded optimizer state, so that the checkpoints it resumes from were gathered from
// both replicas' segments and are split again on load.
// Through the step relay (on from 2 workers: the coordinator calls ranks 0 and 2, which forward
// each step to 1 and 3), so that a worker lost behind a relaying worker is caught too.
TEST_F(DataParallelClusterTest, AKilledWorkerRestartsTheGangWhichEndsWithTheSameLosses) {
  StartCluster(5, {"--step_relay_min_workers=2"});  // four for the job, one spare
  auto ref_id = cluster_->Submit(DataParallelJob(2, 2, 0, /*shard_state=*/true));
  ASSERT_TRUE(ref_id.ok()) << ref_id.status();
  auto reference = cluster_->WaitForEnd(*ref_id, 180s);
  ASSERT_TRUE(reference.ok() && reference->state() == v1::SUCCEEDED) << reference->reason();

  auto id = cluster_->Submit(DataParallelJob(2, 2, 3, /*shard_state=*/true));
  ASSERT_TRUE(id.ok()) << id.status();
  ASSERT_TRUE(cluster_->WaitForSteps(*id, 25));
  auto running = cluster_->GetJob(*id);
  ASSERT_TRUE(running.ok());
  // A worker of replica 1 (not the one that writes checkpoints).
  const int victim = WorkerAt(running->stages(1).replicas(1).address());
  ASSERT_GE(victim, 0);
  cluster_->worker(victim).Kill(SIGKILL);

  auto end = cluster_->WaitForEnd(*id, 180s);
  ASSERT_TRUE(end.ok()) << end.status();
  ExpectTheReferenceRun(*end, *reference, kSteps);
  EXPECT_EQ(end->restarts(), 1);
  EXPECT_THAT(end->first_failure(), HasSubstr("of replica"));
  EXPECT_THAT(ReadFile(cluster_->dir() + "/coordinator.log"),
              HasSubstr(*id + ": attempt 1 resumes from its checkpoint after step "));
  EXPECT_THAT(ReadFile(cluster_->dir() + "/coordinator.log"),
              HasSubstr(*id + ": the step relay: 2 group(s) of up to 2 workers"));
}

TEST_F(DataParallelClusterTest, AGangTheWorkersCannotFillWaitsSayingHowManyAreMissing) {
  StartCluster(3);
  auto id = cluster_->Submit(DataParallelJob(2, 2, 0));
  ASSERT_TRUE(id.ok()) << id.status();
  ASSERT_TRUE(WaitFor(
      [&] {
        auto j = cluster_->GetJob(*id);
        return j.ok() && absl::StrContains(j->reason(), "more must register");
      },
      10s));
  auto job = cluster_->GetJob(*id);
  ASSERT_TRUE(job.ok());
  EXPECT_EQ(job->state(), v1::QUEUED);
  EXPECT_THAT(job->reason(), HasSubstr("waiting for 4 idle cpu workers (2 stages x 2 replicas): "
                                       "3 registered and alive, 3 idle; 1 more must register"));
  // The fourth worker arrives: the job runs.
  ASSERT_TRUE(cluster_->AddWorker().ok());
  auto end = cluster_->WaitForEnd(*id, 180s);
  ASSERT_TRUE(end.ok()) << end.status();
  EXPECT_EQ(end->state(), v1::SUCCEEDED) << end->reason();
}

}  // namespace
}  // namespace tandem::testing
