// Tests of the JobStore: its states, events and restarts, and its persistence in SQLite: what a
// reopened store holds, what it does with jobs a killed coordinator left running, and that a
// store killed at any moment reopens as a consistent prefix of what it was told.
#include "coordinator/job_store.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/spec.h"
#include "coordinator/checkpoint_store.h"
#include "coordinator/prediction_check.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "tests/coordinator/runner_fixture.h"

namespace tandem::coordinator {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

class JobStorePersistenceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir_template[] = "/tmp/tandem-jobstore-XXXXXX";
    dir_ = mkdtemp(dir_template);
    checkpoints_.emplace(dir_ + "/checkpoints");
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::unique_ptr<JobStore> Open() {
    auto store = JobStore::Open(dir_, &*checkpoints_);
    EXPECT_TRUE(store.ok()) << store.status();
    return store.ok() ? *std::move(store) : nullptr;
  }

  // A complete one-stage checkpoint of (job, step) on disk, manifest included.
  void WriteCheckpoint(const std::string& job, int64_t step) {
    CheckpointStore checkpoints(dir_ + "/checkpoints");
    const float x = static_cast<float>(step);
    auto w = checkpoints.BeginStage(job, step, 0, {{"t", "F32", {1}}});
    ASSERT_TRUE(w.ok()) << w.status();
    ASSERT_TRUE((*w)->Append(&x, sizeof(x)).ok());
    ASSERT_TRUE((*w)->Commit().ok());
    ASSERT_TRUE(checkpoints.Commit(job, step, 1, /*keep=*/10).ok());
  }

  std::string dir_;
  std::optional<CheckpointStore> checkpoints_;  // of dir_, set by SetUp
};

v1::JobSpec Spec(int steps) {
  auto spec = LoadJobSpecYaml(absl::StrCat("steps: ", steps, "\npipeline:\n  stages: 1\n"));
  EXPECT_TRUE(spec.ok()) << spec.status();
  return *spec;
}

v1::StepSummary Step(int64_t step, double loss, bool skipped = false) {
  v1::StepSummary s;
  s.set_step(step);
  s.set_loss(loss);
  s.set_skipped(skipped);
  return s;
}

std::vector<v1::StageAssignment> OneStage() {
  v1::StageAssignment a;
  a.set_stage(0);
  a.set_rank(0);
  a.set_worker_id("w-1");
  a.set_address("127.0.0.1:1");
  return {a};
}

std::vector<int64_t> Steps(const v1::Job& job) {
  std::vector<int64_t> out;
  for (const auto& s : job.history()) out.push_back(s.step());
  return out;
}

