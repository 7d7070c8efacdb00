// Paths a job spec names are confined to a root the daemon was configured with (a worker's
// --data-root, the coordinator's <data-root>/models). The spec's path is checked lexically
// when the spec is validated (relative, no '..'); the side that opens the file checks it
// again here, on the file system: the real path (every symlink followed, as realpath(3) does)
// must lie inside the root's real path, so that a symlink under the root cannot lead out.
#ifndef TANDEM_COMMON_CONFINED_PATH_H_
#define TANDEM_COMMON_CONFINED_PATH_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tandem {

// The real path of `path` (it must exist). NOT_FOUND when it, or a symlink on the way,
// does not exist; UNAVAILABLE for any other error of realpath(3).
absl::StatusOr<std::string> RealPath(const std::string& path);

// Whether `real` is `real_root` or lies below it (both real paths).
bool IsWithin(absl::string_view real, absl::string_view real_root);

// Resolves `relative` (the spec field `field`, e.g. "init.hf_file") under `root` (named
// `root_name` in errors, e.g. "the coordinator's <data-root>/models") to its real path.
//   INVALID_ARGUMENT  `relative` is empty, absolute, holds a NUL or a '..' component;
//   NOT_FOUND         it does not exist (or a symlink on the way dangles);
//   PERMISSION_DENIED its real path is outside the root's (a symlink leads out);
//   FAILED_PRECONDITION the root itself cannot be resolved.
// Every message names `field` and the root.
absl::StatusOr<std::string> ResolveConfined(const std::string& root, absl::string_view relative,
                                            absl::string_view field, absl::string_view root_name);

// The lexical part of ResolveConfined alone: INVALID_ARGUMENT naming `field` for an empty or
// absolute path, a NUL or a '..' component.
absl::Status CheckRelativePath(absl::string_view relative, absl::string_view field,
                               absl::string_view root_name);

}  // namespace tandem

#endif  // TANDEM_COMMON_CONFINED_PATH_H_
