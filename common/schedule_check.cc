#include "common/schedule_check.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <deque>
#include <limits>
#include <map>
#include <set>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"

namespace tandem {
namespace {

constexpr size_t kNoMark = std::numeric_limits<size_t>::max();

// The per-rank grid, one line per rank, with action marks[r] of rank r in [brackets]
// (kNoMark: none; the list's size: "[end]").
std::string Grid(const Program& p, const std::vector<size_t>& marks) {
  std::string out;
  for (size_t r = 0; r < p.size(); ++r) {
    const size_t mark = r < marks.size() ? marks[r] : kNoMark;
    absl::StrAppend(&out, "\n  rank ", r, ":");
    for (size_t i = 0; i < p[r].size(); ++i) {
      const std::string a = ActionToString(p[r][i]);
      absl::StrAppend(&out, " ", i == mark ? absl::StrCat("[", a, "]") : a);
    }
    if (mark == p[r].size()) absl::StrAppend(&out, " [end]");
  }
  return out;
}

std::string Describe(const Program& p, int rank, size_t index) {
  return absl::StrCat("rank ", rank, " action ", index, " (",
                      index < p[rank].size() ? ActionToString(p[rank][index]) : std::string("end"),
                      ")");
}

// INVALID_ARGUMENT naming action `index` of `rank` (its size: the end of the list).
absl::Status Bad(const Program& p, int rank, size_t index, absl::string_view what) {
  std::vector<size_t> marks(p.size(), kNoMark);
  marks[rank] = index;
  return absl::InvalidArgumentError(
      absl::StrCat("invalid schedule: ", Describe(p, rank, index), ": ", what, Grid(p, marks)));
}

// A message: (payload SEND_F or SEND_B, destination stage, micro-batch).
using Key = std::tuple<int, int, int>;

Key MessageKey(const Action& a) {
  const TransferMessage m = MessageOf(a);
  return {m.payload, m.to_stage, m.micro_batch};
}

// What the validator knows about one (stage, micro-batch).
struct Progress {
  bool f = false, b = false, i = false, w = false;  // seen in the rank's list (static pass)
  bool r = false;                                   // its R (recompute) seen (static pass)
  bool forward_done = false;                        // F ran (blocking pass)
  bool backward_done = false;                       // B or I ran
  bool input_received = false;                      // RECV_F ran
  bool gradient_received = false;                   // RECV_B ran
};

class Validator {
 public:
  Validator(const Program& p, const Placement& placement, int num_micro_batches)
      : p_(p), placement_(placement), S_(placement.num_stages()), M_(num_micro_batches) {}

  absl::Status Run() {
    if (absl::Status s = ValidatePlacement(placement_); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("invalid schedule: ", s.message()));
    }
    if (M_ < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("invalid schedule: number of micro-batches must be at least 1, got ", M_));
    }
    if (static_cast<int>(p_.size()) != placement_.num_ranks) {
      return absl::InvalidArgumentError(absl::StrCat(
          "invalid schedule: ", p_.size(), " rank lists for ", placement_.num_ranks, " ranks"));
    }
    progress_.assign(static_cast<size_t>(S_) * M_, Progress{});
    reduced_.assign(static_cast<size_t>(S_), false);
    for (int r = 0; r < placement_.num_ranks; ++r) {
      RETURN_IF_ERROR(CheckRankStatically(r));
    }
    // Reductions all or none: a replica whose stage skipped its reduction would step apart.
    const int reduced = static_cast<int>(std::count(reduced_.begin(), reduced_.end(), true));
    if (reduced > 0 && reduced < S_) {
      for (int s = 0; s < S_; ++s) {
        if (reduced_[s]) continue;
        const int r = placement_.rank_of_stage[s];
        return Bad(p_, r, p_[r].size(),
                   absl::StrCat("stage ", s, " has no REDUCE_GRAD, but ", reduced,
                                " other stage(s) do: a data-parallel program reduces every stage"));
      }
    }
    return RunBlocking();
  }

