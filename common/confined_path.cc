#include "common/confined_path.h"

#include <errno.h>
#include <stdlib.h>

#include <cstring>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"

namespace tandem {

absl::StatusOr<std::string> RealPath(const std::string& path) {
  std::unique_ptr<char, decltype(&free)> real(realpath(path.c_str(), nullptr), &free);
  if (real == nullptr) {
    const int err = errno;
    const absl::StatusCode code = (err == ENOENT || err == ENOTDIR)
                                      ? absl::StatusCode::kNotFound
                                      : absl::StatusCode::kUnavailable;
    return absl::Status(code, absl::StrCat(path, ": ", std::strerror(err)));
  }
  return std::string(real.get());
}

bool IsWithin(absl::string_view real, absl::string_view real_root) {
  if (real_root == "/") return !real.empty() && real[0] == '/';
  if (real.size() < real_root.size() || real.substr(0, real_root.size()) != real_root) {
    return false;
  }
  return real.size() == real_root.size() || real[real_root.size()] == '/';
}

absl::Status CheckRelativePath(absl::string_view relative, absl::string_view field,
                               absl::string_view root_name) {
  if (relative.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": is empty; expected a path relative to ", root_name));
  }
  if (relative.front() == '/') {
    return absl::InvalidArgumentError(absl::StrCat(field, ": must be relative to ", root_name,
                                                   ", got the absolute path \"", relative, "\""));
  }
  if (relative.find('\0') != absl::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": must not contain NUL characters"));
  }
  for (absl::string_view part : absl::StrSplit(relative, absl::ByAnyChar("/\\"))) {
    if (part == "..") {
      return absl::InvalidArgumentError(absl::StrCat(field, ": must stay inside ", root_name,
                                                     "; '..' is not allowed, got \"", relative,
                                                     "\""));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ResolveConfined(const std::string& root, absl::string_view relative,
                                            absl::string_view field, absl::string_view root_name) {
  RETURN_IF_ERROR(CheckRelativePath(relative, field, root_name));
  absl::StatusOr<std::string> real_root = RealPath(root.empty() ? "." : root);
  if (!real_root.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat(field, ": ", root_name, " (", root,
                     ") cannot be resolved: ", real_root.status().message()));
  }
  const std::string joined = absl::StrCat(*real_root, *real_root == "/" ? "" : "/", relative);
  absl::StatusOr<std::string> real = RealPath(joined);
  if (!real.ok()) {
    return absl::Status(real.status().code(),
                        absl::StrCat(field, ": \"", relative, "\" does not exist under ", root_name,
                                     " (", *real_root, "): ", real.status().message()));
  }
  if (!IsWithin(*real, *real_root)) {
    return absl::PermissionDeniedError(
        absl::StrCat(field, ": \"", relative, "\" resolves to ", *real, ", outside ", root_name,
                     " (", *real_root, "); a symlink under the root may not lead out of it"));
  }
  return *real;
}

}  // namespace tandem
