// The Hugging Face view of a Tandem model spec: the config.json that transformers reads
// beside an exported safetensors file (LlamaConfig for llama, GPT2Config for gpt), and where
// `tandem export` puts it.
//
// Pure functions of the spec (no file system), shared by the CLI, which writes the file, and
// the coordinator's tests.
#ifndef TANDEM_COORDINATOR_HF_CONFIG_H_
#define TANDEM_COORDINATOR_HF_CONFIG_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "tandem/v1/spec.pb.h"

namespace tandem::coordinator {

// GPT-2's real vocabulary, and the padded size the gpt2 preset trains with.
inline constexpr int kGpt2Vocab = 50257;
inline constexpr int kGpt2PaddedVocab = 50304;

// Rows of the vocabulary matrices in the exported file: the padded GPT-2 vocabulary is cut
// back to GPT-2's 50257; every other vocabulary is kept whole.
int64_t HfVocabRows(const v1::ModelSpec& model);

// The config.json (a JSON object, newline-terminated) of `model` (resolved by WithDefaults:
// llama's n_kv_head and d_hidden set). llama: LlamaForCausalLM (hidden_size, intermediate_size,
// heads, head_dim, rope_theta, rms_norm_eps, tie_word_embeddings, hidden_act silu, no biases,
// float32); gpt: GPT2LMHeadModel (n_embd, n_inner, gelu_new, layer_norm_epsilon 1e-5).
// INVALID_ARGUMENT for another arch (mlp_lm has no Hugging Face counterpart).
absl::StatusOr<std::string> HfConfigJson(const v1::ModelSpec& model);

// Where `tandem export -o FILE` writes the config: config.json in FILE's directory, the name
// from_pretrained(directory) reads ("out/model.safetensors" -> "out/config.json",
// "model.safetensors" -> "config.json").
std::string HfConfigPath(const std::string& safetensors_path);

}  // namespace tandem::coordinator

#endif  // TANDEM_COORDINATOR_HF_CONFIG_H_
