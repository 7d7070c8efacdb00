#include "worker/model/mlp_lm.h"

#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/limits.h"
#include "common/model_desc.h"
#include "common/status_macros.h"
#include "worker/model/kernels.h"
#include "worker/model/layer_init.h"
#include "worker/model/random.h"

namespace tandem::worker {
namespace {

absl::Status CheckMatrix(const char* what, int64_t rows, int64_t cols) {
  if (rows * cols > kMaxTensorElements) {
    return absl::InvalidArgumentError(absl::StrCat("model too large: ", what, " would have ", rows,
                                                   " x ", cols, " elements (limit ",
                                                   kMaxTensorElements, ")"));
  }
  return absl::OkStatus();
}

absl::Status CheckShape(const char* layer, const char* what, const Tensor& t, int64_t rows,
                        int64_t cols) {
  if (t.rank() != 2 || (rows >= 0 && t.dim(0) != rows) || t.dim(1) != cols) {
    return absl::InvalidArgumentError(
        absl::StrCat(layer, ": ", what, " has shape ", t.ShapeString(), ", expected (",
                     rows < 0 ? "B" : absl::StrCat(rows), ", ", cols, ")"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<MlpLmConfig> MlpLmConfigFromSpec(const v1::ModelSpec& model) {
  if (model.arch() != "mlp_lm") {
    return absl::InvalidArgumentError(
        absl::StrCat("model.arch '", model.arch(), "' is not supported; expected mlp_lm"));
  }
  if (model.n_layer() < 0 || model.n_layer() > kMaxLayers) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.n_layer must be in [0, ", kMaxLayers, "], got ", model.n_layer()));
  }
  MlpLmConfig cfg;
  cfg.n_layer = model.n_layer();
  cfg.vocab = model.vocab_size();
  cfg.context = model.context();
  cfg.d_embed = model.d_embed();
  cfg.d_model = model.d_model();
  if (model.d_hidden() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.d_hidden must be >= 0 (0 means 4 * d_model), got ", model.d_hidden()));
  }
  cfg.d_hidden = model.d_hidden() == 0 ? 4 * cfg.d_model : model.d_hidden();
  for (auto [field, value] : {std::pair{"vocab_size", cfg.vocab},
                              {"context", cfg.context},
                              {"d_embed", cfg.d_embed},
                              {"d_model", cfg.d_model},
                              {"d_hidden", cfg.d_hidden}}) {
    RETURN_IF_ERROR(CheckDim(field, value));
  }
  for (auto [what, rows, cols] :
       {std::tuple{"the token table", cfg.vocab, cfg.d_embed},
        {"the embedding projection", cfg.d_model, cfg.context * cfg.d_embed},
        {"a block's fc1", cfg.d_hidden, cfg.d_model},
        {"the head", cfg.vocab, cfg.d_model}}) {
    RETURN_IF_ERROR(CheckMatrix(what, rows, cols));
  }
  // Whole-model parameter count, in double so that a hostile spec cannot overflow it.
  const double total = static_cast<double>(cfg.vocab) * cfg.d_embed +
                       static_cast<double>(cfg.context) * cfg.d_embed +
                       static_cast<double>(cfg.d_model) * (cfg.context * cfg.d_embed + 1) +
                       static_cast<double>(cfg.n_layer) *
                           (2.0 * cfg.d_hidden * cfg.d_model + cfg.d_hidden + 3.0 * cfg.d_model) +
                       static_cast<double>(cfg.vocab) * (cfg.d_model + 1) + 2.0 * cfg.d_model;
  if (total > kMaxModelParameters) {
    return absl::InvalidArgumentError(
        absl::StrCat("model too large: ", total, " parameters (limit ", kMaxModelParameters, ")"));
  }
  return cfg;
}

// ---------------------------------------------------------------------------------------
// Embedding. Saved context: ints[0] = tokens (B, K); tensors[0] = flat (B, K*E).

EmbeddingLayer::EmbeddingLayer(const MlpLmConfig& cfg, uint64_t seed)
    : cfg_(cfg),
      tok_("embedding.tok", {cfg.vocab, cfg.d_embed}, true),
      pos_("embedding.pos", {cfg.context, cfg.d_embed}, true),
      proj_w_("embedding.proj.weight", {cfg.d_model, cfg.context * cfg.d_embed}, true),
      proj_b_("embedding.proj.bias", {cfg.d_model}, false) {
  Rng rng(MixSeed(seed, 0));
  InitNormal(rng, tok_, kInitStd);
  InitNormal(rng, pos_, kInitStd);
  InitNormal(rng, proj_w_, kInitStd);
}

absl::Status EmbeddingLayer::Forward(const Tensor& input, const MicroBatchData& data,
                                     SavedContext& ctx, Tensor& output) {
  const int64_t k = cfg_.context, e = cfg_.d_embed, d = cfg_.d_model;
  if (data.tokens == nullptr || data.tokens->rank() != 2 || data.tokens->dim(1) != k) {
    return absl::InvalidArgumentError(
        absl::StrCat("embedding: expected tokens of shape (B, ", k, "), got ",
                     data.tokens == nullptr ? "none" : data.tokens->ShapeString()));
  }
  const IntTensor& tokens = *data.tokens;
  const int64_t b = tokens.dim(0);
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] >= cfg_.vocab) {
      return absl::InvalidArgumentError(absl::StrCat(
          "embedding: token ", tokens[i], " is outside the vocabulary [0, ", cfg_.vocab, ")"));
    }
  }
  Tensor flat({b, k * e});  // (B, K*E)
  for (int64_t bi = 0; bi < b; ++bi) {
    for (int64_t ki = 0; ki < k; ++ki) {
      const float* t = tok_.value.data() + static_cast<size_t>(tokens[bi * k + ki]) * e;
      const float* p = pos_.value.data() + ki * e;
      float* out = flat.data() + (bi * k + ki) * e;
      for (int64_t j = 0; j < e; ++j) out[j] = t[j] + p[j];
    }
  }
  output.Reset({b, d});
  kernels::LinearForward(flat.data(), proj_w_.value.data(), proj_b_.value.data(), output.data(), b,
                         k * e, d);
  ctx.ints.push_back(tokens);
  ctx.tensors.push_back(std::move(flat));
  return absl::OkStatus();
}

absl::Status EmbeddingLayer::Backward(const Tensor& grad_output, const SavedContext& ctx,
                                      Tensor& grad_input) {
  const int64_t k = cfg_.context, e = cfg_.d_embed, d = cfg_.d_model;
  if (ctx.ints.size() != 1 || ctx.tensors.size() != 1) {
    return absl::InternalError("embedding: backward without a matching forward");
  }
  const IntTensor& tokens = ctx.ints[0];
  const Tensor& flat = ctx.tensors[0];
  const int64_t b = tokens.dim(0);
  RETURN_IF_ERROR(CheckShape("embedding", "grad_output", grad_output, b, d));
  Tensor dflat({b, k * e});  // (B, K*E)
  kernels::LinearBackward(grad_output.data(), flat.data(), proj_w_.value.data(), dflat.data(),
                          proj_w_.grad.data(), proj_b_.grad.data(), b, k * e, d);
  for (int64_t bi = 0; bi < b; ++bi) {
    for (int64_t ki = 0; ki < k; ++ki) {
      const float* g = dflat.data() + (bi * k + ki) * e;
      float* dt = tok_.grad.data() + static_cast<size_t>(tokens[bi * k + ki]) * e;
      float* dp = pos_.grad.data() + ki * e;
      for (int64_t j = 0; j < e; ++j) {
        dt[j] += g[j];
        dp[j] += g[j];
      }
    }
  }
  grad_input.Clear();
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------
// Block. Saved context: tensors = {h (B, D), ln (B, D), mean (B), rstd (B), pre (B, H),
// act (B, H)}.

MlpBlockLayer::MlpBlockLayer(const MlpLmConfig& cfg, int block_index, uint64_t seed)
    : cfg_(cfg),
      block_index_(block_index),
      name_(absl::StrCat("block_", block_index)),
      ln_g_(absl::StrCat(name_, ".ln.gain"), {cfg.d_model}, false),
      ln_b_(absl::StrCat(name_, ".ln.bias"), {cfg.d_model}, false),
      fc1_w_(absl::StrCat(name_, ".fc1.weight"), {cfg.d_hidden, cfg.d_model}, true),
      fc1_b_(absl::StrCat(name_, ".fc1.bias"), {cfg.d_hidden}, false),
      fc2_w_(absl::StrCat(name_, ".fc2.weight"), {cfg.d_model, cfg.d_hidden}, true),
      fc2_b_(absl::StrCat(name_, ".fc2.bias"), {cfg.d_model}, false) {
  ln_g_.value.Fill(1.0f);
  Rng rng(MixSeed(seed, static_cast<uint64_t>(block_index) + 1));
  InitNormal(rng, fc1_w_, kInitStd);
  // GPT-2: residual projections scaled by 1/sqrt(2 n_layer) to keep the stream's variance flat.
  InitNormal(rng, fc2_w_,
             kInitStd / std::sqrt(2.0f * static_cast<float>(std::max<int64_t>(cfg.n_layer, 1))));
}

absl::Status MlpBlockLayer::Forward(const Tensor& input, const MicroBatchData& data,
                                    SavedContext& ctx, Tensor& output) {
  const int64_t d = cfg_.d_model, h = cfg_.d_hidden;
  RETURN_IF_ERROR(CheckShape(name_.c_str(), "input", input, -1, d));
  const int64_t b = input.dim(0);
  Tensor ln({b, d}), mean({b}), rstd({b}), pre({b, h}), act({b, h});
  kernels::LayerNormForward(input.data(), ln_g_.value.data(), ln_b_.value.data(), ln.data(),
                            mean.data(), rstd.data(), b, d);
  kernels::LinearForward(ln.data(), fc1_w_.value.data(), fc1_b_.value.data(), pre.data(), b, d, h);
  kernels::GeluForward(pre.data(), act.data(), b * h);
  output.Reset({b, d});
  kernels::LinearForward(act.data(), fc2_w_.value.data(), fc2_b_.value.data(), output.data(), b, h,
                         d);
  for (size_t i = 0; i < output.size(); ++i) output[i] += input[i];
  ctx.tensors.reserve(6);
  ctx.tensors.push_back(input);
  ctx.tensors.push_back(std::move(ln));
  ctx.tensors.push_back(std::move(mean));
  ctx.tensors.push_back(std::move(rstd));
  ctx.tensors.push_back(std::move(pre));
  ctx.tensors.push_back(std::move(act));
  return absl::OkStatus();
}

absl::Status MlpBlockLayer::Backward(const Tensor& grad_output, const SavedContext& ctx,
                                     Tensor& grad_input) {
  const int64_t d = cfg_.d_model, h = cfg_.d_hidden;
  if (ctx.tensors.size() != 6) {
    return absl::InternalError(absl::StrCat(name_, ": backward without a matching forward"));
  }
  const Tensor& x = ctx.tensors[0];
  const Tensor& ln = ctx.tensors[1];
  const Tensor& mean = ctx.tensors[2];
  const Tensor& rstd = ctx.tensors[3];
  const Tensor& pre = ctx.tensors[4];
  const Tensor& act = ctx.tensors[5];
  const int64_t b = x.dim(0);
  RETURN_IF_ERROR(CheckShape(name_.c_str(), "grad_output", grad_output, b, d));
  Tensor dact({b, h}), dpre({b, h}), dln({b, d});
  kernels::LinearBackward(grad_output.data(), act.data(), fc2_w_.value.data(), dact.data(),
                          fc2_w_.grad.data(), fc2_b_.grad.data(), b, h, d);
  kernels::GeluBackward(pre.data(), dact.data(), dpre.data(), b * h);
  kernels::LinearBackward(dpre.data(), ln.data(), fc1_w_.value.data(), dln.data(),
                          fc1_w_.grad.data(), fc1_b_.grad.data(), b, d, h);
  grad_input = grad_output;  // the residual path
  kernels::LayerNormBackward(dln.data(), x.data(), ln_g_.value.data(), mean.data(), rstd.data(),
                             grad_input.data(), ln_g_.grad.data(), ln_b_.grad.data(), b, d);
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------
// Head. Saved context: tensors = {h (B, D), ln (B, D), mean (B), rstd (B), probs (B, V)},
// ints = {targets (B)}; plus the normalizer as tensors[5] (1,).

LmHeadLayer::LmHeadLayer(const MlpLmConfig& cfg, uint64_t seed)
    : cfg_(cfg),
      ln_g_("head.ln.gain", {cfg.d_model}, false),
      ln_b_("head.ln.bias", {cfg.d_model}, false),
      w_("head.weight", {cfg.vocab, cfg.d_model}, true),
      b_("head.bias", {cfg.vocab}, false) {
  ln_g_.value.Fill(1.0f);
  Rng rng(MixSeed(seed, static_cast<uint64_t>(cfg.n_layer) + 1));
  InitNormal(rng, w_, kInitStd);
}

absl::Status LmHeadLayer::Forward(const Tensor& input, const MicroBatchData& data,
                                  SavedContext& ctx, Tensor& output) {
  const int64_t d = cfg_.d_model, v = cfg_.vocab;
  RETURN_IF_ERROR(CheckShape("head", "input", input, -1, d));
  const int64_t b = input.dim(0);
  if (data.targets == nullptr || data.targets->rank() != 1 || data.targets->dim(0) != b) {
    return absl::InvalidArgumentError(
        absl::StrCat("head: expected targets of shape (", b, "), got ",
                     data.targets == nullptr ? "none" : data.targets->ShapeString()));
  }
  const IntTensor& targets = *data.targets;
  for (size_t i = 0; i < targets.size(); ++i) {
    if (targets[i] < 0 || targets[i] >= v) {
      return absl::InvalidArgumentError(
          absl::StrCat("head: target ", targets[i], " is outside the vocabulary [0, ", v, ")"));
    }
  }
  if (data.loss_normalizer < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("head: loss normalizer must be >= 1, got ", data.loss_normalizer));
  }
  Tensor ln({b, d}), mean({b}), rstd({b}), logits({b, v}), probs({b, v}), losses({b});
  kernels::LayerNormForward(input.data(), ln_g_.value.data(), ln_b_.value.data(), ln.data(),
                            mean.data(), rstd.data(), b, d);
  kernels::LinearForward(ln.data(), w_.value.data(), b_.value.data(), logits.data(), b, d, v);
  const double total = kernels::SoftmaxCrossEntropyForward(logits.data(), targets.data(),
                                                           probs.data(), losses.data(), b, v);
  output.Reset({1});
  output[0] = static_cast<float>(total / static_cast<double>(data.loss_normalizer));
  ctx.tensors.reserve(6);
  ctx.tensors.push_back(input);
  ctx.tensors.push_back(std::move(ln));
  ctx.tensors.push_back(std::move(mean));
  ctx.tensors.push_back(std::move(rstd));
  ctx.tensors.push_back(std::move(probs));
  ctx.tensors.push_back(Tensor({1}, {static_cast<float>(data.loss_normalizer)}));
  ctx.ints.push_back(targets);
  return absl::OkStatus();
}

absl::Status LmHeadLayer::Backward(const Tensor& grad_output, const SavedContext& ctx,
                                   Tensor& grad_input) {
  const int64_t d = cfg_.d_model, v = cfg_.vocab;
  if (ctx.tensors.size() != 6 || ctx.ints.size() != 1) {
    return absl::InternalError("head: backward without a matching forward");
  }
  const Tensor& x = ctx.tensors[0];
  const Tensor& ln = ctx.tensors[1];
  const Tensor& mean = ctx.tensors[2];
  const Tensor& rstd = ctx.tensors[3];
  const Tensor& probs = ctx.tensors[4];
  const float normalizer = ctx.tensors[5][0];
  const IntTensor& targets = ctx.ints[0];
  const int64_t b = x.dim(0);
  const float dloss = grad_output.empty() ? 1.0f : grad_output[0];
  Tensor dlogits({b, v}), dln({b, d});
  kernels::SoftmaxCrossEntropyBackward(probs.data(), targets.data(), dloss / normalizer,
                                       dlogits.data(), b, v);
  kernels::LinearBackward(dlogits.data(), ln.data(), w_.value.data(), dln.data(), w_.grad.data(),
                          b_.grad.data(), b, d, v);
  grad_input.Reset({b, d});
  kernels::LayerNormBackward(dln.data(), x.data(), ln_g_.value.data(), mean.data(), rstd.data(),
                             grad_input.data(), ln_g_.grad.data(), ln_b_.grad.data(), b, d);
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------

absl::StatusOr<std::vector<std::unique_ptr<Layer>>> BuildMlpLmLayers(const v1::ModelSpec& model,
                                                                     uint64_t seed, int layer_begin,
                                                                     int layer_end) {
  ASSIGN_OR_RETURN(const MlpLmConfig cfg, MlpLmConfigFromSpec(model));
  return BuildLayerRange<EmbeddingLayer, MlpBlockLayer, LmHeadLayer>(cfg, model.n_layer(), seed,
                                                                     layer_begin, layer_end);
}

}  // namespace tandem::worker
