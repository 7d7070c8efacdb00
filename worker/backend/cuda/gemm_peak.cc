#include "worker/backend/cuda/gemm_peak.h"

#include <algorithm>

#include "worker/backend/cuda/cuda_handles.h"
#include "worker/backend/cuda/cuda_kernels.h"
#include "worker/backend/cuda/cuda_status.h"
#include "worker/backend/cuda/device_buffer.h"

namespace tandem::worker::cuda {

namespace {

// The best of `repeats` timed n x n x n GEMMs with operands of type T (float or bf16).
template <typename T>
absl::StatusOr<double> TimeGemm(int n, int repeats) {
  absl::StatusOr<CudaStream> stream = CudaStream::Create();
  if (!stream.ok()) return stream.status();
  absl::StatusOr<CublasHandle> blas = CublasHandle::Create(stream->get());
  if (!blas.ok()) return blas.status();
  absl::StatusOr<CudaEvent> start = CudaEvent::Create(cudaEventDefault);
  if (!start.ok()) return start.status();
  absl::StatusOr<CudaEvent> stop = CudaEvent::Create(cudaEventDefault);
  if (!stop.ok()) return stop.status();
  const size_t count = static_cast<size_t>(n) * static_cast<size_t>(n);
  absl::StatusOr<DeviceBuffer<float>> out = DeviceBuffer<float>::Create(count);
  if (!out.ok()) return out.status();
  DeviceBuffer<T> operands[2];
  for (DeviceBuffer<T>& operand : operands) {
    absl::StatusOr<DeviceBuffer<T>> b = DeviceBuffer<T>::Create(count);
    if (!b.ok()) return b.status();
    operand = std::move(*b);
    if (absl::Status s = operand.Zero(stream->get()); !s.ok()) return s;
  }
  double best = 0.0;
  for (int r = 0; r <= repeats; ++r) {
    TANDEM_CUDA_RETURN_IF_ERROR(cudaEventRecord(start->get(), stream->get()));
    if (absl::Status s = LinearForward(blas->get(), stream->get(), operands[0].data(),
                                       operands[1].data(), nullptr, out->data(), n, n, n);
        !s.ok()) {
      return s;
    }
    TANDEM_CUDA_RETURN_IF_ERROR(cudaEventRecord(stop->get(), stream->get()));
    if (absl::Status sync = stream->Synchronize(); !sync.ok()) return sync;
    float ms = 0.0f;
    TANDEM_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, start->get(), stop->get()));
    if (r > 0 && ms > 0.0f) {
      best = std::max(best, 2.0 * n * n * static_cast<double>(n) / (ms * 1e-3));
    }
  }
  return best;
}

}  // namespace

absl::StatusOr<double> MeasureGemmFlops(bool half, int n, int repeats) {
  if (absl::Status s = CudaAvailable(); !s.ok()) return s;
  return half ? TimeGemm<bf16>(n, repeats) : TimeGemm<float>(n, repeats);
}

}  // namespace tandem::worker::cuda
