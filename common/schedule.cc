#include "common/schedule.h"

#include <algorithm>
#include <cctype>
#include <cstddef>
#include <map>
#include <set>
#include <tuple>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "common/schedule_auto.h"
#include "common/status_macros.h"

namespace tandem {
namespace {

struct KindName {
  ActionKind kind;
  const char* name;
};
// Longest names first so that parsing "SEND_F" is not mistaken for "F"-prefixed text.
constexpr KindName kKindNames[] = {
    {v1::ACTION_REDUCE_GRAD, "REDUCE_GRAD"},
    {v1::ACTION_SEND_F, "SEND_F"},
    {v1::ACTION_RECV_F, "RECV_F"},
    {v1::ACTION_SEND_B, "SEND_B"},
    {v1::ACTION_RECV_B, "RECV_B"},
    {v1::ACTION_F, "F"},
    {v1::ACTION_B, "B"},
    {v1::ACTION_I, "I"},
    {v1::ACTION_W, "W"},
    {v1::ACTION_R, "R"},  // after RECV_* and REDUCE_GRAD, which also start with R
};

// M >= P, as 1F1B and the schedules derived from it need to fill the pipeline.
absl::Status CheckEnoughMicroBatches(absl::string_view schedule, int num_ranks,
                                     int num_micro_batches) {
  if (num_micro_batches >= num_ranks) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      schedule, " needs at least as many micro-batches as pipeline ranks (M >= P); got M=",
      num_micro_batches, ", P=", num_ranks, ". Raise pipeline.micro_batches to at least ",
      num_ranks, " or use schedule: gpipe"));
}

Schedule MakeSchedule(absl::string_view name, Placement placement, int num_micro_batches) {
  Schedule s;
  s.name = std::string(name);
  s.program.resize(placement.num_ranks);
  s.placement = std::move(placement);
  s.num_micro_batches = num_micro_batches;
  return s;
}

// Interleaved 1F1B's k-th forward (backward when `backward`) of `rank`: micro-batches in
// groups of P per chunk, chunks ascending for forwards and descending for backwards.
Action InterleavedAction(int k, int rank, int num_ranks, int chunks, bool backward) {
  const int group = (k / num_ranks) % chunks;
  const int chunk = backward ? chunks - 1 - group : group;
  const int micro_batch = (k / (num_ranks * chunks)) * num_ranks + k % num_ranks;
  return {chunk * num_ranks + rank, backward ? v1::ACTION_B : v1::ACTION_F, micro_batch};
}

// ZB-V on one rank over `n` >= 2P - 1 micro-batches (the caller drops those >= M). Chunk 0 is
// stage r (going down the V), chunk 1 stage 2P - 1 - r (coming back up); counters per chunk.
std::vector<Action> ZBVRank(int rank, int num_ranks, int n) {
  const int P = num_ranks;
  const int stage[2] = {rank, 2 * P - 1 - rank};
  int f[2] = {0, 0}, i[2] = {0, 0}, w[2] = {0, 0};
  std::vector<Action> out;
  auto F = [&](int c) { out.push_back({stage[c], v1::ACTION_F, f[c]++}); };
  auto I = [&](int c) { out.push_back({stage[c], v1::ACTION_I, i[c]++}); };
  auto W = [&](int c) { out.push_back({stage[c], v1::ACTION_W, w[c]++}); };
  // Warm-up: fill the V. Chunk 0 runs ahead by 2(P - r) - 1 micro-batches, then the two chunks
  // alternate until chunk 1's first backward can start...
  for (int k = 0; k < 2 * (P - rank) - 1; ++k) F(0);
  for (int k = 0; k < rank; ++k) {
    F(1);
    F(0);
  }
  // ... then chunk 1 runs F I W, its W done at once (the memory stays at 2P chunk activations).
  for (int k = 0; k < P - rank; ++k) {
    F(1);
    I(1);
    W(1);
  }
  // Steady state: F I W on chunk 0, then on chunk 1; chunk 0 runs out of forwards first.
  while (f[0] < n || f[1] < f[0]) {
    if (f[0] < n) F(0);
    I(0);
    W(0);
    F(1);
    I(1);
    W(1);
  }
  // Cool-down: the remaining input gradients first (they are on the critical path), the
  // deferred W's filling the time the gradients take to come back.
  for (int k = 0; k < rank; ++k) {
    I(0);
    I(1);
  }
  for (int k = 0; k < P - rank; ++k) {
    I(0);
    W(0);
  }
  while (w[1] < i[1]) W(1);
  while (w[0] < i[0]) W(0);
  return out;
}

std::string NormalizedName(absl::string_view schedule) {
  std::string name = absl::AsciiStrToLower(absl::StripAsciiWhitespace(schedule));
  absl::StrReplaceAll({{"-", "_"}}, &name);
  if (name == "interleaved") return "interleaved_1f1b";
  if (name == "zbh1") return "zb_h1";
  if (name == "zbh2") return "zb_h2";
  if (name == "zbv") return "zb_v";
  if (name == "dualpipev") return "dualpipe_v";
  if (name == "vhalf") return "v_half";
  if (name == "vmin") return "v_min";
  if (name == "zbauto") return "zb_auto";
  return name;
}

