#include "worker/model/model_layers.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "common/spec.h"
#include "common/status_macros.h"
#include "worker/model/gpt.h"
#include "worker/model/mlp_lm.h"

namespace tandem::worker {

absl::StatusOr<LlamaConfig> LlamaConfigFromSpec(const v1::ModelSpec& model) {
  if (model.arch() != "llama") {
    return absl::InvalidArgumentError(
        absl::StrCat("model.arch '", model.arch(), "' is not supported here; expected llama"));
  }
  if (model.d_hidden() < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model.d_hidden must be >= 0 (0 means the SwiGLU width), got ", model.d_hidden()));
  }
  if (model.n_kv_head() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.n_kv_head must be >= 0 (0 means n_head), got ", model.n_kv_head()));
  }
  LlamaConfig cfg;
  cfg.n_layer = model.n_layer();
  cfg.n_head = model.n_head();
  cfg.n_kv_head = model.n_kv_head() == 0 ? model.n_head() : model.n_kv_head();
  cfg.d_model = model.d_model();
  cfg.d_hidden = model.d_hidden() == 0 ? LlamaDefaultHidden(model.d_model()) : model.d_hidden();
  cfg.seq_len = model.seq_len();
  cfg.vocab = model.vocab_size();
  cfg.rope_theta = model.rope_theta();
  cfg.rms_eps = model.rms_eps();
  cfg.tie_embeddings = model.tie_embeddings();
  RETURN_IF_ERROR(ValidateLlamaConfig(cfg));
  return cfg;
}

absl::Status CheckModelSpec(const v1::ModelSpec& model) {
  if (model.arch() == "gpt") return GptConfigFromSpec(model).status();
  if (model.arch() == "llama") return LlamaConfigFromSpec(model).status();
  if (model.arch() == "mlp_lm") return MlpLmConfigFromSpec(model).status();
  return absl::InvalidArgumentError(absl::StrCat(
      "model.arch '", model.arch(), "' is not supported here; expected gpt, llama or mlp_lm"));
}

namespace {

// The one dispatch on model.arch, with what a job may change in how the blocks compute.
absl::StatusOr<std::vector<std::unique_ptr<Layer>>> BuildLayers(const v1::ModelSpec& model,
                                                                uint64_t seed, int layer_begin,
                                                                int layer_end,
                                                                bool selective_recompute) {
  if (model.arch() == "gpt") {
    ASSIGN_OR_RETURN(GptConfig cfg, GptConfigFromSpec(model));
    cfg.selective_recompute = selective_recompute;
    return BuildGptLayers(cfg, seed, layer_begin, layer_end);
  }
  // mlp_lm: no attention, nothing for selective to drop (spec validation refuses it there).
  if (model.arch() == "mlp_lm") return BuildMlpLmLayers(model, seed, layer_begin, layer_end);
  ASSIGN_OR_RETURN(LlamaConfig cfg, LlamaConfigFromSpec(model));
  cfg.selective_recompute = selective_recompute;
  return BuildLlamaLayers(cfg, seed, layer_begin, layer_end);
}

}  // namespace

absl::StatusOr<std::vector<std::unique_ptr<Layer>>> BuildModelLayers(const v1::ModelSpec& model,
                                                                     uint64_t seed, int layer_begin,
                                                                     int layer_end) {
  return BuildLayers(model, seed, layer_begin, layer_end, /*selective_recompute=*/false);
}

absl::StatusOr<std::vector<std::unique_ptr<Layer>>> BuildModelLayers(const v1::JobSpec& spec,
                                                                     int layer_begin,
                                                                     int layer_end) {
  return BuildLayers(spec.model(), spec.seed(), layer_begin, layer_end,
                     spec.pipeline().recompute() == "selective");
}

}  // namespace tandem::worker
