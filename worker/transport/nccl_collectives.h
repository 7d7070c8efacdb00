// NCCL collectives of a data-parallel group: the GPU side of the gradient reduction
// (pipeline.replicas R > 1), as worker/transport/ring_allreduce.h is the CPU side. One NCCL
// communicator over the R ranks of the group (the same pipeline stage of every replica, one rank
// per GPU) and one stream of its own; sum-all-reduce, reduce-scatter and all-gather of float
// buffers in device memory on the device given in the options, in place.
//
// Ownership: ReduceScatter leaves on rank k the complete sum of OwnedSegment(count, R, k)
// (common/shard_range.h: segment (k + 1) mod R of R contiguous segments, the first count % R one
// element longer), and AllGather copies each rank's owned segment to all: the SAME rule as the
// CPU ring (RingReduceScatter / RingAllGather), so that sharded optimizer state
// (optimizer.shard_state) and the checkpoints gathered from it agree whichever backend reduced
// the gradients. ncclReduceScatter / ncclAllGather follow another rule (R equal chunks, chunk i
// owned by rank i, and separate send and receive buffers of count / R elements), so they are not
// used: ReduceScatter is one NCCL group (ncclGroupStart / ncclGroupEnd) of R ncclReduce calls,
// segment i reduced in place onto its owner (the rank k with (k + 1) mod R == i), and AllGather
// one group of R ncclBroadcast calls, segment i in place from its owner. The calls of a group
// are launched together, and each rank sends (R - 1) / R of the buffer, as with NCCL's own
// reduce-scatter / all-gather.
// Every rank ends with the same bits after AllReduce and after AllGather (each element's sum is
// computed once and copied); the summation order is NCCL's, so ReduceScatter's sums equal
// AllReduce's bit for bit when the addition is exact in any order (always for R = 2), and differ
// from them by rounding otherwise.
//
// Connect(): rank 0 creates the communicator's id (ncclGetUniqueId) and publishes it in the
// rendezvous Store under "<key_prefix>/unique_id" (the Store is job-scoped: in production a
// GrpcRendezvousStore, in tests a gloo::rendezvous::HashStore); when it cannot (no usable
// device), it publishes its error there instead, so that the other ranks fail at once
// (UNAVAILABLE) rather than at the timeout. The other ranks wait for the id, then check their
// device (one without it fails with FAILED_PRECONDITION; rank 0 then fails at its timeout). The
// communicator is created NON-BLOCKING (ncclConfig_t.blocking = 0, ncclCommInitRankConfig) and
// polled with ncclCommGetAsyncError until it is ready, fails, the `cancelled` flag is set
// (ABORTED), or connect_timeout passes (ncclCommAbort and DEADLINE_EXCEEDED), so a missing peer
// never hangs a worker. All as NcclTransport (nccl_transport.h) does for its links.
//
// Every operation is synchronous and collective: all R ranks call the same operations with the
// same counts in the same order. It enqueues the NCCL calls on the group's stream, records an
// event behind them and polls the event and ncclCommGetAsyncError until the data is done
// (usable from any stream on return), the communicator fails (UNAVAILABLE), op_timeout passes
// (DEADLINE_EXCEEDED) or Abort() is called (ABORTED). After a failure the communicator is
// aborted (its kernels stop, so the caller may free the buffer) and every later call returns
// the first error. The data must be complete on the device when an operation is called: the
// group's stream is not ordered after any other stream (the CUDA StageCompute's calls return
// when the device is done). Errors name the operation and its size ("all-reduce of 1000
// floats: ...").
//
// A group of one rank (size 1) creates no communicator and touches no device: every operation
// leaves the data as it is and returns OK (ABORTED after Abort()).
//
// The header names no CUDA or NCCL type (the communicator, stream and event live in
// nccl_collectives.cc), so that main.cc includes it without the CUDA headers.
//
// Thread-safety: one operation at a time (the reduction's own thread, which may differ from the
// thread that called Connect); Abort() and aborted() from any thread: a running and every later
// operation then returns ABORTED.
#ifndef TANDEM_WORKER_TRANSPORT_NCCL_COLLECTIVES_H_
#define TANDEM_WORKER_TRANSPORT_NCCL_COLLECTIVES_H_

#include <atomic>
#include <chrono>
#include <cstddef>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "worker/transport/group_collectives.h"

namespace gloo::rendezvous {
class Store;
}  // namespace gloo::rendezvous

