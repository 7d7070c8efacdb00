// Command-line conveniences for the daemons' main.cc files.
#ifndef TANDEM_COMMON_FLAGS_H_
#define TANDEM_COMMON_FLAGS_H_

#include <cstring>

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

}  // namespace tandem

#endif  // TANDEM_COMMON_FLAGS_H_
