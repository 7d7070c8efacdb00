#include "worker/model/gpt.h"

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
#include "worker/model/random.h"

namespace tandem::worker {

absl::StatusOr<GptConfig> GptConfigFromSpec(const v1::ModelSpec& model) {
  if (model.arch() != "gpt") {
    return absl::InvalidArgumentError(
        absl::StrCat("model.arch '", model.arch(), "' is not supported here; expected gpt"));
  }
  if (model.n_layer() < 0 || model.n_layer() > kMaxLayers) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.n_layer must be in [0, ", kMaxLayers, "], got ", model.n_layer()));
  }
  if (model.d_hidden() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.d_hidden must be >= 0 (0 means 4 * d_model), got ", model.d_hidden()));
  }
  GptConfig cfg;
  cfg.n_layer = model.n_layer();
  cfg.n_head = model.n_head();
  cfg.d_model = model.d_model();
  cfg.d_hidden = model.d_hidden() == 0 ? 4 * static_cast<int64_t>(cfg.d_model) : model.d_hidden();
  cfg.seq_len = model.seq_len();
  cfg.vocab = model.vocab_size();
  cfg.tie_embeddings = model.tie_embeddings();
  for (auto [field, value] : {std::pair{"n_head", cfg.n_head},
                              {"d_model", cfg.d_model},
                              {"d_hidden", cfg.d_hidden},
                              {"seq_len", cfg.seq_len},
                              {"vocab_size", cfg.vocab}}) {
    RETURN_IF_ERROR(CheckDim(field, value));
  }
  if (cfg.d_model % cfg.n_head != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model.d_model (", cfg.d_model, ") must be a multiple of model.n_head (", cfg.n_head, ")"));
  }
  for (auto [what, rows, cols] : {std::tuple{"the token embedding wte", cfg.vocab, cfg.d_model},
                                  {"the position embedding wpe", cfg.seq_len, cfg.d_model},
                                  {"a block's c_attn", 3 * cfg.d_model, cfg.d_model},
                                  {"a block's c_fc", cfg.d_hidden, cfg.d_model}}) {
    if (rows * cols > kMaxTensorElements) {
      return absl::InvalidArgumentError(absl::StrCat("model too large: ", what, " would have ",
                                                     rows, " x ", cols, " elements (limit ",
                                                     kMaxTensorElements, ")"));
    }
  }
  // Whole-model parameter count (both copies of a tied wte), in double so that a hostile
  // spec cannot overflow it.
  const double c = static_cast<double>(cfg.d_model), h = static_cast<double>(cfg.d_hidden);
  const double per_block =
      4.0 * c + (3.0 * c * c + 3.0 * c) + (c * c + c) + (h * c + h) + (c * h + c);
  const double total = 2.0 * static_cast<double>(cfg.vocab) * c +
                       static_cast<double>(cfg.seq_len) * c +
                       static_cast<double>(cfg.n_layer) * per_block + 2.0 * c;
  if (total > kMaxModelParameters) {
    return absl::InvalidArgumentError(
        absl::StrCat("model too large: ", total, " parameters (limit ", kMaxModelParameters, ")"));
  }
  return cfg;
}

namespace {
void DrawTokenEmbedding(const GptConfig& cfg, Rng& rng, Tensor& wte) {
  wte.Reset({cfg.vocab, cfg.d_model});
  for (size_t i = 0; i < wte.size(); ++i) wte[i] = static_cast<float>(rng.Normal() * kInitStd);
}
}  // namespace

void InitGptTokenEmbedding(const GptConfig& cfg, uint64_t seed, Tensor& wte) {
  Rng rng(MixSeed(seed, 0));
  DrawTokenEmbedding(cfg, rng, wte);
}

// ---------------------------------------------------------------------------------------
// Embedding. Saved context: ints[0] = tokens (B, T).

