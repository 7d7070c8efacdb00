#include "worker/model/kernels.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <mutex>
#include <thread>
#include <vector>

#include "worker/model/simd.h"

namespace tandem::worker::kernels {
namespace {

// BLAS takes int dimensions; the layers keep each GEMM dimension far below 2^31.
int Dim(int64_t d) { return static_cast<int>(d); }

constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2/pi)

using simd::F4;
using simd::kLanes;
using simd::Load;
using simd::Splat;
using simd::Store;

// tanh(u) = 1 - 2 / (exp(2u) + 1): absolute error below 1e-6 (relative accuracy is lost only
// for |u| < ~1e-3, where GELU multiplies it by x anyway).
inline F4 Tanh4(F4 u) { return 1.0f - 2.0f / (simd::Exp(2.0f * u) + 1.0f); }

inline F4 GeluForward4(F4 x) {
  const F4 t = Tanh4(kGeluScale * (x + 0.044715f * x * x * x));
  return 0.5f * x * (1.0f + t);
}

inline F4 GeluGrad4(F4 x) {
  const F4 t = Tanh4(kGeluScale * (x + 0.044715f * x * x * x));
  const F4 du = kGeluScale * (1.0f + 3.0f * 0.044715f * x * x);
  return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du;
}

// Applies f to [0, count) by whole vectors, the tail through a zero-padded vector, so every
// element sees the same arithmetic.
template <typename F>
inline void Map4(const float* in, float* out, int64_t count, F f) {
  int64_t i = 0;
  for (; i + kLanes <= count; i += kLanes) Store(out + i, f(Load(in + i)));
  if (i < count) {
    float buf[kLanes] = {};
    std::copy(in + i, in + count, buf);
    Store(buf, f(Load(buf)));
    std::copy(buf, buf + (count - i), out + i);
  }
}

float RowMax(const float* z, int64_t n) {
  float m = -std::numeric_limits<float>::infinity();
  int64_t j = 0;
  if (n >= kLanes) {
    F4 vm = Load(z);
    for (j = kLanes; j + kLanes <= n; j += kLanes) {
      const F4 v = Load(z + j);
      vm = v > vm ? v : vm;
    }
    for (int64_t k = 0; k < kLanes; ++k) m = std::max(m, vm[k]);
  }
  for (; j < n; ++j) m = std::max(m, z[j]);
  return m;
}

// z = exp(z - shift) in place; returns the sum of the new z (in four partial sums).
float ExpShiftSum(float* z, int64_t n, float shift) {
  F4 acc{};
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes) {
    const F4 e = simd::Exp(Load(z + j) - shift);
    Store(z + j, e);
    acc += e;
  }
  float sum = simd::HorizontalSum(acc);
  if (j < n) {
    float buf[kLanes];
    std::fill(buf, buf + kLanes, shift - 100.0f);  // padding: exp(-100) clamps to ~1e-38
    std::copy(z + j, z + n, buf);
    const F4 e = simd::Exp(Load(buf) - shift);
    for (int64_t k = 0; k < n - j; ++k) {
      z[j + k] = e[k];
      sum += e[k];
    }
  }
  return sum;
}

void Scale(float* z, int64_t n, float s) {
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes) Store(z + j, Load(z + j) * s);
  for (; j < n; ++j) z[j] *= s;
}

// Softmax in place over z[0, n).
void SoftmaxInPlace(float* z, int64_t n) {
  const float sum = ExpShiftSum(z, n, RowMax(z, n));
  Scale(z, n, 1.0f / sum);
}

// sum_j p[j] * d[j] over [0, n), in four partial sums.
float Dot(const float* p, const float* d, int64_t n) {
  F4 acc{};
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes) acc += Load(p + j) * Load(d + j);
  float sum = simd::HorizontalSum(acc);
  for (; j < n; ++j) sum += p[j] * d[j];
  return sum;
}

// d = p * (d - dot) over [0, n).
void SoftmaxGradRow(const float* p, float* d, int64_t n, float dot) {
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes) Store(d + j, Load(p + j) * (Load(d + j) - dot));
  for (; j < n; ++j) d[j] = p[j] * (d[j] - dot);
}

