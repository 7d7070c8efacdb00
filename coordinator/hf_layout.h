// Which tensors a Tandem model has in a Hugging Face file, per model.arch: the one place that
// knows the names, Tandem's shapes and how HF lays each out. Both export and import
// (coordinator/hf_export.h) walk this list, so the two directions cannot disagree.
//
//   gpt   (GPT2LMHeadModel): transformer.wte/wpe, transformer.h.N.{ln_1, attn.c_attn,
//         attn.c_proj, ln_2, mlp.c_fc, mlp.c_proj}.{weight, bias}, transformer.ln_f, and
//         lm_head.weight unless tied. The four projections are Conv1D, (in, out) in HF.
//   llama (LlamaForCausalLM): model.embed_tokens, model.layers.N.{input_layernorm,
//         self_attn.{q,k,v,o}_proj, post_attention_layernorm, mlp.{gate,up,down}_proj},
//         model.norm, and lm_head.weight unless tied. Every weight (out, in) as in Tandem.
//
// Names are those of Tandem's parameters too (checkpoints are keyed by them), so only
// layouts differ.
#ifndef TANDEM_COORDINATOR_HF_LAYOUT_H_
#define TANDEM_COORDINATOR_HF_LAYOUT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "tandem/v1/spec.pb.h"

namespace tandem::coordinator {

enum class HfLayout {
  kSame,        // the same shape and order in both
  kTransposed,  // a (out, in) Tandem matrix stored (in, out): GPT-2's Conv1D
  kVocabRows,   // a (V, C) matrix whose HF rows may be fewer: padding rows are not exported,
                // and import pads with zero rows (GPT-2 50257 <-> 50304)
};

struct HfTensor {
  std::string name;            // in the checkpoint and in the HF file alike
  std::vector<int64_t> shape;  // Tandem's
  HfLayout layout = HfLayout::kSame;
};

struct HfModelLayout {
  std::vector<HfTensor> tensors;  // in HF's state_dict order
  // The token embedding: what an untied lm_head missing from a file is imported from (the
  // file's model was tied).
  std::string embedding;
  // Rows of the vocabulary matrices in an exported file (HfVocabRows).
  int64_t hf_vocab = 0;
};

// The layout of `model` (resolved by WithDefaults). INVALID_ARGUMENT for an arch with no HF
// counterpart (mlp_lm) or dimensions that are not positive.
absl::StatusOr<HfModelLayout> HfLayoutOf(const v1::ModelSpec& model);

// "[256, 576]": a shape as the errors print it.
std::string ShapeString(const std::vector<int64_t>& shape);

}  // namespace tandem::coordinator

#endif  // TANDEM_COORDINATOR_HF_LAYOUT_H_
