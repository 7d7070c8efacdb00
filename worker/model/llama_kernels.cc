#include "worker/model/llama_kernels.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "worker/model/kernels.h"
#include "worker/model/simd.h"

namespace tandem::worker::kernels {
namespace {

float Sigmoid(float a) { return 1.0f / (1.0f + std::exp(-a)); }

// Rows per thread in the row-parallel kernels: at least 64 K elements a thread.
int64_t MinRows(int64_t c) { return std::max<int64_t>(1, 65536 / std::max<int64_t>(1, c)); }

}  // namespace

void RmsNormForward(const float* in, const float* gain, float* out, float* rstd, int64_t n,
                    int64_t c, float eps) {
  ParallelFor(KernelThreads(), n, MinRows(c), [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const float* x = in + static_cast<size_t>(i) * c;
      double ss = 0.0;
      for (int64_t j = 0; j < c; ++j) ss += static_cast<double>(x[j]) * x[j];
      const float s = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(c) + eps));
      float* y = out + static_cast<size_t>(i) * c;
      for (int64_t j = 0; j < c; ++j) y[j] = x[j] * s * gain[j];
      rstd[i] = s;
    }
  });
}

void RmsNormBackward(const float* dout, const float* in, const float* gain, const float* rstd,
                     float* din, float* dgain, int64_t n, int64_t c) {
  const int threads = KernelThreads();
  // din by rows.
  ParallelFor(threads, n, MinRows(c), [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const size_t row = static_cast<size_t>(i) * c;
      const float* dy = dout + row;
      const float* x = in + row;
      float* dx = din + row;
      const float s = rstd[i];
      double sum_dxhat_xhat = 0.0;
      for (int64_t j = 0; j < c; ++j) {
        sum_dxhat_xhat += static_cast<double>(dy[j] * gain[j]) * (x[j] * s);
      }
      const float mean_dxhat_xhat = static_cast<float>(sum_dxhat_xhat / static_cast<double>(c));
      for (int64_t j = 0; j < c; ++j) {
        dx[j] += s * (dy[j] * gain[j] - x[j] * s * mean_dxhat_xhat);
      }
    }
  });
  // dgain by columns, each summed over the rows in order (at least 16 columns and 64 K
  // elements a thread).
  ParallelFor(threads, c, std::max<int64_t>(16, 65536 / std::max<int64_t>(1, n)),
              [&](int64_t j0, int64_t j1) {
                for (int64_t i = 0; i < n; ++i) {
                  const size_t row = static_cast<size_t>(i) * c;
                  const float* dy = dout + row;
                  const float* x = in + row;
                  const float s = rstd[i];
                  for (int64_t j = j0; j < j1; ++j) dgain[j] += dy[j] * (x[j] * s);
                }
              });
}

void RopeTables(int64_t max_t, int64_t hd, double theta, float* cos, float* sin) {
  const int64_t half = hd / 2;
  // HF: inv_freq = 1.0 / (base ** (arange(0, hd, 2).float() / hd)), all float32.
  std::vector<float> inv_freq(static_cast<size_t>(half));
  const double base = static_cast<float>(theta);
  for (int64_t j = 0; j < half; ++j) {
    const float e = static_cast<float>(2 * j) / static_cast<float>(hd);
    inv_freq[j] = 1.0f / static_cast<float>(std::pow(base, static_cast<double>(e)));
  }
  for (int64_t p = 0; p < max_t; ++p) {
    for (int64_t j = 0; j < half; ++j) {
      const float angle = static_cast<float>(p) * inv_freq[j];
      const size_t at = static_cast<size_t>(p) * half + j;
      cos[at] = static_cast<float>(std::cos(static_cast<double>(angle)));
      sin[at] = static_cast<float>(std::sin(static_cast<double>(angle)));
    }
  }
}

namespace {
// Rotates each (j, j + half) pair of every head by sign * angle(t, j).
void Rotate(float* x, const float* cos, const float* sin, int64_t b, int64_t t, int64_t nhx,
            int64_t hd, float sign) {
  const int64_t half = hd / 2;
  // By rows (tokens) b*T + t.
  ParallelFor(KernelThreads(), b * t, MinRows(nhx * hd), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t ti = r % t;
      const float* cr = cos + static_cast<size_t>(ti) * half;
      const float* sr = sin + static_cast<size_t>(ti) * half;
      float* row = x + static_cast<size_t>(r) * nhx * hd;
      for (int64_t h = 0; h < nhx; ++h) {
        float* lo = row + h * hd;
        float* hi = lo + half;
        for (int64_t j = 0; j < half; ++j) {
          const float c = cr[j], s = sign * sr[j];
          const float a = lo[j], e = hi[j];
          lo[j] = a * c - e * s;
          hi[j] = e * c + a * s;
        }
      }
    }
  });
}
}  // namespace