 private:
  Progress& At(int stage, int m) { return progress_[static_cast<size_t>(stage) * M_ + m]; }
  bool SameRank(int stage, int other) const {
    return other >= 0 && other < S_ &&
           placement_.rank_of_stage[stage] == placement_.rank_of_stage[other];
  }

  // Ranges, placement, transfer ends, and the order and count of compute per (stage, mb).
  absl::Status CheckRankStatically(int r) {
    const auto& list = p_[r];
    for (size_t i = 0; i < list.size(); ++i) {
      const Action& a = list[i];
      if (a.stage < 0 || a.stage >= S_) {
        return Bad(p_, r, i, absl::StrCat("stage ", a.stage, " does not exist (", S_, " stages)"));
      }
      if (placement_.rank_of_stage[a.stage] != r) {
        return Bad(p_, r, i,
                   absl::StrCat("stage ", a.stage, " is placed on rank ",
                                placement_.rank_of_stage[a.stage], ", not on rank ", r));
      }
      if (a.micro_batch < 0 || a.micro_batch >= M_) {
        return Bad(p_, r, i,
                   absl::StrCat("micro-batch ", a.micro_batch, " out of range [0, ", M_, ")"));
      }
      if (a.overlap_with_next && !StartsOverlappedPair(list, i)) {
        return Bad(p_, r, i,
                   "an overlapped pair (overlap_with_next) is an F followed directly by the B or "
                   "I of another stage, with no action between them");
      }
      if (IsReductionAction(a.kind)) {
        RETURN_IF_ERROR(CheckReduction(r, i));
        continue;
      }
      RETURN_IF_ERROR(IsComputeAction(a.kind) ? CheckComputeOrder(r, i) : CheckTransferEnds(r, i));
    }
    for (int stage : placement_.StagesOf(r)) {
      for (int m = 0; m < M_; ++m) {
        const Progress& g = At(stage, m);
        const std::string what = absl::StrCat("stage ", stage, ", micro-batch ", m, " has ");
        if (!g.f) return Bad(p_, r, list.size(), absl::StrCat(what, "no forward"));
        if (!g.b && !g.i) return Bad(p_, r, list.size(), absl::StrCat(what, "no backward"));
        if (g.i && !g.w) return Bad(p_, r, list.size(), absl::StrCat(what, "an I but no W"));
      }
    }
    return absl::OkStatus();
  }

  // REDUCE_GRAD of a stage: once, after every weight gradient of the stage (B, or W when
  // split) for every micro-batch, since the reduction sums the finished gradients.
  absl::Status CheckReduction(int r, size_t i) {
    const Action& a = p_[r][i];
    if (a.micro_batch != 0) return Bad(p_, r, i, "REDUCE_GRAD takes no micro-batch");
    if (reduced_[a.stage]) return Bad(p_, r, i, "repeated REDUCE_GRAD");
    reduced_[a.stage] = true;
    for (int m = 0; m < M_; ++m) {
      const Progress& g = At(a.stage, m);
      if (!g.b && !g.w) {
        return Bad(p_, r, i,
                   absl::StrCat("REDUCE_GRAD of stage ", a.stage,
                                " before its last weight "
                                "gradient (micro-batch ",
                                m, " has no B or W before it)"));
      }
    }
    return absl::OkStatus();
  }

