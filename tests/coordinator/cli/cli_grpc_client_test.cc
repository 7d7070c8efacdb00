// The gRPC CoordinatorClient against an in-process fake Coordinator service: every request
// carries the protocol version and a deadline, the watch stream is delivered in order, and a
// broken stream or a dead address is an error.
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/version.h"
#include "coordinator/cli/coordinator_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tandem/v1/coordinator.grpc.pb.h"

namespace tandem::cli {
namespace {

using ::testing::Each;
using ::testing::HasSubstr;

class FakeCoordinator final : public v1::Coordinator::Service {
 public:
  grpc::Status SubmitJob(grpc::ServerContext* ctx, const v1::SubmitJobRequest* req,
                         v1::SubmitJobResponse* resp) override {
    Record(ctx, req->protocol_version());
    if (req->spec_yaml().find("bad") != std::string::npos) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "steps: must be in [1, 10000000]");
    }
    resp->set_job_id("job-1");
    return grpc::Status::OK;
  }
  grpc::Status GetJob(grpc::ServerContext* ctx, const v1::GetJobRequest* req,
                      v1::Job* resp) override {
    Record(ctx, req->protocol_version());
    if (req->job_id() == "slow") std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    resp->set_id(req->job_id());
    resp->set_state(v1::RUNNING);
    return grpc::Status::OK;
  }
  grpc::Status ListJobs(grpc::ServerContext* ctx, const v1::ListJobsRequest* req,
                        v1::ListJobsResponse* resp) override {
    Record(ctx, req->protocol_version());
    resp->add_jobs()->set_id("job-1");
    return grpc::Status::OK;
  }
  grpc::Status CancelJob(grpc::ServerContext* ctx, const v1::CancelJobRequest* req,
                         v1::Job* resp) override {
    Record(ctx, req->protocol_version());
    resp->set_id(req->job_id());
    resp->set_state(v1::CANCELLED);
    return grpc::Status::OK;
  }
  grpc::Status ListWorkers(grpc::ServerContext* ctx, const v1::ListWorkersRequest* req,
                           v1::ListWorkersResponse* resp) override {
    Record(ctx, req->protocol_version());
    resp->add_workers()->set_worker_id("w-1");
    return grpc::Status::OK;
  }
  grpc::Status WatchJob(grpc::ServerContext* ctx, const v1::WatchJobRequest* req,
                        grpc::ServerWriter<v1::JobEvent>* writer) override {
    Record(ctx, req->protocol_version());
    v1::JobEvent e;
    e.set_job_id(req->job_id());
    e.set_kind(v1::JobEvent::SNAPSHOT);
    writer->Write(e);
    if (req->job_id() == "breaks") {
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, "coordinator shutting down");
    }
    for (int step = 1; step <= 3; ++step) {
      e.set_kind(v1::JobEvent::STEP);
      e.mutable_step()->set_step(step);
      writer->Write(e);
    }
    e.set_kind(v1::JobEvent::STATE);
    e.set_state(v1::SUCCEEDED);
    writer->Write(e);
    return grpc::Status::OK;
  }

  grpc::Status PlanJob(grpc::ServerContext* ctx, const v1::PlanJobRequest* req,
                       v1::PlanJobResponse* resp) override {
    Record(ctx, req->protocol_version());
    v1::PlanCandidateInfo* c = resp->add_candidates();
    c->set_schedule(req->spec().pipeline().schedule());
    c->set_micro_batches(req->spec().pipeline().micro_batches());
    resp->set_chosen(0);
    return grpc::Status::OK;
  }

  std::vector<uint32_t> versions() {
    std::lock_guard<std::mutex> lock(mu_);
    return versions_;
  }
  std::vector<double> deadline_seconds() {
    std::lock_guard<std::mutex> lock(mu_);
    return deadline_seconds_;
  }

 private:
  void Record(grpc::ServerContext* ctx, uint32_t version) {
    std::lock_guard<std::mutex> lock(mu_);
    versions_.push_back(version);
    deadline_seconds_.push_back(
        std::chrono::duration<double>(ctx->deadline() - std::chrono::system_clock::now()).count());
  }

  std::mutex mu_;
  std::vector<uint32_t> versions_;
  std::vector<double> deadline_seconds_;
};

class GrpcClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    address_ = "127.0.0.1:" + std::to_string(port);
    client_ = NewGrpcCoordinatorClient(address_, absl::Seconds(5), absl::Hours(24 * 7));
  }
  void TearDown() override {
    if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  }

  FakeCoordinator service_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
  std::unique_ptr<CoordinatorClient> client_;
};

