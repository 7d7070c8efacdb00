// GradReducer: the gradient reduction of a data-parallel group (pipeline.replicas > 1). The R
// workers holding the same pipeline rank, one per replica, sum their gradients so that every
// replica applies the same update.
//
// The executor posts buckets (one layer's gradients) as they are final: during a stage's last
// weight-gradient action, layer by layer as the backward finishes them, and at the stage's
// REDUCE_GRAD action whatever is left. A thread of its own reduces them in posting order, one
// at a time, through the group's collectives (worker/transport/group_collectives.h: the ring
// over Gloo on a CPU worker, NCCL on device memory on a CUDA worker), so that the reduction
// runs while the backward of the remaining layers and micro-batches still computes (as DDP's
// bucketed all-reduce does). Every replica posts the same buckets in the same order (they run
// the same program), which is what pairs them up.
//
// Sharded optimizer state (optimizer.shard_state, ZeRO stage 1): the executor posts the
// gradients as kReduceScatter, so that each rank ends with the sum of its segment of every
// tensor (common/shard_range.h) for the same traffic as half an all-reduce, and after the
// update the parameters as kAllGather; every replica still ends bit-identical.
//
// Thread-safety: Post, Wait and BeginStep from one thread (the executor's); Abort from any.
#ifndef TANDEM_WORKER_GRAD_REDUCER_H_
#define TANDEM_WORKER_GRAD_REDUCER_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "worker/transport/group_collectives.h"
#include "worker/transport/transport.h"

namespace tandem::worker {

// One layer's gradients (or, for kAllGather, parameters), in memory of the group's kind (host
// for a CPU worker, device for a CUDA one) that stays valid and untouched until Wait() returns.
struct GradBucket {
  // kAllReduce, or with sharded optimizer state kReduceScatter (gradients) and kAllGather
  // (parameters): group_collectives.h.
  using Op = CollectiveOp;
  int chunk = 0;  // the executor's chunk (for timings)
  int layer = 0;  // global layer index (for messages)
  std::vector<absl::Span<float>> tensors;
  Op op = Op::kAllReduce;
  int64_t posted_us = 0;  // set by Post
};

class GradReducer {
 public:
  // `group`: the data-parallel group's collectives, rank = this worker's replica, size =
  // R >= 2; their memory kind (host for the ring, device for NCCL) is the buckets'.
  explicit GradReducer(std::unique_ptr<GroupCollectives> group);
  // The ring over a host transport (ring_collectives.h): a CPU worker's group.
  explicit GradReducer(std::unique_ptr<Transport> group);
  ~GradReducer();  // aborts and joins
  GradReducer(const GradReducer&) = delete;
  GradReducer& operator=(const GradReducer&) = delete;

  int replica() const { return group_->rank(); }
  int replicas() const { return group_->size(); }

  // Starts a step: forgets the last step's timings. FAILED_PRECONDITION while buckets of the
  // last step are pending or after a failure.
  absl::Status BeginStep();
  // Queues a bucket behind those posted before.
  void Post(GradBucket bucket);
  // Blocks until every posted bucket is summed; the first failure (naming the layer), after
  // which the reducer refuses further work.
  absl::Status Wait();
  // Makes a running and every later reduction return ABORTED. Thread-safe, idempotent.
  void Abort();

  // Per chunk, after Wait(): when its first bucket was posted, when its reduction started and
  // when its last one ended (Unix microseconds; 0 when it had none), and the step's reduced
  // bytes (kAllGather buckets count in neither).
  struct ChunkSpan {
    int64_t first_post_us = 0;  // when its first bucket was posted
    int64_t start_us = 0;
    int64_t end_us = 0;
  };
  ChunkSpan span_of(int chunk) const;
  int64_t step_bytes() const;

 private:
  void Loop();
  absl::Status Reduce(GradBucket& bucket);

  std::unique_ptr<GroupCollectives> group_;

  mutable absl::Mutex mu_;
  std::deque<GradBucket> queue_ ABSL_GUARDED_BY(mu_);
  int in_flight_ ABSL_GUARDED_BY(mu_) = 0;  // queued or being reduced
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  std::vector<ChunkSpan> spans_ ABSL_GUARDED_BY(mu_);
  int64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread thread_;
};

}  // namespace tandem::worker

#endif  // TANDEM_WORKER_GRAD_REDUCER_H_
