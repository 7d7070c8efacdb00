#include <climits>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/backend/cuda/gpu_llama_kernels.h"
#include "worker/backend/cuda/kernel_util.cuh"

namespace tandem::worker::cuda {
namespace {

using kernel_util::BlockSum;
using kernel_util::ColumnTiles;
using kernel_util::kTile;
using kernel_util::LaunchStatus;

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 65535;

unsigned Blocks(int64_t count) {
  const int64_t blocks = (count + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 1 ? 1 : (blocks < kMaxBlocks ? blocks : kMaxBlocks));
}

absl::Status CheckRows(const char* what, int64_t n, int64_t c) {
  if (n < 0 || c < 1 || n > INT_MAX) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": bad shape n=", n, " c=", c));
  }
  return absl::OkStatus();
}

// One block per row. The sum of squares in double, as the CPU's.
__global__ void RmsNormForwardKernel(const float* in, const float* gain, float* out, float* rstd,
                                     int64_t c, float eps) {
  __shared__ double shared[32];
  const int64_t row = blockIdx.x;
  const float* x = in + row * c;
  double ss = 0.0;
  for (int64_t j = threadIdx.x; j < c; j += blockDim.x) ss += static_cast<double>(x[j]) * x[j];
  ss = BlockSum(ss, shared);
  const float s = static_cast<float>(1.0 / sqrt(ss / static_cast<double>(c) + eps));
  float* y = out + row * c;
  for (int64_t j = threadIdx.x; j < c; j += blockDim.x) y[j] = x[j] * s * gain[j];
  if (threadIdx.x == 0) rstd[row] = s;
}

// One block per row: din += s (dy g - x s mean(dy g x s)).
__global__ void RmsNormBackwardInputKernel(const float* dout, const float* in, const float* gain,
                                           const float* rstd, float* din, int64_t c) {
  __shared__ double shared[32];
  const int64_t row = blockIdx.x;
  const float* dy = dout + row * c;
  const float* x = in + row * c;
  float* dx = din + row * c;
  const float s = rstd[row];
  double sum = 0.0;
  for (int64_t j = threadIdx.x; j < c; j += blockDim.x) {
    sum += static_cast<double>(dy[j] * gain[j]) * (x[j] * s);
  }
  const float mean = static_cast<float>(BlockSum(sum, shared) / static_cast<double>(c));
  for (int64_t j = threadIdx.x; j < c; j += blockDim.x) {
    dx[j] += s * (dy[j] * gain[j] - x[j] * s * mean);
  }
}

// dgain[j] += sum_i dy[i, j] x[i, j] rstd[i], in kTile x kTile column tiles (fixed order, as
// cuda_kernels.cu's column sums).
__global__ void RmsNormBackwardGainKernel(const float* dout, const float* in, const float* rstd,
                                          float* dgain, int64_t n, int64_t c) {
  __shared__ float part[kTile][kTile + 1];
  const int64_t j = blockIdx.x * int64_t{kTile} + threadIdx.x;
  float sg = 0.0f;
  if (j < c) {
    for (int64_t i = threadIdx.y; i < n; i += kTile)
      sg += dout[i * c + j] * (in[i * c + j] * rstd[i]);
  }
  part[threadIdx.y][threadIdx.x] = sg;
  __syncthreads();
  if (threadIdx.y == 0 && j < c) {
    float t = 0.0f;
    for (int r = 0; r < kTile; ++r) t += part[r][threadIdx.x];
    dgain[j] += t;
  }
}

// One thread per rotated pair: B*T*NHX*(hd/2) of them. sign +1 forward, -1 backward.
__global__ void RopeKernel(float* x, const float* cos, const float* sin, int64_t t, int64_t nhx,
                           int64_t hd, float sign, int64_t pairs) {
  const int64_t half = hd / 2;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < pairs;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t j = i % half;
    const int64_t head = (i / half) % nhx;
    const int64_t row = i / (half * nhx);  // b * T + position
    const int64_t pos = row % t;
    const float cs = cos[pos * half + j], sn = sign * sin[pos * half + j];
    float* lo = x + row * nhx * hd + head * hd + j;
    float* hi = lo + half;
    const float a = *lo, e = *hi;
    *lo = a * cs - e * sn;
    *hi = e * cs + a * sn;
  }
}

__device__ __forceinline__ float Sigmoid(float a) { return 1.0f / (1.0f + expf(-a)); }

