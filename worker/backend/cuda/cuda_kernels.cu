#include <climits>
#include <cmath>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/backend/cuda/cuda_kernels.h"
#include "worker/backend/cuda/cuda_status.h"
#include "worker/backend/cuda/kernel_util.cuh"

namespace tandem::worker::cuda {
namespace {

using kernel_util::BlockMax;
using kernel_util::BlockSum;
using kernel_util::ColumnTiles;
using kernel_util::kTile;
using kernel_util::LaunchStatus;
using kernel_util::WarpAllSum;
using kernel_util::WarpMax;
using kernel_util::WarpSum;

// Same value as kernels::kLayerNormEps (worker/model/kernels.h, not included here: nvcc need
// not see the CPU headers).
constexpr float kLayerNormEps = 1e-5f;
constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2/pi)
constexpr int kThreads = 256;
constexpr int kMaxBlocks = 65535;
constexpr int kReduceThreads = 1024;

// ---- Argument checks (INVALID_ARGUMENT, never a launch with bad shapes).

absl::Status CheckCount(const char* what, int64_t count) {
  if (count < 0) return absl::InvalidArgumentError(absl::StrCat(what, ": count ", count, " < 0"));
  return absl::OkStatus();
}

// cuBLAS takes int dimensions and leading dimensions.
absl::Status CheckGemmDims(const char* what, int64_t n, int64_t c, int64_t oc) {
  if (n < 0 || c < 0 || oc < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": negative shape n=", n, " c=", c, " oc=", oc));
  }
  if (n > INT_MAX || c > INT_MAX || oc > INT_MAX) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": shape n=", n, " c=", c, " oc=", oc, " exceeds cuBLAS's int range"));
  }
  return absl::OkStatus();
}

absl::Status CheckAttention(const char* what, int64_t b, int64_t t, int64_t c, int64_t nh) {
  if (b < 0 || t < 0 || c < 0 || nh < 1 || c % nh != 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": bad shape b=", b, " t=", t, " c=", c,
                                                   " nh=", nh, " (need nh >= 1 dividing c)"));
  }
  if (3 * c > INT_MAX || t * t > INT_MAX || t > INT_MAX) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": shape t=", t, " c=", c, " exceeds cuBLAS's int range"));
  }
  return absl::OkStatus();
}

int Blocks(int64_t count) {
  const int64_t blocks = (count + kThreads - 1) / kThreads;
  return static_cast<int>(blocks < kMaxBlocks ? (blocks > 0 ? blocks : 1) : kMaxBlocks);
}

// ---- Row-major GEMMs on column-major cuBLAS: a row-major (M, N) matrix with leading dimension
// ld is, in memory, its column-major transpose, so C = op(A) op(B) is computed as
// C^T = op(B)^T op(A)^T: swap the operands and M with N, keep the transpose flags.

cublasOperation_t Op(bool trans) { return trans ? CUBLAS_OP_T : CUBLAS_OP_N; }

absl::Status Sgemm(cublasHandle_t h, cudaStream_t s, bool ta, bool tb, int64_t m, int64_t n,
                   int64_t k, float alpha, const float* a, int64_t lda, const float* b, int64_t ldb,
                   float beta, float* c, int64_t ldc) {
  if (m == 0 || n == 0) return absl::OkStatus();
  TANDEM_CUBLAS_RETURN_IF_ERROR(cublasSetStream(h, s));
  const int mi = static_cast<int>(m), ni = static_cast<int>(n), ki = static_cast<int>(k);
  TANDEM_CUBLAS_RETURN_IF_ERROR(cublasSgemm(h, Op(tb), Op(ta), ni, mi, ki, &alpha, b,
                                            static_cast<int>(ldb), a, static_cast<int>(lda), &beta,
                                            c, static_cast<int>(ldc)));
  return absl::OkStatus();
}

absl::Status SgemmStridedBatched(cublasHandle_t h, cudaStream_t s, bool ta, bool tb, int64_t m,
                                 int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                                 int64_t stride_a, const float* b, int64_t ldb, int64_t stride_b,
                                 float beta, float* c, int64_t ldc, int64_t stride_c,
                                 int64_t batch) {
  if (m == 0 || n == 0 || batch == 0) return absl::OkStatus();
  TANDEM_CUBLAS_RETURN_IF_ERROR(cublasSetStream(h, s));
  TANDEM_CUBLAS_RETURN_IF_ERROR(cublasSgemmStridedBatched(
      h, Op(tb), Op(ta), static_cast<int>(n), static_cast<int>(m), static_cast<int>(k), &alpha, b,
      static_cast<int>(ldb), stride_b, a, static_cast<int>(lda), stride_a, &beta, c,
      static_cast<int>(ldc), stride_c, static_cast<int>(batch)));
  return absl::OkStatus();
}

