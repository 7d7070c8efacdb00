#include "worker/data/data_path.h"

#include <algorithm>
#include <filesystem>
#include <system_error>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace tandem::worker {
namespace {

bool HasWildcard(absl::string_view s) { return s.find_first_of("*?") != absl::string_view::npos; }

}  // namespace

bool MatchesDataPattern(absl::string_view pattern, absl::string_view name) {
  if (!name.empty() && name.front() == '.' && (pattern.empty() || pattern.front() != '.')) {
    return false;
  }
  // Greedy match with backtracking to the last '*': O(|pattern| * |name|) at worst.
  size_t p = 0, n = 0;
  size_t star = absl::string_view::npos, star_n = 0;
  while (n < name.size()) {
    if (p < pattern.size() && (pattern[p] == '?' || pattern[p] == name[n])) {
      ++p;
      ++n;
    } else if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      star_n = n;
    } else if (star != absl::string_view::npos) {
      p = star + 1;
      n = ++star_n;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

absl::StatusOr<std::string> ResolveDataPath(const std::string& data_root, absl::string_view path,
                                            absl::string_view field) {
  if (path.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " is required when data.source is 'file'"));
  }
  if (path.front() == '/') {
    return absl::InvalidArgumentError(absl::StrCat(
        field, " '", path, "' must be relative to the worker's data root, not absolute"));
  }
  const std::vector<absl::string_view> parts = absl::StrSplit(path, '/');
  for (size_t i = 0; i < parts.size(); ++i) {
    if (parts[i] == "..") {
      return absl::InvalidArgumentError(absl::StrCat(
          field, " '", path, "' must stay inside the worker's data root ('..' is not allowed)"));
    }
    if (i + 1 < parts.size() && HasWildcard(parts[i])) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, " '", path, "': only the last path component may hold the wildcards '*' and '?'"));
    }
  }
  return (std::filesystem::path(data_root.empty() ? "." : data_root) / std::string(path)).string();
}

absl::StatusOr<std::vector<std::string>> ResolveDataFiles(const std::string& data_root,
                                                          absl::string_view path,
                                                          absl::string_view field) {
  absl::StatusOr<std::string> full = ResolveDataPath(data_root, path, field);
  if (!full.ok()) return full.status();
  const std::filesystem::path full_path(*full);
  const std::string pattern = full_path.filename().string();
  std::error_code ec;
  if (!HasWildcard(pattern)) {
    if (std::filesystem::is_regular_file(full_path, ec)) return std::vector<std::string>{*full};
    if (!std::filesystem::exists(full_path, ec)) {
      return absl::NotFoundError(absl::StrCat(field, " '", path, "': ", *full,
                                              " does not exist under the worker's data root"));
    }
    return absl::InvalidArgumentError(
        absl::StrCat(field, " '", path, "': ", *full, " is not a regular file"));
  }

  const std::filesystem::path dir = full_path.parent_path();
  std::vector<std::string> names;
  std::filesystem::directory_iterator it(dir, ec);
  if (ec) {
    const auto code = ec == std::errc::no_such_file_or_directory ? absl::StatusCode::kNotFound
                                                                 : absl::StatusCode::kUnavailable;
    return absl::Status(code, absl::StrCat(field, " '", path, "': cannot list directory ",
                                           dir.string(), ": ", ec.message()));
  }
  for (const std::filesystem::directory_entry& entry : it) {
    const std::string name = entry.path().filename().string();
    if (MatchesDataPattern(pattern, name) && entry.is_regular_file(ec)) names.push_back(name);
  }
  if (names.empty()) {
    return absl::NotFoundError(absl::StrCat(field, " '", path, "': no regular file in ",
                                            dir.string(), " matches the pattern '", pattern, "'"));
  }
  std::sort(names.begin(), names.end());
  std::vector<std::string> files;
  files.reserve(names.size());
  for (const std::string& name : names) files.push_back((dir / name).string());
  return files;
}

}  // namespace tandem::worker
