// Point-to-point data plane between the workers of a job (activations and gradients).
//
// Ordering: messages between two ranks with the same tag are delivered in the order they were
// posted; both ends derive their order from the same stage programs (see common/schedule.h),
// and a tag names the payload, the sending stage and the micro-batch (MakeTransferTag).
//
// Deadlock rule: PostSend never blocks, so a stage that must both send and receive posts its
// sends first and then blocks in Recv; two blocking calls never wait on each other.
//
// Thread-safety: PostSend, Recv and WaitSends are called by one thread (the executor's);
// Abort() and the byte counters may be called from any thread at any time.
#ifndef TANDEM_WORKER_TRANSPORT_TRANSPORT_H_
#define TANDEM_WORKER_TRANSPORT_TRANSPORT_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "common/status_macros.h"

namespace tandem::worker {

enum class Payload : uint32_t {
  kActivation = 1,    // forward output of stage s, input of stage s + 1
  kGradient = 2,      // input gradient of stage s + 1, output gradient of stage s
  kTiedGradient = 3,  // gradient of a tied parameter, exchanged between first and last stage
  kLinkProbe = 4,     // a ProbeLink ping or pong: (size index, exchange) in place of (stage, mb)
  kGradReduce = 5,    // a piece of a ring all-reduce: (reduction id, step and piece)
};

// The tag both ends of a transfer use: (payload, the sending stage, micro-batch). Several
// stages of one worker may talk to the same peer (interleaved schedules), so the stage is part
// of the tag. Tied gradients use the parameter's index in place of the micro-batch.
inline uint64_t MakeTransferTag(Payload payload, int stage, int micro_batch) {
  return (static_cast<uint64_t>(payload) << 56) |
         (static_cast<uint64_t>(static_cast<uint32_t>(stage) & 0xFFFFFFu) << 32) |
         static_cast<uint32_t>(micro_batch);
}

class Transport {
 public:
  virtual ~Transport() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;

  // Starts sending `bytes` bytes at `data` to `peer`. Does not block; `data` must stay valid and
  // unchanged until WaitSends() returns. ABORTED after Abort(); INVALID_ARGUMENT for a bad peer.
  virtual absl::Status PostSend(int peer, uint64_t tag, const void* data, size_t bytes) = 0;

  // Receives exactly `bytes` bytes from `peer` into `data`, blocking until they arrive.
  // ABORTED after Abort(); UNAVAILABLE (naming the peer rank) when the peer fails or closes;
  // DEADLINE_EXCEEDED after the transport's operation timeout. Any failure other than
  // INVALID_ARGUMENT leaves the transport unusable.
  virtual absl::Status Recv(int peer, uint64_t tag, void* data, size_t bytes) = 0;

  // Starts receiving exactly `bytes` bytes from `peer` into `data` without blocking, so that
  // the transfer overlaps the caller's compute; WaitRecv(peer, tag) completes it. `data` must
  // stay valid until then. INVALID_ARGUMENT for a bad peer or when a receive of (peer, tag) is
  // already posted; ABORTED after Abort().
  virtual absl::Status PostRecv(int peer, uint64_t tag, void* data, size_t bytes) = 0;
  // Blocks until the receive posted for (peer, tag) has its data; same errors as Recv, and
  // FAILED_PRECONDITION when none is posted.
  virtual absl::Status WaitRecv(int peer, uint64_t tag) = 0;

  // An exchange with `peer`: sends `bytes` bytes from `send` and receives as many into `recv`,
  // both under `tag`, as a pair that progresses together (both ends call it); returns when
  // `recv` holds the data, and the send completes by WaitSends(). The default posts the send
  // and then receives (PostSend never blocks); a transport whose sends wait for the peer's
  // receive (NCCL) posts the two in one group.
  virtual absl::Status SendRecv(int peer, uint64_t tag, const void* send, void* recv,
                                size_t bytes) {
    RETURN_IF_ERROR(PostSend(peer, tag, send, bytes));
    return Recv(peer, tag, recv, bytes);
  }

  // Blocks until every posted send has completed (then their buffers may be reused).
  // Same errors as Recv. After a failure the transport may still reference the buffers of
  // posted sends: keep them until the transport is destroyed.
  virtual absl::Status WaitSends() = 0;

  // Makes every pending and future PostSend/Recv/WaitSends return ABORTED promptly.
  // Thread-safe and idempotent; the transport cannot be used again afterwards.
  virtual void Abort() = 0;
  virtual bool aborted() const = 0;

  // Whether a receive of (peer, tag) is posted and not yet waited for.
  virtual bool posted_recv(int peer, uint64_t tag) const = 0;

  // Totals since construction.
  virtual int64_t bytes_sent() const = 0;
  virtual int64_t bytes_received() const = 0;
};

}  // namespace tandem::worker

#endif  // TANDEM_WORKER_TRANSPORT_TRANSPORT_H_
