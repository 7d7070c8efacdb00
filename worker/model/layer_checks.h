// The checks a sequence model's layers (gpt, llama) make of what they are handed, so that a
// bad shape or target is an INVALID_ARGUMENT that names the layer and the tensor rather than
// an out-of-bounds read.
#ifndef TANDEM_WORKER_MODEL_LAYER_CHECKS_H_
#define TANDEM_WORKER_MODEL_LAYER_CHECKS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "worker/model/layer.h"
#include "worker/model/tensor.h"

namespace tandem::worker {

// t is (B, T, cols) with B >= 1, 1 <= T <= max_t, and B*T at most kMaxRows (common/limits.h).
absl::Status CheckActivation(const std::string& layer, const char* what, const Tensor& t,
                             int64_t max_t, int64_t cols);

// t has exactly `shape`.
absl::Status CheckSameShape(const std::string& layer, const char* what, const Tensor& t,
                            const std::vector<int64_t>& shape);

// What a loss head reads of a (b, t) micro-batch: targets of shape (b, t), each in [0, vocab),
// and a loss normalizer >= 1.
absl::Status CheckHeadTargets(const MicroBatchData& data, int64_t b, int64_t t, int64_t vocab);

}  // namespace tandem::worker

#endif  // TANDEM_WORKER_MODEL_LAYER_CHECKS_H_
