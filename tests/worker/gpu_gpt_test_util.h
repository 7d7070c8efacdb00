// Shared by the GpuGpt tests (gpu_gpt_layout_test.cc: host only; gpu_gpt_test.cc: on a device):
// the tiny GPT they run (2 layers, d 64, 4 heads, T 16, V 128), the gpt2 preset's shapes, the
// CPU gpt layers (worker/model/gpt.h) they compare with, and the per-tensor comparison.
#ifndef TANDEM_TESTS_WORKER_GPU_GPT_TEST_UTIL_H_
#define TANDEM_TESTS_WORKER_GPU_GPT_TEST_UTIL_H_

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "worker/backend/cuda/gpu_gpt_layout.h"
#include "worker/model/gpt.h"

namespace tandem::worker::cuda {

inline GpuGptConfig TinyConfig(GpuPrecision precision, bool tied = true) {
  GpuGptConfig c;
  c.n_layer = 2;
  c.n_head = 4;
  c.d_model = 64;
  c.seq_len = 16;
  c.vocab = 128;
  c.tie_embeddings = tied;
  c.batch = 4;
  c.seq = 16;
  c.precision = precision;
  c.seed = 7;
  return c;
}

// The `gpt2` preset (common/spec.cc: GPT-2 124M, 12 layers, d 768, 12 heads, T 1024, V 50304,
// tied) with micro-batch (batch, 1024).
inline GpuGptConfig Gpt2Config(GpuPrecision precision, int64_t batch) {
  GpuGptConfig c;
  c.n_layer = 12;
  c.n_head = 12;
  c.d_model = 768;
  c.seq_len = 1024;
  c.vocab = 50304;
  c.tie_embeddings = true;
  c.batch = batch;
  c.seq = 1024;
  c.precision = precision;
  c.seed = 7;
  return c;
}

// One tensor's gradient against its reference: the largest |want| and the largest
// |got - want| over its n elements, in double; a non-finite difference (a NaN or inf on
// either side) makes max_err infinite, so that no tolerance passes it.
struct GradError {
  double max_ref = 0.0;
  double max_err = 0.0;
};
inline GradError CompareGradient(const float* got, const float* want, size_t n) {
  GradError e;
  for (size_t j = 0; j < n; ++j) {
    const double d = std::fabs(double{got[j]} - want[j]);
    e.max_ref = std::max(e.max_ref, std::fabs(double{want[j]}));
    e.max_err = std::isfinite(d) ? std::max(e.max_err, d) : HUGE_VAL;
  }
  return e;
}

// Two GPU stages of one layout (GpuGpt or GpuLlama) hold the same gradients bit for bit; the
// tensors whose name contains `atomic` (the token embedding, whose backward scatters with
// atomics, in either order) to within 1e-6 of their largest element.
template <typename Stage>
void ExpectSameGradients(const Stage& a, const Stage& b, const std::string& atomic) {
  ASSERT_EQ(a.layout().size(), b.layout().size());
  for (size_t i = 0; i < a.layout().size(); ++i) {
    std::vector<float> ga(a.layout()[i].count), gb(ga.size());
    ASSERT_TRUE(a.GetGradient(i, ga.data(), ga.size()).ok());
    ASSERT_TRUE(b.GetGradient(i, gb.data(), gb.size()).ok());
    const std::string& name = a.layout()[i].name;
    if (name.find(atomic) == std::string::npos) {
      EXPECT_EQ(ga, gb) << name;
    } else {
      const GradError e = CompareGradient(gb.data(), ga.data(), ga.size());
      EXPECT_LE(e.max_err, 1e-6 * e.max_ref + 1e-9) << name;
    }
  }
}

inline GptConfig CpuConfig(const GpuGptConfig& c) {
  GptConfig g;
  g.n_layer = c.n_layer;
  g.n_head = c.n_head;
  g.d_model = c.d_model;
  g.d_hidden = c.d_hidden == 0 ? 4 * c.d_model : c.d_hidden;
  g.seq_len = c.seq_len;
  g.vocab = c.vocab;
  g.tie_embeddings = c.tie_embeddings;
  return g;
}

// The CPU model: its layers and their parameters in order.
struct CpuGpt {
  std::vector<std::unique_ptr<Layer>> layers;
  std::vector<Parameter*> params;  // every layer's, the head's tied wte copy included
  // params[i] for the GPU layout's tensor i (the tied head copy has no GPU tensor).
  std::vector<Parameter*> matching;
  Parameter* head_wte = nullptr;  // the head's tied copy, or null

  explicit CpuGpt(const GpuGptConfig& c) {
    const GptConfig g = CpuConfig(c);
    layers.push_back(std::make_unique<GptEmbedding>(g, c.seed));
    for (int i = 0; i < g.n_layer; ++i) layers.push_back(std::make_unique<GptBlock>(g, i, c.seed));
    layers.push_back(std::make_unique<GptHead>(g, c.seed));
    for (auto& l : layers) {
      for (Parameter* p : l->Parameters()) {
        params.push_back(p);
        if (l->is_loss() && p->tied) {
          head_wte = p;
        } else {
          matching.push_back(p);
        }
      }
    }
  }

  // Forward + backward of one micro-batch; returns the loss (sum / normalizer).
  float ForwardBackward(const IntTensor& tokens, const IntTensor& targets, int64_t normalizer) {
    MicroBatchData data;
    data.tokens = &tokens;
    data.targets = &targets;
    data.loss_normalizer = normalizer;
    std::vector<SavedContext> ctx(layers.size());
    Tensor x, y;
    for (size_t i = 0; i < layers.size(); ++i) {
      EXPECT_TRUE(layers[i]->Forward(x, data, ctx[i], y).ok());
      x = std::move(y);
    }
    const float loss = x[0];
    Tensor g, gin;
    for (size_t i = layers.size(); i-- > 0;) {
      EXPECT_TRUE(layers[i]->Backward(g, ctx[i], gin).ok());
      g = std::move(gin);
    }
    return loss;
  }

  // The executor's tie rule: both copies get the summed gradient.
  void TieGradients() {
    if (head_wte == nullptr) return;
    Parameter* wte = matching[0];
    for (size_t j = 0; j < wte->grad.size(); ++j) {
      const float s = wte->grad[j] + head_wte->grad[j];
      wte->grad[j] = s;
      head_wte->grad[j] = s;
    }
  }

  // After TieGradients: the global norm, the tied wte once.
  double GradNorm() const {
    double s = 0.0;
    for (const Parameter* p : matching) {
      for (size_t j = 0; j < p->grad.size(); ++j) s += double{p->grad[j]} * p->grad[j];
    }
    return std::sqrt(s);
  }
};

}  // namespace tandem::worker::cuda

#endif  // TANDEM_TESTS_WORKER_GPU_GPT_TEST_UTIL_H_
