#include "worker/model/kernels.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

namespace tandem::worker::kernels {
namespace {

// BLAS takes int dimensions; the layers keep each GEMM dimension far below 2^31.
int Dim(int64_t d) { return static_cast<int>(d); }

constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2/pi)

// ---- Vectorised helpers for the *Fast kernels (GCC/Clang vector extensions: 8 floats, which
// the baseline x86-64 build lowers to pairs of SSE registers). No -ffast-math is needed: the
// approximations are explicit arithmetic, so every build computes the same values.
using V8 = float __attribute__((vector_size(16)));
using V8i = int32_t __attribute__((vector_size(16)));
constexpr int64_t kLanes = 4;

inline V8 Load8(const float* p) {
  V8 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void Store8(float* p, V8 v) { std::memcpy(p, &v, sizeof v); }
inline V8 Splat(float x) { return V8{} + x; }

// exp(x) (Cephes expf): x = n ln2 + r with n = round(x / ln2), |r| <= ln2 / 2, e^r by a
// degree-6 polynomial, 2^n through the exponent bits. Relative error below 3e-7 on
// [-87.3, 88.3]; inputs are clamped to that range (exp(-87.3) ~ 1e-38 stands in for 0).
inline V8 Exp8(V8 x) {
  x = x < -87.3f ? Splat(-87.3f) : x;
  x = x > 88.3f ? Splat(88.3f) : x;
  // Round to nearest by the 1.5 * 2^23 trick (exact for |x / ln2| < 2^22).
  const V8 n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  const V8 r = (x - n * 0.693359375f) - n * -2.12194440e-4f;
  V8 p = Splat(1.9875691500e-4f);
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  const V8i bits = (__builtin_convertvector(n, V8i) + 127) << 23;
  V8 scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

// tanh(u) = 1 - 2 / (exp(2u) + 1): absolute error below 1e-6 (relative accuracy is lost only
// for |u| < ~1e-3, where GELU multiplies it by x anyway).
inline V8 Tanh8(V8 u) { return 1.0f - 2.0f / (Exp8(2.0f * u) + 1.0f); }

inline V8 GeluForward8(V8 x) {
  const V8 t = Tanh8(kGeluScale * (x + 0.044715f * x * x * x));
  return 0.5f * x * (1.0f + t);
}

inline V8 GeluGrad8(V8 x) {
  const V8 t = Tanh8(kGeluScale * (x + 0.044715f * x * x * x));
  const V8 du = kGeluScale * (1.0f + 3.0f * 0.044715f * x * x);
  return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du;
}

// Applies f to [0, count) by whole vectors, the tail through a zero-padded vector, so every
// element sees the same arithmetic.
template <typename F>
inline void Map8(const float* in, float* out, int64_t count, F f) {
  int64_t i = 0;
  for (; i + kLanes <= count; i += kLanes) Store8(out + i, f(Load8(in + i)));
  if (i < count) {
    float buf[kLanes] = {};
    std::copy(in + i, in + count, buf);
    Store8(buf, f(Load8(buf)));
    std::copy(buf, buf + (count - i), out + i);
  }
}

float HorizontalSum(V8 v) {
  float s = 0.0f;
  for (int64_t j = 0; j < kLanes; ++j) s += v[j];
  return s;
}

float RowMax(const float* z, int64_t n) {
  float m = -std::numeric_limits<float>::infinity();
  int64_t j = 0;
  if (n >= kLanes) {
    V8 vm = Load8(z);
    for (j = kLanes; j + kLanes <= n; j += kLanes) {
      const V8 v = Load8(z + j);
      vm = v > vm ? v : vm;
    }
    for (int64_t k = 0; k < kLanes; ++k) m = std::max(m, vm[k]);
  }
  for (; j < n; ++j) m = std::max(m, z[j]);
  return m;
}

// z = exp(z - shift) in place; returns the sum of the new z (in eight partial sums).
float ExpShiftSum(float* z, int64_t n, float shift) {
  V8 acc{};
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes) {
    const V8 e = Exp8(Load8(z + j) - shift);
    Store8(z + j, e);
    acc += e;
  }
  float sum = HorizontalSum(acc);
  if (j < n) {
    float buf[kLanes];
    std::fill(buf, buf + kLanes, shift - 100.0f);  // padding: exp(-100) clamps to ~1e-38
    std::copy(z + j, z + n, buf);
    const V8 e = Exp8(Load8(buf) - shift);
    for (int64_t k = 0; k < n - j; ++k) {
      z[j + k] = e[k];
      sum += e[k];
    }
  }
  return sum;
}

void Scale(float* z, int64_t n, float s) {
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes) Store8(z + j, Load8(z + j) * s);
  for (; j < n; ++j) z[j] *= s;
}

// Softmax in place over z[0, n).
void SoftmaxInPlace(float* z, int64_t n) {
  const float sum = ExpShiftSum(z, n, RowMax(z, n));
  Scale(z, n, 1.0f / sum);
}

}  // namespace

