#include "worker/stage_service.h"

#include "common/rpc.h"

namespace tandem::worker {
namespace {

constexpr char kServerName[] = "tandem-worker";

}  // namespace

grpc::Status StageWorkerService::Configure(grpc::ServerContext* ctx,
                                           const v1::ConfigureRequest* req,
                                           v1::ConfigureResponse* resp) {
  if (absl::Status s = CheckProtocolVersion(req->protocol_version(), kServerName); !s.ok()) {
    return ToGrpcStatus(s);
  }
  absl::StatusOr<v1::ConfigureResponse> r = manager_->Configure(req->program());
  if (!r.ok()) return ToGrpcStatus(r.status());
  *resp = *std::move(r);
  return grpc::Status::OK;
}

grpc::Status StageWorkerService::RunStep(grpc::ServerContext* ctx, const v1::RunStepRequest* req,
                                         v1::RunStepResponse* resp) {
  if (absl::Status s = CheckProtocolVersion(req->protocol_version(), kServerName); !s.ok()) {
    return ToGrpcStatus(s);
  }
  absl::StatusOr<v1::StepReport> r = manager_->RunStep(req->job_id(), req->step(), req->mode());
  if (!r.ok()) return ToGrpcStatus(r.status());
  *resp->mutable_report() = *std::move(r);
  return grpc::Status::OK;
}

grpc::Status StageWorkerService::ApplyStep(grpc::ServerContext* ctx,
                                           const v1::ApplyStepRequest* req,
                                           v1::ApplyStepResponse* resp) {
  if (absl::Status s = CheckProtocolVersion(req->protocol_version(), kServerName); !s.ok()) {
    return ToGrpcStatus(s);
  }
  return ToGrpcStatus(manager_->ApplyStep(*req));
}

grpc::Status StageWorkerService::Abort(grpc::ServerContext* ctx, const v1::AbortRequest* req,
                                       v1::AbortResponse* resp) {
  if (absl::Status s = CheckProtocolVersion(req->protocol_version(), kServerName); !s.ok()) {
    return ToGrpcStatus(s);
  }
  return ToGrpcStatus(manager_->Abort(req->job_id(), req->reason()));
}

grpc::Status StageWorkerService::GetStatus(grpc::ServerContext* ctx,
                                           const v1::GetStatusRequest* req,
                                           v1::WorkerStatus* resp) {
  if (absl::Status s = CheckProtocolVersion(req->protocol_version(), kServerName); !s.ok()) {
    return ToGrpcStatus(s);
  }
  *resp = manager_->GetStatus();
  return grpc::Status::OK;
}

}  // namespace tandem::worker
