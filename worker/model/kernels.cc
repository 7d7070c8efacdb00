#include "worker/model/kernels.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>

namespace tandem::worker::kernels {
namespace {

// BLAS takes int dimensions; the layers keep each GEMM dimension far below 2^31.
int Dim(int64_t d) { return static_cast<int>(d); }

constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2/pi)

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
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, Dim(oc), Dim(c), Dim(n), 1.0f, dout, Dim(oc),
              in, Dim(c), 1.0f, dw, Dim(c));
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

}  // namespace tandem::worker::kernels
