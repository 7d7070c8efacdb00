#include "worker/backend/cuda/cuda_device_copier.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <utility>

#include "common/status_macros.h"
#include "worker/backend/cuda/cuda_handles.h"
#include "worker/backend/cuda/cuda_status.h"
#include "worker/backend/cuda/device.h"

namespace tandem::worker::cuda {
namespace {

// cudaMallocHost memory; freed with cudaFreeHost (its result ignored: no error channel).
class PinnedHostBuffer final : public HostBuffer {
 public:
  PinnedHostBuffer(void* data, size_t bytes) : data_(data), bytes_(bytes) {}
  PinnedHostBuffer(const PinnedHostBuffer&) = delete;
  PinnedHostBuffer& operator=(const PinnedHostBuffer&) = delete;
  ~PinnedHostBuffer() override { (void)cudaFreeHost(data_); }

  void* data() override { return data_; }
  size_t bytes() const override { return bytes_; }

 private:
  void* const data_;
  const size_t bytes_;
};

class CudaDeviceCopier final : public DeviceCopier {
 public:
  CudaDeviceCopier(int device, CudaStream stream) : device_(device), stream_(std::move(stream)) {}

  absl::StatusOr<std::unique_ptr<HostBuffer>> AllocateHost(size_t bytes) override {
    RETURN_IF_ERROR(SetDevice(device_));
    void* data = nullptr;
    // At least one byte, so that data() is never null.
    TANDEM_CUDA_RETURN_IF_ERROR(cudaMallocHost(&data, std::max<size_t>(bytes, 1)));
    return std::make_unique<PinnedHostBuffer>(data, bytes);
  }

  absl::Status CopyToHost(void* dst, const void* src, size_t bytes) override {
    RETURN_IF_ERROR(SetDevice(device_));
    TANDEM_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_.get()));
    return stream_.Synchronize();
  }

  absl::Status CopyToDevice(void* dst, const void* src, size_t bytes) override {
    RETURN_IF_ERROR(SetDevice(device_));
    TANDEM_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_.get()));
    return stream_.Synchronize();
  }

 private:
  const int device_;
  CudaStream stream_;  // created on device_
};

}  // namespace

absl::StatusOr<std::unique_ptr<DeviceCopier>> NewCudaDeviceCopier(int device) {
  RETURN_IF_ERROR(OpenDevice(device).status());
  ASSIGN_OR_RETURN(CudaStream stream, CudaStream::Create(cudaStreamNonBlocking));
  return std::make_unique<CudaDeviceCopier>(device, std::move(stream));
}

}  // namespace tandem::worker::cuda
