#include "worker/model/layer_init.h"

#include "absl/strings/str_cat.h"
#include "common/limits.h"

namespace tandem::worker {

void InitNormal(Rng& rng, Parameter& p, float stddev) {
  for (size_t i = 0; i < p.value.size(); ++i) {
    p.value[i] = static_cast<float>(rng.Normal() * stddev);
  }
}

absl::Status CheckDim(const char* field, int64_t value) {
  if (value < 1 || value > kMaxDim) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.", field, " must be in [1, ", kMaxDim, "], got ", value));
  }
  return absl::OkStatus();
}

}  // namespace tandem::worker
