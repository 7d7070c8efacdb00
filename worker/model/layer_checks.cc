#include "worker/model/layer_checks.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/limits.h"

namespace tandem::worker {

absl::Status CheckActivation(const std::string& layer, const char* what, const Tensor& t,
                             int64_t max_t, int64_t cols) {
  if (t.rank() != 3 || t.dim(0) < 1 || t.dim(1) < 1 || t.dim(1) > max_t || t.dim(2) != cols) {
    return absl::InvalidArgumentError(absl::StrCat(layer, ": ", what, " has shape ",
                                                   t.ShapeString(), ", expected (B, T, ", cols,
                                                   ") with 1 <= T <= ", max_t));
  }
  if (t.dim(0) * t.dim(1) > kMaxRows) {
    return absl::InvalidArgumentError(absl::StrCat(layer, ": ", what, " has ", t.dim(0) * t.dim(1),
                                                   " rows (limit ", kMaxRows, ")"));
  }
  return absl::OkStatus();
}

absl::Status CheckSameShape(const std::string& layer, const char* what, const Tensor& t,
                            const std::vector<int64_t>& shape) {
  if (t.shape() != shape) {
    return absl::InvalidArgumentError(absl::StrCat(layer, ": ", what, " has shape ",
                                                   t.ShapeString(), ", expected (",
                                                   absl::StrJoin(shape, ", "), ")"));
  }
  return absl::OkStatus();
}

absl::Status CheckHeadTargets(const MicroBatchData& data, int64_t b, int64_t t, int64_t vocab) {
  const IntTensor* targets = data.targets;
  if (targets == nullptr || targets->shape() != std::vector<int64_t>{b, t}) {
    return absl::InvalidArgumentError(
        absl::StrCat("head: expected targets of shape (", b, ", ", t, "), got ",
                     targets == nullptr ? "none" : targets->ShapeString()));
  }
  for (size_t i = 0; i < targets->size(); ++i) {
    if ((*targets)[i] < 0 || (*targets)[i] >= vocab) {
      return absl::InvalidArgumentError(absl::StrCat(
          "head: target ", (*targets)[i], " is outside the vocabulary [0, ", vocab, ")"));
    }
  }
  if (data.loss_normalizer < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("head: loss normalizer must be >= 1, got ", data.loss_normalizer));
  }
  return absl::OkStatus();
}

}  // namespace tandem::worker