// bf16 A and B, fp32 accumulation, C of type c_type (CUDA_R_32F or CUDA_R_16BF).
absl::Status GemmBf16(cublasHandle_t h, cudaStream_t s, bool ta, bool tb, int64_t m, int64_t n,
                      int64_t k, float alpha, const bf16* a, int64_t lda, const bf16* b,
                      int64_t ldb, float beta, void* c, cudaDataType_t c_type, int64_t ldc) {
  if (m == 0 || n == 0) return absl::OkStatus();
  TANDEM_CUBLAS_RETURN_IF_ERROR(cublasSetStream(h, s));
  TANDEM_CUBLAS_RETURN_IF_ERROR(cublasGemmEx(
      h, Op(tb), Op(ta), static_cast<int>(n), static_cast<int>(m), static_cast<int>(k), &alpha, b,
      CUDA_R_16BF, static_cast<int>(ldb), a, CUDA_R_16BF, static_cast<int>(lda), &beta, c, c_type,
      static_cast<int>(ldc), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  return absl::OkStatus();
}

// ---- Device helpers.

__device__ __forceinline__ float ToF(float x) { return x; }
__device__ __forceinline__ float ToF(bf16 x) { return __bfloat162float(x); }

// ---- Kernels.

template <typename T>
__global__ void AddBiasKernel(T* out, const float* b, int64_t n, int64_t oc) {
  const int64_t total = n * oc;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    if constexpr (std::is_same_v<T, float>) {
      out[i] += b[i % oc];
    } else {
      out[i] = __float2bfloat16(__bfloat162float(out[i]) + b[i % oc]);
    }
  }
}

// Column reductions over N rows (kernel_util.cuh's kTile): a block of kTile x kTile threads
// owns kTile columns; threadIdx.x is the column (a warp reads kTile consecutive floats of a
// row: coalesced), threadIdx.y a row lane that sums rows y, y + kTile, ... in order; the lanes'
// partials are then added in lane order. A fixed order, so bit-reproducible, with N / kTile
// sequential steps per thread instead of N.

// db[j] += sum_i dout[i, j].
template <typename T>
__global__ void ColumnSumKernel(const T* dout, float* db, int64_t n, int64_t oc) {
  __shared__ float part[kTile][kTile + 1];
  const int64_t j = blockIdx.x * int64_t{kTile} + threadIdx.x;
  float s = 0.0f;
  if (j < oc) {
    for (int64_t i = threadIdx.y; i < n; i += kTile) s += ToF(dout[i * oc + j]);
  }
  part[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && j < oc) {
    float t = 0.0f;
    for (int r = 0; r < kTile; ++r) t += part[r][threadIdx.x];
    db[j] += t;
  }
}

__global__ void LayerNormForwardKernel(const float* in, const float* gain, const float* bias,
                                       float* out, float* mean, float* rstd, int64_t c) {
  __shared__ float shared[32];
  const int64_t row = blockIdx.x;
  const float* x = in + row * c;
  float sum = 0.0f;
  for (int64_t j = threadIdx.x; j < c; j += blockDim.x) sum += x[j];
  const float m = BlockSum(sum, shared) / static_cast<float>(c);
  float var = 0.0f;
  for (int64_t j = threadIdx.x; j < c; j += blockDim.x) {
    const float d = x[j] - m;
    var += d * d;
  }
  var = BlockSum(var, shared) / static_cast<float>(c);
  const float s = 1.0f / sqrtf(var + kLayerNormEps);
  float* y = out + row * c;
  for (int64_t j = threadIdx.x; j < c; j += blockDim.x) y[j] = (x[j] - m) * s * gain[j] + bias[j];
  if (threadIdx.x == 0) {
    mean[row] = m;
    rstd[row] = s;
  }
}

__global__ void LayerNormBackwardInputKernel(const float* dout, const float* in, const float* gain,
                                             const float* mean, const float* rstd, float* din,
                                             int64_t c) {
  __shared__ float shared[32];
  const int64_t row = blockIdx.x;
  const float* dy = dout + row * c;
  const float* x = in + row * c;
  float* dx = din + row * c;
  const float m = mean[row], s = rstd[row];
  float sum_dxhat = 0.0f, sum_dxhat_xhat = 0.0f;
  for (int64_t j = threadIdx.x; j < c; j += blockDim.x) {
    const float xhat = (x[j] - m) * s;
    const float dxhat = dy[j] * gain[j];
    sum_dxhat += dxhat;
    sum_dxhat_xhat += dxhat * xhat;
  }
  const float mean_dxhat = BlockSum(sum_dxhat, shared) / static_cast<float>(c);
  const float mean_dxhat_xhat = BlockSum(sum_dxhat_xhat, shared) / static_cast<float>(c);
  for (int64_t j = threadIdx.x; j < c; j += blockDim.x) {
    const float xhat = (x[j] - m) * s;
    const float dxhat = dy[j] * gain[j];
    dx[j] += s * (dxhat - mean_dxhat - xhat * mean_dxhat_xhat);
  }
}

// dgain[j] += sum_i dy[i, j] xhat[i, j]; dbias[j] += sum_i dy[i, j]; tiled as ColumnSumKernel.
__global__ void LayerNormBackwardParamsKernel(const float* dout, const float* in, const float* mean,
                                              const float* rstd, float* dgain, float* dbias,
                                              int64_t n, int64_t c) {
  __shared__ float part_g[kTile][kTile + 1];
  __shared__ float part_b[kTile][kTile + 1];
  const int64_t j = blockIdx.x * int64_t{kTile} + threadIdx.x;
  float sg = 0.0f, sb = 0.0f;
  if (j < c) {
    for (int64_t i = threadIdx.y; i < n; i += kTile) {
      const float dy = dout[i * c + j];
      sb += dy;
      sg += dy * (in[i * c + j] - mean[i]) * rstd[i];
    }
  }
  part_g[threadIdx.y][threadIdx.x] = sg;
  part_b[threadIdx.y][threadIdx.x] = sb;
  __syncthreads();
  if (threadIdx.y == 0 && j < c) {
    float tg = 0.0f, tb = 0.0f;
    for (int r = 0; r < kTile; ++r) {
      tg += part_g[r][threadIdx.x];
      tb += part_b[r][threadIdx.x];
    }
    dgain[j] += tg;
    dbias[j] += tb;
  }
}

__global__ void GeluForwardKernel(const float* in, float* out, int64_t count) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float x = in[i];
    const float u = kGeluScale * (x + 0.044715f * x * x * x);
    out[i] = 0.5f * x * (1.0f + tanhf(u));
  }
}

