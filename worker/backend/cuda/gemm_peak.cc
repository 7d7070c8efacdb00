#include "worker/backend/cuda/gemm_peak.h"

#include <algorithm>
#include <utility>

#include "common/status_macros.h"
#include "worker/backend/cuda/cuda_handles.h"
#include "worker/backend/cuda/cuda_kernels.h"
#include "worker/backend/cuda/cuda_status.h"
#include "worker/backend/cuda/device.h"
#include "worker/backend/cuda/device_buffer.h"

namespace tandem::worker::cuda {

namespace {

// The best of `repeats` timed n x n x n GEMMs with operands of type T (float or bf16).
template <typename T>
absl::StatusOr<double> TimeGemm(int n, int repeats) {
  ASSIGN_OR_RETURN(CudaStream stream, CudaStream::Create());
  ASSIGN_OR_RETURN(CublasHandle blas, CublasHandle::Create(stream.get()));
  ASSIGN_OR_RETURN(CudaEvent start, CudaEvent::Create(cudaEventDefault));
  ASSIGN_OR_RETURN(CudaEvent stop, CudaEvent::Create(cudaEventDefault));
  const size_t count = static_cast<size_t>(n) * static_cast<size_t>(n);
  ASSIGN_OR_RETURN(DeviceBuffer<float> out, DeviceBuffer<float>::Create(count));
  DeviceBuffer<T> operands[2];
  for (DeviceBuffer<T>& operand : operands) {
    ASSIGN_OR_RETURN(operand, DeviceBuffer<T>::Create(count));
    RETURN_IF_ERROR(operand.Zero(stream.get()));
  }
  double best = 0.0;
  for (int r = 0; r <= repeats; ++r) {
    TANDEM_CUDA_RETURN_IF_ERROR(cudaEventRecord(start.get(), stream.get()));
    RETURN_IF_ERROR(LinearForward(blas.get(), stream.get(), operands[0].data(), operands[1].data(),
                                  nullptr, out.data(), n, n, n));
    TANDEM_CUDA_RETURN_IF_ERROR(cudaEventRecord(stop.get(), stream.get()));
    RETURN_IF_ERROR(stream.Synchronize());
    float ms = 0.0f;
    TANDEM_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, start.get(), stop.get()));
    if (r > 0 && ms > 0.0f) {
      best = std::max(best, 2.0 * n * n * static_cast<double>(n) / (ms * 1e-3));
    }
  }
  return best;
}

}  // namespace

absl::StatusOr<double> MeasureGemmFlops(bool half, int n, int repeats) {
  RETURN_IF_ERROR(CudaAvailable());
  return half ? TimeGemm<bf16>(n, repeats) : TimeGemm<float>(n, repeats);
}

}  // namespace tandem::worker::cuda
