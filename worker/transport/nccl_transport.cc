#include "worker/transport/nccl_transport.h"

#include <cuda_runtime_api.h>
#include <gloo/rendezvous/store.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <exception>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "common/status_macros.h"
#include "worker/backend/cuda/cuda_status.h"
#include "worker/backend/cuda/device.h"

namespace tandem::worker {
namespace {

using Clock = std::chrono::steady_clock;

constexpr std::chrono::microseconds kPollInterval{50};
// A wait spins (yielding) this long before it polls at kPollInterval: a sleep costs its
// interval plus the timer's slack, which would round every short transfer up to ~0.1 ms.
constexpr std::chrono::microseconds kSpin{200};
// What rank 0 publishes: "id:" + the ncclUniqueId bytes, or "error:" + why it could not.
constexpr absl::string_view kIdPrefix = "id:";
constexpr absl::string_view kErrorPrefix = "error:";

std::string Hex(uint64_t tag) { return absl::StrCat("0x", absl::Hex(tag)); }

bool IsTimeout(const std::string& what) {
  const std::string lower = absl::AsciiStrToLower(what);
  return absl::StrContains(lower, "timed out") || absl::StrContains(lower, "timeout") ||
         absl::StrContains(lower, "deadline_exceeded");
}

// The device this rank uses exists and can be made current.
absl::Status UseDevice(int device) {
  ASSIGN_OR_RETURN(const int count, cuda::CudaDeviceCount());
  if (device >= count) {
    return absl::FailedPreconditionError(
        absl::StrCat("CUDA device ", device, " requested, ", count, " visible"));
  }
  TANDEM_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  return absl::OkStatus();
}

// The ranks this rank links with (`options.peers`, or every other rank when empty), or
// INVALID_ARGUMENT for bad options.
absl::StatusOr<std::set<int>> ValidateOptions(const NcclTransportOptions& options) {
  if (options.size < 1 || options.rank < 0 || options.rank >= options.size) {
    return absl::InvalidArgumentError(
        absl::StrCat("nccl transport: rank ", options.rank, " is outside [0, ", options.size, ")"));
  }
  if (options.device < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("nccl transport: device ", options.device, " < 0"));
  }
  if (options.key_prefix.empty()) {
    return absl::InvalidArgumentError("nccl transport: key_prefix must not be empty");
  }
  if (options.connect_timeout.count() <= 0 || options.op_timeout.count() <= 0) {
    return absl::InvalidArgumentError("nccl transport: timeouts must be positive");
  }
  std::set<int> peers;
  for (int peer : options.peers) {
    if (peer < 0 || peer >= options.size || peer == options.rank) {
      return absl::InvalidArgumentError(absl::StrCat(
          "nccl transport: peer rank ", peer, " is not another rank of [0, ", options.size, ")"));
    }
    if (!peers.insert(peer).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("nccl transport: peer rank ", peer, " is listed twice"));
    }
  }
  if (options.peers.empty()) {
    for (int r = 0; r < options.size; ++r) {
      if (r != options.rank) peers.insert(r);
    }
  }
  return peers;
}

}  // namespace

struct NcclTransport::Pending {
  int peer = 0;
  uint64_t tag = 0;
  size_t bytes = 0;
  int slot = -1;                // header slot
  int64_t seq = 0;              // receives: number among the receives from peer
  cudaEvent_t event = nullptr;  // recorded on the link's stream after the transfer, owned
};

struct NcclTransport::Link {
  int peer = 0;
  bool send = false;              // this rank sends on it (and is rank 0 of its communicator)
  ncclComm_t comm = nullptr;      // owned; null after Abort()
  cudaStream_t stream = nullptr;  // owned
};

namespace {

// A communicator's state: ncclSuccess (ready, or its last call done), ncclInProgress, or its
// asynchronous error (or the query's own).
ncclResult_t CommState(ncclComm_t comm) {
  ncclResult_t state = ncclInProgress;
  if (const ncclResult_t r = ncclCommGetAsyncError(comm, &state); r != ncclSuccess) return r;
  return state;
}

// "the link to peer rank 3" / "the link from peer rank 3".
std::string LinkName(bool send, int peer) {
  return absl::StrCat("the link ", send ? "to" : "from", " peer rank ", peer);
}

}  // namespace

