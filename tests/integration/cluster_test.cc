// End-to-end tests: a real coordinator and real workers on 127.0.0.1, driven through gRPC and
// the `tandem` CLI.
#include <grpcpp/generic/generic_stub.h>
#include <signal.h>

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <mutex>
#include <regex>
#include <sstream>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/link_model.h"
#include "common/rpc.h"
#include "common/safetensors.h"
#include "common/spec.h"
#include "common/version.h"
#include "gmock/gmock.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tandem/v1/coordinator.grpc.pb.h"
#include "tests/integration/harness.h"
#include "worker/device_name.h"

namespace tandem::testing {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using namespace std::chrono_literals;

class ClusterTest : public ::testing::Test {
 protected:
  void StartCluster(int workers) {
    Cluster::Options options;
    options.workers = workers;
    cluster_ = std::make_unique<Cluster>(options);
    absl::Status s = cluster_->Start();
    ASSERT_TRUE(s.ok()) << s;
  }
  void TearDown() override {
    if (HasFailure() && cluster_) {
      std::cerr << "coordinator log:\n" << ReadFile(cluster_->dir() + "/coordinator.log");
      for (int i = 0; i < 3; ++i) {
        std::cerr << "worker" << i << " log:\n"
                  << ReadFile(cluster_->dir() + "/worker" + std::to_string(i) + ".log");
      }
    }
  }
  // Submits a 2-stage job too long to finish and waits until it has run `steps` steps.
  // A job that would run for hours; it fails at its first fault (max_restarts: 0).
  absl::StatusOr<std::string> SubmitLongJobAndWaitForSteps(int steps) {
    auto id = cluster_->Submit(TinyJobYaml(2, 4, 100000, "1f1b", "max_restarts: 0\n"));
    if (!id.ok()) return id;
    if (!WaitFor(
            [&] {
              auto j = cluster_->GetJob(*id);
              return j.ok() && j->steps_done() >= steps;
            },
            60s)) {
      return absl::DeadlineExceededError("the job did not start stepping");
    }
    return id;
  }
  std::unique_ptr<Cluster> cluster_;
};

// The main path: a 2-stage job trains to SUCCEEDED, its loss falls, and the same job on one
// stage gives the same loss sequence (partition invariance).
TEST_F(ClusterTest, TwoStageJobTrainsAndMatchesOneStage) {
  StartCluster(2);
  auto two = cluster_->Submit(TinyJobYaml(2, 4, 30));
  ASSERT_TRUE(two.ok()) << two.status();
  auto job2 = cluster_->WaitForEnd(*two, 120s);
  ASSERT_TRUE(job2.ok()) << job2.status();
  ASSERT_EQ(job2->state(), v1::SUCCEEDED) << job2->reason();
  ASSERT_EQ(job2->history_size(), 30);
  ASSERT_EQ(job2->stages_size(), 2);
  EXPECT_EQ(job2->stages(0).layer_begin(), 0);
  EXPECT_EQ(job2->stages(1).layer_end(), 5);
  const std::vector<double> l2 = Losses(*job2);
  EXPECT_NEAR(l2.front(), std::log(256.0), 0.5);  // starts near uniform over bytes
  EXPECT_LT(l2.back(), l2.front() - 1.0) << "loss did not fall";
  EXPECT_GT(job2->history(0).bytes_sent(), 0);
  // Status figures: each worker's measured GEMM peak, and the step's MFU against them, a
  // fraction; per stage, compute + transfers + idle fill the step's span.
  auto workers = cluster_->Workers();
  ASSERT_TRUE(workers.ok());
  for (const v1::WorkerInfo& w : *workers) EXPECT_GT(w.peak_flops(), 1e8) << w.worker_id();
  CommandResult one_worker = cluster_->Cli({"workers", (*workers)[0].worker_id()});
  ASSERT_EQ(one_worker.exit_code, 0) << one_worker.err;
  EXPECT_THAT(one_worker.out, HasSubstr("GFLOP/s"));
  CommandResult no_worker = cluster_->Cli({"workers", "w-99"});
  EXPECT_NE(no_worker.exit_code, 0);
  EXPECT_THAT(no_worker.err, HasSubstr((*workers)[0].worker_id()));  // the registered ids
  const v1::StepSummary& last = job2->history(29);
  EXPECT_GT(last.mfu(), 0.0);
  EXPECT_LT(last.mfu(), 1.0);
  ASSERT_EQ(last.stage_busy_seconds_size(), 2);
  ASSERT_EQ(last.stage_comm_seconds_size(), 2);
  ASSERT_EQ(last.stage_idle_seconds_size(), 2);
  EXPECT_NEAR(last.stage_busy_seconds(0) + last.stage_comm_seconds(0) + last.stage_idle_seconds(0),
              last.stage_busy_seconds(1) + last.stage_comm_seconds(1) + last.stage_idle_seconds(1),
              1e-5);

  auto one = cluster_->Submit(TinyJobYaml(1, 4, 30));
  ASSERT_TRUE(one.ok()) << one.status();
  auto job1 = cluster_->WaitForEnd(*one, 120s);
  ASSERT_TRUE(job1.ok()) << job1.status();
  ASSERT_EQ(job1->state(), v1::SUCCEEDED) << job1->reason();
  const std::vector<double> l1 = Losses(*job1);
  ASSERT_EQ(l1.size(), l2.size());
  // Same initial weights and data; only the process boundary differs. fp32 reassociation is
  // the only source of difference: relative tolerance 1e-4.
  for (size_t i = 0; i < l1.size(); ++i) {
    EXPECT_NEAR(l1[i], l2[i], 1e-4 * std::abs(l1[i])) << "step " << i;
  }
  EXPECT_EQ(job1->history(0).bytes_sent(), 0);
}

TEST_F(ClusterTest, CliSubmitWatchStatusAndJson) {
  StartCluster(2);
  const std::string spec_path = cluster_->dir() + "/job.yaml";
  {
    std::ofstream out(spec_path);
    out << TinyJobYaml(2, 4, 8);
  }
  CommandResult submit = cluster_->Cli({"submit", spec_path});
  ASSERT_EQ(submit.exit_code, 0) << submit.err;
  std::string id = std::string(absl::StripAsciiWhitespace(submit.out));
  ASSERT_TRUE(absl::StartsWith(id, "job-")) << submit.out;

  // `tandem watch` prints a line per step and exits 0 when the job succeeds.
  CommandResult watch = cluster_->Cli({"watch", id});
  ASSERT_EQ(watch.exit_code, 0) << watch.out << watch.err;
  int step_lines = 0;
  for (absl::string_view line : absl::StrSplit(watch.out, '\n')) {
    if (absl::StartsWith(line, "step ")) {
      ++step_lines;
      EXPECT_THAT(std::string(line), HasSubstr("loss"));
      EXPECT_THAT(std::string(line), HasSubstr("tok/s"));
    }
  }
  EXPECT_GE(step_lines, 1) << watch.out;

  // Watching a finished job with -o json: one JSON object per line, all parse.
  CommandResult watch_json = cluster_->Cli({"watch", id, "-o", "json"});
  ASSERT_EQ(watch_json.exit_code, 0) << watch_json.err;
  for (absl::string_view line : absl::StrSplit(watch_json.out, '\n', absl::SkipEmpty())) {
    EXPECT_TRUE(nlohmann::json::accept(line)) << line;
  }

  CommandResult status = cluster_->Cli({"status", id, "-o", "json"});
  ASSERT_EQ(status.exit_code, 0) << status.err;
  nlohmann::json job = nlohmann::json::parse(status.out);
  EXPECT_EQ(job["state"], "SUCCEEDED");
  EXPECT_EQ(job["history"].size(), 8u);

  CommandResult list = cluster_->Cli({"list", "-o", "json"});
  ASSERT_EQ(list.exit_code, 0) << list.err;
  EXPECT_EQ(nlohmann::json::parse(list.out)["jobs"].size(), 1u);

  CommandResult workers = cluster_->Cli({"workers", "-o", "json"});
  ASSERT_EQ(workers.exit_code, 0) << workers.err;
  EXPECT_EQ(nlohmann::json::parse(workers.out)["workers"].size(), 2u);

  CommandResult table = cluster_->Cli({"status", id});
  ASSERT_EQ(table.exit_code, 0) << table.err;
  EXPECT_THAT(table.out, HasSubstr("SUCCEEDED"));
}

TEST_F(ClusterTest, BadSpecIsRejectedNamingTheFieldAndNothingIsStored) {
  StartCluster(0);
  auto bad = cluster_->Submit("pipeline:\n  micro_batches: four\n");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("pipeline.micro_batches"));

