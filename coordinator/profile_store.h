// Layer profiles measured on workers, kept per key (model config, micro-batch shape,
// optimizer, device kind, threads: ProfileKey) so that a job of the same shape on the same
// kind of worker is planned without profiling again. Persisted as one JSON file per key under
// <data-root>/profiles when a directory is given (read back at start), else in memory only.
// A profile older than the store's max age (tandem-coordinator --profile-max-age) is not
// found, so the next job that needs it measures it again: the timings of a machine drift with
// its load, drivers and libraries, and a plan is only as good as the costs it is priced on.
// Thread-safe.
#ifndef TANDEM_COORDINATOR_PROFILE_STORE_H_
#define TANDEM_COORDINATOR_PROFILE_STORE_H_

#include <map>
#include <optional>
#include <set>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "tandem/v1/common.pb.h"

namespace tandem::coordinator {

class ProfileStore {
 public:
  // `dir` empty: memory only. Unreadable files are skipped with a warning. `max_age`: how long
  // after it was measured (ModelProfile.created_unix_ms) a profile is used; infinite: always.
  explicit ProfileStore(std::string dir, absl::Duration max_age = absl::InfiniteDuration());

  // The profile kept under `key`, unless it is older than the max age at `now` (or carries no
  // time and a max age is set): then none, and the next Put replaces it.
  std::optional<v1::ModelProfile> Find(const std::string& key, absl::Time now = absl::Now()) const;
  // The profile kept under `key` however old: for a caller that cannot measure it again now
  // (`tandem plan` while every worker is busy), which says how old it is.
  std::optional<v1::ModelProfile> FindAnyAge(const std::string& key) const;
  // Keeps the profile under profile.key(); the file write's error is returned (the profile is
  // kept in memory regardless). INVALID_ARGUMENT, nothing kept, for a profile that carries a
  // speed check (ModelProfile.speed_check: its times are scaled, not measured).
  absl::Status Put(const v1::ModelProfile& profile);

 private:
  std::string PathOf(const std::string& key) const;

  const std::string dir_;
  const absl::Duration max_age_;
  mutable absl::Mutex mu_;
  std::map<std::string, v1::ModelProfile> profiles_ ABSL_GUARDED_BY(mu_);
  mutable std::set<std::string> told_expired_ ABSL_GUARDED_BY(mu_);  // logged as too old
};

}  // namespace tandem::coordinator

#endif  // TANDEM_COORDINATOR_PROFILE_STORE_H_
