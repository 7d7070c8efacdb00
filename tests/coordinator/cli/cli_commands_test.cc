#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/schedule.h"
#include "common/spec.h"
#include "common/status_macros.h"
#include "coordinator/cli/commands.h"
#include "coordinator/cli/format.h"
#include "gmock/gmock.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"

namespace tandem::cli {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

// Answers from canned values and records what it was asked.
class FakeClient : public CoordinatorClient {
 public:
  absl::StatusOr<std::string> SubmitJob(const std::string& spec_yaml) override {
    submitted.push_back(spec_yaml);
    return submit_result;
  }
  using CoordinatorClient::GetJob;
  absl::StatusOr<v1::Job> GetJob(const std::string& job_id, uint32_t history_limit) override {
    asked_job = job_id;
    asked_history_limit = history_limit;
    return job;
  }
  absl::StatusOr<v1::ListJobsResponse> ListJobs() override { return jobs; }
  absl::StatusOr<v1::Job> CancelJob(const std::string& job_id) override {
    cancelled = job_id;
    return job;
  }
  absl::StatusOr<v1::ListWorkersResponse> ListWorkers() override { return workers; }
  absl::StatusOr<v1::WorkerInfo> GetWorker(const std::string& id) override {
    if (!workers.ok()) return workers.status();
    for (const v1::WorkerInfo& w : workers->workers()) {
      if (w.worker_id() == id) return w;
    }
    return absl::NotFoundError(absl::StrCat("no worker '", id, "'"));
  }
  absl::Status ExportModel(
      const std::string& job_id,
      absl::FunctionRef<absl::Status(const v1::ExportChunk&)> on_chunk) override {
    for (const auto& c : export_chunks) {
      RETURN_IF_ERROR(on_chunk(c));
    }
    return export_status;
  }
  absl::StatusOr<v1::ModelProfile> ProfileModel(const v1::JobSpec& spec, bool refresh) override {
    ++profile_calls;
    return profile;
  }
  absl::StatusOr<v1::GetJobTraceResponse> GetJobTrace(
      const v1::GetJobTraceRequest& request) override {
    trace_requests.push_back(request);
    return trace;
  }
  absl::StatusOr<v1::PlanJobResponse> PlanJob(const v1::JobSpec& spec) override {
    planned.push_back(spec);
    return plan_search;
  }
  absl::StatusOr<v1::PlanJobResponse> plan_search = v1::PlanJobResponse();
  std::vector<v1::JobSpec> planned;
  absl::StatusOr<v1::GetJobTraceResponse> trace = v1::GetJobTraceResponse();
  std::vector<v1::GetJobTraceRequest> trace_requests;
  std::vector<v1::ExportChunk> export_chunks;
  absl::Status export_status;
  absl::StatusOr<v1::ModelProfile> profile = absl::UnavailableError("connection refused");
  int profile_calls = 0;
  absl::Status WatchJob(const std::string& job_id,
                        absl::FunctionRef<bool(const v1::JobEvent&)> on_event) override {
    watched = job_id;
    for (const v1::JobEvent& e : events) {
      ++delivered;
      if (!on_event(e)) return absl::OkStatus();
    }
    return watch_end;
  }

  absl::StatusOr<std::string> submit_result = std::string("job-1");
  absl::StatusOr<v1::Job> job = v1::Job();
  absl::StatusOr<v1::ListJobsResponse> jobs = v1::ListJobsResponse();
  absl::StatusOr<v1::ListWorkersResponse> workers = v1::ListWorkersResponse();
  std::vector<v1::JobEvent> events;
  absl::Status watch_end;
  std::vector<std::string> submitted;
  std::string asked_job, cancelled, watched;
  uint32_t asked_history_limit = 0;
  int delivered = 0;
};

CliOptions Opts(Command command, std::vector<std::string> args = {}) {
  CliOptions o;
  o.command = command;
  o.args = std::move(args);
  o.coordinator = "coord:7070";
  return o;
}

v1::JobEvent Event(v1::JobEvent::Kind kind, v1::JobState state, const std::string& reason = "",
                   int step = 0) {
  v1::JobEvent e;
  e.set_kind(kind);
  e.set_job_id("job-1");
  e.set_state(state);
  e.set_reason(reason);
  e.set_total_steps(2);
  if (kind == v1::JobEvent::SNAPSHOT) {
    e.mutable_job()->set_id("job-1");
    e.mutable_job()->set_state(state);
    e.mutable_job()->set_reason(reason);
    e.mutable_job()->set_total_steps(2);
  }
  if (kind == v1::JobEvent::STEP) {
    e.mutable_step()->set_step(step - 1);  // the index; `step` counts from 1
    e.mutable_step()->set_loss(1.5);
    e.mutable_step()->set_step_seconds(0.1);
  }
  return e;
}

class CommandsTest : public ::testing::Test {
 protected:
  absl::Status Run(const CliOptions& opts) {
    return RunCommand(opts, client_, {out_, in_, /*live=*/false, &progress_});
  }
  // Files live in a directory of this test's own: ctest runs the cases of this binary as
  // parallel processes, and a shared /tmp/plan.yaml was read half-written by another.
  std::string WriteFile(const std::string& name, const std::string& text) {
    const std::string path = Dir() + "/" + name;
    std::ofstream(path) << text;
    return path;
  }
  const std::string& Dir() {
    if (dir_.empty()) {
      std::string pattern = ::testing::TempDir() + "/tandem-cli-XXXXXX";
      dir_ = mkdtemp(pattern.data());
    }
    return dir_;
  }
  void TearDown() override {
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }
  std::string dir_;