  auto unknown = cluster_->Submit("model:\n  n_layers: 4\n");
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(unknown.status().message()), HasSubstr("model.n_layers"));

  auto range = cluster_->Submit("steps: 0\n");
  ASSERT_FALSE(range.ok());
  EXPECT_THAT(std::string(range.status().message()), HasSubstr("steps"));

  // Through the CLI: non-zero exit and a one-line reason naming the field.
  const std::string spec_path = cluster_->dir() + "/bad.yaml";
  {
    std::ofstream out(spec_path);
    out << "optimizer:\n  lr: -1\n";
  }
  CommandResult cli = cluster_->Cli({"submit", spec_path});
  EXPECT_NE(cli.exit_code, 0);
  EXPECT_THAT(cli.err, HasSubstr("optimizer.lr"));
  EXPECT_EQ(std::count(cli.err.begin(), cli.err.end(), '\n'), 1) << cli.err;

  CommandResult list = cluster_->Cli({"list", "-o", "json"});
  ASSERT_EQ(list.exit_code, 0) << list.err;
  nlohmann::json jobs = nlohmann::json::parse(list.out);
  EXPECT_TRUE(!jobs.contains("jobs") || jobs["jobs"].empty()) << list.out;
}

// Issue 26: the coordinator answers every error of a spec at once, each with the line of its
// field, and the CLI prints them as FILE:LINE: path: what, one per line.
TEST_F(ClusterTest, BadSpecAnswerListsEveryErrorWithItsLine) {
  StartCluster(0);
  const std::string yaml =
      "name: three\nsteps: 0\nmodel:\n  d_model: 100\n  n_head: 3\npipeline:\n  transport: mpi\n";
  auto bad = cluster_->Submit(yaml);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(bad.status().message()),
            "steps: must be in [1, 10000000], got 0 (line 2)\n"
            "model.n_head: must divide model.d_model = 100, got 3 (line 5)\n"
            "pipeline.transport: expected \"auto\" or \"nccl\" or \"gloo\", got \"mpi\" (line 7)");

  const std::string path = cluster_->dir() + "/three.yaml";
  std::ofstream(path) << yaml;
  CommandResult cli = cluster_->Cli({"submit", path});
  EXPECT_EQ(cli.exit_code, 1);
  EXPECT_EQ(cli.err,
            absl::StrCat("tandem: submit: INVALID_ARGUMENT: ", path,
                         ":2: steps: must be in [1, 10000000], got 0\n", path,
                         ":5: model.n_head: must divide model.d_model = 100, got 3\n", path,
                         ":7: pipeline.transport: expected \"auto\" or \"nccl\" or "
                         "\"gloo\", got \"mpi\"\n"));
}

TEST_F(ClusterTest, JobNeedingMoreWorkersStaysQueuedWithAReason) {
  StartCluster(2);
  auto id = cluster_->Submit(TinyJobYaml(3, 4, 5));
  ASSERT_TRUE(id.ok()) << id.status();
  std::this_thread::sleep_for(1s);
  auto job = cluster_->GetJob(*id);
  ASSERT_TRUE(job.ok());
  EXPECT_EQ(job->state(), v1::QUEUED);
  EXPECT_THAT(job->reason(), HasSubstr("waiting for 3 idle cpu workers"));
  CommandResult status = cluster_->Cli({"status", *id});
  ASSERT_EQ(status.exit_code, 0) << status.err;
  EXPECT_THAT(status.out, HasSubstr("waiting for 3 idle cpu workers"));

  // A third worker arrives: the job is scheduled and completes.
  ASSERT_TRUE(cluster_->AddWorker().ok());
  auto done = cluster_->WaitForEnd(*id, 120s);
  ASSERT_TRUE(done.ok());
  EXPECT_EQ(done->state(), v1::SUCCEEDED) << done->reason();
}

TEST_F(ClusterTest, CancelStopsARunningJobWithinFiveSecondsAndFreesItsWorkers) {
  StartCluster(2);
  auto id = SubmitLongJobAndWaitForSteps(3);
  ASSERT_TRUE(id.ok()) << id.status();
  const auto t0 = std::chrono::steady_clock::now();
  CommandResult cancel = cluster_->Cli({"cancel", *id});
  ASSERT_EQ(cancel.exit_code, 0) << cancel.err;
  ASSERT_TRUE(WaitFor(
      [&] {
        auto j = cluster_->GetJob(*id);
        auto w = cluster_->Workers();
        if (!j.ok() || !w.ok() || j->state() != v1::CANCELLED) return false;
        for (const auto& info : *w) {
          if (info.state() != v1::IDLE) return false;
        }
        return true;
      },
      5s, 20ms))
      << "job not cancelled and workers not idle within 5 s";
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::cerr << "cancel took " << seconds << " s\n";

  // The freed workers take the next job.
  auto next = cluster_->Submit(TinyJobYaml(2, 4, 3));
  ASSERT_TRUE(next.ok());
  auto done = cluster_->WaitForEnd(*next, 60s);
  ASSERT_TRUE(done.ok());
  EXPECT_EQ(done->state(), v1::SUCCEEDED) << done->reason();
}

TEST_F(ClusterTest, CancelQueuedJob) {
  StartCluster(0);
  auto id = cluster_->Submit(TinyJobYaml(2, 4, 3));
  ASSERT_TRUE(id.ok());
  ASSERT_TRUE(cluster_->Cancel(*id).ok());
  auto job = cluster_->GetJob(*id);
  ASSERT_TRUE(job.ok());
  EXPECT_EQ(job->state(), v1::CANCELLED);
  // Cancelling again is refused with a reason.
  CommandResult again = cluster_->Cli({"cancel", *id});
  EXPECT_NE(again.exit_code, 0);
  EXPECT_THAT(again.err, HasSubstr("already ended"));
}

TEST_F(ClusterTest, WorkerThatDiesMidJobFailsTheJobNamingIt) {
  StartCluster(2);
  auto id = SubmitLongJobAndWaitForSteps(3);
  ASSERT_TRUE(id.ok()) << id.status();
  auto job = cluster_->GetJob(*id);
  ASSERT_TRUE(job.ok());
  const std::string victim_id = job->stages(1).worker_id();
  const std::string victim_address = job->stages(1).address();
  // Workers register in start order; find the process serving stage 1 by its port file.
  const std::string port = victim_address.substr(victim_address.rfind(':') + 1);
  int victim = -1;
  for (int i = 0; i < 2; ++i) {
    std::string p = ReadFile(cluster_->dir() + "/worker" + std::to_string(i) + ".port");
    if (std::string(absl::StripAsciiWhitespace(p)) == port) victim = i;
  }
  ASSERT_GE(victim, 0);
  cluster_->worker(victim).Kill(SIGKILL);
  auto end = cluster_->WaitForEnd(*id, 30s);
  ASSERT_TRUE(end.ok());
  EXPECT_EQ(end->state(), v1::FAILED);
  EXPECT_TRUE(absl::StrContains(end->reason(), victim_id) ||
              absl::StrContains(end->reason(), victim_address))
      << end->reason();
  // The surviving worker is released.
  EXPECT_TRUE(WaitFor(
      [&] {
        auto w = cluster_->Workers();
        if (!w.ok()) return false;
        for (const auto& info : *w) {
          if (info.worker_id() != victim_id && info.state() != v1::IDLE) return false;
        }
        return true;
      },
      5s));
}