void LinearForward(const float* in, const float* w, const float* b, float* out, int64_t n,
                   int64_t c, int64_t oc) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, Dim(n), Dim(oc), Dim(c), 1.0f, in, Dim(c), w,
              Dim(c), 0.0f, out, Dim(oc));
  if (b != nullptr) {
    for (int64_t i = 0; i < n; ++i) {
      float* row = out + i * oc;
      for (int64_t j = 0; j < oc; ++j) row[j] += b[j];
    }
  }
}

void LinearBackward(const float* dout, const float* in, const float* w, float* din, float* dw,
                    float* db, int64_t n, int64_t c, int64_t oc) {
  if (din != nullptr) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, Dim(n), Dim(c), Dim(oc), 1.0f, dout,
                Dim(oc), w, Dim(c), 1.0f, din, Dim(c));
  }
  if (dw != nullptr) {
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, Dim(oc), Dim(c), Dim(n), 1.0f, dout,
                Dim(oc), in, Dim(c), 1.0f, dw, Dim(c));
  }
  if (db != nullptr) {
    for (int64_t i = 0; i < n; ++i) {
      const float* row = dout + i * oc;
      for (int64_t j = 0; j < oc; ++j) db[j] += row[j];
    }
  }
}

void LayerNormForward(const float* in, const float* gain, const float* bias, float* out,
                      float* mean, float* rstd, int64_t n, int64_t c) {
  for (int64_t i = 0; i < n; ++i) {
    const float* x = in + i * c;
    double sum = 0.0;
    for (int64_t j = 0; j < c; ++j) sum += x[j];
    const double m = sum / static_cast<double>(c);
    double var = 0.0;
    for (int64_t j = 0; j < c; ++j) {
      const double d = x[j] - m;
      var += d * d;
    }
    var /= static_cast<double>(c);
    const float s = static_cast<float>(1.0 / std::sqrt(var + kLayerNormEps));
    const float mf = static_cast<float>(m);
    float* y = out + i * c;
    for (int64_t j = 0; j < c; ++j) y[j] = (x[j] - mf) * s * gain[j] + bias[j];
    mean[i] = mf;
    rstd[i] = s;
  }
}

void LayerNormBackward(const float* dout, const float* in, const float* gain, const float* mean,
                       const float* rstd, float* din, float* dgain, float* dbias, int64_t n,
                       int64_t c) {
  for (int64_t i = 0; i < n; ++i) {
    const float* dy = dout + i * c;
    const float* x = in + i * c;
    float* dx = din + i * c;
    const float m = mean[i];
    const float s = rstd[i];
    // With xhat = (x - m) * s and dxhat = dy * gain:
    // dx = s * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)).
    double sum_dxhat = 0.0;
    double sum_dxhat_xhat = 0.0;
    for (int64_t j = 0; j < c; ++j) {
      const float xhat = (x[j] - m) * s;
      const float dxhat = dy[j] * gain[j];
      sum_dxhat += dxhat;
      sum_dxhat_xhat += static_cast<double>(dxhat) * xhat;
      dbias[j] += dy[j];
      dgain[j] += dy[j] * xhat;
    }
    const float mean_dxhat = static_cast<float>(sum_dxhat / static_cast<double>(c));
    const float mean_dxhat_xhat = static_cast<float>(sum_dxhat_xhat / static_cast<double>(c));
    for (int64_t j = 0; j < c; ++j) {
      const float xhat = (x[j] - m) * s;
      const float dxhat = dy[j] * gain[j];
      dx[j] += s * (dxhat - mean_dxhat - xhat * mean_dxhat_xhat);
    }
  }
}

void GeluForward(const float* in, float* out, int64_t count) {
  for (int64_t i = 0; i < count; ++i) {
    const float x = in[i];
    const float u = kGeluScale * (x + 0.044715f * x * x * x);
    out[i] = 0.5f * x * (1.0f + std::tanh(u));
  }
}

