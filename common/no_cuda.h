// Force-included (--include, top-level CMakeLists.txt) into every C++ file of the build. Unless
// the file's target is CUDA code (it links tandem_cuda_headers, which defines
// TANDEM_CUDA_CODE: the CUDA backend in worker/backend/cuda, the NCCL transport, and the
// device tests and benchmarks), it poisons the CUDA, cuBLAS and NCCL handle types, so that
// including cuda_runtime.h, cublas_v2.h or nccl.h, or naming one of these types, fails to
// build: the rest of the tree reaches the device only through worker/backend/cuda's CUDA-free
// headers (device.h, gemm_peak.h, gpu_gpt.h, gpu_gpt_layout.h). A header search path cannot
// hold this rule: some machines link the CUDA headers into /usr/local/include.
#ifndef TANDEM_COMMON_NO_CUDA_H_
#define TANDEM_COMMON_NO_CUDA_H_
#ifndef TANDEM_CUDA_CODE
#pragma GCC poison cudaStream_t cudaEvent_t cudaError_t cublasHandle_t cublasLtHandle_t ncclComm_t
#endif
#endif  // TANDEM_COMMON_NO_CUDA_H_
