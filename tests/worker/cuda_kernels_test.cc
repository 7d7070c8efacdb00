// Conformance of the CUDA kernels (worker/backend/cuda/cuda_kernels.h) to the CPU reference
// kernels (worker/model/kernels.h) and AdamW (worker/model/optimizer.h): the same random inputs
// through both, outputs compared.
//
// Tolerances:
//  - fp32 kernels: every element within kFp32Tol * max(1, |ref|) of the reference, with
//    kFp32Tol = 1e-4 (cuBLAS and the CPU sum in different orders; GELU and softmax use the
//    device's tanhf/expf).
//  - bf16 GEMMs (bf16 operands, fp32 accumulation), against the fp32 reference on the unrounded
//    inputs: max |got - ref| <= kBf16Tol * max |ref| over the output, with kBf16Tol = 2e-2
//    (each operand carries a relative rounding error of at most 2^-8, bf16's unit roundoff).
//  - bf16 conversions: |bf16(x) - x| <= 2^-8 |x| (round to nearest: half an ulp of an 8-bit
//    significand).
// The status-macro, argument-check and no-device tests need no GPU and always run; every other test
// skips with "no CUDA device: <status>" when CudaAvailable() fails.
#include "worker/backend/cuda/cuda_kernels.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "worker/backend/cuda/cuda_handles.h"
#include "worker/backend/cuda/cuda_status.h"
#include "worker/backend/cuda/device.h"
#include "worker/backend/cuda/device_buffer.h"
#include "worker/backend/cuda/gemm_peak.h"
#include "worker/model/kernels.h"
#include "worker/model/optimizer.h"

