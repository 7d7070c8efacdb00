// Four-lane float vectors for the CPU kernels (kernels.cc, llama_kernels.cc) and the
// polynomial exp they share. Internal to worker/model: not part of a kernel's contract.
//
// GCC/Clang vector extensions: one SSE register on the baseline x86-64 build, so no target
// flag is needed. No -ffast-math either: the approximations are explicit arithmetic, every
// build computes the same values, and every lane computes exactly what a lone element would,
// so a kernel's output does not depend on how its work is split into vectors or threads.
#ifndef TANDEM_WORKER_MODEL_SIMD_H_
#define TANDEM_WORKER_MODEL_SIMD_H_

#include <cstdint>
#include <cstring>

namespace tandem::worker::kernels::simd {

using F4 = float __attribute__((vector_size(16)));
using I4 = int32_t __attribute__((vector_size(16)));
inline constexpr int64_t kLanes = 4;

inline F4 Load(const float* p) {
  F4 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void Store(float* p, F4 v) { std::memcpy(p, &v, sizeof v); }
inline F4 Splat(float x) { return F4{} + x; }

// Lanes added in order 0..3.
inline float HorizontalSum(F4 v) { return ((v[0] + v[1]) + v[2]) + v[3]; }

// The inputs Exp clamps to: exp(-87.3) ~ 1.2e-38 (just above FLT_MIN) stands in for 0, and
// exp(88.3) ~ 2.2e38 (below FLT_MAX) for an overflow.
inline constexpr float kExpMin = -87.3f;
inline constexpr float kExpMax = 88.3f;

// exp(x) (Cephes expf): x = n ln2 + r with n = round(x / ln2), |r| <= ln2 / 2, e^r by a
// degree-6 polynomial, 2^n through the exponent bits. Inputs are clamped to [kExpMin,
// kExpMax]. Relative error against std::exp below 1e-7 on that range (measured: at most
// 7.9e-8, under one ulp of 1, on every float kExpMin + i 2^-12; SimdExpTest in
// tests/worker/llama_layers_test.cc). NaN stays NaN.
inline F4 Exp(F4 x) {
  x = x < kExpMin ? Splat(kExpMin) : x;
  x = x > kExpMax ? Splat(kExpMax) : x;
  // Round to nearest by the 1.5 * 2^23 trick (exact for |x / ln2| < 2^22).
  const F4 n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  const F4 r = (x - n * 0.693359375f) - n * -2.12194440e-4f;
  F4 p = Splat(1.9875691500e-4f);
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  const I4 bits = (__builtin_convertvector(n, I4) + 127) << 23;
  F4 scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

// 1 / (1 + exp(-a)).
inline F4 Sigmoid(F4 a) { return 1.0f / (1.0f + Exp(-a)); }

// The correctly rounded square root of each lane (what std::sqrt gives a lone float).
inline F4 Sqrt(F4 x) {
#if defined(__SSE__)
  return __builtin_ia32_sqrtps(x);
#else
  for (int i = 0; i < kLanes; ++i) x[i] = __builtin_sqrtf(x[i]);
  return x;
#endif
}

}  // namespace tandem::worker::kernels::simd

#endif  // TANDEM_WORKER_MODEL_SIMD_H_