TEST_F(JobStorePersistenceTest, AReopenedStoreHoldsEveryJobItsHistoryTimingsAndCheckpoint) {
  std::string done, failed, queued;
  {
    auto store = Open();
    ASSERT_NE(store, nullptr);
    done = *store->Add(Spec(5));
    failed = *store->Add(Spec(5));
    queued = *store->Add(Spec(5));
    ASSERT_TRUE(store->Transition(done, v1::RUNNING, "").ok());
    store->SetStages(done, OneStage());
    v1::TraceProgram program;
    program.set_schedule("gpipe");
    program.add_rank_actions("0F0 0B0");
    store->SetTraceProgram(done, program);
    for (int s = 0; s < 5; ++s) {
      v1::StepTimings t;
      t.set_step(s);
      v1::RankTimings* r = t.add_ranks();
      r->add_index(0);
      r->add_start_us(0);
      r->add_end_us(10 + s);
      r->set_bytes_sent(100);
      store->RecordStepTimings(done, t);
      v1::StepSummary step = Step(s, 5.0 - s);
      if (s == 3) {
        step.set_has_val_loss(true);
        step.set_val_loss(4.5);
      }
      store->RecordStep(done, step);
      if (s == 3) {
        WriteCheckpoint(done, 3);
        store->SetCheckpoint(done, 3);
      }
    }
    ASSERT_TRUE(store->Transition(done, v1::SUCCEEDED, "").ok());
    ASSERT_TRUE(store->Transition(failed, v1::RUNNING, "").ok());
    store->RecordStep(failed, Step(0, 9.0));
    ASSERT_TRUE(store->Transition(failed, v1::FAILED, "step 1: boom").ok());
  }
  EXPECT_TRUE(std::filesystem::exists(dir_ + "/coordinator.db"));
  auto store = Open();
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(store->incarnation(), 2);  // the second start on this data root
  auto job = store->Get(done);
  ASSERT_TRUE(job.ok());
  EXPECT_EQ(job->state(), v1::SUCCEEDED);
  EXPECT_THAT(Steps(*job), ElementsAre(0, 1, 2, 3, 4));
  EXPECT_EQ(job->history(4).loss(), 1.0);
  EXPECT_EQ(job->steps_done(), 5);
  EXPECT_EQ(job->last_loss(), 1.0);
  EXPECT_TRUE(job->has_val_loss());
  EXPECT_EQ(job->last_val_loss(), 4.5);
  EXPECT_EQ(job->checkpoint_step(), 3);
  ASSERT_EQ(job->stages_size(), 1);
  EXPECT_EQ(job->stages(0).worker_id(), "w-1");
  EXPECT_GT(job->finished_unix_ms(), 0);
  auto timings = store->GetTimings(done);
  ASSERT_TRUE(timings.ok());
  EXPECT_EQ(timings->program().schedule(), "gpipe");
  EXPECT_EQ(timings->steps_size(), 5);
  ASSERT_EQ(timings->rank_bytes_sent_size(), 1);
  EXPECT_EQ(timings->rank_bytes_sent(0), 500);
  EXPECT_EQ((*store->StepsAfter(done, 2)).size(), 2u);

  EXPECT_EQ(store->Get(failed)->state(), v1::FAILED);
  EXPECT_EQ(store->Get(failed)->reason(), "step 1: boom");
  EXPECT_THAT(Steps(*store->Get(failed)), ElementsAre(0));
  EXPECT_EQ(store->Get(queued)->state(), v1::QUEUED);
  EXPECT_EQ(store->Queued(), std::vector<std::string>{queued});
  EXPECT_EQ(store->List().size(), 3u);
  EXPECT_EQ(store->List()[0].history_size(), 0);
  // A watcher of a finished job sees its end at once.
  auto events = store->WaitEvents(done, 0, absl::ZeroDuration());
  ASSERT_TRUE(events.ok());
  ASSERT_EQ(events->events.size(), 1u);
  EXPECT_EQ(events->events[0].state(), v1::SUCCEEDED);
  EXPECT_TRUE(events->ended);
  // Ids continue after the highest.
  EXPECT_EQ(*store->Add(Spec(1)), "job-4");
}

TEST_F(JobStorePersistenceTest, ARunningJobComesBackQueuedAtItsLatestCheckpoint) {
  std::string running, later;
  {
    auto store = Open();
    ASSERT_NE(store, nullptr);
    running = *store->Add(Spec(12));
    later = *store->Add(Spec(3));
    ASSERT_TRUE(store->Transition(running, v1::RUNNING, "").ok());
    store->SetStages(running, OneStage());
    for (int s = 0; s < 8; ++s) {
      v1::StepSummary step = Step(s, 10.0 - s, /*skipped=*/s == 2 || s == 6);
      if (s == 3 || s == 7) {
        step.set_has_val_loss(true);
        step.set_val_loss(100.0 + s);
      }
      store->RecordStep(running, step);
      if (s == 4) {
        WriteCheckpoint(running, 4);
        store->SetCheckpoint(running, 4);
      }
    }
    EXPECT_EQ(store->Get(running)->skipped_steps(), 2);
    // The coordinator dies here, with the job running.
  }
  auto store = Open();
  ASSERT_NE(store, nullptr);
  auto job = store->Get(running);
  ASSERT_TRUE(job.ok());
  EXPECT_EQ(job->state(), v1::QUEUED);
  // Numbered from 1 for people: the checkpoint after the 5th step (index 4).
  EXPECT_EQ(job->reason(), "coordinator restarted; resumes from the checkpoint after step 5");
  EXPECT_EQ(job->checkpoint_step(), 4);
  EXPECT_EQ(job->steps_done(), 5);
  EXPECT_THAT(Steps(*job), ElementsAre(0, 1, 2, 3, 4));
  // The job's figures are those of the steps it keeps.
  EXPECT_EQ(job->skipped_steps(), 1);
  EXPECT_EQ(job->last_loss(), 6.0);
  EXPECT_EQ(job->last_val_loss(), 103.0);
  EXPECT_EQ(job->stages_size(), 0);  // the old gang is gone
  // Back in the queue, ahead of the job submitted after it.
  EXPECT_EQ(store->Queued(), (std::vector<std::string>{running, later}));
  auto events = store->WaitEvents(running, 0, absl::ZeroDuration());
  ASSERT_EQ(events->events.size(), 1u);
  EXPECT_EQ(events->events[0].state(), v1::QUEUED);
  EXPECT_FALSE(events->ended);

  // Resumed (as the runner does: the step after the checkpoint), it records each step once.
  ASSERT_TRUE(store->Transition(running, v1::RUNNING, "").ok());
  for (int s = 5; s < 12; ++s) store->RecordStep(running, Step(s, 50.0 - s));
  ASSERT_TRUE(store->Transition(running, v1::SUCCEEDED, "").ok());
  store.reset();
  store = Open();
  job = store->Get(running);
  EXPECT_EQ(job->state(), v1::SUCCEEDED);
  EXPECT_THAT(Steps(*job), ElementsAre(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11));
  EXPECT_EQ(job->history(6).loss(), 44.0);  // the rerun's, not the first run's
  EXPECT_EQ(job->steps_done(), 12);
  EXPECT_EQ(job->skipped_steps(), 1);
}

