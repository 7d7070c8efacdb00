#include "worker/backend/cuda/gpu_stage_layout.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"

namespace tandem::worker::cuda {

GpuStageShape StageShapeOf(int64_t n_layer, int64_t layer_begin, int64_t layer_end) {
  GpuStageShape s;
  s.embedding = layer_begin == 0;
  s.head = layer_end == n_layer + 2;
  s.b0 = std::max<int64_t>(layer_begin, 1) - 1;
  s.b1 = std::min<int64_t>(layer_end, n_layer + 1) - 1;
  if (s.b1 < s.b0) s.b1 = s.b0;
  return s;
}

absl::Status ResolveLayerRange(int64_t n_layer, int64_t* layer_begin, int64_t* layer_end) {
  const int64_t given_end = *layer_end;
  if (*layer_end == -1) *layer_end = n_layer + 2;
  if (*layer_begin < 0 || *layer_begin >= *layer_end || *layer_end > n_layer + 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("layers [", *layer_begin, ", ", given_end,
                     ") are not a non-empty range within the model's ", n_layer + 2, " layers"));
  }
  return absl::OkStatus();
}

GpuTensor& LayoutBuilder::Add(std::string name, std::vector<int64_t> shape, bool decay, bool gemm) {
  GpuTensor t;
  t.name = std::move(name);
  t.count = 1;
  for (int64_t d : shape) t.count *= static_cast<size_t>(d);
  t.shape = std::move(shape);
  t.offset = offset_;
  offset_ += t.count;
  t.decay = decay;
  t.compute_copy = bf16_ && gemm;
  if (t.compute_copy) {
    t.compute_offset = compute_offset_;
    compute_offset_ += t.count;
  }
  layout_.push_back(std::move(t));
  return layout_.back();
}

size_t ParameterElements(const std::vector<GpuTensor>& layout) {
  return layout.empty() ? 0 : layout.back().offset + layout.back().count;
}

size_t ComputeCopyElements(const std::vector<GpuTensor>& layout) {
  size_t n = 0;
  for (const GpuTensor& t : layout) {
    if (t.compute_copy) n = std::max(n, t.compute_offset + t.count);
  }
  return n;
}

GpuStageMemory ParameterMemory(const std::vector<GpuTensor>& layout) {
  GpuStageMemory m;
  const size_t p = ParameterElements(layout);
  m.parameters = p * sizeof(float);
  m.compute_weights = ComputeCopyElements(layout) * sizeof(uint16_t);  // bf16
  m.gradients = p * sizeof(float);
  m.optimizer_state = 2 * p * sizeof(float);
  return m;
}

void FillNormal(Rng& rng, float stddev, float* out, size_t count) {
  for (size_t i = 0; i < count; ++i) out[i] = static_cast<float>(rng.Normal() * stddev);
}

float ResidualProjectionStd(int64_t n_layer) {
  return kGpuInitStd / std::sqrt(2.0f * static_cast<float>(std::max<int64_t>(n_layer, 1)));
}

}  // namespace tandem::worker::cuda
