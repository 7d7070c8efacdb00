#include "common/model_desc.h"

#include "absl/strings/str_cat.h"

namespace tandem {

int NumLayers(const v1::ModelSpec& model) { return model.n_layer() + 2; }

std::string LayerName(const v1::ModelSpec& model, int global_index) {
  if (global_index == 0) return "embedding";
  if (global_index == NumLayers(model) - 1) return "head";
  return absl::StrCat("block_", global_index - 1);
}

absl::StatusOr<std::vector<LayerRange>> UniformPartition(const v1::ModelSpec& model,
                                                         int num_stages) {
  const int num_layers = NumLayers(model);
  if (num_stages < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("number of stages must be at least 1, got ", num_stages));
  }
  if (num_stages > num_layers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot split ", num_layers, " layers (embedding, ", model.n_layer(),
        " blocks, head) into ", num_stages, " stages: every stage needs at least one layer"));
  }
  // Spread all layers evenly; the embedding and the head are counted as layers, so with
  // L blocks over P stages the first stage holds the embedding plus its share of blocks.
  std::vector<LayerRange> ranges;
  ranges.reserve(num_stages);
  const int base = num_layers / num_stages;
  const int extra = num_layers % num_stages;
  int begin = 0;
  for (int s = 0; s < num_stages; ++s) {
    const int size = base + (s < extra ? 1 : 0);
    ranges.push_back({begin, begin + size});
    begin += size;
  }
  return ranges;
}

}  // namespace tandem
