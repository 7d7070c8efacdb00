#include "worker/model/llama.h"

#include <algorithm>
#include <initializer_list>
#include <cmath>
#include <limits>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/limits.h"
#include "common/status_macros.h"
#include "worker/model/kernels.h"
#include "worker/model/layer_checks.h"
#include "worker/model/layer_init.h"
#include "worker/model/llama_kernels.h"
#include "worker/model/random.h"

namespace tandem::worker {
namespace {

absl::Status CheckPositive(const char* field, double value) {
  if (!std::isfinite(value) || value <= 0.0) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.", field, " must be a finite number > 0, got ", value));
  }
  return absl::OkStatus();
}

void DrawTokenEmbedding(const LlamaConfig& cfg, Rng& rng, Tensor& wte) {
  wte.Reset({cfg.vocab, cfg.d_model});
  for (size_t i = 0; i < wte.size(); ++i) wte[i] = static_cast<float>(rng.Normal() * kInitStd);
}

}  // namespace

absl::Status ValidateLlamaConfig(const LlamaConfig& cfg) {
  if (cfg.n_layer < 0 || cfg.n_layer > kMaxLayers) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.n_layer must be in [0, ", kMaxLayers, "], got ", cfg.n_layer));
  }
  for (auto [field, value] : {std::pair{"n_head", cfg.n_head},
                              {"n_kv_head", cfg.n_kv_head},
                              {"d_model", cfg.d_model},
                              {"d_hidden", cfg.d_hidden},
                              {"seq_len", cfg.seq_len},
                              {"vocab_size", cfg.vocab}}) {
    RETURN_IF_ERROR(CheckDim(field, value));
  }
  if (cfg.n_head % cfg.n_kv_head != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model.n_kv_head (", cfg.n_kv_head, ") must divide model.n_head (", cfg.n_head, ")"));
  }
  if (cfg.d_model % cfg.n_head != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model.d_model (", cfg.d_model, ") must be a multiple of model.n_head (", cfg.n_head, ")"));
  }
  if ((cfg.d_model / cfg.n_head) % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model.d_model (", cfg.d_model, ") / model.n_head (", cfg.n_head, ") = head size ",
        cfg.d_model / cfg.n_head, " must be even: rotary embeddings rotate pairs of features"));
  }
  RETURN_IF_ERROR(CheckPositive("rope_theta", cfg.rope_theta));
  RETURN_IF_ERROR(CheckPositive("rms_eps", cfg.rms_eps));
  const int64_t kvd = cfg.n_kv_head * (cfg.d_model / cfg.n_head);
  for (auto [what, rows, cols] :
       {std::tuple{"the token embedding embed_tokens", cfg.vocab, cfg.d_model},
        {"a block's q_proj", cfg.d_model, cfg.d_model},
        {"a block's k_proj", kvd, cfg.d_model},
        {"a block's gate_proj", cfg.d_hidden, cfg.d_model}}) {
    if (rows * cols > kMaxTensorElements) {
      return absl::InvalidArgumentError(absl::StrCat("model too large: ", what, " would have ",
                                                     rows, " x ", cols, " elements (limit ",
                                                     kMaxTensorElements, ")"));
    }
  }
  // Whole-model parameter count (both copies of a tied embedding), in double so that a
  // hostile config cannot overflow it.
  const double c = static_cast<double>(cfg.d_model), h = static_cast<double>(cfg.d_hidden);
  const double per_block = 2.0 * c + 2.0 * c * c + 2.0 * static_cast<double>(kvd) * c + 3.0 * h * c;
  const double total =
      2.0 * static_cast<double>(cfg.vocab) * c + static_cast<double>(cfg.n_layer) * per_block + c;
  if (total > kMaxModelParameters) {
    return absl::InvalidArgumentError(
        absl::StrCat("model too large: ", total, " parameters (limit ", kMaxModelParameters, ")"));
  }
  return absl::OkStatus();
}

void InitLlamaTokenEmbedding(const LlamaConfig& cfg, uint64_t seed, Tensor& embed_tokens) {
  Rng rng(MixSeed(seed, 0));
  DrawTokenEmbedding(cfg, rng, embed_tokens);
}

// ---------------------------------------------------------------------------------------
// Embedding. Saved context: ints[0] = tokens (B, T).

