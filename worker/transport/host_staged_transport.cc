#include "worker/transport/host_staged_transport.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace tandem::worker {
namespace {

// A pooled buffer serves a request of `bytes` when it wastes at most this much (so a small
// message does not pin a large buffer).
size_t MaxFitCapacity(size_t bytes) { return std::max(2 * bytes, bytes + (size_t{64} << 10)); }

}  // namespace

HostStagedTransport::HostStagedTransport(std::unique_ptr<Transport> inner,
                                         std::unique_ptr<DeviceCopier> copier,
                                         HostStagedTransportOptions options)
    : options_(options), copier_(std::move(copier)), inner_(std::move(inner)) {}

HostStagedTransport::~HostStagedTransport() { inner_.reset(); }

absl::StatusOr<std::unique_ptr<HostBuffer>> HostStagedTransport::TakeStaging(size_t bytes,
                                                                             const char* op,
                                                                             int peer,
                                                                             uint64_t tag) {
  {
    absl::MutexLock lock(&mu_);
    auto it = pool_.lower_bound(bytes);
    if (it != pool_.end() && it->first <= MaxFitCapacity(bytes)) {
      std::unique_ptr<HostBuffer> buffer = std::move(it->second);
      pooled_bytes_ -= it->first;
      pool_.erase(it);
      return buffer;
    }
  }
  absl::StatusOr<std::unique_ptr<HostBuffer>> buffer = copier_->AllocateHost(bytes);
  RETURN_IF_ERROR(WithPrefix(buffer.status(), absl::StrCat(Describe(op, peer, tag), ": allocating ",
                                                           bytes, " bytes of host staging")));
  absl::MutexLock lock(&mu_);
  ++staging_allocations_;
  return buffer;
}

void HostStagedTransport::ReturnStaging(std::unique_ptr<HostBuffer> buffer) {
  if (buffer == nullptr) return;
  const size_t capacity = buffer->bytes();
  absl::MutexLock lock(&mu_);
  if (pooled_bytes_ + capacity > options_.max_pooled_bytes) return;  // freed here
  pooled_bytes_ += capacity;
  pool_.emplace(capacity, std::move(buffer));
}

void HostStagedTransport::Retire(std::unique_ptr<HostBuffer> buffer) {
  absl::MutexLock lock(&mu_);
  retired_.push_back(std::move(buffer));
}

absl::Status HostStagedTransport::ReleaseRefused(absl::Status refusal,
                                                 std::unique_ptr<HostBuffer> buffer) {
  if (refusal.code() == absl::StatusCode::kInvalidArgument) {
    ReturnStaging(std::move(buffer));
  } else {
    Retire(std::move(buffer));
  }
  return refusal;
}

int64_t HostStagedTransport::staging_allocations() const {
  absl::MutexLock lock(&mu_);
  return staging_allocations_;
}

std::string HostStagedTransport::Describe(const char* op, int peer, uint64_t tag) const {
  return absl::StrCat("rank ", rank(), ": ", op, " peer rank ", peer, " tag ", tag);
}

absl::Status HostStagedTransport::PostSend(int peer, uint64_t tag, const void* data, size_t bytes) {
  // Checked before the copy, so that an aborted transport does no device work.
  if (aborted()) return absl::AbortedError("send: transport aborted");
  ASSIGN_OR_RETURN(std::unique_ptr<HostBuffer> staging, TakeStaging(bytes, "send to", peer, tag));
  if (bytes > 0) {
    if (absl::Status s = copier_->CopyToHost(staging->data(), data, bytes); !s.ok()) {
      ReturnStaging(std::move(staging));
      return WithPrefix(s, absl::StrCat(Describe("send to", peer, tag), ": copying ", bytes,
                                        " bytes from the device to host staging"));
    }
  }
  if (absl::Status s = inner_->PostSend(peer, tag, staging->data(), bytes); !s.ok()) {
    return ReleaseRefused(std::move(s), std::move(staging));
  }
  absl::MutexLock lock(&mu_);
  sending_.push_back(std::move(staging));
  return absl::OkStatus();
}

absl::Status HostStagedTransport::WaitSends() {
  RETURN_IF_ERROR(inner_->WaitSends());
  std::vector<std::unique_ptr<HostBuffer>> done;
  {
    absl::MutexLock lock(&mu_);
    done.swap(sending_);
  }
  for (auto& buffer : done) ReturnStaging(std::move(buffer));
  return absl::OkStatus();
}

absl::Status HostStagedTransport::PostRecv(int peer, uint64_t tag, void* data, size_t bytes) {
  if (aborted()) return absl::AbortedError("receive: transport aborted");
  {
    absl::MutexLock lock(&mu_);
    if (pending_recvs_.contains({peer, tag})) {
      return absl::InvalidArgumentError(absl::StrCat("rank ", rank(), ": a receive from peer rank ",
                                                     peer, " with tag ", tag,
                                                     " is already posted"));
    }
  }
  ASSIGN_OR_RETURN(std::unique_ptr<HostBuffer> staging,
                   TakeStaging(bytes, "receive from", peer, tag));
  if (absl::Status s = inner_->PostRecv(peer, tag, staging->data(), bytes); !s.ok()) {
    return ReleaseRefused(std::move(s), std::move(staging));
  }
  absl::MutexLock lock(&mu_);
  pending_recvs_[{peer, tag}] = PendingRecv{data, bytes, std::move(staging)};
  return absl::OkStatus();
}

absl::Status HostStagedTransport::WaitRecv(int peer, uint64_t tag) {
  {
    absl::MutexLock lock(&mu_);
    if (!pending_recvs_.contains({peer, tag})) {
      return absl::FailedPreconditionError(absl::StrCat(
          "rank ", rank(), ": no receive from peer rank ", peer, " tag ", tag, " posted"));
    }
  }
  // On failure the entry stays (as the inner transport's does): its staging buffer may still be
  // referenced, and the transport is unusable anyway.
  RETURN_IF_ERROR(inner_->WaitRecv(peer, tag));
  PendingRecv recv;
  {
    absl::MutexLock lock(&mu_);
    auto it = pending_recvs_.find({peer, tag});
    recv = std::move(it->second);
    pending_recvs_.erase(it);
  }
  absl::Status copied;
  if (recv.bytes > 0) copied = copier_->CopyToDevice(recv.device, recv.staging->data(), recv.bytes);
  ReturnStaging(std::move(recv.staging));
  return WithPrefix(copied, absl::StrCat(Describe("receive from", peer, tag), ": copying ",
                                         recv.bytes, " bytes from host staging to the device"));
}

absl::Status HostStagedTransport::Recv(int peer, uint64_t tag, void* data, size_t bytes) {
  RETURN_IF_ERROR(PostRecv(peer, tag, data, bytes));
  return WaitRecv(peer, tag);
}

absl::Status HostStagedTransport::SendRecv(int peer, uint64_t tag, const void* send, void* recv,
                                           size_t bytes) {
  RETURN_IF_ERROR(PostRecv(peer, tag, recv, bytes));
  RETURN_IF_ERROR(PostSend(peer, tag, send, bytes));
  return WaitRecv(peer, tag);
}

bool HostStagedTransport::posted_recv(int peer, uint64_t tag) const {
  absl::MutexLock lock(&mu_);
  return pending_recvs_.contains({peer, tag});
}

}  // namespace tandem::worker
