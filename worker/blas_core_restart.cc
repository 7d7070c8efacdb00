#include "worker/blas_core_restart.h"

#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "absl/algorithm/container.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace tandem::worker {

absl::StatusOr<std::string> BlasCoreToRestartWith(absl::string_view mode, const char* env_coretype,
                                                  absl::string_view better) {
  if (mode == "keep") return std::string();
  if (mode == "auto") return env_coretype != nullptr ? std::string() : std::string(better);
  const bool name = !mode.empty() && mode.size() <= kMaxBlasCoreTypeBytes &&
                    absl::c_all_of(mode, [](char c) { return absl::ascii_isalnum(c); });
  if (!name) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--blas_core=", mode,
        ": expected auto (the processor's OpenBLAS kernels when OpenBLAS chose older ones), keep "
        "(OpenBLAS's own choice) or an OpenBLAS core type such as SkylakeX or Haswell"));
  }
  if (env_coretype != nullptr && absl::EqualsIgnoreCase(env_coretype, mode)) return std::string();
  return std::string(mode);
}

absl::Status RestartWithBlasCore(const std::vector<std::string>& argv, const std::string& coretype,
                                 const std::string& before) {
  if (argv.empty()) return absl::InvalidArgumentError("no arguments to start again with");
  if (setenv("OPENBLAS_CORETYPE", coretype.c_str(), /*overwrite=*/1) != 0 ||
      setenv(kBlasCoreBeforeRestartEnv, before.c_str(), /*overwrite=*/1) != 0) {
    return absl::InternalError(absl::StrCat("setenv: ", std::strerror(errno)));
  }
  std::vector<char*> args;
  args.reserve(argv.size() + 1);
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  execv("/proc/self/exe", args.data());
  const int err = errno;
  // Not restarted: leave the environment as it was, so nothing claims the kernels changed.
  unsetenv("OPENBLAS_CORETYPE");
  unsetenv(kBlasCoreBeforeRestartEnv);
  return absl::InternalError(absl::StrCat("starting /proc/self/exe again: ", std::strerror(err)));
}

std::string TakeBlasCoreRestartNote(absl::string_view now) {
  const char* before = std::getenv(kBlasCoreBeforeRestartEnv);
  if (before == nullptr) return "";
  const char* set = std::getenv("OPENBLAS_CORETYPE");
  const std::string coretype = set != nullptr ? set : "";
  std::string note =
      absl::StrCat("started again with OPENBLAS_CORETYPE=", coretype, " (OpenBLAS had chosen its ",
                   before, " GEMM kernels): OpenBLAS now runs its ", now, " kernels");
  if (!absl::EqualsIgnoreCase(now, coretype)) {
    absl::StrAppend(&note, ", not ", coretype,
                    " (it has none of that name for this processor, or was built without "
                    "DYNAMIC_ARCH)");
  }
  absl::StrAppend(&note, "; --blas_core=keep keeps OpenBLAS's own choice");
  unsetenv(kBlasCoreBeforeRestartEnv);
  return note;
}

}  // namespace tandem::worker
