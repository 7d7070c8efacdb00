#include "worker/transport/nccl_transport.h"

#include <gloo/rendezvous/store.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <set>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "worker/backend/cuda/cuda_status.h"

namespace tandem::worker {
namespace {

using Clock = std::chrono::steady_clock;

constexpr std::chrono::microseconds kPollInterval{50};
// What rank 0 publishes: "id:" + the ncclUniqueId bytes, or "error:" + why it could not.
constexpr absl::string_view kIdPrefix = "id:";
constexpr absl::string_view kErrorPrefix = "error:";

std::string Hex(uint64_t tag) { return absl::StrCat("0x", absl::Hex(tag)); }

bool IsTimeout(const std::string& what) {
  const std::string lower = absl::AsciiStrToLower(what);
  return absl::StrContains(lower, "timed out") || absl::StrContains(lower, "timeout") ||
         absl::StrContains(lower, "deadline_exceeded");
}

// A Status with `prefix` prepended to the message, same code.
absl::Status Prefixed(const std::string& prefix, const absl::Status& s) {
  return absl::Status(s.code(), absl::StrCat(prefix, s.message()));
}

// The device this rank uses exists and can be made current.
absl::Status UseDevice(int device) {
  absl::StatusOr<int> count = cuda::CudaDeviceCount();
  if (!count.ok()) return count.status();
  if (device >= *count) {
    return absl::FailedPreconditionError(
        absl::StrCat("CUDA device ", device, " requested, ", *count, " visible"));
  }
  TANDEM_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  return absl::OkStatus();
}

}  // namespace

struct NcclTransport::Pending {
  int peer = 0;
  uint64_t tag = 0;
  size_t bytes = 0;
  int slot = -1;                // header slot
  int64_t seq = 0;              // receives: number among the receives from peer
  cudaEvent_t event = nullptr;  // recorded on the comm stream after the transfer, owned
};

absl::StatusOr<std::unique_ptr<NcclTransport>> NcclTransport::Connect(
    const NcclTransportOptions& options, gloo::rendezvous::Store& store) {
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
  const std::string me = absl::StrCat("rank ", options.rank, " of ", options.size, ": ");
  const Clock::time_point deadline = Clock::now() + options.connect_timeout;
  const std::string key = absl::StrCat(options.key_prefix, "/unique_id");

  // 1. The communicator id, through the store.
  ncclUniqueId id;
  std::memset(&id, 0, sizeof id);
  try {
    if (options.rank == 0) {
      absl::Status s = UseDevice(options.device);
      if (s.ok()) {
        if (const ncclResult_t r = ncclGetUniqueId(&id); r != ncclSuccess) {
          s = cuda::NcclError(r, "ncclGetUniqueId(&id)", __FILE__, __LINE__);
        }
      }
      const std::string text =
          s.ok() ? absl::StrCat(kIdPrefix, absl::string_view(id.internal, sizeof id.internal))
                 : absl::StrCat(kErrorPrefix, s.ToString());
      const std::vector<char> value(text.begin(), text.end());
      store.set(key, value);  // the error too: the other ranks fail now, not at their timeout
      if (!s.ok()) return Prefixed(me, s);
    } else {
      store.wait({key}, options.connect_timeout);
      const std::vector<char> value = store.get(key);
      const std::string text(value.begin(), value.end());
      if (absl::StartsWith(text, kErrorPrefix)) {
        return absl::UnavailableError(absl::StrCat(
            me, "rank 0 could not create the NCCL id: ", text.substr(kErrorPrefix.size())));
      }
      if (!absl::StartsWith(text, kIdPrefix) ||
          value.size() != kIdPrefix.size() + sizeof id.internal) {
        return absl::InternalError(absl::StrCat(me, "malformed NCCL id under store key ", key, " (",
                                                value.size(), " bytes)"));
      }
      std::memcpy(id.internal, value.data() + kIdPrefix.size(), sizeof id.internal);
      if (absl::Status s = UseDevice(options.device); !s.ok()) return Prefixed(me, s);
    }
  } catch (const std::exception& e) {
    const std::string msg =
        absl::StrCat(me, "rendezvous for the NCCL id (store key ", key, ") failed: ", e.what());
    return IsTimeout(e.what()) || Clock::now() >= deadline ? absl::DeadlineExceededError(msg)
                                                           : absl::UnavailableError(msg);
  }

  // 2. The communicator, non-blocking, polled to readiness.
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  const ncclResult_t init = ncclCommInitRankConfig(&comm, options.size, id, options.rank, &config);
  if (init != ncclSuccess && init != ncclInProgress) {
    if (comm != nullptr) (void)ncclCommAbort(comm);
    return Prefixed(
        me, cuda::NcclError(init, "ncclCommInitRankConfig(&comm, ...)", __FILE__, __LINE__));
  }
  for (;;) {
    ncclResult_t state = ncclInProgress;
    if (const ncclResult_t r = ncclCommGetAsyncError(comm, &state); r != ncclSuccess) state = r;
    if (state == ncclSuccess) break;
    if (state != ncclInProgress) {
      const std::string last = ncclGetLastError(comm);
      (void)ncclCommAbort(comm);
      return Prefixed(me, absl::Status(cuda::NcclErrorCode(state) == absl::StatusCode::kInternal
                                           ? absl::StatusCode::kUnavailable
                                           : cuda::NcclErrorCode(state),
                                       absl::StrCat("creating the NCCL communicator failed: ",
                                                    ncclGetErrorString(state), ": ", last)));
    }
    if (options.cancelled != nullptr && options.cancelled->load()) {
      (void)ncclCommAbort(comm);
      return absl::AbortedError(absl::StrCat(me, "connecting the NCCL transport: cancelled"));
    }
    if (Clock::now() >= deadline) {
      (void)ncclCommAbort(comm);
      return absl::DeadlineExceededError(
          absl::StrCat(me, "the NCCL communicator was not ready after ",
                       options.connect_timeout.count(), " ms (a rank did not join?)"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }

  // 3. The comm stream and the tag-header slots.
  cudaStream_t stream = nullptr;
  uint64_t* device_headers = nullptr;
  uint64_t* host_headers = nullptr;
  auto cleanup = [&](const absl::Status& s) {
    if (host_headers != nullptr) (void)cudaFreeHost(host_headers);
    if (device_headers != nullptr) (void)cudaFree(device_headers);
    if (stream != nullptr) (void)cudaStreamDestroy(stream);
    (void)ncclCommAbort(comm);
    return Prefixed(me, s);
  };
  if (cudaError_t e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking); e != cudaSuccess) {
    return cleanup(cuda::CudaError(e, "cudaStreamCreateWithFlags", __FILE__, __LINE__));
  }
  if (cudaError_t e = cudaMalloc(&device_headers, kMaxInFlight * sizeof(uint64_t));
      e != cudaSuccess) {
    return cleanup(cuda::CudaError(e, "cudaMalloc(&device_headers, ...)", __FILE__, __LINE__));
  }
  if (cudaError_t e = cudaMallocHost(&host_headers, kMaxInFlight * sizeof(uint64_t));
      e != cudaSuccess) {
    return cleanup(cuda::CudaError(e, "cudaMallocHost(&host_headers, ...)", __FILE__, __LINE__));
  }
  std::unique_ptr<NcclTransport> transport(
      new NcclTransport(options, comm, stream, device_headers, host_headers));
  // 4. Connections (the destructor aborts the communicator on failure).
  if (absl::Status s = transport->WarmUp(); !s.ok()) return Prefixed(me, s);
  return transport;
}

absl::Status NcclTransport::WarmUp() {
  if (options_.size == 1) return absl::OkStatus();
  std::vector<Op> ops;
  for (int peer = 0; peer < options_.size; ++peer) {
    if (peer == options_.rank) continue;
    ops.push_back({Op::Kind::kSend, peer, kWarmUpTag, nullptr, 0, nullptr});
    ops.push_back({Op::Kind::kRecv, peer, kWarmUpTag, nullptr, 0, nullptr});
  }
  if (absl::Status s = PostBatch(ops); !s.ok()) return s;
  for (int peer = 0; peer < options_.size; ++peer) {
    if (peer == options_.rank) continue;
    if (absl::Status s = WaitRecv(peer, kWarmUpTag); !s.ok()) return s;
  }
  if (absl::Status s = WaitSends(); !s.ok()) return s;
  // The warm-up's headers are not payload.
  bytes_sent_.store(0);
  bytes_received_.store(0);
  return absl::OkStatus();
}

NcclTransport::NcclTransport(const NcclTransportOptions& options, ncclComm_t comm,
                             cudaStream_t stream, uint64_t* device_headers, uint64_t* host_headers)
    : options_(options),
      stream_(stream),
      device_headers_(device_headers),
      host_headers_(host_headers),
      comm_(comm) {
  free_slots_.reserve(kMaxInFlight);
  for (int i = kMaxInFlight - 1; i >= 0; --i) free_slots_.push_back(i);
}

NcclTransport::~NcclTransport() {
  (void)cudaSetDevice(options_.device);
  absl::MutexLock lock(&mu_);
  if (comm_ != nullptr) {
    bool clean = broken_.ok() && pending_sends_.empty() && pending_recvs_.empty();
    if (clean && ncclCommFinalize(comm_) == ncclSuccess) {
      // Non-blocking: poll the finalize to completion, bounded by the op timeout.
      const Clock::time_point deadline = Clock::now() + options_.op_timeout;
      ncclResult_t state = ncclInProgress;
      while (ncclCommGetAsyncError(comm_, &state) == ncclSuccess && state == ncclInProgress &&
             Clock::now() < deadline) {
        std::this_thread::sleep_for(kPollInterval);
      }
      clean = state == ncclSuccess;
    } else {
      clean = false;
    }
    (void)(clean ? ncclCommDestroy(comm_) : ncclCommAbort(comm_));
    comm_ = nullptr;
  }
  for (auto& p : pending_sends_) (void)cudaEventDestroy(p->event);
  for (auto& [key, p] : pending_recvs_) (void)cudaEventDestroy(p->event);
  if (host_headers_ != nullptr) (void)cudaFreeHost(host_headers_);
  if (device_headers_ != nullptr) (void)cudaFree(device_headers_);
  if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
}

absl::Status NcclTransport::CheckPeer(int peer) const {
  if (peer < 0 || peer >= options_.size || peer == options_.rank) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", options_.rank, ": peer rank ", peer,
                                                   " is not another rank of [0, ", options_.size,
                                                   ")"));
  }
  return absl::OkStatus();
}