// A worker made to fail on purpose (--test-fail-at): the error reaches the job, `tandem
// status` and `tandem watch` naming the worker, its stage, the step and the action.
TEST_F(ClusterTest, AnInjectedWorkerFaultNamesWorkerStageStepAndAction) {
  StartCluster(0);
  ASSERT_TRUE(cluster_->AddWorker().ok());
  ASSERT_TRUE(cluster_->AddWorker({"--test-fail-at=2:B:1"}).ok());
  auto workers = cluster_->Workers();
  ASSERT_TRUE(workers.ok() && workers->size() == 2u);
  auto id = cluster_->Submit(TinyJobYaml(2, 4, 3));
  ASSERT_TRUE(id.ok()) << id.status();
  auto end = cluster_->WaitForEnd(*id, 60s);
  ASSERT_TRUE(end.ok()) << end.status();
  ASSERT_EQ(end->state(), v1::FAILED);
  // The faulty worker is the second to register; find its stage in the job.
  const std::string port =
      absl::StrCat(":", absl::StripAsciiWhitespace(ReadFile(cluster_->dir() + "/worker1.port")));
  const v1::StageAssignment* faulty = nullptr;
  for (const v1::StageAssignment& s : end->stages()) {
    if (absl::EndsWith(s.address(), port)) faulty = &s;
  }
  ASSERT_NE(faulty, nullptr);
  const std::string& reason = end->reason();
  EXPECT_THAT(reason, HasSubstr("step 2: "));  // numbered from 1, as --test-fail-at takes it
  EXPECT_THAT(reason, HasSubstr(absl::StrCat("stage ", faulty->stage())));
  EXPECT_THAT(reason, HasSubstr(faulty->worker_id()));
  EXPECT_THAT(reason, HasSubstr("B mb 1"));
  EXPECT_THAT(reason, HasSubstr("injected fault"));
  CommandResult status = cluster_->Cli({"status", *id});
  EXPECT_THAT(status.out, HasSubstr("injected fault"));
  EXPECT_THAT(status.out, HasSubstr(faulty->worker_id()));
  CommandResult watch = cluster_->Cli({"watch", *id});
  EXPECT_NE(watch.exit_code, 0);
  EXPECT_THAT(watch.out + watch.err, HasSubstr("B mb 1"));
  EXPECT_THAT(watch.out + watch.err, HasSubstr(faulty->worker_id()));
}

// Garbage, oversized and deeply nested YAML through the coordinator's SubmitJob: each gets its
// code, nothing is stored, and the coordinator keeps serving (a valid spec then submits).
TEST_F(ClusterTest, GarbageAndHugeSubmissionsAreRefusedAndTheCoordinatorKeepsServing) {
  StartCluster(0);
  auto stub = v1::Coordinator::NewStub(MakeInsecureChannel(cluster_->address()));
  auto submit = [&](const std::string& yaml) {
    v1::SubmitJobRequest req;
    req.set_protocol_version(kProtocolVersion);
    req.set_spec_yaml(yaml);
    v1::SubmitJobResponse resp;
    grpc::ClientContext ctx;
    SetDeadline(ctx, 20s);
    return stub->SubmitJob(&ctx, req, &resp);
  };
  auto serving = [&](const char* after) {
    v1::ListJobsRequest req;
    req.set_protocol_version(kProtocolVersion);
    v1::ListJobsResponse resp;
    grpc::ClientContext ctx;
    SetDeadline(ctx, 5s);
    grpc::Status s = stub->ListJobs(&ctx, req, &resp);
    EXPECT_TRUE(s.ok()) << "after " << after << ": " << s.error_message();
    EXPECT_EQ(resp.jobs_size(), 0) << "after " << after;
  };
  grpc::Status s = submit("{{{{ :: ]]\x01\x02 not yaml");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("job spec: invalid YAML"));
  serving("garbage YAML");
  s = submit(std::string(100000, '[') + std::string(100000, ']'));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  serving("deeply nested YAML");
  s = submit("name: a\nsteps: " + std::string(3 << 20, '9') + "\n");  // over the spec limit
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("bytes"));
  serving("a 3 MiB spec");
  s = submit(std::string(9 << 20, '#'));  // over the server's receive limit (8 MiB)
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  serving("a 9 MiB request");
  {
    // Not a SubmitJobRequest at all: bytes that do not parse as the message.
    grpc::GenericStub generic(MakeInsecureChannel(cluster_->address()));
    grpc::ClientContext ctx;
    SetDeadline(ctx, 5s);
    grpc::Slice slice(std::string("\x12\xff\xff\xff\xff\x0f\x01", 7));
    grpc::ByteBuffer request(&slice, 1), response;
    std::promise<grpc::Status> done;
    generic.UnaryCall(&ctx, "/tandem.v1.Coordinator/SubmitJob", grpc::StubOptions(), &request,
                      &response, [&](grpc::Status st) { done.set_value(st); });
    s = done.get_future().get();
    EXPECT_FALSE(s.ok());
    EXPECT_NE(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
  }
  serving("an unparsable request");
  auto job =
      cluster_->Submit("name: fine\nsteps: 1\nmodel:\n  n_layer: 1\npipeline:\n  stages: 1\n");
  EXPECT_TRUE(job.ok()) << job.status();
}

TEST_F(ClusterTest, ProtocolVersionMismatchIsRefused) {
  StartCluster(0);
  v1::ListJobsRequest req;
  req.set_protocol_version(kProtocolVersion + 1);
  v1::ListJobsResponse resp;
  grpc::ClientContext ctx;
  SetDeadline(ctx, 5s);
  auto stub = v1::Coordinator::NewStub(MakeInsecureChannel(cluster_->address()));
  grpc::Status s = stub->ListJobs(&ctx, req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(s.error_message(), HasSubstr(absl::StrCat("protocol version ", kProtocolVersion + 1,
                                                        " is not supported")));
}

TEST_F(ClusterTest, BothDaemonsServeGrpcHealth) {
  StartCluster(1);
  const HealthAnswer coordinator = CheckHealth(MakeInsecureChannel(cluster_->address()));
  EXPECT_EQ(coordinator.code, grpc::StatusCode::OK);
  EXPECT_EQ(coordinator.status, 1);  // SERVING
  const std::string port =
      std::string(absl::StripAsciiWhitespace(ReadFile(cluster_->dir() + "/worker0.port")));
  const HealthAnswer worker = CheckHealth(MakeInsecureChannel("127.0.0.1:" + port));
  EXPECT_EQ(worker.code, grpc::StatusCode::OK);
  EXPECT_EQ(worker.status, 1);
}

// A job resumed from another's checkpoint continues its loss sequence exactly, with the same
// or a different number of stages.
TEST_F(ClusterTest, ResumeFromACheckpointContinuesTheLossSequence) {
  StartCluster(2);
  const std::string ckpt = "checkpoint:\n  every: 4\n";
  auto full = cluster_->Submit(TinyJobYaml(2, 4, 12, "1f1b", ckpt, "constant"));
  ASSERT_TRUE(full.ok()) << full.status();
  auto a = cluster_->WaitForEnd(*full, 120s);
  ASSERT_TRUE(a.ok() && a->state() == v1::SUCCEEDED) << a->reason();
  EXPECT_EQ(a->checkpoint_step(), 11);

  // The first 8 steps of the same job (a constant learning rate makes them identical), then
  // the rest resumed from its final checkpoint, on 2 stages and on 1.
  auto head = cluster_->Submit(TinyJobYaml(2, 4, 8, "1f1b", ckpt, "constant"));
  ASSERT_TRUE(head.ok());
  auto b = cluster_->WaitForEnd(*head, 120s);
  ASSERT_TRUE(b.ok() && b->state() == v1::SUCCEEDED) << b->reason();
  ASSERT_EQ(b->checkpoint_step(), 7);
  for (int stages : {2, 1}) {
    auto tail = cluster_->Submit(TinyJobYaml(
        stages, 4, 12, "1f1b", ckpt + "init:\n  from_job: " + *head + "\n", "constant"));
    ASSERT_TRUE(tail.ok()) << tail.status();
    auto c = cluster_->WaitForEnd(*tail, 120s);
    ASSERT_TRUE(c.ok());
    ASSERT_EQ(c->state(), v1::SUCCEEDED) << c->reason();
    EXPECT_EQ(c->first_step(), 8);
    ASSERT_EQ(c->history_size(), 4);
    for (int i = 0; i < 4; ++i) {
      EXPECT_EQ(c->history(i).step(), 8 + i);
      // Bit-identical: same weights, optimizer state, data and arithmetic.
      EXPECT_EQ(c->history(i).loss(), a->history(8 + i).loss())
          << stages << " stages, step " << 8 + i;
    }
  }

  // Resuming from an unknown job is refused at submit.
  auto bad = cluster_->Submit(TinyJobYaml(2, 4, 12, "1f1b", "init:\n  from_job: job-99\n"));
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("init.from_job"));
}

