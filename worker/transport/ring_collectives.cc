#include "worker/transport/ring_collectives.h"

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "common/shard_range.h"
#include "common/status_macros.h"
#include "worker/transport/ring_allreduce.h"

namespace tandem::worker {
namespace {

// Tensors below this many floats (1 MiB) travel coalesced with the call's other small ones.
constexpr size_t kCoalesceBelow = size_t{1} << 18;

class RingCollectives final : public GroupCollectives {
 public:
  explicit RingCollectives(std::unique_ptr<Transport> group) : group_(std::move(group)) {}

  int rank() const override { return group_->rank(); }
  int size() const override { return group_->size(); }
  void Abort() override { group_->Abort(); }

  absl::Status Run(CollectiveOp op, absl::Span<const absl::Span<float>> tensors) override {
    size_t small = 0;
    for (const absl::Span<float>& t : tensors) {
      if (t.size() < kCoalesceBelow) small += t.size();
    }
    for (const absl::Span<float>& t : tensors) {
      if (t.size() < kCoalesceBelow) continue;
      const RingAllReduceOptions options{.id = next_id_++};
      switch (op) {
        case CollectiveOp::kAllReduce:
          RETURN_IF_ERROR(RingAllReduce(*group_, t.data(), t.size(), scratch_, options));
          break;
        case CollectiveOp::kReduceScatter:
          RETURN_IF_ERROR(RingReduceScatter(*group_, t.data(), t.size(), scratch_, options));
          break;
        case CollectiveOp::kAllGather:
          RETURN_IF_ERROR(RingAllGather(*group_, t.data(), t.size(), options));
          break;
      }
    }
    if (small == 0) return absl::OkStatus();
    staging_.resize(small);
    size_t at = 0;
    for (const absl::Span<float>& t : tensors) {
      if (t.size() >= kCoalesceBelow) continue;
      if (op == CollectiveOp::kAllGather) {
        // Only the owner's segment is non-zero: the sum is an exact copy of it.
        std::fill(staging_.data() + at, staging_.data() + at + t.size(), 0.0f);
        const ElementRange own = OwnedSegment(t.size(), size(), rank());
        std::memcpy(staging_.data() + at + own.begin, t.data() + own.begin,
                    own.size() * sizeof(float));
      } else {
        std::memcpy(staging_.data() + at, t.data(), t.size() * sizeof(float));
      }
      at += t.size();
    }
    RETURN_IF_ERROR(RingAllReduce(*group_, staging_.data(), small, scratch_, {.id = next_id_++}));
    at = 0;
    for (const absl::Span<float>& t : tensors) {
      if (t.size() >= kCoalesceBelow) continue;
      std::memcpy(t.data(), staging_.data() + at, t.size() * sizeof(float));
      at += t.size();
    }
    return absl::OkStatus();
  }

 private:
  std::unique_ptr<Transport> group_;
  std::vector<float> scratch_;  // the ring's receive buffer
  std::vector<float> staging_;  // small tensors coalesced
  uint32_t next_id_ = 0;
};

}  // namespace

std::unique_ptr<GroupCollectives> NewRingCollectives(std::unique_ptr<Transport> group) {
  return std::make_unique<RingCollectives>(std::move(group));
}

}  // namespace tandem::worker
