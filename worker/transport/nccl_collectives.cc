#include "worker/transport/nccl_collectives.h"

#include <cuda_runtime_api.h>
#include <gloo/rendezvous/store.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <exception>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/shard_range.h"
#include "common/status_macros.h"
#include "worker/backend/cuda/cuda_status.h"
#include "worker/backend/cuda/device.h"

namespace tandem::worker {
namespace {

using Clock = std::chrono::steady_clock;

constexpr std::chrono::microseconds kPollInterval{50};
// A wait spins (yielding) this long before it polls at kPollInterval: a sleep costs its
// interval plus the timer's slack, which would round every short operation up to ~0.1 ms.
constexpr std::chrono::microseconds kSpin{200};
// What rank 0 publishes: "id:" + the ncclUniqueId bytes, or "error:" + why it could not.
constexpr absl::string_view kIdPrefix = "id:";
constexpr absl::string_view kErrorPrefix = "error:";

bool IsTimeout(const std::string& what) {
  const std::string lower = absl::AsciiStrToLower(what);
  return absl::StrContains(lower, "timed out") || absl::StrContains(lower, "timeout") ||
         absl::StrContains(lower, "deadline_exceeded");
}

bool Cancelled(const NcclCollectivesOptions& options) {
  return options.cancelled != nullptr && options.cancelled->load();
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

absl::Status ValidateOptions(const NcclCollectivesOptions& options) {
  if (options.size < 1 || options.rank < 0 || options.rank >= options.size) {
    return absl::InvalidArgumentError(absl::StrCat("nccl collectives: rank ", options.rank,
                                                   " is outside [0, ", options.size, ")"));
  }
  if (options.device < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("nccl collectives: device ", options.device, " < 0"));
  }
  if (options.key_prefix.empty()) {
    return absl::InvalidArgumentError("nccl collectives: key_prefix must not be empty");
  }
  if (options.connect_timeout.count() <= 0 || options.op_timeout.count() <= 0) {
    return absl::InvalidArgumentError("nccl collectives: timeouts must be positive");
  }
  return absl::OkStatus();
}

// A communicator's state: ncclSuccess (ready, or its last call done), ncclInProgress, or its
// asynchronous error (or the query's own).
ncclResult_t CommState(ncclComm_t comm) {
  ncclResult_t state = ncclInProgress;
  if (const ncclResult_t r = ncclCommGetAsyncError(comm, &state); r != ncclSuccess) return r;
  return state;
}

bool Issued(ncclResult_t r) { return r == ncclSuccess || r == ncclInProgress; }

}  // namespace

struct NcclCollectives::Comm {
  ncclComm_t comm = nullptr;      // owned; null once aborted
  cudaStream_t stream = nullptr;  // owned
  cudaEvent_t event = nullptr;    // owned; recorded behind each operation
};

// Connect()'s steps, in order (size >= 2). Owns what it creates until Finish() hands it over,
// and releases it when dropped before that (a failed step). The steps' errors do not name the
// rank; Connect() prefixes them.
class NcclCollectives::Connector {
 public:
  explicit Connector(const NcclCollectivesOptions& options)
      : options_(options),
        deadline_(Clock::now() + options.connect_timeout),
        key_(absl::StrCat(options.key_prefix, "/unique_id")),
        comm_(std::make_unique<Comm>()) {
    std::memset(&id_, 0, sizeof id_);
  }
  ~Connector() { Release(); }
  Connector(const Connector&) = delete;
  Connector& operator=(const Connector&) = delete;

  // 1. The communicator's id: rank 0 creates and publishes it (or its error); the others wait
  // for it, then check their device. DEADLINE_EXCEEDED or UNAVAILABLE when the store fails or
  // times out; ABORTED when cancelled.
  absl::Status ExchangeId(gloo::rendezvous::Store& store) {
    if (Cancelled(options_)) return absl::AbortedError("connecting NCCL collectives: cancelled");
    try {
      if (options_.rank == 0) return PublishId(store);
      RETURN_IF_ERROR(FetchId(store));
    } catch (const std::exception& e) {
      const std::string msg = absl::StrCat(
          "rendezvous for the NCCL id (store key ", key_, ") failed: ", e.what(),
          options_.rank == 0 ? "" : " (did rank 0 of the group join, with the same key_prefix?)");
      if (Cancelled(options_)) return absl::AbortedError(absl::StrCat(msg, " (cancelled)"));
      return IsTimeout(e.what()) || Clock::now() >= deadline_ ? absl::DeadlineExceededError(msg)
                                                              : absl::UnavailableError(msg);
    }
    return UseDevice(options_.device);
  }

