#include "worker/stage_service.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/rpc.h"

namespace tandem::worker {
namespace {

constexpr char kServerName[] = "tandem-worker";
// A stage's state is a few tensors per layer: far fewer than this.
constexpr int kMaxStateNames = 1 << 20;

// Streams `tensors`: the index first, then their bytes back to back in chunks of 1 MiB.
absl::Status WriteTensorStream(grpc::ServerContext* ctx,
                               grpc::ServerWriter<v1::TensorChunk>* writer,
                               const std::vector<StageExecutor::StateTensor>& tensors) {
  constexpr size_t kChunkBytes = 1 << 20;
  v1::TensorChunk index;
  for (const auto& t : tensors) {
    v1::TensorMeta* m = index.add_index();
    m->set_name(t.name);
    m->set_dtype(t.dtype);
    for (int64_t d : t.shape) m->add_shape(d);
  }
  if (!writer->Write(index)) return absl::CancelledError("tensor stream closed");
  for (const auto& t : tensors) {
    const char* p = static_cast<const char*>(t.data);
    for (size_t off = 0; off < t.bytes; off += kChunkBytes) {
      v1::TensorChunk chunk;
      chunk.set_data(p + off, std::min(kChunkBytes, t.bytes - off));
      if (ctx->IsCancelled() || !writer->Write(chunk)) {
        return absl::CancelledError("tensor stream closed");
      }
    }
  }
  return absl::OkStatus();
}

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
  if (req->relay_size() == 0) {
    absl::StatusOr<v1::StepReport> r =
        manager_->RunStep(req->job_id(), req->step(), req->mode(), req->attempt(),
                          req->has_apply_first() ? &req->apply_first() : nullptr);
    if (!r.ok()) return ToGrpcStatus(r.status());
    *resp->mutable_report() = *std::move(r);
    return grpc::Status::OK;
  }
  return RelayedRunStep(ctx, req, resp);
}

grpc::Status StageWorkerService::RelayedRunStep(grpc::ServerContext* ctx,
                                                const v1::RunStepRequest* req,
                                                v1::RunStepResponse* resp) {
  if (relay_ == nullptr) {
    return ToGrpcStatus(absl::FailedPreconditionError("this worker was started without a relay"));
  }
  if (absl::Status s = ValidateRelay(req->relay()); !s.ok()) return ToGrpcStatus(s);
  // The forwarded calls end a little before this call's deadline, so that a child that timed
  // out is reported as such (and by its rank) before the caller gives up on this worker.
  const auto deadline = ctx->deadline();
  const auto now = std::chrono::system_clock::now();
  const auto margin =
      std::min<std::chrono::system_clock::duration>(std::chrono::seconds(2), (deadline - now) / 20);
  struct Wait {
    absl::Mutex mu;
    bool done ABSL_GUARDED_BY(mu) = false;
    absl::Status failure ABSL_GUARDED_BY(mu);  // the first relayed failure
    int failed_rank ABSL_GUARDED_BY(mu) = -1;
    std::vector<v1::RelayedStep> relayed ABSL_GUARDED_BY(mu);
  };
  auto wait = std::make_shared<Wait>();
  const std::string job_id = req->job_id();
  relay_->Forward(
      *req, deadline > now + margin ? deadline - margin : deadline,
      [this, wait, job_id](const absl::Status& s, int rank) {
        {
          absl::MutexLock lock(&wait->mu);
          wait->failure = s;
          wait->failed_rank = rank;
        }
        // Its own step may wait on the failed peer: abort it, so that this call answers now.
        // The stage stays until the coordinator's Abort, which may keep its state (peer
        // recovery).
        manager_->AbortStep(
            job_id, absl::StrCat("the worker of rank ", rank, " (relayed) failed: ", s.message()));
      },
      [wait](StepRelay::Outcome outcome) {
        absl::MutexLock lock(&wait->mu);
        wait->relayed = std::move(outcome.relayed);
        wait->done = true;
      });
  absl::StatusOr<v1::StepReport> r =
      manager_->RunStep(req->job_id(), req->step(), req->mode(), req->attempt(),
                        req->has_apply_first() ? &req->apply_first() : nullptr);
  absl::MutexLock lock(&wait->mu);
  // Its own failure answers at once (the caller aborts the gang, which ends the forwarded calls);
  // so does a relayed failure, which is reported under the rank that failed (its own step's
  // ABORTED is then only the consequence).
  if (!r.ok() && wait->failure.ok()) return ToGrpcStatus(r.status());
  wait->mu.Await(absl::Condition(
      +[](Wait* w) ABSL_EXCLUSIVE_LOCKS_REQUIRED(w->mu) { return w->done || !w->failure.ok(); },
      wait.get()));
  if (!wait->failure.ok()) {
    ctx->AddTrailingMetadata(kRelayedRankKey, absl::StrCat(wait->failed_rank));
    return ToGrpcStatus(wait->failure);
  }
  *resp->mutable_report() = *std::move(r);
  for (v1::RelayedStep& s : wait->relayed) *resp->add_relayed() = std::move(s);
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
  auto stream = [&](const std::vector<StageExecutor::StateTensor>& tensors) {
    return WriteTensorStream(ctx, writer, tensors);
  };
  return ToGrpcStatus(manager_->SaveCheckpoint(req->job_id(), req->step(), stream, req->attempt()));
}

grpc::Status StageWorkerService::ReadState(grpc::ServerContext* ctx,
                                           const v1::ReadStateRequest* req,
                                           grpc::ServerWriter<v1::TensorChunk>* writer) {
  if (absl::Status s = CheckProtocolVersion(req->protocol_version(), kServerName); !s.ok()) {
    return ToGrpcStatus(s);
  }
  if (req->names_size() > kMaxStateNames) {
    return ToGrpcStatus(absl::InvalidArgumentError(
        absl::StrCat("read state: at most ", kMaxStateNames, " names per request")));
  }
  auto stream = [&](const std::vector<StageExecutor::StateTensor>& tensors) {
    return WriteTensorStream(ctx, writer, tensors);
  };
  return ToGrpcStatus(manager_->ReadState(req->job_id(), req->step(),
                                          {req->names().begin(), req->names().end()}, stream));
}

grpc::Status StageWorkerService::Abort(grpc::ServerContext* ctx, const v1::AbortRequest* req,
                                       v1::AbortResponse* resp) {
  if (absl::Status s = CheckProtocolVersion(req->protocol_version(), kServerName); !s.ok()) {
    return ToGrpcStatus(s);
  }
  return ToGrpcStatus(manager_->Abort(
      req->job_id(), req->reason(),
      req->retain_state() ? std::optional<int64_t>(req->retain_step()) : std::nullopt,
      req->has_retain_apply() ? &req->retain_apply() : nullptr));
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
      req->spec(), std::vector<int>(req->layers().begin(), req->layers().end()), req->repeats(),
      req->forward_backward_only() ? ProfilePasses::kForwardBackward : ProfilePasses::kAll);
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
