#include "worker/model/llama_kernels.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "worker/model/kernels.h"

namespace tandem::worker::kernels {
namespace {

// BLAS takes int dimensions; the layers keep each GEMM dimension far below 2^31.
int Dim(int64_t d) { return static_cast<int>(d); }

// Softmax in place over z[0, n), n >= 1.
void SoftmaxRow(float* z, int64_t n) {
  const float m = *std::max_element(z, z + n);
  float sum = 0.0f;
  for (int64_t j = 0; j < n; ++j) {
    z[j] = std::exp(z[j] - m);
    sum += z[j];
  }
  const float inv = 1.0f / sum;
  for (int64_t j = 0; j < n; ++j) z[j] *= inv;
}

float Sigmoid(float a) { return 1.0f / (1.0f + std::exp(-a)); }

}  // namespace

void RmsNormForward(const float* in, const float* gain, float* out, float* rstd, int64_t n,
                    int64_t c, float eps) {
  for (int64_t i = 0; i < n; ++i) {
    const float* x = in + static_cast<size_t>(i) * c;
    double ss = 0.0;
    for (int64_t j = 0; j < c; ++j) ss += static_cast<double>(x[j]) * x[j];
    const float s = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(c) + eps));
    float* y = out + static_cast<size_t>(i) * c;
    for (int64_t j = 0; j < c; ++j) y[j] = x[j] * s * gain[j];
    rstd[i] = s;
  }
}

void RmsNormBackward(const float* dout, const float* in, const float* gain, const float* rstd,
                     float* din, float* dgain, int64_t n, int64_t c) {
  for (int64_t i = 0; i < n; ++i) {
    const size_t row = static_cast<size_t>(i) * c;
    const float* dy = dout + row;
    const float* x = in + row;
    float* dx = din + row;
    const float s = rstd[i];
    double sum_dxhat_xhat = 0.0;
    for (int64_t j = 0; j < c; ++j) {
      const float xhat = x[j] * s;
      sum_dxhat_xhat += static_cast<double>(dy[j] * gain[j]) * xhat;
      dgain[j] += dy[j] * xhat;
    }
    const float mean_dxhat_xhat = static_cast<float>(sum_dxhat_xhat / static_cast<double>(c));
    for (int64_t j = 0; j < c; ++j) {
      dx[j] += s * (dy[j] * gain[j] - x[j] * s * mean_dxhat_xhat);
    }
  }
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
  for (int64_t bi = 0; bi < b; ++bi) {
    for (int64_t ti = 0; ti < t; ++ti) {
      const float* cr = cos + static_cast<size_t>(ti) * half;
      const float* sr = sin + static_cast<size_t>(ti) * half;
      float* row = x + static_cast<size_t>(bi * t + ti) * nhx * hd;
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
  }
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

void GqaCausalAttentionForward(const float* q, const float* k, const float* v, float* att,
                               float* out, int64_t b, int64_t t, int64_t nh, int64_t kv,
                               int64_t hd) {
  const int64_t group = nh / kv, qd = nh * hd, kd = kv * hd;
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd)));
  const size_t tt = static_cast<size_t>(t) * static_cast<size_t>(t);
  for (int64_t bi = 0; bi < b; ++bi) {
    const size_t row0 = static_cast<size_t>(bi * t);
    for (int64_t h = 0; h < nh; ++h) {
      const int64_t g = h / group;
      const float* qh = q + row0 * qd + h * hd;  // (T, hd), ld NH*hd
      const float* kg = k + row0 * kd + g * hd;  // (T, hd), ld KV*hd
      const float* vg = v + row0 * kd + g * hd;
      float* p = att + static_cast<size_t>(bi * nh + h) * tt;  // (T, T)
      float* y = out + row0 * qd + h * hd;                     // (T, hd), ld NH*hd
      for (int64_t r0 = 0; r0 < t; r0 += kAttentionTile) {
        const int64_t rows = std::min(kAttentionTile, t - r0), cols = r0 + rows;
        float* pt = p + static_cast<size_t>(r0) * t;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, Dim(rows), Dim(cols), Dim(hd), scale,
                    qh + static_cast<size_t>(r0) * qd, Dim(qd), kg, Dim(kd), 0.0f, pt, Dim(t));
        for (int64_t i = r0; i < r0 + rows; ++i) {
          float* row = p + static_cast<size_t>(i) * t;
          const int64_t len = i + 1;  // positions 0..i are visible
          SoftmaxRow(row, len);
          std::fill(row + len, row + t, 0.0f);
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, Dim(rows), Dim(hd), Dim(cols), 1.0f,
                    pt, Dim(t), vg, Dim(kd), 0.0f, y + static_cast<size_t>(r0) * qd, Dim(qd));
      }
    }
  }
}

