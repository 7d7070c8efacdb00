// Worker faults with real processes on 127.0.0.1: a worker killed (SIGKILL) or hung (SIGSTOP)
// mid-run is detected, the job's run is aborted on every worker, and the job restarts by itself
// from its latest checkpoint on the workers available (a spare here). Its losses after
// recovery equal an uninterrupted run's (the same data, the same restored state), no step is
// recorded twice, and a bounded chaos loop ends with the fault-free run's parameters.
#include <signal.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/safetensors.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/harness.h"

namespace tandem::testing {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;

constexpr int kSteps = 200;

// A 2-stage job that checkpoints every 10 steps; restarts as the spec allows.
std::string Job(int max_restarts, int steps = kSteps) {
  return TinyJobYaml(
      2, 4, steps, "1f1b",
      absl::StrCat("checkpoint:\n  every: 10\n  keep: 2\nmax_restarts: ", max_restarts, "\n"));
}

class RecoveryTest : public ::testing::Test {
 protected:
  void StartCluster(int workers, std::vector<std::string> coordinator_args = {}) {
    Cluster::Options options;
    options.workers = workers;
    // A hang with live heartbeats is caught by the step deadline; keep its floor short here.
    options.coordinator_args = {"--step-deadline-floor-ms=2000", "--restart-backoff-ms=100"};
    for (std::string& a : coordinator_args) options.coordinator_args.push_back(std::move(a));
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

  // The fault-free run every test compares with.
  v1::Job Reference(int steps = kSteps) {
    auto id = cluster_->Submit(Job(0, steps));
    EXPECT_TRUE(id.ok()) << id.status();
    auto job = cluster_->WaitForEnd(*id, 120s);
    EXPECT_TRUE(job.ok() && job->state() == v1::SUCCEEDED) << job->reason();
    return *job;
  }

  // Whether `n` workers are registered and idle within 10 s.
  bool WaitForIdleWorkers(int n) {
    return WaitFor(
        [&] {
          auto workers = cluster_->Workers();
          if (!workers.ok()) return false;
          int idle = 0;
          for (const auto& w : *workers) idle += w.state() == v1::IDLE;
          return idle == n;
        },
        10s);
  }

  // The harness index of the worker serving `stage` of the job.
  int WorkerOfStage(const std::string& job_id, int stage) {
    auto job = cluster_->GetJob(job_id);
    if (!job.ok()) return -1;
    for (const v1::StageAssignment& s : job->stages()) {
      if (s.stage() != stage) continue;
      for (int i = 0;; ++i) {
        const std::string port = std::string(absl::StripAsciiWhitespace(
            ReadFile(absl::StrCat(cluster_->dir(), "/worker", i, ".port"))));
        if (port.empty()) return -1;
        if (absl::EndsWith(s.address(), ":" + port)) return i;
      }
    }
    return -1;
  }

  static void ExpectTheReferenceRun(const v1::Job& job, const v1::Job& reference) {
    testing::ExpectTheReferenceRun(job, reference, kSteps);
  }

  std::unique_ptr<Cluster> cluster_;
};

TEST_F(RecoveryTest, AKilledWorkerIsReplacedAndTheJobResumesFromItsCheckpoint) {
  StartCluster(3);  // two for the job, one spare
  const v1::Job reference = Reference();
  auto id = cluster_->Submit(Job(3));
  ASSERT_TRUE(id.ok()) << id.status();
  ASSERT_TRUE(cluster_->WaitForSteps(*id, 35));
  const int victim = WorkerOfStage(*id, 1);
  ASSERT_GE(victim, 0);
  cluster_->worker(victim).Kill(SIGKILL);

  auto end = cluster_->WaitForEnd(*id, 120s);
  ASSERT_TRUE(end.ok()) << end.status();
  ExpectTheReferenceRun(*end, reference);
  EXPECT_EQ(end->restarts(), 1);
  EXPECT_THAT(end->first_failure(), HasSubstr("stage 1"));
  // It resumed from a checkpoint, not from the start.
  EXPECT_THAT(ReadFile(cluster_->dir() + "/coordinator.log"),
              HasSubstr(*id + ": attempt 1 resumes from its checkpoint after step "));
  for (const v1::StageAssignment& s : end->stages()) {
    EXPECT_NE(WorkerOfStage(*id, s.stage()), victim) << "the dead worker serves no stage";
  }
}

// The coordinator's own disk refusing a checkpoint (here a file where the checkpoint's directory
// goes) is no fault of the workers: the checkpoint is skipped with a warning, each worker's
// checkpoint stream is read to its end (so its call is over before the next step reaches it),
// and the job trains on to the reference run's losses with no restart.
TEST_F(RecoveryTest, ACheckpointTheCoordinatorCannotStoreIsSkippedAndTheJobTrainsOn) {
  StartCluster(2);
  constexpr int kShort = 40;
  const v1::Job reference = Reference(kShort);
  int64_t n = 0;
  ASSERT_TRUE(absl::SimpleAtoi(absl::StripPrefix(reference.id(), "job-"), &n)) << reference.id();
  const std::string next = absl::StrCat("job-", n + 1);
  const std::string dir = absl::StrCat(cluster_->data_root(), "/checkpoints/", next);
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/step-19") << "in the way";  // the checkpoint after step 20

  auto id = cluster_->Submit(Job(/*max_restarts=*/2, kShort));
  ASSERT_TRUE(id.ok()) << id.status();
  ASSERT_EQ(*id, next);
  auto end = cluster_->WaitForEnd(*id, 120s);
  ASSERT_TRUE(end.ok()) << end.status();
  testing::ExpectTheReferenceRun(*end, reference, kShort);
  EXPECT_EQ(end->restarts(), 0);
  EXPECT_EQ(end->checkpoint_step(), kShort - 1);
  EXPECT_EQ(end->checkpoint_failures(), 1);
  EXPECT_THAT(end->last_checkpoint_failure(),
              HasSubstr("checkpoint after step 20 not stored (cannot create "));
  EXPECT_THAT(end->last_checkpoint_failure(),
              HasSubstr("the job trains on, its latest checkpoint after step 10"));
}

// A coordinator that must keep more of its disk free than it has (--checkpoint-min-free-mb)
// refuses every checkpoint before a byte of it is written: the first is skipped and the job
// trains on; the final one, tried again, fails the job without a restart, saying why.
TEST_F(RecoveryTest, ACheckpointTheDiskHasNoRoomForIsRefusedBeforeAnyOfItIsWritten) {
  StartCluster(2, {absl::StrCat("--checkpoint-min-free-mb=", int64_t{1} << 40)});
  constexpr int kShort = 20;
  auto id = cluster_->Submit(Job(/*max_restarts=*/2, kShort));
  ASSERT_TRUE(id.ok()) << id.status();
  auto end = cluster_->WaitForEnd(*id, 120s);
  ASSERT_TRUE(end.ok()) << end.status();
  EXPECT_EQ(end->state(), v1::FAILED);
  EXPECT_EQ(end->restarts(), 0);
  EXPECT_EQ(end->steps_done(), kShort);
  EXPECT_EQ(end->checkpoint_failures(), 2);
  EXPECT_THAT(end->reason(),
              HasSubstr("the final checkpoint (after step 20) was not stored after 3 tries ("));
  EXPECT_THAT(end->reason(), HasSubstr("stage-0.safetensors needs "));
  EXPECT_THAT(end->reason(), HasSubstr("keeps 1073741824.0 GiB free for the job store"));
  EXPECT_THAT(end->reason(), HasSubstr("it has no checkpoint to resume from"));
  std::error_code ec;
  EXPECT_FALSE(std::filesystem::exists(
      absl::StrCat(cluster_->data_root(), "/checkpoints/", *id, "/step-9"), ec));
}

TEST_F(RecoveryTest, AHungWorkerIsDetectedInTimeAndWakingItCorruptsNothing) {
  StartCluster(3);
  const v1::Job reference = Reference();
  auto id = cluster_->Submit(Job(3));
  ASSERT_TRUE(id.ok()) << id.status();
  ASSERT_TRUE(cluster_->WaitForSteps(*id, 35));
  const int victim = WorkerOfStage(*id, 0);
  ASSERT_GE(victim, 0);
  cluster_->worker(victim).Kill(SIGSTOP);
  absl::StatusOr<double> detected = cluster_->SecondsUntilRestart(*id, 20s);
  ASSERT_TRUE(detected.ok()) << detected.status();
  EXPECT_LT(*detected, 10.0) << "a hang is detected within 10 s";
  // Let the job get going on the spare, then wake the hung worker: its late answers belong
  // to the aborted run and are refused.
  ASSERT_TRUE(WaitFor(
      [&] {
        auto j = cluster_->GetJob(*id);
        return j.ok() && j->state() == v1::RUNNING && j->steps_done() > 45;
      },
      60s, 5ms));
  cluster_->worker(victim).Kill(SIGCONT);

  auto end = cluster_->WaitForEnd(*id, 120s);
  ASSERT_TRUE(end.ok()) << end.status();
  ExpectTheReferenceRun(*end, reference);
  EXPECT_EQ(end->restarts(), 1);
  // Its heartbeats stop (1.5 s here) or its step passes the deadline (2 s floor here): either
  // may see it first on a loaded machine.
  EXPECT_THAT(end->first_failure(),
              ::testing::AnyOf(HasSubstr("no heartbeat"), HasSubstr("timed out")));
  // The woken worker registers as idle again and can take work.
  EXPECT_TRUE(WaitForIdleWorkers(3));
}

// Regression (issue 26): a configuration error that no restart can fix fails the job at once,
// with the worker's error naming the file, rather than restarting it max_restarts times, each
// run failing identically.
TEST_F(RecoveryTest, AMissingDataFileFailsTheJobAtOnceNamingTheFile) {
  StartCluster(2);
  auto id = cluster_->Submit(TinyJobYaml(
      2, 4, 10, "1f1b", "max_restarts: 3\ndata:\n  source: file\n  path: corpora/missing.txt\n"));
  ASSERT_TRUE(id.ok()) << id.status();
  auto end = cluster_->WaitForEnd(*id, 60s);
  ASSERT_TRUE(end.ok()) << end.status();
  EXPECT_EQ(end->state(), v1::FAILED) << end->reason();
  EXPECT_EQ(end->restarts(), 0) << end->reason();
  EXPECT_EQ(end->first_failure(), "");
  EXPECT_THAT(end->reason(), HasSubstr("configure: "));
  EXPECT_THAT(end->reason(), HasSubstr("NOT_FOUND"));
  EXPECT_THAT(end->reason(), HasSubstr("data.path 'corpora/missing.txt': " + cluster_->dir() +
                                       "/corpora/missing.txt does not exist under the worker's "
                                       "data root"));
  EXPECT_THAT(ReadFile(cluster_->dir() + "/coordinator.log"),
              ::testing::Not(HasSubstr(*id + ": restart 1 of 3")));
  // Its workers are released.
  EXPECT_TRUE(WaitForIdleWorkers(2));
}

// A worker woken after its job moved on writes to Gloo sockets its peers have closed; the
// write must fail with EPIPE, not kill the daemon with SIGPIPE (the default disposition).
TEST_F(RecoveryTest, ABrokenPipeKillsNoDaemon) {
  StartCluster(2);
  cluster_->coordinator().Kill(SIGPIPE);
  for (int i = 0; i < cluster_->num_workers(); ++i) cluster_->worker(i).Kill(SIGPIPE);
  auto id = cluster_->Submit(TinyJobYaml(2, 2, 3, "1f1b"));
  ASSERT_TRUE(id.ok()) << id.status();
  auto end = cluster_->WaitForEnd(*id, 60s);
  ASSERT_TRUE(end.ok()) << end.status();
  EXPECT_EQ(end->state(), v1::SUCCEEDED) << end->reason();
  EXPECT_TRUE(cluster_->coordinator().Running());
  for (int i = 0; i < cluster_->num_workers(); ++i) {
    EXPECT_TRUE(cluster_->worker(i).Running()) << "worker " << i;
  }
}

// The tensors of the job's latest checkpoint, by name (stage files merged).
std::map<std::string, std::string> FinalTensors(const std::string& data_root, const v1::Job& job) {
  std::map<std::string, std::string> out;
  const std::string dir =
      absl::StrCat(data_root, "/checkpoints/", job.id(), "/step-", job.checkpoint_step());
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() != ".safetensors") continue;
    auto file = SafetensorsFile::Open(entry.path().string());
    EXPECT_TRUE(file.ok()) << file.status();
    if (!file.ok()) continue;
    for (const TensorInfo& t : (*file)->tensors()) {
      auto data = (*file)->Data(t.name);
      out[t.name] = std::string(reinterpret_cast<const char*>(data->data()), data->size());
    }
  }
  return out;
}

