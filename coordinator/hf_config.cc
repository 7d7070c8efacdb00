#include "coordinator/hf_config.h"

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace tandem::coordinator {

int64_t HfVocabRows(const v1::ModelSpec& model) {
  return model.arch() == "gpt" && model.vocab_size() == kGpt2PaddedVocab ? kGpt2Vocab
                                                                         : model.vocab_size();
}

absl::StatusOr<std::string> HfConfigJson(const v1::ModelSpec& model) {
  nlohmann::ordered_json c;
  if (model.arch() == "llama") {
    const int kv = model.n_kv_head() > 0 ? model.n_kv_head() : model.n_head();
    c["architectures"] = {"LlamaForCausalLM"};
    c["model_type"] = "llama";
    c["hidden_size"] = model.d_model();
    c["intermediate_size"] = model.d_hidden();
    c["num_hidden_layers"] = model.n_layer();
    c["num_attention_heads"] = model.n_head();
    c["num_key_value_heads"] = kv;
    c["head_dim"] = model.n_head() > 0 ? model.d_model() / model.n_head() : 0;
    c["vocab_size"] = HfVocabRows(model);
    c["max_position_embeddings"] = model.seq_len();
    c["rope_theta"] = model.rope_theta();
    c["rms_norm_eps"] = model.rms_eps();
    c["tie_word_embeddings"] = model.tie_embeddings();
    c["hidden_act"] = "silu";
    c["attention_bias"] = false;
    c["mlp_bias"] = false;
    c["torch_dtype"] = "float32";
  } else if (model.arch() == "gpt") {
    c["architectures"] = {"GPT2LMHeadModel"};
    c["model_type"] = "gpt2";
    c["vocab_size"] = HfVocabRows(model);
    c["n_positions"] = model.seq_len();
    c["n_ctx"] = model.seq_len();
    c["n_embd"] = model.d_model();
    c["n_layer"] = model.n_layer();
    c["n_head"] = model.n_head();
    c["n_inner"] = model.d_hidden() > 0 ? model.d_hidden() : 4 * model.d_model();
    c["activation_function"] = "gelu_new";  // the tanh approximation, as Tandem's GELU
    c["layer_norm_epsilon"] = 1e-5;
    c["tie_word_embeddings"] = model.tie_embeddings();
    c["torch_dtype"] = "float32";
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "model.arch '", model.arch(), "' has no Hugging Face counterpart (gpt and llama do)"));
  }
  return c.dump(2) + "\n";
}

std::string HfConfigPath(const std::string& safetensors_path) {
  const size_t slash = safetensors_path.rfind('/');
  return slash == std::string::npos ? "config.json"
                                    : safetensors_path.substr(0, slash + 1) + "config.json";
}

}  // namespace tandem::coordinator
