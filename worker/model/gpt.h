// The `gpt` architecture: a GPT-2 style decoder (Radford et al. 2019), in the layout of
// Hugging Face's GPT2LMHeadModel and karpathy/llm.c.
//
//   embedding (layer 0):    tokens (B, T) -> wte[tok] + wpe[t]                  (B, T, C)
//   block_i (1..L):         x + attn(ln_1(x)), then + mlp(ln_2(.))   (B, T, C) -> (B, T, C)
//                           attn: c_attn (C -> 3C) -> causal multi-head softmax(q k^T / sqrt(hd)) v
//                                 -> c_proj (C -> C); mlp: c_fc (C -> 4C) -> gelu_tanh -> c_proj
//   head (layer L+1):       ln_f -> logits = x W^T (W (V, C), no bias; W is wte when
//                           tie_embeddings) -> cross-entropy at every position  (B, T, C) -> (1,)
//
// Weights are drawn from Rng(MixSeed(seed, global layer index)) in a fixed order, so every
// partition starts from identical weights. With tie_embeddings the head owns its own copy of
// wte, drawn from the EMBEDDING's stream (MixSeed(seed, 0)), so both copies start
// bit-identical; both Parameters are named "transformer.wte.weight" and flagged `tied`, and
// the executor must add the two copies' gradients before the optimizer step so that they
// stay equal.
//
// Parameter names follow GPT2LMHeadModel's state_dict. Linear weights here are (out, in) as
// in nn.Linear; HF stores its Conv1D weights (c_attn, c_proj, c_fc) as (in, out), so an export
// to HF transposes those four matrices per block (wte, wpe and lm_head are not transposed).
//
// Saved activations (per micro-batch, fp32): a block keeps x, ln_1, qkv, the attention
// probabilities (B, NH, T, T), the merged heads, x + attn, ln_2, the MLP pre-activation and
// GELU output: (8 C + 2 H + NH T) floats per token, 16 C + NH T at H = 4C (and the norms'
// means and rstds, 4 floats), nothing recomputed in backward. With selective_recompute
// (pipeline.recompute: selective) it keeps neither the probabilities nor the GELU output:
// (8 C + H) floats per token, 12 C at H = 4C. Its backward recomputes the probabilities from
// the kept qkv (the attention's forward once more, just before the attention's backward) and
// the GELU output from the kept pre-activation (where c_proj's weight gradient needs it: in B,
// or in W of a split backward, whose I pass then leaves the pre-activation instead), with the
// forward's own kernels, so the gradients are bit for bit those of a block that kept them.
// The head keeps its input, ln_f and softmax - onehot (B*T, V): for V = 50304 that is 201 KB
// per token, the price of not recomputing the (B*T, C) x (C, V) GEMM in backward.
#ifndef TANDEM_WORKER_MODEL_GPT_H_
#define TANDEM_WORKER_MODEL_GPT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "tandem/v1/spec.pb.h"
#include "worker/model/layer.h"

namespace tandem::worker {

struct GptConfig {
  int64_t n_layer = 0;   // L
  int64_t n_head = 0;    // NH
  int64_t d_model = 0;   // C (a multiple of NH; head size hd = C / NH)
  int64_t d_hidden = 0;  // MLP width (model.d_hidden, or 4 * C when 0)
  int64_t seq_len = 0;   // maximum T (rows of wpe)
  int64_t vocab = 0;     // V
  bool tie_embeddings = true;
  // Selective recomputation: a block does not keep its attention probabilities and GELU
  // output for the backward, which recomputes them (see above). Not a model field: the job's
  // pipeline.recompute (model_layers.h's BuildModelLayers for a JobSpec sets it).
  bool selective_recompute = false;
};

// Checks the fields gpt reads (n_layer, n_head, d_model, d_hidden, seq_len, vocab_size,
// tie_embeddings); INVALID_ARGUMENT names the field. A `preset` must already have been
// resolved into those fields by the spec code: it is not read here.
absl::StatusOr<GptConfig> GptConfigFromSpec(const v1::ModelSpec& model);

// Fills wte (V, C) exactly as the embedding does: the first V*C normal(0, 0.02) draws of
// Rng(MixSeed(seed, 0)). The tied head uses it for its copy.
void InitGptTokenEmbedding(const GptConfig& cfg, uint64_t seed, Tensor& wte);

class GptEmbedding final : public Layer {
 public:
  GptEmbedding(const GptConfig& cfg, uint64_t seed);
  const std::string& name() const override { return name_; }
  int global_index() const override { return 0; }
  bool reads_tokens() const override { return true; }
  // data.tokens (B, T) with 1 <= T <= seq_len -> output (B, T, C).
  absl::Status Forward(const Tensor& input, const MicroBatchData& data, SavedContext& ctx,
                       Tensor& output) override;
  // grad_output (B, T, C); grad_input is cleared.
  absl::Status Backward(const Tensor& grad_output, const SavedContext& ctx,
                        Tensor& grad_input) override;
  std::vector<Parameter*> Parameters() override { return {&wte_, &wpe_}; }

