// Transport over NCCL point-to-point (ncclSend / ncclRecv), the GPU data plane. Data pointers
// are device pointers on the CUDA device given in the options.
//
// Connect(): rank 0 creates the communicator's id (ncclGetUniqueId) and publishes it in the
// rendezvous Store under "<key_prefix>/unique_id" (the Store itself is job-scoped: in
// production a GrpcRendezvousStore whose prefix is the job's StageProgram.rendezvous_prefix; in
// tests a gloo::rendezvous::HashStore); if rank 0 cannot, it publishes its error there instead,
// so the other ranks fail at once rather than at the timeout. The others wait for the key. Every
// rank then creates the communicator NON-BLOCKING (ncclConfig_t.blocking = 0,
// ncclCommInitRankConfig) and polls ncclCommGetAsyncError until it is ready, fails, or
// connect_timeout passes (then ncclCommAbort and DEADLINE_EXCEEDED), so a missing peer never
// hangs a worker. Connect() ends with a warm-up: one group holding a header-only send to and a
// receive from every other rank (waited for with op_timeout). NCCL sets up point-to-point
// connections lazily, on the first transfer between two ranks, and that setup pairs a send with
// the peer's receive; done here, for all pairs at once, it cannot deadlock two ranks that later
// post sends to each other before their receives, and PostSend never waits on its peer. (The
// warm-up connects every pair, not only pipeline neighbours: fine for pipeline-sized jobs.)
//
// Transfers run on a dedicated communication stream (cudaStreamNonBlocking), in groups
// (ncclGroupStart / ncclGroupEnd). An NCCL send completes only when the peer's receive runs, and
// one stream runs its groups in order, so two ranks that each send to the other before
// receiving would each wait in a send (NCCL's deadlock rule) where Gloo's buffered sends go
// through. Posting is therefore deferred: PostSend and PostRecv queue their transfer, and the
// queue is launched as ONE group at the next call that waits (WaitRecv, Recv, SendRecv,
// WaitSends, ComputeStreamWaitRecv, CommStreamWaitEvent) or by PostBatch(). Everything a rank
// posts between two waits progresses together: in 1F1B's steady state the executor posts the
// next receive (the previous stage's gradient) before the compute whose output it then sends,
// so the send and the receive form one group, as Megatron's send_forward_recv_backward does.
// Completion is tracked with one cudaEvent per operation; WaitRecv / WaitSends poll the events and
// ncclCommGetAsyncError with op_timeout, and Abort() (any thread: ncclCommAbort) makes every
// pending and future call return ABORTED within a poll interval. Nothing blocks inside NCCL: the
// communicator is non-blocking.
//
// Tags: NCCL has no tags. Messages between two ranks are matched purely by order, so the order of
// posts to a peer IS the protocol: both ends derive it from the same stage programs (the
// schedule, common/schedule.h), and the n-th send to a peer meets the n-th receive from it. To
// catch a schedule bug instead of silently swapping two payloads, each message carries its tag
// in an 8-byte header message just before it (same group, same peer), and each end keeps a
// per-peer FIFO of the tags it posted; a receive whose header names another tag fails with
// INTERNAL naming both tags.
//
// Compute / communication: the caller's compute stream and the comm stream are independent.
// Before posting a send of data produced on a compute stream, record an event there and call
// CommStreamWaitEvent(event) (or set Op::ready). To use received data on a compute stream
// without blocking the host, call ComputeStreamWaitRecv(peer, tag, stream); WaitRecv must still
// be called afterwards (it checks the tag, counts the bytes and frees the receive's slot).
//
// Thread-safety: as Transport (one executor thread; Abort(), aborted() and the counters from any
// thread).
#ifndef TANDEM_WORKER_TRANSPORT_NCCL_TRANSPORT_H_
#define TANDEM_WORKER_TRANSPORT_NCCL_TRANSPORT_H_

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "worker/transport/transport.h"

namespace gloo::rendezvous {
class Store;
}  // namespace gloo::rendezvous

namespace tandem::worker {

struct NcclTransportOptions {
  int rank = 0;
  int size = 1;
  int device = 0;  // CUDA device ordinal of this rank (one rank per device)
  // Separates several communicators of one job in the (job-scoped) store; must not be empty.
  std::string key_prefix = "nccl";
  std::chrono::milliseconds connect_timeout{30000};
  // Longest a single Recv / WaitRecv / WaitSends may wait.
  std::chrono::milliseconds op_timeout{300000};
  // When set and true, a Connect() in progress gives up with ABORTED. Must outlive Connect().
  const std::atomic<bool>* cancelled = nullptr;
};

class NcclTransport final : public Transport {
 public:
  // Transfers the executor can post together in one NCCL group (see the header comment).
  struct Op {
    enum class Kind { kSend, kRecv };
    Kind kind = Kind::kSend;
    int peer = 0;
    uint64_t tag = 0;
    void* data = nullptr;  // device memory; a send only reads it
    size_t bytes = 0;
    // Send only, optional: an event on the producing compute stream that the comm stream waits
    // for before the send reads `data`.
    cudaEvent_t ready = nullptr;
  };

  // Blocks until the communicator is ready. INVALID_ARGUMENT for bad options;
  // FAILED_PRECONDITION when this rank has no usable CUDA device; UNAVAILABLE when rank 0
  // reported a failure or NCCL failed; DEADLINE_EXCEEDED after connect_timeout; ABORTED when
  // cancelled.
  static absl::StatusOr<std::unique_ptr<NcclTransport>> Connect(const NcclTransportOptions& options,
                                                                gloo::rendezvous::Store& store);