  FakeClient client_;
  std::ostringstream out_;
  std::ostringstream progress_;  // the CLI's stderr
  std::istringstream in_{"steps: 3\n"};
};

TEST_F(CommandsTest, SubmitPrintsTheJobIdAlone) {
  const std::string path = WriteFile("job.yaml", "name: x\n");
  ASSERT_TRUE(Run(Opts(Command::kSubmit, {path})).ok());
  EXPECT_EQ(out_.str(), "job-1\n");
  ASSERT_EQ(client_.submitted.size(), 1u);
  EXPECT_EQ(client_.submitted[0], "name: x\n");
}

TEST_F(CommandsTest, SubmitFromStdin) {
  ASSERT_TRUE(Run(Opts(Command::kSubmit, {"-"})).ok());
  ASSERT_EQ(client_.submitted.size(), 1u);
  EXPECT_EQ(client_.submitted[0], "steps: 3\n");
}

TEST_F(CommandsTest, SubmitMissingFile) {
  absl::Status s = Run(Opts(Command::kSubmit, {"/nonexistent/job.yaml"}));
  EXPECT_EQ(s.message(),
            "submit: cannot read job file '/nonexistent/job.yaml': No such file or directory");
  EXPECT_TRUE(client_.submitted.empty());
  s = Run(Opts(Command::kSubmit, {::testing::TempDir()}));
  EXPECT_THAT(std::string(s.message()), HasSubstr("not a regular file"));
}

TEST_F(CommandsTest, SubmitRejectedNamesCodeAndField) {
  client_.submit_result =
      absl::InvalidArgumentError("pipeline.micro_batches: expected an integer, got 'four'");
  const std::string path = WriteFile("bad.yaml", "pipeline:\n  micro_batches: four\n");
  absl::Status s = Run(Opts(Command::kSubmit, {path}));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  // The answer names no line (an older coordinator): the file's own says where the field is.
  EXPECT_EQ(s.message(), absl::StrCat("submit: INVALID_ARGUMENT: ", path,
                                      ":2: pipeline.micro_batches: expected an integer, got "
                                      "'four'"));
  EXPECT_EQ(out_.str(), "");
}

// Issue 26: the coordinator answers every error of the spec; each is printed on a line of its
// own as FILE:LINE: path: what, the first after the command's prefix, a default without a line.
TEST_F(CommandsTest, SubmitRejectedListsEveryErrorWithFileAndLine) {
  client_.submit_result = absl::InvalidArgumentError(
      "steps: must be in [1, 10000000], got 0 (line 2)\n"
      "data.path: required with data.source \"file\"\n"
      "pipeline.schedule_csv: deadlock (line 4)\n  rank 0: F0 [B0]\n"
      "init.from_job: no job 'job-9'");
  const std::string path = WriteFile(
      "bad.yaml", "name: x\nsteps: 0\npipeline:\n  schedule_csv: x\ninit:\n  from_job: job-9\n");
  absl::Status s = Run(Opts(Command::kSubmit, {path}));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), absl::StrCat("submit: INVALID_ARGUMENT: ", path,
                                      ":2: steps: must be in [1, 10000000], got 0\n", path,
                                      ": data.path: required with data.source \"file\"\n", path,
                                      ":4: pipeline.schedule_csv: deadlock\n  rank 0: F0 [B0]\n",
                                      path, ":6: init.from_job: no job 'job-9'"));
  // From the standard input.
  client_.submit_result =
      absl::InvalidArgumentError("steps: expected an integer (line 1, column 8)");
  s = Run(Opts(Command::kSubmit, {"-"}));
  EXPECT_EQ(s.message(), "submit: INVALID_ARGUMENT: <stdin>:1:8: steps: expected an integer");
}

// With overrides the coordinator checks a rewrite of the file (JSON on one line): the lines come
// from the file, and an overridden field has none.
TEST_F(CommandsTest, SubmitWithOverridesTakesTheLinesFromTheFile) {
  client_.submit_result = absl::InvalidArgumentError(
      "steps: must be in [1, 10000000], got 0 (line 1, column 40)\n"
      "pipeline.schedule: 1f1b needs at least as many micro-batches (line 1, column 80)");
  const std::string path =
      WriteFile("bad.yaml", "name: x\nsteps: 0\npipeline:\n  schedule: gpipe\n");
  CliOptions opts = Opts(Command::kSubmit, {path});
  opts.schedule = "1f1b";
  absl::Status s = Run(opts);
  EXPECT_EQ(s.message(), absl::StrCat("submit: INVALID_ARGUMENT: ", path,
                                      ":2: steps: must be in [1, 10000000], got 0\n", path,
                                      ": pipeline.schedule: 1f1b needs at least as many "
                                      "micro-batches"));
}

// The coordinator's text is not trusted: no line breaks of its own, no escape sequences.
TEST_F(CommandsTest, TheCoordinatorsTextIsMadeSingleLine) {
  client_.submit_result = absl::InvalidArgumentError("steps: bad\x1b[2J\r\nfake line\n  more\x07");
  const std::string path = WriteFile("bad.yaml", "steps: 0\n");
  EXPECT_EQ(Run(Opts(Command::kSubmit, {path})).message(),
            absl::StrCat("submit: INVALID_ARGUMENT: ", path, ":1: steps: bad [2J\n", path,
                         ": fake line\n  more "));
  client_.jobs = absl::InternalError("two\nlines\x1b[0m");
  EXPECT_EQ(Run(Opts(Command::kList)).message(), "list: INTERNAL: two lines [0m");
}

TEST_F(CommandsTest, UnreachableCoordinator) {
  client_.jobs = absl::UnavailableError("failed to connect to all addresses");
  absl::Status s = Run(Opts(Command::kList));
  EXPECT_THAT(std::string(s.message()),
              StartsWith("cannot reach coordinator at coord:7070: failed to connect to all "
                         "addresses (if the coordinator serves TLS, give --tls-ca FILE)"));
  CliOptions tls = Opts(Command::kList);
  tls.tls_ca = "ca.crt";
  s = Run(tls);
  EXPECT_THAT(std::string(s.message()), HasSubstr("or give --tls-server-name"));
}

TEST_F(CommandsTest, RefusedCredentialsSayWhatToGive) {
  client_.jobs = absl::UnauthenticatedError("the bearer token is not valid");
  CliOptions tls = Opts(Command::kList);
  tls.tls_ca = "ca.crt";
  absl::Status s = Run(tls);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(std::string(s.message()),
              StartsWith("list: UNAUTHENTICATED: the bearer token is not valid (authenticate "
                         "with --token-file FILE or $TANDEM_TOKEN"));
  client_.jobs = absl::PermissionDeniedError("is for tandem-client only");
  s = Run(tls);
  EXPECT_THAT(std::string(s.message()), HasSubstr("CN=tandem-client"));
}

TEST_F(CommandsTest, DeadlineSuggestsTimeout) {
  client_.workers = absl::DeadlineExceededError("Deadline Exceeded");
  absl::Status s = Run(Opts(Command::kWorkers));
  EXPECT_THAT(std::string(s.message()),
              StartsWith("workers: DEADLINE_EXCEEDED: Deadline Exceeded"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("raise --timeout"));
}

TEST_F(CommandsTest, SubmitWatchFollowsTheJob) {
  client_.events = {
      Event(v1::JobEvent::SNAPSHOT, v1::QUEUED), Event(v1::JobEvent::STATE, v1::RUNNING),
      Event(v1::JobEvent::STEP, v1::RUNNING, "", 1), Event(v1::JobEvent::STEP, v1::RUNNING, "", 2),
      Event(v1::JobEvent::STATE, v1::SUCCEEDED)};
  CliOptions opts = Opts(Command::kSubmit, {"-"});
  opts.watch = true;
  ASSERT_TRUE(Run(opts).ok());
  EXPECT_EQ(client_.watched, "job-1");
  const std::string out = out_.str();
  EXPECT_THAT(out,
              StartsWith("job-1\njob job-1: QUEUED\njob job-1: RUNNING\nstep 1/2  loss 1.5000"));
  EXPECT_THAT(out, HasSubstr("\nstep 2/2  loss 1.5000"));
  EXPECT_THAT(out, HasSubstr("\njob job-1: SUCCEEDED\n"));
}

TEST_F(CommandsTest, WatchFailedJobIsAnErrorWithTheReason) {
  client_.events = {Event(v1::JobEvent::SNAPSHOT, v1::RUNNING),
                    Event(v1::JobEvent::STATE, v1::FAILED, "stage 1 (w-2): worker lost")};
  absl::Status s = Run(Opts(Command::kWatch, {"job-1"}));
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted);
  EXPECT_EQ(s.message(), "job job-1 FAILED: stage 1 (w-2): worker lost");
}