namespace tandem::worker {

struct NcclCollectivesOptions {
  int rank = 0;    // this worker's replica
  int size = 1;    // R, the replicas of the group
  int device = 0;  // CUDA device ordinal of this rank (one rank per device)
  // Separates the communicators of one job in the (job-scoped) store, e.g. one per pipeline
  // stage's group; must not be empty.
  std::string key_prefix = "nccl_dp";
  std::chrono::milliseconds connect_timeout{30000};
  // Longest a single operation may take.
  std::chrono::milliseconds op_timeout{300000};
  // When set and true, a Connect() in progress gives up with ABORTED. Must outlive Connect().
  const std::atomic<bool>* cancelled = nullptr;
};

class NcclCollectives {
 public:
  // Blocks until the communicator is ready. INVALID_ARGUMENT for bad options;
  // FAILED_PRECONDITION when this rank has no usable CUDA device; UNAVAILABLE when rank 0
  // reported a failure or NCCL failed; DEADLINE_EXCEEDED after connect_timeout; ABORTED when
  // cancelled. Errors are prefixed "rank r of R".
  static absl::StatusOr<std::unique_ptr<NcclCollectives>> Connect(
      const NcclCollectivesOptions& options, gloo::rendezvous::Store& store);

  // Finalizes the communicator (bounded by connect_timeout: finalizing waits for the group to be
  // quiescent, so every rank should be destroyed about together), or aborts it when aborted,
  // failed, or finalizing did not finish in time.
  ~NcclCollectives();
  NcclCollectives(const NcclCollectives&) = delete;
  NcclCollectives& operator=(const NcclCollectives&) = delete;

  // The three operations (for the implementation and for callers that dispatch on them).
  enum class Kind { kAllReduce, kReduceScatter, kAllGather };

  int rank() const { return options_.rank; }
  int size() const { return options_.size; }
  int device() const { return options_.device; }

  // data[0, count) (device memory) replaced on every rank by the element-wise sum over the
  // ranks (ncclAllReduce, ncclSum, in place).
  absl::Status AllReduce(float* data, size_t count);
  // Afterwards this rank's OwnedSegment(count, size(), rank()) of data holds the sum over the
  // ranks; the rest of data is undefined (see the header comment).
  absl::Status ReduceScatter(float* data, size_t count);
  // Each rank's OwnedSegment(count, size(), rank) of data copied to every rank, in place.
  absl::Status AllGather(float* data, size_t count);
  // Common to the three: INVALID_ARGUMENT for a null buffer with count > 0 (count 0 is OK and
  // does nothing); the errors of the header comment.

  // Makes a running and every later operation return ABORTED (ncclCommAbort). Thread-safe,
  // idempotent.
  void Abort();
  bool aborted() const { return aborted_.load(); }

 private:
  // The communicator, its stream and the completion event (nccl_collectives.cc).
  struct Comm;
  // Connect()'s steps (nccl_collectives.cc).
  class Connector;
  NcclCollectives(const NcclCollectivesOptions& options, std::unique_ptr<Comm> comm);

  // An operation: checks, enqueue (Enqueue), wait (WaitDone). `what` ("all-reduce of 5
  // floats") prefixes every error.
  absl::Status Run(Kind kind, float* data, size_t count);
  // Issues the operation's NCCL group on the stream and records the event behind it, waiting
  // (mu_ released while it sleeps) until a non-blocking group is enqueued.
  absl::Status Enqueue(Kind kind, float* data, size_t count, const std::string& what,
                       std::chrono::steady_clock::time_point deadline);
  // Polls the event, the communicator's asynchronous error, Abort() and the deadline.
  absl::Status WaitDone(const std::string& what, std::chrono::steady_clock::time_point deadline);
  // Records the first failure (prefixed with `what`) and aborts the communicator (its kernels
  // stop); returns it.
  absl::Status Fail(const std::string& what, const absl::Status& status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // ABORTED after Abort(), the first failure, or OK.
  absl::Status Usable(const std::string& what) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const NcclCollectivesOptions options_;
  std::atomic<bool> aborted_{false};

  mutable absl::Mutex mu_;
  // Null for a group of one rank. Every NCCL call is made under mu_ (none blocks: the
  // communicator is non-blocking), so Abort() can abort it between two calls of the operation.
  std::unique_ptr<Comm> comm_ ABSL_GUARDED_BY(mu_);
  absl::Status broken_ ABSL_GUARDED_BY(mu_);
};

// The CUDA worker's GroupCollectives (group_collectives.h) for GradReducer: each tensor of a
// call (device memory) through `nccl`'s AllReduce / ReduceScatter / AllGather, in order.
std::unique_ptr<GroupCollectives> NewNcclGroupCollectives(std::unique_ptr<NcclCollectives> nccl);

}  // namespace tandem::worker

#endif  // TANDEM_WORKER_TRANSPORT_NCCL_COLLECTIVES_H_
