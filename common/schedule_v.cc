// The controllable-memory V schedules (Qi et al., "Pipeline Parallelism with Controllable
// Memory", 2024): V-Min and V-Half, two chunks per rank on VShapePlacement with the backward
// split into I and W, at about a third (for large P) and about a half of 1F1B's peak
// activation memory.
//
// Both are built from a unit-cost timeline (F = I = W = 1 per chunk, no transfer time) and emit
// each rank's actions in the order of that timeline. A timeline in which every action starts
// after its inputs are done shows that the ranks' orders and the data dependencies together
// have no cycle, so the lists cannot deadlock, whatever the real costs. The peak live
// activations of a rank depend only on its order (F adds one, W frees one), so the peaks in
// schedule.h hold whatever the costs; the bubbles there are the unit-cost ones.
//
// Terms: chunk 0 of rank r is stage r (going down the V), chunk 1 is stage 2P-1-r (coming back
// up); one micro-batch's work on a rank is six unit actions, F I W on each chunk.
#include <algorithm>
#include <array>
#include <cstdint>
#include <deque>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/schedule.h"
#include "common/status_macros.h"

namespace tandem {
namespace {

// The six actions of one micro-batch on a rank: a rank repeating them every kPeriod units is
// never idle.
constexpr int kPeriod = 6;

int VRankOf(int num_ranks, int stage) {
  return stage < num_ranks ? stage : 2 * num_ranks - 1 - stage;
}

Schedule MakeVSchedule(absl::string_view name, int num_ranks, int num_micro_batches) {
  Schedule s;
  s.name = std::string(name);
  s.placement = VShapePlacement(num_ranks);
  s.program.resize(num_ranks);
  s.num_micro_batches = num_micro_batches;
  return s;
}

// V-Min's building block: the unit-time start of micro-batch 0's F, I and W on every stage,
// the six actions of each rank on six different residues modulo kPeriod, so that the block
// repeated every kPeriod units (micro-batch m shifted by m kPeriod) never puts two actions of a
// rank at one time. Each action takes the earliest time its inputs allow whose residue is free
// on its rank: the forward goes straight down and up the V, the input gradient straight back,
// and each W as soon after its I as a residue is free (the two W's of a rank in the order that
// keeps their total wait smallest). With P not a multiple of 3 no action ever waits for a
// residue except the W's; the lifespans (F to W) of a rank's two chunks then add up to 4P + 4
// plus the W's waits.
struct VBlock {
  std::vector<int> f, i, w;  // per stage
};

VBlock MinimalLifespanBlock(int num_ranks) {
  const int P = num_ranks, S = 2 * P;
  std::vector<std::array<bool, kPeriod>> used(P, std::array<bool, kPeriod>{});
  auto first_free = [&](int rank, int t) {
    while (used[rank][t % kPeriod]) ++t;
    return t;
  };
  auto take = [&](int stage, int t) {
    const int rank = VRankOf(P, stage);
    t = first_free(rank, t);
    used[rank][t % kPeriod] = true;
    return t;
  };
  VBlock b{std::vector<int>(S), std::vector<int>(S), std::vector<int>(S)};
  for (int s = 0; s < S; ++s) b.f[s] = take(s, s == 0 ? 0 : b.f[s - 1] + 1);
  for (int s = S - 1; s >= 0; --s) b.i[s] = take(s, s == S - 1 ? b.f[s] + 1 : b.i[s + 1] + 1);
  for (int r = 0; r < P; ++r) {
    const int chunk_stage[2] = {r, S - 1 - r};
    int best_wait = -1;
    std::array<int, 2> best_w{};
    for (int first : {0, 1}) {
      std::array<bool, kPeriod> u = used[r];
      std::array<int, 2> w{};
      int wait = 0;
      for (int c : {first, 1 - first}) {
        const int s = chunk_stage[c];
        int t = b.i[s] + 1;
        while (u[t % kPeriod]) ++t;
        u[t % kPeriod] = true;
        w[c] = t;
        wait += t - b.i[s] - 1;
      }
      if (best_wait < 0 || wait < best_wait) {
        best_wait = wait;
        best_w = w;
      }
    }
    for (int c : {0, 1}) b.w[chunk_stage[c]] = take(chunk_stage[c], best_w[c]);
  }
  return b;
}

}  // namespace

absl::StatusOr<Schedule> GenerateVMin(int num_ranks, int num_micro_batches) {
  RETURN_IF_ERROR(WithPrefix(CheckScheduleSizes(num_ranks, num_micro_batches), "v_min"));
  const int P = num_ranks, M = num_micro_batches;
  Schedule out = MakeVSchedule("v_min", P, M);
  const VBlock b = MinimalLifespanBlock(P);
  // Every action of micro-batch m at its block time + m kPeriod, then each rank's in time
  // order (the residues make the times of one rank distinct).
  std::vector<std::vector<std::pair<int, Action>>> timed(P);
  for (int m = 0; m < M; ++m) {
    for (int s = 0; s < 2 * P; ++s) {
      auto& list = timed[VRankOf(P, s)];
      list.push_back({b.f[s] + m * kPeriod, Action{s, v1::ACTION_F, m}});
      list.push_back({b.i[s] + m * kPeriod, Action{s, v1::ACTION_I, m}});
      list.push_back({b.w[s] + m * kPeriod, Action{s, v1::ACTION_W, m}});
    }
  }
  for (int r = 0; r < P; ++r) {
    std::sort(timed[r].begin(), timed[r].end(),
              [](const auto& a, const auto& b) { return a.first < b.first; });
    for (const auto& [time, action] : timed[r]) out.program[r].push_back(action);
  }
  return out;
}

absl::StatusOr<Schedule> GenerateVHalf(int num_ranks, int num_micro_batches) {
  RETURN_IF_ERROR(WithPrefix(CheckScheduleSizes(num_ranks, num_micro_batches), "v_half"));
  const int P = num_ranks, M = num_micro_batches, S = 2 * P;
  // Unit-time list scheduling. ends_*[s][m]: when the action ends (-1 while it has not run).
  std::vector<std::vector<int>> ends_f(S, std::vector<int>(M, -1));
  std::vector<std::vector<int>> ends_i(S, std::vector<int>(M, -1));
  struct RankState {
    int stage[2];
    // (P/2 + 1) micro-batches of a whole stage, the paper's V-Half memory: P + 2 chunk
    // activations, split between the chunks by the lengths of their round trips (chunk 1's is
    // the shorter: from stage 2P-1-r up to the loss and back is 2r + 1 stages).
    int limit[2];
    int next_f[2] = {0, 0};
    int next_i[2] = {0, 0};
    int live[2] = {0, 0};          // activations between F and W, per chunk
    std::deque<Action> pending_w;  // the W of every I run, oldest first
  };
  std::vector<RankState> ranks(P);
  for (int r = 0; r < P; ++r) {
    RankState& k = ranks[r];
    k.stage[0] = r;
    k.stage[1] = S - 1 - r;
    k.limit[1] = (r + 1) / 2 + 1;
    k.limit[0] = P + 2 - k.limit[1];
  }
  auto ended = [](int end, int now) { return end >= 0 && end <= now; };
  Schedule out = MakeVSchedule("v_half", P, M);
  const int64_t total = int64_t{6} * P * M;
  int64_t issued = 0;
  std::vector<Action> chosen(P);
  std::vector<bool> has(P);
  for (int now = 0; issued < total; ++now) {
    for (int r = 0; r < P; ++r) {
      RankState& k = ranks[r];
      has[r] = true;
      // 1. The ready input gradient of the oldest micro-batch (chunk 1 on a tie).
      int best = -1;
      for (int c : {1, 0}) {
        const int s = k.stage[c], m = k.next_i[c];
        if (m >= M || !ended(ends_f[s][m], now)) continue;
        if (s + 1 < S && !ended(ends_i[s + 1][m], now)) continue;
        if (best < 0 || m < k.next_i[best]) best = c;
      }
      if (best >= 0) {
        chosen[r] = {k.stage[best], v1::ACTION_I, k.next_i[best]};
        continue;
      }
      // 2. A ready forward within its chunk's limit, chunk 1 first.
      const int m1 = k.next_f[1], m0 = k.next_f[0];
      if (m1 < M && ended(ends_f[k.stage[1] - 1][m1], now) && k.live[1] < k.limit[1]) {
        chosen[r] = {k.stage[1], v1::ACTION_F, m1};
        continue;
      }
      if (m0 < M && (r == 0 || ended(ends_f[r - 1][m0], now)) && k.live[0] < k.limit[0]) {
        chosen[r] = {k.stage[0], v1::ACTION_F, m0};
        continue;
      }
      // 3. The oldest deferred weight gradient, filling the gap (and freeing memory).
      if (!k.pending_w.empty()) {
        chosen[r] = k.pending_w.front();
        continue;
      }
      has[r] = false;
    }
    bool any = false;
    for (int r = 0; r < P; ++r) {
      if (!has[r]) continue;
      any = true;
      RankState& k = ranks[r];
      const Action& a = chosen[r];
      const int c = a.stage == r ? 0 : 1;
      out.program[r].push_back(a);
      ++issued;
      if (a.kind == v1::ACTION_F) {
        ends_f[a.stage][a.micro_batch] = now + 1;
        ++k.next_f[c];
        ++k.live[c];
      } else if (a.kind == v1::ACTION_I) {
        ends_i[a.stage][a.micro_batch] = now + 1;
        ++k.next_i[c];
        k.pending_w.push_back({a.stage, v1::ACTION_W, a.micro_batch});
      } else {
        k.pending_w.pop_front();
        --k.live[c];
      }
    }
    if (!any) {
      // Unreachable (see schedule.h: the oldest unfinished micro-batch can always move); a
      // step with nothing to run would repeat forever.
      return absl::InternalError(
          absl::StrCat("v_half: construction stalled at time ", now, " for P=", P, ", M=", M));
    }
  }
  return out;
}

}  // namespace tandem