__global__ void GeluBackwardKernel(const float* in, const float* dout, float* din, int64_t count) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float x = in[i];
    const float u = kGeluScale * (x + 0.044715f * x * x * x);
    const float t = tanhf(u);
    const float du = kGeluScale * (1.0f + 3.0f * 0.044715f * x * x);
    const float grad = 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du;
    din[i] += grad * dout[i];
  }
}

__global__ void AddKernel(const float* a, const float* b, float* out, int64_t count) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count;
       i += int64_t{gridDim.x} * blockDim.x) {
    out[i] = a[i] + b[i];
  }
}

// One warp per row of `rows` rows of length t (row r is query position r % t): softmax over
// positions [0, r % t], zeros after, in place.
__global__ void CausalSoftmaxKernel(float* att, int64_t rows, int64_t t) {
  const int64_t row = blockIdx.x * int64_t{blockDim.x / 32} + threadIdx.x / 32;
  const int lane = threadIdx.x & 31;
  if (row >= rows) return;
  float* p = att + row * t;
  const int64_t len = row % t + 1;
  float m = -INFINITY;
  for (int64_t j = lane; j < len; j += 32) m = fmaxf(m, p[j]);
  m = WarpMax(m);
  float sum = 0.0f;
  for (int64_t j = lane; j < len; j += 32) {
    const float e = expf(p[j] - m);
    p[j] = e;
    sum += e;
  }
  const float inv = 1.0f / WarpAllSum(sum);
  for (int64_t j = lane; j < len; j += 32) p[j] *= inv;
  for (int64_t j = len + lane; j < t; j += 32) p[j] = 0.0f;
}

// ds = p * (ds - sum_j p ds) over the visible positions, zero after; one warp per row.
__global__ void CausalSoftmaxBackwardKernel(const float* att, float* ds, int64_t rows, int64_t t) {
  const int64_t row = blockIdx.x * int64_t{blockDim.x / 32} + threadIdx.x / 32;
  const int lane = threadIdx.x & 31;
  if (row >= rows) return;
  const float* p = att + row * t;
  float* d = ds + row * t;
  const int64_t len = row % t + 1;
  float dot = 0.0f;
  for (int64_t j = lane; j < len; j += 32) dot += p[j] * d[j];
  dot = WarpAllSum(dot);
  for (int64_t j = lane; j < len; j += 32) d[j] = p[j] * (d[j] - dot);
  for (int64_t j = len + lane; j < t; j += 32) d[j] = 0.0f;
}

__global__ void SoftmaxCrossEntropyInPlaceKernel(float* logits, const int32_t* targets,
                                                 float* losses, int64_t v) {
  __shared__ float shared[32];
  const int64_t row = blockIdx.x;
  float* z = logits + row * v;
  const int32_t target = targets[row];
  const bool valid = target >= 0 && target < v;
  const float zt = valid ? z[target] : NAN;  // read by every thread before any write
  float m = -INFINITY;
  for (int64_t j = threadIdx.x; j < v; j += blockDim.x) m = fmaxf(m, z[j]);
  m = BlockMax(m, shared);
  float sum = 0.0f;
  for (int64_t j = threadIdx.x; j < v; j += blockDim.x) sum += expf(z[j] - m);
  sum = BlockSum(sum, shared);
  const float inv = 1.0f / sum;
  for (int64_t j = threadIdx.x; j < v; j += blockDim.x) {
    z[j] = expf(z[j] - m) * inv - (j == target ? 1.0f : 0.0f);
  }
  if (threadIdx.x == 0) losses[row] = static_cast<float>(log(static_cast<double>(sum)) - (zt - m));
}