TEST_F(JobStorePersistenceTest, AnInterruptedJobWithoutACheckpointRunsAgainFromTheStart) {
  std::string id;
  {
    auto store = Open();
    id = *store->Add(Spec(10));
    ASSERT_TRUE(store->Transition(id, v1::RUNNING, "").ok());
    for (int s = 0; s < 4; ++s) store->RecordStep(id, Step(s, 1.0));
  }
  auto store = Open();
  auto job = store->Get(id);
  EXPECT_EQ(job->state(), v1::QUEUED);
  EXPECT_EQ(job->reason(), "coordinator restarted; runs again from the start (no checkpoint)");
  EXPECT_EQ(job->checkpoint_step(), -1);
  EXPECT_EQ(job->steps_done(), 0);
  EXPECT_EQ(job->history_size(), 0);
  EXPECT_EQ(job->last_loss(), 0.0);
}

// Regression (issue 26): a job requeued after a fault keeps its restart backoff across a
// reopen (a coordinator restart), so that the next scheduler waits it out too; it was kept in
// the scheduler's memory only. Running again clears it.
TEST_F(JobStorePersistenceTest, ARestartBackoffSurvivesReopen) {
  std::string id;
  const absl::Time not_before = absl::FromUnixMillis(absl::ToUnixMillis(absl::Now()) + 60'000);
  {
    auto store = Open();
    id = *store->Add(Spec(10));
    ASSERT_TRUE(store->Transition(id, v1::RUNNING, "").ok());
    EXPECT_EQ(store->RecordRestart(id, "step 3: boom", not_before), -1);
    ASSERT_TRUE(store->Transition(id, v1::QUEUED, "restart 1 of 3 after: step 3: boom").ok());
    EXPECT_EQ(absl::FromUnixMillis(store->Get(id)->not_before_unix_ms()), not_before);
  }
  auto store = Open();
  auto job = store->Get(id);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->state(), v1::QUEUED);
  EXPECT_EQ(job->restarts(), 1);
  EXPECT_EQ(absl::FromUnixMillis(job->not_before_unix_ms()), not_before);
  ASSERT_TRUE(store->Transition(id, v1::RUNNING, "").ok());
  EXPECT_EQ(store->Get(id)->not_before_unix_ms(), 0) << "its backoff is over once it runs";
}

TEST_F(JobStorePersistenceTest, CheckpointRecordsAreReconciledWithTheManifestsOnDisk) {
  std::string adopted, ignored, ahead;
  {
    auto store = Open();
    adopted = *store->Add(Spec(20));
    ignored = *store->Add(Spec(20));
    ahead = *store->Add(Spec(20));
    for (const std::string& id : {adopted, ignored, ahead}) {
      ASSERT_TRUE(store->Transition(id, v1::RUNNING, "").ok());
      store->SetStages(id, OneStage());
    }
    for (int s = 0; s < 10; ++s) store->RecordStep(adopted, Step(s, 1.0));
    WriteCheckpoint(adopted, 3);
    store->SetCheckpoint(adopted, 3);
    // Killed after the manifest of step 9 was committed, before its record was written.
    WriteCheckpoint(adopted, 9);

    for (int s = 0; s < 8; ++s) store->RecordStep(ignored, Step(s, 1.0));
    WriteCheckpoint(ignored, 2);
    store->SetCheckpoint(ignored, 2);
    store->SetCheckpoint(ignored, 5);  // recorded, but its files are gone

    for (int s = 0; s < 3; ++s) store->RecordStep(ahead, Step(s, 1.0));
    WriteCheckpoint(ahead, 6);  // after the last step the job recorded: not this job's run
  }
  auto store = Open();
  EXPECT_EQ(store->Get(adopted)->checkpoint_step(), 9);
  EXPECT_EQ(store->Get(adopted)->steps_done(), 10);
  EXPECT_EQ(store->Get(ignored)->checkpoint_step(), 2);
  EXPECT_THAT(Steps(*store->Get(ignored)), ElementsAre(0, 1, 2));
  EXPECT_EQ(store->Get(ahead)->checkpoint_step(), -1);
  EXPECT_EQ(store->Get(ahead)->history_size(), 0);
  // The adopted one is recorded now: with its manifest gone it would no longer count.
  std::filesystem::remove_all(CheckpointStore(dir_ + "/checkpoints").Dir(adopted, 9));
  store.reset();
  store = Open();
  EXPECT_EQ(store->Get(adopted)->checkpoint_step(), 3);
  EXPECT_THAT(Steps(*store->Get(adopted)), ElementsAre(0, 1, 2, 3));
}