GptEmbedding::GptEmbedding(const GptConfig& cfg, uint64_t seed)
    : cfg_(cfg),
      wte_("transformer.wte.weight", {cfg.vocab, cfg.d_model}, true),
      wpe_("transformer.wpe.weight", {cfg.seq_len, cfg.d_model}, true) {
  wte_.tied = cfg.tie_embeddings;
  // Draw order on Rng(MixSeed(seed, 0)): wte (V*C draws, see InitGptTokenEmbedding), wpe.
  Rng rng(MixSeed(seed, 0));
  DrawTokenEmbedding(cfg, rng, wte_.value);
  InitNormal(rng, wpe_, kInitStd);
}

absl::Status GptEmbedding::Forward(const Tensor& input, const MicroBatchData& data,
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
  for (int64_t bi = 0; bi < b; ++bi) {
    for (int64_t ti = 0; ti < t; ++ti) {
      const size_t row = static_cast<size_t>(bi * t + ti);
      kernels::Add(wte_.value.data() + static_cast<size_t>((*tokens)[row]) * c,
                   wpe_.value.data() + static_cast<size_t>(ti) * c, output.data() + row * c, c);
    }
  }
  ctx.ints.push_back(*tokens);
  return absl::OkStatus();
}

absl::Status GptEmbedding::Backward(const Tensor& grad_output, const SavedContext& ctx,
                                    Tensor& grad_input) {
  const int64_t c = cfg_.d_model;
  if (ctx.ints.size() != 1 || !ctx.tensors.empty()) {
    return absl::InternalError("embedding: backward without a matching forward");
  }
  const IntTensor& tokens = ctx.ints[0];
  const int64_t b = tokens.dim(0), t = tokens.dim(1);
  RETURN_IF_ERROR(CheckSameShape(name_, "grad_output", grad_output, {b, t, c}));
  for (int64_t bi = 0; bi < b; ++bi) {
    for (int64_t ti = 0; ti < t; ++ti) {
      const size_t row = static_cast<size_t>(bi * t + ti);
      const float* g = grad_output.data() + row * c;
      float* dte = wte_.grad.data() + static_cast<size_t>(tokens[row]) * c;
      float* dpe = wpe_.grad.data() + static_cast<size_t>(ti) * c;
      kernels::Add(dte, g, dte, c);
      kernels::Add(dpe, g, dpe, c);
    }
  }
  grad_input.Clear();
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------
// Block. Saved context, tensors (N = B*T):
//   0 x (B, T, C)      1 ln1 (N, C)   2 mean1 (N)   3 rstd1 (N)   4 qkv (N, 3C)
//   5 att (B, NH, T, T) 6 y (N, C)    7 x1 (N, C) = x + attn       8 ln2 (N, C)
//   9 mean2 (N)        10 rstd2 (N)  11 pre (N, H)                12 act (N, H) = gelu(pre)
// With selective recomputation att and act are left empty (0 bytes) and recomputed in backward.

namespace {
enum BlockSaved {
  kX,
  kLn1,
  kMean1,
  kRstd1,
  kQkv,
  kAtt,
  kY,
  kX1,
  kLn2,
  kMean2,
  kRstd2,
  kPre,
  kAct,
  kNumBlockSaved
};
}  // namespace

GptBlock::GptBlock(const GptConfig& cfg, int block_index, uint64_t seed)
    : cfg_(cfg),
      block_index_(block_index),
      name_(absl::StrCat("block_", block_index)),
      ln1_g_(absl::StrCat("transformer.h.", block_index, ".ln_1.weight"), {cfg.d_model}, false),
      ln1_b_(absl::StrCat("transformer.h.", block_index, ".ln_1.bias"), {cfg.d_model}, false),
      attn_w_(absl::StrCat("transformer.h.", block_index, ".attn.c_attn.weight"),
              {3 * cfg.d_model, cfg.d_model}, true),
      attn_b_(absl::StrCat("transformer.h.", block_index, ".attn.c_attn.bias"), {3 * cfg.d_model},
              false),
      attn_proj_w_(absl::StrCat("transformer.h.", block_index, ".attn.c_proj.weight"),
                   {cfg.d_model, cfg.d_model}, true),
      attn_proj_b_(absl::StrCat("transformer.h.", block_index, ".attn.c_proj.bias"), {cfg.d_model},
                   false),
      ln2_g_(absl::StrCat("transformer.h.", block_index, ".ln_2.weight"), {cfg.d_model}, false),
      ln2_b_(absl::StrCat("transformer.h.", block_index, ".ln_2.bias"), {cfg.d_model}, false),
      fc_w_(absl::StrCat("transformer.h.", block_index, ".mlp.c_fc.weight"),
            {cfg.d_hidden, cfg.d_model}, true),
      fc_b_(absl::StrCat("transformer.h.", block_index, ".mlp.c_fc.bias"), {cfg.d_hidden}, false),
      mlp_proj_w_(absl::StrCat("transformer.h.", block_index, ".mlp.c_proj.weight"),
                  {cfg.d_model, cfg.d_hidden}, true),
      mlp_proj_b_(absl::StrCat("transformer.h.", block_index, ".mlp.c_proj.bias"), {cfg.d_model},
                  false) {
  ln1_g_.value.Fill(1.0f);
  ln2_g_.value.Fill(1.0f);
  // GPT-2: residual projections scaled by 1/sqrt(2 n_layer) to keep the stream's variance flat.
  const float proj_std =
      kInitStd / std::sqrt(2.0f * static_cast<float>(std::max<int64_t>(cfg.n_layer, 1)));
  // Draw order on Rng(MixSeed(seed, i + 1)): c_attn, attn.c_proj, c_fc, mlp.c_proj.
  Rng rng(MixSeed(seed, static_cast<uint64_t>(block_index) + 1));
  InitNormal(rng, attn_w_, kInitStd);
  InitNormal(rng, attn_proj_w_, proj_std);
  InitNormal(rng, fc_w_, kInitStd);
  InitNormal(rng, mlp_proj_w_, proj_std);
}

absl::Status GptBlock::Forward(const Tensor& input, const MicroBatchData& /*data*/,
                               SavedContext& ctx, Tensor& output) {
  return Run(input, &ctx, &output, nullptr);
}

absl::Status GptBlock::RecomputeContext(const Tensor& input, const MicroBatchData& /*data*/,
                                        SavedContext& ctx) {
  return Run(input, &ctx, nullptr, nullptr);
}

absl::Status GptBlock::ForwardWithoutSaving(const Tensor& input, const MicroBatchData& /*data*/,
                                            Tensor& output, size_t* peak_bytes) {
  return Run(input, nullptr, &output, peak_bytes);
}

absl::Status GptBlock::Run(const Tensor& input, SavedContext* ctx, Tensor* output,
                           size_t* peak_bytes) {
  const int64_t c = cfg_.d_model, h = cfg_.d_hidden, nh = cfg_.n_head;
  RETURN_IF_ERROR(CheckActivation(name_, "input", input, std::numeric_limits<int32_t>::max(), c));
  const int64_t b = input.dim(0), t = input.dim(1), n = b * t;
  Tensor ln1({n, c}), mean1({n}), rstd1({n}), qkv({n, 3 * c}), att({b, nh, t, t}), y({n, c});
  Tensor x1({n, c});
  // x1 = x + c_proj(attn(c_attn(ln_1(x)))).
  kernels::LayerNormForward(input.data(), ln1_g_.value.data(), ln1_b_.value.data(), ln1.data(),
                            mean1.data(), rstd1.data(), n, c);
  kernels::LinearForward(ln1.data(), attn_w_.value.data(), attn_b_.value.data(), qkv.data(), n, c,
                         3 * c);
  kernels::CausalAttentionForward(qkv.data(), att.data(), y.data(), b, t, c, nh);
  kernels::LinearForward(y.data(), attn_proj_w_.value.data(), attn_proj_b_.value.data(), x1.data(),
                         n, c, c);
  kernels::Add(x1.data(), input.data(), x1.data(), n * c);
  const std::initializer_list<Tensor*> attention = {&ln1, &mean1, &rstd1, &qkv, &att, &y};
  size_t peak = x1.bytes();
  for (const Tensor* v : attention) peak += v->bytes();
  // Without a context to fill, the attention's intermediates go before the MLP's are made.
  if (ctx == nullptr) {
    for (Tensor* v : attention) v->Clear();
  }
  // out = x1 + c_proj(gelu(c_fc(ln_2(x1)))).
  Tensor ln2({n, c}), mean2({n}), rstd2({n}), pre({n, h}), act({n, h});
  kernels::LayerNormForward(x1.data(), ln2_g_.value.data(), ln2_b_.value.data(), ln2.data(),
                            mean2.data(), rstd2.data(), n, c);
  kernels::LinearForward(ln2.data(), fc_w_.value.data(), fc_b_.value.data(), pre.data(), n, c, h);
  kernels::GeluForwardFast(pre.data(), act.data(), n * h);
  if (output != nullptr) {
    output->Reset({b, t, c});
    kernels::LinearForward(act.data(), mlp_proj_w_.value.data(), mlp_proj_b_.value.data(),
                           output->data(), n, h, c);
    kernels::Add(output->data(), x1.data(), output->data(), n * c);
  }
  if (peak_bytes != nullptr) {
    size_t mlp = x1.bytes();
    for (const Tensor* v : {&ln2, &mean2, &rstd2, &pre, &act}) mlp += v->bytes();
    *peak_bytes = std::max(peak, mlp);
  }
  if (ctx == nullptr) return absl::OkStatus();

  if (cfg_.selective_recompute) {
    att.Clear();
    act.Clear();
  }
  ctx->tensors.reserve(kNumBlockSaved);
  ctx->tensors.push_back(input);
  for (Tensor* saved :
       {&ln1, &mean1, &rstd1, &qkv, &att, &y, &x1, &ln2, &mean2, &rstd2, &pre, &act}) {
    ctx->tensors.push_back(std::move(*saved));
  }
  return absl::OkStatus();
}

namespace {
// Selective recomputation's probabilities: the forward's attention again on the kept qkv (its
// merged heads discarded), bit for bit what the forward computed.
Tensor RecomputedAttention(const Tensor& qkv, int64_t b, int64_t t, int64_t c, int64_t nh) {
  Tensor att({b, nh, t, t}), merged({b * t, c});
  kernels::CausalAttentionForward(qkv.data(), att.data(), merged.data(), b, t, c, nh);
  return att;
}
}  // namespace

// The output gradients of the block's four linears, which their weight GEMMs need: computed by
// the input-gradient pass and, in a split backward, kept in the context after the saved
// activations until the weight pass.
enum BlockDouts { kDMlpProj, kDFc, kDAttnProj, kDAttn, kNumBlockDouts };

absl::Status GptBlock::InputGradients(const Tensor& grad_output, const SavedContext& ctx,
                                      Tensor& grad_input, std::vector<Tensor>& douts) {
  const int64_t c = cfg_.d_model, h = cfg_.d_hidden, nh = cfg_.n_head;
  if (ctx.tensors.size() != kNumBlockSaved || !ctx.ints.empty()) {
    return absl::InternalError(absl::StrCat(name_, ": backward without a matching forward"));
  }
  const std::vector<Tensor>& sv = ctx.tensors;
  const Tensor& x = sv[kX];
  const int64_t b = x.dim(0), t = x.dim(1), n = b * t;
  RETURN_IF_ERROR(CheckSameShape(name_, "grad_output", grad_output, x.shape()));
  douts.assign(kNumBlockDouts, Tensor{});
  // MLP branch: dx1 = dout + ln_2'(c_fc'(gelu'(c_proj'(dout)))).
  Tensor dact({n, h}), dln2({n, c});
  douts[kDFc].Reset({n, h});
  kernels::LinearBackward(grad_output.data(), nullptr, mlp_proj_w_.value.data(), dact.data(),
                          nullptr, nullptr, n, h, c);
  kernels::GeluBackwardFast(sv[kPre].data(), dact.data(), douts[kDFc].data(), n * h);
  dact.Clear();
  kernels::LinearBackward(douts[kDFc].data(), nullptr, fc_w_.value.data(), dln2.data(), nullptr,
                          nullptr, n, c, h);
  douts[kDMlpProj] = grad_output;
  Tensor dx1 = grad_output;  // (B, T, C), the residual path
  kernels::LayerNormBackward(dln2.data(), sv[kX1].data(), ln2_g_.value.data(), sv[kMean2].data(),
                             sv[kRstd2].data(), dx1.data(), ln2_g_.grad.data(), ln2_b_.grad.data(),
                             n, c);
  dln2.Clear();
  // Attention branch: dx = dx1 + ln_1'(c_attn'(attn'(c_proj'(dx1)))).
  douts[kDAttnProj] = dx1;
  Tensor dy({n, c}), dln1({n, c});
  douts[kDAttn].Reset({n, 3 * c});
  kernels::LinearBackward(dx1.data(), nullptr, attn_proj_w_.value.data(), dy.data(), nullptr,
                          nullptr, n, c, c);
  {
    const Tensor recomputed =
        cfg_.selective_recompute ? RecomputedAttention(sv[kQkv], b, t, c, nh) : Tensor{};
    const Tensor& att = cfg_.selective_recompute ? recomputed : sv[kAtt];
    kernels::CausalAttentionBackward(dy.data(), sv[kQkv].data(), att.data(), douts[kDAttn].data(),
                                     b, t, c, nh);
  }
  dy.Clear();
  kernels::LinearBackward(douts[kDAttn].data(), nullptr, attn_w_.value.data(), dln1.data(), nullptr,
                          nullptr, n, c, 3 * c);
  kernels::LayerNormBackward(dln1.data(), x.data(), ln1_g_.value.data(), sv[kMean1].data(),
                             sv[kRstd1].data(), dx1.data(), ln1_g_.grad.data(), ln1_b_.grad.data(),
                             n, c);
  grad_input = std::move(dx1);
  return absl::OkStatus();
}

void GptBlock::WeightGradients(const std::vector<Tensor>& sv, const Tensor* douts) {
  const int64_t c = cfg_.d_model, h = cfg_.d_hidden;
  const int64_t n = static_cast<int64_t>(sv[kLn1].size()) / c;
  {
    // Selective recomputation: gelu(pre) again, as the forward computed it.
    Tensor recomputed;
    if (cfg_.selective_recompute) {
      recomputed.Reset({n, h});
      kernels::GeluForwardFast(sv[kPre].data(), recomputed.data(), n * h);
    }
    const Tensor& act = cfg_.selective_recompute ? recomputed : sv[kAct];
    kernels::LinearBackward(douts[kDMlpProj].data(), act.data(), nullptr, nullptr,
                            mlp_proj_w_.grad.data(), mlp_proj_b_.grad.data(), n, h, c);
  }
  kernels::LinearBackward(douts[kDFc].data(), sv[kLn2].data(), nullptr, nullptr, fc_w_.grad.data(),
                          fc_b_.grad.data(), n, c, h);
  kernels::LinearBackward(douts[kDAttnProj].data(), sv[kY].data(), nullptr, nullptr,
                          attn_proj_w_.grad.data(), attn_proj_b_.grad.data(), n, c, c);
  kernels::LinearBackward(douts[kDAttn].data(), sv[kLn1].data(), nullptr, nullptr,
                          attn_w_.grad.data(), attn_b_.grad.data(), n, c, 3 * c);
}

absl::Status GptBlock::Backward(const Tensor& grad_output, const SavedContext& ctx,
                                Tensor& grad_input) {
  std::vector<Tensor> douts;
  RETURN_IF_ERROR(InputGradients(grad_output, ctx, grad_input, douts));
  WeightGradients(ctx.tensors, douts.data());
  return absl::OkStatus();
}

absl::Status GptBlock::BackwardInput(const Tensor& grad_output, SavedContext& ctx,
                                     Tensor& grad_input) {
  std::vector<Tensor> douts;
  RETURN_IF_ERROR(InputGradients(grad_output, ctx, grad_input, douts));
  // The weight pass reads only the linears' inputs (ln1, y, ln2, act) and the douts; with
  // selective recomputation pre instead of act, to recompute act from.
  for (int i : {kX, kMean1, kRstd1, kQkv, kAtt, kX1, kMean2, kRstd2}) ctx.tensors[i].Clear();
  if (!cfg_.selective_recompute) ctx.tensors[kPre].Clear();
  for (Tensor& d : douts) ctx.tensors.push_back(std::move(d));
  return absl::OkStatus();
}

absl::Status GptBlock::BackwardWeight(SavedContext& ctx) {
  if (ctx.tensors.size() !=
      static_cast<size_t>(kNumBlockSaved) + static_cast<size_t>(kNumBlockDouts)) {
    return absl::InternalError(absl::StrCat(name_, ": weight gradient before input gradient"));
  }
  WeightGradients(ctx.tensors, ctx.tensors.data() + kNumBlockSaved);
  ctx.Clear();
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------
// Head. Saved context: tensors = {x (B, T, C), ln (N, C), mean (N), rstd (N),
// dlogits (N, V) = softmax - onehot (unscaled), normalizer (1,)}; no ints (the targets are
// folded into dlogits).

GptHead::GptHead(const GptConfig& cfg, uint64_t seed)
    : cfg_(cfg),
      ln_g_("transformer.ln_f.weight", {cfg.d_model}, false),
      ln_b_("transformer.ln_f.bias", {cfg.d_model}, false),
      w_(cfg.tie_embeddings ? "transformer.wte.weight" : "lm_head.weight", {cfg.vocab, cfg.d_model},
         true) {
  ln_g_.value.Fill(1.0f);
  if (cfg.tie_embeddings) {
    w_.tied = true;
    InitGptTokenEmbedding(cfg, seed, w_.value);  // the embedding's stream, bit-identical
  } else {
    Rng rng(MixSeed(seed, static_cast<uint64_t>(cfg.n_layer) + 1));
    InitNormal(rng, w_, kInitStd);
  }
}

absl::Status GptHead::Forward(const Tensor& input, const MicroBatchData& data, SavedContext& ctx,
                              Tensor& output) {
  const int64_t c = cfg_.d_model, v = cfg_.vocab;
  RETURN_IF_ERROR(CheckActivation(name_, "input", input, std::numeric_limits<int32_t>::max(), c));
  const int64_t b = input.dim(0), t = input.dim(1), n = b * t;
  RETURN_IF_ERROR(CheckHeadTargets(data, b, t, v));
  Tensor ln({n, c}), mean({n}), rstd({n}), logits({n, v});
  kernels::LayerNormForward(input.data(), ln_g_.value.data(), ln_b_.value.data(), ln.data(),
                            mean.data(), rstd.data(), n, c);
  kernels::LinearForward(ln.data(), w_.value.data(), nullptr, logits.data(), n, c, v);
  const double total =
      kernels::SoftmaxCrossEntropyInPlace(logits.data(), data.targets->data(), n, v);
  output.Reset({1});
  output[0] = static_cast<float>(total / static_cast<double>(data.loss_normalizer));
  ctx.tensors.reserve(6);
  ctx.tensors.push_back(input);
  ctx.tensors.push_back(std::move(ln));
  ctx.tensors.push_back(std::move(mean));
  ctx.tensors.push_back(std::move(rstd));
  ctx.tensors.push_back(std::move(logits));
  ctx.tensors.push_back(Tensor({1}, {static_cast<float>(data.loss_normalizer)}));
  return absl::OkStatus();
}

absl::Status GptHead::InputGradient(const Tensor& grad_output, const SavedContext& ctx,
                                    Tensor& grad_input, float& scale) {
  const int64_t c = cfg_.d_model, v = cfg_.vocab;
  if (ctx.tensors.size() != 6 || !ctx.ints.empty()) {
    return absl::InternalError("head: backward without a matching forward");
  }
  const Tensor& x = ctx.tensors[0];
  const Tensor& ln = ctx.tensors[1];
  const Tensor& mean = ctx.tensors[2];
  const Tensor& rstd = ctx.tensors[3];
  const Tensor& dlogits = ctx.tensors[4];  // softmax - onehot
  const float normalizer = ctx.tensors[5][0];
  const int64_t n = x.dim(0) * x.dim(1);
  const float dloss = grad_output.empty() ? 1.0f : grad_output[0];
  scale = dloss / normalizer;
  Tensor dln({n, c});
  kernels::ScaledLinearBackward(dlogits.data(), ln.data(), w_.value.data(), scale, dln.data(),
                                nullptr, n, c, v);
  grad_input.Reset(x.shape());
  kernels::LayerNormBackward(dln.data(), x.data(), ln_g_.value.data(), mean.data(), rstd.data(),
                             grad_input.data(), ln_g_.grad.data(), ln_b_.grad.data(), n, c);
  return absl::OkStatus();
}

void GptHead::WeightGradient(const SavedContext& ctx, float scale) {
  const Tensor& ln = ctx.tensors[1];
  const Tensor& dlogits = ctx.tensors[4];
  const int64_t c = cfg_.d_model, v = cfg_.vocab;
  const int64_t n = static_cast<int64_t>(ln.size()) / c;
  kernels::ScaledLinearBackward(dlogits.data(), ln.data(), nullptr, scale, nullptr, w_.grad.data(),
                                n, c, v);
}

absl::Status GptHead::Backward(const Tensor& grad_output, const SavedContext& ctx,
                               Tensor& grad_input) {
  float scale = 0.0f;
  RETURN_IF_ERROR(InputGradient(grad_output, ctx, grad_input, scale));
  WeightGradient(ctx, scale);
  return absl::OkStatus();
}

absl::Status GptHead::BackwardInput(const Tensor& grad_output, SavedContext& ctx,
                                    Tensor& grad_input) {
  float scale = 0.0f;
  RETURN_IF_ERROR(InputGradient(grad_output, ctx, grad_input, scale));
  // The weight pass reads ln, dlogits and the scale.
  for (int i : {0, 2, 3}) ctx.tensors[i].Clear();
  ctx.tensors[5][0] = scale;
  ctx.tensors.push_back(Tensor({1}, {1.0f}));  // marks the input gradient as done
  return absl::OkStatus();
}

absl::Status GptHead::BackwardWeight(SavedContext& ctx) {
  if (ctx.tensors.size() != 7) {
    return absl::InternalError("head: weight gradient before input gradient");
  }
  WeightGradient(ctx, ctx.tensors[5][0]);
  ctx.Clear();
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------

absl::StatusOr<std::vector<std::unique_ptr<Layer>>> BuildGptLayers(const v1::ModelSpec& model,
                                                                   uint64_t seed, int layer_begin,
                                                                   int layer_end) {
  ASSIGN_OR_RETURN(const GptConfig cfg, GptConfigFromSpec(model));
  return BuildGptLayers(cfg, seed, layer_begin, layer_end);
}

absl::StatusOr<std::vector<std::unique_ptr<Layer>>> BuildGptLayers(const GptConfig& cfg,
                                                                   uint64_t seed, int layer_begin,
                                                                   int layer_end) {
  return BuildLayerRange<GptEmbedding, GptBlock, GptHead>(cfg, cfg.n_layer, seed, layer_begin,
                                                          layer_end);
}

}  // namespace tandem::worker