TEST_F(CommandsTest, WatchCancelledJob) {
  client_.events = {Event(v1::JobEvent::SNAPSHOT, v1::CANCELLED, "cancelled by user")};
  absl::Status s = Run(Opts(Command::kWatch, {"job-1"}));
  EXPECT_EQ(s.message(), "job job-1 was CANCELLED: cancelled by user");
}

TEST_F(CommandsTest, WatchOfAFinishedJobSucceeds) {
  client_.events = {Event(v1::JobEvent::SNAPSHOT, v1::SUCCEEDED)};
  EXPECT_TRUE(Run(Opts(Command::kWatch, {"job-1"})).ok());
}

TEST_F(CommandsTest, WatchStopsAtTheTerminalState) {
  client_.events = {Event(v1::JobEvent::STATE, v1::SUCCEEDED),
                    Event(v1::JobEvent::STATE, v1::FAILED, "must not be read")};
  EXPECT_TRUE(Run(Opts(Command::kWatch, {"job-1"})).ok());
  EXPECT_EQ(client_.delivered, 1);
}

TEST_F(CommandsTest, WatchStreamThatEndsEarly) {
  client_.events = {Event(v1::JobEvent::SNAPSHOT, v1::RUNNING)};
  absl::Status s = Run(Opts(Command::kWatch, {"job-1"}));
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()), HasSubstr("ended the stream while job job-1 was RUNNING"));
}

TEST_F(CommandsTest, WatchStreamThatBreaks) {
  client_.events = {Event(v1::JobEvent::SNAPSHOT, v1::RUNNING)};
  client_.watch_end = absl::UnavailableError("Socket closed");
  absl::Status s = Run(Opts(Command::kWatch, {"job-1"}));
  EXPECT_EQ(s.message(),
            "watch: lost the coordinator at coord:7070 while following job job-1: Socket closed");
}

TEST_F(CommandsTest, WatchUnknownJob) {
  client_.watch_end = absl::NotFoundError("no job 'job-9'");
  absl::Status s = Run(Opts(Command::kWatch, {"job-9"}));
  EXPECT_EQ(s.message(), "watch: NOT_FOUND: no job 'job-9'");
}

TEST_F(CommandsTest, WatchJsonPrintsOneObjectPerEvent) {
  client_.events = {Event(v1::JobEvent::SNAPSHOT, v1::RUNNING),
                    Event(v1::JobEvent::STEP, v1::RUNNING, "", 1),
                    Event(v1::JobEvent::STATE, v1::SUCCEEDED)};
  CliOptions opts = Opts(Command::kWatch, {"job-1"});
  opts.output = OutputFormat::kJson;
  ASSERT_TRUE(Run(opts).ok());
  const std::string out = out_.str();
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 3);
}

TEST_F(CommandsTest, StatusWithoutJobShowsJobsAndWorkers) {
  v1::Job* j = client_.jobs->add_jobs();
  j->set_id("job-1");
  j->set_name("tiny");
  j->set_state(v1::SUCCEEDED);
  client_.workers->add_workers()->set_state(v1::IDLE);
  ASSERT_TRUE(Run(Opts(Command::kStatus)).ok());
  EXPECT_THAT(out_.str(), HasSubstr("job-1  tiny  SUCCEEDED"));
  EXPECT_THAT(out_.str(), HasSubstr("\n\n1 worker: 1 idle, 0 busy, 0 lost\n"));
}

TEST_F(CommandsTest, StatusJsonMergesJobsAndWorkers) {
  client_.jobs->add_jobs()->set_id("job-1");
  client_.workers->add_workers()->set_worker_id("w-1");
  CliOptions opts = Opts(Command::kStatus);
  opts.output = OutputFormat::kJson;
  ASSERT_TRUE(Run(opts).ok());
  google::protobuf::Struct parsed;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(out_.str(), &parsed).ok()) << out_.str();
  EXPECT_EQ(parsed.fields().at("jobs").list_value().values_size(), 1);
  EXPECT_EQ(parsed.fields().at("workers").list_value().values_size(), 1);
}

TEST_F(CommandsTest, StatusOfOneJob) {
  client_.job->set_id("job-3");
  client_.job->set_state(v1::QUEUED);
  client_.job->set_reason("waiting for 3 idle cpu workers");
  ASSERT_TRUE(Run(Opts(Command::kStatus, {"job-3"})).ok());
  EXPECT_EQ(client_.asked_job, "job-3");
  EXPECT_THAT(out_.str(), HasSubstr("waiting for 3 idle cpu workers"));
  // The table shows the recent steps only, so only they are asked for; JSON gets everything.
  EXPECT_EQ(client_.asked_history_limit, static_cast<uint32_t>(kRecentSteps));
  CliOptions json = Opts(Command::kStatus, {"job-3"});
  json.output = OutputFormat::kJson;
  ASSERT_TRUE(Run(json).ok());
  EXPECT_EQ(client_.asked_history_limit, 0u);

  client_.job = absl::NotFoundError("no job 'job-4'");
  EXPECT_EQ(Run(Opts(Command::kStatus, {"job-4"})).message(), "status: NOT_FOUND: no job 'job-4'");
}

TEST_F(CommandsTest, ListJsonIsTheResponse) {
  client_.jobs->add_jobs()->set_id("job-1");
  CliOptions opts = Opts(Command::kList);
  opts.output = OutputFormat::kJson;
  ASSERT_TRUE(Run(opts).ok());
  v1::ListJobsResponse parsed;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(out_.str(), &parsed).ok());
  EXPECT_EQ(parsed.jobs(0).id(), "job-1");
}

TEST_F(CommandsTest, ListAndWorkersWhenEmpty) {
  ASSERT_TRUE(Run(Opts(Command::kList)).ok());
  EXPECT_EQ(out_.str(), "No jobs.\n");
  out_.str("");
  ASSERT_TRUE(Run(Opts(Command::kWorkers)).ok());
  EXPECT_THAT(out_.str(), StartsWith("No workers registered."));
}