// While held, OpenBLAS runs every GEMM on its calling thread alone. The threaded kernels hold
// it while their own threads call sgemm: OpenBLAS's pthreads build serialises multi-threaded
// GEMMs on one process-wide lock, which would undo their split, its GEMMs are not
// bit-identical across thread counts, and its idle pool threads spin beside ours. The thread
// count is process-wide state, so concurrent holders (two stages' kernels in one process)
// share one save and restore: the first holder saves it, the last one restores it (meanwhile
// KernelThreads() reads 1, so a concurrent kernel runs on its calling thread: slower, same
// result).
class BlasOnCallingThread {
 public:
  BlasOnCallingThread() {
    std::lock_guard<std::mutex> lock(state().mu);
    if (state().holders++ == 0) {
      state().saved = openblas_get_num_threads();
      openblas_set_num_threads(1);
    }
  }
  ~BlasOnCallingThread() {
    std::lock_guard<std::mutex> lock(state().mu);
    if (--state().holders == 0) openblas_set_num_threads(state().saved);
  }
  BlasOnCallingThread(const BlasOnCallingThread&) = delete;
  BlasOnCallingThread& operator=(const BlasOnCallingThread&) = delete;

 private:
  struct State {
    std::mutex mu;
    int holders = 0;  // guarded by mu
    int saved = 1;    // guarded by mu
  };
  static State& state() {
    static State* s = new State;  // never destroyed: OpenBLAS may outlive static destructors
    return *s;
  }
};

}  // namespace

int KernelThreads() { return std::max(1, openblas_get_num_threads()); }

void ParallelFor(int threads, int64_t count, int64_t min_per_thread,
                 const std::function<void(int64_t, int64_t)>& fn) {
  if (count <= 0) return;
  const int64_t most = std::max<int64_t>(1, count / std::max<int64_t>(1, min_per_thread));
  const int64_t parts = std::min<int64_t>(std::max(1, threads), most);
  if (parts == 1) {
    fn(0, count);
    return;
  }
  // Part p covers [p * count / parts, (p + 1) * count / parts): sizes differ by at most one.
  auto bound = [&](int64_t p) { return p * count / parts; };
  std::vector<std::thread> workers;
  workers.reserve(static_cast<size_t>(parts - 1));
  for (int64_t p = 1; p < parts; ++p) workers.emplace_back(fn, bound(p), bound(p + 1));
  fn(0, bound(1));
  for (std::thread& w : workers) w.join();
}

void ParallelForElements(int64_t count, const std::function<void(int64_t, int64_t)>& fn) {
  // Blocks of kBlock elements (a multiple of the vector width, so every part but the last
  // starts and ends on whole vectors); a thread takes at least 16 blocks (64 K elements):
  // below that, starting it costs about as much as the work.
  constexpr int64_t kBlock = 4096;
  const int64_t blocks = (count + kBlock - 1) / kBlock;
  ParallelFor(KernelThreads(), blocks, 16,
              [&](int64_t b0, int64_t b1) { fn(b0 * kBlock, std::min(count, b1 * kBlock)); });
}