LlamaEmbedding::LlamaEmbedding(const LlamaConfig& cfg, uint64_t seed)
    : cfg_(cfg), wte_("model.embed_tokens.weight", {cfg.vocab, cfg.d_model}, true) {
  wte_.tied = cfg.tie_embeddings;
  InitLlamaTokenEmbedding(cfg, seed, wte_.value);
}

absl::Status LlamaEmbedding::Forward(const Tensor& input, const MicroBatchData& data,
                                     SavedContext& ctx, Tensor& output) {
  const int64_t c = cfg_.d_model;
  const IntTensor* tokens = data.tokens;
  if (tokens == nullptr || tokens->rank() != 2 || tokens->dim(0) < 1 || tokens->dim(1) < 1 ||
      tokens->dim(1) > cfg_.seq_len || tokens->dim(0) * tokens->dim(1) > kMaxRows) {
    return absl::InvalidArgumentError(
        absl::StrCat("embedding: expected tokens of shape (B, T) with 1 <= T <= ", cfg_.seq_len,
                     ", got ", tokens == nullptr ? "none" : tokens->ShapeString()));
  }
  const int64_t b = tokens->dim(0), t = tokens->dim(1);
  for (size_t i = 0; i < tokens->size(); ++i) {
    if ((*tokens)[i] < 0 || (*tokens)[i] >= cfg_.vocab) {
      return absl::InvalidArgumentError(absl::StrCat(
          "embedding: token ", (*tokens)[i], " is outside the vocabulary [0, ", cfg_.vocab, ")"));
    }
  }
  output.Reset({b, t, c});
  for (size_t row = 0; row < tokens->size(); ++row) {
    const float* e = wte_.value.data() + static_cast<size_t>((*tokens)[row]) * c;
    std::copy(e, e + c, output.data() + row * c);
  }
  ctx.ints.push_back(*tokens);
  return absl::OkStatus();
}

