// Command-line conveniences for the daemons' main.cc files.
#ifndef TANDEM_COMMON_FLAGS_H_
#define TANDEM_COMMON_FLAGS_H_

#include <cstring>
#include <string>

#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace tandem {

// Lets users write `--data-root DIR` for the absl flag `data_root`: rewrites dashes in the
// name part of every `--long-flag[=value]` argument to underscores, in place. Stops at `--`.
inline void NormalizeFlagDashes(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    char* a = argv[i];
    if (std::strcmp(a, "--") == 0) return;
    if (a[0] != '-' || a[1] != '-') continue;
    for (char* c = a + 2; *c != '\0' && *c != '='; ++c) {
      if (*c == '-') *c = '_';
    }
  }
}

// Abseil's Mutex looks for lock-order cycles on every Lock when the library was built without
// NDEBUG, as Debian's is: a global graph behind a global lock, touched by every thread of the
// process. In the coordinator under status load it was 2% of the profile, besides the contention.
// Release builds of the programs turn it off; debug builds and the unit tests keep it.
inline void DisableDebugMutexChecksInRelease() {
#ifdef NDEBUG
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
#endif
}

// Makes `--help` list the flags defined in the file whose path ends with `main_file` (e.g.
// "worker/main.cc"). Abseil's default looks for a file named after the program, which
// tandem-worker's worker/main.cc is not, and so printed no flags at all.
inline void HelpListsFlagsOf(std::string main_file) {
  absl::FlagsUsageConfig config;
  config.contains_help_flags = [main_file](absl::string_view path) {
    return absl::EndsWith(path, main_file);
  };
  config.contains_helpshort_flags = config.contains_help_flags;
  absl::SetFlagsUsageConfig(config);
}

}  // namespace tandem

#endif  // TANDEM_COMMON_FLAGS_H_
