#include "worker/backend/cuda/cuda_status.h"

#include "absl/strings/str_cat.h"

namespace tandem::worker::cuda {
namespace {

const char* CublasName(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS:
      return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED:
      return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR:
      return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED:
      return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR:
      return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR:
      return "CUBLAS_STATUS_LICENSE_ERROR";
  }
  return "CUBLAS_STATUS_<unknown>";
}

std::string Where(const char* call, const char* file, int line) {
  return absl::StrCat(call, " at ", file, ":", line);
}

}  // namespace

absl::StatusCode CudaErrorCode(cudaError_t error) {
  switch (error) {
    case cudaSuccess:
      return absl::StatusCode::kOk;
    case cudaErrorMemoryAllocation:
      return absl::StatusCode::kResourceExhausted;
    case cudaErrorInvalidValue:
    case cudaErrorInvalidDevicePointer:
    case cudaErrorInvalidConfiguration:
    case cudaErrorInvalidResourceHandle:
      return absl::StatusCode::kInvalidArgument;
    case cudaErrorInsufficientDriver:
    case cudaErrorNoDevice:
    case cudaErrorInvalidDevice:
    case cudaErrorNoKernelImageForDevice:
    case cudaErrorDevicesUnavailable:
      return absl::StatusCode::kFailedPrecondition;
    default:
      return absl::StatusCode::kInternal;
  }
}

absl::StatusCode CublasErrorCode(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS:
      return absl::StatusCode::kOk;
    case CUBLAS_STATUS_ALLOC_FAILED:
      return absl::StatusCode::kResourceExhausted;
    case CUBLAS_STATUS_INVALID_VALUE:
      return absl::StatusCode::kInvalidArgument;
    case CUBLAS_STATUS_NOT_INITIALIZED:
    case CUBLAS_STATUS_ARCH_MISMATCH:
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return absl::StatusCode::kFailedPrecondition;
    default:
      return absl::StatusCode::kInternal;
  }
}

absl::StatusCode NcclErrorCode(ncclResult_t result) {
  switch (result) {
    case ncclSuccess:
      return absl::StatusCode::kOk;
    case ncclInvalidArgument:
    case ncclInvalidUsage:
      return absl::StatusCode::kInvalidArgument;
    case ncclSystemError:
    case ncclRemoteError:
      return absl::StatusCode::kUnavailable;
    default:
      return absl::StatusCode::kInternal;
  }
}

absl::Status CudaError(cudaError_t error, const char* call, const char* file, int line) {
  return absl::Status(
      CudaErrorCode(error) == absl::StatusCode::kOk ? absl::StatusCode::kInternal
                                                    : CudaErrorCode(error),
      absl::StrCat(Where(call, file, line), " failed: ", cudaGetErrorName(error), " (",
                   static_cast<int>(error), "): ", cudaGetErrorString(error)));
}

absl::Status CublasError(cublasStatus_t status, const char* call, const char* file, int line) {
  return absl::Status(CublasErrorCode(status) == absl::StatusCode::kOk ? absl::StatusCode::kInternal
                                                                       : CublasErrorCode(status),
                      absl::StrCat(Where(call, file, line), " failed: ", CublasName(status), " (",
                                   static_cast<int>(status), "): ", cublasGetStatusString(status)));
}

absl::Status NcclError(ncclResult_t result, const char* call, const char* file, int line) {
  return absl::Status(NcclErrorCode(result) == absl::StatusCode::kOk ? absl::StatusCode::kInternal
                                                                     : NcclErrorCode(result),
                      absl::StrCat(Where(call, file, line), " failed: nccl result ",
                                   static_cast<int>(result), ": ", ncclGetErrorString(result)));
}

}  // namespace tandem::worker::cuda
