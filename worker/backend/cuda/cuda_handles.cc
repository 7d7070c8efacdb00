#include "worker/backend/cuda/cuda_handles.h"

#include "worker/backend/cuda/cuda_status.h"

namespace tandem::worker::cuda {

absl::StatusOr<CudaStream> CudaStream::Create(unsigned int flags) {
  CudaStream s;
  TANDEM_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&s.stream_, flags));
  return s;
}

CudaStream& CudaStream::operator=(CudaStream&& o) noexcept {
  if (this != &o) {
    if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
    stream_ = std::exchange(o.stream_, nullptr);
  }
  return *this;
}

CudaStream::~CudaStream() {
  if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
}

absl::Status CudaStream::Synchronize() const {
  TANDEM_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  return absl::OkStatus();
}

absl::StatusOr<CudaEvent> CudaEvent::Create(unsigned int flags) {
  CudaEvent e;
  TANDEM_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&e.event_, flags));
  return e;
}

CudaEvent& CudaEvent::operator=(CudaEvent&& o) noexcept {
  if (this != &o) {
    if (event_ != nullptr) (void)cudaEventDestroy(event_);
    event_ = std::exchange(o.event_, nullptr);
  }
  return *this;
}

CudaEvent::~CudaEvent() {
  if (event_ != nullptr) (void)cudaEventDestroy(event_);
}

absl::StatusOr<CublasHandle> CublasHandle::Create(cudaStream_t stream) {
  CublasHandle h;
  TANDEM_CUBLAS_RETURN_IF_ERROR(cublasCreate(&h.handle_));
  TANDEM_CUBLAS_RETURN_IF_ERROR(cublasSetStream(h.handle_, stream));
  return h;
}

CublasHandle& CublasHandle::operator=(CublasHandle&& o) noexcept {
  if (this != &o) {
    if (handle_ != nullptr) (void)cublasDestroy(handle_);
    handle_ = std::exchange(o.handle_, nullptr);
  }
  return *this;
}

CublasHandle::~CublasHandle() {
  if (handle_ != nullptr) (void)cublasDestroy(handle_);
}

absl::StatusOr<CublasLtHandle> CublasLtHandle::Create() {
  CublasLtHandle h;
  TANDEM_CUBLAS_RETURN_IF_ERROR(cublasLtCreate(&h.handle_));
  return h;
}

CublasLtHandle& CublasLtHandle::operator=(CublasLtHandle&& o) noexcept {
  if (this != &o) {
    if (handle_ != nullptr) (void)cublasLtDestroy(handle_);
    handle_ = std::exchange(o.handle_, nullptr);
  }
  return *this;
}

CublasLtHandle::~CublasLtHandle() {
  if (handle_ != nullptr) (void)cublasLtDestroy(handle_);
}

}  // namespace tandem::worker::cuda
