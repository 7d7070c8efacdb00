// Conversion of a Tandem GPT checkpoint to the layout of Hugging Face's GPT2LMHeadModel.
//
// Names already follow GPT2LMHeadModel's state_dict; what differs is layout: HF keeps the four
// projection matrices of each block (attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj) as Conv1D
// weights of shape (in, out), Tandem as (out, in), so those are transposed. A vocabulary
// padded to 50304 (the gpt2 preset) is cut back to GPT-2's 50257 rows. With tied embeddings
// lm_head.weight is left out: GPT2LMHeadModel ties it to transformer.wte.weight on load.
#ifndef TANDEM_COORDINATOR_HF_EXPORT_H_
#define TANDEM_COORDINATOR_HF_EXPORT_H_

#include <string>

#include "absl/status/status.h"
#include "coordinator/checkpoint_store.h"
#include "tandem/v1/spec.pb.h"

namespace tandem::coordinator {

// GPT-2's real vocabulary, and the padded size the gpt2 preset trains with.
inline constexpr int kGpt2Vocab = 50257;
inline constexpr int kGpt2PaddedVocab = 50304;

// Writes the parameters (not the optimizer state) of `checkpoint`, taken from a job whose
// model is `model` (arch gpt), to `path` atomically. INVALID_ARGUMENT for another arch.
absl::Status ExportGpt2Safetensors(const CheckpointReader& checkpoint, const v1::ModelSpec& model,
                                   const std::string& path);

// Converts a Hugging Face GPT-2 safetensors file (F32) into a weights-only checkpoint
// (job_id, step 0) of `store` with one stage file holding Tandem's names and layouts for
// `model`: Conv1D weights transposed back, the vocabulary padded with zero rows up to
// model.vocab_size, lm_head taken from wte when the file has none. INVALID_ARGUMENT names a
// tensor that is missing or whose shape does not fit the model.
absl::Status ImportGpt2Safetensors(const std::string& hf_path, const v1::ModelSpec& model,
                                   CheckpointStore& store, const std::string& job_id);

}  // namespace tandem::coordinator

#endif  // TANDEM_COORDINATOR_HF_EXPORT_H_
