// A gloo::rendezvous::Store over another (a HashStore in tests) that gives up once a cancel
// flag is set, as GrpcRendezvousStore does over the coordinator, so that in-process tests can
// exercise the cancellation of a connect.
#ifndef TANDEM_TESTS_WORKER_CANCELLABLE_STORE_H_
#define TANDEM_TESTS_WORKER_CANCELLABLE_STORE_H_

#include <gloo/common/error.h>
#include <gloo/rendezvous/store.h>

#include <atomic>
#include <chrono>
#include <exception>
#include <string>
#include <vector>

namespace tandem::worker::testing {

class CancellableStore final : public gloo::rendezvous::Store {
 public:
  // Both must outlive the store.
  CancellableStore(gloo::rendezvous::Store& inner, const std::atomic<bool>& cancelled)
      : inner_(inner), cancelled_(cancelled) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    ThrowIfCancelled();
    inner_.set(key, data);
  }
  std::vector<char> get(const std::string& key) override {
    wait({key});
    return inner_.get(key);
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, kDefaultTimeout); }
  // Waits in short slices, checking the flag between them.
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (true) {
      ThrowIfCancelled();
      try {
        inner_.wait(keys, std::chrono::milliseconds(20));
        return;
      } catch (const std::exception&) {
        if (std::chrono::steady_clock::now() >= deadline) throw;
      }
    }
  }

 private:
  void ThrowIfCancelled() const {
    if (cancelled_.load()) throw gloo::IoException("rendezvous cancelled");
  }

  gloo::rendezvous::Store& inner_;
  const std::atomic<bool>& cancelled_;
};

}  // namespace tandem::worker::testing

#endif  // TANDEM_TESTS_WORKER_CANCELLABLE_STORE_H_
