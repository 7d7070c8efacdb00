#include "coordinator/rendezvous_store.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace tandem::coordinator {

absl::Status RendezvousStore::Set(const std::string& key, std::string value) {
  if (key.empty()) return absl::InvalidArgumentError("rendezvous key is empty");
  if (value.size() > kMaxValueBytes) {
    return absl::InvalidArgumentError(absl::StrCat("rendezvous value for '", key, "' is ",
                                                   value.size(), " bytes; at most ", kMaxValueBytes,
                                                   " allowed"));
  }
  absl::MutexLock lock(&mu_);
  if (values_.size() >= kMaxKeys && !values_.contains(key)) {
    return absl::ResourceExhaustedError(
        absl::StrCat("rendezvous store holds ", kMaxKeys, " keys already"));
  }
  values_[key] = std::move(value);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> RendezvousStore::Get(const std::vector<std::string>& keys,
                                                              absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto all_present = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (const auto& k : keys) {
      if (!values_.contains(k)) return false;
    }
    return true;
  };
  if (!mu_.AwaitWithTimeout(absl::Condition(&all_present), timeout)) {
    std::vector<std::string> missing;
    for (const auto& k : keys) {
      if (!values_.contains(k)) missing.push_back(k);
    }
    return absl::DeadlineExceededError(absl::StrCat("rendezvous keys not set within ",
                                                    absl::FormatDuration(timeout), ": ",
                                                    absl::StrJoin(missing, ", ")));
  }
  std::vector<std::string> out;
  out.reserve(keys.size());
  for (const auto& k : keys) out.push_back(values_.at(k));
  return out;
}

void RendezvousStore::ErasePrefix(const std::string& prefix) {
  absl::MutexLock lock(&mu_);
  for (auto it = values_.lower_bound(prefix);
       it != values_.end() && it->first.compare(0, prefix.size(), prefix) == 0;) {
    it = values_.erase(it);
  }
}

size_t RendezvousStore::size() const {
  absl::MutexLock lock(&mu_);
  return values_.size();
}

}  // namespace tandem::coordinator