// Connect()'s steps, in order. Owns what it creates (communicators, streams, header slots)
// until Finish() hands it to the transport, and releases it when dropped before that (a
// failed step). The steps' errors do not name the rank; Connect() prefixes them.
class NcclTransport::Connector {
 public:
  Connector(const NcclTransportOptions& options, const std::set<int>& peers)
      : options_(options), deadline_(Clock::now() + options.connect_timeout) {
    // The links in the global order: by pair (lower rank, higher rank), which ascending peers
    // give, and within a pair the lower rank's outgoing link first.
    for (int peer : peers) {
      const bool lower = options.rank < peer;
      links_.push_back({peer, lower, nullptr, nullptr});
      links_.push_back({peer, !lower, nullptr, nullptr});
    }
    ids_.resize(links_.size());
    for (ncclUniqueId& id : ids_) std::memset(&id, 0, sizeof id);
  }
  ~Connector() { Release(); }
  Connector(const Connector&) = delete;
  Connector& operator=(const Connector&) = delete;

  // 1. The communicators' ids: this rank's outgoing links' published, then the incoming
  // links' awaited. DEADLINE_EXCEEDED or UNAVAILABLE when the store fails or times out.
  absl::Status ExchangeIds(gloo::rendezvous::Store& store) {
    try {
      RETURN_IF_ERROR(PublishIds(store));
      return FetchPeerIds(store);
    } catch (const std::exception& e) {
      const std::string msg =
          absl::StrCat("rendezvous for the NCCL ids (store key ", key_, ") failed: ", e.what(),
                       " (did the peer join, and does it list this rank among its peers?)");
      return IsTimeout(e.what()) || Clock::now() >= deadline_ ? absl::DeadlineExceededError(msg)
                                                              : absl::UnavailableError(msg);
    }
  }

  // 2. The communicators (2 ranks each, the sender rank 0), non-blocking, created in the
  // global order, should an init wait for its peer ...
  absl::Status InitComms() {
    for (size_t i = 0; i < links_.size(); ++i) {
      ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
      config.blocking = 0;
      const ncclResult_t init =
          ncclCommInitRankConfig(&links_[i].comm, 2, ids_[i], links_[i].send ? 0 : 1, &config);
      if (init != ncclSuccess && init != ncclInProgress) {
        return WithPrefix(
            cuda::NcclError(init, "ncclCommInitRankConfig(&comm, 2, ...)", __FILE__, __LINE__),
            LinkName(links_[i].send, links_[i].peer));
      }
    }
    return absl::OkStatus();
  }

