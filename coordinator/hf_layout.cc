#include "coordinator/hf_layout.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "coordinator/hf_config.h"

namespace tandem::coordinator {
namespace {

HfModelLayout Gpt2Layout(const v1::ModelSpec& m) {
  const int64_t c = m.d_model(), v = m.vocab_size(), t = m.seq_len();
  const int64_t h = m.d_hidden() > 0 ? m.d_hidden() : 4 * c;
  HfModelLayout out;
  out.embedding = "transformer.wte.weight";
  out.tensors = {{out.embedding, {v, c}, HfLayout::kVocabRows}, {"transformer.wpe.weight", {t, c}}};
  for (int i = 0; i < m.n_layer(); ++i) {
    const std::string b = absl::StrCat("transformer.h.", i, ".");
    for (HfTensor w :
         std::vector<HfTensor>{{"ln_1.weight", {c}},
                               {"ln_1.bias", {c}},
                               {"attn.c_attn.weight", {3 * c, c}, HfLayout::kTransposed},
                               {"attn.c_attn.bias", {3 * c}},
                               {"attn.c_proj.weight", {c, c}, HfLayout::kTransposed},
                               {"attn.c_proj.bias", {c}},
                               {"ln_2.weight", {c}},
                               {"ln_2.bias", {c}},
                               {"mlp.c_fc.weight", {h, c}, HfLayout::kTransposed},
                               {"mlp.c_fc.bias", {h}},
                               {"mlp.c_proj.weight", {c, h}, HfLayout::kTransposed},
                               {"mlp.c_proj.bias", {c}}}) {
      w.name = b + w.name;
      out.tensors.push_back(std::move(w));
    }
  }
  out.tensors.push_back({"transformer.ln_f.weight", {c}});
  out.tensors.push_back({"transformer.ln_f.bias", {c}});
  if (!m.tie_embeddings()) out.tensors.push_back({"lm_head.weight", {v, c}, HfLayout::kVocabRows});
  return out;
}

HfModelLayout LlamaLayout(const v1::ModelSpec& m) {
  const int64_t c = m.d_model(), v = m.vocab_size(), h = m.d_hidden();
  const int64_t kv = m.n_kv_head() > 0 ? m.n_kv_head() : m.n_head();
  const int64_t kvd = kv * (c / m.n_head());  // KV heads x head size
  HfModelLayout out;
  out.embedding = "model.embed_tokens.weight";
  out.tensors = {{out.embedding, {v, c}}};
  for (int i = 0; i < m.n_layer(); ++i) {
    const std::string b = absl::StrCat("model.layers.", i, ".");
    for (HfTensor w : std::vector<HfTensor>{{"input_layernorm.weight", {c}},
                                            {"self_attn.q_proj.weight", {c, c}},
                                            {"self_attn.k_proj.weight", {kvd, c}},
                                            {"self_attn.v_proj.weight", {kvd, c}},
                                            {"self_attn.o_proj.weight", {c, c}},
                                            {"post_attention_layernorm.weight", {c}},
                                            {"mlp.gate_proj.weight", {h, c}},
                                            {"mlp.up_proj.weight", {h, c}},
                                            {"mlp.down_proj.weight", {c, h}}}) {
      w.name = b + w.name;
      out.tensors.push_back(std::move(w));
    }
  }
  out.tensors.push_back({"model.norm.weight", {c}});
  if (!m.tie_embeddings()) out.tensors.push_back({"lm_head.weight", {v, c}});
  return out;
}

}  // namespace

absl::StatusOr<HfModelLayout> HfLayoutOf(const v1::ModelSpec& model) {
  if (model.arch() != "gpt" && model.arch() != "llama") {
    return absl::InvalidArgumentError(absl::StrCat(
        "model.arch '", model.arch(), "' has no Hugging Face counterpart (gpt and llama do)"));
  }
  if (model.d_model() <= 0 || model.n_head() <= 0 || model.vocab_size() <= 0 ||
      model.seq_len() <= 0 || model.n_layer() < 0 ||
      (model.arch() == "llama" && model.d_hidden() <= 0)) {
    return absl::InvalidArgumentError("the model's dimensions are not resolved");
  }
  HfModelLayout layout = model.arch() == "gpt" ? Gpt2Layout(model) : LlamaLayout(model);
  layout.hf_vocab = HfVocabRows(model);
  return layout;
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

}  // namespace tandem::coordinator
