// The worker's side of checkpoint restore: a TensorSource over the coordinator's Checkpoints
// service (gRPC adapter).
#ifndef TANDEM_WORKER_CHECKPOINT_CLIENT_H_
#define TANDEM_WORKER_CHECKPOINT_CLIENT_H_

#include <grpcpp/channel.h>

#include <chrono>
#include <memory>

#include "worker/stage_manager.h"

namespace tandem::worker {

// Every read carries `timeout` as its deadline.
TensorSource MakeGrpcTensorSource(std::shared_ptr<grpc::Channel> coordinator,
                                  std::chrono::milliseconds timeout = std::chrono::minutes(10));

}  // namespace tandem::worker

#endif  // TANDEM_WORKER_CHECKPOINT_CLIENT_H_