// Whether stage + delta (delta = +1 or -1) exists and lives on another rank than `stage`, so
// that data between the two needs a transfer.
bool NeighbourIsRemote(const Placement& placement, int stage, int delta) {
  const int other = stage + delta;
  if (stage < 0 || stage >= placement.num_stages()) return false;
  if (other < 0 || other >= placement.num_stages()) return false;
  return placement.rank_of_stage[other] != placement.rank_of_stage[stage];
}

constexpr absl::string_view kOverlapSuffix = "OVERLAP_F_B";

// The cells of torch's compute_comms CSV that are runtime bookkeeping Tandem does its own way
// (see ScheduleFromCsv): "<stage><kind>[<micro-batch>]" with one of these kinds.
bool IsTorchRuntimeCell(absl::string_view cell) {
  size_t i = 0;
  while (i < cell.size() && std::isdigit(static_cast<unsigned char>(cell[i]))) ++i;
  if (i == 0) return false;
  absl::string_view rest = cell.substr(i);
  // Checked before ParseAction, which would read WAIT_SEND_F0 as a malformed W.
  for (absl::string_view kind :
       {"UNSHARD", "RESHARD", "WAIT_SEND_F", "WAIT_SEND_B", "WAIT_REDUCE_GRAD", "REDUCE_GRAD"}) {
    if (!absl::StartsWith(rest, kind)) continue;
    absl::string_view mb = rest.substr(kind.size());
    return std::all_of(mb.begin(), mb.end(),
                       [](char c) { return std::isdigit(static_cast<unsigned char>(c)); });
  }
  return false;
}

// torch posts a receive where its CSV writes it (as early as its lowering could) and waits
// for it just before the compute that consumes it; Tandem's RECV is that wait (its worker posts
// receives ahead by itself). So each receive moves to just before its consumer, the F (RECV_F)
// or the B or I (RECV_B) of its stage and micro-batch, or before the overlapped pair holding
// it. A receive with no later consumer stays where it is, for the validator to judge.
std::vector<Action> ReceivesAtTheirConsumers(const std::vector<Action>& list) {
  std::map<std::tuple<int, int, int>, size_t> consumer;  // (stage, receive kind, mb) -> index
  for (size_t i = 0; i < list.size(); ++i) {
    const Action& a = list[i];
    if (a.kind == v1::ACTION_F)
      consumer.emplace(std::tuple(a.stage, v1::ACTION_RECV_F, a.micro_batch), i);
    if (a.kind == v1::ACTION_B || a.kind == v1::ACTION_I) {
      consumer.emplace(std::tuple(a.stage, v1::ACTION_RECV_B, a.micro_batch), i);
    }
  }
  std::vector<std::vector<size_t>> before(list.size());  // receives to put before each action
  std::vector<bool> moved(list.size(), false);
  for (size_t i = 0; i < list.size(); ++i) {
    const Action& a = list[i];
    if (a.kind != v1::ACTION_RECV_F && a.kind != v1::ACTION_RECV_B) continue;
    auto it = consumer.find(std::tuple(a.stage, a.kind, a.micro_batch));
    if (it == consumer.end()) continue;
    size_t at = it->second;
    if (at > 0 && StartsOverlappedPair(list, at - 1)) --at;  // before the whole pair
    if (at <= i) continue;
    before[at].push_back(i);
    moved[i] = true;
  }
  std::vector<Action> out;
  out.reserve(list.size());
  for (size_t i = 0; i < list.size(); ++i) {
    for (size_t k : before[i]) out.push_back(list[k]);
    if (!moved[i]) out.push_back(list[i]);
  }
  return out;
}

}  // namespace

bool OverlapPartners(const Action& first, const Action& second) {
  return first.kind == v1::ACTION_F &&
         (second.kind == v1::ACTION_B || second.kind == v1::ACTION_I) &&
         first.stage != second.stage;
}

const char* ActionKindName(ActionKind kind) {
  for (const auto& k : kKindNames) {
    if (k.kind == kind) return k.name;
  }
  return "?";
}

bool IsComputeAction(ActionKind kind) {
  return kind == v1::ACTION_F || kind == v1::ACTION_B || kind == v1::ACTION_I ||
         kind == v1::ACTION_W || kind == v1::ACTION_R;
}

bool IsTransferAction(ActionKind kind) {
  return kind == v1::ACTION_SEND_F || kind == v1::ACTION_RECV_F || kind == v1::ACTION_SEND_B ||
         kind == v1::ACTION_RECV_B;
}

bool IsReductionAction(ActionKind kind) { return kind == v1::ACTION_REDUCE_GRAD; }

std::vector<int> Placement::StagesOf(int rank) const {
  std::vector<int> stages;
  for (int s = 0; s < num_stages(); ++s) {
    if (rank_of_stage[s] == rank) stages.push_back(s);
  }
  return stages;
}

Placement OneStagePerRank(int num_ranks) { return InterleavedPlacement(num_ranks, 1); }

Placement InterleavedPlacement(int num_ranks, int chunks) {
  Placement p;
  p.num_ranks = num_ranks;
  for (int s = 0; s < num_ranks * chunks; ++s) p.rank_of_stage.push_back(s % num_ranks);
  return p;
}

Placement VShapePlacement(int num_ranks) {
  Placement p;
  p.num_ranks = num_ranks;
  for (int s = 0; s < 2 * num_ranks; ++s) {
    p.rank_of_stage.push_back(s < num_ranks ? s : 2 * num_ranks - 1 - s);
  }
  return p;
}

