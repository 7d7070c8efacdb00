#include "worker/backend/cuda/device.h"

#include <cuda_runtime_api.h>

#include <utility>

#include "common/status_macros.h"
#include "worker/backend/cuda/cuda_status.h"
#include "worker/backend/cuda/device_buffer.h"
#include "worker/backend/cuda/module_loading.h"

namespace tandem::worker::cuda {

absl::StatusOr<int> CudaDeviceCount() {
  // The first CUDA call of a program that did not set it in main() (the tests): eager module
  // loading before the runtime initialises (module_loading.h). Once, so no setenv races later.
  static const bool eager = (UseEagerModuleLoading(), true);
  (void)eager;
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess) {
    (void)cudaGetLastError();  // clear it, so a later unrelated check does not see it
    return absl::FailedPreconditionError(
        CudaError(error, "cudaGetDeviceCount(&count)", __FILE__, __LINE__).message());
  }
  return count;
}

absl::Status CudaAvailable() {
  ASSIGN_OR_RETURN(const int count, CudaDeviceCount());
  if (count < 1) return absl::FailedPreconditionError("cudaGetDeviceCount reported 0 devices");
  return absl::OkStatus();
}

absl::Status SetDevice(int device) {
  TANDEM_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  return absl::OkStatus();
}

absl::StatusOr<DeviceInfo> OpenDevice(int device) {
  RETURN_IF_ERROR(CudaAvailable());
  if (const cudaError_t e = cudaSetDevice(device); e != cudaSuccess) {
    return absl::FailedPreconditionError(cudaGetErrorString(e));
  }
  size_t free_bytes = 0, total_bytes = 0;
  if (const cudaError_t e = cudaMemGetInfo(&free_bytes, &total_bytes); e != cudaSuccess) {
    return absl::FailedPreconditionError(cudaGetErrorString(e));
  }
  cudaDeviceProp prop;
  if (const cudaError_t e = cudaGetDeviceProperties(&prop, device); e != cudaSuccess) {
    return absl::FailedPreconditionError(cudaGetErrorString(e));
  }
  DeviceInfo info;
  info.total_memory_bytes = static_cast<int64_t>(total_bytes);
  info.name = prop.name;  // NUL-terminated within its 256 bytes
  return info;
}

std::string FormatDeviceUuid(const unsigned char (&bytes)[16]) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out = "GPU-";
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) out += '-';
    out += kHex[bytes[i] >> 4];
    out += kHex[bytes[i] & 0xf];
  }
  return out;
}

absl::StatusOr<std::string> DeviceUuid(int device) {
  RETURN_IF_ERROR(CudaAvailable());
  cudaDeviceProp prop;
  if (const cudaError_t e = cudaGetDeviceProperties(&prop, device); e != cudaSuccess) {
    return absl::FailedPreconditionError(
        CudaError(e, "cudaGetDeviceProperties(&prop, device)", __FILE__, __LINE__).message());
  }
  unsigned char bytes[16];
  for (int i = 0; i < 16; ++i) bytes[i] = static_cast<unsigned char>(prop.uuid.bytes[i]);
  return FormatDeviceUuid(bytes);
}

absl::StatusOr<DeviceMemory> DeviceMemory::Allocate(size_t bytes) {
  // Through DeviceBuffer, for its error message.
  ASSIGN_OR_RETURN(DeviceBuffer<char> buffer, DeviceBuffer<char>::Create(bytes));
  DeviceMemory memory;
  memory.bytes_ = buffer.size();
  memory.data_ = buffer.Release();
  return memory;
}

DeviceMemory::DeviceMemory(DeviceMemory&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}

DeviceMemory& DeviceMemory::operator=(DeviceMemory&& other) noexcept {
  if (this != &other) {
    Free();
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

DeviceMemory::~DeviceMemory() { Free(); }

absl::Status DeviceMemory::Zero() {
  if (bytes_ == 0) return absl::OkStatus();
  TANDEM_CUDA_RETURN_IF_ERROR(cudaMemset(data_, 0, bytes_));
  return absl::OkStatus();
}

void DeviceMemory::Free() {
  if (data_ != nullptr) (void)cudaFree(data_);
  data_ = nullptr;
  bytes_ = 0;
}

}  // namespace tandem::worker::cuda
