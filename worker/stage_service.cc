#include "worker/stage_service.h"

#include <algorithm>

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
  absl::StatusOr<v1::StepReport> r =
      manager_->RunStep(req->job_id(), req->step(), req->mode(), req->attempt(),
                        req->has_apply_first() ? &req->apply_first() : nullptr);
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

grpc::Status StageWorkerService::SaveCheckpoint(grpc::ServerContext* ctx,
                                                const v1::SaveCheckpointRequest* req,
                                                grpc::ServerWriter<v1::TensorChunk>* writer) {
  if (absl::Status s = CheckProtocolVersion(req->protocol_version(), kServerName); !s.ok()) {
    return ToGrpcStatus(s);
  }
  constexpr size_t kChunkBytes = 1 << 20;
  auto stream = [&](const std::vector<StageExecutor::StateTensor>& tensors) -> absl::Status {
    v1::TensorChunk index;
    for (const auto& t : tensors) {
      v1::TensorMeta* m = index.add_index();
      m->set_name(t.name);
      m->set_dtype(t.dtype);
      for (int64_t d : t.shape) m->add_shape(d);
    }
    if (!writer->Write(index)) return absl::CancelledError("checkpoint stream closed");
    for (const auto& t : tensors) {
      const char* p = static_cast<const char*>(t.data);
      for (size_t off = 0; off < t.bytes; off += kChunkBytes) {
        v1::TensorChunk chunk;
        chunk.set_data(p + off, std::min(kChunkBytes, t.bytes - off));
        if (ctx->IsCancelled() || !writer->Write(chunk)) {
          return absl::CancelledError("checkpoint stream closed");
        }
      }
    }
    return absl::OkStatus();
  };
  return ToGrpcStatus(manager_->SaveCheckpoint(req->job_id(), req->step(), stream, req->attempt()));
}

grpc::Status StageWorkerService::Abort(grpc::ServerContext* ctx, const v1::AbortRequest* req,
                                       v1::AbortResponse* resp) {
  if (absl::Status s = CheckProtocolVersion(req->protocol_version(), kServerName); !s.ok()) {
    return ToGrpcStatus(s);
  }
  return ToGrpcStatus(manager_->Abort(req->job_id(), req->reason()));
}

grpc::Status StageWorkerService::ProfileLayers(grpc::ServerContext* ctx,
                                               const v1::ProfileLayersRequest* req,
                                               v1::ProfileLayersResponse* resp) {
  if (absl::Status s = CheckProtocolVersion(req->protocol_version(), kServerName); !s.ok()) {
    return ToGrpcStatus(s);
  }
  if (req->layers_size() > 4096) {
    return ToGrpcStatus(absl::InvalidArgumentError("profile: at most 4096 layers per request"));
  }
  absl::StatusOr<std::vector<v1::LayerProfile>> layers = manager_->ProfileLayers(
      req->spec(), std::vector<int>(req->layers().begin(), req->layers().end()), req->repeats());
  if (!layers.ok()) return ToGrpcStatus(layers.status());
  for (auto& l : *layers) *resp->add_layers() = std::move(l);
  return grpc::Status::OK;
}

grpc::Status StageWorkerService::ProbeLink(grpc::ServerContext* ctx,
                                           const v1::ProbeLinkRequest* req,
                                           v1::ProbeLinkResponse* resp) {
  if (absl::Status s = CheckProtocolVersion(req->protocol_version(), kServerName); !s.ok()) {
    return ToGrpcStatus(s);
  }
  absl::StatusOr<v1::ProbeLinkResponse> probed = manager_->ProbeLink(*req);
  if (!probed.ok()) return ToGrpcStatus(probed.status());
  *resp = *std::move(probed);
  return grpc::Status::OK;
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