absl::Status ValidatePlacement(const Placement& placement) {
  if (placement.num_ranks < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("placement: number of ranks must be at least 1, got ", placement.num_ranks));
  }
  if (placement.num_stages() < 1) {
    return absl::InvalidArgumentError("placement: no stages");
  }
  std::vector<int> held(placement.num_ranks, 0);
  for (int s = 0; s < placement.num_stages(); ++s) {
    const int r = placement.rank_of_stage[s];
    if (r < 0 || r >= placement.num_ranks) {
      return absl::InvalidArgumentError(absl::StrCat("placement: stage ", s, " is on rank ", r,
                                                     ", outside [0, ", placement.num_ranks, ")"));
    }
    ++held[r];
  }
  for (int r = 0; r < placement.num_ranks; ++r) {
    if (held[r] == 0) {
      return absl::InvalidArgumentError(absl::StrCat("placement: rank ", r, " holds no stage"));
    }
  }
  return absl::OkStatus();
}

std::string ActionToString(const Action& a) {
  if (IsReductionAction(a.kind)) return absl::StrCat(a.stage, ActionKindName(a.kind));
  return absl::StrCat(a.stage, ActionKindName(a.kind), a.micro_batch);
}

absl::StatusOr<Action> ParseAction(absl::string_view text) {
  absl::string_view s = absl::StripAsciiWhitespace(text);
  size_t i = 0;
  while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) ++i;
  Action a;
  if (i == 0 || !absl::SimpleAtoi(s.substr(0, i), &a.stage)) {
    return absl::InvalidArgumentError(
        absl::StrCat("action '", s, "': expected <stage><kind><micro_batch>, e.g. 2F0"));
  }
  absl::string_view rest = s.substr(i);
  for (const auto& k : kKindNames) {
    absl::string_view name(k.name);
    if (rest.substr(0, name.size()) == name) {
      absl::string_view mb = rest.substr(name.size());
      if (IsReductionAction(k.kind)) {
        // A whole stage's reduction: no micro-batch.
        if (!mb.empty()) {
          return absl::InvalidArgumentError(absl::StrCat(
              "action '", s, "': REDUCE_GRAD takes no micro-batch (e.g. 2REDUCE_GRAD)"));
        }
        a.kind = k.kind;
        return a;
      }
      if (mb.empty() ||
          !std::all_of(mb.begin(), mb.end(),
                       [](char c) { return std::isdigit(static_cast<unsigned char>(c)); }) ||
          !absl::SimpleAtoi(mb, &a.micro_batch)) {
        return absl::InvalidArgumentError(
            absl::StrCat("action '", s, "': expected a micro-batch number after ", name));
      }
      a.kind = k.kind;
      return a;
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "action '", s,
      "': unknown kind; expected F, B, I, W, R, SEND_F, RECV_F, SEND_B, RECV_B or REDUCE_GRAD"));
}

bool StartsOverlappedPair(const std::vector<Action>& actions, size_t i) {
  return i + 1 < actions.size() && actions[i].overlap_with_next &&
         OverlapPartners(actions[i], actions[i + 1]);
}

std::vector<std::string> ActionCells(const std::vector<Action>& actions) {
  std::vector<std::string> cells;
  cells.reserve(actions.size());
  for (size_t i = 0; i < actions.size(); ++i) {
    if (StartsOverlappedPair(actions, i)) {
      cells.push_back(absl::StrCat("(", ActionToString(actions[i]), ";",
                                   ActionToString(actions[i + 1]), ")", kOverlapSuffix));
      ++i;
    } else {
      cells.push_back(ActionToString(actions[i]));
    }
  }
  return cells;
}

absl::StatusOr<std::vector<Action>> ParseActionCell(absl::string_view text) {
  absl::string_view s = absl::StripAsciiWhitespace(text);
  if (!absl::StartsWith(s, "(")) {
    ASSIGN_OR_RETURN(Action a, ParseAction(s));
    return std::vector<Action>{a};
  }
  const size_t close = s.find(')');
  std::vector<absl::string_view> parts;
  if (close != absl::string_view::npos) parts = absl::StrSplit(s.substr(1, close - 1), ';');
  if (close == absl::string_view::npos || s.substr(close + 1) != kOverlapSuffix ||
      parts.size() != 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "action '", s, "': expected an overlapped pair (<F>;<B or I>)OVERLAP_F_B, e.g. ",
        "(0F7;7B3)OVERLAP_F_B"));
  }
  std::vector<Action> pair;
  for (absl::string_view part : parts) {
    ASSIGN_OR_RETURN(Action a, ParseAction(part));
    pair.push_back(a);
  }
  if (!OverlapPartners(pair[0], pair[1])) {
    return absl::InvalidArgumentError(
        absl::StrCat("action '", s,
                     "': an overlapped pair is the forward (F) of one stage followed by the "
                     "backward (B or I) of another"));
  }
  pair[0].overlap_with_next = true;
  return pair;
}

std::string ActionsToString(const std::vector<Action>& actions) {
  return absl::StrJoin(ActionCells(actions), " ");
}

absl::StatusOr<Schedule> GenerateGPipe(int num_ranks, int num_micro_batches) {
  RETURN_IF_ERROR(CheckScheduleSizes(num_ranks, num_micro_batches));
  Schedule out = MakeSchedule("gpipe", OneStagePerRank(num_ranks), num_micro_batches);
  for (int r = 0; r < num_ranks; ++r) {
    auto& list = out.program[r];
    for (int m = 0; m < num_micro_batches; ++m) list.push_back({r, v1::ACTION_F, m});
    for (int m = num_micro_batches - 1; m >= 0; --m) list.push_back({r, v1::ACTION_B, m});
  }
  return out;
}