  // 2. The communicator, non-blocking ...
  absl::Status InitComm() {
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    const ncclResult_t init =
        ncclCommInitRankConfig(&comm_->comm, options_.size, id_, options_.rank, &config);
    if (!Issued(init)) {
      return cuda::NcclError(init, "ncclCommInitRankConfig(&comm, size, id, rank, &config)",
                             __FILE__, __LINE__);
    }
    return absl::OkStatus();
  }

  // ... polled to readiness: UNAVAILABLE (or NCCL's code) when it fails, ABORTED when
  // cancelled, DEADLINE_EXCEEDED after connect_timeout (the destructor then aborts it).
  absl::Status PollReady() {
    for (;;) {
      const ncclResult_t state = CommState(comm_->comm);
      if (state == ncclSuccess) return absl::OkStatus();
      if (state != ncclInProgress) {
        const std::string last = ncclGetLastError(comm_->comm);
        const absl::StatusCode code = cuda::NcclErrorCode(state) == absl::StatusCode::kInternal
                                          ? absl::StatusCode::kUnavailable
                                          : cuda::NcclErrorCode(state);
        return absl::Status(code, absl::StrCat("creating the NCCL communicator failed: ",
                                               ncclGetErrorString(state), ": ", last));
      }
      if (Cancelled(options_)) {
        return absl::AbortedError("connecting NCCL collectives: cancelled");
      }
      if (Clock::now() >= deadline_) {
        return absl::DeadlineExceededError(absl::StrCat(
            "the NCCL communicator was not ready after ", options_.connect_timeout.count(),
            " ms (a rank of the group did not join?)"));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }

  // 3. The stream and the completion event.
  absl::Status CreateStreamAndEvent() {
    TANDEM_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&comm_->stream, cudaStreamNonBlocking));
    TANDEM_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&comm_->event, cudaEventDisableTiming));
    return absl::OkStatus();
  }

  // Everything created (the steps above all succeeded).
  std::unique_ptr<Comm> Finish() { return std::move(comm_); }

 private:
  // Creates and publishes the id; when this rank cannot (no usable device), publishes its error
  // in its place, so that the other ranks fail now, not at their timeout, and returns it. The
  // store may throw.
  absl::Status PublishId(gloo::rendezvous::Store& store) {
    absl::Status s = UseDevice(options_.device);
    if (s.ok()) {
      if (const ncclResult_t r = ncclGetUniqueId(&id_); r != ncclSuccess) {
        s = cuda::NcclError(r, "ncclGetUniqueId(&id)", __FILE__, __LINE__);
      }
    }
    const std::string text =
        s.ok() ? absl::StrCat(kIdPrefix, absl::string_view(id_.internal, sizeof id_.internal))
               : absl::StrCat(kErrorPrefix, s.ToString());
    store.set(key_, std::vector<char>(text.begin(), text.end()));
    return s;
  }

  // Waits for rank 0's id. UNAVAILABLE when rank 0 published its error, INTERNAL for a
  // malformed id. The store may throw (its timeout too).
  absl::Status FetchId(gloo::rendezvous::Store& store) {
    const auto left =
        std::max(std::chrono::duration_cast<std::chrono::milliseconds>(deadline_ - Clock::now()),
                 std::chrono::milliseconds(1));
    store.wait({key_}, left);
    const std::vector<char> value = store.get(key_);
    const std::string text(value.begin(), value.end());
    if (absl::StartsWith(text, kErrorPrefix)) {
      return absl::UnavailableError(
          absl::StrCat("rank 0 of the group could not create the NCCL id: ",
                       absl::string_view(text).substr(kErrorPrefix.size())));
    }
    if (!absl::StartsWith(text, kIdPrefix) ||
        value.size() != kIdPrefix.size() + sizeof id_.internal) {
      return absl::InternalError(
          absl::StrCat("malformed NCCL id under store key ", key_, " (", value.size(), " bytes)"));
    }
    std::memcpy(id_.internal, value.data() + kIdPrefix.size(), sizeof id_.internal);
    return absl::OkStatus();
  }

  // Frees whatever was created and not handed over.
  void Release() {
    if (comm_ == nullptr) return;
    if (comm_->comm != nullptr) (void)ncclCommAbort(comm_->comm);
    if (comm_->event != nullptr) (void)cudaEventDestroy(comm_->event);
    if (comm_->stream != nullptr) (void)cudaStreamDestroy(comm_->stream);
    comm_.reset();
  }

  const NcclCollectivesOptions& options_;
  const Clock::time_point deadline_;
  const std::string key_;  // "<key_prefix>/unique_id"
  ncclUniqueId id_;
  std::unique_ptr<Comm> comm_;
};

