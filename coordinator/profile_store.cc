#include "coordinator/profile_store.h"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "google/protobuf/util/json_util.h"
#include "spdlog/spdlog.h"

namespace tandem::coordinator {
namespace {

// "95s", "3m5s": to the second (absl::FormatDuration prints the microseconds of a clock's
// difference).
std::string FormatAge(absl::Duration age) {
  return absl::FormatDuration(absl::Trunc(age, absl::Seconds(1)));
}

}  // namespace

ProfileStore::ProfileStore(std::string dir, absl::Duration max_age)
    : dir_(std::move(dir)), max_age_(max_age) {
  if (dir_.empty()) return;
  std::error_code ec;
  std::filesystem::create_directories(dir_, ec);
  for (const auto& entry : std::filesystem::directory_iterator(dir_, ec)) {
    if (entry.path().extension() != ".json") continue;
    std::ifstream f(entry.path());
    std::stringstream text;
    text << f.rdbuf();
    v1::ModelProfile p;
    if (!google::protobuf::util::JsonStringToMessage(text.str(), &p).ok() || p.key().empty()) {
      spdlog::warn("profile store: skipping unreadable {}", entry.path().string());
      continue;
    }
    absl::MutexLock lock(&mu_);
    profiles_[p.key()] = std::move(p);
  }
}

std::string ProfileStore::PathOf(const std::string& key) const {
  std::string name;
  for (char c : key) name += std::isalnum(static_cast<unsigned char>(c)) || c == '-' ? c : '_';
  return absl::StrCat(dir_, "/", name, ".json");
}

std::optional<v1::ModelProfile> ProfileStore::Find(const std::string& key, absl::Time now) const {
  absl::MutexLock lock(&mu_);
  auto it = profiles_.find(key);
  if (it == profiles_.end()) return std::nullopt;
  if (max_age_ != absl::InfiniteDuration()) {
    const int64_t created_ms = it->second.created_unix_ms();
    const absl::Duration age = now - absl::FromUnixMillis(created_ms);
    if (created_ms <= 0 || age > max_age_) {
      // Said once per profile, not at every look-up (a plan looks on every worker).
      if (!told_expired_.insert(key).second) return std::nullopt;
      spdlog::info(
          "profile store: the profile {} was measured {}, longer ago than the max age "
          "of {} (--profile-max-age): a job or plan that cuts by it measures it again",
          key, created_ms <= 0 ? std::string("at an unknown time") : FormatAge(age) + " ago",
          absl::FormatDuration(max_age_));
      return std::nullopt;
    }
  }
  return it->second;
}

std::optional<v1::ModelProfile> ProfileStore::FindAnyAge(const std::string& key) const {
  absl::MutexLock lock(&mu_);
  auto it = profiles_.find(key);
  if (it == profiles_.end()) return std::nullopt;
  return it->second;
}

absl::Status ProfileStore::Put(const v1::ModelProfile& profile) {
  if (!profile.speed_check().empty()) {
    // Scaled to a speed check's moment: the store keeps the times as they were measured.
    return absl::InvalidArgumentError(
        absl::StrCat("profile store: profile ", profile.key(), " was served after a speed check (",
                     profile.speed_check(), "); only a profile as measured is kept"));
  }
  {
    absl::MutexLock lock(&mu_);
    profiles_[profile.key()] = profile;
    told_expired_.erase(profile.key());
  }
  if (dir_.empty()) return absl::OkStatus();
  std::string json;
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.preserve_proto_field_names = true;
  if (!google::protobuf::util::MessageToJsonString(profile, &json, options).ok()) {
    return absl::InternalError("profile store: cannot print the profile as JSON");
  }
  const std::string path = PathOf(profile.key());
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::trunc);
    f << json;
    if (!f) return absl::UnavailableError(absl::StrCat("profile store: cannot write ", tmp));
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) return absl::UnavailableError(absl::StrCat("profile store: ", path, ": ", ec.message()));
  return absl::OkStatus();
}

}  // namespace tandem::coordinator
