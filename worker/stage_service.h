// The StageWorker gRPC service: a thin adapter over StageManager. Each handler checks the
// protocol version, hands the request to the manager and translates its Status.
//
// It uses the synchronous gRPC API on purpose: RunStep blocks for a whole step and Configure
// for the transport's connect, and the sync server gives each call its own thread, so an Abort
// or GetStatus is always served while a step runs.
// A RunStep with a relay list (RunStepRequest.relay) is forwarded through `relay` before this
// worker's own step starts, and answered once the own step and every forwarded call have ended;
// a forwarded call's failure aborts the own step and fails the call with that failure (its rank
// in the trailing metadata, common/rpc.h's kRelayedRankKey).
// Thread-safety: thread-safe (the manager and the relay are).
#ifndef TANDEM_WORKER_STAGE_SERVICE_H_
#define TANDEM_WORKER_STAGE_SERVICE_H_

#include "tandem/v1/worker.grpc.pb.h"
#include "worker/stage_manager.h"
#include "worker/step_relay.h"

namespace tandem::worker {

class StageWorkerService final : public v1::StageWorker::Service {
 public:
  // `manager` and `relay` must outlive the service; without a relay, a RunStep that asks to be
  // relayed is refused (FAILED_PRECONDITION).
  explicit StageWorkerService(StageManager* manager, StepRelay* relay = nullptr)
      : manager_(manager), relay_(relay) {}

  grpc::Status Configure(grpc::ServerContext* ctx, const v1::ConfigureRequest* req,
                         v1::ConfigureResponse* resp) override;
  grpc::Status RunStep(grpc::ServerContext* ctx, const v1::RunStepRequest* req,
                       v1::RunStepResponse* resp) override;
  grpc::Status ApplyStep(grpc::ServerContext* ctx, const v1::ApplyStepRequest* req,
                         v1::ApplyStepResponse* resp) override;
  grpc::Status SaveCheckpoint(grpc::ServerContext* ctx, const v1::SaveCheckpointRequest* req,
                              grpc::ServerWriter<v1::TensorChunk>* writer) override;
  grpc::Status ReadState(grpc::ServerContext* ctx, const v1::ReadStateRequest* req,
                         grpc::ServerWriter<v1::TensorChunk>* writer) override;
  grpc::Status Abort(grpc::ServerContext* ctx, const v1::AbortRequest* req,
                     v1::AbortResponse* resp) override;
  grpc::Status ProfileLayers(grpc::ServerContext* ctx, const v1::ProfileLayersRequest* req,
                             v1::ProfileLayersResponse* resp) override;
  grpc::Status ProbeLink(grpc::ServerContext* ctx, const v1::ProbeLinkRequest* req,
                         v1::ProbeLinkResponse* resp) override;
  grpc::Status GetStatus(grpc::ServerContext* ctx, const v1::GetStatusRequest* req,
                         v1::WorkerStatus* resp) override;

 private:
  grpc::Status RelayedRunStep(grpc::ServerContext* ctx, const v1::RunStepRequest* req,
                              v1::RunStepResponse* resp);

  StageManager* const manager_;
  StepRelay* const relay_;
};

}  // namespace tandem::worker

#endif  // TANDEM_WORKER_STAGE_SERVICE_H_