TEST_F(CommandsTest, Cancel) {
  client_.job->set_id("job-2");
  client_.job->set_state(v1::CANCELLED);
  client_.job->set_reason("cancelled by user");
  ASSERT_TRUE(Run(Opts(Command::kCancel, {"job-2"})).ok());
  EXPECT_EQ(client_.cancelled, "job-2");
  EXPECT_EQ(out_.str(), "job job-2: CANCELLED: cancelled by user\n");

  client_.job = absl::FailedPreconditionError("job job-2 already ended (CANCELLED)");
  EXPECT_EQ(Run(Opts(Command::kCancel, {"job-2"})).message(),
            "cancel: FAILED_PRECONDITION: job job-2 already ended (CANCELLED)");
}

TEST_F(CommandsTest, ValidateLocally) {
  const std::string good = WriteFile("good.yaml", "name: ok\npipeline:\n  stages: 2\n");
  ASSERT_TRUE(Run(Opts(Command::kValidate, {good})).ok());
  EXPECT_THAT(out_.str(), HasSubstr("valid. Job ok: 50 steps on 2 cpu workers (1f1b), effective "
                                    "batch 32 x 4 = 128 sequences, ideal bubble 20.0%"));
  // optimizer.shard_state: what it does for this job, including nothing.
  out_.str("");
  const std::string one =
      WriteFile("one.yaml", "name: one\noptimizer:\n  shard_state: true\npipeline:\n  stages: 2\n");
  ASSERT_TRUE(Run(Opts(Command::kValidate, {one})).ok());
  EXPECT_THAT(out_.str(), HasSubstr("optimizer.shard_state: accepted, and does nothing with 1 "
                                    "replica"));
  out_.str("");
  const std::string two = WriteFile("two.yaml",
                                    "name: two\noptimizer:\n  shard_state: true\npipeline:\n  "
                                    "stages: 2\n  replicas: 2\n");
  ASSERT_TRUE(Run(Opts(Command::kValidate, {two})).ok());
  EXPECT_THAT(out_.str(), HasSubstr("each of the 2 replicas keeps 1/2 of the AdamW moments"));
  out_.str("");
  const std::string sgd = WriteFile("sgd.yaml",
                                    "name: sgd\noptimizer:\n  name: sgd\n  shard_state: true\n"
                                    "pipeline:\n  stages: 2\n  replicas: 2\n");
  ASSERT_TRUE(Run(Opts(Command::kValidate, {sgd})).ok());
  EXPECT_THAT(out_.str(), HasSubstr("does nothing with optimizer sgd"));
  const std::string bad = WriteFile("bad.yaml", "optimizer:\n  lr: -1\n");
  absl::Status s = Run(Opts(Command::kValidate, {bad}));
  EXPECT_THAT(std::string(s.message()), HasSubstr("bad.yaml:2: optimizer.lr: must be"));
}

// The parameter count, as Hugging Face counts it (a tied matrix once), for the presets.
TEST_F(CommandsTest, ValidatePrintsTheParameterCount) {
  const std::string smol = WriteFile("smol.yaml", "model:\n  preset: smollm2-135m\n");
  ASSERT_TRUE(Run(Opts(Command::kValidate, {smol})).ok());
  EXPECT_THAT(out_.str(), HasSubstr("Model: llama, 134,515,008 parameters (134.5M); the LM head "
                                    "shares the token embedding."));
  out_.str("");
  const std::string tiny = WriteFile("tiny.yaml", "model:\n  preset: tinyllama-1.1b\n");
  ASSERT_TRUE(Run(Opts(Command::kValidate, {tiny})).ok());
  EXPECT_THAT(out_.str(), HasSubstr("Model: llama, 1,100,048,384 parameters (1100.0M)."));
  out_.str("");
  const std::string odd = WriteFile("odd.yaml",
                                    "model:\n  arch: llama\n  d_model: 36\n  n_head: 4\n"
                                    "  n_kv_head: 3\n");
  const absl::Status s = Run(Opts(Command::kValidate, {odd}));
  EXPECT_THAT(std::string(s.message()), HasSubstr("odd.yaml:5: model.n_kv_head: must divide"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("odd head size"));
}

// Issue 26: three mistakes in one answer, each as FILE:LINE: path: what, in spec order.
constexpr char kThreeErrors[] =
    "name: three\n"
    "steps: 0\n"
    "model:\n"
    "  d_model: 100\n"
    "  n_head: 3\n"
    "pipeline:\n"
    "  stages: 2\n"
    "  transport: mpi\n";

TEST_F(CommandsTest, ValidateListsEveryErrorWithFileAndLine) {
  const std::string path = WriteFile("three.yaml", kThreeErrors);
  absl::Status s = Run(Opts(Command::kValidate, {path}));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(),
            absl::StrCat("validate: ", path, ":2: steps: must be in [1, 10000000], got 0\n", path,
                         ":5: model.n_head: must divide model.d_model = 100, got 3\n", path,
                         ":8: pipeline.transport: expected \"auto\" or \"nccl\" or \"gloo\", "
                         "got \"mpi\""));
  EXPECT_EQ(out_.str(), "");
  // Type errors: each with its line and column.
  const std::string types = WriteFile("types.yaml", "steps: ten\nmodel:\n  n_head: x\n");
  EXPECT_EQ(Run(Opts(Command::kValidate, {types})).message(),
            absl::StrCat("validate: ", types, ":1:8: steps: expected an integer, got 'ten'\n",
                         types, ":3:11: model.n_head: expected an integer, got 'x'"));
  // A field the file does not write (a default the rest makes wrong) has no line.
  const std::string file = WriteFile("file.yaml", "name: f\ndata:\n  source: file\n");
  EXPECT_THAT(std::string(Run(Opts(Command::kValidate, {file})).message()),
              StartsWith(absl::StrCat("validate: ", file, ": data.path: required")));
}

// What the user sees: the real binary prints every error, one per line, after "tandem: ".
TEST_F(CommandsTest, ValidateBinaryPrintsEveryErrorOnItsOwnLine) {
  const std::string bin = std::string(TANDEM_BIN_DIR) + "/tandem";
  if (!std::filesystem::exists(bin)) GTEST_SKIP() << bin << " not built";
  const std::string path = WriteFile("three.yaml", kThreeErrors);
  FILE* p = popen((bin + " validate " + path + " 2>&1").c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string output;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof(buf), p)) > 0;) output.append(buf, n);
  const int status = pclose(p);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 1) << status;
  EXPECT_EQ(output,
            absl::StrCat("tandem: validate: ", path,
                         ":2: steps: must be in [1, 10000000], "
                         "got 0\n",
                         path, ":5: model.n_head: must divide model.d_model = 100, got 3\n", path,
                         ":8: pipeline.transport: expected \"auto\" or \"nccl\" or "
                         "\"gloo\", got \"mpi\"\n"));
}