absl::Status LlamaEmbedding::Backward(const Tensor& grad_output, const SavedContext& ctx,
                                      Tensor& grad_input) {
  const int64_t c = cfg_.d_model;
  if (ctx.ints.size() != 1 || !ctx.tensors.empty()) {
    return absl::InternalError("embedding: backward without a matching forward");
  }
  const IntTensor& tokens = ctx.ints[0];
  RETURN_IF_ERROR(
      CheckSameShape(name_, "grad_output", grad_output, {tokens.dim(0), tokens.dim(1), c}));
  for (size_t row = 0; row < tokens.size(); ++row) {
    float* de = wte_.grad.data() + static_cast<size_t>(tokens[row]) * c;
    kernels::Add(de, grad_output.data() + row * c, de, c);
  }
  grad_input.Clear();
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------
// Block. Saved context, tensors (N = B*T, KVD = KV * hd):
//   0 x (B, T, C)   1 xn1 (N, C) = rms_1(x)   2 rstd1 (N)    3 q (N, C) rotated
//   4 k (N, KVD) rotated   5 v (N, KVD)      6 att (B, NH, T, T)   7 y (N, C) merged heads
//   8 x1 (N, C) = x + o_proj(y)   9 rstd2 (N)   10 xn2 (N, C) = rms_2(x1)
//  11 gate (N, H)   12 up (N, H)
// With selective recomputation att is left empty (0 bytes) and recomputed in backward.

namespace {
enum BlockSaved {
  kX,
  kXn1,
  kRstd1,
  kQ,
  kK,
  kV,
  kAtt,
  kY,
  kX1,
  kRstd2,
  kXn2,
  kGate,
  kUp,
  kNumBlockSaved
};

// What the weight GEMMs need besides the saved linear inputs (xn1, y, xn2): the down_proj input
// act = silu(gate) * up (recomputed by the input-gradient pass) and the seven linears' output
// gradients. In a split backward they follow the saved tensors in the context.
enum BlockWeightOperands { kAct, kDDown, kDGate, kDUp, kDO, kDQ, kDK, kDV, kNumWeightOperands };
}  // namespace

LlamaBlock::LlamaBlock(const LlamaConfig& cfg, int block_index, uint64_t seed)
    : cfg_(cfg),
      block_index_(block_index),
      name_(absl::StrCat("block_", block_index)),
      hd_(cfg.d_model / cfg.n_head),
      rope_cos_({cfg.seq_len, hd_ / 2}),
      rope_sin_({cfg.seq_len, hd_ / 2}),
      rms1_g_(absl::StrCat("model.layers.", block_index, ".input_layernorm.weight"), {cfg.d_model},
              false),
      q_w_(absl::StrCat("model.layers.", block_index, ".self_attn.q_proj.weight"),
           {cfg.d_model, cfg.d_model}, true),
      k_w_(absl::StrCat("model.layers.", block_index, ".self_attn.k_proj.weight"),
           {cfg.n_kv_head * hd_, cfg.d_model}, true),
      v_w_(absl::StrCat("model.layers.", block_index, ".self_attn.v_proj.weight"),
           {cfg.n_kv_head * hd_, cfg.d_model}, true),
      o_w_(absl::StrCat("model.layers.", block_index, ".self_attn.o_proj.weight"),
           {cfg.d_model, cfg.d_model}, true),
      rms2_g_(absl::StrCat("model.layers.", block_index, ".post_attention_layernorm.weight"),
              {cfg.d_model}, false),
      gate_w_(absl::StrCat("model.layers.", block_index, ".mlp.gate_proj.weight"),
              {cfg.d_hidden, cfg.d_model}, true),
      up_w_(absl::StrCat("model.layers.", block_index, ".mlp.up_proj.weight"),
            {cfg.d_hidden, cfg.d_model}, true),
      down_w_(absl::StrCat("model.layers.", block_index, ".mlp.down_proj.weight"),
              {cfg.d_model, cfg.d_hidden}, true) {
  kernels::RopeTables(cfg.seq_len, hd_, cfg.rope_theta, rope_cos_.data(), rope_sin_.data());
  rms1_g_.value.Fill(1.0f);
  rms2_g_.value.Fill(1.0f);
  // As GPT-2: residual projections scaled by 1/sqrt(2 n_layer).
  const float proj_std =
      kInitStd / std::sqrt(2.0f * static_cast<float>(std::max<int64_t>(cfg.n_layer, 1)));
  Rng rng(MixSeed(seed, static_cast<uint64_t>(block_index) + 1));
  InitNormal(rng, q_w_, kInitStd);
  InitNormal(rng, k_w_, kInitStd);
  InitNormal(rng, v_w_, kInitStd);
  InitNormal(rng, o_w_, proj_std);
  InitNormal(rng, gate_w_, kInitStd);
  InitNormal(rng, up_w_, kInitStd);
  InitNormal(rng, down_w_, proj_std);
}

absl::Status LlamaBlock::Forward(const Tensor& input, const MicroBatchData& /*data*/,
                                 SavedContext& ctx, Tensor& output) {
  return Run(input, &ctx, &output, nullptr);
}

absl::Status LlamaBlock::RecomputeContext(const Tensor& input, const MicroBatchData& /*data*/,
                                          SavedContext& ctx) {
  return Run(input, &ctx, nullptr, nullptr);
}

absl::Status LlamaBlock::ForwardWithoutSaving(const Tensor& input, const MicroBatchData& /*data*/,
                                              Tensor& output, size_t* peak_bytes) {
  return Run(input, nullptr, &output, peak_bytes);
}

absl::Status LlamaBlock::Run(const Tensor& input, SavedContext* ctx, Tensor* output,
                             size_t* peak_bytes) {
  const int64_t c = cfg_.d_model, h = cfg_.d_hidden, nh = cfg_.n_head, kv = cfg_.n_kv_head;
  const int64_t kvd = kv * hd_;
  const float eps = static_cast<float>(cfg_.rms_eps);
  RETURN_IF_ERROR(CheckActivation(name_, "input", input, cfg_.seq_len, c));
  const int64_t b = input.dim(0), t = input.dim(1), n = b * t;
  Tensor xn1({n, c}), rstd1({n}), q({n, c}), k({n, kvd}), v({n, kvd}), att({b, nh, t, t});
  Tensor y({n, c}), x1({n, c});
  // x1 = x + o_proj(attn(RoPE(q_proj(rms_1(x))), RoPE(k_proj(.)), v_proj(.))).
  kernels::RmsNormForward(input.data(), rms1_g_.value.data(), xn1.data(), rstd1.data(), n, c, eps);
  kernels::LinearForward(xn1.data(), q_w_.value.data(), nullptr, q.data(), n, c, c);
  kernels::LinearForward(xn1.data(), k_w_.value.data(), nullptr, k.data(), n, c, kvd);
  kernels::LinearForward(xn1.data(), v_w_.value.data(), nullptr, v.data(), n, c, kvd);
  kernels::RopeForward(q.data(), rope_cos_.data(), rope_sin_.data(), b, t, nh, hd_);
  kernels::RopeForward(k.data(), rope_cos_.data(), rope_sin_.data(), b, t, kv, hd_);
  kernels::GqaCausalAttentionForward(q.data(), k.data(), v.data(), att.data(), y.data(), b, t, nh,
                                     kv, hd_);
  kernels::LinearForward(y.data(), o_w_.value.data(), nullptr, x1.data(), n, c, c);
  kernels::Add(x1.data(), input.data(), x1.data(), n * c);
  const std::initializer_list<Tensor*> attention = {&xn1, &rstd1, &q, &k, &v, &att, &y};
  size_t peak = x1.bytes();
  for (const Tensor* a : attention) peak += a->bytes();
  // Without a context to fill, the attention's intermediates go before the MLP's are made.
  if (ctx == nullptr) {
    for (Tensor* a : attention) a->Clear();
  }
  // out = x1 + down_proj(silu(gate_proj(rms_2(x1))) * up_proj(rms_2(x1))).
  Tensor rstd2({n}), xn2({n, c}), gate({n, h}), up({n, h}), act({n, h});
  kernels::RmsNormForward(x1.data(), rms2_g_.value.data(), xn2.data(), rstd2.data(), n, c, eps);
  kernels::LinearForward(xn2.data(), gate_w_.value.data(), nullptr, gate.data(), n, c, h);
  kernels::LinearForward(xn2.data(), up_w_.value.data(), nullptr, up.data(), n, c, h);
  kernels::SwiGluForwardFast(gate.data(), up.data(), act.data(), n * h);
  if (output != nullptr) {
    output->Reset({b, t, c});
    kernels::LinearForward(act.data(), down_w_.value.data(), nullptr, output->data(), n, h, c);
    kernels::Add(output->data(), x1.data(), output->data(), n * c);
  }
  if (peak_bytes != nullptr) {
    size_t mlp = x1.bytes();
    for (const Tensor* a : {&rstd2, &xn2, &gate, &up, &act}) mlp += a->bytes();
    *peak_bytes = std::max(peak, mlp);
  }
  if (ctx == nullptr) return absl::OkStatus();

  if (cfg_.selective_recompute) att.Clear();
  ctx->tensors.reserve(kNumBlockSaved);
  ctx->tensors.push_back(input);
  for (Tensor* saved : {&xn1, &rstd1, &q, &k, &v, &att, &y, &x1, &rstd2, &xn2, &gate, &up}) {
    ctx->tensors.push_back(std::move(*saved));
  }
  return absl::OkStatus();
}

absl::Status LlamaBlock::InputGradients(const Tensor& grad_output, const SavedContext& ctx,
                                        Tensor& grad_input, std::vector<Tensor>& wpass) {
  const int64_t c = cfg_.d_model, h = cfg_.d_hidden, nh = cfg_.n_head, kv = cfg_.n_kv_head;
  const int64_t kvd = kv * hd_;
  if (ctx.tensors.size() != kNumBlockSaved || !ctx.ints.empty()) {
    return absl::InternalError(absl::StrCat(name_, ": backward without a matching forward"));
  }
  const std::vector<Tensor>& sv = ctx.tensors;
  const Tensor& x = sv[kX];
  const int64_t b = x.dim(0), t = x.dim(1), n = b * t;
  RETURN_IF_ERROR(CheckSameShape(name_, "grad_output", grad_output, x.shape()));
  wpass.assign(kNumWeightOperands, Tensor{});
  // MLP branch: dx1 = dout + rms_2'(gate_proj'(dgate) + up_proj'(dup)), with
  // (dgate, dup) = swiglu'(down_proj'(dout)).
  Tensor dact({n, h}), dxn2({n, c});
  wpass[kAct].Reset({n, h});
  wpass[kDGate].Reset({n, h});
  wpass[kDUp].Reset({n, h});
  kernels::LinearBackward(grad_output.data(), nullptr, down_w_.value.data(), dact.data(), nullptr,
                          nullptr, n, h, c);
  kernels::SwiGluBackwardFast(sv[kGate].data(), sv[kUp].data(), dact.data(), wpass[kAct].data(),
                              wpass[kDGate].data(), wpass[kDUp].data(), n * h);
  dact.Clear();
  kernels::LinearBackward(wpass[kDGate].data(), nullptr, gate_w_.value.data(), dxn2.data(), nullptr,
                          nullptr, n, c, h);
  kernels::LinearBackward(wpass[kDUp].data(), nullptr, up_w_.value.data(), dxn2.data(), nullptr,
                          nullptr, n, c, h);
  wpass[kDDown] = grad_output;
  Tensor dx1 = grad_output;  // (B, T, C), the residual path
  kernels::RmsNormBackward(dxn2.data(), sv[kX1].data(), rms2_g_.value.data(), sv[kRstd2].data(),
                           dx1.data(), rms2_g_.grad.data(), n, c);
  dxn2.Clear();
  // Attention branch: dx = dx1 + rms_1'(q_proj'(RoPE'(dq)) + k_proj'(RoPE'(dk)) + v_proj'(dv)),
  // with (dq, dk, dv) = attn'(o_proj'(dx1)).
  wpass[kDO] = dx1;
  Tensor dy({n, c}), dxn1({n, c});
  wpass[kDQ].Reset({n, c});
  wpass[kDK].Reset({n, kvd});
  wpass[kDV].Reset({n, kvd});
  kernels::LinearBackward(dx1.data(), nullptr, o_w_.value.data(), dy.data(), nullptr, nullptr, n, c,
                          c);
  {
    // Selective recomputation: the probabilities again from the kept (rotated) q, k and v, by
    // the forward's attention (its merged heads discarded), bit for bit what it computed.
    Tensor recomputed;
    if (cfg_.selective_recompute) {
      recomputed.Reset({b, nh, t, t});
      Tensor merged({n, c});
      kernels::GqaCausalAttentionForward(sv[kQ].data(), sv[kK].data(), sv[kV].data(),
                                         recomputed.data(), merged.data(), b, t, nh, kv, hd_);
    }
    const Tensor& att = cfg_.selective_recompute ? recomputed : sv[kAtt];
    kernels::GqaCausalAttentionBackward(dy.data(), sv[kQ].data(), sv[kK].data(), sv[kV].data(),
                                        att.data(), wpass[kDQ].data(), wpass[kDK].data(),
                                        wpass[kDV].data(), b, t, nh, kv, hd_);
  }
  dy.Clear();
  kernels::RopeBackward(wpass[kDQ].data(), rope_cos_.data(), rope_sin_.data(), b, t, nh, hd_);
  kernels::RopeBackward(wpass[kDK].data(), rope_cos_.data(), rope_sin_.data(), b, t, kv, hd_);
  kernels::LinearBackward(wpass[kDQ].data(), nullptr, q_w_.value.data(), dxn1.data(), nullptr,
                          nullptr, n, c, c);
  kernels::LinearBackward(wpass[kDK].data(), nullptr, k_w_.value.data(), dxn1.data(), nullptr,
                          nullptr, n, c, kvd);
  kernels::LinearBackward(wpass[kDV].data(), nullptr, v_w_.value.data(), dxn1.data(), nullptr,
                          nullptr, n, c, kvd);
  kernels::RmsNormBackward(dxn1.data(), x.data(), rms1_g_.value.data(), sv[kRstd1].data(),
                           dx1.data(), rms1_g_.grad.data(), n, c);
  grad_input = std::move(dx1);
  return absl::OkStatus();
}

void LlamaBlock::WeightGradients(const std::vector<Tensor>& sv, const Tensor* wpass) {
  const int64_t c = cfg_.d_model, h = cfg_.d_hidden, kvd = cfg_.n_kv_head * hd_;
  const int64_t n = static_cast<int64_t>(sv[kXn1].size()) / c;
  kernels::LinearBackward(wpass[kDDown].data(), wpass[kAct].data(), nullptr, nullptr,
                          down_w_.grad.data(), nullptr, n, h, c);
  kernels::LinearBackward(wpass[kDGate].data(), sv[kXn2].data(), nullptr, nullptr,
                          gate_w_.grad.data(), nullptr, n, c, h);
  kernels::LinearBackward(wpass[kDUp].data(), sv[kXn2].data(), nullptr, nullptr, up_w_.grad.data(),
                          nullptr, n, c, h);
  kernels::LinearBackward(wpass[kDO].data(), sv[kY].data(), nullptr, nullptr, o_w_.grad.data(),
                          nullptr, n, c, c);
  kernels::LinearBackward(wpass[kDQ].data(), sv[kXn1].data(), nullptr, nullptr, q_w_.grad.data(),
                          nullptr, n, c, c);
  kernels::LinearBackward(wpass[kDK].data(), sv[kXn1].data(), nullptr, nullptr, k_w_.grad.data(),
                          nullptr, n, c, kvd);
  kernels::LinearBackward(wpass[kDV].data(), sv[kXn1].data(), nullptr, nullptr, v_w_.grad.data(),
                          nullptr, n, c, kvd);
}

absl::Status LlamaBlock::Backward(const Tensor& grad_output, const SavedContext& ctx,
                                  Tensor& grad_input) {
  std::vector<Tensor> wpass;
  RETURN_IF_ERROR(InputGradients(grad_output, ctx, grad_input, wpass));
  WeightGradients(ctx.tensors, wpass.data());
  return absl::OkStatus();
}

absl::Status LlamaBlock::BackwardInput(const Tensor& grad_output, SavedContext& ctx,
                                       Tensor& grad_input) {
  std::vector<Tensor> wpass;
  RETURN_IF_ERROR(InputGradients(grad_output, ctx, grad_input, wpass));
  // The weight pass reads only the linears' inputs (xn1, y, xn2, act) and output gradients.
  for (int i : {kX, kRstd1, kQ, kK, kV, kAtt, kX1, kRstd2, kGate, kUp}) ctx.tensors[i].Clear();
  for (Tensor& w : wpass) ctx.tensors.push_back(std::move(w));
  return absl::OkStatus();
}

absl::Status LlamaBlock::BackwardWeight(SavedContext& ctx) {
  if (ctx.tensors.size() !=
      static_cast<size_t>(kNumBlockSaved) + static_cast<size_t>(kNumWeightOperands)) {
    return absl::InternalError(absl::StrCat(name_, ": weight gradient before input gradient"));
  }
  WeightGradients(ctx.tensors, ctx.tensors.data() + kNumBlockSaved);
  ctx.Clear();
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------
// Head. Saved context: tensors = {x (B, T, C), xn (N, C) = rms_f(x), rstd (N),
// dlogits (N, V) = softmax - onehot (unscaled), normalizer (1,)}; no ints (the targets are
// folded into dlogits).

namespace {
enum HeadSaved { kHeadX, kHeadXn, kHeadRstd, kHeadDLogits, kHeadScale, kNumHeadSaved };
}  // namespace

LlamaHead::LlamaHead(const LlamaConfig& cfg, uint64_t seed)
    : cfg_(cfg),
      norm_g_("model.norm.weight", {cfg.d_model}, false),
      w_(cfg.tie_embeddings ? "model.embed_tokens.weight" : "lm_head.weight",
         {cfg.vocab, cfg.d_model}, true) {
  norm_g_.value.Fill(1.0f);
  if (cfg.tie_embeddings) {
    w_.tied = true;
    InitLlamaTokenEmbedding(cfg, seed, w_.value);  // the embedding's stream, bit-identical
  } else {
    Rng rng(MixSeed(seed, static_cast<uint64_t>(cfg.n_layer) + 1));
    InitNormal(rng, w_, kInitStd);
  }
}

absl::Status LlamaHead::Forward(const Tensor& input, const MicroBatchData& data, SavedContext& ctx,
                                Tensor& output) {
  const int64_t c = cfg_.d_model, v = cfg_.vocab;
  RETURN_IF_ERROR(CheckActivation(name_, "input", input, std::numeric_limits<int32_t>::max(), c));
  const int64_t b = input.dim(0), t = input.dim(1), n = b * t;
  RETURN_IF_ERROR(CheckHeadTargets(data, b, t, v));
  Tensor xn({n, c}), rstd({n}), logits({n, v});
  kernels::RmsNormForward(input.data(), norm_g_.value.data(), xn.data(), rstd.data(), n, c,
                          static_cast<float>(cfg_.rms_eps));
  kernels::LinearForward(xn.data(), w_.value.data(), nullptr, logits.data(), n, c, v);
  const double total =
      kernels::SoftmaxCrossEntropyInPlace(logits.data(), data.targets->data(), n, v);
  output.Reset({1});
  output[0] = static_cast<float>(total / static_cast<double>(data.loss_normalizer));
  ctx.tensors.reserve(kNumHeadSaved);
  ctx.tensors.push_back(input);
  ctx.tensors.push_back(std::move(xn));
  ctx.tensors.push_back(std::move(rstd));
  ctx.tensors.push_back(std::move(logits));
  ctx.tensors.push_back(Tensor({1}, {static_cast<float>(data.loss_normalizer)}));
  return absl::OkStatus();
}

absl::Status LlamaHead::InputGradient(const Tensor& grad_output, const SavedContext& ctx,
                                      Tensor& grad_input, float& scale) {
  const int64_t c = cfg_.d_model, v = cfg_.vocab;
  if (ctx.tensors.size() != kNumHeadSaved || !ctx.ints.empty()) {
    return absl::InternalError("head: backward without a matching forward");
  }
  const Tensor& x = ctx.tensors[kHeadX];
  const Tensor& xn = ctx.tensors[kHeadXn];
  const Tensor& dlogits = ctx.tensors[kHeadDLogits];  // softmax - onehot
  const float normalizer = ctx.tensors[kHeadScale][0];
  const int64_t n = x.dim(0) * x.dim(1);
  const float dloss = grad_output.empty() ? 1.0f : grad_output[0];
  scale = dloss / normalizer;
  Tensor dxn({n, c});
  kernels::ScaledLinearBackward(dlogits.data(), xn.data(), w_.value.data(), scale, dxn.data(),
                                nullptr, n, c, v);
  grad_input.Reset(x.shape());
  kernels::RmsNormBackward(dxn.data(), x.data(), norm_g_.value.data(),
                           ctx.tensors[kHeadRstd].data(), grad_input.data(), norm_g_.grad.data(), n,
                           c);
  return absl::OkStatus();
}

void LlamaHead::WeightGradient(const SavedContext& ctx, float scale) {
  const Tensor& xn = ctx.tensors[kHeadXn];
  const int64_t c = cfg_.d_model, v = cfg_.vocab;
  const int64_t n = static_cast<int64_t>(xn.size()) / c;
  kernels::ScaledLinearBackward(ctx.tensors[kHeadDLogits].data(), xn.data(), nullptr, scale,
                                nullptr, w_.grad.data(), n, c, v);
}

absl::Status LlamaHead::Backward(const Tensor& grad_output, const SavedContext& ctx,
                                 Tensor& grad_input) {
  float scale = 0.0f;
  RETURN_IF_ERROR(InputGradient(grad_output, ctx, grad_input, scale));
  WeightGradient(ctx, scale);
  return absl::OkStatus();
}

absl::Status LlamaHead::BackwardInput(const Tensor& grad_output, SavedContext& ctx,
                                      Tensor& grad_input) {
  float scale = 0.0f;
  RETURN_IF_ERROR(InputGradient(grad_output, ctx, grad_input, scale));
  // The weight pass reads xn, dlogits and the scale (kept where the normalizer was).
  for (int i : {kHeadX, kHeadRstd}) ctx.tensors[i].Clear();
  ctx.tensors[kHeadScale][0] = scale;
  ctx.tensors.push_back(Tensor({1}, {1.0f}));  // marks the input gradient as done
  return absl::OkStatus();
}

absl::Status LlamaHead::BackwardWeight(SavedContext& ctx) {
  if (ctx.tensors.size() != kNumHeadSaved + 1) {
    return absl::InternalError("head: weight gradient before input gradient");
  }
  WeightGradient(ctx, ctx.tensors[kHeadScale][0]);
  ctx.Clear();
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------

absl::StatusOr<std::vector<std::unique_ptr<Layer>>> BuildLlamaLayers(const LlamaConfig& cfg,
                                                                     uint64_t seed, int layer_begin,
                                                                     int layer_end) {
  RETURN_IF_ERROR(ValidateLlamaConfig(cfg));
  return BuildLayerRange<LlamaEmbedding, LlamaBlock, LlamaHead>(cfg, cfg.n_layer, seed, layer_begin,
                                                                layer_end);
}

}  // namespace tandem::worker