  absl::Status CheckComputeOrder(int r, size_t i) {
    const Action& a = p_[r][i];
    Progress& g = At(a.stage, a.micro_batch);
    const std::string both =
        absl::StrCat("both B and I/W for micro-batch ", a.micro_batch, " of stage ", a.stage);
    switch (a.kind) {
      case v1::ACTION_F:
        if (g.f) return Bad(p_, r, i, "repeated forward");
        g.f = true;
        break;
      case v1::ACTION_B:
        if (!g.f) return Bad(p_, r, i, "backward before its forward");
        if (g.i || g.w) return Bad(p_, r, i, both);
        if (g.b) return Bad(p_, r, i, "repeated backward");
        g.b = true;
        break;
      case v1::ACTION_R:
        // The recomputation re-runs the forward from the input the F kept, for the backward.
        if (!g.f) return Bad(p_, r, i, "recompute (R) before its forward");
        if (g.b || g.i) return Bad(p_, r, i, "recompute (R) after its backward");
        if (g.r) return Bad(p_, r, i, "repeated R");
        g.r = true;
        break;
      case v1::ACTION_I:
        if (!g.f) return Bad(p_, r, i, "backward (I) before its forward");
        if (g.b) return Bad(p_, r, i, both);
        if (g.i) return Bad(p_, r, i, "repeated I");
        g.i = true;
        break;
      default:  // W
        if (g.b) return Bad(p_, r, i, both);
        if (!g.i)
          return Bad(p_, r, i,
                     "W before its I (the weight gradient needs the input "
                     "gradient's backward first)");
        if (g.w) return Bad(p_, r, i, "repeated W");
        g.w = true;
        break;
    }
    return absl::OkStatus();
  }

  // A transfer must have a neighbour to talk to, on another rank.
  absl::Status CheckTransferEnds(int r, size_t i) {
    const Action& a = p_[r][i];
    int other;
    switch (a.kind) {
      case v1::ACTION_SEND_F:
      case v1::ACTION_RECV_B:
        other = a.stage + 1;
        if (other >= S_) return Bad(p_, r, i, "the last stage has no next stage");
        break;
      case v1::ACTION_RECV_F:
      case v1::ACTION_SEND_B:
        other = a.stage - 1;
        if (other < 0) return Bad(p_, r, i, "the first stage has no previous stage");
        break;
      default:
        return Bad(p_, r, i, "unknown action kind");
    }
    if (SameRank(a.stage, other)) {
      return Bad(p_, r, i,
                 absl::StrCat("a transfer between stages ", std::min(a.stage, other), " and ",
                              std::max(a.stage, other), ", which are both on rank ", r,
                              " (a hand-off within one rank is local, not a transfer)"));
    }
    return absl::OkStatus();
  }