void RopeForward(float* x, const float* cos, const float* sin, int64_t b, int64_t t, int64_t nhx,
                 int64_t hd) {
  Rotate(x, cos, sin, b, t, nhx, hd, 1.0f);
}

void RopeBackward(float* dx, const float* cos, const float* sin, int64_t b, int64_t t, int64_t nhx,
                  int64_t hd) {
  Rotate(dx, cos, sin, b, t, nhx, hd, -1.0f);
}

void SwiGluForward(const float* gate, const float* up, float* out, int64_t count) {
  for (int64_t i = 0; i < count; ++i) {
    const float a = gate[i];
    out[i] = a * Sigmoid(a) * up[i];
  }
}

void SwiGluBackward(const float* gate, const float* up, const float* dout, float* dgate, float* dup,
                    int64_t count) {
  for (int64_t i = 0; i < count; ++i) {
    const float a = gate[i];
    const float s = Sigmoid(a);
    const float silu = a * s;
    dgate[i] += dout[i] * up[i] * (s * (1.0f + a * (1.0f - s)));
    dup[i] += dout[i] * silu;
  }
}

namespace {
using simd::F4;
using simd::kLanes;
using simd::Load;
using simd::Store;

// The SwiGLU forward of four lanes.
inline F4 SwiGlu4(F4 a, F4 u) { return a * simd::Sigmoid(a) * u; }

// Calls f(i, n) for vectors at i (n = kLanes) and, for a tail of n < kLanes elements, on
// copies padded with zeros (f sees pointers into a scratch block then): every element sees
// the same arithmetic.
template <int kIn, int kOut, typename F>
inline void ForLanes(const float* const (&in)[kIn], float* const (&out)[kOut], int64_t count, F f) {
  int64_t i = 0;
  for (; i + kLanes <= count; i += kLanes) {
    F4 a[kIn], b[kOut];
    for (int k = 0; k < kIn; ++k) a[k] = Load(in[k] + i);
    for (int k = 0; k < kOut; ++k) b[k] = out[k] == nullptr ? F4{} : Load(out[k] + i);
    f(a, b);
    for (int k = 0; k < kOut; ++k) {
      if (out[k] != nullptr) Store(out[k] + i, b[k]);
    }
  }
  if (i < count) {
    float ta[kIn][kLanes] = {}, tb[kOut][kLanes] = {};
    F4 a[kIn], b[kOut];
    for (int k = 0; k < kIn; ++k) {
      std::copy(in[k] + i, in[k] + count, ta[k]);
      a[k] = Load(ta[k]);
    }
    for (int k = 0; k < kOut; ++k) {
      if (out[k] != nullptr) std::copy(out[k] + i, out[k] + count, tb[k]);
      b[k] = Load(tb[k]);
    }
    f(a, b);
    for (int k = 0; k < kOut; ++k) {
      if (out[k] == nullptr) continue;
      Store(tb[k], b[k]);
      std::copy(tb[k], tb[k] + (count - i), out[k] + i);
    }
  }
}
}  // namespace

void SwiGluForwardFast(const float* gate, const float* up, float* out, int64_t count) {
  ParallelForElements(count, [&](int64_t i0, int64_t i1) {
    ForLanes<2, 1>({gate + i0, up + i0}, {out + i0}, i1 - i0,
                   [](const F4* in, F4* o) { o[0] = SwiGlu4(in[0], in[1]); });
  });
}

void SwiGluBackwardFast(const float* gate, const float* up, const float* dout, float* act,
                        float* dgate, float* dup, int64_t count) {
  ParallelForElements(count, [&](int64_t i0, int64_t i1) {
    ForLanes<3, 3>({gate + i0, up + i0, dout + i0},
                   {act == nullptr ? nullptr : act + i0, dgate + i0, dup + i0}, i1 - i0,
                   [](const F4* in, F4* o) {
                     const F4 a = in[0], u = in[1], d = in[2];
                     const F4 s = simd::Sigmoid(a);
                     const F4 silu = a * s;
                     o[0] = silu * u;
                     o[1] += d * u * (s * (1.0f + a * (1.0f - s)));
                     o[2] += d * silu;
                   });
  });
}

void GqaCausalAttentionForward(const float* q, const float* k, const float* v, float* att,
                               float* out, int64_t b, int64_t t, int64_t nh, int64_t kv,
                               int64_t hd) {
  const AttentionLayout l{b, t, nh, kv, hd, nh * hd, kv * hd, nh * hd};
  StridedCausalAttentionForward(l, q, k, v, att, out);
}

void GqaCausalAttentionBackward(const float* dout, const float* q, const float* k, const float* v,
                                const float* att, float* dq, float* dk, float* dv, int64_t b,
                                int64_t t, int64_t nh, int64_t kv, int64_t hd) {
  const AttentionLayout l{b, t, nh, kv, hd, nh * hd, kv * hd, nh * hd};
  StridedCausalAttentionBackward(l, dout, q, k, v, att, dq, dk, dv);
}

}  // namespace tandem::worker::kernels
