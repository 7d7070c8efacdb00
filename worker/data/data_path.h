// Data paths from a job spec: relative to the worker's --data-root, never escaping it, and
// possibly a shard pattern.
//
// A path's last component may hold the wildcards '*' (any run of characters) and '?' (one
// character); no other character is special. A pattern names every regular file of its
// directory whose name matches, in byte-wise name order. As in a shell, a wildcard does not
// match a leading '.' (hidden files) unless the pattern itself starts with '.'.
#ifndef TANDEM_WORKER_DATA_DATA_PATH_H_
#define TANDEM_WORKER_DATA_DATA_PATH_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tandem::worker {

// Whether `name` matches `pattern` ('*' and '?' wildcards; see above).
bool MatchesDataPattern(absl::string_view pattern, absl::string_view name);

// Joins `path` (from the spec field `field`, e.g. "data.path") under `data_root` ("." when
// empty). INVALID_ARGUMENT naming `field` when the path is empty, absolute, has a '..'
// component, or a wildcard outside its last component. The result may still be a pattern.
absl::StatusOr<std::string> ResolveDataPath(const std::string& data_root, absl::string_view path,
                                            absl::string_view field = "data.path");

// The files `path` names: the one regular file, or the sorted matches of a pattern, as real
// paths (symlinks followed) inside the real path of `data_root`. Errors name `field`: those
// of ResolveDataPath; NOT_FOUND for a missing file or a pattern without a match (naming the
// pattern and the directory); INVALID_ARGUMENT for a path that is not a regular file;
// PERMISSION_DENIED when the file, or a matching shard, or the pattern's directory resolves
// outside the root (a symlink leading out); FAILED_PRECONDITION when the root itself does not
// resolve.
absl::StatusOr<std::vector<std::string>> ResolveDataFiles(const std::string& data_root,
                                                          absl::string_view path,
                                                          absl::string_view field);

}  // namespace tandem::worker

#endif  // TANDEM_WORKER_DATA_DATA_PATH_H_