// A GPT with tied embeddings across two stages trains, evaluates, checkpoints, and resumes on
// one stage with the same losses as the uninterrupted two-stage run.
TEST_F(ClusterTest, GptTrainsEvaluatesAndResumesOnAnotherStageCount) {
  StartCluster(2);
  auto spec = [](int stages, int steps, const std::string& extra) {
    return absl::StrCat("name: gpt\nsteps: ", steps,
                        "\nseed: 3\nmodel:\n  arch: gpt\n  n_layer: 2\n  n_head: 2\n"
                        "  d_model: 16\n  seq_len: 8\noptimizer:\n  lr: 0.01\n"
                        "  lr_schedule: constant\npipeline:\n  stages: ",
                        stages,
                        "\n  micro_batch_size: 4\n  micro_batches: 2\n"
                        "eval:\n  every: 5\n  micro_batches: 2\n",
                        extra);
  };
  auto full = cluster_->Submit(spec(2, 10, ""));
  ASSERT_TRUE(full.ok()) << full.status();
  auto a = cluster_->WaitForEnd(*full, 120s);
  ASSERT_TRUE(a.ok() && a->state() == v1::SUCCEEDED) << a->reason();
  EXPECT_EQ(a->tokens_per_step(), 4 * 2 * 8);
  EXPECT_TRUE(a->history(4).has_val_loss());
  EXPECT_FALSE(a->history(5).has_val_loss());
  EXPECT_TRUE(a->has_val_loss());
  EXPECT_LT(a->history(9).loss(), a->history(0).loss());
  EXPECT_GT(a->history(0).grad_norm(), 0.0);

  // Export as a Hugging Face GPT2LMHeadModel file: HF names, Conv1D layouts (in, out), no
  // lm_head (tied), no optimizer state.
  const std::string exported = cluster_->dir() + "/model.safetensors";
  CommandResult cli = cluster_->Cli({"export", *full, "-o", exported});
  ASSERT_EQ(cli.exit_code, 0) << cli.err;
  auto file = SafetensorsFile::Open(exported);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->metadata().at("format"), "pt");
  const std::map<std::string, std::vector<int64_t>> expected = {
      {"transformer.wte.weight", {256, 16}},
      {"transformer.wpe.weight", {8, 16}},
      {"transformer.h.0.ln_1.weight", {16}},
      {"transformer.h.0.attn.c_attn.weight", {16, 48}},
      {"transformer.h.0.attn.c_attn.bias", {48}},
      {"transformer.h.1.attn.c_proj.weight", {16, 16}},
      {"transformer.h.1.mlp.c_fc.weight", {16, 64}},
      {"transformer.h.1.mlp.c_proj.weight", {64, 16}},
      {"transformer.ln_f.bias", {16}},
  };
  for (const auto& [name, shape] : expected) {
    const TensorInfo* t = (*file)->Find(name);
    ASSERT_NE(t, nullptr) << name;
    EXPECT_EQ(t->shape, shape) << name;
  }
  EXPECT_EQ((*file)->Find("lm_head.weight"), nullptr);
  EXPECT_EQ((*file)->tensors().size(), 2u + 2 * 12u + 2u);
  if (std::system("python3 -c 'import safetensors, numpy' >/dev/null 2>&1") == 0) {
    const std::string py = "python3 -c \"from safetensors.numpy import load_file; t = load_file('" +
                           exported +
                           "'); assert t['transformer.h.0.attn.c_attn.weight'].shape == (16, 48); "
                           "assert len(t) == 28, len(t)\"";
    EXPECT_EQ(std::system(py.c_str()), 0);
  }

  // Fine-tune from the exported file: the new job starts from the trained weights.
  std::filesystem::create_directories(cluster_->dir() + "/store/models");
  std::filesystem::copy_file(exported, cluster_->dir() + "/store/models/ft.safetensors");
  auto ft = cluster_->Submit(spec(2, 2, "init:\n  hf_file: ft.safetensors\n"));
  ASSERT_TRUE(ft.ok()) << ft.status();
  auto f = cluster_->WaitForEnd(*ft, 120s);
  ASSERT_TRUE(f.ok() && f->state() == v1::SUCCEEDED) << f->reason();
  EXPECT_LT(f->history(0).loss(), a->history(0).loss() - 0.2);
  EXPECT_NEAR(f->history(0).loss(), a->history(9).loss(), 0.3);
  auto missing = cluster_->Submit(spec(2, 2, "init:\n  hf_file: nope.safetensors\n"));
  ASSERT_TRUE(missing.ok());
  auto m = cluster_->WaitForEnd(*missing, 60s);
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->state(), v1::FAILED);
  EXPECT_THAT(m->reason(), HasSubstr("init.hf_file"));
  // A symlink under models/ that leads out of it (to the exported file) is refused.
  std::filesystem::create_symlink(exported, cluster_->dir() + "/store/models/escape.safetensors");
  auto escape = cluster_->Submit(spec(2, 2, "init:\n  hf_file: escape.safetensors\n"));
  ASSERT_TRUE(escape.ok());
  auto e = cluster_->WaitForEnd(*escape, 60s);
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->state(), v1::FAILED);
  EXPECT_THAT(e->reason(), AllOf(HasSubstr("init.hf_file"), HasSubstr("outside")));

  auto head = cluster_->Submit(spec(2, 5, ""));
  ASSERT_TRUE(head.ok());
  auto b = cluster_->WaitForEnd(*head, 120s);
  ASSERT_TRUE(b.ok() && b->state() == v1::SUCCEEDED) << b->reason();
  auto tail = cluster_->Submit(spec(1, 10, "init:\n  from_job: " + *head + "\n"));
  ASSERT_TRUE(tail.ok()) << tail.status();
  auto c = cluster_->WaitForEnd(*tail, 120s);
  ASSERT_TRUE(c.ok() && c->state() == v1::SUCCEEDED) << c->reason();
  ASSERT_EQ(c->history_size(), 5);
  for (int i = 0; i < 5; ++i) {
    EXPECT_NEAR(c->history(i).loss(), a->history(5 + i).loss(),
                1e-5 * std::abs(a->history(5 + i).loss()))
        << "step " << 5 + i;
  }
  EXPECT_NEAR(c->last_val_loss(), a->last_val_loss(), 1e-5 * a->last_val_loss());
}

// Every schedule trains the same GPT to the same losses through the real service (virtual
// stages, local hand-offs and the split backward included), with evaluation and a checkpoint;
// and a schedule exported by `tandem plan --csv` and submitted with --schedule-csv runs and
// gives the same losses again.
TEST_F(ClusterTest, EveryScheduleAndAnExportedCsvTrainTheSameLosses) {
  StartCluster(2);
  const std::string yaml =
      "name: sched\nsteps: 4\nseed: 5\nmodel:\n  arch: gpt\n  n_layer: 2\n  n_head: 2\n"
      "  d_model: 16\n  seq_len: 8\noptimizer:\n  lr: 0.01\n  lr_schedule: constant\n"
      "pipeline:\n  stages: 2\n  micro_batch_size: 2\n  micro_batches: 4\n"
      "eval:\n  every: 2\n  micro_batches: 2\ncheckpoint:\n  every: 4\n";
  const std::string path = cluster_->dir() + "/sched.yaml";
  std::ofstream(path) << yaml;
  auto run = [&](const std::vector<std::string>& flags) -> std::vector<double> {
    std::vector<std::string> args{"submit", path};
    args.insert(args.end(), flags.begin(), flags.end());
    CommandResult submitted = cluster_->Cli(args);
    EXPECT_EQ(submitted.exit_code, 0) << submitted.err;
    const std::string id(absl::StripAsciiWhitespace(submitted.out));
    auto job = cluster_->WaitForEnd(id, 120s);
    EXPECT_TRUE(job.ok() && job->state() == v1::SUCCEEDED)
        << (job.ok() ? job->reason() : job.status().ToString());
    std::vector<double> losses;
    if (!job.ok()) return losses;
    for (const v1::StepSummary& s : job->history()) {
      losses.push_back(s.loss());
      // Every step is profiled: per-rank busy time, measured and predicted bubble.
      EXPECT_EQ(s.busy_seconds_size(), 2);
      EXPECT_GT(s.busy_seconds(0), 0.0);
      EXPECT_GE(s.bubble_measured(), 0.0);
      EXPECT_LT(s.bubble_measured(), 1.0);
      EXPECT_GT(s.bubble_predicted(), 0.0);
      EXPECT_EQ(s.rank_peak_activation_bytes_size(), 2);
      EXPECT_GT(s.peak_activation_bytes(), 0);
    }
    EXPECT_TRUE(job->has_val_loss());
    return losses;
  };
  const std::vector<double> ref = run({"--schedule", "1f1b"});
  ASSERT_EQ(ref.size(), 4u);
  for (const char* schedule : {"gpipe", "interleaved_1f1b", "zb_h1", "zb_v"}) {
    const std::vector<double> got = run({"--schedule", schedule});
    ASSERT_EQ(got.size(), ref.size()) << schedule;
    for (size_t i = 0; i < ref.size(); ++i) {
      EXPECT_NEAR(got[i], ref[i], 1e-5 * std::abs(ref[i])) << schedule << " step " << i;
    }
  }
  const std::string csv = cluster_->dir() + "/zbv.csv";
  CommandResult plan = cluster_->Cli({"plan", path, "--schedule", "zb_v", "--csv", csv});
  ASSERT_EQ(plan.exit_code, 0) << plan.err;
  const std::vector<double> imported = run({"--schedule-csv", csv});
  ASSERT_EQ(imported.size(), ref.size());
  for (size_t i = 0; i < ref.size(); ++i) {
    EXPECT_NEAR(imported[i], ref[i], 1e-5 * std::abs(ref[i])) << "csv step " << i;
  }
}

