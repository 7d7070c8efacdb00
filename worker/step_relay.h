// The forwarding side of the step relay (RunStepRequest.relay): a worker asked to relay a step
// calls each worker of its relay list with the same request (each carrying its own subtree as
// its relay list), and gathers their reports, flattened, each under its gang rank. The
// coordinator of a large gang then calls one worker per group instead of every worker (see
// docs/architecture.md, "The step relay").
//
// Failure: the first failed call (its own status, or the failure it relayed from deeper in the
// tree, carried as common/rpc.h's relayed rank) is reported at once through `on_failure` (the
// service aborts its own step there, so that it answers promptly rather than waiting on a
// failed peer), and the outcome carries it with the rank that failed. The caller's call then
// fails with that status and that rank, and the coordinator aborts the gang as for any failed
// step.
//
// Thread-safety: Forward may be called from any thread, concurrently; the callbacks run on gRPC
// threads. Channels are dialled once per address and kept (a relay forwards to the same workers
// every step). The destructor cancels the calls in flight and waits for their callbacks to
// finish.
#ifndef TANDEM_WORKER_STEP_RELAY_H_
#define TANDEM_WORKER_STEP_RELAY_H_

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "tandem/v1/worker.grpc.pb.h"

namespace tandem::worker {

// Checks a relay list before anything is forwarded: every rank >= 0 and distinct (at every
// depth), every address non-empty, at most `max_nodes` workers in all (a bound on what one
// request may ask a worker to call). INVALID_ARGUMENT names what is wrong.
absl::Status ValidateRelay(const google::protobuf::RepeatedPtrField<v1::StepRelay>& relay,
                           int max_nodes = 1 << 16);

class StepRelay {
 public:
  using Dial = std::function<std::shared_ptr<grpc::Channel>(const std::string& address)>;

  struct Outcome {
    absl::Status status;  // OK, or the first failure (with RelayedRank attached)
    int failed_rank = -1;
    std::vector<v1::RelayedStep> relayed;  // every rank of the subtrees, when OK
  };

  explicit StepRelay(Dial dial);
  ~StepRelay();
  StepRelay(const StepRelay&) = delete;
  StepRelay& operator=(const StepRelay&) = delete;

  // Forwards `request` to every worker of request.relay() with `deadline`. `on_failure(status,
  // rank)` runs at most once, at the first failure; `done` runs exactly once, after every call
  // has ended (each has the deadline, so it does). With an empty relay list `done` runs at once
  // with OK.
  void Forward(const v1::RunStepRequest& request, std::chrono::system_clock::time_point deadline,
               std::function<void(const absl::Status&, int rank)> on_failure,
               std::function<void(Outcome)> done);

 private:
  struct Batch;
  v1::StageWorker::Stub* StubFor(const std::string& address);
  void Track(grpc::ClientContext* ctx);
  void Untrack(grpc::ClientContext* ctx);
  void CallbackFinished();

  const Dial dial_;
  absl::Mutex mu_;
  std::map<std::string, std::unique_ptr<v1::StageWorker::Stub>> stubs_ ABSL_GUARDED_BY(mu_);
  // The calls not yet ended (the destructor cancels them), and the callbacks not yet finished
  // (it waits for them: a callback frees the calls' contexts and runs `done`).
  std::vector<grpc::ClientContext*> in_flight_ ABSL_GUARDED_BY(mu_);
  int callbacks_pending_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace tandem::worker

#endif  // TANDEM_WORKER_STEP_RELAY_H_
