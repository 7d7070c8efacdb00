// Turning CUDA runtime, cuBLAS and NCCL result codes into absl::Status.
//
// Every fallible CUDA, cuBLAS or NCCL call in the CUDA backend goes through one of the
// TANDEM_*_RETURN_IF_ERROR macros, which return early from the enclosing function (whose return
// type must be constructible from absl::Status: absl::Status or absl::StatusOr<T>) with a Status
// naming the call's text, the library's error name and string, and the file and line. They never
// exit or abort: a daemon must survive a failed device call (see /work/shared/style.md habit 1).
//
// Codes: out-of-memory results map to RESOURCE_EXHAUSTED, invalid-value results to
// INVALID_ARGUMENT, "no usable device or driver" to FAILED_PRECONDITION, NCCL's remote/system
// errors to UNAVAILABLE and everything else to INTERNAL.
// (The device queries, CudaDeviceCount and CudaAvailable, are in device.h.)
// Thread-safety: the functions are thread-safe.
#ifndef TANDEM_WORKER_BACKEND_CUDA_CUDA_STATUS_H_
#define TANDEM_WORKER_BACKEND_CUDA_CUDA_STATUS_H_

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#include "absl/status/status.h"

namespace tandem::worker::cuda {

// The Status for a failed call; `call` is the call's source text. Never returns OK (callers
// only reach it with a failing code).
absl::Status CudaError(cudaError_t error, const char* call, const char* file, int line);
absl::Status CublasError(cublasStatus_t status, const char* call, const char* file, int line);
absl::Status NcclError(ncclResult_t result, const char* call, const char* file, int line);

// The canonical code for each library's result (exposed for tests).
absl::StatusCode CudaErrorCode(cudaError_t error);
absl::StatusCode CublasErrorCode(cublasStatus_t status);
absl::StatusCode NcclErrorCode(ncclResult_t result);

}  // namespace tandem::worker::cuda

#define TANDEM_CUDA_RETURN_IF_ERROR(call)                                                      \
  do {                                                                                         \
    if (const cudaError_t tandem_cuda_error_ = (call); tandem_cuda_error_ != cudaSuccess) {    \
      return ::tandem::worker::cuda::CudaError(tandem_cuda_error_, #call, __FILE__, __LINE__); \
    }                                                                                          \
  } while (false)

#define TANDEM_CUBLAS_RETURN_IF_ERROR(call)                                              \
  do {                                                                                   \
    if (const cublasStatus_t tandem_cublas_status_ = (call);                             \
        tandem_cublas_status_ != CUBLAS_STATUS_SUCCESS) {                                \
      return ::tandem::worker::cuda::CublasError(tandem_cublas_status_, #call, __FILE__, \
                                                 __LINE__);                              \
    }                                                                                    \
  } while (false)

#define TANDEM_NCCL_RETURN_IF_ERROR(call)                                                       \
  do {                                                                                          \
    if (const ncclResult_t tandem_nccl_result_ = (call); tandem_nccl_result_ != ncclSuccess) {  \
      return ::tandem::worker::cuda::NcclError(tandem_nccl_result_, #call, __FILE__, __LINE__); \
    }                                                                                           \
  } while (false)

#endif  // TANDEM_WORKER_BACKEND_CUDA_CUDA_STATUS_H_
