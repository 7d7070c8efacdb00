// Helpers for the transport tests: two Gloo ranks in one process, and a Transport that forwards
// to another so that a test can watch the calls it cares about.
#ifndef TANDEM_TESTS_WORKER_TRANSPORT_TEST_UTIL_H_
#define TANDEM_TESTS_WORKER_TRANSPORT_TEST_UTIL_H_

#include <gloo/rendezvous/store.h>
#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <memory>
#include <utility>

#include "worker/transport/gloo_transport.h"
#include "worker/transport/transport.h"

namespace tandem::worker::testing {

// Ranks 0 and 1 over `store` on 127.0.0.1, connected at once (rank 1 on a thread). Both null,
// with a test failure, when either cannot connect.
inline std::pair<std::unique_ptr<GlooTransport>, std::unique_ptr<GlooTransport>> ConnectGlooPair(
    gloo::rendezvous::Store& store,
    std::chrono::milliseconds op_timeout = std::chrono::milliseconds(10000)) {
  auto connect = [&](int rank) {
    GlooTransportOptions o;
    o.rank = rank;
    o.size = 2;
    o.hostname = "127.0.0.1";
    o.connect_timeout = std::chrono::milliseconds(10000);
    o.op_timeout = op_timeout;
    return GlooTransport::Connect(o, store);
  };
  auto f1 = std::async(std::launch::async, connect, 1);
  auto t0 = connect(0);
  auto t1 = f1.get();
  EXPECT_TRUE(t0.ok()) << t0.status();
  EXPECT_TRUE(t1.ok()) << t1.status();
  if (!t0.ok() || !t1.ok()) return {};
  return {*std::move(t0), *std::move(t1)};
}

// Every call goes to `inner`; a test overrides the ones it watches and calls the base. SendRecv
// is left to Transport's own (PostRecv, PostSend, WaitRecv through this object), so that a
// watcher of those sees the transfers SendRecv makes too.
class ForwardingTransport : public Transport {
 public:
  explicit ForwardingTransport(std::unique_ptr<Transport> inner) : inner_(std::move(inner)) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  absl::Status PostSend(int peer, uint64_t tag, const void* data, size_t bytes) override {
    return inner_->PostSend(peer, tag, data, bytes);
  }
  absl::Status Recv(int peer, uint64_t tag, void* data, size_t bytes) override {
    return inner_->Recv(peer, tag, data, bytes);
  }
  absl::Status PostRecv(int peer, uint64_t tag, void* data, size_t bytes) override {
    return inner_->PostRecv(peer, tag, data, bytes);
  }
  absl::Status WaitRecv(int peer, uint64_t tag) override { return inner_->WaitRecv(peer, tag); }
  absl::Status WaitSends() override { return inner_->WaitSends(); }
  void Abort() override { inner_->Abort(); }
  bool aborted() const override { return inner_->aborted(); }
  bool posted_recv(int peer, uint64_t tag) const override { return inner_->posted_recv(peer, tag); }
  int64_t bytes_sent() const override { return inner_->bytes_sent(); }
  int64_t bytes_received() const override { return inner_->bytes_received(); }

 protected:
  Transport& inner() { return *inner_; }

 private:
  std::unique_ptr<Transport> inner_;
};

}  // namespace tandem::worker::testing

#endif  // TANDEM_TESTS_WORKER_TRANSPORT_TEST_UTIL_H_
