#include "common/schedule_auto.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace tandem {
namespace {

constexpr double kInfinity = std::numeric_limits<double>::infinity();
constexpr double kUnknown = -1.0;  // an end not placed yet (every end is positive)

// Timing of a compute-only program by SimulateProgram's semantics, without lowering it: what
// the search evaluates thousands of times. The message of an action on stage s is receivable
// per_stage[s].transfer after it ends (a lowered program sends right after the compute).
struct Timing {
  bool complete = false;  // false: the orders deadlock (or an action comes before its input)
  double step = 0.0;
  double sum_of_ends = 0.0;
  std::vector<int> peak_live;  // per rank, F to W
};

class Timer {
 public:
  Timer(int num_ranks, int num_micro_batches, const std::vector<ActionCosts>& costs)
      : p_(num_ranks), m_(num_micro_batches), costs_(costs) {}

  Timing Run(const Program& program) {
    f_end_.assign(static_cast<size_t>(p_) * m_, kUnknown);
    i_end_.assign(static_cast<size_t>(p_) * m_, kUnknown);
    Timing out;
    out.peak_live.assign(p_, 0);
    std::vector<size_t> pc(p_, 0);
    std::vector<double> clock(p_, 0.0);
    std::vector<int> live(p_, 0);
    size_t remaining = 0;
    for (const auto& list : program) remaining += list.size();
    for (bool moved = true; moved && remaining > 0;) {
      moved = false;
      for (int r = 0; r < p_; ++r) {
        for (; pc[r] < program[r].size(); ++pc[r], --remaining, moved = true) {
          const Action& a = program[r][pc[r]];
          const int s = a.stage;
          const size_t at = Index(s, a.micro_batch);
          double ready = 0.0;
          double cost = 0.0;
          if (a.kind == v1::ACTION_F) {
            if (s > 0) {
              const double e = f_end_[Index(s - 1, a.micro_batch)];
              if (e < 0) break;
              ready = e + costs_[s - 1].transfer;
            }
            cost = costs_[s].forward;
          } else if (a.kind == v1::ACTION_I) {
            if (f_end_[at] < 0) break;
            if (s + 1 < p_) {
              const double e = i_end_[Index(s + 1, a.micro_batch)];
              if (e < 0) break;
              ready = e + costs_[s + 1].transfer;
            }
            cost = costs_[s].backward_input;
          } else {  // W
            if (i_end_[at] < 0) break;
            cost = costs_[s].backward_weight;
          }
          clock[r] = std::max(clock[r], ready) + cost;
          out.sum_of_ends += clock[r];
          if (a.kind == v1::ACTION_F) {
            f_end_[at] = clock[r];
            out.peak_live[r] = std::max(out.peak_live[r], ++live[r]);
          } else if (a.kind == v1::ACTION_I) {
            i_end_[at] = clock[r];
          } else {
            --live[r];
          }
        }
      }
    }
    out.complete = remaining == 0;
    out.step = *std::max_element(clock.begin(), clock.end());
    return out;
  }

 private:
  size_t Index(int stage, int micro_batch) const {
    return static_cast<size_t>(stage) * m_ + micro_batch;
  }

