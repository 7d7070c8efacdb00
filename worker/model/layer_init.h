// What the models' layers share when they are built: the initial draw of a parameter and the
// check of a configured dimension. Every model (gpt, mlp_lm) initialises a parameter from its
// own RNG stream by global layer index, so that any partition draws the same values.
#ifndef TANDEM_WORKER_MODEL_LAYER_INIT_H_
#define TANDEM_WORKER_MODEL_LAYER_INIT_H_

#include <cstdint>

#include "absl/status/status.h"
#include "worker/model/layer.h"
#include "worker/model/random.h"

namespace tandem::worker {

// The standard deviation of the models' normal initial weights (GPT-2's).
inline constexpr float kInitStd = 0.02f;

// Fills `p.value` with normal draws of standard deviation `stddev`, in element order.
void InitNormal(Rng& rng, Parameter& p, float stddev);

// INVALID_ARGUMENT "model.<field> must be in [1, kMaxDim], got <value>" unless
// 1 <= value <= kMaxDim (common/limits.h).
absl::Status CheckDim(const char* field, int64_t value);

}  // namespace tandem::worker

#endif  // TANDEM_WORKER_MODEL_LAYER_INIT_H_