TEST_F(JobStorePersistenceTest, ARecordedStepSupersedesItselfAndEveryLaterStep) {
  auto store = Open();
  const std::string id = *store->Add(Spec(10));
  ASSERT_TRUE(store->Transition(id, v1::RUNNING, "").ok());
  for (int s = 0; s < 6; ++s) store->RecordStep(id, Step(s, 1.0 + s, /*skipped=*/s == 4));
  EXPECT_EQ(store->Get(id)->skipped_steps(), 1);
  store->RecordStep(id, Step(3, 30.0));
  auto job = store->Get(id);
  EXPECT_THAT(Steps(*job), ElementsAre(0, 1, 2, 3));
  EXPECT_EQ(job->history(3).loss(), 30.0);
  EXPECT_EQ(job->steps_done(), 4);
  EXPECT_EQ(job->skipped_steps(), 0);
  EXPECT_EQ((*store->StepsAfter(id, 1)).size(), 2u);
  // A window of the history: after a step, at most the latest N.
  EXPECT_THAT(Steps(*store->Get(id, JobStore::HistoryWindow{.after_step = -1, .limit = 2})),
              ElementsAre(2, 3));
  EXPECT_THAT(Steps(*store->Get(id, JobStore::HistoryWindow{.after_step = 0})),
              ElementsAre(1, 2, 3));
  EXPECT_THAT(Steps(*store->Get(id, JobStore::HistoryWindow{.after_step = 1, .limit = 1})),
              ElementsAre(3));
  EXPECT_THAT(Steps(*store->Get(id, JobStore::HistoryWindow{.after_step = 3})), ElementsAre());
  EXPECT_EQ(store->Get(id, JobStore::HistoryWindow{.limit = 2})->steps_done(), 4);
  store->RecordStep(id, Step(4, 40.0));
  ASSERT_TRUE(store->Transition(id, v1::SUCCEEDED, "").ok());
  store.reset();
  store = Open();
  job = store->Get(id);
  EXPECT_THAT(Steps(*job), ElementsAre(0, 1, 2, 3, 4));
  EXPECT_EQ(job->history(3).loss(), 30.0);
  EXPECT_EQ(job->history(4).loss(), 40.0);
}

TEST_F(JobStorePersistenceTest, TheDatabaseKeepsTheSameLatestStepsAsMemory) {
  const int64_t steps = static_cast<int64_t>(JobStore::kMaxHistory) + 3;
  std::string id;
  {
    auto store = Open();
    id = *store->Add(Spec(static_cast<int>(steps)));
    ASSERT_TRUE(store->Transition(id, v1::RUNNING, "").ok());
    for (int64_t s = 0; s < steps; ++s) store->RecordStep(id, Step(s, static_cast<double>(s)));
    ASSERT_TRUE(store->Transition(id, v1::SUCCEEDED, "").ok());
    EXPECT_EQ(store->Get(id)->history(0).step(), 3);
  }
  auto store = Open();
  auto job = store->Get(id);
  ASSERT_EQ(job->history_size(), static_cast<int>(JobStore::kMaxHistory));
  EXPECT_EQ(job->history(0).step(), 3);
  EXPECT_EQ(job->history(job->history_size() - 1).step(), steps - 1);
  EXPECT_EQ(job->steps_done(), steps);
}

