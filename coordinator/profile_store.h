// Layer profiles measured on workers, kept per key (model config, micro-batch shape,
// optimizer, device kind, threads: ProfileKey) so that a job of the same shape on the same
// kind of worker is planned without profiling again. Persisted as one JSON file per key under
// <data-root>/profiles when a directory is given (read back at start), else in memory only.
// Thread-safe.
#ifndef TANDEM_COORDINATOR_PROFILE_STORE_H_
#define TANDEM_COORDINATOR_PROFILE_STORE_H_

#include <map>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "tandem/v1/common.pb.h"

namespace tandem::coordinator {

class ProfileStore {
 public:
  // `dir` empty: memory only. Unreadable files are skipped with a warning.
  explicit ProfileStore(std::string dir);

  std::optional<v1::ModelProfile> Find(const std::string& key) const;
  // Keeps the profile under profile.key(); the file write's error is returned (the profile is
  // kept in memory regardless).
  absl::Status Put(const v1::ModelProfile& profile);

 private:
  std::string PathOf(const std::string& key) const;

  const std::string dir_;
  mutable absl::Mutex mu_;
  std::map<std::string, v1::ModelProfile> profiles_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tandem::coordinator

#endif  // TANDEM_COORDINATOR_PROFILE_STORE_H_
