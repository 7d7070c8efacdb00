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
  return CopyRestoredRange(lookup, name, bytes, 0, dst, bytes, where);
}

absl::Status CopyRestoredRange(const TensorLookup& lookup, const std::string& name,
                               size_t tensor_bytes, size_t offset, void* dst, size_t bytes,
                               absl::string_view where) {
  absl::StatusOr<absl::Span<const uint8_t>> src = lookup(name);
  if (!src.ok()) {
    return absl::Status(src.status().code(), absl::StrCat(where, ": ", src.status().message()));
  }
  if (src->size() != tensor_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": tensor ", name, " has ", src->size(),
                                                   " bytes, this stage needs ", tensor_bytes,
                                                   " (a different model shape?)"));
  }
  if (offset > tensor_bytes || bytes > tensor_bytes - offset) {
    return absl::InternalError(absl::StrCat(where, ": bytes [", offset, ", ", offset + bytes,
                                            ") of tensor ", name, " out of its ", tensor_bytes));
  }
  std::memcpy(dst, src->data() + offset, bytes);
  return absl::OkStatus();
}

}  // namespace tandem::worker
