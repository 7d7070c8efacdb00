// The `llama` architecture: a Llama-style decoder (Touvron et al. 2023), in the layout of
// Hugging Face's LlamaForCausalLM.
//
//   embedding (layer 0):  tokens (B, T) -> embed_tokens[tok] (no learned positions)  (B, T, C)
//   block_i (1..L):       x + attn(rms_1(x)), then + mlp(rms_2(.))       (B, T, C) -> (B, T, C)
//                         attn: q = RoPE(q_proj x) (NH heads), k = RoPE(k_proj x), v = v_proj x
//                               (KV heads each; query head h reads kv head h / (NH / KV)) ->
//                               causal softmax(q k^T / sqrt(hd)) v -> o_proj (C -> C)
//                         mlp:  down_proj(silu(gate_proj x) * up_proj x)  (C -> H -> C)
//   head (layer L+1):     rms_f -> logits = x W^T (W (V, C); W is embed_tokens when
//                         tie_embeddings) -> cross-entropy at every position  (B, T, C) -> (1,)
//
// hd = C / NH is even (RoPE rotates the pairs (j, j + hd/2), HF's rotate_half convention;
// positions start at 0 in each sequence, so T <= seq_len). No linear has a bias. RMSNorm is
// y = x / sqrt(mean(x^2) + rms_eps) * g.
//
// Weights are drawn from Rng(MixSeed(seed, global layer index)) in a fixed order (below), so
// every partition starts from identical weights: normal(0, 0.02), o_proj and down_proj
// scaled by 1/sqrt(2L) as GPT-2's residual projections (HF's Llama init does not scale them);
// norm gains 1. With tie_embeddings the head owns its own copy of the embedding, drawn from
// the EMBEDDING's stream (MixSeed(seed, 0)), so both copies start bit-identical; both
// Parameters are named "model.embed_tokens.weight" and flagged `tied`, and the executor must
// add the two copies' gradients before the optimizer step (as for gpt; see layer.h).
//
// Parameter names follow LlamaForCausalLM's state_dict, and every weight is (out, in) as in
// nn.Linear, so an export to HF needs no transposes.
//
// Saved activations (per micro-batch, fp32; KVD = KV * hd): a block keeps x, rms_1(x) and its
// rstd, the rotated q (C) and k (KVD), v (KVD), the attention probabilities (B, NH, T, T), the
// merged heads, x + attn, rms_2 and its rstd, and the MLP's gate and up pre-activations (H
// each): (6 C + 2 KVD + 2 H + 2 + NH T) floats per token. silu(gate) * up is recomputed in
// backward (one elementwise pass) instead of being kept. With selective_recompute
// (pipeline.recompute: selective) the block keeps everything but the probabilities,
// (6 C + 2 KVD + 2 H + 2) floats per token: its backward recomputes them from the kept q, k
// and v (the attention's forward once more, just before the attention's backward) with the
// forward's own kernel, so the gradients are bit for bit those of a block that kept them. What
// it keeps, as Megatron's selective recompute does, are the GEMMs' inputs and outputs, the
// residual stream and the rstds. The split backward's I pass leaves for W the linears' inputs
// (rms_1, merged heads, rms_2, silu(gate) * up) and output gradients: (6 C + 2 KVD + 3 H)
// floats per token, with or without selective_recompute. The head keeps its input, rms_f and its
// rstd, and softmax - onehot (B*T, V), as gpt's.
#ifndef TANDEM_WORKER_MODEL_LLAMA_H_
#define TANDEM_WORKER_MODEL_LLAMA_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/model/layer.h"