// pipeline.recompute under a budget, through the real daemons. A first job measures and
// caches the layer profile; a plain job at the cut [emb, 3 blocks | block, head] gives the
// reference losses and the plan's bytes per stage: 1F1B keeps two micro-batches on stage 0
// (about 74 MiB here) and one on stage 1 (about 16 MiB). At a budget between the two, the
// auto job recomputes stage 0 only (its actions carry R's, stage 1's none). Just under stage
// 0's plain need, full recomputation recomputes only some of stage 0's micro-batches: the
// others keep their activations beside one recomputed micro-batch's checkpoints
// (DropRecomputation), so one stage mixes the two. Both train the same losses, every stage's
// measured peak stays within the budget, and the plan's bytes per stage are within 10% of the
// measured peaks in every job.
TEST_F(ClusterTest, RecomputationFitsABudgetRecomputingOnlyWhatNeedsIt) {
  StartCluster(2);
  const std::string model =
      "steps: 3\nseed: 11\nmodel:\n  arch: gpt\n  n_layer: 4\n  n_head: 4\n  d_model: 128\n"
      "  seq_len: 128\noptimizer:\n  lr: 0.01\n  lr_schedule: constant\n"
      "pipeline:\n  schedule: 1f1b\n  stages: 2\n  micro_batch_size: 8\n  micro_batches: 4\n";
  auto run = [&](const std::string& name, const std::string& extra) -> absl::StatusOr<v1::Job> {
    auto id = cluster_->Submit("name: " + name + "\n" + model + extra);
    if (!id.ok()) return id.status();
    auto job = cluster_->WaitForEnd(*id, 180s);
    if (!job.ok()) return job.status();
    if (job->state() != v1::SUCCEEDED) return absl::InternalError(name + ": " + job->reason());
    return job;
  };
  ASSERT_TRUE(run("profiled", "  partition: profile\n").ok());
  const std::string cut = "  partition: manual\n  cuts: [4]\n";
  auto plain = run("plain", cut);
  ASSERT_TRUE(plain.ok()) << plain.status();
  ASSERT_EQ(plain->stages_size(), 2);
  const int64_t p0 = plain->stages(0).predicted_bytes(), p1 = plain->stages(1).predicted_bytes();
  ASSERT_GT(p0, 2 * p1) << "stage 0 should hold far more than stage 1";
  const v1::StepSummary& before = plain->history(plain->history_size() - 1);
  // The recomputed micro-batches of stage 0.
  auto recomputed_on_stage0 = [](const v1::Job& job) {
    const std::string& actions = job.stages(0).actions();
    int n = 0;
    for (size_t at = actions.find("0R"); at != std::string::npos; at = actions.find("0R", at + 1)) {
      ++n;
    }
    return n;
  };
  // The same losses as the plain job, measured peaks within the budget, predictions within 10%.
  auto check = [&](const v1::Job& job, int64_t budget_mb) {
    SCOPED_TRACE(job.name());
    const std::vector<double> want = Losses(*plain), got = Losses(job);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_NEAR(got[i], want[i], 1e-6 * std::abs(want[i])) << "step " << i;
    }
    const v1::StepSummary& last = job.history(job.history_size() - 1);
    ASSERT_EQ(last.stage_peak_bytes_size(), 2);
    for (int s = 0; s < 2; ++s) {
      EXPECT_LE(last.stage_peak_bytes(s), budget_mb << 20) << "stage " << s;
      EXPECT_LE(job.stages(s).predicted_bytes(), budget_mb << 20) << "stage " << s;
      const double measured = static_cast<double>(last.stage_peak_bytes(s));
      EXPECT_NEAR(static_cast<double>(job.stages(s).predicted_bytes()), measured, 0.1 * measured)
          << "stage " << s;
      std::cout << job.name() << " stage " << s << ": plain peak " << before.stage_peak_bytes(s)
                << " (predicted " << plain->stages(s).predicted_bytes() << "), peak "
                << last.stage_peak_bytes(s) << " (predicted " << job.stages(s).predicted_bytes()
                << "), budget " << (budget_mb << 20) << "\n";
    }
    EXPECT_LT(last.stage_peak_bytes(0), before.stage_peak_bytes(0));
    EXPECT_EQ(last.stage_peak_bytes(1), before.stage_peak_bytes(1));  // stage 1 keeps its own
  };
  const int64_t between_mb = ((p0 + p1) / 2) >> 20;
  auto automatic =
      run("auto", absl::StrCat(cut, "  recompute: auto\n  memory_budget_mb: ", between_mb, "\n"));
  ASSERT_TRUE(automatic.ok()) << automatic.status();
  EXPECT_THAT(automatic->stages(0).actions(), HasSubstr("0R0"));
  EXPECT_THAT(automatic->stages(1).actions(), ::testing::Not(HasSubstr("R")));
  check(*automatic, between_mb);

  const int64_t under_mb = (p0 >> 20) - 1;
  auto some =
      run("some", absl::StrCat(cut, "  recompute: full\n  memory_budget_mb: ", under_mb, "\n"));
  ASSERT_TRUE(some.ok()) << some.status();
  EXPECT_GE(recomputed_on_stage0(*some), 1) << some->stages(0).actions();
  EXPECT_LT(recomputed_on_stage0(*some), 4) << some->stages(0).actions();
  EXPECT_THAT(some->stages(1).actions(), ::testing::Not(HasSubstr("R")));
  check(*some, under_mb);
}

