// What the coordinator needs to know about a model without building it: its sequence of
// partitionable layers [embedding, block_0 .. block_{L-1}, head], and how to cut it.
#ifndef TANDEM_COMMON_MODEL_DESC_H_
#define TANDEM_COMMON_MODEL_DESC_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "tandem/v1/spec.pb.h"

namespace tandem {

// Number of partitionable layers: n_layer blocks plus the embedding and the head.
int NumLayers(const v1::ModelSpec& model);
// "embedding", "block_3", "head".
std::string LayerName(const v1::ModelSpec& model, int global_index);

// A contiguous range of global layer indices [begin, end) held by one stage.
struct LayerRange {
  int begin = 0;
  int end = 0;
  bool operator==(const LayerRange&) const = default;
};

// Uniform partition: all n_layer + 2 layers (the embedding and the head count as one layer
// each) split into contiguous ranges as evenly as possible, earlier stages taking the
// remainder; so the embedding is on stage 0 and the head on the last. Every stage holds at
// least one layer; fails if num_stages exceeds the number of layers.
absl::StatusOr<std::vector<LayerRange>> UniformPartition(const v1::ModelSpec& model,
                                                         int num_stages);

}  // namespace tandem

#endif  // TANDEM_COMMON_MODEL_DESC_H_
