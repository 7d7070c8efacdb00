// RAII holders of a CUDA stream, a CUDA event, a cuBLAS handle and a cuBLASLt handle. Each is
// created by a Status-returning factory (without a device they return the runtime's error, never
// crash), is move-only, and releases its object in the destructor (results ignored: a destructor
// has no error channel).
// Thread-safety: thread-compatible; the objects themselves follow CUDA's rules (a cuBLAS handle
// is used by one thread at a time).
#ifndef TANDEM_WORKER_BACKEND_CUDA_CUDA_HANDLES_H_
#define TANDEM_WORKER_BACKEND_CUDA_CUDA_HANDLES_H_

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <utility>

#include "absl/status/statusor.h"

namespace tandem::worker::cuda {

class CudaStream {
 public:
  // flags: cudaStreamDefault or cudaStreamNonBlocking (does not synchronise with stream 0).
  static absl::StatusOr<CudaStream> Create(unsigned int flags = cudaStreamNonBlocking);
  CudaStream() = default;
  CudaStream(CudaStream&& o) noexcept : stream_(std::exchange(o.stream_, nullptr)) {}
  CudaStream& operator=(CudaStream&& o) noexcept;
  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;
  ~CudaStream();

  cudaStream_t get() const { return stream_; }
  // Blocks until all work on the stream has finished; the first error of that work otherwise.
  absl::Status Synchronize() const;

 private:
  cudaStream_t stream_ = nullptr;
};

class CudaEvent {
 public:
  // Timing disabled by default (cheaper to record and to query).
  static absl::StatusOr<CudaEvent> Create(unsigned int flags = cudaEventDisableTiming);
  CudaEvent() = default;
  CudaEvent(CudaEvent&& o) noexcept : event_(std::exchange(o.event_, nullptr)) {}
  CudaEvent& operator=(CudaEvent&& o) noexcept;
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;
  ~CudaEvent();

  cudaEvent_t get() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
};

class CublasHandle {
 public:
  // A handle bound to `stream` (the GEMM kernels rebind it to the stream they are given).
  static absl::StatusOr<CublasHandle> Create(cudaStream_t stream);
  CublasHandle() = default;
  CublasHandle(CublasHandle&& o) noexcept : handle_(std::exchange(o.handle_, nullptr)) {}
  CublasHandle& operator=(CublasHandle&& o) noexcept;
  CublasHandle(const CublasHandle&) = delete;
  CublasHandle& operator=(const CublasHandle&) = delete;
  ~CublasHandle();

  cublasHandle_t get() const { return handle_; }

 private:
  cublasHandle_t handle_ = nullptr;
};

class CublasLtHandle {
 public:
  static absl::StatusOr<CublasLtHandle> Create();
  CublasLtHandle() = default;
  CublasLtHandle(CublasLtHandle&& o) noexcept : handle_(std::exchange(o.handle_, nullptr)) {}
  CublasLtHandle& operator=(CublasLtHandle&& o) noexcept;
  CublasLtHandle(const CublasLtHandle&) = delete;
  CublasLtHandle& operator=(const CublasLtHandle&) = delete;
  ~CublasLtHandle();

  cublasLtHandle_t get() const { return handle_; }

 private:
  cublasLtHandle_t handle_ = nullptr;
};

}  // namespace tandem::worker::cuda

#endif  // TANDEM_WORKER_BACKEND_CUDA_CUDA_HANDLES_H_
