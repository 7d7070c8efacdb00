// How the coordinator talks to one stage worker. An interface first (job runners and tests
// use it without gRPC); GrpcStageWorkerClient is the implementation over the network.
#ifndef TANDEM_COORDINATOR_WORKER_CLIENT_H_
#define TANDEM_COORDINATOR_WORKER_CLIENT_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/tls.h"
#include "tandem/v1/worker.pb.h"

namespace tandem::coordinator {

// Thread-safe. Asynchronous calls invoke `done` exactly once, on an arbitrary thread; the
// request is copied, the response must stay valid until `done` runs.
class StageWorkerClient {
 public:
  using Done = std::function<void(absl::Status)>;
  virtual ~StageWorkerClient() = default;

  virtual void Configure(const v1::ConfigureRequest& request, v1::ConfigureResponse* response,
                         absl::Duration timeout, Done done) = 0;
  virtual void RunStep(const v1::RunStepRequest& request, v1::RunStepResponse* response,
                       absl::Duration timeout, Done done) = 0;
  virtual void ApplyStep(const v1::ApplyStepRequest& request, v1::ApplyStepResponse* response,
                         absl::Duration timeout, Done done) = 0;
  // Streams the stage's checkpoint: `on_chunk` is called for every chunk in order (the first
  // carries the index); an error from it cancels the stream and is returned.
  virtual absl::Status SaveCheckpoint(
      const v1::SaveCheckpointRequest& request, absl::Duration timeout,
      const std::function<absl::Status(const v1::TensorChunk&)>& on_chunk) = 0;
  virtual absl::Status Abort(const v1::AbortRequest& request, absl::Duration timeout) = 0;
  // Times and measures layers on the worker (it must be idle); blocking.
  virtual absl::StatusOr<v1::ProfileLayersResponse> ProfileLayers(
      const v1::ProfileLayersRequest& request, absl::Duration timeout) = 0;
  // Times the link to another worker (StageWorker.ProbeLink); the other end must receive its
  // ProbeLink (the other rank, the same prefix) at the same time.
  virtual void ProbeLink(const v1::ProbeLinkRequest& request, v1::ProbeLinkResponse* response,
                         absl::Duration timeout, Done done) = 0;
  // A cheap liveness probe (GetStatus).
  virtual absl::Status Probe(absl::Duration timeout) = 0;
  // Cancels every outstanding asynchronous call; their `done` runs with CANCELLED.
  virtual void CancelPending() = 0;
};

class StageWorkerClientFactory {
 public:
  virtual ~StageWorkerClientFactory() = default;
  virtual std::unique_ptr<StageWorkerClient> Connect(const std::string& address) = 0;
};

// The factory that dials workers over gRPC, with `security` (plaintext, or TLS with the
// coordinator's certificate, which workers require for StageWorker calls).
std::unique_ptr<StageWorkerClientFactory> MakeGrpcStageWorkerClientFactory(
    ChannelSecurity security = {});

}  // namespace tandem::coordinator

#endif  // TANDEM_COORDINATOR_WORKER_CLIENT_H_