constexpr char kPlanJob[] =
    "name: planned\nmodel:\n  n_layer: 2\npipeline:\n  stages: 2\n  micro_batches: 4\n";

TEST_F(CommandsTest, PlanPrintsStagesFiguresGridAndActions) {
  const std::string path = WriteFile("plan.yaml", kPlanJob);
  CliOptions opts = Opts(Command::kPlan, {path});
  opts.print_actions = true;
  ASSERT_TRUE(Run(opts).ok());
  const std::string out = out_.str();
  EXPECT_THAT(out, HasSubstr("Job planned: 2 workers, schedule 1f1b, 2 stages (1 per worker), 4 "
                             "micro-batches"));
  EXPECT_THAT(out, HasSubstr("bubble 20.0% (formula (P-1)/(M+P-1) = 20.0%)"));
  EXPECT_THAT(out, HasSubstr("Timestep grid"));
  EXPECT_THAT(out, HasSubstr("rank 0: 0F0 0SEND_F0 0F1 0SEND_F1 0RECV_B0 0B0"));
  EXPECT_THAT(out, HasSubstr("rank 1: 1RECV_F0 1F0 1B0 1SEND_B0"));
  EXPECT_TRUE(client_.submitted.empty());  // nothing ran
}

TEST_F(CommandsTest, PlanScheduleOverrideAndCsvRoundTrip) {
  const std::string path = WriteFile("plan.yaml", kPlanJob);
  CliOptions opts = Opts(Command::kPlan, {path});
  opts.schedule = "interleaved_1f1b";
  opts.csv_out = Dir() + "/plan.csv";
  ASSERT_TRUE(Run(opts).ok()) << out_.str();
  EXPECT_THAT(out_.str(), HasSubstr("schedule interleaved_1f1b, 4 stages (2 per worker)"));
  EXPECT_THAT(out_.str(), HasSubstr("formula (P-1)/(vM+P-1) = 11.1%"));
  EXPECT_THAT(out_.str(), HasSubstr("Wrote the schedule (2 rows, lowered)"));
  // The exported CSV plans to the same schedule.
  out_.str("");
  CliOptions again = Opts(Command::kPlan, {path});
  again.schedule_csv = opts.csv_out;
  ASSERT_TRUE(Run(again).ok()) << out_.str();
  EXPECT_THAT(out_.str(), HasSubstr("schedule csv, 4 stages (2 per worker)"));
  EXPECT_THAT(out_.str(), HasSubstr("bubble 11.1%"));
  // A schedule that does not fit names its constraint.
  out_.str("");
  CliOptions bad = Opts(Command::kPlan, {path});
  bad.schedule = "1f1b";
  bad.chunks = 3;
  absl::Status s = Run(bad);
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()), HasSubstr("pipeline.schedule"));
}

// A measured profile from the coordinator: a head as heavy as three blocks. partition:
// profile cuts by measured time and the plan explains it against the uniform cut.
v1::ModelProfile HeavyHeadProfile() {
  v1::ModelProfile p;
  p.set_device("cpu");
  p.set_threads(1);
  for (int g = 0; g < 4; ++g) {
    v1::LayerProfile* l = p.add_layers();
    l->set_layer(g);
    const double s = g == 3 ? 0.030 : g == 0 ? 0.001 : 0.010;
    l->set_forward_seconds(s / 3);
    l->set_backward_seconds(2 * s / 3);
    l->set_backward_input_seconds(s / 3);
    l->set_backward_weight_seconds(s / 3);
    l->set_static_bytes(1 << 20);
    l->set_activation_bytes(1 << 18);
    l->set_output_bytes(1 << 16);
  }
  return p;
}

// A 2-stage job of two blocks with partition: profile, for the plans priced on HeavyHeadProfile.
constexpr char kProfiledPlanYaml[] =
    "name: prof\nmodel:\n  n_layer: 2\npipeline:\n  stages: 2\n  micro_batches: 4\n"
    "  partition: profile\n";

// The plan says when and on what hardware its profile was measured (the coordinator measures
// one again past its --profile-max-age); a profile that carries neither prints no such line.
TEST_F(CommandsTest, PlanSaysWhenAndOnWhatItsProfileWasMeasured) {
  const std::string path = WriteFile("prof.yaml", kProfiledPlanYaml);
  client_.profile = HeavyHeadProfile();
  ASSERT_TRUE(Run(Opts(Command::kPlan, {path})).ok()) << out_.str();
  EXPECT_THAT(out_.str(), Not(HasSubstr("  profile: measured")));
  const int64_t at = 1'796'000'000'000;  // 2026-11-29
  client_.profile->set_created_unix_ms(at);
  client_.profile->set_device_name("Intel(R) Xeon(R) Processor / OpenBLAS SkylakeX");
  out_.str("");
  ASSERT_TRUE(Run(Opts(Command::kPlan, {path})).ok()) << out_.str();
  EXPECT_THAT(out_.str(), HasSubstr(absl::StrCat("  profile: measured ", FormatTimestamp(at),
                                                 " on Intel(R) Xeon(R) Processor / OpenBLAS "
                                                 "SkylakeX\n")));
  EXPECT_THAT(out_.str(), Not(HasSubstr("speed check")));
  // An old profile the coordinator timed again before it served it: what the check found.
  client_.profile->set_speed_check("checked now: layer 0 2.2/2.0 ms (x1.100); priced at x1.100");
  out_.str("");
  ASSERT_TRUE(Run(Opts(Command::kPlan, {path})).ok()) << out_.str();
  EXPECT_THAT(out_.str(),
              HasSubstr("SkylakeX\n  speed check: checked now: layer 0 2.2/2.0 ms (x1.100); "
                        "priced at x1.100\n"));
}

