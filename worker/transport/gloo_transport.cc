#include "worker/transport/gloo_transport.h"

#include <gloo/common/error.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>

#include <exception>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace tandem::worker {

struct GlooTransport::PendingSend {
  int peer = 0;
  std::unique_ptr<gloo::transport::UnboundBuffer> buffer;
};

struct GlooTransport::PendingRecv {
  size_t bytes = 0;
  std::unique_ptr<gloo::transport::UnboundBuffer> buffer;
};

absl::StatusOr<std::unique_ptr<GlooTransport>> GlooTransport::Connect(
    const GlooTransportOptions& options, gloo::rendezvous::Store& store) {
  if (options.size < 1 || options.rank < 0 || options.rank >= options.size) {
    return absl::InvalidArgumentError(
        absl::StrCat("gloo transport: rank ", options.rank, " is outside [0, ", options.size, ")"));
  }
  if (options.hostname.empty()) {
    return absl::InvalidArgumentError("gloo transport: hostname must be set explicitly");
  }
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = options.hostname;
    std::shared_ptr<gloo::transport::Device> device = gloo::transport::tcp::CreateDevice(attr);
    auto context = std::make_shared<gloo::rendezvous::Context>(options.rank, options.size);
    context->setTimeout(options.connect_timeout);
    context->connectFullMesh(store, device);
    return std::unique_ptr<GlooTransport>(new GlooTransport(options, device, std::move(context)));
  } catch (const std::exception& e) {
    const bool timeout =
        absl::StrContains(e.what(), "imed out") || absl::StrContains(e.what(), "DEADLINE_EXCEEDED");
    const std::string msg =
        absl::StrCat("rank ", options.rank, " of ", options.size, ": connecting the transport (",
                     options.hostname, ") to the job's other ranks failed: ", e.what());
    return timeout ? absl::DeadlineExceededError(msg) : absl::UnavailableError(msg);
  } catch (...) {
    return absl::UnavailableError(
        absl::StrCat("rank ", options.rank, ": connecting the transport failed (unknown error)"));
  }
}

GlooTransport::GlooTransport(const GlooTransportOptions& options,
                             std::shared_ptr<gloo::transport::Device> device,
                             std::shared_ptr<gloo::Context> context)
    : options_(options), device_(std::move(device)), context_(std::move(context)) {}

GlooTransport::~GlooTransport() {
  // Buffers first (they reference the context), then the context, then the device.
  absl::MutexLock lock(&mu_);
  pending_sends_.clear();
  pending_recvs_.clear();
}

absl::Status GlooTransport::CheckPeer(int peer) const {
  if (peer < 0 || peer >= options_.size || peer == options_.rank) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", options_.rank, ": peer rank ", peer,
                                                   " is not another rank of [0, ", options_.size,
                                                   ")"));
  }
  return absl::OkStatus();
}

absl::Status GlooTransport::Failure(const char* op, int peer, const std::exception* e) {
  const std::string what = e != nullptr ? e->what() : "unknown error";
  if (aborted_.load()) {
    return absl::AbortedError(absl::StrCat(op, " with peer rank ", peer, ": transport aborted"));
  }
  const std::string msg = absl::StrCat(op, " with peer rank ", peer, " failed: ", what);
  if (absl::StrContains(what, "Timed out")) return absl::DeadlineExceededError(msg);
  return absl::UnavailableError(msg);
}

absl::Status GlooTransport::PostSend(int peer, uint64_t tag, const void* data, size_t bytes) {
  RETURN_IF_ERROR(CheckPeer(peer));
  if (aborted_.load()) return absl::AbortedError("send: transport aborted");
  try {
    auto pending = std::make_unique<PendingSend>();
    pending->peer = peer;
    // Gloo's buffer type is not const-correct; a send never writes to it.
    pending->buffer = context_->createUnboundBuffer(const_cast<void*>(data), bytes);
    pending->buffer->send(peer, tag);
    {
      absl::MutexLock lock(&mu_);
      if (aborted_.load()) pending->buffer->abortWaitSend();
      pending_sends_.push_back(std::move(pending));
    }
    bytes_sent_.fetch_add(static_cast<int64_t>(bytes));
    return absl::OkStatus();
  } catch (const std::exception& e) {
    return Failure("send", peer, &e);
  } catch (...) {
    return Failure("send", peer, nullptr);
  }
}