// One block: out (= or +=) the sum of in[i] (squared when `square`), in double, each thread
// over a fixed stride, then a fixed tree: the same order every run.
template <bool kSquare, bool kAccumulate>
__global__ void ReduceKernel(const float* in, int64_t count, double* out) {
  __shared__ double shared[32];
  double s = 0.0;
  for (int64_t i = threadIdx.x; i < count; i += blockDim.x) {
    const double x = in[i];
    s += kSquare ? x * x : x;
  }
  s = BlockSum(s, shared);
  if (threadIdx.x == 0) *out = kAccumulate ? *out + s : s;
}

__global__ void AdamWKernel(float* w, float* g, float* m, float* v, int64_t count, float lr,
                            float b1, float b2, float eps, float wd, float c1, float c2) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float gi = g[i];
    const float mi = b1 * m[i] + (1.0f - b1) * gi;
    const float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    const float mhat = mi / c1;
    const float vhat = vi / c2;
    w[i] -= lr * (mhat / (sqrtf(vhat) + eps) + wd * w[i]);
    g[i] = 0.0f;
  }
}

__global__ void ToBf16Kernel(const float* in, bf16* out, int64_t count) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count;
       i += int64_t{gridDim.x} * blockDim.x) {
    out[i] = __float2bfloat16_rn(in[i]);
  }
}

__global__ void ToFloatKernel(const bf16* in, float* out, int64_t count) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count;
       i += int64_t{gridDim.x} * blockDim.x) {
    out[i] = __bfloat162float(in[i]);
  }
}

template <typename T>
absl::Status AddBias(cudaStream_t stream, T* out, const float* b, int64_t n, int64_t oc) {
  if (b == nullptr || n == 0 || oc == 0) return absl::OkStatus();
  AddBiasKernel<T><<<Blocks(n * oc), kThreads, 0, stream>>>(out, b, n, oc);
  return LaunchStatus("AddBiasKernel<<<>>>");
}

template <typename T>
absl::Status ColumnSum(cudaStream_t stream, const T* dout, float* db, int64_t n, int64_t oc) {
  if (db == nullptr || oc == 0) return absl::OkStatus();
  ColumnSumKernel<T><<<ColumnTiles(oc), dim3(kTile, kTile), 0, stream>>>(dout, db, n, oc);
  return LaunchStatus("ColumnSumKernel<<<>>>");
}

}  // namespace

// ---- Linear.

absl::Status LinearForward(cublasHandle_t blas, cudaStream_t stream, const float* in,
                           const float* w, const float* b, float* out, int64_t n, int64_t c,
                           int64_t oc) {
  RETURN_IF_ERROR(CheckGemmDims("LinearForward", n, c, oc));
  RETURN_IF_ERROR(Sgemm(blas, stream, false, true, n, oc, c, 1.0f, in, c, w, c, 0.0f, out, oc));
  return AddBias(stream, out, b, n, oc);
}

absl::Status LinearBackward(cublasHandle_t blas, cudaStream_t stream, const float* dout,
                            const float* in, const float* w, float* din, float* dw, float* db,
                            int64_t n, int64_t c, int64_t oc) {
  RETURN_IF_ERROR(ScaledLinearBackward(blas, stream, dout, in, w, 1.0f, din, dw, n, c, oc));
  return ColumnSum(stream, dout, db, n, oc);
}

absl::Status ScaledLinearBackward(cublasHandle_t blas, cudaStream_t stream, const float* dout,
                                  const float* in, const float* w, float scale, float* din,
                                  float* dw, int64_t n, int64_t c, int64_t oc) {
  RETURN_IF_ERROR(CheckGemmDims("LinearBackward", n, c, oc));
  if (din != nullptr) {
    // din (N, C) += scale * dout (N, OC) * w (OC, C)
    RETURN_IF_ERROR(
        Sgemm(blas, stream, false, false, n, c, oc, scale, dout, oc, w, c, 1.0f, din, c));
  }
  if (dw != nullptr) {
    // dw (OC, C) += scale * dout^T (OC, N) * in (N, C)
    RETURN_IF_ERROR(
        Sgemm(blas, stream, true, false, oc, c, n, scale, dout, oc, in, c, 1.0f, dw, c));
  }
  return absl::OkStatus();
}