TEST_F(CommandsTest, PlanWithAProfileCutsByMeasuredTimeAndExplains) {
  const std::string path = WriteFile("prof.yaml", kProfiledPlanYaml);
  client_.profile = HeavyHeadProfile();
  ASSERT_TRUE(Run(Opts(Command::kPlan, {path})).ok()) << out_.str();
  const std::string out = out_.str();
  // The job's own shape, then the planner's other splits of 4 x 32 = 128 sequences
  // (M = 2, 8, 16, 32, 64).
  EXPECT_EQ(client_.profile_calls, 6);
  // Each other micro-batch size's profile, which the coordinator may measure for minutes, is
  // announced on stderr with the time it took; the result on stdout has none of it.
  const std::string progress = progress_.str();
  EXPECT_THAT(progress,
              HasSubstr("plan: the profile of micro-batch size 2 (cached, or measured now)... "
                        "ready in "));
  EXPECT_EQ(std::count(progress.begin(), progress.end(), '\n'), 5) << progress;
  EXPECT_THAT(out, Not(HasSubstr("cached, or measured now")));
  EXPECT_THAT(out, HasSubstr("F MS/MB  B MS/MB  MEMORY"));
  EXPECT_THAT(out, HasSubstr("embedding..block_1  7.0      14.0"));  // 21 ms | 30 ms
  EXPECT_THAT(out, HasSubstr("Predicted from the measured profile (cpu, 1 thread)"));
  EXPECT_THAT(out, HasSubstr("the uniform cut:"));
  EXPECT_THAT(out, HasSubstr("  cut: profile\n"));
  EXPECT_THAT(out, HasSubstr("  link: not measured (transfers planned as free)"));
  EXPECT_THAT(out, HasSubstr("Communication per step: 1 cut x 4 micro-batches"));
  EXPECT_THAT(out, HasSubstr("0.5 MiB"));  // 2 x 4 x 64 KiB
  // 2 blocks x 4 all-reduces x 4 micro-batches x 64 KiB = 2 MiB, 4x the pipeline's 0.5 MiB.
  EXPECT_THAT(out, HasSubstr("2 blocks x 4 x 0.2 MiB = 2.0 MiB per step, 4x more"));
  EXPECT_THAT(out, HasSubstr("warning: micro_batches 4 < 4 x 2 workers"));
  EXPECT_THAT(out, HasSubstr("warning: stages imbalanced by 43%"));
  // ZB-H1 fills 1F1B's cool-down: predicted faster at the same micro-batches.
  EXPECT_THAT(out, HasSubstr("Recommendation: schedule zb_h1 is predicted"));
  EXPECT_THAT(out, HasSubstr("`--schedule zb_h1`"));

  // No coordinator: said so, and the cut balances parameter counts.
  out_.str("");
  client_.profile = absl::UnavailableError("connection refused");
  ASSERT_TRUE(Run(Opts(Command::kPlan, {path})).ok());
  EXPECT_THAT(out_.str(),
              HasSubstr("(no measured profile: cannot reach coordinator at coord:7070"));
  EXPECT_THAT(out_.str(), HasSubstr("balances parameter counts"));
  // --no-profile does not ask.
  out_.str("");
  CliOptions quiet = Opts(Command::kPlan, {path});
  quiet.no_profile = true;
  ASSERT_TRUE(Run(quiet).ok());
  EXPECT_EQ(client_.profile_calls, 7);
}

// The planner searches schedules, chunks and splits of the global batch with a profile per
// micro-batch size, shows the fastest and says how to run the choice; --no-search skips it.
TEST_F(CommandsTest, PlanShowsTheMeasuredLink) {
  const std::string path = WriteFile("link.yaml",
                                     "name: l\nmodel:\n  n_layer: 2\npipeline:\n  stages: 2\n"
                                     "  micro_batches: 4\n");
  v1::ModelProfile profile = HeavyHeadProfile();
  v1::LinkProfile* link = profile.mutable_link();
  link->set_worker_a("w-1");
  link->set_worker_b("w-2");
  link->set_latency_seconds(50e-6);
  link->set_seconds_per_byte(1e-9);  // 1 GB/s
  client_.profile = profile;
  CliOptions opts = Opts(Command::kPlan, {path});
  opts.no_search = true;
  ASSERT_TRUE(Run(opts).ok()) << out_.str();
  // 64 KiB: 50 us + 65536 ns = 0.12 ms.
  EXPECT_THAT(out_.str(), HasSubstr("link w-1 <-> w-2: latency 50.0 us, 1.00 GB/s; one "
                                    "activation (64.0 KiB) 0.12 ms each way"));
}

// --workers N: every stages x replicas of N at the spec's global batch; with a measured link the
// all-reduce is priced and the output says why the choice splits the workers as it does.
TEST_F(CommandsTest, PlanForNWorkersSearchesStagesTimesReplicas) {
  const std::string path = WriteFile("workers.yaml",
                                     "name: w\nmodel:\n  n_layer: 2\npipeline:\n  stages: 2\n"
                                     "  micro_batch_size: 4\n  micro_batches: 4\n");
  v1::ModelProfile profile = HeavyHeadProfile();
  profile.mutable_link()->set_worker_a("w-1");
  profile.mutable_link()->set_worker_b("w-2");
  profile.mutable_link()->set_latency_seconds(50e-6);
  profile.mutable_link()->set_seconds_per_byte(1e-9);
  client_.profile = profile;
  CliOptions opts = Opts(Command::kPlan, {path});
  opts.workers = 4;
  ASSERT_TRUE(Run(opts).ok()) << out_.str();
  const std::string out = out_.str();
  EXPECT_THAT(out, HasSubstr("Planning for 4 workers; shown first as 4 stages x 1 replicas."));
  EXPECT_THAT(out, HasSubstr("Planner: 4 workers as stages x replicas, the global batch of 16"));
  for (const char* way : {"4 x 1: ", "2 x 2: ", "1 x 4: "}) EXPECT_THAT(out, HasSubstr(way));
  EXPECT_THAT(out, HasSubstr("stages x replicas, each at its best: "));
  // 5 workers cannot split 4 layers' model... but 5 x 1 needs 5 layers: only 1 x 5 would, and
  // 16 sequences do not divide by 5.
  out_.str("");
  opts.workers = 5;
  const absl::Status none = Run(opts);
  EXPECT_THAT(std::string(none.message()), HasSubstr("no stages x replicas of 5 workers"));
}

TEST_F(CommandsTest, PlanSearchesSplitsOfTheGlobalBatch) {
  const std::string path = WriteFile("search.yaml",
                                     "name: s\nmodel:\n  n_layer: 2\npipeline:\n  stages: 2\n"
                                     "  micro_batch_size: 4\n  micro_batches: 2\n");
  client_.profile = HeavyHeadProfile();
  ASSERT_TRUE(Run(Opts(Command::kPlan, {path})).ok()) << out_.str();
  std::string out = out_.str();
  EXPECT_EQ(client_.profile_calls, 3);  // size 4 (the job's), then 2 and 1 (M >= P = 2)
  EXPECT_THAT(out, HasSubstr("Planner: 2 workers as stages x replicas, the global batch of 8 "
                             "sequences split"));
  EXPECT_THAT(out, HasSubstr("SCHEDULE          CHUNKS  M x SIZE  STEP     TOKENS/S"));
  EXPECT_THAT(out, HasSubstr("Planner's choice: "));
  EXPECT_THAT(out, HasSubstr("run it with `--auto` (pipeline.plan: auto)"));
  // This fake gives the same profile at every size, so a micro-batch costs the same however
  // large: the fewest micro-batches win, and the plan warns about the bubble.
  EXPECT_THAT(out, HasSubstr("2 x 1              zb_h1             1       2 x 4     0.067 s"));
  EXPECT_THAT(out, HasSubstr("Planner's choice: zb_h1, 2 micro-batches of 4, 1 stage per worker"));
  EXPECT_THAT(out, HasSubstr("it keeps the spec's split; run it with `--auto` (pipeline.plan: "
                             "auto) or `--schedule zb_h1`"));
  EXPECT_THAT(out, HasSubstr("warning: the choice has micro_batches 2 < 4 x 2 stages"));

  out_.str("");
  CliOptions opts = Opts(Command::kPlan, {path});
  opts.no_search = true;
  ASSERT_TRUE(Run(opts).ok());
  EXPECT_THAT(out_.str(), Not(HasSubstr("Planner")));

  // --auto: the plan says the coordinator runs the choice, and submit sends plan: auto.
  out_.str("");
  opts = Opts(Command::kPlan, {path});
  opts.auto_plan = true;
  ASSERT_TRUE(Run(opts).ok());
  EXPECT_THAT(out_.str(), HasSubstr("pipeline.plan is auto: the coordinator runs this choice"));
  opts = Opts(Command::kSubmit, {path});
  opts.auto_plan = true;
  ASSERT_TRUE(Run(opts).ok()) << out_.str();
  ASSERT_EQ(client_.submitted.size(), 1u);
  EXPECT_THAT(client_.submitted[0], HasSubstr("\"plan\":\"auto\""));
}