  // ... and polled to readiness together: UNAVAILABLE (or NCCL's code) when one fails,
  // ABORTED when cancelled, DEADLINE_EXCEEDED after connect_timeout.
  absl::Status PollReady() {
    for (;;) {
      bool ready = true;
      for (const Link& l : links_) {
        const ncclResult_t state = CommState(l.comm);
        if (state == ncclInProgress) ready = false;
        if (state == ncclSuccess || state == ncclInProgress) continue;
        const std::string last = ncclGetLastError(l.comm);
        const absl::StatusCode code = cuda::NcclErrorCode(state) == absl::StatusCode::kInternal
                                          ? absl::StatusCode::kUnavailable
                                          : cuda::NcclErrorCode(state);
        return absl::Status(
            code, absl::StrCat("creating the NCCL communicator of ", LinkName(l.send, l.peer),
                               " failed: ", ncclGetErrorString(state), ": ", last));
      }
      if (ready) return absl::OkStatus();
      if (options_.cancelled != nullptr && options_.cancelled->load()) {
        return absl::AbortedError("connecting the NCCL transport: cancelled");
      }
      if (Clock::now() >= deadline_) {
        return absl::DeadlineExceededError(
            absl::StrCat("the NCCL communicators were not ready after ",
                         options_.connect_timeout.count(), " ms (a peer did not join?)"));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }

  // 3. A stream per link ...
  absl::Status CreateStreams() {
    for (Link& l : links_) {
      if (cudaError_t e = cudaStreamCreateWithFlags(&l.stream, cudaStreamNonBlocking);
          e != cudaSuccess) {
        return cuda::CudaError(e, "cudaStreamCreateWithFlags", __FILE__, __LINE__);
      }
    }
    return absl::OkStatus();
  }

  // ... and the tag-header slots, on the device and pinned on the host.
  absl::Status AllocateHeaders() {
    if (cudaError_t e = cudaMalloc(&device_headers_, kMaxInFlight * sizeof(uint64_t));
        e != cudaSuccess) {
      return cuda::CudaError(e, "cudaMalloc(&device_headers, ...)", __FILE__, __LINE__);
    }
    if (cudaError_t e = cudaMallocHost(&host_headers_, kMaxInFlight * sizeof(uint64_t));
        e != cudaSuccess) {
      return cuda::CudaError(e, "cudaMallocHost(&host_headers, ...)", __FILE__, __LINE__);
    }
    return absl::OkStatus();
  }

  // The transport, owning everything created so far (the steps above all succeeded).
  std::unique_ptr<NcclTransport> Finish() {
    std::unique_ptr<NcclTransport> transport(
        new NcclTransport(options_, std::move(links_), std::exchange(device_headers_, nullptr),
                          std::exchange(host_headers_, nullptr)));
    links_.clear();
    return transport;
  }

 private:
  // The store key of a link's communicator id.
  std::string KeyOf(const Link& l) const {
    const int from = l.send ? options_.rank : l.peer;
    const int to = l.send ? l.peer : options_.rank;
    return absl::StrCat(options_.key_prefix, "/", from, "-", to, "/unique_id");
  }

  // Creates and publishes the outgoing links' ids; when this rank cannot (no usable device),
  // publishes its error in their place, so that the peers fail now, not at their timeout, and
  // returns it. The store may throw.
  absl::Status PublishIds(gloo::rendezvous::Store& store) {
    absl::Status s = UseDevice(options_.device);
    for (size_t i = 0; i < links_.size() && s.ok(); ++i) {
      if (!links_[i].send) continue;
      if (const ncclResult_t r = ncclGetUniqueId(&ids_[i]); r != ncclSuccess) {
        s = cuda::NcclError(r, "ncclGetUniqueId(&id)", __FILE__, __LINE__);
      }
    }
    for (size_t i = 0; i < links_.size(); ++i) {
      if (!links_[i].send) continue;
      key_ = KeyOf(links_[i]);
      const std::string text =
          s.ok() ? absl::StrCat(kIdPrefix,
                                absl::string_view(ids_[i].internal, sizeof ids_[i].internal))
                 : absl::StrCat(kErrorPrefix, s.ToString());
      store.set(key_, std::vector<char>(text.begin(), text.end()));
    }
    return s;
  }

  // Waits for the incoming links' ids (each peer publishes them before it waits for any).
  // UNAVAILABLE when a peer published its error, INTERNAL for a malformed id. The store may
  // throw (its timeout too).
  absl::Status FetchPeerIds(gloo::rendezvous::Store& store) {
    for (size_t i = 0; i < links_.size(); ++i) {
      if (links_[i].send) continue;
      key_ = KeyOf(links_[i]);
      const auto left =
          std::max(std::chrono::duration_cast<std::chrono::milliseconds>(deadline_ - Clock::now()),
                   std::chrono::milliseconds(1));
      store.wait({key_}, left);
      const std::vector<char> value = store.get(key_);
      const std::string text(value.begin(), value.end());
      if (absl::StartsWith(text, kErrorPrefix)) {
        return absl::UnavailableError(absl::StrCat("peer rank ", links_[i].peer,
                                                   " could not create the NCCL id of its link to "
                                                   "this rank: ",
                                                   text.substr(kErrorPrefix.size())));
      }
      if (!absl::StartsWith(text, kIdPrefix) ||
          value.size() != kIdPrefix.size() + sizeof ids_[i].internal) {
        return absl::InternalError(absl::StrCat("malformed NCCL id under store key ", key_, " (",
                                                value.size(), " bytes)"));
      }
      std::memcpy(ids_[i].internal, value.data() + kIdPrefix.size(), sizeof ids_[i].internal);
    }
    return absl::OkStatus();
  }

  // Frees whatever was created and not handed over.
  void Release() {
    if (host_headers_ != nullptr) (void)cudaFreeHost(host_headers_);
    if (device_headers_ != nullptr) (void)cudaFree(device_headers_);
    host_headers_ = nullptr;
    device_headers_ = nullptr;
    for (Link& l : links_) {
      if (l.comm != nullptr) (void)ncclCommAbort(l.comm);
      if (l.stream != nullptr) (void)cudaStreamDestroy(l.stream);
      l.comm = nullptr;
      l.stream = nullptr;
    }
  }

  const NcclTransportOptions& options_;
  const Clock::time_point deadline_;
  std::vector<Link> links_;        // in the global order
  std::vector<ncclUniqueId> ids_;  // per link: its communicator's id
  std::string key_;                // the store key being published or awaited, for the messages
  uint64_t* device_headers_ = nullptr;  // (kMaxInFlight)
  uint64_t* host_headers_ = nullptr;    // (kMaxInFlight), pinned
};

absl::StatusOr<std::unique_ptr<NcclTransport>> NcclTransport::Connect(
    const NcclTransportOptions& options, gloo::rendezvous::Store& store) {
  ASSIGN_OR_RETURN(const std::set<int> peers, ValidateOptions(options));
  const std::string me = absl::StrCat("rank ", options.rank, " of ", options.size);
  Connector connector(options, peers);
  RETURN_IF_ERROR(WithPrefix(connector.ExchangeIds(store), me));
  RETURN_IF_ERROR(WithPrefix(connector.InitComms(), me));
  RETURN_IF_ERROR(WithPrefix(connector.PollReady(), me));
  RETURN_IF_ERROR(WithPrefix(connector.CreateStreams(), me));
  RETURN_IF_ERROR(WithPrefix(connector.AllocateHeaders(), me));
  std::unique_ptr<NcclTransport> transport = connector.Finish();
  // 4. Connections (the destructor aborts the communicators on failure).
  RETURN_IF_ERROR(WithPrefix(transport->WarmUp(), me));
  return transport;
}

absl::Status NcclTransport::WarmUp() {
  std::vector<Op> ops;
  {
    absl::MutexLock lock(&mu_);
    for (const Link& l : links_) {
      ops.push_back({l.send ? Op::Kind::kSend : Op::Kind::kRecv, l.peer, kWarmUpTag, nullptr, 0});
    }
  }
  if (ops.empty()) return absl::OkStatus();
  // Posted in the global order, each launch waiting for its link's connection to be set up.
  RETURN_IF_ERROR(PostBatch(ops));
  for (const Op& op : ops) {
    if (op.kind != Op::Kind::kRecv) continue;
    RETURN_IF_ERROR(WaitRecv(op.peer, kWarmUpTag));
  }
  RETURN_IF_ERROR(WaitSends());
  // The warm-up's headers are not payload.
  bytes_sent_.store(0);
  bytes_received_.store(0);
  return absl::OkStatus();
}

NcclTransport::NcclTransport(const NcclTransportOptions& options, std::vector<Link> links,
                             uint64_t* device_headers, uint64_t* host_headers)
    : options_(options),
      device_headers_(device_headers),
      host_headers_(host_headers),
      links_(std::move(links)) {
  for (size_t i = 0; i < links_.size(); ++i) {
    auto& [out, in] = link_of_peer_[links_[i].peer];
    (links_[i].send ? out : in) = i;
  }
  free_slots_.reserve(kMaxInFlight);
  for (int i = kMaxInFlight - 1; i >= 0; --i) free_slots_.push_back(i);
}

NcclTransport::~NcclTransport() {
  (void)cudaSetDevice(options_.device);
  absl::MutexLock lock(&mu_);
  const bool clean = broken_.ok() && pending_sends_.empty() && pending_recvs_.empty();
  // Finalize (non-blocking: polled to completion, bounded by the op timeout) when clean; what
  // did not finalize is aborted.
  std::vector<bool> finalizing(links_.size(), false);
  for (size_t i = 0; i < links_.size(); ++i) {
    if (!clean || links_[i].comm == nullptr) continue;
    const ncclResult_t r = ncclCommFinalize(links_[i].comm);
    finalizing[i] = r == ncclSuccess || r == ncclInProgress;
  }
  const Clock::time_point deadline = Clock::now() + options_.op_timeout;
  for (size_t i = 0; i < links_.size(); ++i) {
    Link& l = links_[i];
    if (l.comm == nullptr) continue;
    bool finalized = false;
    if (finalizing[i]) {
      ncclResult_t state = CommState(l.comm);
      while (state == ncclInProgress && Clock::now() < deadline) {
        std::this_thread::sleep_for(kPollInterval);
        state = CommState(l.comm);
      }
      finalized = state == ncclSuccess;
    }
    (void)(finalized ? ncclCommDestroy(l.comm) : ncclCommAbort(l.comm));
    l.comm = nullptr;
  }
  for (auto& p : pending_sends_) (void)cudaEventDestroy(p->event);
  for (auto& [key, p] : pending_recvs_) (void)cudaEventDestroy(p->event);
  if (host_headers_ != nullptr) (void)cudaFreeHost(host_headers_);
  if (device_headers_ != nullptr) (void)cudaFree(device_headers_);
  for (Link& l : links_) {
    if (l.stream != nullptr) (void)cudaStreamDestroy(l.stream);
  }
}

std::vector<int> NcclTransport::peers() const {
  std::vector<int> out;
  for (const auto& [peer, ends] : link_of_peer_) out.push_back(peer);
  return out;
}

absl::Status NcclTransport::CheckPeer(int peer) const {
  if (peer < 0 || peer >= options_.size || peer == options_.rank) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", options_.rank, ": peer rank ", peer,
                                                   " is not another rank of [0, ", options_.size,
                                                   ")"));
  }
  if (!link_of_peer_.contains(peer)) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", options_.rank, ": peer rank ", peer,
                     " is not one of this rank's NCCL peers (the ranks it has links with: ",
                     absl::StrJoin(peers(), ", "), ")"));
  }
  return absl::OkStatus();
}