absl::Status LinearForward(cublasHandle_t blas, cudaStream_t stream, const bf16* in, const bf16* w,
                           const float* b, float* out, int64_t n, int64_t c, int64_t oc) {
  RETURN_IF_ERROR(CheckGemmDims("LinearForward(bf16)", n, c, oc));
  RETURN_IF_ERROR(
      GemmBf16(blas, stream, false, true, n, oc, c, 1.0f, in, c, w, c, 0.0f, out, CUDA_R_32F, oc));
  return AddBias(stream, out, b, n, oc);
}

absl::Status LinearForward(cublasHandle_t blas, cudaStream_t stream, const bf16* in, const bf16* w,
                           const float* b, bf16* out, int64_t n, int64_t c, int64_t oc) {
  RETURN_IF_ERROR(CheckGemmDims("LinearForward(bf16 out)", n, c, oc));
  RETURN_IF_ERROR(
      GemmBf16(blas, stream, false, true, n, oc, c, 1.0f, in, c, w, c, 0.0f, out, CUDA_R_16BF, oc));
  return AddBias(stream, out, b, n, oc);
}

absl::Status LinearBackward(cublasHandle_t blas, cudaStream_t stream, const bf16* dout,
                            const bf16* in, const bf16* w, float* din, float* dw, float* db,
                            int64_t n, int64_t c, int64_t oc) {
  RETURN_IF_ERROR(CheckGemmDims("LinearBackward(bf16)", n, c, oc));
  if (din != nullptr) {
    RETURN_IF_ERROR(GemmBf16(blas, stream, false, false, n, c, oc, 1.0f, dout, oc, w, c, 1.0f, din,
                             CUDA_R_32F, c));
  }
  if (dw != nullptr) {
    RETURN_IF_ERROR(GemmBf16(blas, stream, true, false, oc, c, n, 1.0f, dout, oc, in, c, 1.0f, dw,
                             CUDA_R_32F, c));
  }
  return ColumnSum(stream, dout, db, n, oc);
}

// ---- Elementwise and row kernels.

absl::Status LayerNormForward(cudaStream_t stream, const float* in, const float* gain,
                              const float* bias, float* out, float* mean, float* rstd, int64_t n,
                              int64_t c) {
  if (n < 0 || c < 1 || n > INT_MAX) {
    return absl::InvalidArgumentError(absl::StrCat("LayerNormForward: bad shape n=", n, " c=", c));
  }
  if (n == 0) return absl::OkStatus();
  LayerNormForwardKernel<<<static_cast<unsigned>(n), kThreads, 0, stream>>>(in, gain, bias, out,
                                                                            mean, rstd, c);
  return LaunchStatus("LayerNormForwardKernel<<<>>>");
}

absl::Status LayerNormBackward(cudaStream_t stream, const float* dout, const float* in,
                               const float* gain, const float* mean, const float* rstd, float* din,
                               float* dgain, float* dbias, int64_t n, int64_t c) {
  if (n < 0 || c < 1 || n > INT_MAX) {
    return absl::InvalidArgumentError(absl::StrCat("LayerNormBackward: bad shape n=", n, " c=", c));
  }
  if (n == 0) return absl::OkStatus();
  if ((dgain == nullptr) != (dbias == nullptr)) {
    return absl::InvalidArgumentError("LayerNormBackward: dgain and dbias must both be given");
  }
  if (din != nullptr) {
    LayerNormBackwardInputKernel<<<static_cast<unsigned>(n), kThreads, 0, stream>>>(
        dout, in, gain, mean, rstd, din, c);
    RETURN_IF_ERROR(LaunchStatus("LayerNormBackwardInputKernel<<<>>>"));
  }
  if (dgain == nullptr) return absl::OkStatus();
  LayerNormBackwardParamsKernel<<<ColumnTiles(c), dim3(kTile, kTile), 0, stream>>>(
      dout, in, mean, rstd, dgain, dbias, n, c);
  return LaunchStatus("LayerNormBackwardParamsKernel<<<>>>");
}

absl::Status GeluForward(cudaStream_t stream, const float* in, float* out, int64_t count) {
  RETURN_IF_ERROR(CheckCount("GeluForward", count));
  if (count == 0) return absl::OkStatus();
  GeluForwardKernel<<<Blocks(count), kThreads, 0, stream>>>(in, out, count);
  return LaunchStatus("GeluForwardKernel<<<>>>");
}

absl::Status GeluBackward(cudaStream_t stream, const float* in, const float* dout, float* din,
                          int64_t count) {
  RETURN_IF_ERROR(CheckCount("GeluBackward", count));
  if (count == 0) return absl::OkStatus();
  GeluBackwardKernel<<<Blocks(count), kThreads, 0, stream>>>(in, dout, din, count);
  return LaunchStatus("GeluBackwardKernel<<<>>>");
}