 private:
  GptConfig cfg_;
  std::string name_ = "embedding";
  Parameter wte_;  // (V, C) transformer.wte.weight; tied with the head's W when tie_embeddings
  Parameter wpe_;  // (seq_len, C) transformer.wpe.weight
};

class GptBlock final : public Layer {
 public:
  // block_index in [0, n_layer); global index = block_index + 1.
  GptBlock(const GptConfig& cfg, int block_index, uint64_t seed);
  const std::string& name() const override { return name_; }
  int global_index() const override { return block_index_ + 1; }
  // input (B, T, C) -> output (B, T, C); the attention is causal along T.
  absl::Status Forward(const Tensor& input, const MicroBatchData& data, SavedContext& ctx,
                       Tensor& output) override;
  // Forward without its last GEMM and residual add (mlp.c_proj's, down_proj's), which
  // only the output needs.
  absl::Status RecomputeContext(const Tensor& input, const MicroBatchData& data,
                                SavedContext& ctx) override;
  // Forward's arithmetic in its two halves, each half's intermediates freed as it ends (the
  // attention's, then the MLP's): about half the context at once.
  absl::Status ForwardWithoutSaving(const Tensor& input, const MicroBatchData& data, Tensor& output,
                                    size_t* peak_bytes) override;
  absl::Status Backward(const Tensor& grad_output, const SavedContext& ctx,
                        Tensor& grad_input) override;
  // I: the input gradient and the norms' gains and biases; W: the four linears' weights and
  // biases (the GEMMs dW = dout^T in), from the linears' inputs and output gradients kept in ctx.
  absl::Status BackwardInput(const Tensor& grad_output, SavedContext& ctx,
                             Tensor& grad_input) override;
  absl::Status BackwardWeight(SavedContext& ctx) override;
  std::vector<Parameter*> Parameters() override {
    return {&ln1_g_, &ln1_b_, &attn_w_, &attn_b_, &attn_proj_w_, &attn_proj_b_,
            &ln2_g_, &ln2_b_, &fc_w_,   &fc_b_,   &mlp_proj_w_,  &mlp_proj_b_};
  }

 private:
  // Forward's arithmetic, one code for all three: output null skips the last GEMM and residual
  // add; ctx null keeps nothing and frees the attention half's intermediates before the MLP
  // half runs; peak_bytes (when set) gets the larger half's intermediates.
  absl::Status Run(const Tensor& input, SavedContext* ctx, Tensor* output, size_t* peak_bytes);
  absl::Status InputGradients(const Tensor& grad_output, const SavedContext& ctx,
                              Tensor& grad_input, std::vector<Tensor>& douts);
  void WeightGradients(const std::vector<Tensor>& saved, const Tensor* douts);

  GptConfig cfg_;
  int block_index_;
  std::string name_;
  Parameter ln1_g_;        // (C)      transformer.h.{i}.ln_1.weight
  Parameter ln1_b_;        // (C)      transformer.h.{i}.ln_1.bias
  Parameter attn_w_;       // (3C, C)  transformer.h.{i}.attn.c_attn.weight; rows q | k | v
  Parameter attn_b_;       // (3C)     transformer.h.{i}.attn.c_attn.bias
  Parameter attn_proj_w_;  // (C, C)   transformer.h.{i}.attn.c_proj.weight, std / sqrt(2L)
  Parameter attn_proj_b_;  // (C)      transformer.h.{i}.attn.c_proj.bias
  Parameter ln2_g_;        // (C)      transformer.h.{i}.ln_2.weight
  Parameter ln2_b_;        // (C)      transformer.h.{i}.ln_2.bias
  Parameter fc_w_;         // (H, C)   transformer.h.{i}.mlp.c_fc.weight (H = d_hidden)
  Parameter fc_b_;         // (H)      transformer.h.{i}.mlp.c_fc.bias
  Parameter mlp_proj_w_;   // (C, H)   transformer.h.{i}.mlp.c_proj.weight, std / sqrt(2L)
  Parameter mlp_proj_b_;   // (C)      transformer.h.{i}.mlp.c_proj.bias
};

class GptHead final : public Layer {
 public:
  GptHead(const GptConfig& cfg, uint64_t seed);
  const std::string& name() const override { return name_; }
  int global_index() const override { return static_cast<int>(cfg_.n_layer) + 1; }
  bool is_loss() const override { return true; }
  // input (B, T, C), data.targets (B, T) in [0, V) -> output (1,) = summed cross-entropy /
  // data.loss_normalizer.
  absl::Status Forward(const Tensor& input, const MicroBatchData& data, SavedContext& ctx,
                       Tensor& output) override;
  absl::Status Backward(const Tensor& grad_output, const SavedContext& ctx,
                        Tensor& grad_input) override;
  // I: the input gradient and ln_f's gradients; W: the (V, C) projection's gradient.
  absl::Status BackwardInput(const Tensor& grad_output, SavedContext& ctx,
                             Tensor& grad_input) override;
  absl::Status BackwardWeight(SavedContext& ctx) override;
  std::vector<Parameter*> Parameters() override { return {&ln_g_, &ln_b_, &w_}; }

 private:
  absl::Status InputGradient(const Tensor& grad_output, const SavedContext& ctx, Tensor& grad_input,
                             float& scale);
  void WeightGradient(const SavedContext& ctx, float scale);

  GptConfig cfg_;
  std::string name_ = "head";
  Parameter ln_g_;  // (C) transformer.ln_f.weight
  Parameter ln_b_;  // (C) transformer.ln_f.bias
  // (V, C) lm_head.weight, or the tied copy of transformer.wte.weight (tied = true).
  Parameter w_;
};

// The layers [layer_begin, layer_end) of a gpt model (global indices: embedding 0, block_i
// i + 1, head n_layer + 1). INVALID_ARGUMENT on a bad model or range.
absl::StatusOr<std::vector<std::unique_ptr<Layer>>> BuildGptLayers(const v1::ModelSpec& model,
                                                                   uint64_t seed, int layer_begin,
                                                                   int layer_end);
// The same from a config GptConfigFromSpec made (with what a job may set on it, such as
// selective_recompute).
absl::StatusOr<std::vector<std::unique_ptr<Layer>>> BuildGptLayers(const GptConfig& cfg,
                                                                   uint64_t seed, int layer_begin,
                                                                   int layer_end);

}  // namespace tandem::worker

#endif  // TANDEM_WORKER_MODEL_GPT_H_
