// A gloo::rendezvous::Store over the coordinator's Rendezvous gRPC service, so that a job's
// workers find each other without a shared file system.
//
// Keys are prefixed with the job's StageProgram.rendezvous_prefix. Gloo's Store interface has
// no error channel, so failures are thrown as gloo::IoException (GlooTransport::Connect catches
// them and returns a Status). wait()/get() poll the service in slices of at most one second so
// that Cancel() takes effect promptly; UNAVAILABLE answers (a restarting coordinator) are
// retried until the wait's timeout. Every RPC carries a deadline.
// Thread-safety: thread-safe (Gloo calls it from one thread; Cancel() from any thread).
#ifndef TANDEM_WORKER_TRANSPORT_GRPC_RENDEZVOUS_STORE_H_
#define TANDEM_WORKER_TRANSPORT_GRPC_RENDEZVOUS_STORE_H_

#include <gloo/rendezvous/store.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

namespace grpc {
class Channel;
}  // namespace grpc

namespace tandem::worker {

struct GrpcRendezvousStoreOptions {
  std::string prefix;                             // prepended to every key
  std::chrono::milliseconds rpc_timeout{10000};   // deadline of a Set, and slack on a Get
  std::chrono::milliseconds wait_timeout{30000};  // default wait for keys to appear
  // When set and true, pending and later calls fail with "cancelled". Must outlive the store.
  const std::atomic<bool>* cancelled = nullptr;
};

class GrpcRendezvousStore final : public gloo::rendezvous::Store {
 public:
  GrpcRendezvousStore(std::shared_ptr<grpc::Channel> channel, GrpcRendezvousStoreOptions options);
  ~GrpcRendezvousStore() override;

  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem::worker

#endif  // TANDEM_WORKER_TRANSPORT_GRPC_RENDEZVOUS_STORE_H_
