#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/backend/cuda/cuda_status.h"
#include "worker/backend/cuda/gpu_gpt_kernels.h"

namespace tandem::worker::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 65535;

unsigned Blocks(int64_t count) {
  const int64_t blocks = (count + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 1 ? 1 : (blocks < kMaxBlocks ? blocks : kMaxBlocks));
}

absl::Status LaunchStatus(const char* kernel) {
  if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) {
    return CudaError(e, kernel, __FILE__, __LINE__);
  }
  return absl::OkStatus();
}

absl::Status CheckShape(const char* what, int64_t b, int64_t t, int64_t c) {
  if (b < 0 || t < 0 || c < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": negative shape b=", b, " t=", t, " c=", c));
  }
  return absl::OkStatus();
}

// Grid-stride over the B*T*C outputs.
__global__ void EmbeddingForwardKernel(const int32_t* tokens, const float* wte, const float* wpe,
                                       float* out, int64_t t, int64_t c, int64_t total) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t row = i / c, j = i % c;
    const float e = wte[int64_t{tokens[row]} * c + j];
    out[i] = wpe == nullptr ? e : e + wpe[(row % t) * c + j];
  }
}

// One thread per (t, j) of wpe: the batch summed in order.
__global__ void PositionGradKernel(const float* dout, float* dwpe, int64_t b, int64_t t,
                                   int64_t c) {
  const int64_t tc = t * c;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < tc;
       i += int64_t{gridDim.x} * blockDim.x) {
    float s = 0.0f;
    for (int64_t bi = 0; bi < b; ++bi) s += dout[bi * tc + i];
    dwpe[i] += s;
  }
}

__global__ void TokenGradKernel(const int32_t* tokens, const float* dout, float* dwte, int64_t c,
                                int64_t total) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t row = i / c, j = i % c;
    atomicAdd(dwte + int64_t{tokens[row]} * c + j, dout[i]);
  }
}

__global__ void ScaledToBf16Kernel(const float* in, float scale, bf16* out, int64_t count) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count;
       i += int64_t{gridDim.x} * blockDim.x) {
    out[i] = __float2bfloat16_rn(scale * in[i]);
  }
}

}  // namespace

absl::Status EmbeddingForward(cudaStream_t stream, const int32_t* tokens, const float* wte,
                              const float* wpe, float* out, int64_t b, int64_t t, int64_t c) {
  RETURN_IF_ERROR(CheckShape("EmbeddingForward", b, t, c));
  const int64_t total = b * t * c;
  if (total == 0) return absl::OkStatus();
  EmbeddingForwardKernel<<<Blocks(total), kThreads, 0, stream>>>(tokens, wte, wpe, out, t, c,
                                                                 total);
  return LaunchStatus("EmbeddingForwardKernel<<<>>>");
}

absl::Status EmbeddingBackward(cudaStream_t stream, const int32_t* tokens, const float* dout,
                               float* dwte, float* dwpe, int64_t b, int64_t t, int64_t c) {
  RETURN_IF_ERROR(CheckShape("EmbeddingBackward", b, t, c));
  const int64_t total = b * t * c;
  if (total == 0) return absl::OkStatus();
  if (dwpe != nullptr) {
    PositionGradKernel<<<Blocks(t * c), kThreads, 0, stream>>>(dout, dwpe, b, t, c);
    RETURN_IF_ERROR(LaunchStatus("PositionGradKernel<<<>>>"));
  }
  TokenGradKernel<<<Blocks(total), kThreads, 0, stream>>>(tokens, dout, dwte, c, total);
  return LaunchStatus("TokenGradKernel<<<>>>");
}

absl::Status ScaledConvertToBf16(cudaStream_t stream, const float* in, float scale, bf16* out,
                                 int64_t count) {
  if (count < 0) {
    return absl::InvalidArgumentError(absl::StrCat("ScaledConvertToBf16: count ", count, " < 0"));
  }
  if (count == 0) return absl::OkStatus();
  ScaledToBf16Kernel<<<Blocks(count), kThreads, 0, stream>>>(in, scale, out, count);
  return LaunchStatus("ScaledToBf16Kernel<<<>>>");
}

}  // namespace tandem::worker::cuda
