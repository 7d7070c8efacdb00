// Transport for device buffers over a host transport: device -> host -> (inner transport, Gloo)
// -> host -> device. The data plane of CUDA workers where NCCL cannot be used: two stages on one
// device (NCCL refuses a communicator with the same device twice) or a build without NCCL.
//
// Every data pointer given to this transport is DEVICE memory; the inner transport only ever
// sees host staging buffers that this transport owns:
//   - PostSend copies the device data into a staging buffer (DeviceCopier::CopyToHost, which
//     returns when the copy is done) and posts the host send. So the caller's device buffer is
//     free again as soon as PostSend returns (the Transport contract asks for less: until
//     WaitSends).
//   - PostRecv posts the host receive into a staging buffer; WaitRecv waits for it and then
//     copies the data into the caller's device buffer (CopyToDevice), which holds it when
//     WaitRecv returns.
//   - A staging buffer goes back to the pool when the inner transport is done with it: a send's
//     at WaitSends, a receive's at its WaitRecv. After a failure of the inner transport it may
//     still reference them, so they are kept until this transport is destroyed (it destroys the
//     inner transport first).
// Staging buffers are pooled (best fit by size, up to max_pooled_bytes kept free), so the steady
// state of a schedule allocates no host memory. A zero-byte message copies nothing.
//
// Errors: the inner transport's, unchanged (ABORTED, UNAVAILABLE naming the peer,
// DEADLINE_EXCEEDED after its op timeout, INVALID_ARGUMENT, FAILED_PRECONDITION). A failed copy
// or staging allocation keeps the copier's code and adds what was being copied:
//   "rank 0: send to peer rank 1 tag 7: copying 4096 bytes from the device to host staging: ..."
// Abort(), aborted(), rank(), size() and the byte counters (payload bytes, as the inner
// transport counts them) pass through to the inner transport.
//
// Thread-safety: as Transport. The copier is only used by the executor thread (PostSend,
// WaitRecv); Abort() only calls the inner transport's.
#ifndef TANDEM_WORKER_TRANSPORT_HOST_STAGED_TRANSPORT_H_
#define TANDEM_WORKER_TRANSPORT_HOST_STAGED_TRANSPORT_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "worker/transport/device_copier.h"
#include "worker/transport/transport.h"

namespace tandem::worker {

struct HostStagedTransportOptions {
  // Free staging memory the pool keeps for reuse; a buffer returned beyond it is freed. Buffers
  // in flight do not count.
  size_t max_pooled_bytes = size_t{512} << 20;
};

class HostStagedTransport final : public Transport {
 public:
  // `inner` moves host memory between the ranks (a GlooTransport); `copier` moves data between
  // this rank's device and the host. Both must be non-null.
  HostStagedTransport(std::unique_ptr<Transport> inner, std::unique_ptr<DeviceCopier> copier,
                      HostStagedTransportOptions options = {});
  // Destroys the inner transport before the staging buffers it may still reference.
  ~HostStagedTransport() override;

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  absl::Status PostSend(int peer, uint64_t tag, const void* data, size_t bytes) override;
  absl::Status Recv(int peer, uint64_t tag, void* data, size_t bytes) override;
  absl::Status PostRecv(int peer, uint64_t tag, void* data, size_t bytes) override;
  absl::Status WaitRecv(int peer, uint64_t tag) override;
  // Posts the receive first (so that the peer's data can land while this rank copies its own
  // to the host), then the send, then waits for the receive.
  absl::Status SendRecv(int peer, uint64_t tag, const void* send, void* recv,
                        size_t bytes) override;
  absl::Status WaitSends() override;
  void Abort() override { inner_->Abort(); }
  bool aborted() const override { return inner_->aborted(); }
  bool posted_recv(int peer, uint64_t tag) const override;
  int64_t bytes_sent() const override { return inner_->bytes_sent(); }
  int64_t bytes_received() const override { return inner_->bytes_received(); }

  // Staging buffers allocated so far (pool misses), for tests and statistics.
  int64_t staging_allocations() const;

 private:
  struct PendingRecv {
    void* device = nullptr;  // the caller's device buffer
    size_t bytes = 0;
    std::unique_ptr<HostBuffer> staging;
  };

  // A staging buffer of at least `bytes` bytes for the transfer `op` peer/tag: from the pool, or
  // newly allocated (an allocation error says "<Describe>: allocating N bytes of host staging").
  absl::StatusOr<std::unique_ptr<HostBuffer>> TakeStaging(size_t bytes, const char* op, int peer,
                                                          uint64_t tag);
  // Back to the pool (or freed when the pool is full).
  void ReturnStaging(std::unique_ptr<HostBuffer> buffer);
  // Kept until destruction: the inner transport may still reference it after a failure.
  void Retire(std::unique_ptr<HostBuffer> buffer);
  // After the inner transport refused a post with `refusal`: a post refused outright
  // (INVALID_ARGUMENT) never referenced the buffer, so it goes back to the pool; otherwise it is
  // retired. Returns `refusal`.
  absl::Status ReleaseRefused(absl::Status refusal, std::unique_ptr<HostBuffer> buffer);
  // "rank 0: send to peer rank 1 tag 7": what a copy or allocation error was about.
  std::string Describe(const char* op, int peer, uint64_t tag) const;

  const HostStagedTransportOptions options_;
  // Declared before the buffers and inner_, so it is destroyed after them.
  const std::unique_ptr<DeviceCopier> copier_;

  mutable absl::Mutex mu_;
  // Free staging buffers by size (best fit), and their total size.
  std::multimap<size_t, std::unique_ptr<HostBuffer>> pool_ ABSL_GUARDED_BY(mu_);
  size_t pooled_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t staging_allocations_ ABSL_GUARDED_BY(mu_) = 0;
  // Staging of the sends posted since the last successful WaitSends.
  std::vector<std::unique_ptr<HostBuffer>> sending_ ABSL_GUARDED_BY(mu_);
  std::map<std::pair<int, uint64_t>, PendingRecv> pending_recvs_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<HostBuffer>> retired_ ABSL_GUARDED_BY(mu_);

  // Declared last: destroyed first (it may reference the staging buffers above).
  std::unique_ptr<Transport> inner_;
};

}  // namespace tandem::worker

#endif  // TANDEM_WORKER_TRANSPORT_HOST_STAGED_TRANSPORT_H_
