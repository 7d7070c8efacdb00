// Eager loading of CUDA kernel modules, set before the first CUDA call of every program that
// uses a device (tandem-worker, the GPU benchmarks, the CUDA tests through CudaDeviceCount).
//
// Why: since CUDA 12.2 kernels load lazily, and loading one for the first time waits for the
// work already running on the device to drain. A pipeline stage posts its next receive before
// each compute, so the first forward of stage 0 would load its kernels behind NCCL's receive
// kernel, which spins until stage 1 sends, which waits on stage 0: a hang until the transport's
// timeout. With every module loaded at the first CUDA call nothing loads mid-step.
// Plain C++ (no CUDA): built and tested in every build.
#ifndef TANDEM_WORKER_BACKEND_CUDA_MODULE_LOADING_H_
#define TANDEM_WORKER_BACKEND_CUDA_MODULE_LOADING_H_

#include <string>

namespace tandem::worker::cuda {

inline constexpr char kModuleLoadingVariable[] = "CUDA_MODULE_LOADING";

// Sets CUDA_MODULE_LOADING=EAGER in the process environment, overriding any other value (LAZY
// would bring the hang back), and returns the value it replaced ("" when unset). Has effect
// only before the CUDA runtime initialises, so call it first in main() and before any CUDA
// call. Not thread-safe (setenv): call it while the program has one thread.
std::string UseEagerModuleLoading();

}  // namespace tandem::worker::cuda

#endif  // TANDEM_WORKER_BACKEND_CUDA_MODULE_LOADING_H_