// partition: profile through the real daemons: a head that outweighs the blocks (vocab 8192
// at d_model 64: a block costs ~10% of the head, so the cut matters by more than the 3% within
// which the uniform cut is kept) is measured on a worker, the cut puts it alone on the last
// stage, the job trains to the uniform cut's losses, `tandem plan` shows the same profile
// (cached), and `tandem status` the measured step against the predicted one.
TEST_F(ClusterTest, ProfiledPartitionIsolatesAHeavyHeadAndPlanShowsIt) {
  StartCluster(2);
  auto spec = [](const std::string& partition) {
    return absl::StrCat(
        "name: prof\nsteps: 4\nseed: 5\nmodel:\n  arch: gpt\n  n_layer: 2\n  n_head: 4\n"
        "  d_model: 64\n  seq_len: 16\n  vocab_size: 8192\n  tie_embeddings: false\n"
        "optimizer:\n  lr: 0.01\n  lr_schedule: constant\npipeline:\n  stages: 2\n"
        "  micro_batch_size: 4\n  micro_batches: 4\n  partition: ",
        partition, "\n");
  };
  auto profiled = cluster_->Submit(spec("profile"));
  ASSERT_TRUE(profiled.ok()) << profiled.status();
  auto a = cluster_->WaitForEnd(*profiled, 120s);
  ASSERT_TRUE(a.ok() && a->state() == v1::SUCCEEDED) << a->reason();
  ASSERT_EQ(a->stages_size(), 2);
  EXPECT_EQ(a->stages(1).layer_begin(), 3);  // the head alone
  EXPECT_GT(a->stages(0).predicted_seconds(), 0.0);
  EXPECT_GT(a->predicted_step_seconds(), 0.0);
  EXPECT_EQ(a->history(0).stage_seconds_size(), 2);
  auto uniform = cluster_->Submit(spec("uniform"));
  ASSERT_TRUE(uniform.ok());
  auto b = cluster_->WaitForEnd(*uniform, 120s);
  ASSERT_TRUE(b.ok() && b->state() == v1::SUCCEEDED) << b->reason();
  EXPECT_EQ(b->stages(1).layer_begin(), 2);
  EXPECT_GT(b->stages(1).predicted_seconds(), 0.0);  // the cached profile predicts it too
  for (int i = 0; i < 4; ++i) {
    EXPECT_NEAR(a->history(i).loss(), b->history(i).loss(), 1e-5 * b->history(i).loss());
  }
  const std::string path = cluster_->dir() + "/prof.yaml";
  std::ofstream(path) << spec("profile");
  CommandResult plan = cluster_->Cli({"plan", path});
  ASSERT_EQ(plan.exit_code, 0) << plan.err;
  EXPECT_THAT(plan.out, HasSubstr("Predicted from the measured profile (cpu, 1 thread)"));
  EXPECT_THAT(plan.out, HasSubstr("  profile: measured 20"));  // its date, and the processor
  EXPECT_THAT(plan.out, HasSubstr("embedding..block_1"));
  EXPECT_THAT(plan.out, HasSubstr("the uniform cut:"));
  CommandResult status = cluster_->Cli({"status", *profiled});
  ASSERT_EQ(status.exit_code, 0) << status.err;
  EXPECT_THAT(status.out, HasSubstr("PREDICTED MS/MB  MEASURED MS/MB"));
  // Under the prediction, the steady steps (not the first, nor the last with its own update)
  // against it.
  EXPECT_THAT(status.out, HasSubstr("\nMeasured "));
  EXPECT_THAT(status.out, HasSubstr(" s per step, median of steps 2-3: x"));

  // The job's profile (as ProfileModel serves `tandem plan`) carries the link between its two
  // workers: 4 KiB, the embedding's activation and 4 x that, timed from both ends.
  auto parsed = LoadJobSpecYaml(spec("profile"));
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  auto cached = cluster_->client().ProfileModel(*parsed, /*refresh=*/false);
  ASSERT_TRUE(cached.ok()) << cached.status();
  const v1::LinkProfile& link = cached->link();
  EXPECT_EQ(link.worker_a(), a->stages(0).worker_id());
  EXPECT_EQ(link.worker_b(), a->stages(1).worker_id());
  ASSERT_EQ(link.samples_size(), 6);
  EXPECT_EQ(link.samples(1).bytes(), 4 * 16 * 64 * 4);  // micro-batch x seq_len x d_model fp32
  for (const v1::LinkSample& s : link.samples()) {
    EXPECT_GT(s.one_way_seconds(), 0.0);
    EXPECT_EQ(s.round_trip_seconds_size(), 5);
  }
  EXPECT_GE(link.latency_seconds(), 0.0);
  EXPECT_GT(TransferSeconds(link, 4096), 0.0);
  // Measured afresh through ProfileModel, which holds the two idle workers. Loopback latency
  // is tens of microseconds; on a loaded machine scheduling delays of milliseconds can swamp
  // a 5-round median and tip the clamped fit to latency 0, so a few attempts are allowed.
  bool positive = link.latency_seconds() > 0.0;
  for (int attempt = 0; attempt < 3; ++attempt) {
    auto fresh = cluster_->client().ProfileModel(*parsed, /*refresh=*/true);
    ASSERT_TRUE(fresh.ok()) << fresh.status();
    ASSERT_TRUE(fresh->has_link());
    EXPECT_NE(fresh->link().worker_a(), fresh->link().worker_b());
    EXPECT_EQ(fresh->link().samples_size(), 6);
    positive = positive || fresh->link().latency_seconds() > 0.0;
    if (positive) break;
  }
  EXPECT_TRUE(positive) << link.ShortDebugString();
}

// tandem-coordinator --profile-max-age: a profile older than it is measured again by the next
// that needs one (0: every time), and a negative age is refused at start, naming the flag.
TEST_F(ClusterTest, AProfilePastTheMaxAgeIsMeasuredAgain) {
  Cluster::Options options;
  options.coordinator_args = {"--profile-max-age=0s"};
  cluster_ = std::make_unique<Cluster>(options);
  ASSERT_TRUE(cluster_->Start().ok());
  auto spec = LoadJobSpecYaml(TinyJobYaml(2, 2, 2));
  ASSERT_TRUE(spec.ok()) << spec.status();
  auto first = cluster_->client().ProfileModel(*spec, /*refresh=*/false);
  ASSERT_TRUE(first.ok()) << first.status();
  absl::SleepFor(absl::Milliseconds(5));
  auto second = cluster_->client().ProfileModel(*spec, /*refresh=*/false);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->key(), first->key());
  EXPECT_GT(second->created_unix_ms(), first->created_unix_ms());  // measured again
  EXPECT_THAT(ReadFile(cluster_->dir() + "/coordinator.log"),
              HasSubstr("longer ago than the max age of 0 (--profile-max-age)"));

  CommandResult negative = RunCommand({std::string(TANDEM_BIN_DIR) + "/tandem-coordinator",
                                       "--listen=127.0.0.1:0", "--profile-max-age=-5s"},
                                      30s);
  EXPECT_NE(negative.exit_code, 0);
  EXPECT_THAT(negative.err + negative.out,
              HasSubstr("--profile-max-age must not be negative, got -5s"));
}

// tandem-coordinator --profile-speed-check prices `tandem plan` as it prices a job: a cached
// profile that old is timed again on the idle workers (the embedding, a block and the head,
// forward and backward) before the plan is priced on it, and the plan prints what the check
// found under the profile's time.
TEST_F(ClusterTest, TandemPlanSpeedChecksAnOldProfileAsAJobWould) {
  Cluster::Options options;
  options.coordinator_args = {"--profile-speed-check=1s"};
  cluster_ = std::make_unique<Cluster>(options);
  ASSERT_TRUE(cluster_->Start().ok());
  const std::string yaml = TinyJobYaml(2, 2, 2);
  auto spec = LoadJobSpecYaml(yaml);
  ASSERT_TRUE(spec.ok()) << spec.status();
  auto fresh = cluster_->client().ProfileModel(*spec, /*refresh=*/false);
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  EXPECT_EQ(fresh->speed_check(), "");  // just measured: nothing to check
  absl::SleepFor(absl::Milliseconds(1100));
  const std::string path = cluster_->dir() + "/tiny.yaml";
  std::ofstream(path) << yaml;
  CommandResult plan = cluster_->Cli({"plan", "--no-search", path});
  ASSERT_EQ(plan.exit_code, 0) << plan.err;
  EXPECT_THAT(plan.out, HasSubstr("  speed check: checked now: layer 0 ")) << plan.out;
  EXPECT_THAT(ReadFile(cluster_->dir() + "/coordinator.log"),
              HasSubstr(absl::StrCat("speed check of profile ", fresh->key())));
  // The planner's search (tandem plan -o json, the Python client's plan) says so too, once the
  // profile is old enough again (on a busy host the tiny model's check may have called for
  // measuring it again just now).
  absl::SleepFor(absl::Milliseconds(1100));
  auto search = cluster_->client().PlanJob(*spec);
  ASSERT_TRUE(search.ok()) << search.status();
  EXPECT_THAT(search->profile_speed_check(), HasSubstr("checked ")) << search->ShortDebugString();
}

// pipeline.plan: auto through the real daemons: the coordinator profiles every split of the
// global batch on a worker, runs the planner's choice and says so; the global batch is the
// same, so the losses equal the spec as written.
TEST_F(ClusterTest, AutoPlanKeepsTheGlobalBatchAndItsLosses) {
  StartCluster(2);
  auto spec = [](const std::string& plan) {
    return absl::StrCat(
        "name: auto\nsteps: 3\nseed: 9\nmodel:\n  arch: gpt\n  n_layer: 2\n  n_head: 2\n"
        "  d_model: 16\n  seq_len: 16\n  vocab_size: 4096\n  tie_embeddings: false\n"
        "optimizer:\n  lr: 0.01\n  lr_schedule: constant\npipeline:\n  stages: 2\n"
        "  micro_batch_size: 4\n  micro_batches: 2\n  plan: \"",
        plan, "\"\n");
  };
  auto planned = cluster_->Submit(spec("auto"));
  ASSERT_TRUE(planned.ok()) << planned.status();
  auto a = cluster_->WaitForEnd(*planned, 120s);
  ASSERT_TRUE(a.ok() && a->state() == v1::SUCCEEDED) << a->reason();
  const v1::PipelineSpec& p = a->spec().pipeline();
  // The same global batch, however the planner split the two workers (stages x replicas).
  EXPECT_EQ(p.replicas() * p.micro_batch_size() * p.micro_batches(), 8);
  EXPECT_EQ(p.stages() * p.replicas(), 2);
  EXPECT_EQ(a->effective_batch(), 8);
  EXPECT_THAT(a->plan(),
              HasSubstr(absl::StrCat(p.schedule(), ", ", p.micro_batches(), " micro-batch")));
  EXPECT_GT(a->predicted_step_seconds(), 0.0);
  auto written = cluster_->Submit(spec(""));
  ASSERT_TRUE(written.ok());
  auto b = cluster_->WaitForEnd(*written, 120s);
  ASSERT_TRUE(b.ok() && b->state() == v1::SUCCEEDED) << b->reason();
  EXPECT_TRUE(b->plan().empty());
  ASSERT_EQ(a->history_size(), 3);
  for (int i = 0; i < 3; ++i) {
    EXPECT_NEAR(a->history(i).loss(), b->history(i).loss(), 1e-5 * b->history(i).loss()) << i;
  }
  CommandResult status = cluster_->Cli({"status", *planned});
  ASSERT_EQ(status.exit_code, 0) << status.err;
  EXPECT_THAT(status.out, HasSubstr("Planned"));
  const std::string path = cluster_->dir() + "/auto.yaml";
  std::ofstream(path) << spec("");
  CommandResult plan = cluster_->Cli({"plan", "--auto", path});
  ASSERT_EQ(plan.exit_code, 0) << plan.err;
  EXPECT_THAT(plan.out, HasSubstr("Planner's choice: "));
  EXPECT_THAT(plan.out, HasSubstr("pipeline.plan is auto: the coordinator runs this choice"));
}