TEST_F(RecoveryTest, AChaosLoopEndsSucceededWithTheFaultFreeParameters) {
  StartCluster(4);  // two for the job, two spares
  // Long enough that all the faults land before the end: a tiny step takes a few milliseconds,
  // and with the restart backoff back to its base after each run that trained, 200 steps could
  // end before the fourth fault's window under a loaded machine.
  constexpr int kChaosSteps = 800;
  const v1::Job reference = Reference(kChaosSteps);
  auto id = cluster_->Submit(Job(6, kChaosSteps));
  ASSERT_TRUE(id.ok()) << id.status();
  constexpr int kFaults = 4;
  for (int fault = 0; fault < kFaults; ++fault) {
    // A fault every few steps of progress: kill one of the job's workers, alternately each
    // stage's, and start a fresh worker so that a spare is always there. The kill comes a few
    // steps past a checkpoint (work to redo), and the window is 8 of every 10 steps: a tiny
    // job's steps take a few milliseconds, so a narrower one can slip between two polls.
    ASSERT_TRUE(WaitFor(
        [&] {
          auto j = cluster_->GetJob(*id);
          return j.ok() && j->state() == v1::RUNNING && j->restarts() == fault &&
                 j->steps_done() >= j->checkpoint_step() + 3;
        },
        60s, 5ms))
        << "fault " << fault;
    const int victim = WorkerOfStage(*id, fault % 2);
    ASSERT_GE(victim, 0);
    cluster_->worker(victim).Kill(SIGKILL);
    ASSERT_TRUE(cluster_->AddWorker().ok());
  }
  auto end = cluster_->WaitForEnd(*id, 180s);
  ASSERT_TRUE(end.ok()) << end.status();
  testing::ExpectTheReferenceRun(*end, reference, kChaosSteps);
  EXPECT_EQ(end->restarts(), kFaults);
  // The final parameters and optimizer state are the fault-free run's, bit for bit.
  const auto got = FinalTensors(cluster_->data_root(), *end);
  const auto want = FinalTensors(cluster_->data_root(), reference);
  ASSERT_FALSE(want.empty());
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [name, bytes] : want) {
    ASSERT_TRUE(got.count(name)) << name;
    EXPECT_TRUE(got.at(name) == bytes) << name << " differs";
  }
}

}  // namespace
}  // namespace tandem::testing