namespace {

// Output rows per GEMM part are multiples of this, so that a part boundary never cuts one of
// OpenBLAS's row tiles: 24 rows with its Haswell kernels (which it also picks on AMD Zen), 16
// or 32 with SkylakeX's, fewer elsewhere. A part then runs exactly the tiles the whole call
// would, and each element's sum is the same: with parts of 64 rows, the Haswell kernels on a
// Zen 5 gave different last bits at 2 and 3 threads.
constexpr int64_t kGemmRowAlign = 96;

// Runs gemm(r0, r1) over the output rows [0, rows): in one call on one thread, or split into
// at most KernelThreads() parts at multiples of kGemmRowAlign, each on its own thread with
// OpenBLAS running on that thread alone (BlasOnCallingThread). Every output element is the
// same single-threaded sum over the inner dimension either way (the tests check bit-identity
// at 1, 2 and 3 threads), and OpenBLAS's own pool is never woken: its idle threads would
// otherwise spin (sched_yield) beside ours for 2^28 cycles after each GEMM.
void GemmRows(int64_t rows, const std::function<void(int64_t, int64_t)>& gemm) {
  const int threads = KernelThreads();
  if (threads == 1) {
    gemm(0, rows);
    return;
  }
  BlasOnCallingThread blas;  // also for a single part: OpenBLAS's threads must stay out
  // The rows past the last whole unit go with it, so that no part is a sliver: OpenBLAS runs a
  // small product (a few rows) through other kernels, with other rounding.
  const int64_t units = std::max<int64_t>(1, rows / kGemmRowAlign);
  ParallelFor(threads, units, 1, [&](int64_t u0, int64_t u1) {
    gemm(u0 * kGemmRowAlign, u1 == units ? rows : u1 * kGemmRowAlign);
  });
}

// out (N, OC) = in (N, C) * w^T (C, OC), by rows of out.
void GemmForward(const float* in, const float* w, float* out, int64_t n, int64_t c, int64_t oc) {
  GemmRows(n, [&](int64_t r0, int64_t r1) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, Dim(r1 - r0), Dim(oc), Dim(c), 1.0f,
                in + static_cast<size_t>(r0) * c, Dim(c), w, Dim(c), 0.0f,
                out + static_cast<size_t>(r0) * oc, Dim(oc));
  });
}

// din (N, C) += scale * dout (N, OC) * w (OC, C), by rows of din.
void GemmInputGrad(const float* dout, const float* w, float* din, int64_t n, int64_t c, int64_t oc,
                   float scale) {
  GemmRows(n, [&](int64_t r0, int64_t r1) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, Dim(r1 - r0), Dim(c), Dim(oc), scale,
                dout + static_cast<size_t>(r0) * oc, Dim(oc), w, Dim(c), 1.0f,
                din + static_cast<size_t>(r0) * c, Dim(c));
  });
}

// dw (OC, C) += scale * dout^T (OC, N) * in (N, C), by rows of dw (columns of dout).
void GemmWeightGrad(const float* dout, const float* in, float* dw, int64_t n, int64_t c, int64_t oc,
                    float scale) {
  GemmRows(oc, [&](int64_t o0, int64_t o1) {
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, Dim(o1 - o0), Dim(c), Dim(n), scale,
                dout + o0, Dim(oc), in, Dim(c), 1.0f, dw + static_cast<size_t>(o0) * c, Dim(c));
  });
}

}  // namespace

void LinearForward(const float* in, const float* w, const float* b, float* out, int64_t n,
                   int64_t c, int64_t oc) {
  GemmForward(in, w, out, n, c, oc);
  if (b != nullptr) {
    for (int64_t i = 0; i < n; ++i) {
      float* row = out + i * oc;
      for (int64_t j = 0; j < oc; ++j) row[j] += b[j];
    }
  }
}

void LinearBackward(const float* dout, const float* in, const float* w, float* din, float* dw,
                    float* db, int64_t n, int64_t c, int64_t oc) {
  if (din != nullptr) GemmInputGrad(dout, w, din, n, c, oc, 1.0f);
  if (dw != nullptr) GemmWeightGrad(dout, in, dw, n, c, oc, 1.0f);
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
  if (din != nullptr) GemmInputGrad(dout, w, din, n, c, oc, scale);
  if (dw != nullptr) GemmWeightGrad(dout, in, dw, n, c, oc, scale);
}