absl::StatusOr<std::unique_ptr<NcclCollectives>> NcclCollectives::Connect(
    const NcclCollectivesOptions& options, gloo::rendezvous::Store& store) {
  RETURN_IF_ERROR(ValidateOptions(options));
  // One rank: nothing to reduce with, no communicator, no device.
  if (options.size == 1) {
    return std::unique_ptr<NcclCollectives>(new NcclCollectives(options, nullptr));
  }
  const std::string me = absl::StrCat("rank ", options.rank, " of ", options.size);
  Connector connector(options);
  RETURN_IF_ERROR(WithPrefix(connector.ExchangeId(store), me));
  RETURN_IF_ERROR(WithPrefix(connector.InitComm(), me));
  RETURN_IF_ERROR(WithPrefix(connector.PollReady(), me));
  RETURN_IF_ERROR(WithPrefix(connector.CreateStreamAndEvent(), me));
  return std::unique_ptr<NcclCollectives>(new NcclCollectives(options, connector.Finish()));
}

NcclCollectives::NcclCollectives(const NcclCollectivesOptions& options, std::unique_ptr<Comm> comm)
    : options_(options), comm_(std::move(comm)) {}

NcclCollectives::~NcclCollectives() {
  absl::MutexLock lock(&mu_);
  if (comm_ == nullptr) return;
  (void)cudaSetDevice(options_.device);
  Comm& c = *comm_;
  if (c.comm != nullptr) {
    // Finalize (non-blocking: polled, bounded by connect_timeout, as it waits for the group to
    // be quiescent) when clean; what did not finalize is aborted.
    bool finalized = false;
    if (broken_.ok() && !aborted_.load() && Issued(ncclCommFinalize(c.comm))) {
      const Clock::time_point deadline = Clock::now() + options_.connect_timeout;
      ncclResult_t state = CommState(c.comm);
      while (state == ncclInProgress && Clock::now() < deadline) {
        std::this_thread::sleep_for(kPollInterval);
        state = CommState(c.comm);
      }
      finalized = state == ncclSuccess;
    }
    (void)(finalized ? ncclCommDestroy(c.comm) : ncclCommAbort(c.comm));
    c.comm = nullptr;
  }
  if (c.event != nullptr) (void)cudaEventDestroy(c.event);
  if (c.stream != nullptr) (void)cudaStreamDestroy(c.stream);
}

absl::Status NcclCollectives::AllReduce(float* data, size_t count) {
  return Run(Kind::kAllReduce, data, count);
}

absl::Status NcclCollectives::ReduceScatter(float* data, size_t count) {
  return Run(Kind::kReduceScatter, data, count);
}

absl::Status NcclCollectives::AllGather(float* data, size_t count) {
  return Run(Kind::kAllGather, data, count);
}

void NcclCollectives::Abort() {
  aborted_.store(true);
  absl::MutexLock lock(&mu_);
  // Stops NCCL's kernels and proxy threads; the running operation's event may then complete
  // early or never, which is why its wait checks aborted_ on each poll and after the event.
  if (comm_ != nullptr && comm_->comm != nullptr) {
    (void)ncclCommAbort(comm_->comm);
    comm_->comm = nullptr;
  }
}

namespace {

const char* NameOf(NcclCollectives::Kind kind) {
  switch (kind) {
    case NcclCollectives::Kind::kAllReduce:
      return "all-reduce";
    case NcclCollectives::Kind::kReduceScatter:
      return "reduce-scatter";
    case NcclCollectives::Kind::kAllGather:
      return "all-gather";
  }
  return "collective";
}

}  // namespace