// The per-stage memory breakdown is constant but for the activations: only the latest step of
// the history keeps it, in memory and after a reopen.
TEST_F(JobStorePersistenceTest, OnlyTheLatestStepKeepsTheStageMemoryBreakdown) {
  std::string id;
  auto with_memory = [](int64_t s) {
    v1::StepSummary step = Step(s, 1.0);
    v1::StageMemory* m = step.add_stage_memory();
    m->set_stage(0);
    m->set_parameter_bytes(100 + s);
    return step;
  };
  {
    auto store = Open();
    id = *store->Add(Spec(3));
    ASSERT_TRUE(store->Transition(id, v1::RUNNING, "").ok());
    for (int64_t s = 0; s < 3; ++s) store->RecordStep(id, with_memory(s));
    ASSERT_TRUE(store->Transition(id, v1::SUCCEEDED, "").ok());
    auto job = store->Get(id);
    ASSERT_EQ(job->history_size(), 3);
    EXPECT_EQ(job->history(0).stage_memory_size(), 0);
    EXPECT_EQ(job->history(1).stage_memory_size(), 0);
    ASSERT_EQ(job->history(2).stage_memory_size(), 1);
    EXPECT_EQ(job->history(2).stage_memory(0).parameter_bytes(), 102);
  }
  auto job = Open()->Get(id);
  ASSERT_EQ(job->history_size(), 3);
  EXPECT_EQ(job->history(1).stage_memory_size(), 0);
  ASSERT_EQ(job->history(2).stage_memory_size(), 1);
  EXPECT_EQ(job->history(2).stage_memory(0).parameter_bytes(), 102);
}

TEST_F(JobStorePersistenceTest, ASecondStoreOnTheSameDataRootIsRefusedUntilTheFirstCloses) {
  auto first = Open();
  ASSERT_NE(first, nullptr);
  auto second = JobStore::Open(dir_, &*checkpoints_);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(second.status().message(),
              HasSubstr(absl::StrCat("the data root ", dir_, " is in use by another coordinator (",
                                     dir_, "/coordinator.lock is locked by process ", getpid())));
  first.reset();
  EXPECT_TRUE(JobStore::Open(dir_, &*checkpoints_).ok());
}

// The store reconciles jobs with the coordinator's checkpoint store, so one with a data root
// cannot open without it; an in-memory store needs none.
TEST_F(JobStorePersistenceTest, ADataRootNeedsTheCheckpointStore) {
  auto store = JobStore::Open(dir_, nullptr);
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/coordinator.db"));
  EXPECT_TRUE(JobStore::Open("", nullptr).ok());
}

TEST_F(JobStorePersistenceTest, ADamagedDatabaseIsRefusedNamingIt) {
  std::ofstream(dir_ + "/coordinator.db") << std::string(8192, 'x');
  auto store = JobStore::Open(dir_, &*checkpoints_);
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(store.status().message(), HasSubstr(dir_ + "/coordinator.db"));
}

void WriteJson(const google::protobuf::Message& m, const std::string& path) {
  std::string json;
  ASSERT_TRUE(google::protobuf::util::MessageToJsonString(m, &json).ok());
  std::ofstream(path) << json;
}

TEST_F(JobStorePersistenceTest, TheJsonFilesOfAnEarlierVersionAreImportedOnce) {
  std::filesystem::create_directories(dir_ + "/jobs");
  std::filesystem::create_directories(dir_ + "/timings");
  v1::Job done;
  done.set_id("job-2");
  *done.mutable_spec() = Spec(3);
  done.set_state(v1::SUCCEEDED);
  done.set_checkpoint_step(-1);
  done.set_steps_done(3);
  for (int s = 0; s < 3; ++s) *done.add_history() = Step(s, 3.0 - s);
  WriteJson(done, dir_ + "/jobs/job-2.json");
  v1::JobTimings timings;
  timings.set_job_id("job-2");
  timings.add_rank_bytes_sent(77);
  WriteJson(timings, dir_ + "/timings/job-2.json");
  v1::Job running = done;
  running.set_id("job-5");
  running.set_state(v1::RUNNING);
  WriteJson(running, dir_ + "/jobs/job-5.json");
  std::ofstream(dir_ + "/jobs/job-6.json") << "{ not json";
  {
    auto store = Open();
    ASSERT_NE(store, nullptr);
    EXPECT_EQ(store->List().size(), 2u);
    EXPECT_EQ(store->Get("job-2")->state(), v1::SUCCEEDED);
    EXPECT_THAT(Steps(*store->Get("job-2")), ElementsAre(0, 1, 2));
    EXPECT_EQ(store->GetTimings("job-2")->rank_bytes_sent(0), 77);
    EXPECT_EQ(store->Get("job-5")->state(), v1::QUEUED);  // it was running
    EXPECT_EQ(store->Get("job-5")->history_size(), 0);
    EXPECT_EQ(*store->Add(Spec(1)), "job-6");
  }
  // Once: a job file appearing later is not read.
  running.set_id("job-9");
  WriteJson(running, dir_ + "/jobs/job-9.json");
  auto store = Open();
  EXPECT_EQ(store->List().size(), 3u);
  EXPECT_EQ(store->Get("job-9").status().code(), absl::StatusCode::kNotFound);
}