absl::StatusOr<Schedule> Generate1F1B(int num_ranks, int num_micro_batches) {
  RETURN_IF_ERROR(CheckScheduleSizes(num_ranks, num_micro_batches));
  RETURN_IF_ERROR(CheckEnoughMicroBatches("1f1b", num_ranks, num_micro_batches));
  const int M = num_micro_batches;
  Schedule out = MakeSchedule("1f1b", OneStagePerRank(num_ranks), M);
  for (int r = 0; r < num_ranks; ++r) {
    auto& list = out.program[r];
    const int warmup = std::min(num_ranks - r - 1, M);
    int next_f = 0;
    int next_b = 0;
    for (; next_f < warmup; ++next_f) list.push_back({r, v1::ACTION_F, next_f});
    // Steady state: one forward, then one backward.
    while (next_f < M) {
      list.push_back({r, v1::ACTION_F, next_f++});
      list.push_back({r, v1::ACTION_B, next_b++});
    }
    // Cool-down: drain the backwards of the warm-up forwards.
    while (next_b < M) list.push_back({r, v1::ACTION_B, next_b++});
  }
  return out;
}

absl::StatusOr<Schedule> GenerateInterleaved1F1B(int num_ranks, int chunks, int num_micro_batches) {
  RETURN_IF_ERROR(CheckScheduleSizes(num_ranks, num_micro_batches));
  const int P = num_ranks, v = chunks, M = num_micro_batches;
  if (v < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("interleaved_1f1b needs at least 2 chunks per rank; got ", v,
                     ". Set pipeline.chunks to 2 or more, or use schedule: 1f1b for one chunk"));
  }
  RETURN_IF_ERROR(CheckEnoughMicroBatches("interleaved_1f1b", P, M));
  if (M % P != 0) {
    const int lower = M / P * P;
    return absl::InvalidArgumentError(absl::StrCat(
        "interleaved_1f1b needs the micro-batches to be a multiple of the pipeline ranks (M % P "
        "== 0, micro-batches go through the chunks in groups of P); got M=",
        M, ", P=", P, ". Use pipeline.micro_batches ", lower, " or ", lower + P));
  }
  Schedule out = MakeSchedule("interleaved_1f1b", InterleavedPlacement(P, v), M);
  const int total = v * M;  // forwards (and backwards) per rank
  for (int r = 0; r < P; ++r) {
    auto& list = out.program[r];
    const int warmup = std::min(2 * (P - r - 1) + (v - 1) * P, total);
    int next_f = 0, next_b = 0;
    for (; next_f < warmup; ++next_f) list.push_back(InterleavedAction(next_f, r, P, v, false));
    while (next_f < total) {
      list.push_back(InterleavedAction(next_f++, r, P, v, false));
      list.push_back(InterleavedAction(next_b++, r, P, v, true));
    }
    while (next_b < total) list.push_back(InterleavedAction(next_b++, r, P, v, true));
  }
  return out;
}

absl::StatusOr<Schedule> GenerateLoopedBFS(int num_ranks, int chunks, int num_micro_batches) {
  RETURN_IF_ERROR(CheckScheduleSizes(num_ranks, num_micro_batches));
  const int P = num_ranks, v = chunks, M = num_micro_batches;
  if (v < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("looped_bfs needs at least 1 chunk per rank; got ", v));
  }
  Schedule out = MakeSchedule("looped_bfs", InterleavedPlacement(P, v), M);
  for (int r = 0; r < P; ++r) {
    auto& list = out.program[r];
    for (int c = 0; c < v; ++c) {
      for (int m = 0; m < M; ++m) list.push_back({c * P + r, v1::ACTION_F, m});
    }
    for (int c = v - 1; c >= 0; --c) {
      for (int m = M - 1; m >= 0; --m) list.push_back({c * P + r, v1::ACTION_B, m});
    }
  }
  return out;
}

absl::StatusOr<Schedule> GenerateInterleavedZeroBubble(int num_ranks, int chunks,
                                                       int num_micro_batches) {
  RETURN_IF_ERROR(CheckScheduleSizes(num_ranks, num_micro_batches));
  const int P = num_ranks, v = chunks, M = num_micro_batches;
  if (v < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("interleaved_zb needs at least 2 chunks per rank; got ", v,
                     ". Set pipeline.chunks to 2 or more, or use schedule: zb_h1 for one chunk"));
  }
  RETURN_IF_ERROR(CheckEnoughMicroBatches("interleaved_zb", P, M));
  // Micro-batches go through the chunks in rounds of n (n = P when M is a multiple of P).
  const int rounds = std::max(1, M / P);
  if (M % rounds != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "interleaved_zb needs the micro-batches to be a multiple of the number of rounds (M % "
        "max(1, M / P) == 0, micro-batches go through the chunks in rounds of equal size); got "
        "M=",
        M, ", P=", P, " (", rounds, " rounds). Use a multiple of ", P,
        " for pipeline.micro_batches"));
  }
  const int n = M / rounds;
  Schedule out = MakeSchedule("interleaved_zb", InterleavedPlacement(P, v), M);
  const int total = v * M;  // forwards (and I's, and W's) per rank
  for (int r = 0; r < P; ++r) {
    auto& list = out.program[r];
    const int warmup = std::min((v - 1) * n + P - 1 - r, total);
    std::vector<int> next_f(v, 0), next_i(v, 0), next_w(v, 0);  // per chunk
    std::vector<int> input_chunks;  // the chunk of each I, in order: W's follow the same order
    int forwards = 0, weights = 0;
    auto forward = [&] {
      const int c = (forwards++ / n) % v;
      list.push_back({c * P + r, v1::ACTION_F, next_f[c]++});
    };
    auto weight = [&] {
      const int c = input_chunks[weights++];
      list.push_back({c * P + r, v1::ACTION_W, next_w[c]++});
    };
    // The j-th I, then (from the r-th on) the W of the oldest pending I.
    auto input_then_weight = [&] {
      const int j = static_cast<int>(input_chunks.size());
      const int c = v - 1 - (j / n) % v;
      input_chunks.push_back(c);
      list.push_back({c * P + r, v1::ACTION_I, next_i[c]++});
      if (j >= r) weight();
    };
    while (forwards < warmup) forward();
    while (forwards < total) {
      forward();
      input_then_weight();
    }
    while (static_cast<int>(input_chunks.size()) < total) input_then_weight();
    while (weights < total) weight();
  }
  return out;
}