absl::Status Add(cudaStream_t stream, const float* a, const float* b, float* out, int64_t count) {
  RETURN_IF_ERROR(CheckCount("Add", count));
  if (count == 0) return absl::OkStatus();
  AddKernel<<<Blocks(count), kThreads, 0, stream>>>(a, b, out, count);
  return LaunchStatus("AddKernel<<<>>>");
}

// ---- Attention.

absl::Status CausalAttentionForward(cublasHandle_t blas, cudaStream_t stream, const float* qkv,
                                    float* att, float* out, int64_t b, int64_t t, int64_t c,
                                    int64_t nh) {
  RETURN_IF_ERROR(CheckAttention("CausalAttentionForward", b, t, c, nh));
  if (b == 0 || t == 0 || c == 0) return absl::OkStatus();
  const int64_t hd = c / nh;
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd)));
  const int64_t tt = t * t;
  for (int64_t bi = 0; bi < b; ++bi) {
    const float* q = qkv + bi * t * 3 * c;  // head h at + h * hd, (T, hd), ld 3C
    const float* k = q + c;
    const float* v = q + 2 * c;
    float* p = att + bi * nh * tt;  // (NH, T, T)
    // scores (T, T) = scale * q (T, hd) k^T (hd, T), per head
    RETURN_IF_ERROR(SgemmStridedBatched(blas, stream, false, true, t, t, hd, scale, q, 3 * c, hd, k,
                                        3 * c, hd, 0.0f, p, t, tt, nh));
    const int64_t rows = nh * t;
    const int64_t rows_per_block = kThreads / 32;
    CausalSoftmaxKernel<<<static_cast<unsigned>((rows + rows_per_block - 1) / rows_per_block),
                          kThreads, 0, stream>>>(p, rows, t);
    RETURN_IF_ERROR(LaunchStatus("CausalSoftmaxKernel<<<>>>"));
    if (out == nullptr) continue;  // the probabilities only (selective recomputation)
    float* y = out + bi * t * c;   // head h at + h * hd, (T, hd), ld C
    // y (T, hd) = p (T, T) v (T, hd), per head
    RETURN_IF_ERROR(SgemmStridedBatched(blas, stream, false, false, t, hd, t, 1.0f, p, t, tt, v,
                                        3 * c, hd, 0.0f, y, c, hd, nh));
  }
  return absl::OkStatus();
}

absl::Status CausalAttentionBackward(cublasHandle_t blas, cudaStream_t stream, const float* dout,
                                     const float* qkv, const float* att, float* dqkv,
                                     float* scratch, int64_t b, int64_t t, int64_t c, int64_t nh) {
  RETURN_IF_ERROR(CheckAttention("CausalAttentionBackward", b, t, c, nh));
  if (b == 0 || t == 0 || c == 0) return absl::OkStatus();
  const int64_t hd = c / nh;
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd)));
  const int64_t tt = t * t, c3 = 3 * c;
  for (int64_t bi = 0; bi < b; ++bi) {
    const float* q = qkv + bi * t * c3;
    const float* k = q + c;
    const float* v = q + 2 * c;
    float* dq = dqkv + bi * t * c3;
    float* dk = dq + c;
    float* dv = dq + 2 * c;
    const float* dy = dout + bi * t * c;
    const float* p = att + bi * nh * tt;
    float* ds = scratch;  // (NH, T, T)
    // d att (T, T) = dy (T, hd) v^T
    RETURN_IF_ERROR(SgemmStridedBatched(blas, stream, false, true, t, t, hd, 1.0f, dy, c, hd, v, c3,
                                        hd, 0.0f, ds, t, tt, nh));
    const int64_t rows = nh * t;
    const int64_t rows_per_block = kThreads / 32;
    CausalSoftmaxBackwardKernel<<<
        static_cast<unsigned>((rows + rows_per_block - 1) / rows_per_block), kThreads, 0, stream>>>(
        p, ds, rows, t);
    RETURN_IF_ERROR(LaunchStatus("CausalSoftmaxBackwardKernel<<<>>>"));
    // dq (T, hd) += scale ds (T, T) k (T, hd)
    RETURN_IF_ERROR(SgemmStridedBatched(blas, stream, false, false, t, hd, t, scale, ds, t, tt, k,
                                        c3, hd, 1.0f, dq, c3, hd, nh));
    // dv (T, hd) += p^T (T, T) dy (T, hd)
    RETURN_IF_ERROR(SgemmStridedBatched(blas, stream, true, false, t, hd, t, 1.0f, p, t, tt, dy, c,
                                        hd, 1.0f, dv, c3, hd, nh));
    // dk (T, hd) += scale ds^T (T, T) q (T, hd)
    RETURN_IF_ERROR(SgemmStridedBatched(blas, stream, true, false, t, hd, t, scale, ds, t, tt, q,
                                        c3, hd, 1.0f, dk, c3, hd, nh));
  }
  return absl::OkStatus();
}