size_t NcclTransport::LinkOf(const Op& op) const {
  const auto& [out, in] = link_of_peer_.at(op.peer);
  return op.kind == Op::Kind::kSend ? out : in;
}

void NcclTransport::Fail(const absl::Status& status) {
  absl::MutexLock lock(&mu_);
  if (broken_.ok()) broken_ = status;
}

absl::Status NcclTransport::PollCheck(const char* op, int peer, Clock::time_point deadline) {
  const std::string what = absl::StrCat(op, " with peer rank ", peer);
  if (aborted_.load()) return absl::AbortedError(absl::StrCat(what, ": transport aborted"));
  {
    absl::MutexLock lock(&mu_);
    // Every link: a failed peer anywhere in the pipeline fails this wait now, not at its
    // timeout.
    for (const Link& l : links_) {
      if (l.comm == nullptr) return absl::AbortedError(absl::StrCat(what, ": transport aborted"));
      const ncclResult_t state = CommState(l.comm);
      if (state == ncclSuccess || state == ncclInProgress) continue;
      const absl::Status s = absl::UnavailableError(
          absl::StrCat(what, " failed: ", LinkName(l.send, l.peer), ": ", ncclGetErrorString(state),
                       ": ", ncclGetLastError(l.comm)));
      if (broken_.ok()) broken_ = s;
      return s;
    }
  }
  if (Clock::now() >= deadline) {
    const absl::Status s = absl::DeadlineExceededError(
        absl::StrCat(what, ": not complete after ", options_.op_timeout.count(), " ms"));
    Fail(s);
    return s;
  }
  std::this_thread::sleep_for(kPollInterval);
  return absl::OkStatus();
}