absl::StatusOr<Schedule> GenerateZBH1(int num_ranks, int num_micro_batches) {
  RETURN_IF_ERROR(CheckScheduleSizes(num_ranks, num_micro_batches));
  RETURN_IF_ERROR(CheckEnoughMicroBatches("zb_h1", num_ranks, num_micro_batches));
  const int P = num_ranks, M = num_micro_batches;
  Schedule out = MakeSchedule("zb_h1", OneStagePerRank(P), M);
  for (int r = 0; r < P; ++r) {
    auto& list = out.program[r];
    int next_f = 0, next_i = 0, next_w = 0;
    // An I, then the oldest W's while more than r are pending: rank r defers r W's.
    auto input_then_weights = [&] {
      list.push_back({r, v1::ACTION_I, next_i++});
      while (next_i - next_w > r) list.push_back({r, v1::ACTION_W, next_w++});
    };
    for (; next_f < P - r - 1; ++next_f) list.push_back({r, v1::ACTION_F, next_f});
    while (next_f < M) {
      list.push_back({r, v1::ACTION_F, next_f++});
      input_then_weights();
    }
    while (next_i < M) input_then_weights();
    while (next_w < M) list.push_back({r, v1::ACTION_W, next_w++});
  }
  return out;
}

absl::StatusOr<Schedule> GenerateZBH2(int num_ranks, int num_micro_batches) {
  RETURN_IF_ERROR(CheckScheduleSizes(num_ranks, num_micro_batches));
  RETURN_IF_ERROR(CheckEnoughMicroBatches("zb_h2", num_ranks, num_micro_batches));
  const int P = num_ranks, M = num_micro_batches;
  Schedule out = MakeSchedule("zb_h2", OneStagePerRank(P), M);
  for (int r = 0; r < P; ++r) {
    auto& list = out.program[r];
    int next_f = 0, next_i = 0, next_w = 0;
    // The oldest W's while more than 2r are pending: rank r defers 2r W's, which fill the
    // time its last input gradients take to come back.
    auto weights = [&] {
      while (next_i - next_w > 2 * r) list.push_back({r, v1::ACTION_W, next_w++});
    };
    for (; next_f < std::min(2 * (P - r) - 1, M); ++next_f) {
      list.push_back({r, v1::ACTION_F, next_f});
    }
    while (next_f < M) {  // steady: I F W
      list.push_back({r, v1::ACTION_I, next_i++});
      list.push_back({r, v1::ACTION_F, next_f++});
      weights();
    }
    while (next_i < M) {  // cool-down: I W
      list.push_back({r, v1::ACTION_I, next_i++});
      weights();
    }
    while (next_w < M) list.push_back({r, v1::ACTION_W, next_w++});
  }
  return out;
}

absl::StatusOr<Schedule> GenerateZBV(int num_ranks, int num_micro_batches) {
  RETURN_IF_ERROR(CheckScheduleSizes(num_ranks, num_micro_batches));
  RETURN_IF_ERROR(CheckEnoughMicroBatches("zb_v", num_ranks, num_micro_batches));
  const int P = num_ranks, M = num_micro_batches;
  Schedule out = MakeSchedule("zb_v", VShapePlacement(P), M);
  // The phases need 2P - 1 micro-batches to fill the V; with fewer, the schedule for 2P - 1 is
  // built and the micro-batches that do not exist are dropped from every rank (removing a whole
  // micro-batch keeps every dependency of the others, so the order stays deadlock-free).
  const int n = std::max(M, 2 * P - 1);
  for (int r = 0; r < P; ++r) {
    for (const Action& a : ZBVRank(r, P, n)) {
      if (a.micro_batch < M) out.program[r].push_back(a);
    }
  }
  return out;
}

absl::StatusOr<Schedule> GenerateForwardOnly(const Placement& placement, int num_micro_batches) {
  RETURN_IF_ERROR(ValidatePlacement(placement));
  RETURN_IF_ERROR(CheckScheduleSizes(placement.num_ranks, num_micro_batches));
  Schedule out = MakeSchedule("forward_only", placement, num_micro_batches);
  for (int r = 0; r < placement.num_ranks; ++r) {
    for (int stage : placement.StagesOf(r)) {
      for (int m = 0; m < num_micro_batches; ++m) {
        out.program[r].push_back({stage, v1::ACTION_F, m});
      }
    }
  }
  return out;
}

