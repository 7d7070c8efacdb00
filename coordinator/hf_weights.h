// A Hugging Face checkpoint opened for reading (init.hf_file): one safetensors file, or a
// sharded one, model.safetensors.index.json, whose "weight_map" maps each tensor name to a
// shard file in the index's own directory. Every file is resolved under the models root as
// common/confined_path.h says (no '..', no symlink out of the root), the shards included.
//
// Tensors read as fp32 whatever the file stores: F32 as is, BF16 and F16 widened exactly
// (both are subsets of fp32: every value, subnormals, infinities and NaNs included, maps to
// one fp32 value). Immutable after Open: safe to read from several threads.
#ifndef TANDEM_COORDINATOR_HF_WEIGHTS_H_
#define TANDEM_COORDINATOR_HF_WEIGHTS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/safetensors.h"

namespace tandem::coordinator {

// Widening conversions of one element (exact).
float Bf16ToFloat(uint16_t bits);
float F16ToFloat(uint16_t bits);

class HfWeights {
 public:
  // Opens `relative` (the spec's init.hf_file) under `root` (<data-root>/models, named
  // `root_name` in errors). A name ending in ".json" is a shard index, anything else one
  // safetensors file. Every error starts "init.hf_file: ":
  //   INVALID_ARGUMENT  a bad path (ResolveConfined); an index that is not JSON, has no
  //                     "weight_map" object of strings, or names a shard that is not a plain
  //                     file name;
  //   NOT_FOUND         the file or a shard does not exist;
  //   PERMISSION_DENIED it or a shard resolves outside the root;
  //   DATA_LOSS         a malformed safetensors file, or a shard without a tensor the index
  //                     maps to it (naming both).
  static absl::StatusOr<std::unique_ptr<HfWeights>> Open(const std::string& root,
                                                         const std::string& relative,
                                                         const std::string& root_name);

  // The tensor's name, dtype and shape as the file declares them; nullptr if absent.
  const TensorInfo* Find(const std::string& name) const;
  // Every tensor name, sorted.
  std::vector<std::string> Names() const;
  // The tensor's elements as fp32, row-major in the file's shape. NOT_FOUND for an absent
  // name; INVALID_ARGUMENT naming the tensor for a dtype other than F32, BF16 and F16.
  absl::StatusOr<std::vector<float>> ReadF32(const std::string& name) const;
  // What the errors call the checkpoint: the spec's relative path.
  const std::string& name() const { return name_; }

 private:
  HfWeights() = default;

  std::string name_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const SafetensorsFile*> by_name_;
};

}  // namespace tandem::coordinator

#endif  // TANDEM_COORDINATOR_HF_WEIGHTS_H_
