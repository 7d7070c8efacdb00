// The model of a job spec, whatever its architecture: one place that maps model.arch to the
// layers the workers build (gpt: worker/model/gpt.h, llama: llama.h, mlp_lm: mlp_lm.h).
// Callers (the stage compute, the profiler, the stage-program check) do not branch on arch.
#ifndef TANDEM_WORKER_MODEL_MODEL_LAYERS_H_
#define TANDEM_WORKER_MODEL_MODEL_LAYERS_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "tandem/v1/spec.pb.h"
#include "worker/model/layer.h"
#include "worker/model/llama.h"

namespace tandem::worker {

// The llama config of `model` (arch llama): n_kv_head 0 means n_head and d_hidden 0 means
// common/spec.h's LlamaDefaultHidden, as WithDefaults resolves them. INVALID_ARGUMENT naming
// the field for another arch or a config ValidateLlamaConfig refuses.
absl::StatusOr<LlamaConfig> LlamaConfigFromSpec(const v1::ModelSpec& model);

// OK when the workers can build `model`: its arch is one they know and its fields pass that
// architecture's config check (GptConfigFromSpec, LlamaConfigFromSpec, MlpLmConfigFromSpec).
absl::Status CheckModelSpec(const v1::ModelSpec& model);

// The layers [layer_begin, layer_end) of `model` (global indices: embedding 0, block_i i + 1,
// head n_layer + 1), weights drawn from `seed` as every partition draws them.
absl::StatusOr<std::vector<std::unique_ptr<Layer>>> BuildModelLayers(const v1::ModelSpec& model,
                                                                     uint64_t seed, int layer_begin,
                                                                     int layer_end);

// The layers [layer_begin, layer_end) a worker of job `spec` runs: those of spec.model() from
// spec.seed(), with the job's settings that change how a layer computes applied: with
// pipeline.recompute "selective" the gpt and llama blocks keep no attention probabilities
// (gpt: nor GELU output) and recompute them in backward (gpt.h, llama.h). The workers' stage
// compute and profiler build through this one, so that a profile measures the job's layers.
absl::StatusOr<std::vector<std::unique_ptr<Layer>>> BuildModelLayers(const v1::JobSpec& spec,
                                                                     int layer_begin,
                                                                     int layer_end);

}  // namespace tandem::worker

#endif  // TANDEM_WORKER_MODEL_MODEL_LAYERS_H_