absl::Status GlooTransport::Recv(int peer, uint64_t tag, void* data, size_t bytes) {
  RETURN_IF_ERROR(PostRecv(peer, tag, data, bytes));
  return WaitRecv(peer, tag);
}

absl::Status GlooTransport::PostRecv(int peer, uint64_t tag, void* data, size_t bytes) {
  RETURN_IF_ERROR(CheckPeer(peer));
  if (aborted_.load()) return absl::AbortedError("receive: transport aborted");
  try {
    auto pending = std::make_unique<PendingRecv>();
    pending->bytes = bytes;
    pending->buffer = context_->createUnboundBuffer(data, bytes);
    absl::MutexLock lock(&mu_);
    auto [it, inserted] = pending_recvs_.try_emplace({peer, tag}, nullptr);
    if (!inserted) {
      return absl::InvalidArgumentError(absl::StrCat("rank ", options_.rank,
                                                     ": a receive from peer rank ", peer,
                                                     " with tag ", tag, " is already posted"));
    }
    pending->buffer->recv(peer, tag);
    // An Abort() before the entry existed has already run: honour it.
    if (aborted_.load()) pending->buffer->abortWaitRecv();
    it->second = std::move(pending);
    return absl::OkStatus();
  } catch (const std::exception& e) {
    absl::MutexLock lock(&mu_);
    pending_recvs_.erase({peer, tag});
    return Failure("receive", peer, &e);
  } catch (...) {
    absl::MutexLock lock(&mu_);
    pending_recvs_.erase({peer, tag});
    return Failure("receive", peer, nullptr);
  }
}

bool GlooTransport::posted_recv(int peer, uint64_t tag) const {
  absl::MutexLock lock(&mu_);
  return pending_recvs_.contains({peer, tag});
}

absl::Status GlooTransport::WaitRecv(int peer, uint64_t tag) {
  gloo::transport::UnboundBuffer* buffer = nullptr;
  size_t bytes = 0;
  {
    absl::MutexLock lock(&mu_);
    auto it = pending_recvs_.find({peer, tag});
    if (it == pending_recvs_.end()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "rank ", options_.rank, ": no receive from peer rank ", peer, " tag ", tag, " posted"));
    }
    buffer = it->second->buffer.get();
    bytes = it->second->bytes;
  }
  absl::Status status;
  try {
    if (!buffer->waitRecv(options_.op_timeout)) {
      status =
          absl::AbortedError(absl::StrCat("receive from peer rank ", peer, ": transport aborted"));
    } else {
      bytes_received_.fetch_add(static_cast<int64_t>(bytes));
    }
  } catch (const std::exception& e) {
    status = Failure("receive", peer, &e);
  } catch (...) {
    status = Failure("receive", peer, nullptr);
  }
  // On failure the transport is dead; keep the buffer (it references caller memory, which the
  // caller keeps until this transport is destroyed), as for sends.
  if (status.ok()) {
    absl::MutexLock lock(&mu_);
    pending_recvs_.erase({peer, tag});
  }
  return status;
}

absl::Status GlooTransport::WaitSends() {
  if (aborted_.load()) return absl::AbortedError("wait for sends: transport aborted");
  std::vector<std::pair<int, gloo::transport::UnboundBuffer*>> sends;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& p : pending_sends_) sends.emplace_back(p->peer, p->buffer.get());
  }
  absl::Status status;
  for (const auto& [peer, buffer] : sends) {
    try {
      if (!buffer->waitSend(options_.op_timeout)) {
        status =
            absl::AbortedError(absl::StrCat("send to peer rank ", peer, ": transport aborted"));
      }
    } catch (const std::exception& e) {
      status = Failure("send", peer, &e);
    } catch (...) {
      status = Failure("send", peer, nullptr);
    }
    if (!status.ok()) break;
  }
  // On failure the transport is dead; keep the buffers (their memory belongs to the caller,
  // who keeps it until this transport is destroyed).
  if (status.ok()) {
    absl::MutexLock lock(&mu_);
    pending_sends_.clear();
  }
  return status;
}

void GlooTransport::Abort() {
  absl::MutexLock lock(&mu_);
  aborted_.store(true);
  try {
    for (const auto& [key, r] : pending_recvs_) r->buffer->abortWaitRecv();
    for (const auto& p : pending_sends_) p->buffer->abortWaitSend();
  } catch (...) {
    // abortWait* only signals a condition variable; nothing to recover.
  }
}

}  // namespace tandem::worker
