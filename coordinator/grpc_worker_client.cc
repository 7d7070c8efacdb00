// gRPC implementation of StageWorkerClient (the only coordinator file that dials workers).
#include <grpcpp/grpcpp.h>

#include <list>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/rpc.h"
#include "common/status_macros.h"
#include "common/tls.h"
#include "common/version.h"
#include "coordinator/worker_client.h"
#include "tandem/v1/worker.grpc.pb.h"

namespace tandem::coordinator {
namespace {

std::chrono::milliseconds ToChrono(absl::Duration d) {
  return std::chrono::milliseconds(absl::ToInt64Milliseconds(d));
}

class GrpcStageWorkerClient final : public StageWorkerClient {
 public:
  GrpcStageWorkerClient(const std::string& address, const ChannelSecurity& security)
      : stub_(v1::StageWorker::NewStub(MakeChannel(address, security))) {}

  ~GrpcStageWorkerClient() override {
    CancelPending();
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](std::list<grpc::ClientContext>* l) { return l->empty(); }, &pending_));
  }

  void Configure(const v1::ConfigureRequest& request, v1::ConfigureResponse* response,
                 absl::Duration timeout, Done done) override {
    Call(request, response, timeout, std::move(done),
         [this](auto... args) { stub_->async()->Configure(args...); });
  }

  void RunStep(const v1::RunStepRequest& request, v1::RunStepResponse* response,
               absl::Duration timeout, Done done) override {
    Call(request, response, timeout, std::move(done),
         [this](auto... args) { stub_->async()->RunStep(args...); });
  }

  void ApplyStep(const v1::ApplyStepRequest& request, v1::ApplyStepResponse* response,
                 absl::Duration timeout, Done done) override {
    Call(request, response, timeout, std::move(done),
         [this](auto... args) { stub_->async()->ApplyStep(args...); });
  }

  absl::Status SaveCheckpoint(
      const v1::SaveCheckpointRequest& request, absl::Duration timeout,
      const std::function<absl::Status(const v1::TensorChunk&)>& on_chunk) override {
    v1::SaveCheckpointRequest req = request;
    req.set_protocol_version(kProtocolVersion);
    grpc::ClientContext ctx;
    SetDeadline(ctx, ToChrono(timeout));
    auto reader = stub_->SaveCheckpoint(&ctx, req);
    v1::TensorChunk chunk;
    absl::Status sink = absl::OkStatus();
    while (sink.ok() && reader->Read(&chunk)) sink = on_chunk(chunk);
    if (!sink.ok()) {
      ctx.TryCancel();
      (void)reader->Finish();
      return sink;
    }
    return FromGrpcStatus(reader->Finish());
  }

  absl::Status Abort(const v1::AbortRequest& request, absl::Duration timeout) override {
    v1::AbortRequest req = request;
    req.set_protocol_version(kProtocolVersion);
    v1::AbortResponse resp;
    grpc::ClientContext ctx;
    SetDeadline(ctx, ToChrono(timeout));
    return FromGrpcStatus(stub_->Abort(&ctx, req, &resp));
  }

  absl::StatusOr<v1::ProfileLayersResponse> ProfileLayers(const v1::ProfileLayersRequest& request,
                                                          absl::Duration timeout) override {
    v1::ProfileLayersRequest req = request;
    req.set_protocol_version(kProtocolVersion);
    v1::ProfileLayersResponse resp;
    grpc::ClientContext ctx;
    SetDeadline(ctx, ToChrono(timeout));
    RETURN_IF_ERROR(FromGrpcStatus(stub_->ProfileLayers(&ctx, req, &resp)));
    return resp;
  }

  void ProbeLink(const v1::ProbeLinkRequest& request, v1::ProbeLinkResponse* response,
                 absl::Duration timeout, Done done) override {
    Call(request, response, timeout, std::move(done),
         [this](auto... args) { stub_->async()->ProbeLink(args...); });
  }

  absl::Status Probe(absl::Duration timeout) override {
    v1::GetStatusRequest req;
    req.set_protocol_version(kProtocolVersion);
    v1::WorkerStatus resp;
    grpc::ClientContext ctx;
    SetDeadline(ctx, ToChrono(timeout));
    return FromGrpcStatus(stub_->GetStatus(&ctx, req, &resp));
  }

  void CancelPending() override {
    absl::MutexLock lock(&mu_);
    for (auto& ctx : pending_) ctx.TryCancel();
  }

 private:
  using ContextIt = std::list<grpc::ClientContext>::iterator;

  // One asynchronous unary call: copies the request (it must outlive the call), stamps the
  // protocol version, tracks the context for CancelPending, and runs `done` once.
  template <typename Request, typename Response, typename Issue>
  void Call(const Request& request, Response* response, absl::Duration timeout, Done done,
            Issue issue) {
    auto req = std::make_shared<Request>(request);
    req->set_protocol_version(kProtocolVersion);
    auto it = NewContext(timeout);
    std::function<void(grpc::Status)> finish = [this, it, req, done](grpc::Status s) {
      Finish(it, s, done);
    };
    issue(&*it, static_cast<const Request*>(req.get()), response, std::move(finish));
  }

  ContextIt NewContext(absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    pending_.emplace_back();
    auto it = std::prev(pending_.end());
    SetDeadline(*it, ToChrono(timeout));
    return it;
  }

  void Finish(ContextIt it, const grpc::Status& s, const Done& done) {
    done(FromGrpcCall(s, *it));
    absl::MutexLock lock(&mu_);
    pending_.erase(it);
  }

  std::unique_ptr<v1::StageWorker::Stub> stub_;
  absl::Mutex mu_;
  std::list<grpc::ClientContext> pending_ ABSL_GUARDED_BY(mu_);
};

class GrpcFactory final : public StageWorkerClientFactory {
 public:
  explicit GrpcFactory(ChannelSecurity security) : security_(std::move(security)) {}

  std::unique_ptr<StageWorkerClient> Connect(const std::string& address) override {
    return std::make_unique<GrpcStageWorkerClient>(address, security_);
  }

 private:
  const ChannelSecurity security_;
};

}  // namespace

std::unique_ptr<StageWorkerClientFactory> MakeGrpcStageWorkerClientFactory(
    ChannelSecurity security) {
  return std::make_unique<GrpcFactory>(std::move(security));
}

}  // namespace tandem::coordinator
