// Job specifications: YAML text -> tandem.v1.JobSpec, defaults, and validation.
//
// The JobSpec proto is the schema. ParseJobSpecYaml walks the YAML against the proto's
// descriptor (common/proto_yaml.h): every key must be a field, every value must have the
// field's type; errors name the field path and place ("pipeline.micro_batches: expected an
// integer, got 'four' (line 2, column 18)"). ValidateJobSpec (common/spec_validation.h) then
// checks ranges and allowed names, again naming the path. Either step reports every error it
// finds, one per line (the text form of common/field_errors.h).
#ifndef TANDEM_COMMON_SPEC_H_
#define TANDEM_COMMON_SPEC_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/field_errors.h"
#include "common/spec_validation.h"
#include "tandem/v1/spec.pb.h"

namespace tandem {

// INVALID_ARGUMENT listing every structural or type error, each with its field path and place,
// and for a text over kMaxSpecBytes (common/limits.h). `lines`, when given, receives the line
// where each field is written (also on error), for ValidateJobSpec's errors.
absl::StatusOr<v1::JobSpec> ParseJobSpecYaml(absl::string_view yaml, FieldLines* lines = nullptr);

// Returns `spec` with every field that has a default set explicitly (recursively), so that
// the stored and shown spec says exactly what runs.
v1::JobSpec WithDefaults(const v1::JobSpec& spec);

// ValidateJobSpec(spec), declared in common/spec_validation.h: INVALID_ARGUMENT naming every
// bad field and what was expected. `spec` should already have defaults filled in
// (WithDefaults).

// Parse + WithDefaults + Validate; the validation errors name the lines of their fields.
absl::StatusOr<v1::JobSpec> LoadJobSpecYaml(absl::string_view yaml);

// Sequences per optimizer step (the global batch): micro_batch_size x micro_batches x
// replicas.
int64_t EffectiveBatch(const v1::JobSpec& spec);
// Whether model.arch is a decoder trained on seq_len windows predicting every position
// (gpt, llama), as opposed to mlp_lm (context tokens predict one next token).
bool IsDecoder(const v1::ModelSpec& model);
// llama's d_hidden when the spec leaves it 0: the smallest multiple of 64 at or above
// 8 d_model / 3 (SwiGLU's three matrices cost what GELU's two of width 4 d_model do).
int32_t LlamaDefaultHidden(int32_t d_model);
// Predicted (target) tokens per optimizer step: EffectiveBatch x seq_len for a decoder (every
// position is predicted), EffectiveBatch for mlp_lm (one next token per window).
int64_t TokensPerStep(const v1::JobSpec& spec);
// Workers of the job's gang: pipeline.stages x pipeline.replicas.
int GangSize(const v1::JobSpec& spec);
// Whether the job is elastic (elastic.min_workers > 0; common/elastic_layout.h).
inline bool IsElastic(const v1::JobSpec& spec) { return spec.elastic().min_workers() > 0; }
// Whether the job shards its optimizer state across replicas (ZeRO stage 1): optimizer.shard_state
// with pipeline.replicas > 1 and adamw (sgd keeps no state). Otherwise shard_state does nothing.
bool ShardsOptimizerState(const v1::JobSpec& spec);
// Tokens one training sample reads: seq_len + 1 (a decoder) or context + 1 (mlp_lm).
int64_t TrainingWindow(const v1::ModelSpec& model);

// The device kind a worker offers, the JobSpec.device it runs: "cuda:3" -> "cuda", "cpu" -> "cpu".
std::string DeviceKind(const std::string& device);

}  // namespace tandem

#endif  // TANDEM_COMMON_SPEC_H_