absl::Status NcclCollectives::Run(Kind kind, float* data, size_t count) {
  const std::string what = absl::StrCat(NameOf(kind), " of ", count, " floats");
  if (data == nullptr && count > 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": null buffer"));
  }
  {
    absl::MutexLock lock(&mu_);
    RETURN_IF_ERROR(Usable(what));
    if (comm_ == nullptr) return absl::OkStatus();  // one rank: the data is the sum
  }
  if (count == 0) return absl::OkStatus();
  const Clock::time_point deadline = Clock::now() + options_.op_timeout;
  // The calling thread's current device may not be this rank's (Connect may have run on
  // another thread); the stream and the event live on options_.device.
  if (const cudaError_t e = cudaSetDevice(options_.device); e != cudaSuccess) {
    return WithPrefix(cuda::CudaError(e, "cudaSetDevice(device)", __FILE__, __LINE__), what);
  }
  RETURN_IF_ERROR(Enqueue(kind, data, count, what, deadline));
  return WaitDone(what, deadline);
}

namespace {

// Issues the operation on `comm` / `stream` as one group (see the header comment). Returns
// whether the group is still being enqueued (ncclInProgress: a non-blocking communicator), or
// the failed call's error.
absl::StatusOr<bool> IssueGroup(NcclCollectives::Kind kind, float* data, size_t count, int size,
                                ncclComm_t comm, cudaStream_t stream) {
  TANDEM_NCCL_RETURN_IF_ERROR(ncclGroupStart());
  ncclResult_t issue = ncclSuccess;
  const char* failed_call = "";
  if (kind == NcclCollectives::Kind::kAllReduce) {
    issue = ncclAllReduce(data, data, count, ncclFloat32, ncclSum, comm, stream);
    failed_call = "ncclAllReduce(data, data, count, ncclFloat32, ncclSum, comm, stream)";
  } else {
    // Rank k's owned segment rooted at k: the same calls, in the same order, on every rank.
    // Empty segments (count < size) are skipped, alike everywhere.
    for (int owner = 0; owner < size && Issued(issue); ++owner) {
      const ElementRange segment = OwnedSegment(count, size, owner);
      if (segment.size() == 0) continue;
      float* p = data + segment.begin;
      if (kind == NcclCollectives::Kind::kReduceScatter) {
        issue = ncclReduce(p, p, segment.size(), ncclFloat32, ncclSum, owner, comm, stream);
        failed_call = "ncclReduce(segment, segment, n, ncclFloat32, ncclSum, owner, comm, stream)";
      } else {
        issue = ncclBroadcast(p, p, segment.size(), ncclFloat32, owner, comm, stream);
        failed_call = "ncclBroadcast(segment, segment, n, ncclFloat32, owner, comm, stream)";
      }
    }
  }
  // The group is closed even after a failed call inside it (NCCL requires balanced groups).
  const ncclResult_t end = ncclGroupEnd();
  if (!Issued(issue)) return cuda::NcclError(issue, failed_call, __FILE__, __LINE__);
  if (!Issued(end)) return cuda::NcclError(end, "ncclGroupEnd()", __FILE__, __LINE__);
  return end == ncclInProgress;
}

}  // namespace

absl::Status NcclCollectives::Enqueue(Kind kind, float* data, size_t count, const std::string& what,
                                      Clock::time_point deadline) {
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(Usable(what));
  Comm& c = *comm_;  // not reset before the destructor (Abort() nulls c.comm only)
  // A failure from here on leaves part of the operation on the stream: the communicator is
  // unusable (Fail aborts it).
  absl::StatusOr<bool> in_progress = IssueGroup(kind, data, count, options_.size, c.comm, c.stream);
  if (!in_progress.ok()) return Fail(what, in_progress.status());
  // Non-blocking: the group is on the stream once the communicator leaves ncclInProgress; only
  // then may the event be recorded behind it.
  while (*in_progress) {
    const ncclResult_t state = CommState(c.comm);
    if (state == ncclSuccess) break;
    if (state != ncclInProgress) {
      return Fail(what, absl::UnavailableError(absl::StrCat(
                            "rank ", options_.rank, " of ", options_.size,
                            ": NCCL failed enqueueing the operation: ", ncclGetErrorString(state),
                            ": ", ncclGetLastError(c.comm))));
    }
    if (Clock::now() >= deadline) {
      return Fail(what, absl::DeadlineExceededError(absl::StrCat(
                            "rank ", options_.rank, " of ", options_.size,
                            ": NCCL did not enqueue the operation within the op timeout (",
                            options_.op_timeout.count(), " ms)")));
    }
    // Released while sleeping so that Abort() can run (it takes mu_).
    mu_.Unlock();
    std::this_thread::sleep_for(kPollInterval);
    mu_.Lock();
    RETURN_IF_ERROR(Usable(what));
  }
  if (const cudaError_t e = cudaEventRecord(c.event, c.stream); e != cudaSuccess) {
    return Fail(what, cuda::CudaError(e, "cudaEventRecord(event, stream)", __FILE__, __LINE__));
  }
  return absl::OkStatus();
}

