// How a data-parallel group cuts a tensor of `count` elements among its R ranks: R contiguous
// segments, the first count % R one element longer. After a ring reduce-scatter
// (worker/transport/ring_allreduce.h) rank k holds the complete sum of segment (k + 1) mod R,
// so that is the segment it owns when the optimizer state is sharded (optimizer.shard_state):
// it keeps the moments of that segment, updates it, and the all-gather copies it to the others.
// Shared by the ring, the optimizer and the checkpoint gathering, so that all three agree.
#ifndef TANDEM_COMMON_SHARD_RANGE_H_
#define TANDEM_COMMON_SHARD_RANGE_H_

#include <algorithm>
#include <cstddef>

namespace tandem {

struct ElementRange {
  size_t begin = 0;
  size_t end = 0;
  size_t size() const { return end - begin; }
  bool operator==(const ElementRange&) const = default;
};

// Segment `i` of `parts` (>= 1) over `count` elements.
inline ElementRange SegmentOf(size_t count, int parts, int i) {
  const size_t n = static_cast<size_t>(std::max(1, parts));
  const size_t base = count / n;
  const size_t extra = count % n;
  const size_t idx = static_cast<size_t>(i);
  const size_t begin = idx * base + std::min(idx, extra);
  return {begin, begin + base + (idx < extra ? 1 : 0)};
}

// The segment rank `rank` of `ranks` owns: (rank + 1) mod ranks; the whole tensor for one rank.
inline ElementRange OwnedSegment(size_t count, int ranks, int rank) {
  if (ranks <= 1) return {0, count};
  return SegmentOf(count, ranks, (rank + 1) % ranks);
}

}  // namespace tandem

#endif  // TANDEM_COMMON_SHARD_RANGE_H_
