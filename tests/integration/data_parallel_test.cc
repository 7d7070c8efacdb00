// Data parallelism with real processes on 127.0.0.1: a job of 2 stages x 2 replicas on four
// workers trains to SUCCEEDED with falling loss and names every (stage, replica) in its status
// and its trace; SIGKILL of one of the four (sharded optimizer state) restarts the job from its
// checkpoint, and it ends with the uninterrupted run's losses; a gang that the registered workers
// cannot fill waits with a reason that says how many are missing; a chaos loop of kills that a
// surviving replica covers resumes from the survivors' state each time and redoes no step.
#include <signal.h>

#include <chrono>
#include <cmath>
#include <map>
#include <random>
#include <set>
#include <string>
#include <thread>
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

// Peer recovery under chaos: a 2 x 2 job on five workers (one spare), its checkpoints far
// apart, loses a random worker of its gang at a random step, three times: the first two with a
// spare to take its place (a fresh worker is started after the first), the third with none, so
// that the job waits QUEUED until a fresh worker registers. Every
// fault is covered by the dead worker's surviving replica, so the job resumes each time from
// the state its survivors kept after the last completed step: it redoes no step and ends with
// the fault-free run's losses, bit for bit.
TEST_F(DataParallelClusterTest, AChaosLoopThatReplicasCoverRedoesNoStep) {
  constexpr int kChaosSteps = 400;
  auto job = [&](int max_restarts) {
    return absl::StrCat(
        "name: dp-chaos\nsteps: ", kChaosSteps,
        "\nseed: 7\nmodel:\n  arch: mlp_lm\n  n_layer: 3\n  d_model: 32\n  d_embed: 8\n"
        "  context: 4\noptimizer:\n  lr: 0.01\npipeline:\n  stages: 2\n  replicas: 2\n"
        "  micro_batch_size: 8\n  micro_batches: 2\n  schedule: 1f1b\n  partition: uniform\n"
        "checkpoint:\n  every: 200\n  keep: 2\nmax_restarts: ",
        max_restarts, "\n");
  };
  StartCluster(5);  // four for the job, one spare
  auto ref_id = cluster_->Submit(job(0));
  ASSERT_TRUE(ref_id.ok()) << ref_id.status();
  auto reference = cluster_->WaitForEnd(*ref_id, 300s);
  ASSERT_TRUE(reference.ok() && reference->state() == v1::SUCCEEDED) << reference->reason();

  auto id = cluster_->Submit(job(5));
  ASSERT_TRUE(id.ok()) << id.status();
  std::mt19937 random(20261205);
  constexpr int kFaults = 3;
  int64_t progress = 0;
  for (int fault = 0; fault < kFaults; ++fault) {
    // Some steps past the last fault's resume (a kill is never in the previous run's window).
    const int64_t at = progress + std::uniform_int_distribution<int>(5, 40)(random);
    ASSERT_TRUE(WaitFor(
        [&] {
          auto j = cluster_->GetJob(*id);
          return j.ok() && j->state() == v1::RUNNING && j->restarts() == fault &&
                 j->steps_done() >= at;
        },
        120s, 2ms))
        << "fault " << fault;
    auto running = cluster_->GetJob(*id);
    ASSERT_TRUE(running.ok());
    const int stage = std::uniform_int_distribution<int>(0, 1)(random);
    const int replica = std::uniform_int_distribution<int>(0, 1)(random);
    const int victim = WorkerAt(running->stages(stage).replicas(replica).address());
    ASSERT_GE(victim, 0);
    cluster_->worker(victim).Kill(SIGKILL);
    if (fault == kFaults - 1) {
      // No spare this time: the job waits for a worker, its survivors keeping their state.
      ASSERT_TRUE(WaitFor(
          [&] {
            auto j = cluster_->GetJob(*id);
            return j.ok() && j->state() == v1::QUEUED && j->restarts() == fault + 1;
          },
          60s, 5ms));
      std::this_thread::sleep_for(500ms);
      auto waiting = cluster_->GetJob(*id);
      ASSERT_TRUE(waiting.ok());
      EXPECT_EQ(waiting->state(), v1::QUEUED) << "three workers cannot run a 2 x 2 gang";
      EXPECT_TRUE(waiting->has_peer_state());
    }
    // A fresh worker after the first and the last fault; after the second the spare takes
    // the dead one's place, and none is left for the third.
    if (fault != 1) {
      ASSERT_TRUE(cluster_->AddWorker().ok());
    }
    auto resumed = cluster_->GetJob(*id);
    ASSERT_TRUE(resumed.ok());
    progress = std::max<int64_t>(at, resumed->steps_done());
  }
  auto end = cluster_->WaitForEnd(*id, 300s);
  ASSERT_TRUE(end.ok()) << end.status();
  ExpectTheReferenceRun(*end, *reference, kChaosSteps);
  EXPECT_EQ(end->restarts(), kFaults);
  EXPECT_EQ(end->peer_recoveries(), kFaults) << "every fault resumed from the survivors";
  EXPECT_EQ(end->steps_redone(), 0) << "only the steps in flight ran again";
  EXPECT_EQ(end->checkpoint_step(), 399);
  EXPECT_THAT(ReadFile(cluster_->dir() + "/coordinator.log"),
              HasSubstr("surviving worker(s) kept after step "));
}

