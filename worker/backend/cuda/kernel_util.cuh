// Device helpers shared by the backend's .cu files (cuda_kernels.cu, gpu_llama_kernels.cu):
// warp and block reductions, the column-tile size of the fixed-order column sums, and the
// launch check. Internal to the CUDA backend; nvcc only.
#ifndef TANDEM_WORKER_BACKEND_CUDA_KERNEL_UTIL_CUH_
#define TANDEM_WORKER_BACKEND_CUDA_KERNEL_UTIL_CUH_

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>

#include "absl/status/status.h"
#include "worker/backend/cuda/cuda_status.h"

namespace tandem::worker::cuda::kernel_util {

// Column reductions use blocks of kTile x kTile threads, kTile columns each.
inline constexpr int kTile = 32;

inline unsigned ColumnTiles(int64_t cols) {
  return static_cast<unsigned>((cols + kTile - 1) / kTile);
}

// The error of the launch just made (configuration errors surface here, not at the next sync),
// naming the caller's file and line.
inline absl::Status LaunchStatus(const char* kernel, const char* file = __builtin_FILE(),
                                 int line = __builtin_LINE()) {
  if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) {
    return CudaError(e, kernel, file, line);
  }
  return absl::OkStatus();
}

template <typename T>
__device__ inline T WarpSum(T v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
  return v;  // complete in lane 0
}

__device__ inline float WarpMax(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;  // in every lane
}

__device__ inline float WarpAllSum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;  // in every lane
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024), returned to every thread.
// `shared` holds 32 elements; it may be reused after the call returns.
template <typename T>
__device__ inline T BlockSum(T v, T* shared) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = WarpSum(v);
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  const int warps = blockDim.x >> 5;
  if (warp == 0) {
    v = lane < warps ? shared[lane] : T(0);
    v = WarpSum(v);
    if (lane == 0) shared[0] = v;
  }
  __syncthreads();
  const T r = shared[0];
  __syncthreads();
  return r;
}

__device__ inline float BlockMax(float v, float* shared) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = WarpMax(v);
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  const int warps = blockDim.x >> 5;
  if (warp == 0) {
    v = lane < warps ? shared[lane] : -INFINITY;
    v = WarpMax(v);
    if (lane == 0) shared[0] = v;
  }
  __syncthreads();
  const float r = shared[0];
  __syncthreads();
  return r;
}

}  // namespace tandem::worker::cuda::kernel_util

#endif  // TANDEM_WORKER_BACKEND_CUDA_KERNEL_UTIL_CUH_