namespace {

absl::Status CheckGqa(const char* what, int64_t b, int64_t t, int64_t nh, int64_t kv, int64_t hd) {
  if (b < 0 || t < 0 || hd < 1 || nh < 1 || kv < 1 || nh % kv != 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": bad shape b=", b, " t=", t, " nh=", nh,
                                                   " kv=", kv, " hd=", hd,
                                                   " (need kv >= 1 dividing nh >= 1, hd >= 1)"));
  }
  if (nh * hd > INT_MAX || t * t > INT_MAX || t > INT_MAX) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": shape t=", t, " nh=", nh, " hd=", hd, " exceeds cuBLAS's int range"));
  }
  return absl::OkStatus();
}

}  // namespace

// In both passes, per sequence and per r in [0, group): the query heads h = g * group + r of
// every kv head g form one strided batch of KV GEMMs (h's q columns are group * hd apart, g's
// k / v columns hd apart, h's (T, T) probabilities group * T * T apart).
absl::Status GqaCausalAttentionForward(cublasHandle_t blas, cudaStream_t stream, const float* q,
                                       const float* k, const float* v, float* att, float* out,
                                       int64_t b, int64_t t, int64_t nh, int64_t kv, int64_t hd) {
  RETURN_IF_ERROR(CheckGqa("GqaCausalAttentionForward", b, t, nh, kv, hd));
  if (b == 0 || t == 0) return absl::OkStatus();
  const int64_t group = nh / kv, qd = nh * hd, kd = kv * hd, tt = t * t;
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd)));
  for (int64_t bi = 0; bi < b; ++bi) {
    const float* qb = q + bi * t * qd;  // head h at + h * hd, (T, hd), ld NH*hd
    const float* kb = k + bi * t * kd;  // kv head g at + g * hd, (T, hd), ld KV*hd
    const float* vb = v + bi * t * kd;
    float* p = att + bi * nh * tt;  // (NH, T, T)
    for (int64_t r = 0; r < group; ++r) {
      // scores (T, T) = scale * q_h (T, hd) k_g^T (hd, T)
      RETURN_IF_ERROR(SgemmStridedBatched(blas, stream, false, true, t, t, hd, scale, qb + r * hd,
                                          qd, group * hd, kb, kd, hd, 0.0f, p + r * tt, t,
                                          group * tt, kv));
    }
    const int64_t rows = nh * t;
    const int64_t rows_per_block = kThreads / 32;
    CausalSoftmaxKernel<<<static_cast<unsigned>((rows + rows_per_block - 1) / rows_per_block),
                          kThreads, 0, stream>>>(p, rows, t);
    RETURN_IF_ERROR(LaunchStatus("CausalSoftmaxKernel<<<>>>"));
    if (out == nullptr) continue;  // the probabilities only (selective recomputation)
    float* y = out + bi * t * qd;
    for (int64_t r = 0; r < group; ++r) {
      // y_h (T, hd) = p_h (T, T) v_g (T, hd)
      RETURN_IF_ERROR(SgemmStridedBatched(blas, stream, false, false, t, hd, t, 1.0f, p + r * tt, t,
                                          group * tt, vb, kd, hd, 0.0f, y + r * hd, qd, group * hd,
                                          kv));
    }
  }
  return absl::OkStatus();
}

absl::Status GqaCausalAttentionBackward(cublasHandle_t blas, cudaStream_t stream, const float* dout,
                                        const float* q, const float* k, const float* v,
                                        const float* att, float* dq, float* dk, float* dv,
                                        float* scratch, int64_t b, int64_t t, int64_t nh,
                                        int64_t kv, int64_t hd) {
  RETURN_IF_ERROR(CheckGqa("GqaCausalAttentionBackward", b, t, nh, kv, hd));
  if (b == 0 || t == 0) return absl::OkStatus();
  const int64_t group = nh / kv, qd = nh * hd, kd = kv * hd, tt = t * t;
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd)));
  for (int64_t bi = 0; bi < b; ++bi) {
    const float* qb = q + bi * t * qd;
    const float* kb = k + bi * t * kd;
    const float* vb = v + bi * t * kd;
    const float* dy = dout + bi * t * qd;
    float* dqb = dq + bi * t * qd;
    float* dkb = dk + bi * t * kd;
    float* dvb = dv + bi * t * kd;
    const float* p = att + bi * nh * tt;
    float* ds = scratch;  // (NH, T, T)
    for (int64_t r = 0; r < group; ++r) {
      // d att_h (T, T) = dy_h (T, hd) v_g^T
      RETURN_IF_ERROR(SgemmStridedBatched(blas, stream, false, true, t, t, hd, 1.0f, dy + r * hd,
                                          qd, group * hd, vb, kd, hd, 0.0f, ds + r * tt, t,
                                          group * tt, kv));
    }
    const int64_t rows = nh * t;
    const int64_t rows_per_block = kThreads / 32;
    CausalSoftmaxBackwardKernel<<<
        static_cast<unsigned>((rows + rows_per_block - 1) / rows_per_block), kThreads, 0, stream>>>(
        p, ds, rows, t);
    RETURN_IF_ERROR(LaunchStatus("CausalSoftmaxBackwardKernel<<<>>>"));
    // Query head by query head of each group (r in order), so each kv head's sums run in head
    // order.
    for (int64_t r = 0; r < group; ++r) {
      // dq_h (T, hd) += scale ds_h (T, T) k_g (T, hd)
      RETURN_IF_ERROR(SgemmStridedBatched(blas, stream, false, false, t, hd, t, scale, ds + r * tt,
                                          t, group * tt, kb, kd, hd, 1.0f, dqb + r * hd, qd,
                                          group * hd, kv));
      // dv_g (T, hd) += p_h^T (T, T) dy_h (T, hd)
      RETURN_IF_ERROR(SgemmStridedBatched(blas, stream, true, false, t, hd, t, 1.0f, p + r * tt, t,
                                          group * tt, dy + r * hd, qd, group * hd, 1.0f, dvb, kd,
                                          hd, kv));
      // dk_g (T, hd) += scale ds_h^T (T, T) q_h (T, hd)
      RETURN_IF_ERROR(SgemmStridedBatched(blas, stream, true, false, t, hd, t, scale, ds + r * tt,
                                          t, group * tt, qb + r * hd, qd, group * hd, 1.0f, dkb, kd,
                                          hd, kv));
    }
  }
  return absl::OkStatus();
}