// One event of a trace-event JSON document, as google.protobuf.Struct parsed it.
struct TraceEvent {
  std::string name, ph, cat;
  double ts = 0, dur = 0;
  int pid = 0, tid = 0, id = -1;
  std::string kind;  // args.kind of an action
  int micro_batch = -1;
};

std::vector<TraceEvent> ParseTrace(const std::string& json) {
  google::protobuf::Struct doc;
  const auto parsed = google::protobuf::util::JsonStringToMessage(json, &doc);
  EXPECT_TRUE(parsed.ok()) << parsed.ToString();
  std::vector<TraceEvent> out;
  if (!parsed.ok() || !doc.fields().contains("traceEvents")) return out;
  for (const auto& v : doc.fields().at("traceEvents").list_value().values()) {
    const auto& f = v.struct_value().fields();
    auto str = [&](const char* k) { return f.contains(k) ? f.at(k).string_value() : ""; };
    auto num = [&](const char* k) { return f.contains(k) ? f.at(k).number_value() : -1.0; };
    TraceEvent e;
    e.name = str("name");
    e.ph = str("ph");
    e.cat = str("cat");
    e.ts = num("ts");
    e.dur = num("dur");
    e.pid = static_cast<int>(num("pid"));
    e.tid = static_cast<int>(num("tid"));
    e.id = static_cast<int>(num("id"));
    if (f.contains("args")) {
      const auto& args = f.at("args").struct_value().fields();
      if (args.contains("kind")) e.kind = args.at("kind").string_value();
      if (args.contains("micro_batch")) {
        e.micro_batch = static_cast<int>(args.at("micro_batch").number_value());
      }
    }
    out.push_back(std::move(e));
  }
  return out;
}

int CountOf(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// `tandem trace` on a real job: the JSON parses, every send has a flow to its receive, slices
// on one track never overlap, and each stage's compute time in the trace is the busy time
// GetJob reports for that step; the SVG has a row per stage and a rect per compute action.
TEST_F(ClusterTest, TraceOfAStepMatchesWhatGetJobReports) {
  StartCluster(2);
  auto id = cluster_->Submit(TinyJobYaml(2, 4, 6));
  ASSERT_TRUE(id.ok()) << id.status();
  auto job = cluster_->WaitForEnd(*id, 120s);
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_EQ(job->state(), v1::SUCCEEDED) << job->reason();
  ASSERT_EQ(job->history_size(), 6);

  const std::string json_path = cluster_->dir() + "/trace.json";
  CommandResult r = cluster_->Cli({"trace", *id, "-o", json_path});  // the latest: step 6
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("step 6"));
  const std::vector<TraceEvent> events = ParseTrace(ReadFile(json_path));
  ASSERT_FALSE(events.empty());

  std::map<std::pair<int, int>, std::vector<const TraceEvent*>> tracks;
  std::map<int, double> busy_us;  // per process (stage + 1)
  std::map<int, const TraceEvent*> flow_start, flow_end;
  int sends = 0, recvs = 0, computes = 0;
  for (const TraceEvent& e : events) {
    if (e.ph == "X") {
      tracks[{e.pid, e.tid}].push_back(&e);
      if (e.cat == "compute") {
        busy_us[e.pid] += e.dur;
        ++computes;
      }
      sends += absl::StartsWith(e.kind, "SEND");
      recvs += absl::StartsWith(e.kind, "RECV");
    } else if (e.ph == "s") {
      EXPECT_TRUE(flow_start.emplace(e.id, &e).second) << "flow id " << e.id << " twice";
    } else if (e.ph == "f") {
      EXPECT_TRUE(flow_end.emplace(e.id, &e).second) << "flow id " << e.id << " twice";
    }
  }
  // 2 stages, 1F1B, 4 micro-batches: 8 F and 8 B; stage 0 sends 4 activations and receives 4
  // gradients, stage 1 the other way round.
  EXPECT_EQ(computes, 16);
  EXPECT_EQ(sends, 8);
  EXPECT_EQ(recvs, 8);
  EXPECT_EQ(flow_start.size(), 8u);
  EXPECT_EQ(flow_end.size(), 8u);

  for (auto& [track, slices] : tracks) {
    std::sort(slices.begin(), slices.end(),
              [](const TraceEvent* a, const TraceEvent* b) { return a->ts < b->ts; });
    for (size_t i = 1; i < slices.size(); ++i) {
      EXPECT_LE(slices[i - 1]->ts + slices[i - 1]->dur, slices[i]->ts + 1e-6)
          << "pid " << track.first << " tid " << track.second << ": " << slices[i - 1]->name
          << " overlaps " << slices[i]->name;
    }
  }
  // The slice a flow event binds to: the last on its track that starts at or before it, if
  // the event lies within it (the tracks are sorted by start above).
  auto slice_at = [&](const TraceEvent& flow) -> const TraceEvent* {
    const TraceEvent* found = nullptr;
    for (const TraceEvent* s : tracks[{flow.pid, flow.tid}]) {
      if (s->ts <= flow.ts + 1e-9) found = s;
    }
    if (found == nullptr || flow.ts > found->ts + found->dur + 1e-9) return nullptr;
    return found;
  };
  // Each send starts a flow on its own slice; the flow ends inside the receive of the same
  // message (a RECV of the same payload and micro-batch) on the neighbouring stage.
  for (const TraceEvent& e : events) {
    if (e.ph != "X" || !absl::StartsWith(e.kind, "SEND")) continue;
    const TraceEvent* start = nullptr;
    for (const auto& [fid, f] : flow_start) {
      if (f->pid == e.pid && f->tid == e.tid && f->ts == e.ts) start = f;
    }
    ASSERT_NE(start, nullptr) << "no flow from " << e.name << " of pid " << e.pid;
    ASSERT_TRUE(flow_end.contains(start->id)) << "flow " << start->id << " has no end";
    const TraceEvent* recv = slice_at(*flow_end.at(start->id));
    ASSERT_NE(recv, nullptr) << "the flow from " << e.name << " ends outside any slice";
    EXPECT_EQ(recv->kind, e.kind == "SEND_F" ? "RECV_F" : "RECV_B") << e.name;
    EXPECT_EQ(recv->micro_batch, e.micro_batch) << e.name;
    EXPECT_EQ(std::abs(recv->pid - e.pid), 1) << e.name;
  }
  // Per-stage busy time: the trace against GetJob's figure for step 6, index 5 (the trace nudges a
  // slice by 1 ns at most where two would start in one microsecond).
  const v1::StepSummary& step5 = job->history(5);
  ASSERT_EQ(step5.step(), 5);
  ASSERT_EQ(step5.stage_busy_seconds_size(), 2);
  for (int stage = 0; stage < 2; ++stage) {
    EXPECT_GT(step5.stage_busy_seconds(stage), 0.0);
    EXPECT_NEAR(busy_us[stage + 1], step5.stage_busy_seconds(stage) * 1e6, 0.02) << stage;
  }

  // Several steps in one file; a step that is not kept names the kept ones.
  r = cluster_->Cli({"trace", *id, "--steps", "1..6", "-o", json_path});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  int all_computes = 0;
  for (const TraceEvent& e : ParseTrace(ReadFile(json_path))) {
    all_computes += e.ph == "X" && e.cat == "compute";
  }
  EXPECT_EQ(all_computes, 6 * 16);
  r = cluster_->Cli({"trace", *id, "--step", "99", "-o", json_path});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("keeps no timings of step 99; kept steps: 1..6"));

  const std::string svg_path = cluster_->dir() + "/trace.svg";
  r = cluster_->Cli({"trace", *id, "--step", "3", "--svg", "-o", svg_path});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string svg = ReadFile(svg_path);
  EXPECT_EQ(CountOf(svg, "<g class=\"row\""), 2) << svg;
  EXPECT_EQ(CountOf(svg, "<rect class=\"act "), 16);
  EXPECT_THAT(svg, HasSubstr("step 3: 1f1b, 2 ranks, 4 micro-batches"));

  // The workers' clocks: on one host the true offset is 0, so the estimate is within its
  // error bound (half the best heartbeat round trip).
  auto workers = cluster_->Workers();
  ASSERT_TRUE(workers.ok()) << workers.status();
  for (const v1::WorkerInfo& w : *workers) {
    EXPECT_GE(w.clock_uncertainty_us(), 0) << w.worker_id();
    EXPECT_LE(std::abs(w.clock_offset_us()), w.clock_uncertainty_us()) << w.worker_id();
  }
}