// --- Crash safety ---

// What the writer below was told was done, as it appended it to its log after each call
// returned: a killed writer's log holds only calls that had returned.
struct Acked {
  std::map<std::string, int64_t> last_step;        // job -> the last step recorded
  std::map<std::string, int64_t> last_checkpoint;  // job -> the last checkpoint recorded
  std::set<std::string> added, succeeded;
};

Acked ReadAcks(const std::string& path) {
  Acked acked;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    std::vector<std::string> f = absl::StrSplit(line, ' ');
    int64_t n = -1;
    if (f.size() == 2 && f[0] == "add") acked.added.insert(f[1]);
    if (f.size() == 2 && f[0] == "done") acked.succeeded.insert(f[1]);
    if (f.size() == 3 && f[0] == "step" && absl::SimpleAtoi(f[2], &n)) acked.last_step[f[1]] = n;
    if (f.size() == 3 && f[0] == "ckpt" && absl::SimpleAtoi(f[2], &n)) {
      acked.last_checkpoint[f[1]] = n;
    }
  }
  return acked;
}

double LossOf(const std::string& job, int64_t step) {
  int64_t n = 0;
  absl::SimpleAtoi(job.substr(4), &n);
  return static_cast<double>(n * 1000 + step);
}

// The writer: plays a coordinator that runs jobs one after another, forever: resumes the
// queued ones at the step after their checkpoint, checkpoints every 4 steps, finishes a job
// after 30 steps and submits the next. Runs in a child process until it is killed.
[[noreturn]] void RunWriter(const std::string& dir, const std::string& ack_path) {
  const int ack = ::open(ack_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  auto say = [&](const std::string& line) {
    const std::string text = line + "\n";
    if (::write(ack, text.data(), text.size()) != static_cast<ssize_t>(text.size())) _exit(4);
  };
  CheckpointStore checkpoints(dir + "/checkpoints");
  auto opened = JobStore::Open(dir, &checkpoints);
  if (!opened.ok()) {
    say("error " + opened.status().ToString());
    _exit(3);
  }
  JobStore& store = **opened;
  while (true) {
    std::vector<std::string> queued = store.Queued();
    std::string id;
    if (queued.empty()) {
      absl::StatusOr<std::string> added = store.Add(Spec(30));
      if (!added.ok()) _exit(5);
      id = *added;
      say("add " + id);
    } else {
      id = queued[0];
    }
    const int64_t first = store.Get(id, false)->steps_done();
    if (!store.Transition(id, v1::RUNNING, "").ok()) _exit(6);
    store.SetStages(id, OneStage());
    for (int64_t s = first; s < 30; ++s) {
      store.RecordStep(id, Step(s, LossOf(id, s)));
      say(absl::StrCat("step ", id, " ", s));
      if (s % 4 == 3) {
        const float x = static_cast<float>(s);
        auto w = checkpoints.BeginStage(id, s, 0, {{"t", "F32", {1}}});
        if (!w.ok() || !(*w)->Append(&x, sizeof(x)).ok() || !(*w)->Commit().ok() ||
            !checkpoints.Commit(id, s, 1, /*keep=*/2).ok()) {
          _exit(7);
        }
        store.SetCheckpoint(id, s);
        say(absl::StrCat("ckpt ", id, " ", s));
      }
    }
    if (!store.Transition(id, v1::SUCCEEDED, "").ok()) _exit(8);
    say("done " + id);
  }
}

TEST_F(JobStorePersistenceTest, AStoreKilledAtAnyMomentReopensAsAConsistentPrefix) {
  const std::string ack_path = dir_ + "/acks.log";
  // Kill times spread over the writer's first moments (opening) and its steady state.
  const int kill_after_ms[] = {3, 40, 150, 15, 260, 90, 7, 400, 55, 200};
  int64_t total_steps_seen = 0;
  // The checkpoint each job was found at on the last reopen: a manifest committed just before
  // a kill is adopted then without ever being acknowledged, and the next round resumes there.
  std::map<std::string, int64_t> found_at;
  for (int round = 0; round < 10; ++round) {
    SCOPED_TRACE(absl::StrCat("round ", round));
    // The test process has no other threads, so the child may run the store after fork.
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) RunWriter(dir_, ack_path);
    std::this_thread::sleep_for(std::chrono::milliseconds(kill_after_ms[round]));
    ASSERT_EQ(kill(pid, SIGKILL), 0);
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFSIGNALED(status)) << "the writer exited with " << WEXITSTATUS(status) << ": "
                                     << std::ifstream(ack_path).rdbuf();

    const Acked acked = ReadAcks(ack_path);
    auto store = JobStore::Open(dir_, &*checkpoints_);
    ASSERT_TRUE(store.ok()) << store.status();
    for (const std::string& id : acked.added) {
      absl::StatusOr<v1::Job> job = (*store)->Get(id);
      ASSERT_TRUE(job.ok()) << id << " was acknowledged but is lost";
    }
    for (const v1::Job& listed : (*store)->List()) {
      const std::string& id = listed.id();
      SCOPED_TRACE(id);
      const v1::Job job = *(*store)->Get(id);
      // Each step once, in order, from the first, with the values it was recorded with.
      ASSERT_EQ(job.history_size(), job.steps_done());
      for (int i = 0; i < job.history_size(); ++i) {
        ASSERT_EQ(job.history(i).step(), i);
        ASSERT_EQ(job.history(i).loss(), LossOf(id, i));
      }
      total_steps_seen += job.steps_done();
      if (job.state() == v1::SUCCEEDED) {
        EXPECT_EQ(job.steps_done(), 30);
        EXPECT_EQ(job.checkpoint_step(), 27);
        continue;
      }
      EXPECT_FALSE(acked.succeeded.count(id)) << "an acknowledged end was lost";
      ASSERT_EQ(job.state(), v1::QUEUED);
      // At the latest checkpoint: the one acknowledged last, or one after it whose record
      // was written but not yet acknowledged when the writer died.
      const auto ck = acked.last_checkpoint.find(id);
      int64_t acked_checkpoint = ck == acked.last_checkpoint.end() ? -1 : ck->second;
      if (const auto f = found_at.find(id); f != found_at.end()) {
        acked_checkpoint = std::max(acked_checkpoint, f->second);
      }
      EXPECT_GE(job.checkpoint_step(), acked_checkpoint);
      EXPECT_LE(job.checkpoint_step(), acked_checkpoint + 4);
      found_at[id] = job.checkpoint_step();
      EXPECT_EQ(job.steps_done(), job.checkpoint_step() + 1);
      EXPECT_TRUE(job.checkpoint_step() == -1 || job.checkpoint_step() % 4 == 3);
      if (job.checkpoint_step() >= 0) {
        EXPECT_EQ(CheckpointStore(dir_ + "/checkpoints").Latest(id).value_or(-2),
                  job.checkpoint_step());
      }
    }
    // Only one writer may hold the data root: this store is closed before the next round.
  }
  // The rounds made progress (the writer got past opening at least sometimes).
  EXPECT_GT(total_steps_seen, 0);
}

