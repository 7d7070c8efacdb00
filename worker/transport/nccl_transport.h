// Transport over NCCL point-to-point (ncclSend / ncclRecv), the GPU data plane. Data pointers
// are device pointers on the CUDA device given in the options.
//
// Links: every direction of data between this rank and a peer is a LINK with its own 2-rank
// communicator (the sending rank is rank 0 in it) and its own stream on each end, as PyTorch's
// ProcessGroupNCCL keeps a communicator per pair for its sends and receives. A link carries
// transfers one way only, so a send waits for nothing but the peer's matching receive on that
// link: in 1F1B's steady state stage s sends an activation to s + 1 while s + 1 sends a
// gradient to s, and with one communicator and one stream the two sends would each wait for
// the other's receive (NCCL's deadlock rule), where on two links they simply both go. So every
// transfer is launched the moment it is posted, on its link's stream: a receive posted before
// a compute (the executor posts the program's next receive ahead) fills while the compute runs,
// and a send posted after a compute proceeds while the next one runs. The links are the pairs
// in `peers` (TransferPeers of the stage program: pipeline neighbours and the tied-gradient
// pair), two communicators per pair.
//
// Connect(): for each outgoing link this rank creates the communicator's id (ncclGetUniqueId)
// and publishes it in the rendezvous Store under "<key_prefix>/<from>-<to>/unique_id" (the Store
// is job-scoped: in production a GrpcRendezvousStore whose prefix is the job's
// StageProgram.rendezvous_prefix; in tests a gloo::rendezvous::HashStore); if it cannot (no
// usable device), it publishes its error there instead, so that its peers fail at once rather
// than at the timeout. Only after publishing every outgoing id does it wait for the incoming
// ones, so no two ranks wait for each other's id. Every communicator is created NON-BLOCKING
// (ncclConfig_t.blocking = 0, ncclCommInitRankConfig) and polled with ncclCommGetAsyncError
// until all are ready, one fails, or connect_timeout passes (then ncclCommAbort on all and
// DEADLINE_EXCEEDED), so a missing peer never hangs a worker. Connect() ends with a warm-up:
// one header-only transfer on every link. NCCL sets up a link's connection lazily, on its first
// transfer, pairing the two ends; the warm-up does it for every link in one global order (by
// pair, then the lower rank's outgoing link first) that all ranks share, so that no two ranks
// can each be setting up a link the other has not reached, and later posts never wait on the
// peer.
//
// Completion is tracked with one cudaEvent per transfer, recorded on its link's stream;
// WaitRecv / WaitSends poll the events and every link's ncclCommGetAsyncError with op_timeout,
// and Abort() (any thread: ncclCommAbort on every link) makes every pending and future call
// return ABORTED within a poll interval. Nothing blocks inside NCCL: the communicators are
// non-blocking.
//
// Tags: NCCL has no tags. Messages on a link are matched purely by order, so the order of posts
// to a peer IS the protocol: both ends derive it from the same stage programs (the schedule,
// common/schedule.h), and the n-th send to a peer meets the n-th receive from it. To catch a
// schedule bug instead of silently swapping two payloads, each message carries its tag in an
// 8-byte header message just before it (same group, same link), and each end keeps a per-peer
// FIFO of the tags it posted; a receive whose header names another tag fails with INTERNAL
// naming both tags.
//
// Compute / communication: the link streams are independent of any compute stream, so the data
// of a send must be complete on the device when it is posted (the CUDA StageCompute's calls
// return when the device is done), and received data may be used once WaitRecv returns (it
// also checks the tag, counts the bytes and frees the receive's slot). A receive in flight
// holds NCCL kernels on the device until its data comes, so nothing on this device may
// synchronise the whole device (cudaDeviceSynchronize, cudaFree) while transfers are pending:
// the compute's buffers are pooled for that reason.
//
// The header names no CUDA or NCCL type (the streams, events and communicators live in
// nccl_transport.cc), so that main.cc includes it without the CUDA headers.
//
// Thread-safety: as Transport (one executor thread; Abort(), aborted() and the counters from any
// thread).
#ifndef TANDEM_WORKER_TRANSPORT_NCCL_TRANSPORT_H_
#define TANDEM_WORKER_TRANSPORT_NCCL_TRANSPORT_H_

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
  // The ranks this rank exchanges data with (TransferPeers of its stage program), in any order;
  // each of them must list this rank too. Empty: every other rank.
  std::vector<int> peers;
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

  // Posts `ops` in order, each launched at once on its link (the per-peer order of the sends
  // and of the receives is the posting order). Validates every op before posting any:
  // INVALID_ARGUMENT for a bad peer (one that is not in the options' peers) or a receive of
  // (peer, tag) already posted (or twice in the batch); RESOURCE_EXHAUSTED when more than
  // kMaxInFlight transfers would be in flight.
  absl::Status PostBatch(absl::Span<const Op> ops);

  // The peers this rank has links with, ascending.
  std::vector<int> peers() const;

  // Transfers (sends plus receives) that may be in flight at once.
  static constexpr int kMaxInFlight = 4096;

 private:
  // A transfer in flight: its peer, tag, header slot and completion event
  // (nccl_transport.cc).
  struct Pending;
  // One direction of data between this rank and a peer (see the header comment): its
  // communicator and stream (nccl_transport.cc).
  struct Link;
  // Connect()'s steps: options, ids through the store, communicators, streams and header
  // slots (nccl_transport.cc).
  class Connector;

  NcclTransport(const NcclTransportOptions& options, std::vector<Link> links,
                uint64_t* device_headers, uint64_t* host_headers);
  // The tag of Connect()'s warm-up exchange (no transfer tag has payload 0xFF).
  static constexpr uint64_t kWarmUpTag = ~uint64_t{0};

  // Connects every link now, in the global order (see the header comment). Called once, by
  // Connect().
  absl::Status WarmUp();
  // Checks `ops` (peers, buffers, receives not posted yet, room in flight).
  absl::Status Validate(absl::Span<const Op> ops) const;
  // Posts `op` (it passed Validate) on its link now, as one group (header and payload).
  absl::Status Launch(const Op& op);
  // Launch's steps. Checks that a transfer can go on link `link_index` now (ABORTED,
  // the broken status, RESOURCE_EXHAUSTED without a free header slot).
  absl::Status CheckLaunchable(size_t link_index) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A transfer of `op` holding a free header slot (CheckLaunchable found one).
  std::unique_ptr<Pending> TakeSlot(const Op& op) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Enqueues `op` on its link's stream: the completion event, a send's header staged to the
  // device, the NCCL group (header and payload), a receive's header back to the host, the
  // event recorded behind them. A failure leaves the link's stream with part of the transfer.
  absl::Status Enqueue(const Op& op, size_t link_index, Pending& transfer)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Waits until NCCL has enqueued the group just issued on link `link_index` (a non-blocking
  // communicator leaves ncclInProgress), releasing mu_ while it sleeps so that Abort() can run.
  absl::Status WaitEnqueued(const Op& op, size_t link_index) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Records an enqueued transfer: the expected-tag FIFO, the byte counter, the pending lists.
  void Track(const Op& op, std::unique_ptr<Pending> transfer) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Status CheckPeer(int peer) const;
  // Index into links_ of the link `op` goes on (its peer passed CheckPeer).
  size_t LinkOf(const Op& op) const;
  // Sleeps a poll interval. Returns ABORTED after Abort(), a link's asynchronous error, or
  // DEADLINE_EXCEEDED at `deadline`; OK to keep polling.
  absl::Status PollCheck(const char* op, int peer, std::chrono::steady_clock::time_point deadline);
  // Waits for `transfer`'s completion event (recorded on a link's stream).
  absl::Status WaitEvent(const char* op, int peer, const Pending& transfer);
  void Fail(const absl::Status& status);

  const NcclTransportOptions options_;
  // Per peer: the index into links_ of its outgoing and of its incoming link. Fixed at
  // construction.
  std::map<int, std::pair<size_t, size_t>> link_of_peer_;
  uint64_t* device_headers_ = nullptr;  // (kMaxInFlight) tag headers on the device, owned
  uint64_t* host_headers_ = nullptr;    // (kMaxInFlight) pinned host mirror, owned
  std::atomic<bool> aborted_{false};
  std::atomic<int64_t> bytes_sent_{0};
  std::atomic<int64_t> bytes_received_{0};

  mutable absl::Mutex mu_;
  // In the global warm-up order. Every NCCL call is made under mu_ (none blocks: the
  // communicators are non-blocking), so Abort() can free the communicators between two calls of
  // the executor.
  std::vector<Link> links_ ABSL_GUARDED_BY(mu_);
  absl::Status broken_ ABSL_GUARDED_BY(mu_);
  std::vector<int> free_slots_ ABSL_GUARDED_BY(mu_);  // indices into the header arrays
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