void GeluBackward(const float* in, const float* dout, float* din, int64_t count) {
  for (int64_t i = 0; i < count; ++i) {
    const float x = in[i];
    const float u = kGeluScale * (x + 0.044715f * x * x * x);
    const float t = std::tanh(u);
    const float sech2 = 1.0f - t * t;
    const float du = kGeluScale * (1.0f + 3.0f * 0.044715f * x * x);
    const float grad = 0.5f * (1.0f + t) + 0.5f * x * sech2 * du;
    din[i] += grad * dout[i];
  }
}

double SoftmaxCrossEntropyForward(const float* logits, const int32_t* targets, float* probs,
                                  float* losses, int64_t n, int64_t v) {
  double total = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const float* z = logits + i * v;
    float* p = probs + i * v;
    const float zmax = *std::max_element(z, z + v);
    double sum = 0.0;
    for (int64_t j = 0; j < v; ++j) {
      p[j] = std::exp(z[j] - zmax);
      sum += p[j];
    }
    const float inv = static_cast<float>(1.0 / sum);
    for (int64_t j = 0; j < v; ++j) p[j] *= inv;
    // -log softmax computed from the logits, not from p, so a tiny p does not underflow.
    const double loss = std::log(sum) - static_cast<double>(z[targets[i]] - zmax);
    losses[i] = static_cast<float>(loss);
    total += loss;
  }
  return total;
}

void SoftmaxCrossEntropyBackward(const float* probs, const int32_t* targets, float scale,
                                 float* dlogits, int64_t n, int64_t v) {
  for (int64_t i = 0; i < n; ++i) {
    const float* p = probs + i * v;
    float* d = dlogits + i * v;
    for (int64_t j = 0; j < v; ++j) d[j] += p[j] * scale;
    d[targets[i]] -= scale;
  }
}

// ---------------------------------------------------------------------------------------
// GPT kernels.

void ScaledLinearBackward(const float* dout, const float* in, const float* w, float scale,
                          float* din, float* dw, int64_t n, int64_t c, int64_t oc) {
  if (din != nullptr) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, Dim(n), Dim(c), Dim(oc), scale, dout,
                Dim(oc), w, Dim(c), 1.0f, din, Dim(c));
  }
  if (dw != nullptr) {
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, Dim(oc), Dim(c), Dim(n), scale, dout,
                Dim(oc), in, Dim(c), 1.0f, dw, Dim(c));
  }
}

void CausalAttentionForward(const float* qkv, float* att, float* out, int64_t b, int64_t t,
                            int64_t c, int64_t nh) {
  const int64_t hd = c / nh;
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd)));
  const size_t tt = static_cast<size_t>(t) * static_cast<size_t>(t);
  for (int64_t bi = 0; bi < b; ++bi) {
    for (int64_t h = 0; h < nh; ++h) {
      const float* q = qkv + static_cast<size_t>(bi * t) * 3 * c + h * hd;  // (T, hd), ld 3C
      const float* k = q + c;
      const float* v = q + 2 * c;
      float* p = att + static_cast<size_t>(bi * nh + h) * tt;     // (T, T)
      float* y = out + static_cast<size_t>(bi * t) * c + h * hd;  // (T, hd), ld C
      for (int64_t r0 = 0; r0 < t; r0 += kAttentionTile) {
        const int64_t rows = std::min(kAttentionTile, t - r0), cols = r0 + rows;
        float* pt = p + static_cast<size_t>(r0) * t;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, Dim(rows), Dim(cols), Dim(hd), scale,
                    q + static_cast<size_t>(r0) * 3 * c, Dim(3 * c), k, Dim(3 * c), 0.0f, pt,
                    Dim(t));
        for (int64_t i = r0; i < r0 + rows; ++i) {
          float* row = p + static_cast<size_t>(i) * t;
          const int64_t len = i + 1;  // positions 0..i are visible
          SoftmaxInPlace(row, len);
          std::fill(row + len, row + t, 0.0f);
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, Dim(rows), Dim(hd), Dim(cols), 1.0f,
                    pt, Dim(t), v, Dim(3 * c), 0.0f, y + static_cast<size_t>(r0) * c, Dim(c));
      }
    }
  }
}