void StridedCausalAttentionForward(const AttentionLayout& l, const float* q, const float* k,
                                   const float* v, float* att, float* out) {
  const int64_t t = l.t, hd = l.hd, group = l.nh / l.kv;
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd)));
  const size_t tt = static_cast<size_t>(t) * static_cast<size_t>(t);
  // One task per (batch, query head): its probabilities and its columns of out are its own.
  auto run = [&](int64_t task0, int64_t task1) {
    for (int64_t task = task0; task < task1; ++task) {
      const int64_t bi = task / l.nh, h = task % l.nh, g = h / group;
      const size_t row0 = static_cast<size_t>(bi * t);
      const float* qh = q + row0 * l.ldq + h * hd;  // (T, hd), ld ldq
      const float* kg = k + row0 * l.ldk + g * hd;  // (T, hd), ld ldk
      const float* vg = v + row0 * l.ldk + g * hd;
      float* p = att + static_cast<size_t>(task) * tt;  // (T, T)
      float* y = out + row0 * l.ldo + h * hd;           // (T, hd), ld ldo
      for (int64_t r0 = 0; r0 < t; r0 += kAttentionTile) {
        const int64_t rows = std::min(kAttentionTile, t - r0), cols = r0 + rows;
        float* pt = p + static_cast<size_t>(r0) * t;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, Dim(rows), Dim(cols), Dim(hd), scale,
                    qh + static_cast<size_t>(r0) * l.ldq, Dim(l.ldq), kg, Dim(l.ldk), 0.0f, pt,
                    Dim(t));
        for (int64_t i = r0; i < r0 + rows; ++i) {
          float* row = p + static_cast<size_t>(i) * t;
          const int64_t len = i + 1;  // positions 0..i are visible
          SoftmaxInPlace(row, len);
          std::fill(row + len, row + t, 0.0f);
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, Dim(rows), Dim(hd), Dim(cols), 1.0f,
                    pt, Dim(t), vg, Dim(l.ldk), 0.0f, y + static_cast<size_t>(r0) * l.ldo,
                    Dim(l.ldo));
      }
    }
  };
  const int threads = KernelThreads();
  const int64_t tasks = l.b * l.nh;
  if (threads == 1) {
    run(0, tasks);
    return;
  }
  BlasOnCallingThread blas;  // also for a single task: OpenBLAS's threads must stay out
  ParallelFor(threads, tasks, 1, run);
}

void StridedCausalAttentionBackward(const AttentionLayout& l, const float* dout, const float* q,
                                    const float* k, const float* v, const float* att, float* dq,
                                    float* dk, float* dv) {
  const int64_t t = l.t, hd = l.hd, group = l.nh / l.kv;
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd)));
  const size_t tt = static_cast<size_t>(t) * static_cast<size_t>(t);
  const int ldq = Dim(l.ldq), ldk = Dim(l.ldk), ldo = Dim(l.ldo);
  // One task per (batch, kv head): the kv head's dk and dv are the sum over its query heads,
  // added in head order by the one task that owns them.
  auto run = [&](int64_t task0, int64_t task1) {
    std::vector<float> ds(tt);  // (T, T) d scores, one head at a time
    for (int64_t task = task0; task < task1; ++task) {
      const int64_t bi = task / l.kv, g = task % l.kv;
      const size_t row0 = static_cast<size_t>(bi * t);
      const float* kg = k + row0 * l.ldk + g * hd;  // (T, hd), ld ldk
      const float* vg = v + row0 * l.ldk + g * hd;
      float* dkg = dk + row0 * l.ldk + g * hd;
      float* dvg = dv + row0 * l.ldk + g * hd;
      for (int64_t h = g * group; h < (g + 1) * group; ++h) {
        const float* qh = q + row0 * l.ldq + h * hd;  // (T, hd), ld ldq
        float* dqh = dq + row0 * l.ldq + h * hd;
        const float* dy = dout + row0 * l.ldo + h * hd;  // (T, hd), ld ldo
        const float* p = att + static_cast<size_t>(bi * l.nh + h) * tt;
        // Per query tile: d att = dy v^T, then the softmax backward
        // ds = p * (d att - sum(p * d att)) (zero where masked), then dq += scale ds k.
        for (int64_t r0 = 0; r0 < t; r0 += kAttentionTile) {
          const int64_t rows = std::min(kAttentionTile, t - r0), cols = r0 + rows;
          float* dst = ds.data() + static_cast<size_t>(r0) * t;
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, Dim(rows), Dim(cols), Dim(hd), 1.0f,
                      dy + static_cast<size_t>(r0) * l.ldo, ldo, vg, ldk, 0.0f, dst, Dim(t));
          for (int64_t i = r0; i < r0 + rows; ++i) {
            float* d = ds.data() + static_cast<size_t>(i) * t;
            const float* pr = p + static_cast<size_t>(i) * t;
            const int64_t len = i + 1;
            SoftmaxGradRow(pr, d, len, Dot(pr, d, len));
            std::fill(d + len, d + t, 0.0f);
          }
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, Dim(rows), Dim(hd), Dim(cols),
                      scale, dst, Dim(t), kg, ldk, 1.0f, dqh + static_cast<size_t>(r0) * l.ldq,
                      ldq);
        }
        // Per key tile [c0, c0 + w): only queries i >= c0 see it.
        // dv += att^T dy; dk += scale ds^T q.
        for (int64_t c0 = 0; c0 < t; c0 += kAttentionTile) {
          const int64_t w = std::min(kAttentionTile, t - c0), rows = t - c0;
          const size_t at = static_cast<size_t>(c0) * t + c0;
          cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, Dim(w), Dim(hd), Dim(rows), 1.0f,
                      p + at, Dim(t), dy + static_cast<size_t>(c0) * l.ldo, ldo, 1.0f,
                      dvg + static_cast<size_t>(c0) * l.ldk, ldk);
          cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, Dim(w), Dim(hd), Dim(rows), scale,
                      ds.data() + at, Dim(t), qh + static_cast<size_t>(c0) * l.ldq, ldq, 1.0f,
                      dkg + static_cast<size_t>(c0) * l.ldk, ldk);
        }
      }
    }
  };
  const int threads = KernelThreads();
  const int64_t tasks = l.b * l.kv;
  if (threads == 1) {
    run(0, tasks);
    return;
  }
  BlasOnCallingThread blas;  // also for a single task: OpenBLAS's threads must stay out
  ParallelFor(threads, tasks, 1, run);
}

