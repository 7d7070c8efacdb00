// The key-value store behind the Rendezvous service: workers of a job publish their transport
// addresses here and wait for their peers' (Gloo's rendezvous::Store contract: set, get, wait).
//
// Thread-safe. Values are bounded in size and count so that a misbehaving client cannot
// exhaust the coordinator's memory.
#ifndef TANDEM_COORDINATOR_RENDEZVOUS_STORE_H_
#define TANDEM_COORDINATOR_RENDEZVOUS_STORE_H_

#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace tandem::coordinator {

class RendezvousStore {
 public:
  static constexpr size_t kMaxValueBytes = 1 << 20;
  static constexpr size_t kMaxKeys = 1 << 16;

  absl::Status Set(const std::string& key, std::string value);
  // Waits up to `timeout` until every key is present; DEADLINE_EXCEEDED names the missing.
  absl::StatusOr<std::vector<std::string>> Get(const std::vector<std::string>& keys,
                                               absl::Duration timeout);
  // Drops every key that starts with `prefix` (a job's keys once it ends).
  void ErasePrefix(const std::string& prefix);
  size_t size() const;

 private:
  mutable absl::Mutex mu_;
  std::map<std::string, std::string> values_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tandem::coordinator

#endif  // TANDEM_COORDINATOR_RENDEZVOUS_STORE_H_
