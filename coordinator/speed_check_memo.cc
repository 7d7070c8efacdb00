#include "coordinator/speed_check_memo.h"

#include <utility>

namespace tandem::coordinator {

std::optional<SpeedCheckMemo::Verdict> SpeedCheckMemo::Find(const std::string& family,
                                                            absl::Time now) const {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(family);
  if (it == entries_.end() || now - it->second.made >= after_) return std::nullopt;
  return it->second;
}

void SpeedCheckMemo::Put(const std::string& family, SpeedCheck check, absl::Time now) {
  absl::MutexLock lock(&mu_);
  // An older verdict never replaces a newer one.
  Verdict& v = entries_[family];
  if (v.made > now) return;
  v = Verdict{std::move(check), now};
}

}  // namespace tandem::coordinator