absl::Status NcclCollectives::WaitDone(const std::string& what, Clock::time_point deadline) {
  const Clock::time_point start = Clock::now();
  for (;;) {
    // The event is only destroyed by the destructor, so it is queried without mu_.
    cudaEvent_t event = nullptr;
    {
      absl::MutexLock lock(&mu_);
      event = comm_->event;
    }
    const cudaError_t e = cudaEventQuery(event);
    if (e == cudaSuccess) {
      // An abort stops NCCL's kernels early, which completes the event too: the data is only
      // the sum when the communicator is still whole.
      absl::MutexLock lock(&mu_);
      return Usable(what);
    }
    if (e != cudaErrorNotReady) {
      absl::MutexLock lock(&mu_);
      return Fail(what, cuda::CudaError(e, "cudaEventQuery(event)", __FILE__, __LINE__));
    }
    if (Clock::now() - start < kSpin && !aborted_.load()) {
      std::this_thread::yield();
      continue;
    }
    {
      absl::MutexLock lock(&mu_);
      RETURN_IF_ERROR(Usable(what));
      const ncclResult_t state = CommState(comm_->comm);
      if (state != ncclSuccess && state != ncclInProgress) {
        return Fail(what, absl::UnavailableError(absl::StrCat(
                              "rank ", options_.rank, " of ", options_.size,
                              ": NCCL failed: ", ncclGetErrorString(state), ": ",
                              ncclGetLastError(comm_->comm), " (did a rank of the group fail?)")));
      }
      if (Clock::now() >= deadline) {
        return Fail(what, absl::DeadlineExceededError(absl::StrCat(
                              "rank ", options_.rank, " of ", options_.size,
                              ": not complete after ", options_.op_timeout.count(),
                              " ms (did every rank of the group call it, with the same count?)")));
      }
    }
    std::this_thread::sleep_for(kPollInterval);
  }
}

absl::Status NcclCollectives::Usable(const std::string& what) const {
  if (aborted_.load()) return absl::AbortedError(absl::StrCat(what, ": communicator aborted"));
  if (!broken_.ok()) {
    return WithPrefix(broken_, absl::StrCat(what, ": the communicator failed earlier"));
  }
  if (comm_ != nullptr && comm_->comm == nullptr) {
    return absl::AbortedError(absl::StrCat(what, ": communicator aborted"));
  }
  return absl::OkStatus();
}

absl::Status NcclCollectives::Fail(const std::string& what, const absl::Status& status) {
  const absl::Status s = WithPrefix(status, what);
  if (broken_.ok()) broken_ = s;
  // Stops the kernels still running, so that the caller may free or reuse the buffer.
  if (comm_ != nullptr && comm_->comm != nullptr) {
    (void)ncclCommAbort(comm_->comm);
    comm_->comm = nullptr;
  }
  return s;
}

namespace {

class NcclGroupCollectives final : public GroupCollectives {
 public:
  explicit NcclGroupCollectives(std::unique_ptr<NcclCollectives> nccl) : nccl_(std::move(nccl)) {}
  int rank() const override { return nccl_->rank(); }
  int size() const override { return nccl_->size(); }
  void Abort() override { nccl_->Abort(); }
  absl::Status Run(CollectiveOp op, absl::Span<const absl::Span<float>> tensors) override {
    for (const absl::Span<float>& t : tensors) {
      switch (op) {
        case CollectiveOp::kAllReduce:
          RETURN_IF_ERROR(nccl_->AllReduce(t.data(), t.size()));
          break;
        case CollectiveOp::kReduceScatter:
          RETURN_IF_ERROR(nccl_->ReduceScatter(t.data(), t.size()));
          break;
        case CollectiveOp::kAllGather:
          RETURN_IF_ERROR(nccl_->AllGather(t.data(), t.size()));
          break;
      }
    }
    return absl::OkStatus();
  }

 private:
  std::unique_ptr<NcclCollectives> nccl_;
};

}  // namespace

std::unique_ptr<GroupCollectives> NewNcclGroupCollectives(std::unique_ptr<NcclCollectives> nccl) {
  return std::make_unique<NcclGroupCollectives>(std::move(nccl));
}

}  // namespace tandem::worker
