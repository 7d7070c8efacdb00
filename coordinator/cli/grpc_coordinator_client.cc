// The gRPC implementation of CoordinatorClient: the one file of the CLI that sees the stub.
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/rpc.h"
#include "common/status_macros.h"
#include "common/tls.h"
#include "common/version.h"
#include "coordinator/cli/coordinator_client.h"
#include "tandem/v1/coordinator.grpc.pb.h"

namespace tandem::cli {
namespace {

class GrpcCoordinatorClient final : public CoordinatorClient {
 public:
  GrpcCoordinatorClient(const std::string& address, absl::Duration timeout,
                        absl::Duration watch_timeout, const ChannelSecurity& security)
      : stub_(v1::Coordinator::NewStub(MakeChannel(address, security))),
        timeout_(absl::ToChronoMilliseconds(timeout)),
        watch_timeout_(absl::ToChronoMilliseconds(watch_timeout)) {}

  absl::StatusOr<std::string> SubmitJob(const std::string& spec_yaml) override {
    v1::SubmitJobRequest req;
    req.set_protocol_version(kProtocolVersion);
    req.set_spec_yaml(spec_yaml);
    v1::SubmitJobResponse resp;
    grpc::ClientContext ctx;
    SetDeadline(ctx, timeout_);
    RETURN_IF_ERROR(FromGrpcStatus(stub_->SubmitJob(&ctx, req, &resp)));
    return resp.job_id();
  }

  absl::StatusOr<v1::Job> GetJob(const std::string& job_id, uint32_t history_limit) override {
    v1::GetJobRequest req;
    req.set_protocol_version(kProtocolVersion);
    req.set_job_id(job_id);
    req.set_history_limit(history_limit);
    return Unary(&v1::Coordinator::Stub::GetJob, req);
  }

  absl::StatusOr<v1::ListJobsResponse> ListJobs() override {
    v1::ListJobsRequest req;
    req.set_protocol_version(kProtocolVersion);
    return Unary(&v1::Coordinator::Stub::ListJobs, req);
  }

  absl::StatusOr<v1::Job> CancelJob(const std::string& job_id) override {
    v1::CancelJobRequest req;
    req.set_protocol_version(kProtocolVersion);
    req.set_job_id(job_id);
    return Unary(&v1::Coordinator::Stub::CancelJob, req);
  }

  absl::StatusOr<v1::ListWorkersResponse> ListWorkers() override {
    v1::ListWorkersRequest req;
    req.set_protocol_version(kProtocolVersion);
    return Unary(&v1::Coordinator::Stub::ListWorkers, req);
  }

  absl::StatusOr<v1::WorkerInfo> GetWorker(const std::string& worker_id) override {
    v1::GetWorkerRequest req;
    req.set_protocol_version(kProtocolVersion);
    req.set_worker_id(worker_id);
    return Unary(&v1::Coordinator::Stub::GetWorker, req);
  }

  absl::StatusOr<v1::GetJobTraceResponse> GetJobTrace(
      const v1::GetJobTraceRequest& request) override {
    v1::GetJobTraceRequest req = request;
    req.set_protocol_version(kProtocolVersion);
    return Unary(&v1::Coordinator::Stub::GetJobTrace, req);
  }

  absl::StatusOr<v1::ModelProfile> ProfileModel(const v1::JobSpec& spec, bool refresh) override {
    v1::ProfileModelRequest req;
    req.set_protocol_version(kProtocolVersion);
    *req.mutable_spec() = spec;
    req.set_refresh(refresh);
    v1::ModelProfile resp;
    grpc::ClientContext ctx;
    // Measuring a large model's head takes a while; a cached profile answers at once.
    SetDeadline(ctx, std::max(timeout_, std::chrono::milliseconds(600000)));
    RETURN_IF_ERROR(FromGrpcStatus(stub_->ProfileModel(&ctx, req, &resp)));
    return resp;
  }

  absl::StatusOr<v1::PlanJobResponse> PlanJob(const v1::JobSpec& spec) override {
    v1::PlanJobRequest req;
    req.set_protocol_version(kProtocolVersion);
    *req.mutable_spec() = spec;
    v1::PlanJobResponse resp;
    grpc::ClientContext ctx;
    // Every micro-batch size of the search may need a profile measured first.
    SetDeadline(ctx, std::max(timeout_, std::chrono::milliseconds(1800000)));
    RETURN_IF_ERROR(FromGrpcStatus(stub_->PlanJob(&ctx, req, &resp)));
    return resp;
  }

  absl::Status WatchJob(const std::string& job_id,
                        absl::FunctionRef<bool(const v1::JobEvent&)> on_event) override {
    v1::WatchJobRequest req;
    req.set_protocol_version(kProtocolVersion);
    req.set_job_id(job_id);
    grpc::ClientContext ctx;
    SetDeadline(ctx, watch_timeout_);
    std::unique_ptr<grpc::ClientReader<v1::JobEvent>> reader = stub_->WatchJob(&ctx, req);
    v1::JobEvent event;
    bool cancelled = false;
    while (reader->Read(&event)) {
      if (!on_event(event)) {
        ctx.TryCancel();
        cancelled = true;
        break;
      }
    }
    const grpc::Status status = reader->Finish();
    if (cancelled) return absl::OkStatus();
    return FromGrpcStatus(status);
  }

  absl::Status ExportModel(
      const std::string& job_id,
      absl::FunctionRef<absl::Status(const v1::ExportChunk&)> on_chunk) override {
    v1::ExportModelRequest req;
    req.set_protocol_version(kProtocolVersion);
    req.set_job_id(job_id);
    grpc::ClientContext ctx;
    SetDeadline(ctx, watch_timeout_);
    std::unique_ptr<grpc::ClientReader<v1::ExportChunk>> reader = stub_->ExportModel(&ctx, req);
    v1::ExportChunk chunk;
    absl::Status sink = absl::OkStatus();
    while (sink.ok() && reader->Read(&chunk)) sink = on_chunk(chunk);
    if (!sink.ok()) ctx.TryCancel();
    const grpc::Status status = reader->Finish();
    RETURN_IF_ERROR(sink);
    return FromGrpcStatus(status);
  }

 private:
  template <typename Request, typename Response>
  absl::StatusOr<Response> Unary(grpc::Status (v1::Coordinator::Stub::*method)(grpc::ClientContext*,
                                                                               const Request&,
                                                                               Response*),
                                 const Request& req) {
    Response resp;
    grpc::ClientContext ctx;
    SetDeadline(ctx, timeout_);
    RETURN_IF_ERROR(FromGrpcStatus((stub_.get()->*method)(&ctx, req, &resp)));
    return resp;
  }

  std::unique_ptr<v1::Coordinator::Stub> stub_;
  const std::chrono::milliseconds timeout_;
  const std::chrono::milliseconds watch_timeout_;
};

}  // namespace

std::unique_ptr<CoordinatorClient> NewGrpcCoordinatorClient(const std::string& address,
                                                            absl::Duration timeout,
                                                            absl::Duration watch_timeout,
                                                            const ChannelSecurity& security) {
  return std::make_unique<GrpcCoordinatorClient>(address, timeout, watch_timeout, security);
}

}  // namespace tandem::cli