  // Runs the blocking semantics: a send is posted at once, a receive waits for its send, a
  // compute action needs its input (received, produced earlier on this rank, or none at the
  // pipeline's ends).
  absl::Status RunBlocking() {
    const int P = placement_.num_ranks;
    std::vector<size_t> pc(P, 0);
    std::map<Key, std::deque<std::pair<int, size_t>>> posted;  // sends not yet received
    for (bool moved = true; moved;) {
      moved = false;
      for (int r = 0; r < P; ++r) {
        for (; pc[r] < p_[r].size(); ++pc[r], moved = true) {
          ASSIGN_OR_RETURN(bool ran, Step(r, pc[r], posted));
          if (!ran) break;  // blocked in a receive
        }
      }
    }
    std::vector<size_t> blocked(P, kNoMark);
    std::vector<std::string> waits;
    int first = -1;
    for (int r = 0; r < P; ++r) {
      if (pc[r] == p_[r].size()) continue;
      blocked[r] = pc[r];
      waits.push_back(Describe(p_, r, pc[r]));
      if (first < 0) first = r;
    }
    if (first >= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("invalid schedule: deadlock: ", absl::StrJoin(waits, ", "),
                       waits.size() == 1 ? " waits" : " wait",
                       " in a receive whose send is never posted", Grid(p_, blocked)));
    }
    for (const auto& [key, sends] : posted) {
      if (sends.empty()) continue;
      const auto [rank, index] = sends.front();
      const int to = std::get<1>(key);
      return Bad(p_, rank, index,
                 absl::StrCat("this send is never received by stage ", to, " (rank ",
                              placement_.rank_of_stage[to], ")"));
    }
    return absl::OkStatus();
  }

  // Executes action `i` of rank `r`; false when it blocks.
  absl::StatusOr<bool> Step(int r, size_t i,
                            std::map<Key, std::deque<std::pair<int, size_t>>>& posted) {
    const Action& a = p_[r][i];
    Progress& g = At(a.stage, a.micro_batch);
    switch (a.kind) {
      case v1::ACTION_SEND_F:
        if (!g.forward_done) return Bad(p_, r, i, "sends an activation not computed yet");
        posted[MessageKey(a)].push_back({r, i});
        return true;
      case v1::ACTION_SEND_B:
        if (!g.backward_done) return Bad(p_, r, i, "sends a gradient not computed yet");
        posted[MessageKey(a)].push_back({r, i});
        return true;
      case v1::ACTION_RECV_F:
      case v1::ACTION_RECV_B: {
        auto it = posted.find(MessageKey(a));
        if (it == posted.end() || it->second.empty()) return false;
        it->second.pop_front();
        (a.kind == v1::ACTION_RECV_F ? g.input_received : g.gradient_received) = true;
        return true;
      }
      case v1::ACTION_F: {
        const int prev = a.stage - 1;
        const bool ready =
            prev < 0 ||
            (SameRank(a.stage, prev) ? At(prev, a.micro_batch).forward_done : g.input_received);
        if (!ready) return Bad(p_, r, i, "forward before its input arrives");
        g.forward_done = true;
        return true;
      }
      case v1::ACTION_B:
      case v1::ACTION_I: {
        const int next = a.stage + 1;
        const bool ready =
            next >= S_ ||
            (SameRank(a.stage, next) ? At(next, a.micro_batch).backward_done : g.gradient_received);
        if (!ready) return Bad(p_, r, i, "backward before its gradient arrives");
        g.backward_done = true;
        return true;
      }
      default:        // W: its I ran earlier on this rank; R: its F did; REDUCE_GRAD: its
        return true;  // gradients are done (all checked statically)
    }
  }

  const Program& p_;
  const Placement& placement_;
  const int S_;
  const int M_;
  std::vector<Progress> progress_;  // S x M
  std::vector<bool> reduced_;       // per stage: its REDUCE_GRAD was seen
};

double ComputeCost(const ActionCosts& c, ActionKind kind) {
  switch (kind) {
    case v1::ACTION_F:
      return c.forward;
    case v1::ACTION_R:
      return c.recompute >= 0 ? c.recompute : c.forward;
    case v1::ACTION_B:
      return c.backward;
    case v1::ACTION_I:
      return c.backward_input;
    case v1::ACTION_W:
      return c.backward_weight;
    default:
      return 0.0;
  }
}

}  // namespace

absl::Status ValidateProgram(const Program& lowered, const Placement& placement,
                             int num_micro_batches) {
  return Validator(lowered, placement, num_micro_batches).Run();
}

absl::Status ValidateSchedule(const Schedule& lowered) {
  return ValidateProgram(lowered.program, lowered.placement, lowered.num_micro_batches);
}