absl::Status NcclTransport::WaitEvent(const char* op, int peer, const Pending& transfer) {
  const cudaEvent_t event = transfer.event;
  const Clock::time_point start = Clock::now();
  const Clock::time_point deadline = start + options_.op_timeout;
  for (;;) {
    const cudaError_t e = cudaEventQuery(event);
    if (e == cudaSuccess) return absl::OkStatus();
    if (e != cudaErrorNotReady) {
      const absl::Status s = cuda::CudaError(e, "cudaEventQuery(event)", __FILE__, __LINE__);
      Fail(s);
      return s;
    }
    if (Clock::now() - start < kSpin && !aborted_.load()) {
      std::this_thread::yield();
      continue;
    }
    RETURN_IF_ERROR(PollCheck(op, peer, deadline));
  }
}

absl::Status NcclTransport::PostSend(int peer, uint64_t tag, const void* data, size_t bytes) {
  Op op;
  op.kind = Op::Kind::kSend;
  op.peer = peer;
  op.tag = tag;
  op.data = const_cast<void*>(data);  // NCCL's send reads it only
  op.bytes = bytes;
  return PostBatch({&op, 1});
}

absl::Status NcclTransport::PostRecv(int peer, uint64_t tag, void* data, size_t bytes) {
  Op op;
  op.kind = Op::Kind::kRecv;
  op.peer = peer;
  op.tag = tag;
  op.data = data;
  op.bytes = bytes;
  return PostBatch({&op, 1});
}

absl::Status NcclTransport::Recv(int peer, uint64_t tag, void* data, size_t bytes) {
  RETURN_IF_ERROR(PostRecv(peer, tag, data, bytes));
  return WaitRecv(peer, tag);
}