absl::Status NcclTransport::Broken() const {
  if (aborted_.load()) return absl::AbortedError("nccl transport aborted");
  absl::MutexLock lock(&mu_);
  return broken_;
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
    if (comm_ == nullptr) return absl::AbortedError(absl::StrCat(what, ": transport aborted"));
    ncclResult_t state = ncclSuccess;
    const ncclResult_t r = ncclCommGetAsyncError(comm_, &state);
    if (r != ncclSuccess) state = r;
    if (state != ncclSuccess && state != ncclInProgress) {
      const absl::Status s = absl::UnavailableError(absl::StrCat(
          what, " failed: ", ncclGetErrorString(state), ": ", ncclGetLastError(comm_)));
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

absl::Status NcclTransport::WaitEvent(const char* op, int peer, cudaEvent_t event) {
  const Clock::time_point deadline = Clock::now() + options_.op_timeout;
  for (;;) {
    const cudaError_t e = cudaEventQuery(event);
    if (e == cudaSuccess) return absl::OkStatus();
    if (e != cudaErrorNotReady) {
      const absl::Status s = cuda::CudaError(e, "cudaEventQuery(event)", __FILE__, __LINE__);
      Fail(s);
      return s;
    }
    if (absl::Status s = PollCheck(op, peer, deadline); !s.ok()) return s;
  }
}

absl::Status NcclTransport::PostSend(int peer, uint64_t tag, const void* data, size_t bytes) {
  Op op;
  op.kind = Op::Kind::kSend;
  op.peer = peer;
  op.tag = tag;
  op.data = const_cast<void*>(data);  // NCCL's send reads it only
  op.bytes = bytes;
  return Queue({&op, 1});
}

absl::Status NcclTransport::PostRecv(int peer, uint64_t tag, void* data, size_t bytes) {
  Op op;
  op.kind = Op::Kind::kRecv;
  op.peer = peer;
  op.tag = tag;
  op.data = data;
  op.bytes = bytes;
  return Queue({&op, 1});
}

absl::Status NcclTransport::Recv(int peer, uint64_t tag, void* data, size_t bytes) {
  if (absl::Status s = PostRecv(peer, tag, data, bytes); !s.ok()) return s;
  return WaitRecv(peer, tag);
}

absl::Status NcclTransport::Queue(absl::Span<const Op> ops) {
  // Bad arguments now, not at the launch, so that the caller sees them where it posted.
  std::set<std::pair<int, uint64_t>> batch_recvs;
  for (const Op& op : ops) {
    if (absl::Status s = CheckPeer(op.peer); !s.ok()) return s;
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
  if (queued_.size() + ops.size() > static_cast<size_t>(kMaxInFlight)) {
    return absl::ResourceExhaustedError(
        absl::StrCat("rank ", options_.rank, ": more than ", kMaxInFlight, " transfers posted"));
  }
  queued_.insert(queued_.end(), ops.begin(), ops.end());
  return absl::OkStatus();
}

absl::Status NcclTransport::Flush() {
  std::vector<Op> ops;
  {
    absl::MutexLock lock(&mu_);
    if (queued_.empty()) return absl::OkStatus();
    ops.swap(queued_);
  }
  return Launch(ops);
}

absl::Status NcclTransport::PostBatch(absl::Span<const Op> ops) {
  if (absl::Status s = Queue(ops); !s.ok()) return s;
  return Flush();
}

absl::Status NcclTransport::Launch(absl::Span<const Op> ops) {
  // The arguments passed Queue's checks (peers, buffers, receives not yet posted).
  if (aborted_.load()) return absl::AbortedError("nccl transport: post: transport aborted");
  // The calling thread's current device may not be this rank's (Connect may have run on
  // another thread); the stream, events and header slots live on options_.device.
  TANDEM_CUDA_RETURN_IF_ERROR(cudaSetDevice(options_.device));
  absl::MutexLock lock(&mu_);
  if (comm_ == nullptr) return absl::AbortedError("nccl transport: post: transport aborted");
  if (!broken_.ok()) return broken_;
  if (ops.size() > free_slots_.size()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("rank ", options_.rank, ": more than ", kMaxInFlight, " transfers in flight"));
  }

  // Everything below changes state; a failure breaks the transport (the comm stream may hold
  // part of the batch).
  std::vector<std::unique_ptr<Pending>> posted;
  auto broken = [&](const absl::Status& s) {
    for (auto& p : posted) {
      if (p->event != nullptr) (void)cudaEventDestroy(p->event);
      free_slots_.push_back(p->slot);
    }
    if (broken_.ok()) broken_ = s;
    return s;
  };
  for (const Op& op : ops) {
    auto p = std::make_unique<Pending>();
    p->peer = op.peer;
    p->tag = op.tag;
    p->bytes = op.bytes;
    p->slot = free_slots_.back();
    free_slots_.pop_back();
    posted.push_back(std::move(p));
    Pending& pending = *posted.back();
    if (cudaError_t e = cudaEventCreateWithFlags(&pending.event, cudaEventDisableTiming);
        e != cudaSuccess) {
      return broken(cuda::CudaError(e, "cudaEventCreateWithFlags", __FILE__, __LINE__));
    }
    if (op.kind == Op::Kind::kSend) {
      if (op.ready != nullptr) {
        if (cudaError_t e = cudaStreamWaitEvent(stream_, op.ready, 0); e != cudaSuccess) {
          return broken(
              cuda::CudaError(e, "cudaStreamWaitEvent(stream_, op.ready)", __FILE__, __LINE__));
        }
      }
      // The header: the tag, staged through its pinned slot (which stays reserved until the
      // send completes, so the asynchronous copy may read it late).
      host_headers_[pending.slot] = op.tag;
      if (cudaError_t e =
              cudaMemcpyAsync(device_headers_ + pending.slot, host_headers_ + pending.slot,
                              sizeof(uint64_t), cudaMemcpyHostToDevice, stream_);
          e != cudaSuccess) {
        return broken(cuda::CudaError(e, "cudaMemcpyAsync(header H2D)", __FILE__, __LINE__));
      }
    }
  }

  // One group: header + payload per op, in order.
  if (ncclResult_t r = ncclGroupStart(); r != ncclSuccess) {
    return broken(cuda::NcclError(r, "ncclGroupStart()", __FILE__, __LINE__));
  }
  ncclResult_t issue = ncclSuccess;
  const char* failed_call = "";
  for (size_t i = 0; i < ops.size() && issue == ncclSuccess; ++i) {
    const Op& op = ops[i];
    uint64_t* header = device_headers_ + posted[i]->slot;
    if (op.kind == Op::Kind::kSend) {
      issue = ncclSend(header, sizeof(uint64_t), ncclUint8, op.peer, comm_, stream_);
      failed_call = "ncclSend(header)";
      if (issue == ncclSuccess && op.bytes > 0) {  // both ends skip an empty payload
        issue = ncclSend(op.data, op.bytes, ncclUint8, op.peer, comm_, stream_);
        failed_call = "ncclSend(data, bytes, ncclUint8, peer, comm_, stream_)";
      }
    } else {
      issue = ncclRecv(header, sizeof(uint64_t), ncclUint8, op.peer, comm_, stream_);
      failed_call = "ncclRecv(header)";
      if (issue == ncclSuccess && op.bytes > 0) {
        issue = ncclRecv(op.data, op.bytes, ncclUint8, op.peer, comm_, stream_);
        failed_call = "ncclRecv(data, bytes, ncclUint8, peer, comm_, stream_)";
      }
    }
  }
  // The group is closed even after a failed call inside it (NCCL requires balanced groups).
  const ncclResult_t end = ncclGroupEnd();
  if (issue != ncclSuccess && issue != ncclInProgress) {
    return broken(cuda::NcclError(issue, failed_call, __FILE__, __LINE__));
  }
  if (end != ncclSuccess && end != ncclInProgress) {
    return broken(cuda::NcclError(end, "ncclGroupEnd()", __FILE__, __LINE__));
  }
  // Non-blocking: the group is enqueued on the stream once the communicator leaves
  // ncclInProgress; only then may the completion events be recorded behind it. This only waits
  // for NCCL's enqueueing (connection setup on a first transfer to a peer), never for the peer.
  if (end == ncclInProgress) {
    const Clock::time_point deadline = Clock::now() + options_.op_timeout;
    for (;;) {
      ncclResult_t state = ncclInProgress;
      if (const ncclResult_t r = ncclCommGetAsyncError(comm_, &state); r != ncclSuccess) state = r;
      if (state == ncclSuccess) break;
      if (state != ncclInProgress) {
        return broken(absl::UnavailableError(absl::StrCat(
            "rank ", options_.rank, ": posting transfers failed: ", ncclGetErrorString(state), ": ",
            ncclGetLastError(comm_))));
      }
      if (aborted_.load()) return broken(absl::AbortedError("nccl transport: post: aborted"));
      if (Clock::now() >= deadline) {
        return broken(absl::DeadlineExceededError(absl::StrCat(
            "rank ", options_.rank, ": NCCL did not enqueue a group within the op timeout")));
      }
      // Released while sleeping so that Abort() can run (it takes mu_).
      mu_.Unlock();
      std::this_thread::sleep_for(kPollInterval);
      mu_.Lock();
      if (comm_ == nullptr) return broken(absl::AbortedError("nccl transport: post: aborted"));
    }
  }

  for (size_t i = 0; i < ops.size(); ++i) {
    const Op& op = ops[i];
    Pending& pending = *posted[i];
    if (op.kind == Op::Kind::kRecv) {
      // The received header back to its pinned slot, read by WaitRecv after the event.
      if (cudaError_t e =
              cudaMemcpyAsync(host_headers_ + pending.slot, device_headers_ + pending.slot,
                              sizeof(uint64_t), cudaMemcpyDeviceToHost, stream_);
          e != cudaSuccess) {
        return broken(cuda::CudaError(e, "cudaMemcpyAsync(header D2H)", __FILE__, __LINE__));
      }
    }
    if (cudaError_t e = cudaEventRecord(pending.event, stream_); e != cudaSuccess) {
      return broken(cuda::CudaError(e, "cudaEventRecord(event, stream_)", __FILE__, __LINE__));
    }
  }
  for (size_t i = 0; i < ops.size(); ++i) {
    const Op& op = ops[i];
    if (op.kind == Op::Kind::kSend) {
      send_order_[op.peer].push_back(op.tag);
      bytes_sent_.fetch_add(static_cast<int64_t>(op.bytes));
      pending_sends_.push_back(std::move(posted[i]));
    } else {
      posted[i]->seq = recvs_posted_[op.peer]++;
      recv_order_[op.peer].push_back(op.tag);
      pending_recvs_[{op.peer, op.tag}] = std::move(posted[i]);
    }
  }
  return absl::OkStatus();
}

bool NcclTransport::posted_recv(int peer, uint64_t tag) const {
  absl::MutexLock lock(&mu_);
  if (pending_recvs_.contains({peer, tag})) return true;
  return std::any_of(queued_.begin(), queued_.end(), [&](const Op& op) {
    return op.kind == Op::Kind::kRecv && op.peer == peer && op.tag == tag;
  });
}

absl::Status NcclTransport::WaitRecv(int peer, uint64_t tag) {
  if (absl::Status s = Flush(); !s.ok()) return s;
  if (aborted_.load()) {
    return absl::AbortedError(absl::StrCat("receive from peer rank ", peer, ": transport aborted"));
  }
  cudaEvent_t event = nullptr;
  {
    absl::MutexLock lock(&mu_);
    auto it = pending_recvs_.find({peer, tag});
    if (it == pending_recvs_.end()) {
      return absl::FailedPreconditionError(absl::StrCat("rank ", options_.rank,
                                                        ": no receive from peer rank ", peer,
                                                        " tag ", Hex(tag), " posted"));
    }
    if (!broken_.ok()) return broken_;
    event = it->second->event;
  }
  if (absl::Status s = WaitEvent("receive", peer, event); !s.ok()) return s;

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
  const Op ops[2] = {{Op::Kind::kSend, peer, tag, const_cast<void*>(send), bytes, nullptr},
                     {Op::Kind::kRecv, peer, tag, recv, bytes, nullptr}};
  if (absl::Status s = Queue(ops); !s.ok()) return s;
  return WaitRecv(peer, tag);  // launches the queue, the pair included
}

absl::Status NcclTransport::WaitSends() {
  if (absl::Status s = Flush(); !s.ok()) return s;
  if (aborted_.load()) return absl::AbortedError("wait for sends: transport aborted");
  std::vector<std::pair<int, cudaEvent_t>> sends;
  {
    absl::MutexLock lock(&mu_);
    if (!broken_.ok()) return broken_;
    for (const auto& p : pending_sends_) sends.emplace_back(p->peer, p->event);
  }
  for (const auto& [peer, event] : sends) {
    if (absl::Status s = WaitEvent("send", peer, event); !s.ok()) return s;
  }
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

absl::Status NcclTransport::CommStreamWaitEvent(cudaEvent_t event) {
  if (absl::Status s = Flush(); !s.ok()) return s;
  if (absl::Status s = Broken(); !s.ok()) return s;
  TANDEM_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream_, event, 0));
  return absl::OkStatus();
}

absl::Status NcclTransport::ComputeStreamWaitRecv(int peer, uint64_t tag, cudaStream_t stream) {
  if (absl::Status s = Flush(); !s.ok()) return s;
  if (absl::Status s = Broken(); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  auto it = pending_recvs_.find({peer, tag});
  if (it == pending_recvs_.end()) {
    return absl::FailedPreconditionError(absl::StrCat("rank ", options_.rank,
                                                      ": no receive from peer rank ", peer, " tag ",
                                                      Hex(tag), " posted"));
  }
  TANDEM_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream, it->second->event, 0));
  return absl::OkStatus();
}

void NcclTransport::Abort() {
  aborted_.store(true);
  absl::MutexLock lock(&mu_);
  if (comm_ != nullptr) {
    // Stops NCCL's kernels and proxy threads; pending events may never complete, which is why
    // every wait checks aborted_ on each poll.
    (void)ncclCommAbort(comm_);
    comm_ = nullptr;
  }
}

}  // namespace tandem::worker
