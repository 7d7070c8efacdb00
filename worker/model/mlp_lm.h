// The `mlp_lm` architecture: a byte-level MLP language model (Bengio et al. 2003 style).
//
//   embedding (layer 0):      tokens (B, K) -> flatten_k(tok[x_k] + pos[k]) (B, K*E) -> Linear ->
//   (B, D) block_i (layers 1..L):    h + W2 gelu(W1 LN(h) + b1) + b2           (B, D) -> (B, D)
//   head (layer L+1):         LN -> Linear (D -> V) -> cross-entropy    (B, D) -> loss (1,)
//
// Each layer's parameters are drawn from an Rng seeded by MixSeed(seed, global layer index)
// only, in a fixed order, so every partition of the model starts from identical weights.
#ifndef TANDEM_WORKER_MODEL_MLP_LM_H_
#define TANDEM_WORKER_MODEL_MLP_LM_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "tandem/v1/spec.pb.h"
#include "worker/model/layer.h"

namespace tandem::worker {

struct MlpLmConfig {
  int64_t n_layer = 0;
  int64_t vocab = 0;     // V
  int64_t context = 0;   // K
  int64_t d_embed = 0;   // E
  int64_t d_model = 0;   // D
  int64_t d_hidden = 0;  // H (model.d_hidden, or 4 * D when 0)
};

// Checks the fields mlp_lm reads; INVALID_ARGUMENT names the field ("model.d_model ...").
absl::StatusOr<MlpLmConfig> MlpLmConfigFromSpec(const v1::ModelSpec& model);

class EmbeddingLayer final : public Layer {
 public:
  EmbeddingLayer(const MlpLmConfig& cfg, uint64_t seed);
  const std::string& name() const override { return name_; }
  int global_index() const override { return 0; }
  bool reads_tokens() const override { return true; }
  absl::Status Forward(const Tensor& input, const MicroBatchData& data, SavedContext& ctx,
                       Tensor& output) override;
  absl::Status Backward(const Tensor& grad_output, const SavedContext& ctx,
                        Tensor& grad_input) override;
  std::vector<Parameter*> Parameters() override { return {&tok_, &pos_, &proj_w_, &proj_b_}; }

 private:
  MlpLmConfig cfg_;
  std::string name_ = "embedding";
  Parameter tok_;     // (V, E)
  Parameter pos_;     // (K, E)
  Parameter proj_w_;  // (D, K*E)
  Parameter proj_b_;  // (D)
};

class MlpBlockLayer final : public Layer {
 public:
  // block_index in [0, n_layer); global index = block_index + 1.
  MlpBlockLayer(const MlpLmConfig& cfg, int block_index, uint64_t seed);
  const std::string& name() const override { return name_; }
  int global_index() const override { return block_index_ + 1; }
  absl::Status Forward(const Tensor& input, const MicroBatchData& data, SavedContext& ctx,
                       Tensor& output) override;
  absl::Status Backward(const Tensor& grad_output, const SavedContext& ctx,
                        Tensor& grad_input) override;
  std::vector<Parameter*> Parameters() override {
    return {&ln_g_, &ln_b_, &fc1_w_, &fc1_b_, &fc2_w_, &fc2_b_};
  }

 private:
  MlpLmConfig cfg_;
  int block_index_;
  std::string name_;
  Parameter ln_g_;   // (D)
  Parameter ln_b_;   // (D)
  Parameter fc1_w_;  // (H, D)
  Parameter fc1_b_;  // (H)
  Parameter fc2_w_;  // (D, H), init scaled by 1/sqrt(2 n_layer)
  Parameter fc2_b_;  // (D)
};

class LmHeadLayer final : public Layer {
 public:
  LmHeadLayer(const MlpLmConfig& cfg, uint64_t seed);
  const std::string& name() const override { return name_; }
  int global_index() const override { return static_cast<int>(cfg_.n_layer) + 1; }
  bool is_loss() const override { return true; }
  absl::Status Forward(const Tensor& input, const MicroBatchData& data, SavedContext& ctx,
                       Tensor& output) override;
  absl::Status Backward(const Tensor& grad_output, const SavedContext& ctx,
                        Tensor& grad_input) override;
  std::vector<Parameter*> Parameters() override { return {&ln_g_, &ln_b_, &w_, &b_}; }

 private:
  MlpLmConfig cfg_;
  std::string name_ = "head";
  Parameter ln_g_;  // (D)
  Parameter ln_b_;  // (D)
  Parameter w_;     // (V, D)
  Parameter b_;     // (V)
};

// The layers [layer_begin, layer_end) of an mlp_lm model. INVALID_ARGUMENT on a bad model or
// range.
absl::StatusOr<std::vector<std::unique_ptr<Layer>>> BuildMlpLmLayers(const v1::ModelSpec& model,
                                                                     uint64_t seed, int layer_begin,
                                                                     int layer_end);

}  // namespace tandem::worker

#endif  // TANDEM_WORKER_MODEL_MLP_LM_H_
