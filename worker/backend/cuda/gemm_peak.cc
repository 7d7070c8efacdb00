#include "worker/backend/cuda/gemm_peak.h"

#include <algorithm>

#include "worker/backend/cuda/cuda_handles.h"
#include "worker/backend/cuda/cuda_kernels.h"
#include "worker/backend/cuda/cuda_status.h"
#include "worker/backend/cuda/device_buffer.h"

namespace tandem::worker::cuda {

absl::StatusOr<double> MeasureGemmFlops(bool half, int n, int repeats) {
  if (absl::Status s = CudaAvailable(); !s.ok()) return s;
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
  DeviceBuffer<float> a32, b32;
  DeviceBuffer<bf16> a16, b16;
  if (half) {
    absl::StatusOr<DeviceBuffer<bf16>> a = DeviceBuffer<bf16>::Create(count);
    if (!a.ok()) return a.status();
    absl::StatusOr<DeviceBuffer<bf16>> b = DeviceBuffer<bf16>::Create(count);
    if (!b.ok()) return b.status();
    a16 = std::move(*a);
    b16 = std::move(*b);
    TANDEM_CUDA_RETURN_IF_ERROR(
        cudaMemsetAsync(a16.data(), 0, count * sizeof(bf16), stream->get()));
    TANDEM_CUDA_RETURN_IF_ERROR(
        cudaMemsetAsync(b16.data(), 0, count * sizeof(bf16), stream->get()));
  } else {
    absl::StatusOr<DeviceBuffer<float>> a = DeviceBuffer<float>::Create(count);
    if (!a.ok()) return a.status();
    absl::StatusOr<DeviceBuffer<float>> b = DeviceBuffer<float>::Create(count);
    if (!b.ok()) return b.status();
    a32 = std::move(*a);
    b32 = std::move(*b);
    if (absl::Status s = a32.Zero(stream->get()); !s.ok()) return s;
    if (absl::Status s = b32.Zero(stream->get()); !s.ok()) return s;
  }
  double best = 0.0;
  for (int r = 0; r <= repeats; ++r) {
    TANDEM_CUDA_RETURN_IF_ERROR(cudaEventRecord(start->get(), stream->get()));
    absl::Status s = half ? LinearForward(blas->get(), stream->get(), a16.data(), b16.data(),
                                          nullptr, out->data(), n, n, n)
                          : LinearForward(blas->get(), stream->get(), a32.data(), b32.data(),
                                          nullptr, out->data(), n, n, n);
    if (!s.ok()) return s;
    TANDEM_CUDA_RETURN_IF_ERROR(cudaEventRecord(stop->get(), stream->get()));
    if (absl::Status sync = stream->Synchronize(); !sync.ok()) return sync;
    float ms = 0.0f;
    TANDEM_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, start->get(), stop->get()));
    if (r > 0 && ms > 0.0f)
      best = std::max(best, 2.0 * n * n * static_cast<double>(n) / (ms * 1e-3));
  }
  return best;
}

}  // namespace tandem::worker::cuda