absl::StatusOr<SimulationResult> SimulateProgram(const Program& p, const Placement& placement,
                                                 int num_micro_batches, const ActionCosts& costs,
                                                 const std::vector<ActionCosts>& per_stage) {
  RETURN_IF_ERROR(ValidateProgram(p, placement, num_micro_batches));
  if (!per_stage.empty() && static_cast<int>(per_stage.size()) != placement.num_stages()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "per-stage costs: ", per_stage.size(), " entries for ", placement.num_stages(), " stages"));
  }
  auto cost_of = [&](int stage) -> const ActionCosts& {
    return per_stage.empty() ? costs : per_stage[stage];
  };
  const int P = placement.num_ranks;
  std::vector<size_t> pc(P, 0);
  std::vector<double> clock(P, 0.0);
  std::map<Key, std::deque<double>> arrival;  // when each posted message becomes receivable
  SimulationResult out;
  out.busy.assign(P, 0.0);
  out.peak_live_micro_batches.assign(P, 0);
  out.start.resize(P);
  out.end.resize(P);
  for (int r = 0; r < P; ++r) {
    out.start[r].assign(p[r].size(), 0.0);
    out.end[r].assign(p[r].size(), 0.0);
  }
  std::vector<int> live(P, 0);
  // The memory model: a micro-batch holds its stage's activation_bytes from F to its last
  // backward, or, when the program recomputes it (has an R for it), input_bytes from F to R
  // (and one layer's working set more while the F runs) and activation_bytes from R to its
  // last backward.
  out.peak_activation_bytes.assign(P, 0.0);
  std::vector<double> live_bytes(P, 0.0);
  std::set<std::pair<int, int>> recomputed;
  std::set<std::pair<int, int>> at_backward;  // recomputed layer by layer inside its backward
  for (const auto& list : p) {
    const std::vector<bool> inside = RecomputeAtBackward(list);
    for (size_t i = 0; i < list.size(); ++i) {
      const Action& a = list[i];
      if (a.kind != v1::ACTION_R) continue;
      recomputed.insert({a.stage, a.micro_batch});
      if (inside[i]) at_backward.insert({a.stage, a.micro_batch});
    }
  }
  // Per rank: when its reductions (REDUCE_GRAD, one at a time) are done.
  std::vector<double> reduce_done(P, 0.0);
  // The program is valid, so this terminates with every list done.
  for (bool moved = true; moved;) {
    moved = false;
    for (int r = 0; r < P; ++r) {
      for (; pc[r] < p[r].size(); ++pc[r], moved = true) {
        const Action& a = p[r][pc[r]];
        const double begin = clock[r];
        if (a.kind == v1::ACTION_RECV_F || a.kind == v1::ACTION_RECV_B) {
          auto it = arrival.find(MessageKey(a));
          if (it == arrival.end() || it->second.empty()) break;  // its send is not posted yet
          clock[r] = std::max(clock[r], it->second.front());
          it->second.pop_front();
        } else if (a.kind == v1::ACTION_SEND_F || a.kind == v1::ACTION_SEND_B) {
          arrival[MessageKey(a)].push_back(clock[r] + cost_of(a.stage).transfer);
        } else if (IsReductionAction(a.kind)) {
          // Posted: it runs beside the rank's compute, after the rank's earlier reductions.
          const double start = std::max(clock[r], reduce_done[r]);
          reduce_done[r] = start + cost_of(a.stage).reduce;
          out.start[r][pc[r]] = start;
          out.end[r][pc[r]] = reduce_done[r];
          continue;
        } else {
          double cost = ComputeCost(cost_of(a.stage), a.kind);
          if (StartsOverlappedPair(p[r], pc[r]) && cost_of(a.stage).overlapped_pair > 0) {
            // The pair takes F&B in all: its F is charged what its second action leaves.
            const Action& second = p[r][pc[r] + 1];
            cost = std::max(0.0, cost_of(a.stage).overlapped_pair -
                                     ComputeCost(cost_of(second.stage), second.kind));
          }
          clock[r] += cost;
          out.busy[r] += cost;
          const ActionCosts& mem = cost_of(a.stage);
          if (a.kind == v1::ACTION_F) {
            ++live[r];
            if (recomputed.count({a.stage, a.micro_batch})) {
              // Layer by layer without saving: its checkpoints and, while a layer runs, that
              // layer's working set (on cuda the stage's slot) at the most.
              out.peak_activation_bytes[r] = std::max(
                  out.peak_activation_bytes[r], live_bytes[r] + mem.input_bytes + mem.layer_bytes);
              live_bytes[r] += mem.input_bytes;
            } else {
              live_bytes[r] += mem.activation_bytes;
            }
          } else if (a.kind == v1::ACTION_R) {
            if (!at_backward.count({a.stage, a.micro_batch})) {
              live_bytes[r] += mem.activation_bytes - mem.input_bytes;
            }
          } else if (at_backward.count({a.stage, a.micro_batch}) && a.kind != v1::ACTION_W) {
            // Each layer recomputed just before its backward: the checkpoints and one layer's
            // working set at the most. A B frees it all; an I leaves what the W's need (taken
            // as the whole working set: an upper bound).
            out.peak_activation_bytes[r] =
                std::max(out.peak_activation_bytes[r], live_bytes[r] + mem.layer_bytes);
            if (a.kind == v1::ACTION_B) {
              --live[r];
              live_bytes[r] -= mem.input_bytes;
            } else {
              live_bytes[r] += mem.activation_bytes - mem.input_bytes;
            }
          } else if (a.kind == v1::ACTION_B || a.kind == v1::ACTION_W) {
            --live[r];
            live_bytes[r] -= mem.activation_bytes;
          }
          out.peak_live_micro_batches[r] = std::max(out.peak_live_micro_batches[r], live[r]);
          out.peak_activation_bytes[r] = std::max(out.peak_activation_bytes[r], live_bytes[r]);
        }
        out.start[r][pc[r]] = begin;
        out.end[r][pc[r]] = clock[r];
      }
    }
  }
  out.reduce_exposed.assign(P, 0.0);
  for (int r = 0; r < P; ++r) {
    out.reduce_exposed[r] = std::max(0.0, reduce_done[r] - clock[r]);
    clock[r] = std::max(clock[r], reduce_done[r]);
  }
  out.step_time = *std::max_element(clock.begin(), clock.end());
  double idle = 0.0;
  for (int r = 0; r < P; ++r) {
    out.idle.push_back(out.step_time - out.busy[r]);
    idle += out.idle.back();
  }
  out.bubble_fraction = out.step_time > 0 ? idle / (P * out.step_time) : 0.0;
  return out;
}