void CausalAttentionBackward(const float* dout, const float* qkv, const float* att, float* dqkv,
                             int64_t b, int64_t t, int64_t c, int64_t nh) {
  const int64_t hd = c / nh;
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd)));
  const size_t tt = static_cast<size_t>(t) * static_cast<size_t>(t);
  const int ld3 = Dim(3 * c);
  std::vector<float> ds(tt);  // (T, T) d scores, one head at a time
  for (int64_t bi = 0; bi < b; ++bi) {
    for (int64_t h = 0; h < nh; ++h) {
      const size_t row0 = static_cast<size_t>(bi * t);
      const float* q = qkv + row0 * 3 * c + h * hd;  // (T, hd), ld 3C
      const float* k = q + c;
      const float* v = q + 2 * c;
      float* dq = dqkv + row0 * 3 * c + h * hd;
      float* dk = dq + c;
      float* dv = dq + 2 * c;
      const float* dy = dout + row0 * c + h * hd;  // (T, hd), ld C
      const float* p = att + static_cast<size_t>(bi * nh + h) * tt;
      // Per query tile: d att = dy v^T, then the softmax backward
      // ds = p * (d att - sum(p * d att)) (zero where masked), then dq += scale ds k.
      for (int64_t r0 = 0; r0 < t; r0 += kAttentionTile) {
        const int64_t rows = std::min(kAttentionTile, t - r0), cols = r0 + rows;
        float* dst = ds.data() + static_cast<size_t>(r0) * t;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, Dim(rows), Dim(cols), Dim(hd), 1.0f,
                    dy + static_cast<size_t>(r0) * c, Dim(c), v, ld3, 0.0f, dst, Dim(t));
        for (int64_t i = r0; i < r0 + rows; ++i) {
          float* d = ds.data() + static_cast<size_t>(i) * t;
          const float* pr = p + static_cast<size_t>(i) * t;
          const int64_t len = i + 1;
          float dot = 0.0f;
          for (int64_t j = 0; j < len; ++j) dot += pr[j] * d[j];
          for (int64_t j = 0; j < len; ++j) d[j] = pr[j] * (d[j] - dot);
          std::fill(d + len, d + t, 0.0f);
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, Dim(rows), Dim(hd), Dim(cols), scale,
                    dst, Dim(t), k, ld3, 1.0f, dq + static_cast<size_t>(r0) * 3 * c, ld3);
      }
      // Per key tile [c0, c0 + w): only queries i >= c0 see it.
      // dv += att^T dy; dk += scale ds^T q.
      for (int64_t c0 = 0; c0 < t; c0 += kAttentionTile) {
        const int64_t w = std::min(kAttentionTile, t - c0), rows = t - c0;
        const size_t at = static_cast<size_t>(c0) * t + c0;
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, Dim(w), Dim(hd), Dim(rows), 1.0f,
                    p + at, Dim(t), dy + static_cast<size_t>(c0) * c, Dim(c), 1.0f,
                    dv + static_cast<size_t>(c0) * 3 * c, ld3);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, Dim(w), Dim(hd), Dim(rows), scale,
                    ds.data() + at, Dim(t), q + static_cast<size_t>(c0) * 3 * c, ld3, 1.0f,
                    dk + static_cast<size_t>(c0) * 3 * c, ld3);
      }
    }
  }
}

double SoftmaxCrossEntropyInPlace(float* logits, const int32_t* targets, int64_t n, int64_t v) {
  double total = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    float* z = logits + static_cast<size_t>(i) * v;
    const float zmax = RowMax(z, v);
    const float zt = z[targets[i]];
    const float sum = ExpShiftSum(z, v, zmax);
    Scale(z, v, 1.0f / sum);
    z[targets[i]] -= 1.0f;
    total += std::log(static_cast<double>(sum)) - static_cast<double>(zt - zmax);
  }
  return total;
}

void GeluForwardFast(const float* in, float* out, int64_t count) {
  Map8(in, out, count, GeluForward8);
}

void GeluBackwardFast(const float* in, const float* dout, float* din, int64_t count) {
  int64_t i = 0;
  for (; i + kLanes <= count; i += kLanes) {
    Store8(din + i, Load8(din + i) + GeluGrad8(Load8(in + i)) * Load8(dout + i));
  }
  if (i < count) {
    float x[kLanes] = {}, d[kLanes] = {}, g[kLanes] = {};
    std::copy(in + i, in + count, x);
    std::copy(dout + i, dout + count, d);
    std::copy(din + i, din + count, g);
    Store8(g, Load8(g) + GeluGrad8(Load8(x)) * Load8(d));
    std::copy(g, g + (count - i), din + i);
  }
}

void Add(const float* a, const float* b, float* out, int64_t count) {
  for (int64_t i = 0; i < count; ++i) out[i] = a[i] + b[i];
}

}  // namespace tandem::worker::kernels