TEST_F(CommandsTest, PlanAsJsonIsTheCoordinatorsPlannerSearch) {
  const std::string path = WriteFile("search.yaml",
                                     "name: s\nmodel:\n  n_layer: 2\npipeline:\n  stages: 2\n"
                                     "  micro_batch_size: 4\n  micro_batches: 2\n");
  v1::PlanJobResponse resp;
  v1::PlanCandidateInfo* c = resp.add_candidates();
  c->set_schedule("zb_h1");
  c->set_micro_batches(4);
  c->set_micro_batch_size(2);
  c->set_step_seconds(1.25);
  c->set_feasible(true);
  resp.set_chosen(0);
  client_.plan_search = resp;
  CliOptions opts = Opts(Command::kPlan, {path});
  opts.output = OutputFormat::kJson;
  ASSERT_TRUE(Run(opts).ok()) << out_.str();
  // stderr says what the wait is for; stdout is the JSON alone (parsed below).
  EXPECT_THAT(progress_.str(), HasSubstr("measured first on idle workers"));
  // The spec sent is the file's with its defaults, and the answer is printed as it came.
  ASSERT_EQ(client_.planned.size(), 1u);
  EXPECT_EQ(client_.planned[0].pipeline().micro_batches(), 2);
  EXPECT_EQ(client_.planned[0].pipeline().stages(), 2);
  EXPECT_EQ(client_.profile_calls, 0);  // the coordinator profiles, not the CLI
  v1::PlanJobResponse printed;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(out_.str(), &printed).ok()) << out_.str();
  ASSERT_EQ(printed.candidates_size(), 1);
  EXPECT_EQ(printed.candidates(0).schedule(), "zb_h1");
  EXPECT_DOUBLE_EQ(printed.candidates(0).step_seconds(), 1.25);

  // A coordinator that cannot plan: its error, named as the command's.
  client_.plan_search = absl::UnavailableError("connection refused");
  out_.str("");
  absl::Status s = Run(opts);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(s.message(), HasSubstr("connection refused"));
  // The local views do not combine with it.
  opts.compare = true;
  s = Run(opts);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("--compare"));
}

TEST_F(CommandsTest, PlanCompareListsEverySchedule) {
  const std::string path = WriteFile("plan.yaml", kPlanJob);
  CliOptions opts = Opts(Command::kPlan, {path});
  opts.compare = true;
  ASSERT_TRUE(Run(opts).ok());
  for (const std::string& name : AllScheduleNames()) EXPECT_THAT(out_.str(), HasSubstr(name));
  EXPECT_THAT(out_.str(), HasSubstr("20.0%"));  // 1f1b and gpipe
  EXPECT_THAT(out_.str(), HasSubstr("fastest"));
  // A schedule that does not fit says why: 1 block gives 3 layers, too few for 2 x 2 stages.
  out_.str("");
  const std::string small = WriteFile(
      "small.yaml", "name: s\nmodel:\n  n_layer: 1\npipeline:\n  stages: 2\n  micro_batches: 4\n");
  ASSERT_TRUE(Run(Opts(Command::kPlan, {small})).ok());
  out_.str("");
  CliOptions compare = Opts(Command::kPlan, {small});
  compare.compare = true;
  ASSERT_TRUE(Run(compare).ok());
  EXPECT_THAT(out_.str(), HasSubstr("does not fit: partition: cannot split 3 layers"));
}

TEST_F(CommandsTest, SubmitWithScheduleOverrideSendsTheSpec) {
  const std::string path = WriteFile("plan.yaml", kPlanJob);
  CliOptions opts = Opts(Command::kSubmit, {path});
  opts.schedule = "zb_h1";
  ASSERT_TRUE(Run(opts).ok());
  ASSERT_EQ(client_.submitted.size(), 1u);
  EXPECT_THAT(client_.submitted[0], HasSubstr("\"schedule\":\"zb_h1\""));
  EXPECT_THAT(client_.submitted[0], HasSubstr("\"name\":\"planned\""));
}

TEST_F(CommandsTest, HelpAndVersion) {
  ASSERT_TRUE(Run(Opts(Command::kHelp)).ok());
  EXPECT_THAT(out_.str(), StartsWith("Usage: tandem [flags] COMMAND"));
  out_.str("");
  ASSERT_TRUE(Run(Opts(Command::kHelp, {"cancel"})).ok());
  EXPECT_THAT(out_.str(), StartsWith("Usage: tandem cancel JOB"));
  out_.str("");
  ASSERT_TRUE(Run(Opts(Command::kVersion)).ok());
  EXPECT_THAT(out_.str(), StartsWith("tandem 0.1.0"));
}

TEST_F(CommandsTest, TraceWritesTheCoordinatorsDocument) {
  v1::GetJobTraceResponse resp;
  resp.set_content(R"({"traceEvents":[]})");
  resp.add_steps(7);
  resp.add_kept_steps(6);
  resp.add_kept_steps(7);
  client_.trace = resp;
  const std::string path = Dir() + "/trace.json";
  CliOptions opts = Opts(Command::kTrace, {"job-3"});
  opts.output_path = path;
  ASSERT_TRUE(Run(opts).ok());
  std::ifstream in(path);
  std::stringstream written;
  written << in.rdbuf();
  EXPECT_EQ(written.str(), R"({"traceEvents":[]})");
  EXPECT_EQ(out_.str(),
            "wrote " + path + " (job-3 step 8, 18 bytes); open it at https://ui.perfetto.dev\n");
  ASSERT_EQ(client_.trace_requests.size(), 1u);
  const v1::GetJobTraceRequest& req = client_.trace_requests[0];
  EXPECT_EQ(req.job_id(), "job-3");
  EXPECT_EQ(req.format(), v1::TRACE_FORMAT_JSON);
  EXPECT_FALSE(req.has_step());  // the coordinator picks the latest kept
  EXPECT_FALSE(req.has_first_step());
}

