#include "worker/stage_compute.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace tandem::worker {

absl::Status CopyRestoredTensor(const TensorLookup& lookup, const std::string& name, void* dst,
                                size_t bytes, absl::string_view where) {
  absl::StatusOr<absl::Span<const uint8_t>> src = lookup(name);
  if (!src.ok()) {
    return absl::Status(src.status().code(), absl::StrCat(where, ": ", src.status().message()));
  }
  if (src->size() != bytes) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": tensor ", name, " has ", src->size(),
                                                   " bytes, this stage needs ", bytes,
                                                   " (a different model shape?)"));
  }
  std::memcpy(dst, src->data(), bytes);
  return absl::OkStatus();
}

}  // namespace tandem::worker
