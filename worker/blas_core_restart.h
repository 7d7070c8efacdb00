// Choosing OpenBLAS's GEMM kernels at tandem-worker's start (--blas_core). OpenBLAS reads
// OPENBLAS_CORETYPE once, as the library loads, and on a processor its detection does not know
// (seen on VMs: an AVX-512 Xeon taken for a Prescott) it runs kernels several times slower than
// the processor's own. A cpu worker then starts itself again (the same process id, arguments and
// environment) with OPENBLAS_CORETYPE naming the processor's kernels (BetterBlasCoreType), unless
// the environment sets OPENBLAS_CORETYPE already (the user's choice, or this restart's) or
// --blas_core=keep asks for OpenBLAS's own choice. --blas_core=CORE (e.g. Haswell) starts with
// those kernels, as OPENBLAS_CORETYPE=CORE would, where a flag is easier to give than an
// environment variable.
#ifndef TANDEM_WORKER_BLAS_CORE_RESTART_H_
#define TANDEM_WORKER_BLAS_CORE_RESTART_H_

#include <cstddef>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tandem::worker {

// Set by RestartWithBlasCore to the kernels the process ran before it started again.
inline constexpr char kBlasCoreBeforeRestartEnv[] = "TANDEM_WORKER_BLAS_CORE_BEFORE";

// The longest core type --blas_core takes (OpenBLAS's longest is 14 characters).
inline constexpr size_t kMaxBlasCoreTypeBytes = 32;

// The OPENBLAS_CORETYPE to start again with, or empty to go on as is. `mode` is --blas_core:
// "auto" restarts when `better` (BetterBlasCoreType, empty when the kernels fit) names a core
// type and `env_coretype` (OPENBLAS_CORETYPE's value, nullptr when unset) is unset; "keep"
// never does; a core type (letters and digits, e.g. "Haswell") restarts unless the environment
// names it already (in any case). INVALID_ARGUMENT naming the flag for anything else.
absl::StatusOr<std::string> BlasCoreToRestartWith(absl::string_view mode, const char* env_coretype,
                                                  absl::string_view better);

// Starts this program again (execv of /proc/self/exe with `argv`, argv[0] first) with
// OPENBLAS_CORETYPE=`coretype` and kBlasCoreBeforeRestartEnv=`before` (the kernels it ran) in
// its environment. Call it before the process opens a socket or a file or starts a thread of
// its own (OpenBLAS's threads end with the old image). Returns only on failure: INTERNAL naming the
// call and errno.
absl::Status RestartWithBlasCore(const std::vector<std::string>& argv, const std::string& coretype,
                                 const std::string& before);

// After RestartWithBlasCore, the line to log: the OPENBLAS_CORETYPE it started with, the kernels
// that ran before and those that run now (`now`: OpenBlasCoreName(); when they are not the ones
// asked for, it says so), and how to keep OpenBLAS's own choice; the marker is removed from the
// environment. Empty when this process was not so restarted.
std::string TakeBlasCoreRestartNote(absl::string_view now);

}  // namespace tandem::worker

#endif  // TANDEM_WORKER_BLAS_CORE_RESTART_H_
