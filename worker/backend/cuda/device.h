// The CUDA device as the rest of the worker sees it: plain functions and one owned allocation,
// with no CUDA type and no CUDA header, so that code outside worker/backend/cuda (main.cc, the
// CUDA StageCompute) reaches the device through this file and the build can keep the CUDA
// headers away from it (tandem_cuda_backend's CUDA include directories are PRIVATE).
// Errors come from the TANDEM_CUDA_RETURN_IF_ERROR macros (cuda_status.h): never an exit.
// Thread-safety: the functions are thread-safe; the current device is per thread (CUDA's rule).
#ifndef TANDEM_WORKER_BACKEND_CUDA_DEVICE_H_
#define TANDEM_WORKER_BACKEND_CUDA_DEVICE_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tandem::worker::cuda {

// The number of CUDA devices visible to this process. Without a driver (no libcuda.so.1) or
// without a device, the runtime's error as a FAILED_PRECONDITION Status.
absl::StatusOr<int> CudaDeviceCount();

// OK when at least one CUDA device can be used; otherwise FAILED_PRECONDITION saying why (tests
// skip on it: GTEST_SKIP() << "no CUDA device: " << status).
absl::Status CudaAvailable();

// Makes device `device` current on the calling thread (cudaSetDevice).
absl::Status SetDevice(int device);

// The uuid of CUDA device `device` as NVIDIA's tools print it (nvidia-smi -L,
// NVIDIA_VISIBLE_DEVICES): "GPU-" and the 16 bytes of cudaDeviceProp.uuid in lower-case hex,
// grouped 8-4-4-4-12. The same GPU has the same uuid in every process, whatever
// CUDA_VISIBLE_DEVICES renumbers it to: how the coordinator tells two workers on one GPU.
// FAILED_PRECONDITION (the runtime's error) when the device cannot be queried.
absl::StatusOr<std::string> DeviceUuid(int device);

// The formatting of DeviceUuid: "GPU-" and `bytes` grouped 8-4-4-4-12 in lower-case hex.
std::string FormatDeviceUuid(const unsigned char (&bytes)[16]);

struct DeviceInfo {
  int64_t total_memory_bytes = 0;
  std::string name;  // cudaDeviceProp.name, e.g. "NVIDIA H100 80GB HBM3"
};

// Checks that CUDA device `device` can be used and makes it current on the calling thread:
// CudaAvailable(), then cudaSetDevice and cudaMemGetInfo. FAILED_PRECONDITION saying why not
// (CudaAvailable's message, or the runtime's error string).
absl::StatusOr<DeviceInfo> OpenDevice(int device);

// An owned allocation of device memory on the current device (cudaMalloc / cudaFree):
// move-only; the destructor frees it (its result ignored, as DeviceBuffer's).
class DeviceMemory {
 public:
  // `bytes` uninitialised bytes (0 holds no memory). RESOURCE_EXHAUSTED (or the runtime's
  // error) with the message of DeviceBuffer::Create.
  static absl::StatusOr<DeviceMemory> Allocate(size_t bytes);

  DeviceMemory() = default;
  DeviceMemory(DeviceMemory&& other) noexcept;
  DeviceMemory& operator=(DeviceMemory&& other) noexcept;
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;
  ~DeviceMemory();

  void* data() { return data_; }
  size_t bytes() const { return bytes_; }

  // Sets every byte to zero (cudaMemset, on the legacy default stream).
  absl::Status Zero();

 private:
  void Free();

  void* data_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace tandem::worker::cuda

#endif  // TANDEM_WORKER_BACKEND_CUDA_DEVICE_H_
