#include "worker/transport/ring_allreduce.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/shard_range.h"
#include "common/status_macros.h"

namespace tandem::worker {
namespace {

int Mod(int a, int r) { return ((a % r) + r) % r; }

// The tag of piece `piece` of ring step `step` (0 .. 2R - 3) of reduction `id`.
uint64_t PieceTag(uint32_t id, int step, size_t piece) {
  // micro-batch field: step in the high 12 bits, piece in the low 20 (pieces wrap; both ends
  // post them in the same order, and a tag's messages arrive in order).
  const uint32_t field =
      (static_cast<uint32_t>(step) << 20) | static_cast<uint32_t>(piece & 0xFFFFFu);
  return MakeTransferTag(Payload::kGradReduce, static_cast<int>(id & 0xFFFFFFu),
                         static_cast<int>(field));
}

// The ring's phases over data[0, count): `reduce` runs the R - 1 reduce-scatter steps (tags
// 0 .. R - 2), `gather` the R - 1 all-gather steps (tags R - 1 .. 2R - 3).
absl::Status RunRing(Transport& transport, float* data, size_t count, std::vector<float>* scratch,
                     const RingAllReduceOptions& options, bool reduce, bool gather) {
  const int ranks = transport.size();
  if (ranks <= 1 || count == 0) return absl::OkStatus();
  if (data == nullptr) return absl::InvalidArgumentError("collective on a null buffer");
  if (ranks > 2048) {
    return absl::InvalidArgumentError(
        absl::StrCat("collective over ", ranks, " ranks (at most 2048)"));
  }
  const int me = transport.rank();
  const int right = Mod(me + 1, ranks);
  const int left = Mod(me - 1, ranks);
  const size_t piece = std::max<size_t>(1, options.piece_bytes / sizeof(float));
  if (reduce) {
    const size_t largest = SegmentOf(count, ranks, 0).size();
    if (scratch->size() < largest) scratch->resize(largest);
  }

  // One step: send segment `out` to the right; receive segment `in` from the left, into the
  // scratch (reduce-scatter, then added) or in place (all-gather).
  auto step = [&](int s, int out, int in, bool add) -> absl::Status {
    const ElementRange out_seg = SegmentOf(count, ranks, out);
    const ElementRange in_seg = SegmentOf(count, ranks, in);
    float* dst = add ? scratch->data() : data + in_seg.begin;
    const size_t in_n = in_seg.size();
    const size_t pieces = (in_n + piece - 1) / piece;
    const std::string where = absl::StrCat(add ? "reduce-scatter" : "all-gather", " step ",
                                           s < ranks - 1 ? s : s - (ranks - 1), " (", count,
                                           " floats, ", ranks, " ranks)");
    // Receives first, so that every piece has its buffer when it arrives.
    for (size_t p = 0; p < pieces; ++p) {
      const size_t b = p * piece;
      const size_t n = std::min(piece, in_n - b);
      RETURN_IF_ERROR(WithPrefix(
          transport.PostRecv(left, PieceTag(options.id, s, p), dst + b, n * sizeof(float)), where));
    }
    const size_t out_n = out_seg.size();
    for (size_t p = 0, b = 0; b < out_n; ++p, b += piece) {
      const size_t n = std::min(piece, out_n - b);
      RETURN_IF_ERROR(WithPrefix(transport.PostSend(right, PieceTag(options.id, s, p),
                                                    data + out_seg.begin + b, n * sizeof(float)),
                                 where));
    }
    for (size_t p = 0; p < pieces; ++p) {
      RETURN_IF_ERROR(WithPrefix(transport.WaitRecv(left, PieceTag(options.id, s, p)), where));
      if (!add) continue;
      const size_t b = p * piece;
      const size_t n = std::min(piece, in_n - b);
      float* acc = data + in_seg.begin + b;
      const float* got = scratch->data() + b;
      for (size_t i = 0; i < n; ++i) acc[i] += got[i];
    }
    // The segment sent may be written by a later step (all-gather receives in place).
    return WithPrefix(transport.WaitSends(), where);
  };

  if (reduce) {
    for (int s = 0; s < ranks - 1; ++s) {
      RETURN_IF_ERROR(step(s, Mod(me - s, ranks), Mod(me - s - 1, ranks), /*add=*/true));
    }
  }
  if (gather) {
    for (int s = 0; s < ranks - 1; ++s) {
      RETURN_IF_ERROR(
          step(ranks - 1 + s, Mod(me + 1 - s, ranks), Mod(me - s, ranks), /*add=*/false));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status RingAllReduce(Transport& transport, float* data, size_t count,
                           std::vector<float>& scratch, const RingAllReduceOptions& options) {
  return RunRing(transport, data, count, &scratch, options, /*reduce=*/true, /*gather=*/true);
}

absl::Status RingReduceScatter(Transport& transport, float* data, size_t count,
                               std::vector<float>& scratch, const RingAllReduceOptions& options) {
  return RunRing(transport, data, count, &scratch, options, /*reduce=*/true, /*gather=*/false);
}

absl::Status RingAllGather(Transport& transport, float* data, size_t count,
                           const RingAllReduceOptions& options) {
  return RunRing(transport, data, count, nullptr, options, /*reduce=*/false, /*gather=*/true);
}

}  // namespace tandem::worker