// The store's states, events and restarts, as the job runner uses them.

TEST(JobStoreTest, StatesAreFinalAndPersisted) {
  char dir_template[] = "/tmp/tandem-store-XXXXXX";
  const std::string dir = mkdtemp(dir_template);
  const CheckpointStore checkpoints(dir + "/checkpoints");
  std::string running_id, done_id, queued_id;
  {
    auto store = JobStore::Open(dir, &checkpoints);
    ASSERT_TRUE(store.ok()) << store.status();
    running_id = *(*store)->Add(JobSpecOf(2, 5));
    done_id = *(*store)->Add(JobSpecOf(2, 5));
    queued_id = *(*store)->Add(JobSpecOf(2, 5));
    ASSERT_TRUE((*store)->Transition(running_id, v1::RUNNING, "").ok());
    ASSERT_TRUE((*store)->Transition(done_id, v1::RUNNING, "").ok());
    ASSERT_TRUE((*store)->Transition(done_id, v1::SUCCEEDED, "").ok());
    EXPECT_EQ((*store)->Transition(done_id, v1::FAILED, "x").code(),
              absl::StatusCode::kFailedPrecondition);
    EXPECT_EQ((*store)->Queued(), std::vector<std::string>{queued_id});
  }
  // Reopen: finished history kept, queued stays queued, running was interrupted and is queued
  // again (job_store_test.cc has the details).
  auto store = JobStore::Open(dir, &checkpoints);
  ASSERT_TRUE(store.ok());
  EXPECT_EQ((*store)->Get(done_id)->state(), v1::SUCCEEDED);
  EXPECT_EQ((*store)->Get(queued_id)->state(), v1::QUEUED);
  EXPECT_EQ((*store)->Get(running_id)->state(), v1::QUEUED);
  EXPECT_THAT((*store)->Get(running_id)->reason(), HasSubstr("restarted"));
  auto next = (*store)->Add(JobSpecOf(1, 1));
  EXPECT_EQ(*next, "job-4");
  std::filesystem::remove_all(dir);
}