// An elastic 2 x 2 job loses a worker with no spare: it is re-planned on the three left, whose
// stages cut the layers elsewhere, and each of them reads its layers from the survivors' kept
// state (from whichever holds each tensor): no step is redone, and the losses are the fault-free
// run's (within 1e-5: another P sums in another order).
TEST_F(DataParallelClusterTest, AnElasticJobShrinksOntoItsSurvivorsAndTakesTheirState) {
  constexpr int kElasticSteps = 200;
  auto job = [&](const std::string& elastic) {
    return absl::StrCat(
        "name: dp-elastic\nsteps: ", kElasticSteps,
        "\nseed: 7\nmodel:\n  arch: mlp_lm\n  n_layer: 4\n  d_model: 32\n  d_embed: 8\n"
        "  context: 4\noptimizer:\n  lr: 0.01\npipeline:\n  stages: 2\n  replicas: 2\n"
        "  micro_batch_size: 8\n  micro_batches: 6\n  schedule: 1f1b\n  partition: uniform\n"
        "checkpoint:\n  every: 150\n  keep: 2\nmax_restarts: 3\n",
        elastic);
  };
  StartCluster(4);
  auto ref_id = cluster_->Submit(job(""));
  ASSERT_TRUE(ref_id.ok()) << ref_id.status();
  auto reference = cluster_->WaitForEnd(*ref_id, 300s);
  ASSERT_TRUE(reference.ok() && reference->state() == v1::SUCCEEDED) << reference->reason();

  auto id = cluster_->Submit(job("elastic:\n  min_workers: 2\n"));
  ASSERT_TRUE(id.ok()) << id.status();
  ASSERT_TRUE(cluster_->WaitForSteps(*id, 30));
  auto running = cluster_->GetJob(*id);
  ASSERT_TRUE(running.ok());
  const int victim = WorkerAt(running->stages(1).replicas(0).address());
  ASSERT_GE(victim, 0);
  cluster_->worker(victim).Kill(SIGKILL);

  auto end = cluster_->WaitForEnd(*id, 300s);
  ASSERT_TRUE(end.ok()) << end.status();
  ASSERT_EQ(end->state(), v1::SUCCEEDED) << end->reason();
  ASSERT_EQ(end->history_size(), kElasticSteps);
  for (int i = 0; i < kElasticSteps; ++i) {
    const double want = reference->history(i).loss();
    EXPECT_NEAR(end->history(i).loss(), want, 1e-5 * std::fabs(want)) << "step " << i + 1;
  }
  ASSERT_EQ(end->resizes_size(), 1) << end->DebugString();
  const v1::ResizeEvent& shrink = end->resizes(0);
  EXPECT_EQ(shrink.from_workers(), 4);
  EXPECT_EQ(shrink.to_workers(), 3);
  EXPECT_THAT(shrink.state_source(), HasSubstr("kept state after step "));
  EXPECT_EQ(shrink.steps_redone(), 0);
  EXPECT_EQ(end->peer_recoveries(), 1);
  EXPECT_EQ(end->steps_redone(), 0);
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
