// The device's GEMM throughput, measured: a cuda:N worker registers it as its peak, the
// denominator of model-FLOPs utilisation (as a CPU worker registers its sgemm's).
#ifndef TANDEM_WORKER_BACKEND_CUDA_GEMM_PEAK_H_
#define TANDEM_WORKER_BACKEND_CUDA_GEMM_PEAK_H_

#include "absl/status/statusor.h"

namespace tandem::worker::cuda {

// FLOP/s of an n x n x n GEMM on the current device (`half`: bf16 operands with fp32 accumulation;
// else fp32), the best of `repeats` timed with CUDA events after a warm-up. Errors from the device.
absl::StatusOr<double> MeasureGemmFlops(bool half, int n = 4096, int repeats = 5);

}  // namespace tandem::worker::cuda

#endif  // TANDEM_WORKER_BACKEND_CUDA_GEMM_PEAK_H_