  // Finalizes the communicator (ncclCommAbort instead when aborted, failed, or transfers are
  // still pending).
  ~NcclTransport() override;

  int rank() const override { return options_.rank; }
  int size() const override { return options_.size; }
  absl::Status PostSend(int peer, uint64_t tag, const void* data, size_t bytes) override;
  absl::Status Recv(int peer, uint64_t tag, void* data, size_t bytes) override;
  absl::Status PostRecv(int peer, uint64_t tag, void* data, size_t bytes) override;
  absl::Status WaitRecv(int peer, uint64_t tag) override;
  bool posted_recv(int peer, uint64_t tag) const override;
  absl::Status WaitSends() override;
  // The send and the receive in one group (PostBatch), then WaitRecv.
  absl::Status SendRecv(int peer, uint64_t tag, const void* send, void* recv,
                        size_t bytes) override;
  void Abort() override;
  bool aborted() const override { return aborted_.load(); }
  int64_t bytes_sent() const override { return bytes_sent_.load(); }
  int64_t bytes_received() const override { return bytes_received_.load(); }

  // Queues `ops` behind what is queued and launches the queue now, as one NCCL group, in order
  // (the per-peer order of the sends and of the receives is the posting order). Validates every
  // op before queueing any: INVALID_ARGUMENT for a bad peer or a receive of (peer, tag) already
  // posted (or twice in the batch); RESOURCE_EXHAUSTED when more than kMaxInFlight transfers
  // would be in flight.
  absl::Status PostBatch(absl::Span<const Op> ops);

  // Makes the comm stream wait (on the device) for `event`, recorded on a compute stream, before
  // any transfer posted after this call.
  absl::Status CommStreamWaitEvent(cudaEvent_t event);
  // Makes `stream` wait (on the device) until the receive posted for (peer, tag) has its data.
  // FAILED_PRECONDITION when none is posted.
  absl::Status ComputeStreamWaitRecv(int peer, uint64_t tag, cudaStream_t stream);

  cudaStream_t comm_stream() const { return stream_; }

  // Transfers (sends plus receives) that may be in flight at once.
  static constexpr int kMaxInFlight = 4096;

 private:
  struct Pending;

  NcclTransport(const NcclTransportOptions& options, ncclComm_t comm, cudaStream_t stream,
                uint64_t* device_headers, uint64_t* host_headers);
  // The tag of Connect()'s warm-up exchange (no transfer tag has payload 0xFF).
  static constexpr uint64_t kWarmUpTag = ~uint64_t{0};

  // Connects every pair now (see the header comment). Called once, by Connect().
  absl::Status WarmUp();
  // Validates `ops` and appends them to queued_ (the deferred posting).
  absl::Status Queue(absl::Span<const Op> ops);
  // Launches queued_ as one group (nothing when empty).
  absl::Status Flush();
  // Posts `ops` as one group now (they passed Queue's checks).
  absl::Status Launch(absl::Span<const Op> ops);
  absl::Status CheckPeer(int peer) const;
  // Sleeps a poll interval. Returns ABORTED after Abort(), the communicator's asynchronous
  // error, or DEADLINE_EXCEEDED at `deadline`; OK to keep polling.
  absl::Status PollCheck(const char* op, int peer, std::chrono::steady_clock::time_point deadline);
  // Waits for `event` (recorded on the comm stream) to complete.
  absl::Status WaitEvent(const char* op, int peer, cudaEvent_t event);
  // The error every call returns once the transport failed (OK while healthy).
  absl::Status Broken() const;
  void Fail(const absl::Status& status);

  const NcclTransportOptions options_;
  cudaStream_t stream_ = nullptr;       // the comm stream, owned
  uint64_t* device_headers_ = nullptr;  // (kMaxInFlight) tag headers on the device, owned
  uint64_t* host_headers_ = nullptr;    // (kMaxInFlight) pinned host mirror, owned
  std::atomic<bool> aborted_{false};
  std::atomic<int64_t> bytes_sent_{0};
  std::atomic<int64_t> bytes_received_{0};

  mutable absl::Mutex mu_;
  // Null after Abort(). Every NCCL call is made under mu_ (none blocks: the communicator is
  // non-blocking), so Abort() can free the communicator between two calls of the executor.
  ncclComm_t comm_ ABSL_GUARDED_BY(mu_) = nullptr;
  absl::Status broken_ ABSL_GUARDED_BY(mu_);
  std::vector<int> free_slots_ ABSL_GUARDED_BY(mu_);  // indices into the header arrays
  std::vector<Op> queued_ ABSL_GUARDED_BY(mu_);       // posted, not yet launched
  std::vector<std::unique_ptr<Pending>> pending_sends_ ABSL_GUARDED_BY(mu_);
  std::map<std::pair<int, uint64_t>, std::unique_ptr<Pending>> pending_recvs_ ABSL_GUARDED_BY(mu_);
  // Per peer: the tags of the transfers posted to / from it, in posting order (the order NCCL
  // matches them in): the expected-tag FIFOs. A receive's header is checked against its own
  // entry; entries leave the front as transfers complete in order.
  std::map<int, std::deque<uint64_t>> send_order_ ABSL_GUARDED_BY(mu_);
  std::map<int, std::deque<uint64_t>> recv_order_ ABSL_GUARDED_BY(mu_);
  // Per peer: receives posted so far (numbers them in error messages: "receive #n").
  std::map<int, int64_t> recvs_posted_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tandem::worker

#endif  // TANDEM_WORKER_TRANSPORT_NCCL_TRANSPORT_H_
