// DualPipeV: DeepSeek's DualPipe (DeepSeek-V3 technical report, 2024) cut in half into a V
// (Sea AI Lab's "cut-in-half"), in the per-rank order torch.distributed.pipelining's
// ScheduleDualPipeV gives (torch 2.15; the test compares the two for several (P, M)).
//
// Each rank r holds two chunks on VShapePlacement: chunk 0 = stage r on the way down, chunk 1 =
// stage 2P-1-r on the way back up; micro-batches enter at rank 0's chunk 0 and leave (with the
// loss) at rank 0's chunk 1. The steady state pairs the forward of one chunk with the full
// backward of the other (an overlapped pair, Action::overlap_with_next): their compute and their
// transfers are independent, so a device running them together hides one's communication
// under the other's compute. Warm-up and cool-down fill their gaps with the backward split into
// I and W, the W's running later, oldest first.
#include <deque>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/schedule.h"

namespace tandem {
namespace {

// One rank's list. Counters per chunk: the next micro-batch of its forward and of its backward
// (B or I); W's take the oldest pending I, of either chunk.
class DualPipeVRank {
 public:
  DualPipeVRank(int rank, int num_ranks) : stage_{rank, 2 * num_ranks - 1 - rank} {}

  void F(int chunk) { out_.push_back({stage_[chunk], v1::ACTION_F, forward_[chunk]++}); }
  // The backward of `chunk`: a full B, or an I whose W is queued when `split`.
  void Backward(int chunk, bool split) {
    const Action a{stage_[chunk], split ? v1::ACTION_I : v1::ACTION_B, backward_[chunk]++};
    out_.push_back(a);
    if (split) pending_weights_.push_back({a.stage, v1::ACTION_W, a.micro_batch});
  }
  // The weight gradient of the oldest pending I, if any.
  void W() {
    if (pending_weights_.empty()) return;
    out_.push_back(pending_weights_.front());
    pending_weights_.pop_front();
  }
  // The forward of `forward_chunk` overlapped with the full backward of the other chunk.
  void Pair(int forward_chunk) {
    F(forward_chunk);
    out_.back().overlap_with_next = true;
    Backward(1 - forward_chunk, /*split=*/false);
  }

  std::vector<Action> Take() { return std::move(out_); }

 private:
  const int stage_[2];
  int forward_[2] = {0, 0};
  int backward_[2] = {0, 0};
  std::deque<Action> pending_weights_;
  std::vector<Action> out_;
};

std::vector<Action> DualPipeVActions(int r, int P, int M) {
  DualPipeVRank k(r, P);
  // 1. Chunk 0 runs ahead by 2(P-r-1) micro-batches: the deeper the rank, the less.
  for (int i = 0; i < 2 * (P - r - 1); ++i) k.F(0);
  // 2. Both chunks, alternately, until the first gradient reaches chunk 1 ...
  for (int i = 0; i < r + 1; ++i) {
    k.F(0);
    k.F(1);
  }
  // 3. ... then chunk 1's backward split (its W's fill the wait for the next gradient).
  for (int i = 0; i < P - r - 1; ++i) {
    k.Backward(1, /*split=*/true);
    k.W();
    k.F(1);
  }
  // 4. Steady state: two overlapped pairs per round, F0 with B1 and F1 with B0. The last rank
  // runs its first F0 and B1 as two plain actions (torch's generator does so "to further
  // reduce bubble size").
  for (int i = 0; i < M - 2 * P + r + 1; ++i) {
    if (i == 0 && r == P - 1) {
      k.F(0);
      k.Backward(1, /*split=*/false);
    } else {
      k.Pair(0);
    }
    k.Pair(1);
  }
  // 5. Chunk 0's forwards are done: chunk 1's backward, then chunk 1's forward with B0.
  for (int i = 0; i < P - r - 1; ++i) {
    k.Backward(1, /*split=*/false);
    k.Pair(1);
  }
  // 6. Both backwards, alternately; from half-way on they split into I (W deferred), chunk 1
  // switching first on odd ranks and chunk 0 first on even ones.
  bool split = false;
  for (int i = 0; i < r + 1; ++i) {
    if (i == (r + 1) / 2 && r % 2 == 1) split = true;
    k.Backward(1, split);
    if (i == (r + 1) / 2 && r % 2 == 0) split = true;
    k.Backward(0, split);
  }
  // 7. Chunk 0's last backwards, a deferred W before each, ...
  for (int i = 0; i < P - r - 1; ++i) {
    k.W();
    k.Backward(0, split);
  }
  // 8. ... and the W's still pending.
  for (int i = 0; i < r + 1; ++i) k.W();
  return k.Take();
}

}  // namespace

absl::StatusOr<Schedule> GenerateDualPipeV(int num_ranks, int num_micro_batches) {
  const int P = num_ranks, M = num_micro_batches;
  if (P < 1) {
    return absl::InvalidArgumentError(absl::StrCat("number of ranks must be at least 1, got ", P));
  }
  if (M < 2 * P) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dualpipe_v needs at least as many micro-batches as stages (M >= 2P, two stages per "
        "rank, as torch's ScheduleDualPipeV requires); got M=",
        M, ", P=", P, ". Raise pipeline.micro_batches to at least ", 2 * P,
        " or use schedule: zb_v"));
  }
  Schedule out;
  out.name = "dualpipe_v";
  out.placement = VShapePlacement(P);
  out.num_micro_batches = M;
  for (int r = 0; r < P; ++r) out.program.push_back(DualPipeVActions(r, P, M));
  return out;
}

}  // namespace tandem
