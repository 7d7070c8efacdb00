// DeviceBuffer<T>: an owned, typed allocation of device memory (cudaMalloc / cudaFree).
//
// Created only through Create(), which returns RESOURCE_EXHAUSTED (or the runtime's error) in
// place of throwing; move-only; the destructor frees the memory (its result is ignored: a
// destructor has no error channel, and a failing cudaFree means the context is already lost).
// The copy helpers are synchronous with respect to the host and to every stream (cudaMemcpy,
// then the legacy stream is synchronised), for tests and setup; the training path uses
// cudaMemcpyAsync on its own streams.
// Thread-safety: thread-compatible.
#ifndef TANDEM_WORKER_BACKEND_CUDA_DEVICE_BUFFER_H_
#define TANDEM_WORKER_BACKEND_CUDA_DEVICE_BUFFER_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/backend/cuda/cuda_status.h"

namespace tandem::worker::cuda {

template <typename T>
class DeviceBuffer {
 public:
  // `count` elements, uninitialised (count 0 holds no memory).
  static absl::StatusOr<DeviceBuffer> Create(size_t count) {
    DeviceBuffer buffer;
    if (count == 0) return buffer;
    void* ptr = nullptr;
    if (const cudaError_t e = cudaMalloc(&ptr, count * sizeof(T)); e != cudaSuccess) {
      (void)cudaGetLastError();
      const absl::Status s =
          CudaError(e, "cudaMalloc(&ptr, count * sizeof(T))", __FILE__, __LINE__);
      return absl::Status(s.code(), absl::StrCat("allocating ", count * sizeof(T),
                                                 " bytes of device memory: ", s.message()));
    }
    buffer.data_ = static_cast<T*>(ptr);
    buffer.count_ = count;
    return buffer;
  }
  // `count` elements copied from host memory.
  static absl::StatusOr<DeviceBuffer> FromHost(const T* host, size_t count) {
    ASSIGN_OR_RETURN(DeviceBuffer buffer, Create(count));
    RETURN_IF_ERROR(buffer.CopyFromHost(host, count));
    return buffer;
  }

  DeviceBuffer() = default;
  DeviceBuffer(DeviceBuffer&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), count_(std::exchange(other.count_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    if (this != &other) {
      Free();
      data_ = std::exchange(other.data_, nullptr);
      count_ = std::exchange(other.count_, 0);
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { Free(); }

  T* data() { return data_; }
  const T* data() const { return data_; }
  size_t size() const { return count_; }
  size_t bytes() const { return count_ * sizeof(T); }
  // Gives up ownership: the caller frees the returned memory (cudaFree); the buffer is empty.
  T* Release() {
    count_ = 0;
    return std::exchange(data_, nullptr);
  }

  // Copies min(count, size()) elements; INVALID_ARGUMENT when count > size().
  absl::Status CopyFromHost(const T* host, size_t count) {
    if (count > count_) return TooMany(count);
    if (count == 0) return absl::OkStatus();
    TANDEM_CUDA_RETURN_IF_ERROR(cudaMemcpy(data_, host, count * sizeof(T), cudaMemcpyHostToDevice));
    // From pageable memory cudaMemcpy may return once the data is staged, before the DMA lands,
    // and a cudaStreamNonBlocking stream is not ordered after the legacy stream that carries it:
    // wait for the legacy stream so that work on any stream sees the data.
    TANDEM_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(cudaStreamLegacy));
    return absl::OkStatus();
  }
  absl::Status CopyToHost(T* host, size_t count) const {
    if (count > count_) return TooMany(count);
    if (count == 0) return absl::OkStatus();
    TANDEM_CUDA_RETURN_IF_ERROR(cudaMemcpy(host, data_, count * sizeof(T), cudaMemcpyDeviceToHost));
    return absl::OkStatus();
  }
  // Sets every byte to zero, ordered on `stream`.
  absl::Status Zero(cudaStream_t stream) {
    if (count_ == 0) return absl::OkStatus();
    TANDEM_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(data_, 0, bytes(), stream));
    return absl::OkStatus();
  }

 private:
  absl::Status TooMany(size_t count) const {
    return absl::InvalidArgumentError(
        absl::StrCat("copy of ", count, " elements into a device buffer of ", count_));
  }
  void Free() {
    if (data_ != nullptr) (void)cudaFree(data_);
    data_ = nullptr;
    count_ = 0;
  }

  T* data_ = nullptr;
  size_t count_ = 0;
};

}  // namespace tandem::worker::cuda

#endif  // TANDEM_WORKER_BACKEND_CUDA_DEVICE_BUFFER_H_