namespace tandem::worker::cuda {
namespace {

constexpr float kFp32Tol = 1e-4f;
constexpr float kBf16Tol = 2e-2f;

// ---- Status macros: no GPU needed.

cudaError_t FakeCuda(cudaError_t e) { return e; }
cublasStatus_t FakeCublas(cublasStatus_t s) { return s; }
ncclResult_t FakeNccl(ncclResult_t r) { return r; }

absl::Status CudaCall(cudaError_t e, int* line) {
  *line = __LINE__ + 1;
  TANDEM_CUDA_RETURN_IF_ERROR(FakeCuda(e));
  return absl::OkStatus();
}

absl::Status CublasCall(cublasStatus_t s, int* line) {
  *line = __LINE__ + 1;
  TANDEM_CUBLAS_RETURN_IF_ERROR(FakeCublas(s));
  return absl::OkStatus();
}

// The macros also work in a function returning StatusOr.
absl::StatusOr<int> NcclCall(ncclResult_t r, int* line) {
  *line = __LINE__ + 1;
  TANDEM_NCCL_RETURN_IF_ERROR(FakeNccl(r));
  return 7;
}

void ExpectNames(const absl::Status& s, const std::string& call, const std::string& error,
                 int line) {
  const std::string msg(s.message());
  EXPECT_NE(msg.find(call), std::string::npos) << msg;
  EXPECT_NE(msg.find(error), std::string::npos) << msg;
  EXPECT_NE(msg.find(absl::StrCat("cuda_kernels_test.cc:", line)), std::string::npos) << msg;
}

TEST(CudaStatusTest, CudaMacroNamesCallErrorFileAndLine) {
  int line = 0;
  EXPECT_TRUE(CudaCall(cudaSuccess, &line).ok());
  const absl::Status s = CudaCall(cudaErrorMemoryAllocation, &line);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  ExpectNames(s, "FakeCuda(e)", "cudaErrorMemoryAllocation", line);
  EXPECT_EQ(CudaCall(cudaErrorInsufficientDriver, &line).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(CudaCall(cudaErrorInvalidValue, &line).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CudaCall(cudaErrorLaunchFailure, &line).code(), absl::StatusCode::kInternal);
}

TEST(CudaStatusTest, CublasMacroNamesCallErrorFileAndLine) {
  int line = 0;
  EXPECT_TRUE(CublasCall(CUBLAS_STATUS_SUCCESS, &line).ok());
  const absl::Status s = CublasCall(CUBLAS_STATUS_INVALID_VALUE, &line);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  ExpectNames(s, "FakeCublas(s)", "CUBLAS_STATUS_INVALID_VALUE", line);
  EXPECT_EQ(CublasCall(CUBLAS_STATUS_NOT_INITIALIZED, &line).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(CublasCall(CUBLAS_STATUS_ALLOC_FAILED, &line).code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(CublasCall(CUBLAS_STATUS_EXECUTION_FAILED, &line).code(), absl::StatusCode::kInternal);
}

TEST(CudaStatusTest, NcclMacroNamesCallErrorFileAndLine) {
  int line = 0;
  absl::StatusOr<int> ok = NcclCall(ncclSuccess, &line);
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(*ok, 7);
  const absl::StatusOr<int> r = NcclCall(ncclInvalidUsage, &line);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  ExpectNames(r.status(), "FakeNccl(r)", ncclGetErrorString(ncclInvalidUsage), line);
  EXPECT_EQ(NcclCall(ncclRemoteError, &line).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(NcclCall(ncclUnhandledCudaError, &line).status().code(), absl::StatusCode::kInternal);
}

// Runs everywhere: with a device the count is positive; without one the answer is a clear
// FAILED_PRECONDITION naming the runtime call (here: no driver, cudaErrorInsufficientDriver).
TEST(CudaStatusTest, DeviceCountIsAnswerOrClearError) {
  const absl::StatusOr<int> count = CudaDeviceCount();
  if (count.ok()) {
    EXPECT_GE(*count, 0);
    EXPECT_EQ(CudaAvailable().ok(), *count > 0);
  } else {
    EXPECT_EQ(count.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(count.status().message().find("cudaGetDeviceCount"), std::string::npos)
        << count.status();
    EXPECT_FALSE(CudaAvailable().ok());
  }
}

// Without a device, allocations and handles fail with a Status (no crash); an empty buffer
// needs no device at all.
TEST(CudaStatusTest, BuffersAndHandlesFailCleanlyWithoutDevice) {
  absl::StatusOr<DeviceBuffer<float>> empty = DeviceBuffer<float>::Create(0);
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_EQ(empty->size(), 0u);
  if (CudaAvailable().ok()) GTEST_SKIP() << "a CUDA device is present; nothing fails here";
  absl::StatusOr<DeviceBuffer<float>> buffer = DeviceBuffer<float>::Create(16);
  EXPECT_FALSE(buffer.ok());
  EXPECT_NE(buffer.status().message().find("cudaMalloc"), std::string::npos) << buffer.status();
  absl::StatusOr<CudaStream> stream = CudaStream::Create();
  EXPECT_FALSE(stream.ok());
  absl::StatusOr<CublasHandle> blas = CublasHandle::Create(nullptr);
  EXPECT_FALSE(blas.ok());
  EXPECT_NE(blas.status().message().find("cublasCreate"), std::string::npos) << blas.status();
}

// Shapes are checked before anything touches a device, so this runs without one.
TEST(CudaKernelsArgsTest, BadShapesAreInvalidArgument) {
  EXPECT_EQ(GeluForward(nullptr, nullptr, nullptr, -1).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(LinearForward(nullptr, nullptr, static_cast<const float*>(nullptr), nullptr, nullptr,
                          static_cast<float*>(nullptr), -1, 2, 3)
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      LayerNormForward(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 4, 0).code(),
      absl::StatusCode::kInvalidArgument);
}

TEST(CudaKernelsArgsTest, AttentionHeadsMustDivideChannels) {
  const absl::Status s =
      CausalAttentionForward(nullptr, nullptr, nullptr, nullptr, nullptr, 1, 4, 50, 4);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("nh=4"), std::string::npos) << s;
}

// ---- Kernel conformance: needs a device.

std::vector<float> Random(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// Every element within tol * max(1, |ref|).
void ExpectClose(const std::vector<float>& ref, const std::vector<float>& got, float tol,
                 const std::string& what) {
  ASSERT_EQ(ref.size(), got.size()) << what;
  double worst = 0.0;
  size_t worst_i = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double excess = std::abs(static_cast<double>(got[i]) - ref[i]) /
                          std::max(1.0, std::abs(static_cast<double>(ref[i])));
    if (!(excess <= worst)) {  // also catches NaN
      worst = std::isnan(excess) ? INFINITY : excess;
      worst_i = i;
    }
  }
  EXPECT_LE(worst, tol) << what << ": element " << worst_i << " ref " << ref[worst_i] << " got "
                        << got[worst_i];
}

// max |got - ref| <= tol * max |ref|.
void ExpectCloseRelativeToMax(const std::vector<float>& ref, const std::vector<float>& got,
                              float tol, const std::string& what) {
  ASSERT_EQ(ref.size(), got.size()) << what;
  double max_ref = 0.0, max_err = 0.0;
  for (size_t i = 0; i < ref.size(); ++i) {
    max_ref = std::max(max_ref, std::abs(static_cast<double>(ref[i])));
    const double err = std::abs(static_cast<double>(got[i]) - ref[i]);
    max_err = std::isnan(err) ? INFINITY : std::max(max_err, err);
  }
  EXPECT_LE(max_err, tol * max_ref)
      << what << ": max error " << max_err << ", max |ref| " << max_ref;
}

class CudaKernelsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (absl::Status s = CudaAvailable(); !s.ok()) GTEST_SKIP() << "no CUDA device: " << s;
    absl::StatusOr<CudaStream> stream = CudaStream::Create();
    ASSERT_TRUE(stream.ok()) << stream.status();
    stream_ = *std::move(stream);
    absl::StatusOr<CublasHandle> blas = CublasHandle::Create(stream_.get());
    ASSERT_TRUE(blas.ok()) << blas.status();
    blas_ = *std::move(blas);
  }

  template <typename T>
  DeviceBuffer<T> Dev(const std::vector<T>& host) {
    absl::StatusOr<DeviceBuffer<T>> b = DeviceBuffer<T>::FromHost(host.data(), host.size());
    EXPECT_TRUE(b.ok()) << b.status();
    return b.ok() ? *std::move(b) : DeviceBuffer<T>();
  }
  template <typename T>
  std::vector<T> Host(const DeviceBuffer<T>& b) {
    EXPECT_TRUE(stream_.Synchronize().ok());
    std::vector<T> host(b.size());
    EXPECT_TRUE(b.CopyToHost(host.data(), host.size()).ok());
    return host;
  }
  DeviceBuffer<bf16> ToBf16(const DeviceBuffer<float>& f) {
    absl::StatusOr<DeviceBuffer<bf16>> b = DeviceBuffer<bf16>::Create(f.size());
    EXPECT_TRUE(b.ok()) << b.status();
    EXPECT_TRUE(ConvertToBf16(stream_.get(), f.data(), b->data(), f.size()).ok());
    return *std::move(b);
  }
  std::vector<float> HostFromBf16(const DeviceBuffer<bf16>& b) {
    DeviceBuffer<float> f = Dev(std::vector<float>(b.size()));
    EXPECT_TRUE(ConvertToFloat(stream_.get(), b.data(), f.data(), b.size()).ok());
    return Host(f);
  }

  CudaStream stream_;
  CublasHandle blas_;
};

constexpr int64_t kN = 37, kC = 64, kOC = 48;  // odd row count: no tile divides it

TEST_F(CudaKernelsTest, LinearForwardMatchesCpu) {
  const auto in = Random(kN * kC, 1), w = Random(kOC * kC, 2), b = Random(kOC, 3);
  for (bool with_bias : {true, false}) {
    std::vector<float> ref(kN * kOC);
    kernels::LinearForward(in.data(), w.data(), with_bias ? b.data() : nullptr, ref.data(), kN, kC,
                           kOC);
    auto din = Dev(in), dw = Dev(w), db = Dev(b), dout = Dev(std::vector<float>(kN * kOC, 9.0f));
    ASSERT_TRUE(LinearForward(blas_.get(), stream_.get(), din.data(), dw.data(),
                              with_bias ? db.data() : nullptr, dout.data(), kN, kC, kOC)
                    .ok());
    ExpectClose(ref, Host(dout), kFp32Tol, with_bias ? "out (bias)" : "out (no bias)");
  }
}

TEST_F(CudaKernelsTest, LinearBackwardAddsLikeCpu) {
  const auto dout = Random(kN * kOC, 4), in = Random(kN * kC, 5), w = Random(kOC * kC, 6);
  // Non-zero starting gradients: the kernels add.
  auto din = Random(kN * kC, 7), dw = Random(kOC * kC, 8), db = Random(kOC, 9);
  auto g_dout = Dev(dout), g_in = Dev(in), g_w = Dev(w);
  auto g_din = Dev(din), g_dw = Dev(dw), g_db = Dev(db);
  kernels::LinearBackward(dout.data(), in.data(), w.data(), din.data(), dw.data(), db.data(), kN,
                          kC, kOC);
  ASSERT_TRUE(LinearBackward(blas_.get(), stream_.get(), g_dout.data(), g_in.data(), g_w.data(),
                             g_din.data(), g_dw.data(), g_db.data(), kN, kC, kOC)
                  .ok());
  ExpectClose(din, Host(g_din), kFp32Tol, "din");
  ExpectClose(dw, Host(g_dw), kFp32Tol, "dw");
  ExpectClose(db, Host(g_db), kFp32Tol, "db");

  // Scaled, din only (dw null).
  kernels::ScaledLinearBackward(dout.data(), in.data(), w.data(), 0.25f, din.data(), nullptr, kN,
                                kC, kOC);
  ASSERT_TRUE(ScaledLinearBackward(blas_.get(), stream_.get(), g_dout.data(), g_in.data(),
                                   g_w.data(), 0.25f, g_din.data(), nullptr, kN, kC, kOC)
                  .ok());
  ExpectClose(din, Host(g_din), kFp32Tol, "scaled din");
  ExpectClose(dw, Host(g_dw), kFp32Tol, "dw untouched");
}

TEST_F(CudaKernelsTest, Bf16LinearWithinBf16Tolerance) {
  const auto in = Random(kN * kC, 11), w = Random(kOC * kC, 12), b = Random(kOC, 13);
  auto f_in = Dev(in), f_w = Dev(w), f_b = Dev(b);
  DeviceBuffer<bf16> h_in = ToBf16(f_in), h_w = ToBf16(f_w);

  std::vector<float> ref(kN * kOC);
  kernels::LinearForward(in.data(), w.data(), b.data(), ref.data(), kN, kC, kOC);
  auto out32 = Dev(std::vector<float>(kN * kOC));
  ASSERT_TRUE(LinearForward(blas_.get(), stream_.get(), h_in.data(), h_w.data(), f_b.data(),
                            out32.data(), kN, kC, kOC)
                  .ok());
  ExpectCloseRelativeToMax(ref, Host(out32), kBf16Tol, "bf16 -> fp32 out");
  absl::StatusOr<DeviceBuffer<bf16>> out16 = DeviceBuffer<bf16>::Create(kN * kOC);
  ASSERT_TRUE(out16.ok());
  ASSERT_TRUE(LinearForward(blas_.get(), stream_.get(), h_in.data(), h_w.data(), f_b.data(),
                            out16->data(), kN, kC, kOC)
                  .ok());
  ExpectCloseRelativeToMax(ref, HostFromBf16(*out16), kBf16Tol, "bf16 -> bf16 out");

  const auto dout = Random(kN * kOC, 14);
  auto din = Random(kN * kC, 15), dw = Random(kOC * kC, 16), db = Random(kOC, 17);
  auto g_din = Dev(din), g_dw = Dev(dw), g_db = Dev(db), f_dout = Dev(dout);
  DeviceBuffer<bf16> h_dout = ToBf16(f_dout);
  kernels::LinearBackward(dout.data(), in.data(), w.data(), din.data(), dw.data(), db.data(), kN,
                          kC, kOC);
  ASSERT_TRUE(LinearBackward(blas_.get(), stream_.get(), h_dout.data(), h_in.data(), h_w.data(),
                             g_din.data(), g_dw.data(), g_db.data(), kN, kC, kOC)
                  .ok());
  ExpectCloseRelativeToMax(din, Host(g_din), kBf16Tol, "bf16 din");
  ExpectCloseRelativeToMax(dw, Host(g_dw), kBf16Tol, "bf16 dw");
  ExpectCloseRelativeToMax(db, Host(g_db), kBf16Tol, "bf16 db");
}

TEST_F(CudaKernelsTest, Bf16ConversionRoundsToNearest) {
  std::vector<float> x = Random(1000, 18, -100.0f, 100.0f);
  x.push_back(0.0f);
  x.push_back(1.0f);
  auto f = Dev(x);
  const std::vector<float> rt = HostFromBf16(ToBf16(f));
  for (size_t i = 0; i < x.size(); ++i) {
    EXPECT_LE(std::abs(rt[i] - x[i]), std::ldexp(std::abs(x[i]), -8)) << i << ": " << x[i];
  }
  EXPECT_EQ(rt[x.size() - 1], 1.0f);
}

TEST_F(CudaKernelsTest, LayerNormMatchesCpu) {
  const int64_t n = 19, c = 300;  // c not a multiple of the block size
  const auto in = Random(n * c, 21, -2.0f, 3.0f), gain = Random(c, 22), bias = Random(c, 23);
  std::vector<float> out(n * c), mean(n), rstd(n);
  kernels::LayerNormForward(in.data(), gain.data(), bias.data(), out.data(), mean.data(),
                            rstd.data(), n, c);
  auto g_in = Dev(in), g_gain = Dev(gain), g_bias = Dev(bias);
  auto g_out = Dev(std::vector<float>(n * c)), g_mean = Dev(std::vector<float>(n)),
       g_rstd = Dev(std::vector<float>(n));
  ASSERT_TRUE(LayerNormForward(stream_.get(), g_in.data(), g_gain.data(), g_bias.data(),
                               g_out.data(), g_mean.data(), g_rstd.data(), n, c)
                  .ok());
  ExpectClose(out, Host(g_out), kFp32Tol, "out");
  ExpectClose(mean, Host(g_mean), kFp32Tol, "mean");
  ExpectClose(rstd, Host(g_rstd), kFp32Tol, "rstd");

  const auto dout = Random(n * c, 24);
  auto din = Random(n * c, 25), dgain = Random(c, 26), dbias = Random(c, 27);
  auto g_dout = Dev(dout), g_din = Dev(din), g_dgain = Dev(dgain), g_dbias = Dev(dbias);
  kernels::LayerNormBackward(dout.data(), in.data(), gain.data(), mean.data(), rstd.data(),
                             din.data(), dgain.data(), dbias.data(), n, c);
  ASSERT_TRUE(LayerNormBackward(stream_.get(), g_dout.data(), g_in.data(), g_gain.data(),
                                g_mean.data(), g_rstd.data(), g_din.data(), g_dgain.data(),
                                g_dbias.data(), n, c)
                  .ok());
  ExpectClose(din, Host(g_din), kFp32Tol, "din");
  ExpectClose(dgain, Host(g_dgain), kFp32Tol, "dgain");
  ExpectClose(dbias, Host(g_dbias), kFp32Tol, "dbias");
}

TEST_F(CudaKernelsTest, GeluAndAddMatchCpu) {
  const int64_t count = 10007;
  const auto in = Random(count, 31, -6.0f, 6.0f), dout = Random(count, 32);
  auto din = Random(count, 33);
  std::vector<float> out(count);
  kernels::GeluForward(in.data(), out.data(), count);
  auto g_in = Dev(in), g_out = Dev(std::vector<float>(count)), g_dout = Dev(dout), g_din = Dev(din);
  ASSERT_TRUE(GeluForward(stream_.get(), g_in.data(), g_out.data(), count).ok());
  ExpectClose(out, Host(g_out), kFp32Tol, "gelu out");
  kernels::GeluBackward(in.data(), dout.data(), din.data(), count);
  ASSERT_TRUE(GeluBackward(stream_.get(), g_in.data(), g_dout.data(), g_din.data(), count).ok());
  ExpectClose(din, Host(g_din), kFp32Tol, "gelu din");

  std::vector<float> sum(count);
  kernels::Add(in.data(), dout.data(), sum.data(), count);
  ASSERT_TRUE(Add(stream_.get(), g_in.data(), g_dout.data(), g_in.data(), count).ok());  // aliased
  ExpectClose(sum, Host(g_in), kFp32Tol, "add");
}

TEST_F(CudaKernelsTest, CausalAttentionMatchesCpu) {
  const int64_t b = 2, t = 70, c = 48, nh = 4;  // t spans two of the CPU kernel's tiles
  const auto qkv = Random(b * t * 3 * c, 41);
  std::vector<float> att(b * nh * t * t), out(b * t * c);
  kernels::CausalAttentionForward(qkv.data(), att.data(), out.data(), b, t, c, nh);
  auto g_qkv = Dev(qkv), g_att = Dev(std::vector<float>(att.size(), 5.0f)),
       g_out = Dev(std::vector<float>(out.size()));
  ASSERT_TRUE(CausalAttentionForward(blas_.get(), stream_.get(), g_qkv.data(), g_att.data(),
                                     g_out.data(), b, t, c, nh)
                  .ok());
  ExpectClose(att, Host(g_att), kFp32Tol, "att");
  ExpectClose(out, Host(g_out), kFp32Tol, "out");

  const auto dout = Random(b * t * c, 42);
  auto dqkv = Random(qkv.size(), 43);
  auto g_dout = Dev(dout), g_dqkv = Dev(dqkv), scratch = Dev(std::vector<float>(nh * t * t));
  kernels::CausalAttentionBackward(dout.data(), qkv.data(), att.data(), dqkv.data(), b, t, c, nh);
  ASSERT_TRUE(CausalAttentionBackward(blas_.get(), stream_.get(), g_dout.data(), g_qkv.data(),
                                      g_att.data(), g_dqkv.data(), scratch.data(), b, t, c, nh)
                  .ok());
  ExpectClose(dqkv, Host(g_dqkv), kFp32Tol, "dqkv");
  EXPECT_EQ(CausalAttentionForward(blas_.get(), stream_.get(), g_qkv.data(), g_att.data(),
                                   g_out.data(), b, t, 50, nh)
                .code(),
            absl::StatusCode::kInvalidArgument);  // nh does not divide c
}

TEST_F(CudaKernelsTest, SoftmaxCrossEntropyInPlaceMatchesCpu) {
  const int64_t n = 13, v = 1000;
  auto logits = Random(n * v, 51, -4.0f, 4.0f);
  std::vector<int32_t> targets(n);
  for (int64_t i = 0; i < n; ++i) targets[i] = static_cast<int32_t>((i * 97 + 5) % v);
  auto g_logits = Dev(logits);
  auto g_targets = Dev(targets);
  auto g_losses = Dev(std::vector<float>(n));
  auto g_sum = Dev(std::vector<double>(1, -1.0));
  const double ref = kernels::SoftmaxCrossEntropyInPlace(logits.data(), targets.data(), n, v);
  ASSERT_TRUE(SoftmaxCrossEntropyInPlace(stream_.get(), g_logits.data(), g_targets.data(),
                                         g_losses.data(), g_sum.data(), n, v)
                  .ok());
  ExpectClose(logits, Host(g_logits), kFp32Tol, "p - onehot");
  const double sum = Host(g_sum)[0];
  EXPECT_LE(std::abs(sum - ref), kFp32Tol * std::max(1.0, std::abs(ref))) << sum << " vs " << ref;
}

TEST_F(CudaKernelsTest, AdamWMatchesCpuOverSteps) {
  const size_t count = 4099;
  Parameter w("w", {static_cast<int64_t>(count)}, /*weight_decay=*/true);
  Parameter bias("b", {static_cast<int64_t>(count)}, /*weight_decay=*/false);
  auto set = [](Tensor& t, const std::vector<float>& v) { t.vec().assign(v.begin(), v.end()); };
  set(w.value, Random(count, 61));
  set(bias.value, Random(count, 62));
  AdamWOptions opt;
  opt.beta1 = 0.9f;
  opt.beta2 = 0.95f;
  opt.eps = 1e-8f;
  opt.weight_decay = 0.1f;
  AdamW adam({&w, &bias}, opt);
  AdamWHyper hyper;
  hyper.lr = 1e-2f;
  hyper.beta1 = opt.beta1;
  hyper.beta2 = opt.beta2;
  hyper.eps = opt.eps;
  hyper.weight_decay = opt.weight_decay;

  Parameter* params[] = {&w, &bias};
  DeviceBuffer<float> gw[2], gg[2], gm[2], gv[2];
  for (int p = 0; p < 2; ++p) {
    gw[p] = Dev(params[p]->value.values());
    gm[p] = Dev(std::vector<float>(count));
    gv[p] = Dev(std::vector<float>(count));
  }
  for (int step = 1; step <= 3; ++step) {
    for (int p = 0; p < 2; ++p) {
      set(params[p]->grad, Random(count, 70 + 2 * step + p));
      gg[p] = Dev(params[p]->grad.values());
      ASSERT_TRUE(AdamWStep(stream_.get(), gw[p].data(), gg[p].data(), gm[p].data(), gv[p].data(),
                            count, hyper, params[p]->decay, step)
                      .ok());
    }
    adam.Step(hyper.lr);
    for (int p = 0; p < 2; ++p) {
      ExpectClose(params[p]->value.values(), Host(gw[p]), kFp32Tol,
                  absl::StrCat(params[p]->name, " step ", step));
      EXPECT_EQ(Host(gg[p]), std::vector<float>(count, 0.0f)) << "grad zeroed";
    }
  }
}

TEST_F(CudaKernelsTest, GradSquaredNormAccumulatesInDouble) {
  const auto a = Random(100003, 81), b = Random(517, 82);
  double ref = 0.0;
  for (float x : a) ref += static_cast<double>(x) * x;
  for (float x : b) ref += static_cast<double>(x) * x;
  auto ga = Dev(a), gb = Dev(b);
  auto sum = Dev(std::vector<double>(1, 0.0));
  ASSERT_TRUE(GradSquaredNorm(stream_.get(), ga.data(), a.size(), sum.data()).ok());
  ASSERT_TRUE(GradSquaredNorm(stream_.get(), gb.data(), b.size(), sum.data()).ok());
  const double got = Host(sum)[0];
  EXPECT_LE(std::abs(got - ref), 1e-9 * ref) << got << " vs " << ref;
}

// A cuda:N worker's registered peak: a positive figure on a device (bf16 above fp32 on any GPU
// with tensor cores), a clear error without one.
TEST(GemmPeakTest, MeasuresOnADeviceAndFailsCleanlyWithout) {
  if (!CudaAvailable().ok()) {
    const absl::StatusOr<double> none = MeasureGemmFlops(/*half=*/true, 256, 1);
    ASSERT_FALSE(none.ok());
    EXPECT_EQ(none.status().code(), absl::StatusCode::kFailedPrecondition) << none.status();
    return;
  }
  const absl::StatusOr<double> f32 = MeasureGemmFlops(/*half=*/false, 2048, 3);
  const absl::StatusOr<double> b16 = MeasureGemmFlops(/*half=*/true, 2048, 3);
  ASSERT_TRUE(f32.ok()) << f32.status();
  ASSERT_TRUE(b16.ok()) << b16.status();
  EXPECT_GT(*f32, 1e11);
  EXPECT_GT(*b16, *f32);
}

}  // namespace
}  // namespace tandem::worker::cuda
