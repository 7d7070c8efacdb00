// Transport over Gloo's TCP point-to-point (UnboundBuffer send/recv), the CPU data plane.
//
// Connect() builds a gloo::rendezvous::Context of (rank, size) and connects a full mesh through
// a rendezvous Store (in production GrpcRendezvousStore over the coordinator; in tests a
// gloo::rendezvous::HashStore). Each message rides on Gloo slot = its transfer tag.
// Every Gloo exception is caught and turned into a Status naming this rank and the peer.
// Thread-safety: as Transport.
#ifndef TANDEM_WORKER_TRANSPORT_GLOO_TRANSPORT_H_
#define TANDEM_WORKER_TRANSPORT_GLOO_TRANSPORT_H_

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "worker/transport/transport.h"

namespace gloo {
class Context;
namespace rendezvous {
class Store;
}  // namespace rendezvous
namespace transport {
class Device;
class UnboundBuffer;
}  // namespace transport
}  // namespace gloo

namespace tandem::worker {

struct GlooTransportOptions {
  int rank = 0;
  int size = 1;
  // Host (name or IP) whose address this rank listens on and advertises to its peers. Must not
  // be empty: Gloo would resolve the machine's hostname, which may not be reachable.
  std::string hostname = "127.0.0.1";
  std::chrono::milliseconds connect_timeout{30000};
  // Longest a single Recv or a WaitSends may block.
  std::chrono::milliseconds op_timeout{300000};
};

class GlooTransport final : public Transport {
 public:
  // Blocks until every rank has connected (or connect_timeout / a store error):
  // INVALID_ARGUMENT for bad options, UNAVAILABLE or DEADLINE_EXCEEDED otherwise.
  static absl::StatusOr<std::unique_ptr<GlooTransport>> Connect(const GlooTransportOptions& options,
                                                                gloo::rendezvous::Store& store);

  ~GlooTransport() override;

  int rank() const override { return options_.rank; }
  int size() const override { return options_.size; }
  absl::Status PostSend(int peer, uint64_t tag, const void* data, size_t bytes) override;
  absl::Status Recv(int peer, uint64_t tag, void* data, size_t bytes) override;
  absl::Status PostRecv(int peer, uint64_t tag, void* data, size_t bytes) override;
  absl::Status WaitRecv(int peer, uint64_t tag) override;
  bool posted_recv(int peer, uint64_t tag) const override;
  absl::Status WaitSends() override;
  void Abort() override;
  bool aborted() const override { return aborted_.load(); }
  int64_t bytes_sent() const override { return bytes_sent_.load(); }
  int64_t bytes_received() const override { return bytes_received_.load(); }

 private:
  struct PendingSend;
  struct PendingRecv;

  GlooTransport(const GlooTransportOptions& options,
                std::shared_ptr<gloo::transport::Device> device,
                std::shared_ptr<gloo::Context> context);
  absl::Status CheckPeer(int peer) const;
  absl::Status Failure(const char* op, int peer, const std::exception* e);

  const GlooTransportOptions options_;
  std::shared_ptr<gloo::transport::Device> device_;
  std::shared_ptr<gloo::Context> context_;
  std::atomic<bool> aborted_{false};
  std::atomic<int64_t> bytes_sent_{0};
  std::atomic<int64_t> bytes_received_{0};

  mutable absl::Mutex mu_;
  // Buffers with an operation in flight, so that Abort() can wake their waiters. Only the
  // executor thread adds and removes entries; Abort() only calls abortWait* on them.
  std::map<std::pair<int, uint64_t>, std::unique_ptr<PendingRecv>> pending_recvs_
      ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<PendingSend>> pending_sends_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tandem::worker

#endif  // TANDEM_WORKER_TRANSPORT_GLOO_TRANSPORT_H_
