// The worker's side of a restore (gRPC adapters): a TensorSource over the coordinator's
// Checkpoints service, and a PeerStateReader over other workers' StageWorker.ReadState (peer
// recovery).
#ifndef TANDEM_WORKER_CHECKPOINT_CLIENT_H_
#define TANDEM_WORKER_CHECKPOINT_CLIENT_H_

#include <grpcpp/channel.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "worker/stage_manager.h"

namespace tandem::worker {

// Every read carries `timeout` as its deadline.
TensorSource MakeGrpcTensorSource(std::shared_ptr<grpc::Channel> coordinator,
                                  std::chrono::milliseconds timeout = std::chrono::minutes(10));

// `channel_for(address)` opens the channel to another worker (with this worker's credentials
// under mTLS). Every read carries `timeout` as its deadline.
PeerStateReader MakeGrpcPeerStateReader(
    std::function<std::shared_ptr<grpc::Channel>(const std::string& address)> channel_for,
    std::chrono::milliseconds timeout = std::chrono::minutes(10));

}  // namespace tandem::worker

#endif  // TANDEM_WORKER_CHECKPOINT_CLIENT_H_