absl::Status CheckScheduleSizes(int num_ranks, int num_micro_batches) {
  if (num_ranks < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("number of ranks must be at least 1, got ", num_ranks));
  }
  if (num_micro_batches < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("number of micro-batches must be at least 1, got ", num_micro_batches));
  }
  return absl::OkStatus();
}

std::vector<std::string> ScheduleNames() {
  return {"gpipe", "1f1b", "interleaved_1f1b", "zb_h1", "zb_v"};
}

std::vector<std::string> AllScheduleNames() {
  std::vector<std::string> names = ScheduleNames();
  for (const char* name :
       {"looped_bfs", "interleaved_zb", "zb_h2", "dualpipe_v", "v_half", "v_min", "zb_auto"}) {
    names.push_back(name);
  }
  return names;
}

bool TakesChunks(absl::string_view schedule) {
  const std::string name = NormalizedName(schedule);
  return name == "interleaved_1f1b" || name == "looped_bfs" || name == "interleaved_zb";
}

int DefaultChunks(absl::string_view schedule) {
  const std::string name = NormalizedName(schedule);
  return TakesChunks(name) || name == "zb_v" || name == "dualpipe_v" || name == "v_half" ||
                 name == "v_min"
             ? 2
             : 1;
}

absl::StatusOr<Schedule> GenerateSchedule(absl::string_view schedule, int num_ranks,
                                          int num_micro_batches, int chunks) {
  const std::string name = NormalizedName(schedule);
  const std::vector<std::string> names = AllScheduleNames();
  if (std::find(names.begin(), names.end(), name) == names.end()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "unknown schedule '", schedule, "'; expected one of ", absl::StrJoin(names, ", "),
        " (or interleaved, zbh1, zbh2, zbv, dualpipev, vhalf, vmin, zbauto)"));
  }
  if (chunks < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunks per rank must be 0 (the schedule's default) or more, got ", chunks));
  }
  const int v = chunks == 0 ? DefaultChunks(name) : chunks;
  if (name == "interleaved_1f1b") return GenerateInterleaved1F1B(num_ranks, v, num_micro_batches);
  if (name == "looped_bfs") return GenerateLoopedBFS(num_ranks, v, num_micro_batches);
  if (name == "interleaved_zb") {
    return GenerateInterleavedZeroBubble(num_ranks, v, num_micro_batches);
  }
  if (v != DefaultChunks(name)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "schedule ", name, " runs ", DefaultChunks(name), " chunk",
        DefaultChunks(name) == 1 ? "" : "s", " per rank; got chunks=", chunks,
        ". Leave pipeline.chunks at 0 or ", DefaultChunks(name),
        DefaultChunks(name) == 2 ? "" : ", or use schedule: interleaved_1f1b for more"));
  }
  if (name == "gpipe") return GenerateGPipe(num_ranks, num_micro_batches);
  if (name == "1f1b") return Generate1F1B(num_ranks, num_micro_batches);
  if (name == "zb_h1") return GenerateZBH1(num_ranks, num_micro_batches);
  if (name == "zb_h2") return GenerateZBH2(num_ranks, num_micro_batches);
  if (name == "dualpipe_v") return GenerateDualPipeV(num_ranks, num_micro_batches);
  if (name == "v_half") return GenerateVHalf(num_ranks, num_micro_batches);
  if (name == "v_min") return GenerateVMin(num_ranks, num_micro_batches);
  if (name == "zb_auto") {
    // Without a profile: equal stages (F = I = W), free links, 1F1B's memory (P live
    // micro-batches per worker). PlanPipeline rebuilds it from the measured costs.
    ActionCosts unit;
    unit.forward = unit.backward_input = unit.backward_weight = 1.0;
    unit.backward = 2.0;
    return GenerateZBAuto(
        num_ranks, num_micro_batches,
        std::vector<ActionCosts>(static_cast<size_t>(std::max(num_ranks, 0)), unit),
        std::vector<int>(static_cast<size_t>(std::max(num_ranks, 0)), num_ranks));
  }
  return GenerateZBV(num_ranks, num_micro_batches);
}