TEST_F(GrpcClientTest, EveryCallCarriesVersionAndDeadline) {
  ASSERT_EQ(*client_->SubmitJob("steps: 3"), "job-1");
  ASSERT_EQ(client_->GetJob("job-1")->id(), "job-1");
  ASSERT_EQ(client_->ListJobs()->jobs_size(), 1);
  ASSERT_EQ(client_->CancelJob("job-1")->state(), v1::CANCELLED);
  ASSERT_EQ(client_->ListWorkers()->workers_size(), 1);
  ASSERT_TRUE(client_->WatchJob("job-1", [](const v1::JobEvent&) { return true; }).ok());
  EXPECT_THAT(service_.versions(), Each(kProtocolVersion));
  const std::vector<double> deadlines = service_.deadline_seconds();
  ASSERT_EQ(deadlines.size(), 6u);
  for (size_t i = 0; i < 5; ++i) {
    EXPECT_GT(deadlines[i], 3) << i;
    EXPECT_LE(deadlines[i], 5.5) << i;
  }
  // The watch stream: long, but finite.
  EXPECT_GT(deadlines[5], 6.9 * 86400);
  EXPECT_LT(deadlines[5], 7.1 * 86400);
}

TEST_F(GrpcClientTest, PlanJobSendsTheSpecWithALongDeadline) {
  v1::JobSpec spec;
  spec.mutable_pipeline()->set_schedule("zb_h1");
  spec.mutable_pipeline()->set_micro_batches(8);
  absl::StatusOr<v1::PlanJobResponse> plan = client_->PlanJob(spec);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->candidates_size(), 1);
  EXPECT_EQ(plan->candidates(0).schedule(), "zb_h1");
  EXPECT_EQ(plan->candidates(0).micro_batches(), 8);
  EXPECT_THAT(service_.versions(), Each(kProtocolVersion));
  // The search may profile the model at several sizes first: far past the unary timeout.
  ASSERT_EQ(service_.deadline_seconds().size(), 1u);
  EXPECT_GT(service_.deadline_seconds()[0], 1700);
}

TEST_F(GrpcClientTest, ServerErrorsPassThrough) {
  absl::StatusOr<std::string> id = client_->SubmitJob("bad: 1");
  ASSERT_FALSE(id.ok());
  EXPECT_EQ(id.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(id.status().message(), "steps: must be in [1, 10000000]");
}

TEST_F(GrpcClientTest, UnaryTimeout) {
  auto client = NewGrpcCoordinatorClient(address_, absl::Milliseconds(200), absl::Seconds(5));
  absl::StatusOr<v1::Job> job = client->GetJob("slow");
  ASSERT_FALSE(job.ok());
  EXPECT_EQ(job.status().code(), absl::StatusCode::kDeadlineExceeded);
}

TEST_F(GrpcClientTest, WatchDeliversEventsInOrder) {
  std::vector<v1::JobEvent::Kind> kinds;
  absl::Status s = client_->WatchJob("job-1", [&](const v1::JobEvent& e) {
    kinds.push_back(e.kind());
    return true;
  });
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_THAT(kinds,
              ::testing::ElementsAre(v1::JobEvent::SNAPSHOT, v1::JobEvent::STEP, v1::JobEvent::STEP,
                                     v1::JobEvent::STEP, v1::JobEvent::STATE));
}

TEST_F(GrpcClientTest, WatchStoppedByTheCallerIsOk) {
  int seen = 0;
  absl::Status s = client_->WatchJob("job-1", [&](const v1::JobEvent&) { return ++seen < 2; });
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(seen, 2);
}

TEST_F(GrpcClientTest, BrokenWatchStreamIsAnError) {
  int seen = 0;
  absl::Status s = client_->WatchJob("breaks", [&](const v1::JobEvent&) { return ++seen > 0; });
  EXPECT_EQ(seen, 1);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(s.message(), HasSubstr("shutting down"));
}

TEST(GrpcClient, DeadAddressIsUnavailable) {
  // Port 1 on loopback: nothing listens there.
  auto client = NewGrpcCoordinatorClient("127.0.0.1:1", absl::Seconds(5), absl::Seconds(5));
  const auto t0 = std::chrono::steady_clock::now();
  absl::StatusOr<v1::ListJobsResponse> jobs = client->ListJobs();
  ASSERT_FALSE(jobs.ok());
  EXPECT_EQ(jobs.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(3));
  absl::Status watch = client->WatchJob("job-1", [](const v1::JobEvent&) { return true; });
  EXPECT_EQ(watch.code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace tandem::cli
