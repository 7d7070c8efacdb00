// The collectives of a data-parallel group (the same pipeline rank of every replica), as
// GradReducer (worker/grad_reducer.h) runs them for each bucket: sum-all-reduce, and the two
// halves of it that sharded optimizer state uses (reduce-scatter of the gradients, all-gather
// of the parameters), in place, with the segment ownership of common/shard_range.h. Two
// implementations, one per kind of memory: the ring over a host Transport (CPU workers, Gloo;
// ring_collectives.h) and NCCL on device memory (CUDA workers; nccl_collectives.h's
// NewNcclGroupCollectives), so that the reducer, the executor and the program are the same on
// both backends.
//
// Thread-safety: one Run at a time (the reducer's thread); Abort() from any thread.
#ifndef TANDEM_WORKER_TRANSPORT_GROUP_COLLECTIVES_H_
#define TANDEM_WORKER_TRANSPORT_GROUP_COLLECTIVES_H_

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace tandem::worker {

enum class CollectiveOp {
  kAllReduce,      // every tensor summed over the group
  kReduceScatter,  // each rank's OwnedSegment summed, the rest undefined
  kAllGather,      // each rank's OwnedSegment copied to all
};

class GroupCollectives {
 public:
  virtual ~GroupCollectives() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Runs `op` on every tensor of `tensors`, in place. Every rank of the group calls Run with
  // the same op and tensor sizes in the same order (the memory is the implementation's kind:
  // host for the ring, device for NCCL). Errors name what failed; after Abort(), ABORTED.
  virtual absl::Status Run(CollectiveOp op, absl::Span<const absl::Span<float>> tensors) = 0;
  // Makes a running and every later Run return ABORTED. Idempotent.
  virtual void Abort() = 0;
};

}  // namespace tandem::worker

#endif  // TANDEM_WORKER_TRANSPORT_GROUP_COLLECTIVES_H_
