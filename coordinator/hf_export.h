// Conversion between Tandem checkpoints and Hugging Face model files, for every arch with a
// counterpart (coordinator/hf_layout.h): gpt <-> GPT2LMHeadModel, llama <-> LlamaForCausalLM.
//
// Names already follow HF's state_dicts; what differs is layout, which hf_layout.h lists per
// tensor: GPT-2's four Conv1D projections are (in, out) in HF, (out, in) in Tandem, and a
// vocabulary padded to 50304 (the gpt2 preset) is cut back to GPT-2's 50257 rows. Llama needs
// no transposes. With tied embeddings lm_head.weight is left out of an export: HF ties it to
// the token embedding on load. The config.json beside an export comes from hf_config.h.
#ifndef TANDEM_COORDINATOR_HF_EXPORT_H_
#define TANDEM_COORDINATOR_HF_EXPORT_H_

#include <string>

#include "absl/status/status.h"
#include "coordinator/checkpoint_store.h"
#include "coordinator/hf_config.h"
#include "coordinator/hf_weights.h"
#include "tandem/v1/spec.pb.h"

namespace tandem::coordinator {

// Writes the parameters (not the optimizer state) of `checkpoint`, taken from a job whose
// model is `model`, to `path` atomically as F32 safetensors in HF's names and layouts.
//   INVALID_ARGUMENT  an arch with no HF counterpart (mlp_lm);
//   DATA_LOSS         the checkpoint lacks a tensor of the model, or holds one with another
//                     dtype or shape (naming it).
absl::Status ExportHfSafetensors(const CheckpointReader& checkpoint, const v1::ModelSpec& model,
                                 const std::string& path);

// Converts HF weights (init.hf_file: F32, BF16 or F16, one file or shards) into a
// weights-only checkpoint (job_id, step 0) of `store` with one stage file holding Tandem's
// names and layouts for `model`: Conv1D weights transposed back, a GPT-2 vocabulary padded
// with zero rows up to model.vocab_size, an untied lm_head the file lacks taken from the
// token embedding (the file's model was tied). Tensors the model does not use (e.g. an
// older transformers' rotary_emb.inv_freq) are ignored. INVALID_ARGUMENT, starting
// "init.hf_file: ", for an arch with no HF counterpart, a missing tensor, another dtype, or
// a shape that does not fit the spec, naming the tensor:
//   "init.hf_file: tensor model.layers.3.self_attn.k_proj.weight is [256, 576], the spec
//    needs [192, 576]".
absl::Status ImportHfWeights(const HfWeights& weights, const v1::ModelSpec& model,
                             CheckpointStore& store, const std::string& job_id);

}  // namespace tandem::coordinator

#endif  // TANDEM_COORDINATOR_HF_EXPORT_H_