TEST_F(CommandsTest, TraceStepRangeAndSvgAreAskedFor) {
  v1::GetJobTraceResponse resp;
  resp.set_content("<svg/>");
  resp.add_steps(4);
  client_.trace = resp;
  CliOptions opts = Opts(Command::kTrace, {"job-3"});
  opts.output_path = "-";  // stdout
  opts.svg = true;
  opts.trace_step = 4;
  ASSERT_TRUE(Run(opts).ok());
  EXPECT_EQ(out_.str(), "<svg/>");
  EXPECT_EQ(client_.trace_requests[0].format(), v1::TRACE_FORMAT_SVG);
  EXPECT_EQ(client_.trace_requests[0].step(), 3);  // step 4 is the one at index 3

  opts.svg = false;
  opts.trace_step = -1;
  opts.trace_first = 2;
  opts.trace_last = 9;
  ASSERT_TRUE(Run(opts).ok());
  EXPECT_TRUE(client_.trace_requests[1].has_first_step());
  EXPECT_EQ(client_.trace_requests[1].first_step(), 1);
  EXPECT_EQ(client_.trace_requests[1].last_step(), 8);
  EXPECT_FALSE(client_.trace_requests[1].has_step());
}

TEST_F(CommandsTest, TraceOfAStepNotKeptSaysWhichAre) {
  client_.trace = absl::NotFoundError("job job-3 keeps no timings of step 3; kept steps: 0, 4..9");
  CliOptions opts = Opts(Command::kTrace, {"job-3"});
  opts.output_path = Dir() + "/none.json";
  opts.trace_step = 3;
  absl::Status s = Run(opts);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s.message(),
            "trace: NOT_FOUND: job job-3 keeps no timings of step 3; kept steps: 0, 4..9");
  EXPECT_FALSE(std::ifstream(opts.output_path).good()) << "nothing is written";
}

TEST(MergeJsonObjects, Cases) {
  EXPECT_EQ(*MergeJsonObjects("{\"a\":1}", "{\"b\":2}"), "{\"a\":1,\"b\":2}");
  EXPECT_EQ(*MergeJsonObjects("{}", "{\"b\":2}"), "{\"b\":2}");
  EXPECT_EQ(*MergeJsonObjects("{\"a\":1}\n", " {}"), "{\"a\":1}");
  EXPECT_FALSE(MergeJsonObjects("[1]", "{}").ok());
}

TEST_F(CommandsTest, WorkersWithAnIdShowsThatWorker) {
  v1::ListWorkersResponse list;
  v1::WorkerInfo* w = list.add_workers();
  w->set_worker_id("w-3");
  w->set_address("127.0.0.1:7101");
  w->set_device("cpu");
  w->set_threads(2);
  w->set_device_name("Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz / OpenBLAS SkylakeX");
  w->set_peak_flops(48.5e9);
  w->set_peak_method("fp32 SGEMM 768^3 on 2 threads, best of 8 samples 20ms apart");
  w->set_peak_measured_unix_ms(1'796'000'000'000);  // 2026-11-30 00:53:20 UTC
  w->set_state(v1::BUSY);
  w->set_job_id("job-4");
  w->set_stage(1);
  w->set_version("0.1.0");
  w->set_clock_offset_us(-120);
  w->set_clock_uncertainty_us(35);
  client_.workers = list;
  ASSERT_TRUE(Run(Opts(Command::kWorkers, {"w-3"})).ok()) << out_.str();
  const std::string out = out_.str();
  EXPECT_THAT(out, HasSubstr("Worker     w-3"));
  EXPECT_THAT(out, HasSubstr("cpu, 2 threads"));
  EXPECT_THAT(out, HasSubstr("Hardware   Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz / "
                             "OpenBLAS SkylakeX"));
  EXPECT_THAT(out, HasSubstr("48.5 GFLOP/s, fp32 SGEMM 768^3 on 2 threads, best of 8 samples "
                             "20ms apart; measured at start, 2026-11-30 00:53:20 UTC"));
  EXPECT_THAT(out, HasSubstr("job-4, stage 1"));
  EXPECT_THAT(out, HasSubstr("-120 us from the coordinator's (+/- 35 us)"));
  absl::Status missing = Run(Opts(Command::kWorkers, {"w-9"}));
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound);
}

// The job's latest checkpoint as safetensors, streamed in chunks into FILE.tmp and renamed
// once whole, with its config.json beside it.
TEST_F(CommandsTest, ExportWritesTheStreamedModelAndItsConfig) {
  absl::StatusOr<v1::JobSpec> spec = LoadJobSpecYaml("name: x\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  client_.job->mutable_spec()->CopyFrom(*spec);
  client_.export_chunks.resize(2);
  client_.export_chunks[0].set_total_bytes(6);
  client_.export_chunks[0].set_step(4);
  client_.export_chunks[0].set_data("abc");
  client_.export_chunks[1].set_data("def");
  CliOptions o = Opts(Command::kExport, {"job-1"});
  o.output_path = Dir() + "/model.safetensors";
  ASSERT_TRUE(Run(o).ok()) << out_.str();
  std::ifstream in(o.output_path, std::ios::binary);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), {}), "abcdef");
  EXPECT_THAT(out_.str(), HasSubstr(absl::StrCat("wrote ", o.output_path,
                                                 " (6 bytes, checkpoint after step 5)")));
  EXPECT_TRUE(std::filesystem::exists(Dir() + "/config.json"));
  EXPECT_FALSE(std::filesystem::exists(o.output_path + ".tmp"));
}

// A model larger than the destination's free space is refused at the stream's first chunk
// (which says how many bytes follow), naming both sizes; nothing is left behind.
TEST_F(CommandsTest, ExportRefusesADiskThatCannotHoldTheModel) {
  client_.export_chunks.resize(2);
  client_.export_chunks[0].set_total_bytes(int64_t{1} << 60);  // an exbibyte
  client_.export_chunks[0].set_data("abc");
  client_.export_chunks[1].set_data("def");
  CliOptions o = Opts(Command::kExport, {"job-1"});
  o.output_path = Dir() + "/model.safetensors";
  const absl::Status s = Run(o);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("export: the model is 1073741824.0 GiB and "));
  EXPECT_THAT(std::string(s.message()), HasSubstr(" free; free some space or export elsewhere"));
  EXPECT_FALSE(std::filesystem::exists(o.output_path));
  EXPECT_FALSE(std::filesystem::exists(o.output_path + ".tmp"));
}

}  // namespace
}  // namespace tandem::cli