namespace tandem::worker {

struct LlamaConfig {
  int64_t n_layer = 0;          // L (0 is a model of the embedding and the head only)
  int64_t n_head = 0;           // NH query heads
  int64_t n_kv_head = 0;        // KV key/value heads, dividing NH (NH: MHA, 1: MQA)
  int64_t d_model = 0;          // C, a multiple of NH with an even head size hd = C / NH
  int64_t d_hidden = 0;         // H, the SwiGLU width (HF's intermediate_size)
  int64_t seq_len = 0;          // maximum T (the RoPE tables' rows)
  int64_t vocab = 0;            // V
  double rope_theta = 10000.0;  // RoPE base
  double rms_eps = 1e-5;        // RMSNorm epsilon (HF's rms_norm_eps)
  bool tie_embeddings = false;
  // Selective recomputation: a block does not keep its attention probabilities for the
  // backward, which recomputes them (see above). Not a model field: the job's
  // pipeline.recompute (model_layers.h's BuildModelLayers for a JobSpec sets it).
  bool selective_recompute = false;
};

// OK when the layers can be built from cfg. INVALID_ARGUMENT with the field first
// ("model.n_kv_head ...", with the spec's field names: vocab is model.vocab_size) for a size
// outside [1, kMaxDim] (n_layer: [0, kMaxLayers]); n_kv_head not dividing n_head; d_model not
// a multiple of n_head; an odd head size d_model / n_head; rope_theta or rms_eps not a finite
// number > 0; a weight matrix or a whole model over common/limits.h's limits.
absl::Status ValidateLlamaConfig(const LlamaConfig& cfg);

// Fills embed_tokens (V, C) exactly as the embedding does: the first V*C normal(0, 0.02)
// draws of Rng(MixSeed(seed, 0)). The tied head uses it for its copy.
void InitLlamaTokenEmbedding(const LlamaConfig& cfg, uint64_t seed, Tensor& embed_tokens);

// The layers' constructors take a config that ValidateLlamaConfig accepted (BuildLlamaLayers
// checks it); they do not check it again.

class LlamaEmbedding final : public Layer {
 public:
  LlamaEmbedding(const LlamaConfig& cfg, uint64_t seed);
  const std::string& name() const override { return name_; }
  int global_index() const override { return 0; }
  bool reads_tokens() const override { return true; }
  // data.tokens (B, T) with 1 <= T <= seq_len -> output (B, T, C).
  absl::Status Forward(const Tensor& input, const MicroBatchData& data, SavedContext& ctx,
                       Tensor& output) override;
  // grad_output (B, T, C); grad_input is cleared.
  absl::Status Backward(const Tensor& grad_output, const SavedContext& ctx,
                        Tensor& grad_input) override;
  std::vector<Parameter*> Parameters() override { return {&wte_}; }

 private:
  LlamaConfig cfg_;
  std::string name_ = "embedding";
  // (V, C) model.embed_tokens.weight; tied with the head's W when tie_embeddings.
  Parameter wte_;
};

class LlamaBlock final : public Layer {
 public:
  // block_index in [0, n_layer); global index = block_index + 1. Draw order on
  // Rng(MixSeed(seed, block_index + 1)): q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj,
  // down_proj.
  LlamaBlock(const LlamaConfig& cfg, int block_index, uint64_t seed);
  const std::string& name() const override { return name_; }
  int global_index() const override { return block_index_ + 1; }
  // input (B, T, C) with 1 <= T <= seq_len -> output (B, T, C); the attention is causal along
  // T and token t is rotated by position t.
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
  // I: the input gradient and the norms' gains; W: the seven linears' weights (the GEMMs
  // dW = dout^T in), from the linears' inputs and output gradients kept in ctx.
  absl::Status BackwardInput(const Tensor& grad_output, SavedContext& ctx,
                             Tensor& grad_input) override;
  absl::Status BackwardWeight(SavedContext& ctx) override;
  std::vector<Parameter*> Parameters() override {
    return {&rms1_g_, &q_w_, &k_w_, &v_w_, &o_w_, &rms2_g_, &gate_w_, &up_w_, &down_w_};
  }

