#include "worker/stage_compute.h"

#include <cstring>
#include <new>

#include "absl/strings/str_cat.h"

namespace tandem::worker {
namespace {

class HostBytes final : public StageBuffer {
 public:
  explicit HostBytes(size_t bytes) : bytes_(bytes) {}
  void* data() override { return bytes_.data(); }
  size_t bytes() const override { return bytes_.size(); }

 private:
  std::vector<char> bytes_;  // zeroed
};

}  // namespace

absl::StatusOr<StageBufferPtr> NewHostBuffer(size_t bytes) {
  try {
    return std::make_unique<HostBytes>(bytes);
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot allocate ", bytes, " bytes of host memory"));
  }
}

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