void GqaCausalAttentionBackward(const float* dout, const float* q, const float* k, const float* v,
                                const float* att, float* dq, float* dk, float* dv, int64_t b,
                                int64_t t, int64_t nh, int64_t kv, int64_t hd) {
  const int64_t group = nh / kv, qd = nh * hd, kd = kv * hd;
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd)));
  const size_t tt = static_cast<size_t>(t) * static_cast<size_t>(t);
  std::vector<float> ds(tt);  // (T, T) d scores, one head at a time
  for (int64_t bi = 0; bi < b; ++bi) {
    const size_t row0 = static_cast<size_t>(bi * t);
    for (int64_t h = 0; h < nh; ++h) {
      const int64_t g = h / group;
      const float* qh = q + row0 * qd + h * hd;  // (T, hd), ld NH*hd
      const float* kg = k + row0 * kd + g * hd;  // (T, hd), ld KV*hd
      const float* vg = v + row0 * kd + g * hd;
      const float* dy = dout + row0 * qd + h * hd;
      float* dqh = dq + row0 * qd + h * hd;
      float* dkg = dk + row0 * kd + g * hd;
      float* dvg = dv + row0 * kd + g * hd;
      const float* p = att + static_cast<size_t>(bi * nh + h) * tt;
      // Per query tile: d att = dy v^T, then the softmax backward
      // ds = p * (d att - sum(p * d att)) (zero where masked), then dq += scale ds k.
      for (int64_t r0 = 0; r0 < t; r0 += kAttentionTile) {
        const int64_t rows = std::min(kAttentionTile, t - r0), cols = r0 + rows;
        float* dst = ds.data() + static_cast<size_t>(r0) * t;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, Dim(rows), Dim(cols), Dim(hd), 1.0f,
                    dy + static_cast<size_t>(r0) * qd, Dim(qd), vg, Dim(kd), 0.0f, dst, Dim(t));
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
                    dst, Dim(t), kg, Dim(kd), 1.0f, dqh + static_cast<size_t>(r0) * qd, Dim(qd));
      }
      // Per key tile [c0, c0 + w): only queries i >= c0 see it.
      // dv += att^T dy; dk += scale ds^T q (summed over the group's query heads).
      for (int64_t c0 = 0; c0 < t; c0 += kAttentionTile) {
        const int64_t w = std::min(kAttentionTile, t - c0), rows = t - c0;
        const size_t at = static_cast<size_t>(c0) * t + c0;
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, Dim(w), Dim(hd), Dim(rows), 1.0f,
                    p + at, Dim(t), dy + static_cast<size_t>(c0) * qd, Dim(qd), 1.0f,
                    dvg + static_cast<size_t>(c0) * kd, Dim(kd));
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, Dim(w), Dim(hd), Dim(rows), scale,
                    ds.data() + at, Dim(t), qh + static_cast<size_t>(c0) * qd, Dim(qd), 1.0f,
                    dkg + static_cast<size_t>(c0) * kd, Dim(kd));
      }
    }
  }
}

}  // namespace tandem::worker::kernels