  int p_, m_;
  const std::vector<ActionCosts>& costs_;
  std::vector<double> f_end_, i_end_;
};

bool WithinLimits(const Timing& t, const std::vector<int>& limit) {
  if (!t.complete) return false;
  for (size_t r = 0; r < limit.size(); ++r) {
    if (t.peak_live[r] > limit[r]) return false;
  }
  return true;
}

int TotalPeak(const Timing& t) {
  int sum = 0;
  for (int p : t.peak_live) sum += p;
  return sum;
}

// Shorter step; or as long with the work done earlier (several moves together can shorten a
// step that no single one can: each one that lets work happen earlier prepares the next).
bool Improves(const Timing& trial, const Timing& current) {
  if (trial.step < current.step * (1 - 1e-9)) return true;
  return trial.step <= current.step * (1 + 1e-12) &&
         trial.sum_of_ends < current.sum_of_ends * (1 - 1e-9);
}

// The hyperparameters of the greedy construction (the paper grid-searches its own).
struct Knobs {
  bool forward_may_delay_input = false;  // an F may start although the next I's gradient
                                         // arrives before it would end
  bool weight_may_delay_input = false;   // likewise a W (filling gaps smaller than a W)
  bool weight_before_forward = false;    // both fit: W first (less memory) or F first
  // At most limit - r forwards on rank r before its first I (ZB-H1's warm-up shape), keeping
  // room for the W's it defers later; else as many as the limit allows.
  bool staggered_warmup = false;
  // The paper's rule that a rank stays at least one forward ahead of the next: a ready F goes
  // before a ready I while the next rank has run as many forwards (it waits for this one).
  bool forward_keeps_ahead = false;
};

// The event-driven list scheduler of the header's step 1. nullopt if it stops making progress
// (a safety net, not seen in the tests).
std::optional<Program> Greedy(int num_ranks, int num_micro_batches,
                              const std::vector<ActionCosts>& c, const std::vector<int>& limit,
                              const Knobs& knobs) {
  const int P = num_ranks, M = num_micro_batches;
  auto at = [M](int stage, int m) { return static_cast<size_t>(stage) * M + m; };
  std::vector<double> f_end(static_cast<size_t>(P) * M, kUnknown);
  std::vector<double> i_end(static_cast<size_t>(P) * M, kUnknown);
  struct RankState {
    double time = 0.0;  // when it decides its next action (free, or done waiting)
    int next_f = 0, next_i = 0, next_w = 0;
  };
  std::vector<RankState> ranks(P);
  Program program(P);
  const int64_t total = int64_t{3} * P * M;
  int64_t placed = 0;
  // Each wait moves the rank to a later arrival it knows of (or a lower bound of one), and the
  // costs are positive; a generous bound on the iterations guards against a policy that would
  // stop placing actions.
  const int64_t max_iterations = 64 * total + 1024;
  for (int64_t iteration = 0; placed < total; ++iteration) {
    if (iteration > max_iterations) return std::nullopt;
    int r = -1;
    for (int q = 0; q < P; ++q) {
      const RankState& k = ranks[q];
      if (k.next_w == M) continue;  // finished
      if (r < 0 || k.time < ranks[r].time) r = q;
    }
    RankState& k = ranks[r];
    const ActionCosts& cost = c[r];
    const double t = k.time;
    auto emit = [&](ActionKind kind, int m, double ready, double duration) {
      const double end = std::max(t, ready) + duration;
      if (kind == v1::ACTION_F) f_end[at(r, m)] = end;
      if (kind == v1::ACTION_I) i_end[at(r, m)] = end;
      program[r].push_back({r, kind, m});
      k.time = end;
      ++placed;
    };
    // The next I: its gradient's arrival, known once the rank below has placed its I, else a
    // lower bound (that rank decides no earlier than its own time, which is >= t).
    const bool input_pending = k.next_i < k.next_f;
    double gradient = kInfinity;
    bool gradient_known = false;
    if (input_pending) {
      const int m = k.next_i;
      if (r == P - 1) {
        gradient = f_end[at(r, m)];
        gradient_known = true;
      } else if (i_end[at(r + 1, m)] >= 0) {
        gradient = i_end[at(r + 1, m)] + c[r + 1].transfer;
        gradient_known = true;
      } else {
        gradient = std::max(ranks[r + 1].time, t) + c[r + 1].backward_input + c[r + 1].transfer;
      }
    }
    // The next forward: its input's arrival, known or a lower bound likewise.
    const int live = k.next_f - k.next_w;
    const bool forward_allowed =
        k.next_f < M && live < limit[r] &&
        (!knobs.staggered_warmup || k.next_i > 0 || k.next_f < std::max(1, limit[r] - r));
    double input = kInfinity;
    bool input_known = false;
    if (forward_allowed) {
      if (r == 0) {
        input = 0.0;
        input_known = true;
      } else if (f_end[at(r - 1, k.next_f)] >= 0) {
        input = f_end[at(r - 1, k.next_f)] + c[r - 1].transfer;
        input_known = true;
      } else {
        input = std::max(ranks[r - 1].time, t) + c[r - 1].forward + c[r - 1].transfer;
      }
    }
    const double slack = 1e-9 * std::max(1.0, t);
    const bool forward_ready = forward_allowed && input_known && input <= t;
    const bool forward_first =
        knobs.forward_keeps_ahead && forward_ready && r + 1 < P && k.next_f <= ranks[r + 1].next_f;
    if (gradient_known && gradient <= t && !forward_first) {
      emit(v1::ACTION_I, k.next_i++, gradient, cost.backward_input);
      continue;
    }
    const bool weight_ready = k.next_w < k.next_i;
    const bool forward_fits =
        forward_first ||
        (forward_ready && (knobs.forward_may_delay_input || t + cost.forward <= gradient + slack));
    // A full memory with forwards left: the W makes the room the next F needs.
    const bool memory_full = k.next_f < M && live >= limit[r];
    const bool weight_fits = weight_ready && (knobs.weight_may_delay_input || memory_full ||
                                              t + cost.backward_weight <= gradient + slack);
    if (forward_fits && (!weight_fits || !knobs.weight_before_forward)) {
      emit(v1::ACTION_F, k.next_f++, input, cost.forward);
      continue;
    }
    if (weight_fits) {
      emit(v1::ACTION_W, k.next_w++, t, cost.backward_weight);
      continue;
    }
    // Wait for the next arrival (known, or the bound a neighbour's next decision allows).
    double next = kInfinity;
    if (input_pending) next = std::min(next, gradient);
    if (forward_allowed && !forward_ready) next = std::min(next, input);
    if (next > t && next < kInfinity) {
      k.time = next;
      continue;
    }
    // Nothing to wait for that is later (cannot happen with positive costs): run what is ready.
    if (forward_ready) {
      emit(v1::ACTION_F, k.next_f++, input, cost.forward);
    } else if (weight_ready) {
      emit(v1::ACTION_W, k.next_w++, t, cost.backward_weight);
    } else {
      return std::nullopt;
    }
  }
  return program;
}

// A hand-crafted compute-only order for the same placement, with any full backward B split
// into I then W (1F1B's). nullopt when the generator refuses (M < P).
std::optional<Program> Handcrafted(const absl::StatusOr<Schedule>& s) {
  if (!s.ok()) return std::nullopt;
  Program out(s->program.size());
  for (size_t r = 0; r < s->program.size(); ++r) {
    for (const Action& a : s->program[r]) {
      if (a.kind == v1::ACTION_B) {
        out[r].push_back({a.stage, v1::ACTION_I, a.micro_batch});
        out[r].push_back({a.stage, v1::ACTION_W, a.micro_batch});
      } else {
        out[r].push_back(a);
      }
    }
  }
  return out;
}

// The header's step 3: first-improvement hill climbing over single moves, until a pass finds
// nothing or the budget of evaluations is spent.
void LocalSearch(Timer& timer, const std::vector<int>& limit, int budget, Program& program,
                 Timing& current) {
  const int P = static_cast<int>(program.size());
  const int window = 2 * P + 2;
  int evaluations = 0;
  auto try_move = [&](std::vector<Action>& list, size_t from, size_t to) {
    if (evaluations >= budget) return false;
    ++evaluations;
    auto move = [&list](size_t a, size_t b) {
      if (a < b) {
        std::rotate(list.begin() + a, list.begin() + a + 1, list.begin() + b + 1);
      } else {
        std::rotate(list.begin() + b, list.begin() + a, list.begin() + a + 1);
      }
    };
    move(from, to);
    Timing trial = timer.Run(program);
    if (WithinLimits(trial, limit) && Improves(trial, current)) {
      current = std::move(trial);
      return true;
    }
    move(to, from);
    return false;
  };
  for (bool improved = true; improved && evaluations < budget;) {
    improved = false;
    for (int r = 0; r < P; ++r) {
      std::vector<Action>& list = program[r];
      const size_t n = list.size();
      for (size_t i = 0; i < n; ++i) {
        if (list[i].kind == v1::ACTION_W) {
          const size_t lo = i > static_cast<size_t>(window) ? i - window : 0;
          const size_t hi = std::min(n - 1, i + window);
          bool moved = false;
          for (size_t j = lo; j <= hi && !moved; ++j) {
            if (j != i && j != i + 1) moved = try_move(list, i, j);
          }
          if (moved) {
            improved = true;
            continue;
          }
        }
        if (i + 1 < n && try_move(list, i, i + 1)) improved = true;
      }
    }
  }
}

absl::Status CheckInputs(int P, int M, const std::vector<ActionCosts>& per_stage,
                         const std::vector<int>& limit) {
  RETURN_IF_ERROR(WithPrefix(CheckScheduleSizes(P, M), "zb_auto"));
  if (static_cast<int>(per_stage.size()) != P) {
    return absl::InvalidArgumentError(absl::StrCat("zb_auto: per-stage costs: ", per_stage.size(),
                                                   " entries for ", P,
                                                   " stages (one stage per rank)"));
  }
  for (int s = 0; s < P; ++s) {
    const ActionCosts& c = per_stage[s];
    const struct {
      const char* name;
      double value;
      bool positive;
    } fields[] = {{"forward", c.forward, true},
                  {"backward_input", c.backward_input, true},
                  {"backward_weight", c.backward_weight, false},
                  {"transfer", c.transfer, false}};
    for (const auto& f : fields) {
      if (!std::isfinite(f.value) || f.value < 0 || (f.positive && f.value == 0)) {
        return absl::InvalidArgumentError(
            absl::StrCat("zb_auto: stage ", s, "'s ", f.name, " cost must be ",
                         f.positive ? "positive" : "non-negative", " and finite, got ", f.value));
      }
    }
  }
  if (static_cast<int>(limit.size()) != P) {
    return absl::InvalidArgumentError(absl::StrCat(
        "zb_auto: max_live_micro_batches: ", limit.size(), " entries for ", P, " ranks"));
  }
  for (int r = 0; r < P; ++r) {
    if (limit[r] < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "zb_auto: rank ", r, "'s memory limit must be at least 1 micro-batch (0: no limit), got ",
          limit[r]));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Schedule> GenerateZBAuto(int num_ranks, int num_micro_batches,
                                        const std::vector<ActionCosts>& per_stage,
                                        const std::vector<int>& max_live_micro_batches,
                                        const ZBAutoOptions& options) {
  RETURN_IF_ERROR(CheckInputs(num_ranks, num_micro_batches, per_stage, max_live_micro_batches));
  const int P = num_ranks, M = num_micro_batches;
  std::vector<int> limit = max_live_micro_batches;
  for (int& l : limit) l = l == 0 ? M : std::min(l, M);

  Timer timer(P, M, per_stage);
  std::optional<Program> best;
  Timing best_timing;
  auto consider = [&](std::optional<Program> candidate) {
    if (!candidate) return;
    Timing t = timer.Run(*candidate);
    if (!WithinLimits(t, limit)) return;
    const bool better =
        !best || t.step < best_timing.step * (1 - 1e-9) ||
        (t.step <= best_timing.step * (1 + 1e-9) && TotalPeak(t) < TotalPeak(best_timing));
    if (better) {
      best = std::move(candidate);
      best_timing = std::move(t);
    }
  };
  for (int bits = 0; bits < 32; ++bits) {
    const Knobs knobs{(bits & 1) != 0, (bits & 2) != 0, (bits & 4) != 0, (bits & 8) != 0,
                      (bits & 16) != 0};
    consider(Greedy(P, M, per_stage, limit, knobs));
  }
  if (options.seed_with_handcrafted) {
    consider(Handcrafted(Generate1F1B(P, M)));
    consider(Handcrafted(GenerateZBH1(P, M)));
    consider(Handcrafted(GenerateZBH2(P, M)));
  }
  if (!best) {
    return absl::InternalError(
        absl::StrCat("zb_auto: no order found for P=", P, ", M=", M, " within the limits"));
  }
  if (options.local_search_evaluations > 0) {
    LocalSearch(timer, limit, options.local_search_evaluations, *best, best_timing);
  }

  Schedule out;
  out.name = "zb_auto";
  out.placement = OneStagePerRank(P);
  out.program = *std::move(best);
  out.num_micro_batches = M;
  // A programming error, not the caller's: every order the search keeps runs to completion.
  RETURN_IF_ERROR(WithPrefix(ValidateSchedule(LowerWithTransfers(out)), "zb_auto (internal)"));
  return out;
}

}  // namespace tandem