TEST(JobStoreTest, WatchersSeeEveryEventInOrder) {
  auto store = *JobStore::Open("", /*checkpoints=*/nullptr);
  const std::string id = *store->Add(JobSpecOf(1, 3));
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

// Every read of a predicted job carries the coordinator's check of its prediction: over the
// steps the read carries, or over the latest ones where it carries none; made on each read,
// never stored.
TEST(JobStoreTest, EveryReadCarriesThePredictionCheckOfItsSteps) {
  auto store = *JobStore::Open("", /*checkpoints=*/nullptr);
  const std::string id = *store->Add(JobSpecOf(2, 30));
  ASSERT_TRUE(store->Transition(id, v1::RUNNING, "").ok());
  EXPECT_FALSE(store->Get(id)->has_prediction_check());  // no prediction yet
  store->SetPredictedStep(id, 1.0, 0.1);
  for (int64_t s = 0; s < 20; ++s) {
    v1::StepSummary step;
    step.set_step(s);
    step.set_loss(5.0);
    step.set_step_seconds(s < 12 ? 2.0 : 1.01);  // the early steps ran at twice the prediction
    store->RecordStep(id, step);
  }
  // The whole history: steps 1..19 (step 0 warms up), 11 of them at 2 s.
  const v1::Job all = *store->Get(id);
  ASSERT_TRUE(all.has_prediction_check());
  EXPECT_EQ(all.prediction_check().steps(), 19);
  EXPECT_EQ(all.prediction_check().first_step(), 1);
  EXPECT_DOUBLE_EQ(all.prediction_check().measured_seconds(), 2.0);
  EXPECT_EQ(all.prediction_check().miss(), v1::PREDICTION_MISS_UNKNOWN);
  // A window of steps: over those alone.
  JobStore::HistoryWindow window;
  window.after_step = 1;
  window.limit = 3;  // steps 17..19
  const v1::Job recent = *store->Get(id, window);
  EXPECT_EQ(recent.prediction_check().first_step(), 17);
  EXPECT_EQ(recent.prediction_check().miss(), v1::PREDICTION_WITHIN);
  // Without history (and in the list): over the latest kPredictionCheckSteps.
  const v1::Job bare = *store->Get(id, /*with_history=*/false);
  EXPECT_EQ(bare.history_size(), 0);
  ASSERT_TRUE(bare.has_prediction_check());
  EXPECT_EQ(bare.prediction_check().steps(), kPredictionCheckSteps);
  EXPECT_EQ(bare.prediction_check().first_step(), 10);
  EXPECT_EQ(store->List().at(0).prediction_check().last_step(), 19);
  EXPECT_THAT(bare.prediction_check().summary(),
              HasSubstr("1.010 s per step, median of steps 11-20: x1.010 the prediction"));
}

// A rerun step supersedes its record and every later one; a restart rolls back to the
// checkpoint, so that no step is counted twice.
TEST(JobStoreTest, ARestartRollsBackToTheCheckpointAndRerunStepsReplaceTheirRecords) {
  auto store = *JobStore::Open("", /*checkpoints=*/nullptr);
  const std::string id = *store->Add(JobSpecOf(2, 10));
  for (int64_t s = 0; s < 6; ++s) {
    v1::StepSummary step;
    step.set_step(s);
    step.set_loss(10.0 - static_cast<double>(s));
    step.set_skipped(s == 4);
    store->RecordStep(id, step);
  }
  store->SetCheckpoint(id, 2);
  EXPECT_EQ(store->RecordRestart(id, "step 6: boom", absl::InfinitePast()), 2)
      << "resumes after the checkpoint";
  auto job = *store->Get(id);
  EXPECT_EQ(job.restarts(), 1);
  EXPECT_EQ(job.first_failure(), "step 6: boom");
  EXPECT_EQ(job.steps_done(), 3);
  ASSERT_EQ(job.history_size(), 3);
  EXPECT_EQ(job.history(2).step(), 2);
  EXPECT_EQ(job.last_loss(), 8.0);
  EXPECT_EQ(job.skipped_steps(), 0);
  store->RecordRestart(id, "later", absl::InfinitePast());
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