void CausalAttentionForward(const float* qkv, float* att, float* out, int64_t b, int64_t t,
                            int64_t c, int64_t nh) {
  const AttentionLayout l{b, t, nh, nh, c / nh, 3 * c, 3 * c, c};
  StridedCausalAttentionForward(l, qkv, qkv + c, qkv + 2 * c, att, out);
}

void CausalAttentionBackward(const float* dout, const float* qkv, const float* att, float* dqkv,
                             int64_t b, int64_t t, int64_t c, int64_t nh) {
  const AttentionLayout l{b, t, nh, nh, c / nh, 3 * c, 3 * c, c};
  StridedCausalAttentionBackward(l, dout, qkv, qkv + c, qkv + 2 * c, att, dqkv, dqkv + c,
                                 dqkv + 2 * c);
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
  ParallelForElements(
      count, [&](int64_t i0, int64_t i1) { Map4(in + i0, out + i0, i1 - i0, GeluForward4); });
}

namespace {
void GeluBackward4(const float* in, const float* dout, float* din, int64_t count) {
  int64_t i = 0;
  for (; i + kLanes <= count; i += kLanes) {
    Store(din + i, Load(din + i) + GeluGrad4(Load(in + i)) * Load(dout + i));
  }
  if (i < count) {
    float x[kLanes] = {}, d[kLanes] = {}, g[kLanes] = {};
    std::copy(in + i, in + count, x);
    std::copy(dout + i, dout + count, d);
    std::copy(din + i, din + count, g);
    Store(g, Load(g) + GeluGrad4(Load(x)) * Load(d));
    std::copy(g, g + (count - i), din + i);
  }
}
}  // namespace

void GeluBackwardFast(const float* in, const float* dout, float* din, int64_t count) {
  ParallelForElements(
      count, [&](int64_t i0, int64_t i1) { GeluBackward4(in + i0, dout + i0, din + i0, i1 - i0); });
}

void Add(const float* a, const float* b, float* out, int64_t count) {
  ParallelForElements(count, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) out[i] = a[i] + b[i];
  });
}

double SumOfSquares(const float* x, int64_t count) {
  double s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= count; i += 8) {
    for (int k = 0; k < 8; ++k) s[k] += static_cast<double>(x[i + k]) * x[i + k];
  }
  for (int k = 0; i < count; ++i, ++k) s[k] += static_cast<double>(x[i]) * x[i];
  return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

}  // namespace tandem::worker::kernels