absl::Status NcclTransport::Validate(absl::Span<const Op> ops) const {
  // Bad arguments before anything is posted, so that the caller sees them where it posted.
  std::set<std::pair<int, uint64_t>> batch_recvs;
  for (const Op& op : ops) {
    RETURN_IF_ERROR(CheckPeer(op.peer));
    if (op.data == nullptr && op.bytes > 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("rank ", options_.rank, ": null buffer for ", op.bytes, " bytes"));
    }
    if (op.kind == Op::Kind::kRecv &&
        (posted_recv(op.peer, op.tag) || !batch_recvs.insert({op.peer, op.tag}).second)) {
      return absl::InvalidArgumentError(
          absl::StrCat("rank ", options_.rank, ": a receive from peer rank ", op.peer, " with tag ",
                       Hex(op.tag), " is already posted"));
    }
  }
  if (aborted_.load()) return absl::AbortedError("nccl transport: post: transport aborted");
  absl::MutexLock lock(&mu_);
  if (ops.size() > free_slots_.size()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("rank ", options_.rank, ": more than ", kMaxInFlight, " transfers in flight"));
  }
  return absl::OkStatus();
}

absl::Status NcclTransport::PostBatch(absl::Span<const Op> ops) {
  RETURN_IF_ERROR(Validate(ops));
  for (const Op& op : ops) {
    RETURN_IF_ERROR(Launch(op));
  }
  return absl::OkStatus();
}

absl::Status NcclTransport::Launch(const Op& op) {
  // The arguments passed Validate's checks (peer, buffer, receive not yet posted).
  if (aborted_.load()) return absl::AbortedError("nccl transport: post: transport aborted");
  // The calling thread's current device may not be this rank's (Connect may have run on
  // another thread); the streams, events and header slots live on options_.device.
  TANDEM_CUDA_RETURN_IF_ERROR(cudaSetDevice(options_.device));
  absl::MutexLock lock(&mu_);
  const size_t link_index = LinkOf(op);
  RETURN_IF_ERROR(CheckLaunchable(link_index));
  std::unique_ptr<Pending> transfer = TakeSlot(op);
  // A failure from here on breaks the transport (the link's stream may hold part of the
  // transfer).
  if (const absl::Status s = Enqueue(op, link_index, *transfer); !s.ok()) {
    if (transfer->event != nullptr) (void)cudaEventDestroy(transfer->event);
    free_slots_.push_back(transfer->slot);
    if (broken_.ok()) broken_ = s;
    return s;
  }
  Track(op, std::move(transfer));
  return absl::OkStatus();
}

absl::Status NcclTransport::CheckLaunchable(size_t link_index) const {
  if (links_[link_index].comm == nullptr) {
    return absl::AbortedError("nccl transport: post: transport aborted");
  }
  if (!broken_.ok()) return broken_;
  if (free_slots_.empty()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("rank ", options_.rank, ": more than ", kMaxInFlight, " transfers in flight"));
  }
  return absl::OkStatus();
}

std::unique_ptr<NcclTransport::Pending> NcclTransport::TakeSlot(const Op& op) {
  auto transfer = std::make_unique<Pending>();
  transfer->peer = op.peer;
  transfer->tag = op.tag;
  transfer->bytes = op.bytes;
  transfer->slot = free_slots_.back();
  free_slots_.pop_back();
  return transfer;
}

namespace {

// Issues `op` on `comm` / `stream` as one group: the tag header (device slot `header`), then the
// payload (both ends skip an empty one). Returns whether the group is still being enqueued
// (ncclInProgress: a non-blocking communicator), or the failed call's error.
absl::StatusOr<bool> IssueGroup(const NcclTransport::Op& op, ncclComm_t comm, cudaStream_t stream,
                                uint64_t* header) {
  if (ncclResult_t r = ncclGroupStart(); r != ncclSuccess) {
    return cuda::NcclError(r, "ncclGroupStart()", __FILE__, __LINE__);
  }
  const bool send = op.kind == NcclTransport::Op::Kind::kSend;
  // On a link's communicator the peer is its rank 1 when this rank sends, rank 0 when it
  // receives.
  const int peer_in_comm = send ? 1 : 0;
  ncclResult_t issue = ncclSuccess;
  const char* failed_call = "";
  if (send) {
    issue = ncclSend(header, sizeof(uint64_t), ncclUint8, peer_in_comm, comm, stream);
    failed_call = "ncclSend(header)";
    if (issue == ncclSuccess && op.bytes > 0) {
      issue = ncclSend(op.data, op.bytes, ncclUint8, peer_in_comm, comm, stream);
      failed_call = "ncclSend(data, bytes, ncclUint8, 1, comm, stream)";
    }
  } else {
    issue = ncclRecv(header, sizeof(uint64_t), ncclUint8, peer_in_comm, comm, stream);
    failed_call = "ncclRecv(header)";
    if (issue == ncclSuccess && op.bytes > 0) {
      issue = ncclRecv(op.data, op.bytes, ncclUint8, peer_in_comm, comm, stream);
      failed_call = "ncclRecv(data, bytes, ncclUint8, 0, comm, stream)";
    }
  }
  // The group is closed even after a failed call inside it (NCCL requires balanced groups).
  const ncclResult_t end = ncclGroupEnd();
  if (issue != ncclSuccess && issue != ncclInProgress) {
    return cuda::NcclError(issue, failed_call, __FILE__, __LINE__);
  }
  if (end != ncclSuccess && end != ncclInProgress) {
    return cuda::NcclError(end, "ncclGroupEnd()", __FILE__, __LINE__);
  }
  return end == ncclInProgress;
}

}  // namespace

