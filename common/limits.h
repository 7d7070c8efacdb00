// The limits on what a job spec may ask for, in one place: the coordinator refuses a spec over
// them at submit (common/spec.cc), and the workers refuse to build a model over them at
// configure (worker/model/gpt.cc, mlp_lm.cc), so both sides agree on what a valid job is. And
// the limit on what a worker registers, which the worker keeps to and the coordinator checks.
//
// A spec is untrusted input. The model limits keep every GEMM dimension and every weight matrix
// within BLAS's int range and bound a worker's memory.
#ifndef TANDEM_COMMON_LIMITS_H_
#define TANDEM_COMMON_LIMITS_H_

#include <cstddef>
#include <cstdint>
#include <limits>

namespace tandem {

// A job spec's YAML text is a few hundred bytes; anything near this is a mistake (or an attack
// on the coordinator's memory), not a spec.
inline constexpr size_t kMaxSpecBytes = 1 << 20;

// One model dimension (d_model, d_hidden, n_head, seq_len, vocab_size, context, d_embed).
inline constexpr int64_t kMaxDim = 1 << 20;
// Transformer blocks (or MLP blocks) of one model.
inline constexpr int64_t kMaxLayers = 4096;
// Elements of one weight matrix: BLAS indexes it with an int.
inline constexpr int64_t kMaxTensorElements = std::numeric_limits<int32_t>::max();
// Parameters of a whole model: 2^32, 16 GiB of fp32 weights (64 GiB with gradients and AdamW
// state). A double, as the counts it bounds are computed in double so that a hostile spec
// cannot overflow them.
inline constexpr double kMaxModelParameters = 4294967296.0;
// Rows of one GEMM (B*T) stay within BLAS's int range.
inline constexpr int64_t kMaxRows = std::numeric_limits<int32_t>::max();

// Data parallelism: pipeline replicas per job, and the workers of one job's gang (stages x
// replicas).
inline constexpr int64_t kMaxReplicas = 1024;
inline constexpr int64_t kMaxGangWorkers = 4096;

// RegisterRequest.device_name, the GPU's or the processor's name: the worker cuts its name to
// this (worker/device_name.h), the coordinator refuses more (coordinator/worker_registry.cc).
inline constexpr size_t kMaxDeviceNameBytes = 256;

}  // namespace tandem

#endif  // TANDEM_COMMON_LIMITS_H_
