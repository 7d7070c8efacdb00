#include "worker/data/data_path.h"

#include <algorithm>
#include <filesystem>
#include <system_error>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/confined_path.h"
#include "common/status_macros.h"

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
  ASSIGN_OR_RETURN(std::string full, ResolveDataPath(data_root, path, field));
  // Confinement on the file system: every file handed out is a real path (symlinks followed)
  // inside the root's real path.
  const std::string root = data_root.empty() ? "." : data_root;
  absl::StatusOr<std::string> real_root = RealPath(root);
  if (!real_root.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        field, " '", path,
        "': the worker's data root cannot be resolved: ", real_root.status().message()));
  }
  auto outside = [&](const std::string& real) {
    return absl::PermissionDeniedError(
        absl::StrCat(field, " '", path, "' resolves to ", real, ", outside the worker's data root ",
                     *real_root, "; a symlink under the root may not lead out of it"));
  };
  const std::filesystem::path full_path(full);
  const std::string pattern = full_path.filename().string();
  std::error_code ec;
  if (!HasWildcard(pattern)) {
    absl::StatusOr<std::string> real = RealPath(full);
    if (!real.ok()) {
      if (real.status().code() == absl::StatusCode::kNotFound) {
        return absl::NotFoundError(absl::StrCat(field, " '", path, "': ", full,
                                                " does not exist under the worker's data root"));
      }
      return absl::Status(real.status().code(),
                          absl::StrCat(field, " '", path, "': ", real.status().message()));
    }
    if (!IsWithin(*real, *real_root)) return outside(*real);
    if (std::filesystem::is_regular_file(*real, ec)) return std::vector<std::string>{*real};
    return absl::InvalidArgumentError(
        absl::StrCat(field, " '", path, "': ", full, " is not a regular file"));
  }

  const std::filesystem::path dir = full_path.parent_path();
  absl::StatusOr<std::string> real_dir = RealPath(dir.string());
  if (!real_dir.ok()) {
    return absl::Status(real_dir.status().code(),
                        absl::StrCat(field, " '", path, "': cannot list directory ", dir.string(),
                                     ": ", real_dir.status().message()));
  }
  if (!IsWithin(*real_dir, *real_root)) return outside(*real_dir);
  std::vector<std::string> names;
  std::filesystem::directory_iterator it(*real_dir, ec);
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
  for (const std::string& name : names) {
    absl::StatusOr<std::string> real = RealPath((std::filesystem::path(*real_dir) / name).string());
    if (!real.ok()) {
      return absl::Status(real.status().code(),
                          absl::StrCat(field, " '", path, "': ", real.status().message()));
    }
    // A matching shard that is a symlink out of the root refuses the whole pattern: silently
    // skipping it would train on other data than the user listed.
    if (!IsWithin(*real, *real_root)) return outside(*real);
    files.push_back(*real);
  }
  return files;
}

}  // namespace tandem::worker