// Every example spec in examples/ runs to SUCCEEDED (shortened to a few steps; the GPU one on
// CPU workers). The text-file example trains on a file the test writes under the workers'
// data root.
TEST_F(ClusterTest, EveryExampleSpecRuns) {
  StartCluster(4);
  int ran = 0;
  for (const auto& entry :
       std::filesystem::directory_iterator(std::string(TANDEM_SOURCE_DIR) + "/examples")) {
    if (entry.path().extension() != ".yaml") continue;
    std::string yaml = ReadFile(entry.path().string());
    yaml = std::regex_replace(yaml, std::regex("(^|\n)steps: *[0-9]+"), "$1steps: 3");
    // A GPU example runs its pipeline on these CPU workers, in fp32 (scripts/gpu-check.sh
    // runs it on a GPU).
    yaml = std::regex_replace(yaml, std::regex("(^|\n)device: *cuda"), "$1device: cpu");
    yaml = std::regex_replace(yaml, std::regex("(^|\n)precision: *bf16"), "$1precision: fp32");
    std::smatch path;
    if (std::regex_search(yaml, path, std::regex("\n +path: *([A-Za-z0-9_./*-]+)"))) {
      // Text for byte data; for token data the same bytes read as headerless uint16 tokens
      // (pairs of ASCII letters, all below GPT-2's vocabulary).
      const std::string file =
          cluster_->dir() + "/" + std::regex_replace(path[1].str(), std::regex("\\*"), "000");
      std::filesystem::create_directories(std::filesystem::path(file).parent_path());
      std::ofstream out(file);
      for (int i = 0; i < 400; ++i) out << "the quick brown fox jumps over the lazy dog. ";
    }
    auto id = cluster_->Submit(yaml);
    ASSERT_TRUE(id.ok()) << entry.path() << ": " << id.status();
    auto job = cluster_->WaitForEnd(*id, 120s);
    ASSERT_TRUE(job.ok()) << job.status();
    EXPECT_EQ(job->state(), v1::SUCCEEDED) << entry.path() << ": " << job->reason();
    EXPECT_EQ(job->steps_done(), 3) << entry.path();
    ++ran;
  }
  EXPECT_GE(ran, 4);
}

// A cpu worker runs the GEMM kernels its processor can. Where OpenBLAS takes the processor for
// an older one (this project's VMs: an AVX-512 Xeon taken for a Prescott), the worker starts
// itself again with OPENBLAS_CORETYPE, says so, and registers the processor's kernels; with
// --blas_core=keep it keeps OpenBLAS's choice. On a processor OpenBLAS knows neither starts
// again. This test process (no OPENBLAS_CORETYPE) sees OpenBLAS's own choice.
TEST_F(ClusterTest, ACpuWorkerStartsAgainOnTheKernelsItsProcessorRuns) {
  if (const char* set = std::getenv("OPENBLAS_CORETYPE"); set != nullptr) {
    GTEST_SKIP() << "OPENBLAS_CORETYPE=" << set << " is set here, and every worker inherits it";
  }
  const std::string own = worker::OpenBlasCoreName();
  const std::string better = worker::BetterBlasCoreType();
  StartCluster(1);
  ASSERT_TRUE(cluster_->AddWorker({"--blas_core=keep"}).ok());
  auto workers = cluster_->Workers();
  ASSERT_TRUE(workers.ok()) << workers.status();
  ASSERT_EQ(workers->size(), 2u);
  std::vector<std::string> names;
  for (const v1::WorkerInfo& w : *workers) names.push_back(w.device_name());
  const std::string chosen = " / OpenBLAS " + (better.empty() ? own : better);
  EXPECT_THAT(names, ::testing::UnorderedElementsAre(::testing::EndsWith(chosen),
                                                     ::testing::EndsWith(" / OpenBLAS " + own)));
  const std::string auto_log = ReadFile(cluster_->worker(0).log_path());
  const std::string keep_log = ReadFile(cluster_->worker(1).log_path());
  if (better.empty()) {
    EXPECT_THAT(auto_log, ::testing::Not(HasSubstr("started again")));
  } else {
    EXPECT_THAT(auto_log, HasSubstr("started again with OPENBLAS_CORETYPE=" + better +
                                    " (OpenBLAS had chosen its " + own + " GEMM kernels)"));
    EXPECT_THAT(auto_log,
                ::testing::Not(HasSubstr("did not recognise the model")));  // no advice left
    EXPECT_THAT(keep_log, HasSubstr("OPENBLAS_CORETYPE=" + better + " or --blas_core=auto"));
  }
  EXPECT_THAT(keep_log, ::testing::Not(HasSubstr("started again")));
  // Restarted or not, both train: a 2-stage job across the two kernels' workers succeeds.
  auto id = cluster_->Submit(TinyJobYaml(2, 2, 3));
  ASSERT_TRUE(id.ok()) << id.status();
  auto job = cluster_->WaitForEnd(*id, 120s);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->state(), v1::SUCCEEDED) << job->reason();

  CommandResult bad = RunCommand({std::string(TANDEM_BIN_DIR) + "/tandem-worker",
                                  "--coordinator=" + cluster_->address(), "--blas_core=fast!"});
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_THAT(bad.err, HasSubstr("--blas_core=fast!: expected auto"));

  // A core type named by the flag: the worker starts again on those kernels whatever its
  // processor (Prescott's SSE3 kernels run on every x86-64), as the same process: the child
  // the harness started is the one that registered and still runs.
  if (own == "NEOVERSEN1" || absl::StrContains(own, "ARM") || own == "RISCV64_GENERIC") {
    GTEST_SKIP() << "not an x86-64 processor (OpenBLAS " << own << ")";
  }
  ASSERT_TRUE(cluster_->AddWorker({"--blas_core=Prescott"}).ok());
  auto three = cluster_->Workers();
  ASSERT_TRUE(three.ok()) << three.status();
  ASSERT_EQ(three->size(), 3u);
  int on_prescott = 0;
  for (const v1::WorkerInfo& w : *three) {
    on_prescott += absl::EndsWith(w.device_name(), " / OpenBLAS Prescott") ? 1 : 0;
  }
  // Where OpenBLAS itself chose Prescott, the keep worker runs it too, and so does the auto one
  // unless it moved to better kernels.
  EXPECT_EQ(on_prescott, own != "Prescott" ? 1 : better.empty() ? 3 : 2);
  const std::string log = ReadFile(cluster_->worker(2).log_path());
  if (own != "Prescott") {
    EXPECT_THAT(log, HasSubstr("started again with OPENBLAS_CORETYPE=Prescott (OpenBLAS had "
                               "chosen its " +
                               own + " GEMM kernels): OpenBLAS now runs its Prescott kernels"));
  }
  if (!worker::BetterBlasCoreType(ReadFile("/proc/cpuinfo"), "Prescott").empty()) {
    EXPECT_THAT(log, HasSubstr(", as OPENBLAS_CORETYPE=Prescott asks."));
  }
  EXPECT_TRUE(cluster_->worker(2).Running());
}

}  // namespace
}  // namespace tandem::testing