Program LowerWithTransfers(const Program& compute, const Placement& placement) {
  Program lowered(compute.size());
  for (size_t r = 0; r < compute.size(); ++r) {
    // The transfers this rank's list already has: kept where they are, never added twice.
    std::set<std::tuple<int, int, int>> present;
    for (const Action& a : compute[r]) {
      if (IsTransferAction(a.kind)) present.insert({a.stage, a.kind, a.micro_batch});
    }
    auto& out = lowered[r];
    auto add_missing = [&](const Action& a) {
      if (!present.count({a.stage, a.kind, a.micro_batch})) out.push_back(a);
    };
    auto receives = [&](const Action& a) {
      const int s = a.stage, m = a.micro_batch;
      if (a.kind == v1::ACTION_F && NeighbourIsRemote(placement, s, -1)) {
        add_missing({s, v1::ACTION_RECV_F, m});
      }
      if ((a.kind == v1::ACTION_B || a.kind == v1::ACTION_I) &&
          NeighbourIsRemote(placement, s, +1) && !present.count({s, v1::ACTION_RECV_B, m})) {
        // Before an R right in front of the backward too, which stays adjacent to it (an R
        // there runs inside the backward: RecomputeAtBackward).
        const Action recv{s, v1::ACTION_RECV_B, m};
        if (!out.empty() && out.back() == Action{s, v1::ACTION_R, m}) {
          out.insert(out.end() - 1, recv);
        } else {
          out.push_back(recv);
        }
      }
    };
    auto sends = [&](const Action& a) {
      const int s = a.stage, m = a.micro_batch;
      if (a.kind == v1::ACTION_F && NeighbourIsRemote(placement, s, +1)) {
        add_missing({s, v1::ACTION_SEND_F, m});
      }
      if ((a.kind == v1::ACTION_B || a.kind == v1::ACTION_I) &&
          NeighbourIsRemote(placement, s, -1)) {
        add_missing({s, v1::ACTION_SEND_B, m});
      }
    };
    const std::vector<Action>& list = compute[r];
    for (size_t i = 0; i < list.size(); ++i) {
      // An overlapped pair is bracketed as one unit: both receives, the pair, both sends.
      const size_t n = StartsOverlappedPair(list, i) ? 2 : 1;
      for (size_t k = i; k < i + n; ++k) receives(list[k]);
      for (size_t k = i; k < i + n; ++k) out.push_back(list[k]);
      for (size_t k = i; k < i + n; ++k) sends(list[k]);
      i += n - 1;
    }
  }
  return lowered;
}

Schedule LowerWithTransfers(const Schedule& compute) {
  Schedule out = compute;
  out.program = LowerWithTransfers(compute.program, compute.placement);
  return out;
}

Program AddRecomputation(const Program& program, const std::vector<bool>& stages) {
  auto recomputes = [&](int stage) {
    return stages.empty() || (stage >= 0 && static_cast<size_t>(stage) < stages.size() &&
                              stages[static_cast<size_t>(stage)]);
  };
  Program out(program.size());
  for (size_t r = 0; r < program.size(); ++r) {
    const std::vector<Action>& list = program[r];
    // The (stage, micro-batch) pairs that already have an R: kept where they are.
    std::set<std::pair<int, int>> present;
    for (const Action& a : list) {
      if (a.kind == v1::ACTION_R) present.insert({a.stage, a.micro_batch});
    }
    std::vector<Action>& dst = out[r];
    dst.reserve(list.size() * 3 / 2);
    for (const Action& a : list) {
      const bool backward = a.kind == v1::ACTION_B || a.kind == v1::ACTION_I;
      if (backward && recomputes(a.stage) && present.insert({a.stage, a.micro_batch}).second) {
        // Right before the backward, after the receive of its output gradient: the backward
        // recomputes layer by layer (RecomputeAtBackward). A backward that is the second half
        // of an overlapped pair gets its R before the pair, which stays together.
        size_t at = dst.size();
        if (at > 0 && dst[at - 1].overlap_with_next) --at;
        dst.insert(dst.begin() + static_cast<std::ptrdiff_t>(at),
                   Action{a.stage, v1::ACTION_R, a.micro_batch});
      }
      dst.push_back(a);
    }
  }
  return out;
}

Schedule AddRecomputation(const Schedule& schedule, const std::vector<bool>& stages) {
  Schedule out = schedule;
  out.program = AddRecomputation(schedule.program, stages);
  return out;
}

std::vector<bool> RecomputeAtBackward(const std::vector<Action>& actions) {
  std::vector<bool> out(actions.size(), false);
  for (size_t i = 0; i < actions.size(); ++i) {
    if (actions[i].kind != v1::ACTION_R) continue;
    if (i + 1 < actions.size()) {
      const Action& next = actions[i + 1];
      out[i] = (next.kind == v1::ACTION_B || next.kind == v1::ACTION_I) &&
               next.stage == actions[i].stage && next.micro_batch == actions[i].micro_batch;
    }
  }
  return out;
}

Program AddGradReductions(const Program& lowered, const Placement& placement) {
  Program out = lowered;
  for (size_t r = 0; r < out.size(); ++r) {
    std::vector<Action>& list = out[r];
    for (int stage : placement.StagesOf(static_cast<int>(r))) {
      if (std::any_of(list.begin(), list.end(), [&](const Action& a) {
            return a.stage == stage && IsReductionAction(a.kind);
          })) {
        continue;  // already there: kept where it is
      }
      // After the stage's last weight gradient (B, or W when split) and the sends that follow
      // it, so that the previous stage's gradient leaves first.
      size_t at = list.size();
      for (size_t i = 0; i < list.size(); ++i) {
        const Action& a = list[i];
        if (a.stage == stage && (a.kind == v1::ACTION_B || a.kind == v1::ACTION_W)) at = i + 1;
      }
      while (at < list.size() && list[at].stage == stage &&
             (list[at].kind == v1::ACTION_SEND_B || list[at].kind == v1::ACTION_SEND_F)) {
        ++at;
      }
      list.insert(list.begin() + static_cast<std::ptrdiff_t>(at),
                  Action{stage, v1::ACTION_REDUCE_GRAD, 0});
    }
  }
  return out;
}

Schedule AddGradReductions(const Schedule& lowered) {
  Schedule out = lowered;
  out.program = AddGradReductions(lowered.program, lowered.placement);
  return out;
}