// ---- Loss.

absl::Status SoftmaxCrossEntropyInPlace(cudaStream_t stream, float* logits, const int32_t* targets,
                                        float* losses, double* loss_sum, int64_t n, int64_t v) {
  if (n < 0 || v < 1 || n > INT_MAX) {
    return absl::InvalidArgumentError(
        absl::StrCat("SoftmaxCrossEntropyInPlace: bad shape n=", n, " v=", v));
  }
  if (n > 0) {
    SoftmaxCrossEntropyInPlaceKernel<<<static_cast<unsigned>(n), kThreads, 0, stream>>>(
        logits, targets, losses, v);
    RETURN_IF_ERROR(LaunchStatus("SoftmaxCrossEntropyInPlaceKernel<<<>>>"));
  }
  ReduceKernel<false, false><<<1, kReduceThreads, 0, stream>>>(losses, n, loss_sum);
  return LaunchStatus("ReduceKernel<<<>>>");
}

// ---- Optimizer.

absl::Status AdamWStep(cudaStream_t stream, float* w, float* g, float* m, float* v, int64_t count,
                       const AdamWHyper& hyper, bool decay, int64_t step) {
  RETURN_IF_ERROR(CheckCount("AdamWStep", count));
  if (step < 1) {
    return absl::InvalidArgumentError(absl::StrCat("AdamWStep: step ", step, " < 1"));
  }
  if (count == 0) return absl::OkStatus();
  // As worker/model/optimizer.cc: the corrections in double, then rounded to float.
  const float c1 = 1.0f - static_cast<float>(std::pow(static_cast<double>(hyper.beta1), step));
  const float c2 = 1.0f - static_cast<float>(std::pow(static_cast<double>(hyper.beta2), step));
  const float wd = decay ? hyper.weight_decay : 0.0f;
  AdamWKernel<<<Blocks(count), kThreads, 0, stream>>>(w, g, m, v, count, hyper.lr, hyper.beta1,
                                                      hyper.beta2, hyper.eps, wd, c1, c2);
  return LaunchStatus("AdamWKernel<<<>>>");
}

absl::Status GradSquaredNorm(cudaStream_t stream, const float* g, int64_t count, double* sum_sq) {
  RETURN_IF_ERROR(CheckCount("GradSquaredNorm", count));
  ReduceKernel<true, true><<<1, kReduceThreads, 0, stream>>>(g, count, sum_sq);
  return LaunchStatus("ReduceKernel<<<>>>");
}

// ---- Conversions.

absl::Status ConvertToBf16(cudaStream_t stream, const float* in, bf16* out, int64_t count) {
  RETURN_IF_ERROR(CheckCount("ConvertToBf16", count));
  if (count == 0) return absl::OkStatus();
  ToBf16Kernel<<<Blocks(count), kThreads, 0, stream>>>(in, out, count);
  return LaunchStatus("ToBf16Kernel<<<>>>");
}

absl::Status ConvertToFloat(cudaStream_t stream, const bf16* in, float* out, int64_t count) {
  RETURN_IF_ERROR(CheckCount("ConvertToFloat", count));
  if (count == 0) return absl::OkStatus();
  ToFloatKernel<<<Blocks(count), kThreads, 0, stream>>>(in, out, count);
  return LaunchStatus("ToFloatKernel<<<>>>");
}

}  // namespace tandem::worker::cuda