absl::StatusOr<SimulationResult> SimulateSchedule(const Schedule& lowered, const ActionCosts& costs,
                                                  const std::vector<ActionCosts>& per_stage) {
  return SimulateProgram(lowered.program, lowered.placement, lowered.num_micro_batches, costs,
                         per_stage);
}

std::string TimestepGrid(const Program& lowered, const SimulationResult& sim, double unit) {
  constexpr int64_t kMaxColumns = 10000;
  if (!(unit > 0)) unit = 1.0;
  const int64_t columns =
      std::min<int64_t>(kMaxColumns, static_cast<int64_t>(std::ceil(sim.step_time / unit - 1e-9)));
  size_t width = 1;
  for (const auto& list : lowered) {
    for (const Action& a : list) {
      if (IsComputeAction(a.kind)) width = std::max(width, ActionToString(a).size());
    }
  }
  std::string out;
  for (size_t r = 0; r < lowered.size(); ++r) {
    std::vector<std::string> cells(std::max<int64_t>(columns, 0), ".");
    const size_t known = r < sim.start.size() && r < sim.end.size()
                             ? std::min({lowered[r].size(), sim.start[r].size(), sim.end[r].size()})
                             : 0;
    for (size_t i = 0; i < known; ++i) {
      if (!IsComputeAction(lowered[r][i].kind)) continue;
      // The columns whose midpoint falls in [start, end).
      const int64_t first =
          std::max<int64_t>(0, static_cast<int64_t>(std::ceil(sim.start[r][i] / unit - 0.5)));
      const int64_t last =
          std::min<int64_t>(columns, static_cast<int64_t>(std::ceil(sim.end[r][i] / unit - 0.5)));
      for (int64_t c = first; c < last; ++c) cells[c] = ActionToString(lowered[r][i]);
    }
    std::string line = absl::StrCat("rank ", r, ":");
    for (const std::string& cell : cells) {
      absl::StrAppend(&line, " ", cell, std::string(width - std::min(width, cell.size()), ' '));
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    absl::StrAppend(&out, line, "\n");
  }
  return out;
}

}  // namespace tandem