Schedule ReplicatedSchedule(const Schedule& lowered, int replicas) {
  if (replicas <= 1) return lowered;
  const int S = lowered.placement.num_stages();
  const int P = lowered.placement.num_ranks;
  Schedule out;
  out.name = lowered.name;
  out.num_micro_batches = lowered.num_micro_batches;
  out.placement.num_ranks = P * replicas;
  for (int r = 0; r < replicas; ++r) {
    for (int s = 0; s < S; ++s)
      out.placement.rank_of_stage.push_back(r * P + lowered.placement.rank_of_stage[s]);
    for (int p = 0; p < P; ++p) {
      std::vector<Action>& list = out.program.emplace_back(lowered.program[p]);
      for (Action& a : list) a.stage += r * S;
    }
  }
  return out;
}

TransferMessage MessageOf(const Action& a) {
  switch (a.kind) {
    case v1::ACTION_SEND_F:
      return {v1::ACTION_SEND_F, a.stage, a.stage + 1, a.micro_batch};
    case v1::ACTION_RECV_F:
      return {v1::ACTION_SEND_F, a.stage - 1, a.stage, a.micro_batch};
    case v1::ACTION_SEND_B:
      return {v1::ACTION_SEND_B, a.stage, a.stage - 1, a.micro_batch};
    case v1::ACTION_RECV_B:
      return {v1::ACTION_SEND_B, a.stage + 1, a.stage, a.micro_batch};
    default:
      return {v1::ACTION_F, a.stage, a.stage, a.micro_batch};
  }
}

std::string ProgramToCsv(const Program& program) {
  std::string out;
  for (const auto& rank : program)
    absl::StrAppend(&out, absl::StrJoin(ActionCells(rank), ","), "\n");
  return out;
}

absl::StatusOr<Schedule> ScheduleFromCsv(absl::string_view csv, int num_ranks,
                                         int num_micro_batches) {
  RETURN_IF_ERROR(CheckScheduleSizes(num_ranks, num_micro_batches));
  Schedule out;
  out.name = "csv";
  out.num_micro_batches = num_micro_batches;
  std::map<int, int> rank_of_stage;  // a map: a stray huge stage number allocates nothing
  bool has_transfers = false;
  int row = 0;
  for (absl::string_view line : absl::StrSplit(csv, '\n')) {
    line = absl::StripAsciiWhitespace(line);
    if (line.empty()) continue;
    ++row;
    out.program.emplace_back();
    int col = 0;
    for (absl::string_view cell : absl::StrSplit(line, ',')) {
      ++col;
      cell = absl::StripAsciiWhitespace(cell);
      if (cell.empty()) continue;              // trailing commas, padded rows
      if (IsTorchRuntimeCell(cell)) continue;  // torch's FSDP, send-wait and reduction cells
      const std::string where = absl::StrCat("schedule CSV row ", row, " column ", col, ": ");
      absl::StatusOr<std::vector<Action>> actions = ParseActionCell(cell);
      if (!actions.ok()) {
        return absl::InvalidArgumentError(absl::StrCat(where, actions.status().message()));
      }
      for (const Action& a : *actions) {
        if (a.micro_batch >= num_micro_batches) {
          return absl::InvalidArgumentError(absl::StrCat(
              where, "action ", cell, " names micro-batch ", a.micro_batch, ", but the step has ",
              num_micro_batches, " (0..", num_micro_batches - 1, ")"));
        }
        const int rank = rank_of_stage.try_emplace(a.stage, row - 1).first->second;
        if (rank != row - 1) {
          return absl::InvalidArgumentError(absl::StrCat(
              where, "action ", cell, " belongs to stage ", a.stage, ", whose actions are on row ",
              rank + 1, " (rank ", rank, "); a stage runs on one rank"));
        }
        has_transfers = has_transfers || IsTransferAction(a.kind);
        out.program.back().push_back(a);
      }
    }
  }
  if (row != num_ranks) {
    return absl::InvalidArgumentError(
        absl::StrCat("schedule CSV has ", row, " rows, expected one per rank: ", num_ranks));
  }
  out.placement.num_ranks = num_ranks;
  for (const auto& [stage, rank] : rank_of_stage) {
    const int expected = out.placement.num_stages();
    if (stage != expected) {
      return absl::InvalidArgumentError(
          absl::StrCat("schedule CSV names stages up to ", rank_of_stage.rbegin()->first,
                       " but stage ", expected, " has no actions; stages must be numbered 0..S-1"));
    }
    out.placement.rank_of_stage.push_back(rank);
  }
  if (absl::Status s = ValidatePlacement(out.placement); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("schedule CSV: ", s.message()));
  }
  if (!has_transfers) {
    out.program = LowerWithTransfers(out.program, out.placement);
  } else {
    for (std::vector<Action>& list : out.program) list = ReceivesAtTheirConsumers(list);
  }
  return out;
}

double IdealBubbleFraction(int num_ranks, int num_micro_batches, int chunks) {
  return static_cast<double>(num_ranks - 1) /
         (static_cast<double>(chunks) * num_micro_batches + num_ranks - 1);
}

v1::Action ToProto(const Action& a) {
  v1::Action p;
  p.set_stage(a.stage);
  p.set_kind(a.kind);
  p.set_micro_batch(a.micro_batch);
  p.set_overlap_with_next(a.overlap_with_next);
  return p;
}

Action FromProto(const v1::Action& a) {
  return Action{a.stage(), a.kind(), a.micro_batch(), a.overlap_with_next()};
}

}  // namespace tandem