absl::Status NcclTransport::Enqueue(const Op& op, size_t link_index, Pending& transfer) {
  const cudaStream_t stream = links_[link_index].stream;
  if (cudaError_t e = cudaEventCreateWithFlags(&transfer.event, cudaEventDisableTiming);
      e != cudaSuccess) {
    return cuda::CudaError(e, "cudaEventCreateWithFlags", __FILE__, __LINE__);
  }
  uint64_t* header = device_headers_ + transfer.slot;
  if (op.kind == Op::Kind::kSend) {
    // The header: the tag, staged through its pinned slot (which stays reserved until the send
    // completes, so the asynchronous copy may read it late).
    host_headers_[transfer.slot] = op.tag;
    if (cudaError_t e = cudaMemcpyAsync(header, host_headers_ + transfer.slot, sizeof(uint64_t),
                                        cudaMemcpyHostToDevice, stream);
        e != cudaSuccess) {
      return cuda::CudaError(e, "cudaMemcpyAsync(header H2D)", __FILE__, __LINE__);
    }
  }
  ASSIGN_OR_RETURN(const bool in_progress, IssueGroup(op, links_[link_index].comm, stream, header));
  // Non-blocking: the group is enqueued on the stream once the communicator leaves
  // ncclInProgress; only then may the completion event be recorded behind it. After the
  // warm-up this only waits for NCCL's enqueueing, never for the peer.
  if (in_progress) RETURN_IF_ERROR(WaitEnqueued(op, link_index));
  if (op.kind == Op::Kind::kRecv) {
    // The received header back to its pinned slot, read by WaitRecv after the event.
    if (cudaError_t e = cudaMemcpyAsync(host_headers_ + transfer.slot, header, sizeof(uint64_t),
                                        cudaMemcpyDeviceToHost, stream);
        e != cudaSuccess) {
      return cuda::CudaError(e, "cudaMemcpyAsync(header D2H)", __FILE__, __LINE__);
    }
  }
  if (cudaError_t e = cudaEventRecord(transfer.event, stream); e != cudaSuccess) {
    return cuda::CudaError(e, "cudaEventRecord(event, stream)", __FILE__, __LINE__);
  }
  return absl::OkStatus();
}

absl::Status NcclTransport::WaitEnqueued(const Op& op, size_t link_index) {
  const ncclComm_t comm = links_[link_index].comm;
  const Clock::time_point deadline = Clock::now() + options_.op_timeout;
  for (;;) {
    const ncclResult_t state = CommState(comm);
    if (state == ncclSuccess) return absl::OkStatus();
    if (state != ncclInProgress) {
      return absl::UnavailableError(absl::StrCat("rank ", options_.rank, ": posting a transfer on ",
                                                 LinkName(op.kind == Op::Kind::kSend, op.peer),
                                                 " failed: ", ncclGetErrorString(state), ": ",
                                                 ncclGetLastError(comm)));
    }
    if (aborted_.load()) return absl::AbortedError("nccl transport: post: aborted");
    if (Clock::now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("rank ", options_.rank, ": NCCL did not enqueue a transfer on ",
                       LinkName(op.kind == Op::Kind::kSend, op.peer), " within the op timeout"));
    }
    // Released while sleeping so that Abort() can run (it takes mu_).
    mu_.Unlock();
    std::this_thread::sleep_for(kPollInterval);
    mu_.Lock();
    if (links_[link_index].comm == nullptr) {
      return absl::AbortedError("nccl transport: post: aborted");
    }
  }
}

void NcclTransport::Track(const Op& op, std::unique_ptr<Pending> transfer) {
  if (op.kind == Op::Kind::kSend) {
    send_order_[op.peer].push_back(op.tag);
    bytes_sent_.fetch_add(static_cast<int64_t>(op.bytes));
    pending_sends_.push_back(std::move(transfer));
  } else {
    transfer->seq = recvs_posted_[op.peer]++;
    recv_order_[op.peer].push_back(op.tag);
    pending_recvs_[{op.peer, op.tag}] = std::move(transfer);
  }
}