 private:
  // Forward's arithmetic, one code for all three: output null skips the last GEMM and residual
  // add; ctx null keeps nothing and frees the attention half's intermediates before the MLP
  // half runs; peak_bytes (when set) gets the larger half's intermediates.
  absl::Status Run(const Tensor& input, SavedContext* ctx, Tensor* output, size_t* peak_bytes);
  absl::Status InputGradients(const Tensor& grad_output, const SavedContext& ctx,
                              Tensor& grad_input, std::vector<Tensor>& wpass);
  void WeightGradients(const std::vector<Tensor>& saved, const Tensor* wpass);

  LlamaConfig cfg_;
  int block_index_;
  std::string name_;
  int64_t hd_;        // head size C / NH
  Tensor rope_cos_;   // (seq_len, hd/2) cos(t w_j), from kernels::RopeTables
  Tensor rope_sin_;   // (seq_len, hd/2)
  Parameter rms1_g_;  // (C)        model.layers.{i}.input_layernorm.weight
  Parameter q_w_;     // (C, C)     model.layers.{i}.self_attn.q_proj.weight
  Parameter k_w_;     // (KVD, C)   model.layers.{i}.self_attn.k_proj.weight
  Parameter v_w_;     // (KVD, C)   model.layers.{i}.self_attn.v_proj.weight
  Parameter o_w_;     // (C, C)     model.layers.{i}.self_attn.o_proj.weight, std / sqrt(2L)
  Parameter rms2_g_;  // (C)        model.layers.{i}.post_attention_layernorm.weight
  Parameter gate_w_;  // (H, C)     model.layers.{i}.mlp.gate_proj.weight
  Parameter up_w_;    // (H, C)     model.layers.{i}.mlp.up_proj.weight
  Parameter down_w_;  // (C, H)     model.layers.{i}.mlp.down_proj.weight, std / sqrt(2L)
};

class LlamaHead final : public Layer {
 public:
  // Untied: lm_head is drawn from Rng(MixSeed(seed, n_layer + 1)).
  LlamaHead(const LlamaConfig& cfg, uint64_t seed);
  const std::string& name() const override { return name_; }
  int global_index() const override { return static_cast<int>(cfg_.n_layer) + 1; }
  bool is_loss() const override { return true; }
  // input (B, T, C), data.targets (B, T) in [0, V) -> output (1,) = summed cross-entropy /
  // data.loss_normalizer.
  absl::Status Forward(const Tensor& input, const MicroBatchData& data, SavedContext& ctx,
                       Tensor& output) override;
  absl::Status Backward(const Tensor& grad_output, const SavedContext& ctx,
                        Tensor& grad_input) override;
  // I: the input gradient and the norm's gain; W: the (V, C) projection's gradient.
  absl::Status BackwardInput(const Tensor& grad_output, SavedContext& ctx,
                             Tensor& grad_input) override;
  absl::Status BackwardWeight(SavedContext& ctx) override;
  std::vector<Parameter*> Parameters() override { return {&norm_g_, &w_}; }

 private:
  absl::Status InputGradient(const Tensor& grad_output, const SavedContext& ctx, Tensor& grad_input,
                             float& scale);
  void WeightGradient(const SavedContext& ctx, float scale);

  LlamaConfig cfg_;
  std::string name_ = "head";
  Parameter norm_g_;  // (C) model.norm.weight
  // (V, C) lm_head.weight, or the tied copy of model.embed_tokens.weight (tied = true).
  Parameter w_;
};

// The layers [layer_begin, layer_end) of a llama model (global indices: embedding 0, block_i
// i + 1, head n_layer + 1). INVALID_ARGUMENT on a bad config (ValidateLlamaConfig) or range.
absl::StatusOr<std::vector<std::unique_ptr<Layer>>> BuildLlamaLayers(const LlamaConfig& cfg,
                                                                     uint64_t seed, int layer_begin,
                                                                     int layer_end);

}  // namespace tandem::worker

#endif  // TANDEM_WORKER_MODEL_LLAMA_H_
