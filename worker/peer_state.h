// Peer recovery on the worker (docs/architecture.md, "Peer recovery"): the copy of its stage's
// state a worker keeps when its job's run is aborted after a fault (Abort.retain_state), and the
// fetch that restores a stage of the job's next run from the workers that kept theirs.
//
// A data-parallel job's replicas hold the same parameters and optimizer state after every
// step. When a worker dies, every surviving worker keeps its state after the last step the
// whole gang completed; the next run (a spare in the dead worker's place, or a re-planned
// layout) reads each tensor by its global name from the first survivor that holds it, so only
// the step in flight is trained again. No gRPC here: the reader is injected.
#ifndef TANDEM_WORKER_PEER_STATE_H_
#define TANDEM_WORKER_PEER_STATE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "tandem/v1/common.pb.h"
#include "worker/stage_compute.h"

namespace tandem::worker {

// A stage's parameters and optimizer state after one step of one job, copied out of the
// executor (which is destroyed). Immutable once made; shared by the reads that stream it.
class KeptState {
 public:
  // Copies `tensors` (StageExecutor::CheckpointTensors: whole tensors; a sharded one is
  // refused with FAILED_PRECONDITION, since a replica's segment cannot restore another).
  static absl::StatusOr<std::shared_ptr<const KeptState>> Copy(
      const std::string& job_id, int64_t step, const std::vector<StateTensor>& tensors);

  const std::string& job_id() const { return job_id_; }
  int64_t step() const { return step_; }
  bool Holds(const std::string& job_id, int64_t step) const {
    return job_id == job_id_ && step == step_;
  }
  // The tensors among `names` it holds, in `names` order (views into this object).
  std::vector<StateTensor> Select(const std::vector<std::string>& names) const;
  int64_t bytes() const { return bytes_; }

 private:
  struct Tensor {
    std::string dtype;
    std::vector<int64_t> shape;
    std::string data;
  };
  KeptState(std::string job_id, int64_t step) : job_id_(std::move(job_id)), step_(step) {}

  const std::string job_id_;
  const int64_t step_;
  std::map<std::string, Tensor> tensors_;
  int64_t bytes_ = 0;
};

// Reads the tensors among `names` that the worker at `address` kept of state.job_id() after
// state.step() (StageWorker.ReadState) into `out` (name -> raw bytes): only those it holds.
using PeerStateReader = std::function<absl::Status(
    const std::string& address, const v1::CheckpointRef& state,
    const std::vector<std::string>& names, std::map<std::string, std::string>* out)>;

// Fills `out` with every tensor of `names` of restore.job_id() after restore.step(): from `own`
// (this worker's kept state; null or another job's or step's: unused) first, then from
// restore.peers() in order, each asked for what is still missing. A peer whose read fails (it
// died, mid-transfer or before; it keeps another step; it never kept any) is skipped and what
// it sent is discarded. UNAVAILABLE (a fault: the coordinator falls back to the checkpoint)
// naming the first tensor that no one holds.
absl::Status FetchPeerState(const v1::CheckpointRef& restore, const std::vector<std::string>& names,
                            const KeptState* own, const PeerStateReader& read,
                            std::map<std::string, std::string>* out);

}  // namespace tandem::worker

#endif  // TANDEM_WORKER_PEER_STATE_H_