bool NcclTransport::posted_recv(int peer, uint64_t tag) const {
  absl::MutexLock lock(&mu_);
  return pending_recvs_.contains({peer, tag});
}

absl::Status NcclTransport::WaitRecv(int peer, uint64_t tag) {
  if (aborted_.load()) {
    return absl::AbortedError(absl::StrCat("receive from peer rank ", peer, ": transport aborted"));
  }
  const Pending* transfer = nullptr;
  {
    absl::MutexLock lock(&mu_);
    auto it = pending_recvs_.find({peer, tag});
    if (it == pending_recvs_.end()) {
      return absl::FailedPreconditionError(absl::StrCat("rank ", options_.rank,
                                                        ": no receive from peer rank ", peer,
                                                        " tag ", Hex(tag), " posted"));
    }
    if (!broken_.ok()) return broken_;
    transfer = it->second.get();
  }
  RETURN_IF_ERROR(WaitEvent("receive", peer, *transfer));

  absl::MutexLock lock(&mu_);
  auto it = pending_recvs_.find({peer, tag});
  if (it == pending_recvs_.end()) return absl::AbortedError("receive: transport aborted");
  Pending& p = *it->second;
  const uint64_t got = host_headers_[p.slot];
  std::deque<uint64_t>& order = recv_order_[peer];
  if (got != tag) {
    // The peer sent its messages in another order than this rank posted its receives: the two
    // ends' schedules disagree. The data is in the wrong buffers; the transport is unusable.
    const absl::Status s = absl::InternalError(absl::StrCat(
        "rank ", options_.rank, ": receive #", p.seq, " from peer rank ", peer, " expected tag ",
        Hex(tag), " but the peer sent tag ", Hex(got),
        " (messages are matched by order; the two ranks' schedules disagree; receives pending "
        "from that peer in order: ",
        absl::StrJoin(order, ", ", [](std::string* out, uint64_t t) { out->append(Hex(t)); }),
        ")"));
    if (broken_.ok()) broken_ = s;
    return s;
  }
  if (auto pos = std::find(order.begin(), order.end(), tag); pos != order.end()) order.erase(pos);
  bytes_received_.fetch_add(static_cast<int64_t>(p.bytes));
  (void)cudaEventDestroy(p.event);
  free_slots_.push_back(p.slot);
  pending_recvs_.erase(it);
  return absl::OkStatus();
}

absl::Status NcclTransport::SendRecv(int peer, uint64_t tag, const void* send, void* recv,
                                     size_t bytes) {
  // On two links: neither waits for the other.
  const Op ops[2] = {{Op::Kind::kSend, peer, tag, const_cast<void*>(send), bytes},
                     {Op::Kind::kRecv, peer, tag, recv, bytes}};
  RETURN_IF_ERROR(PostBatch(ops));
  return WaitRecv(peer, tag);
}

absl::Status NcclTransport::WaitSends() {
  if (aborted_.load()) return absl::AbortedError("wait for sends: transport aborted");
  std::vector<const Pending*> sends;
  {
    absl::MutexLock lock(&mu_);
    if (!broken_.ok()) return broken_;
    for (const auto& p : pending_sends_) sends.push_back(p.get());
  }
  for (const Pending* p : sends) RETURN_IF_ERROR(WaitEvent("send", p->peer, *p));
  absl::MutexLock lock(&mu_);
  // Only the sends waited for (none is added concurrently: one executor thread).
  const size_t done = std::min(sends.size(), pending_sends_.size());
  for (size_t i = 0; i < done; ++i) {
    Pending& p = *pending_sends_[i];
    std::deque<uint64_t>& order = send_order_[p.peer];
    if (!order.empty()) order.pop_front();
    (void)cudaEventDestroy(p.event);
    free_slots_.push_back(p.slot);
  }
  pending_sends_.erase(pending_sends_.begin(), pending_sends_.begin() + done);
  return absl::OkStatus();
}

void NcclTransport::Abort() {
  aborted_.store(true);
  absl::MutexLock lock(&mu_);
  // Stops NCCL's kernels and proxy threads; pending events may never complete, which is why
  // every wait checks aborted_ on each poll.
  for (Link& l : links_) {
    if (l.comm != nullptr) (void)ncclCommAbort(l.comm);
    l.comm = nullptr;
  }
}

}  // namespace tandem::worker
