#include "worker/transport/ring_allreduce.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace tandem::worker {
namespace {

// Segment i of R over `count` elements: [begin, end), the first count % R one longer.
std::pair<size_t, size_t> Segment(size_t count, int ranks, int i) {
  const size_t base = count / static_cast<size_t>(ranks);
  const size_t extra = count % static_cast<size_t>(ranks);
  const size_t idx = static_cast<size_t>(i);
  const size_t begin = idx * base + std::min(idx, extra);
  return {begin, begin + base + (idx < extra ? 1 : 0)};
}

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

}  // namespace

absl::Status RingAllReduce(Transport& transport, float* data, size_t count,
                           std::vector<float>& scratch, const RingAllReduceOptions& options) {
  const int ranks = transport.size();
  if (ranks <= 1 || count == 0) return absl::OkStatus();
  if (data == nullptr) return absl::InvalidArgumentError("all-reduce of a null buffer");
  if (ranks > 2048) {
    return absl::InvalidArgumentError(
        absl::StrCat("all-reduce over ", ranks, " ranks (at most 2048)"));
  }
  const int me = transport.rank();
  const int right = Mod(me + 1, ranks);
  const int left = Mod(me - 1, ranks);
  const size_t piece = std::max<size_t>(1, options.piece_bytes / sizeof(float));
  const size_t largest = Segment(count, ranks, 0).second;
  if (scratch.size() < largest) scratch.resize(largest);

  // One step: send segment `out` to the right; receive segment `in` from the left, into the
  // scratch (reduce-scatter, then added) or in place (all-gather).
  auto step = [&](int s, int out, int in, bool add) -> absl::Status {
    const auto [out_begin, out_end] = Segment(count, ranks, out);
    const auto [in_begin, in_end] = Segment(count, ranks, in);
    float* dst = add ? scratch.data() : data + in_begin;
    const size_t in_n = in_end - in_begin;
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
    const size_t out_n = out_end - out_begin;
    for (size_t p = 0, b = 0; b < out_n; ++p, b += piece) {
      const size_t n = std::min(piece, out_n - b);
      RETURN_IF_ERROR(WithPrefix(transport.PostSend(right, PieceTag(options.id, s, p),
                                                    data + out_begin + b, n * sizeof(float)),
                                 where));
    }
    for (size_t p = 0; p < pieces; ++p) {
      RETURN_IF_ERROR(WithPrefix(transport.WaitRecv(left, PieceTag(options.id, s, p)), where));
      if (!add) continue;
      const size_t b = p * piece;
      const size_t n = std::min(piece, in_n - b);
      float* acc = data + in_begin + b;
      const float* got = scratch.data() + b;
      for (size_t i = 0; i < n; ++i) acc[i] += got[i];
    }
    // The segment sent may be written by a later step (all-gather receives in place).
    return WithPrefix(transport.WaitSends(), where);
  };

  for (int s = 0; s < ranks - 1; ++s) {
    RETURN_IF_ERROR(step(s, Mod(me - s, ranks), Mod(me - s - 1, ranks), /*add=*/true));
  }
  for (int s = 0; s < ranks - 1; ++s) {
    RETURN_IF_ERROR(step(ranks - 1 + s, Mod(me + 1 - s, ranks), Mod(me - s, ranks), /*add=*/false));
  }
  return absl::OkStatus();
}

}  // namespace tandem::worker