__global__ void SwiGluForwardKernel(const float* gate, const float* up, float* out, int64_t count) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float a = gate[i];
    out[i] = a * Sigmoid(a) * up[i];
  }
}

__global__ void SwiGluBackwardKernel(const float* gate, const float* up, const float* dout,
                                     float* dgate, float* dup, int64_t count) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float a = gate[i];
    const float s = Sigmoid(a);
    dgate[i] += dout[i] * up[i] * (s * (1.0f + a * (1.0f - s)));
    dup[i] += dout[i] * (a * s);
  }
}

absl::Status Rope(const char* what, cudaStream_t stream, float* x, const float* cos,
                  const float* sin, int64_t b, int64_t t, int64_t nhx, int64_t hd, float sign) {
  if (b < 0 || t < 0 || nhx < 0 || hd < 2 || hd % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": bad shape b=", b, " t=", t, " nhx=", nhx, " hd=", hd, " (hd even)"));
  }
  const int64_t pairs = b * t * nhx * (hd / 2);
  if (pairs == 0) return absl::OkStatus();
  RopeKernel<<<Blocks(pairs), kThreads, 0, stream>>>(x, cos, sin, t, nhx, hd, sign, pairs);
  return LaunchStatus("RopeKernel<<<>>>");
}

}  // namespace

absl::Status RmsNormForward(cudaStream_t stream, const float* in, const float* gain, float* out,
                            float* rstd, int64_t n, int64_t c, float eps) {
  RETURN_IF_ERROR(CheckRows("RmsNormForward", n, c));
  if (n == 0) return absl::OkStatus();
  RmsNormForwardKernel<<<static_cast<unsigned>(n), kThreads, 0, stream>>>(in, gain, out, rstd, c,
                                                                          eps);
  return LaunchStatus("RmsNormForwardKernel<<<>>>");
}

absl::Status RmsNormBackward(cudaStream_t stream, const float* dout, const float* in,
                             const float* gain, const float* rstd, float* din, float* dgain,
                             int64_t n, int64_t c) {
  RETURN_IF_ERROR(CheckRows("RmsNormBackward", n, c));
  if (n == 0) return absl::OkStatus();
  if (din != nullptr) {
    RmsNormBackwardInputKernel<<<static_cast<unsigned>(n), kThreads, 0, stream>>>(dout, in, gain,
                                                                                  rstd, din, c);
    RETURN_IF_ERROR(LaunchStatus("RmsNormBackwardInputKernel<<<>>>"));
  }
  if (dgain == nullptr) return absl::OkStatus();
  RmsNormBackwardGainKernel<<<ColumnTiles(c), dim3(kTile, kTile), 0, stream>>>(dout, in, rstd,
                                                                               dgain, n, c);
  return LaunchStatus("RmsNormBackwardGainKernel<<<>>>");
}

absl::Status RopeForward(cudaStream_t stream, float* x, const float* cos, const float* sin,
                         int64_t b, int64_t t, int64_t nhx, int64_t hd) {
  return Rope("RopeForward", stream, x, cos, sin, b, t, nhx, hd, 1.0f);
}

absl::Status RopeBackward(cudaStream_t stream, float* dx, const float* cos, const float* sin,
                          int64_t b, int64_t t, int64_t nhx, int64_t hd) {
  return Rope("RopeBackward", stream, dx, cos, sin, b, t, nhx, hd, -1.0f);
}

absl::Status SwiGluForward(cudaStream_t stream, const float* gate, const float* up, float* out,
                           int64_t count) {
  if (count < 0) {
    return absl::InvalidArgumentError(absl::StrCat("SwiGluForward: count ", count, " < 0"));
  }
  if (count == 0) return absl::OkStatus();
  SwiGluForwardKernel<<<Blocks(count), kThreads, 0, stream>>>(gate, up, out, count);
  return LaunchStatus("SwiGluForwardKernel<<<>>>");
}

absl::Status SwiGluBackward(cudaStream_t stream, const float* gate, const float* up,
                            const float* dout, float* dgate, float* dup, int64_t count) {
  if (count < 0) {
    return absl::InvalidArgumentError(absl::StrCat("SwiGluBackward: count ", count, " < 0"));
  }
  if (count == 0) return absl::OkStatus();
  SwiGluBackwardKernel<<<Blocks(count), kThreads, 0, stream>>>(gate, up, dout, dgate, dup, count);
  return LaunchStatus("SwiGluBackwardKernel<<<>>>");
}

}  // namespace tandem::worker::cuda
