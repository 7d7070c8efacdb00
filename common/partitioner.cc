#include "common/partitioner.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <optional>
#include <queue>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "common/spec.h"
#include "common/status_macros.h"

namespace tandem {

int64_t StageWorkspaceBytes(absl::Span<const int64_t> layer_workspaces) {
  std::vector<int64_t> distinct;
  for (int64_t w : layer_workspaces) {
    if (w > 0 && std::find(distinct.begin(), distinct.end(), w) == distinct.end()) {
      distinct.push_back(w);
    }
  }
  int64_t sum = 0;
  for (int64_t w : distinct) sum += w;
  return sum;
}

int64_t SmallestBudgetBytes(const absl::Status& status) {
  const auto payload = status.GetPayload(kSmallestBudgetPayload);
  int64_t bytes = 0;
  if (!payload.has_value() || !absl::SimpleAtoi(std::string(*payload), &bytes)) return 0;
  return bytes;
}

namespace {

constexpr double kNoSeconds = std::numeric_limits<double>::infinity();
// A layer's message, working set and workspace are taken at most this (256 TiB), so that a
// stage's sum of them over up to 2^13 layers stays within int64.
constexpr int64_t kMaxLayerBytes = int64_t{1} << 48;
constexpr int64_t kNoBytes = std::numeric_limits<int64_t>::max();

std::string RangeString(const LayerRange& r) {
  return absl::StrCat("[", r.begin, ", ", r.end, ")");
}

// "[0, 2) [2, 5)".
std::string RangesString(const std::vector<LayerRange>& ranges) {
  return absl::StrJoin(ranges, " ",
                       [](std::string* out, const LayerRange& r) { out->append(RangeString(r)); });
}

// A problem's costs as prefix sums, so that a stage's figures are O(1). Every figure the
// partitioner compares or reports comes from StageSeconds / StageBytes (GrowingBytes only
// stops scans), so that the optimum's bottleneck is bit-identical to EvaluatePartition's
// figure for the same cut.
class Costs {
 public:
  // INVALID_ARGUMENT for stage counts below 1, negative or non-finite costs, a
  // live_micro_batches of the wrong size, or byte figures that would overflow int64.
  static absl::StatusOr<Costs> Make(const PartitionProblem& problem) {
    const int p = problem.num_stages;
    if (p < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("partition: number of stages must be at least 1, got ", p));
    }
    if (!std::isfinite(problem.transfer_seconds) || problem.transfer_seconds < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "partition: transfer_seconds must be finite and >= 0, got ", problem.transfer_seconds));
    }
    if (problem.memory_budget_bytes < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("partition: memory_budget_bytes must be >= 0 (0 = unlimited), got ",
                       problem.memory_budget_bytes));
    }
    if (!problem.live_micro_batches.empty() &&
        static_cast<int>(problem.live_micro_batches.size()) != p) {
      return absl::InvalidArgumentError(
          absl::StrCat("partition: live_micro_batches has ", problem.live_micro_batches.size(),
                       " entries for ", p, " stages (empty means 1 for every stage)"));
    }
    if (!problem.rank_of_stage.empty()) {
      if (static_cast<int>(problem.rank_of_stage.size()) != p) {
        return absl::InvalidArgumentError(
            absl::StrCat("partition: rank_of_stage has ", problem.rank_of_stage.size(),
                         " entries for ", p, " stages (empty means one stage per worker)"));
      }
      for (int s = 0; s < p; ++s) {
        if (problem.rank_of_stage[s] < 0 || problem.rank_of_stage[s] >= p) {
          return absl::InvalidArgumentError(absl::StrCat("partition: rank_of_stage[", s, "] is ",
                                                         problem.rank_of_stage[s],
                                                         "; expected 0 to ", p - 1));
        }
      }
    }
    const bool per_stage = !problem.stage_recomputes.empty();
    if (per_stage && static_cast<int>(problem.stage_recomputes.size()) != p) {
      return absl::InvalidArgumentError(
          absl::StrCat("partition: stage_recomputes has ", problem.stage_recomputes.size(),
                       " entries for ", p, " stages (empty means none chosen per stage)"));
    }
    if (per_stage != !problem.recomputed_layers.empty() ||
        (per_stage && problem.recomputed_layers.size() != problem.layers.size())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "partition: recomputed_layers has ", problem.recomputed_layers.size(), " entries for ",
          problem.layers.size(), " layers and stage_recomputes ", problem.stage_recomputes.size(),
          " for ", p, " stages (both empty, or one per layer and one per stage)"));
    }
    Costs c;
    c.problem_ = &problem;
    c.rank_.resize(p);
    for (int s = 0; s < p; ++s) {
      c.rank_[s] = problem.rank_of_stage.empty() ? s : problem.rank_of_stage[s];
    }
    c.num_ranks_ = *std::max_element(c.rank_.begin(), c.rank_.end()) + 1;
    std::vector<int> held(c.num_ranks_, 0);
    for (int r : c.rank_) c.grouped_ = c.grouped_ || ++held[r] > 1;
    c.live_.assign(p, 1);
    int64_t max_live = 0;
    for (int s = 0; s < p && !problem.live_micro_batches.empty(); ++s) {
      const int live = problem.live_micro_batches[s];
      if (live < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("partition: live_micro_batches[", s, "] must be >= 0, got ", live));
      }
      c.live_[s] = live;
    }
    for (int live : c.live_) max_live = std::max<int64_t>(max_live, live);
    const size_t n = problem.layers.size();
    c.output_.assign(n, 0);
    for (size_t l = 0; l < n; ++l) {
      c.output_[l] =
          std::min<int64_t>(std::max<int64_t>(problem.layers[l].output_bytes, 0), kMaxLayerBytes);
    }
    RETURN_IF_ERROR(c.plain_.Sum(problem.layers, max_live, problem.transfer_seconds, ""));
    if (per_stage) {
      RETURN_IF_ERROR(c.recomputed_.Sum(problem.recomputed_layers, max_live,
                                        problem.transfer_seconds, "recomputed "));
    }
    return c;
  }

  int num_layers() const { return static_cast<int>(plain_.seconds.size()) - 1; }
  int num_stages() const { return problem_->num_stages; }
  int num_ranks() const { return num_ranks_; }
  int RankOf(int s) const { return rank_[s]; }
  // The stages worker r holds, in order.
  std::vector<int> StagesOf(int r) const {
    std::vector<int> stages;
    for (int s = 0; s < num_stages(); ++s) {
      if (rank_[s] == r) stages.push_back(s);
    }
    return stages;
  }
  // Some worker holds several stages: the budget bounds their sum.
  bool Grouped() const { return grouped_; }
  int64_t budget() const {
    return problem_->memory_budget_bytes > 0 ? problem_->memory_budget_bytes : kNoBytes;
  }

  // Cut sides stage s touches: none for a single stage, one for the first and the last.
  int Transfers(int s) const {
    const int p = num_stages();
    if (p == 1) return 0;
    return (s == 0 || s == p - 1) ? 1 : 2;
  }
  // Stage s holding layers [i, j). Nondecreasing in j and nonincreasing in i (costs >= 0;
  // every stage's figures come from one variant of the layers' costs, its own).
  double StageSeconds(int s, int i, int j) const {
    const Sums& v = Of(s);
    return (v.seconds[j] - v.seconds[i]) + Transfers(s) * problem_->transfer_seconds;
  }
  int64_t StaticBytes(int s, int i, int j) const { return Of(s).statics[j] - Of(s).statics[i]; }
  int64_t ActivationBytes(int s, int i, int j) const {
    return Of(s).activation[j] - Of(s).activation[i];
  }
  int Live(int s) const { return live_[s]; }
  bool Recomputes(int s) const {
    return !problem_->stage_recomputes.empty() && problem_->stage_recomputes[s];
  }
  // Two messages at the stage's cuts (the larger cut's), when it has a neighbour.
  int64_t BufferBytes(int s, int i, int j) const {
    if (Transfers(s) == 0) return 0;
    return 2 * std::max(i > 0 ? output_[i - 1] : 0, j > i ? output_[j - 1] : 0);
  }
  // The largest working set of the stage's layers (their sum when a stage recomputes at once).
  int64_t WorkingSetBytes(int s, int i, int j) const {
    const std::vector<int64_t>& w = Of(s).working_set;
    int64_t most = 0, sum = 0;
    for (int l = i; l < j; ++l) {
      most = std::max(most, w[l]);
      sum += w[l];
    }
    return problem_->whole_stage_recompute ? sum : most;
  }
  int64_t WorkspaceBytes(int s, int i, int j) const {
    const std::vector<int64_t>& w = Of(s).workspace;
    return StageWorkspaceBytes(absl::MakeConstSpan(w).subspan(i, j - i));
  }
  int64_t StageBytes(int s, int i, int j) const {
    return GrowingBytes(s, i, j) + BufferBytes(s, i, j);
  }
  // StageBytes less the messages: nondecreasing in j and nonincreasing in i, where the messages
  // (the output at the stage's cut) are not, so that a stage can fit with a layer more than
  // without. The scans below stop on this part and skip a stage over its bound.
  int64_t GrowingBytes(int s, int i, int j) const {
    return StaticBytes(s, i, j) + live_[s] * ActivationBytes(s, i, j) + WorkingSetBytes(s, i, j) +
           WorkspaceBytes(s, i, j);
  }

  // "stage 1 (layers [2, 6)) needs 22 bytes (12 static + 2 x 5 activation)".
  std::string DescribeStage(int s, const LayerRange& r) const {
    const int i = r.begin, j = r.end;
    return absl::StrCat(
        "stage ", s, " (layers ", RangeString(r), Recomputes(s) ? ", recomputed" : "", ") needs ",
        StageBytes(s, i, j), " bytes (", StaticBytes(s, i, j), " static + ", Live(s), " x ",
        ActivationBytes(s, i, j), " activation",
        WorkingSetBytes(s, i, j) > 0 ? absl::StrCat(" + ", WorkingSetBytes(s, i, j), " working set")
                                     : "",
        WorkspaceBytes(s, i, j) > 0 ? absl::StrCat(" + ", WorkspaceBytes(s, i, j), " workspace")
                                    : "",
        BufferBytes(s, i, j) > 0 ? absl::StrCat(" + ", BufferBytes(s, i, j), " messages") : "",
        ")");
  }

  Partition Figures(const std::vector<LayerRange>& ranges) const {
    Partition out;
    out.ranges = ranges;
    out.worker_bytes.assign(num_ranks_, 0);
    for (int s = 0; s < static_cast<int>(ranges.size()); ++s) {
      out.stage_seconds.push_back(StageSeconds(s, ranges[s].begin, ranges[s].end));
      out.stage_bytes.push_back(StageBytes(s, ranges[s].begin, ranges[s].end));
      int64_t& worker = out.worker_bytes[rank_[s]];
      if (__builtin_add_overflow(worker, out.stage_bytes.back(), &worker)) worker = kNoBytes;
      out.bottleneck_seconds = std::max(out.bottleneck_seconds, out.stage_seconds.back());
    }
    return out;
  }

  // "worker 0 needs 9 bytes: stage 0 (...) and stage 3 (...)", for a cut's figures.
  std::string DescribeWorker(int r, const Partition& figures) const {
    std::vector<std::string> stages;
    for (int s : StagesOf(r)) stages.push_back(DescribeStage(s, figures.ranges[s]));
    return absl::StrCat("worker ", r, " needs ", figures.worker_bytes[r],
                        " bytes: ", absl::StrJoin(stages, " and "));
  }

 private:
  // One variant of the layers' costs (plain, or recomputed): prefix sums, and the working
  // sets per layer.
  struct Sums {
    std::vector<double> seconds;  // seconds[l] = layers [0, l)
    std::vector<int64_t> statics;
    std::vector<int64_t> activation;
    std::vector<int64_t> working_set;  // per layer
    std::vector<int64_t> workspace;    // per layer

    // INVALID_ARGUMENT for negative or non-finite costs, or figures that would overflow.
    absl::Status Sum(const std::vector<LayerCost>& layers, int64_t max_live, double transfer,
                     absl::string_view what) {
      const size_t n = layers.size();
      seconds.assign(n + 1, 0.0);
      statics.assign(n + 1, 0);
      activation.assign(n + 1, 0);
      working_set.assign(n, 0);
      workspace.assign(n, 0);
      for (size_t l = 0; l < n; ++l) {
        const LayerCost& lc = layers[l];
        if (!std::isfinite(lc.seconds) || lc.seconds < 0) {
          return absl::InvalidArgumentError(absl::StrCat("partition: ", what, "layer ", l,
                                                         " seconds must be finite and >= 0, got ",
                                                         lc.seconds));
        }
        if (lc.static_bytes < 0 || lc.activation_bytes < 0 || lc.output_bytes < 0 ||
            lc.working_set_bytes < 0 || lc.workspace_bytes < 0) {
          return absl::InvalidArgumentError(absl::StrCat(
              "partition: ", what, "layer ", l, " bytes must be >= 0, got static ", lc.static_bytes,
              ", activation ", lc.activation_bytes, ", output ", lc.output_bytes, ", working set ",
              lc.working_set_bytes, " and workspace ", lc.workspace_bytes));
        }
        seconds[l + 1] = seconds[l] + lc.seconds;
        working_set[l] = std::min<int64_t>(lc.working_set_bytes, kMaxLayerBytes);
        workspace[l] = std::min<int64_t>(lc.workspace_bytes, kMaxLayerBytes);
        if (__builtin_add_overflow(statics[l], lc.static_bytes, &statics[l + 1]) ||
            __builtin_add_overflow(activation[l], lc.activation_bytes, &activation[l + 1])) {
          return absl::InvalidArgumentError("partition: the layers' total bytes overflow int64");
        }
      }
      // The largest figure that StageBytes can produce; StageSeconds adds at most two
      // transfers.
      int64_t live_bytes = 0, total_bytes = 0, extra = 0;
      if (__builtin_mul_overflow(max_live, activation[n], &live_bytes) ||
          __builtin_add_overflow(live_bytes, statics[n], &total_bytes) ||
          // the working sets and workspaces (at most kMaxLayerBytes each) and two messages
          __builtin_mul_overflow(static_cast<int64_t>(2 * n + 2), kMaxLayerBytes, &extra) ||
          __builtin_add_overflow(total_bytes, extra, &total_bytes)) {
        return absl::InvalidArgumentError(
            "partition: static plus live activation bytes overflow int64");
      }
      if (!std::isfinite(seconds[n] + 2.0 * transfer)) {
        return absl::InvalidArgumentError("partition: the layers' total seconds are not finite");
      }
      return absl::OkStatus();
    }
  };
  const Sums& Of(int s) const { return Recomputes(s) ? recomputed_ : plain_; }

  const PartitionProblem* problem_ = nullptr;
  std::vector<int> rank_;  // per stage: its worker
  int num_ranks_ = 1;
  bool grouped_ = false;
  std::vector<int> live_;
  std::vector<int64_t> output_;  // per layer, the same in both variants
  Sums plain_, recomputed_;      // a stage's figures: recomputed_ where it Recomputes, else plain_
};

// In every DP below, row s, column j is about stages 0..s holding layers [0, j); stage s
// holds [i, j) with s <= i (one layer for each earlier stage) and j <= n - (P - 1 - s) (one
// for each later stage). Scanning i downwards makes stage s's seconds and GrowingBytes grow
// (its messages may not), so a scan stops as soon as a bound is crossed by them or the stage
// alone can no longer beat the best found, and skips a stage whose messages put it over:
// every DP stays exact.

// The smallest slowest-stage seconds over the cuts whose every stage s has at most
// max_bytes[s]; kNoSeconds when none.
double MinBottleneckSeconds(const Costs& c, const std::vector<int64_t>& max_bytes) {
  const int n = c.num_layers(), p = c.num_stages();
  std::vector<double> prev(n + 1, kNoSeconds), cur(n + 1, kNoSeconds);
  for (int j = 1; j <= n - (p - 1); ++j) {
    const int64_t g = c.GrowingBytes(0, 0, j);
    if (g > max_bytes[0]) break;
    if (g + c.BufferBytes(0, 0, j) > max_bytes[0]) continue;
    prev[j] = c.StageSeconds(0, 0, j);
  }
  for (int s = 1; s < p; ++s) {
    std::fill(cur.begin(), cur.end(), kNoSeconds);
    for (int j = s + 1; j <= n - (p - 1 - s); ++j) {
      double best = kNoSeconds;
      for (int i = j - 1; i >= s; --i) {
        const int64_t g = c.GrowingBytes(s, i, j);
        if (g > max_bytes[s]) break;
        const double t = c.StageSeconds(s, i, j);
        if (t >= best) break;
        if (prev[i] == kNoSeconds || g + c.BufferBytes(s, i, j) > max_bytes[s]) continue;
        best = std::min(best, std::max(prev[i], t));
      }
      cur[j] = best;
    }
    std::swap(prev, cur);
  }
  return prev[n];
}

// The smallest peak stage bytes over the cuts whose every stage s has at most max_seconds and
// at most max_bytes[s]; kNoBytes when none.
int64_t MinPeakBytes(const Costs& c, double max_seconds, const std::vector<int64_t>& max_bytes) {
  const int n = c.num_layers(), p = c.num_stages();
  std::vector<int64_t> prev(n + 1, kNoBytes), cur(n + 1, kNoBytes);
  for (int j = 1; j <= n - (p - 1); ++j) {
    const int64_t g = c.GrowingBytes(0, 0, j);
    if (g > max_bytes[0] || c.StageSeconds(0, 0, j) > max_seconds) break;
    const int64_t m = g + c.BufferBytes(0, 0, j);
    if (m > max_bytes[0]) continue;
    prev[j] = m;
  }
  for (int s = 1; s < p; ++s) {
    std::fill(cur.begin(), cur.end(), kNoBytes);
    for (int j = s + 1; j <= n - (p - 1 - s); ++j) {
      int64_t best = kNoBytes;
      for (int i = j - 1; i >= s; --i) {
        const int64_t g = c.GrowingBytes(s, i, j);
        if (g > max_bytes[s] || g >= best || c.StageSeconds(s, i, j) > max_seconds) break;
        const int64_t m = g + c.BufferBytes(s, i, j);
        if (prev[i] == kNoBytes || m > max_bytes[s] || m >= best) continue;
        best = std::min(best, std::max(prev[i], m));
      }
      cur[j] = best;
    }
    std::swap(prev, cur);
  }
  return prev[n];
}

// The lexicographically smallest cut (earliest first cut, then second, ...) whose every stage
// s has at most max_seconds and at most max_bytes[s]; empty when none.
std::vector<LayerRange> EarliestCut(const Costs& c, double max_seconds,
                                    const std::vector<int64_t>& max_bytes) {
  const int n = c.num_layers(), p = c.num_stages();
  auto fits = [&](int s, int i, int j) {
    return c.StageSeconds(s, i, j) <= max_seconds && c.StageBytes(s, i, j) <= max_bytes[s];
  };
  // No longer stage from [i, j) on fits either.
  auto outgrown = [&](int s, int i, int j) {
    return c.StageSeconds(s, i, j) > max_seconds || c.GrowingBytes(s, i, j) > max_bytes[s];
  };
  // done[s][i]: stages s..P-1 can hold layers [i, n) within the bounds.
  std::vector<std::vector<char>> done(p, std::vector<char>(n + 1, 0));
  for (int i = p - 1; i < n; ++i) done[p - 1][i] = fits(p - 1, i, n);
  for (int s = p - 2; s >= 0; --s) {
    for (int i = s; i <= n - (p - s); ++i) {
      for (int j = i + 1; j <= n - (p - 1 - s); ++j) {
        if (outgrown(s, i, j)) break;
        if (!fits(s, i, j)) continue;
        if (done[s + 1][j]) {
          done[s][i] = 1;
          break;
        }
      }
    }
  }
  if (!done[0][0]) return {};
  std::vector<LayerRange> ranges;
  int begin = 0;
  for (int s = 0; s < p - 1; ++s) {
    int end = begin + 1;
    while (!done[s + 1][end] || !fits(s, begin, end)) ++end;  // exists: done[s][begin]
    ranges.push_back({begin, end});
    begin = end;
  }
  ranges.push_back({begin, n});
  return ranges;
}

// Among the cuts whose every stage s has at most max_bytes[s] and the least bottleneck
// `seconds` (MinBottleneckSeconds), the one of the least peak stage, then the earliest.
Partition Cheapest(const Costs& c, double seconds, const std::vector<int64_t>& max_bytes) {
  const int64_t peak = MinPeakBytes(c, seconds, max_bytes);
  std::vector<int64_t> bounds = max_bytes;
  for (int64_t& b : bounds) b = std::min(b, peak);
  return c.Figures(EarliestCut(c, seconds, bounds));
}

// The workers of a cut over the budget.
std::vector<int> WorkersOver(const Costs& c, const Partition& cut) {
  std::vector<int> over;
  for (int r = 0; r < c.num_ranks(); ++r) {
    if (cut.worker_bytes[r] > c.budget()) over.push_back(r);
  }
  return over;
}

// The largest worker's bytes of a cut.
int64_t PeakWorkerBytes(const Partition& cut) {
  return *std::max_element(cut.worker_bytes.begin(), cut.worker_bytes.end());
}

// Without bounds, the earliest of the cuts whose largest stage is the least there is (which
// its largest stage's bytes then are).
Partition Lightest(const Costs& c) {
  const int p = c.num_stages();
  const int64_t peak = MinPeakBytes(c, kNoSeconds, std::vector<int64_t>(p, kNoBytes));
  return c.Figures(EarliestCut(c, kNoSeconds, std::vector<int64_t>(p, peak)));
}

// a + b, kNoBytes when it overflows.
int64_t AddBytes(int64_t a, int64_t b) {
  int64_t sum = 0;
  return __builtin_add_overflow(a, b, &sum) ? kNoBytes : sum;
}

// What a descent over cut points (DescendCuts) minimises: the larger figure first, then the
// smaller, lexicographically.
struct CutScore {
  double first = kNoSeconds;
  double second = 0.0;
  bool operator<(const CutScore& o) const {
    return first != o.first ? first < o.first : second < o.second;
  }
};

// The figures of a cut that a descent scores: per stage its seconds and bytes, per worker its
// bytes.
struct CutFigures {
  std::vector<double> seconds;
  std::vector<int64_t> stage_bytes;
  std::vector<int64_t> worker_bytes;
};

// The two goals of a descent. Fewest bytes: the fullest worker, then the sum of the workers'
// squares (which spreads the rest). Fastest within the budget: the slowest stage, then the sum
// of the stages' squares, among cuts whose every worker fits (none else is taken).
enum class Goal { kFewestBytes, kFastestWithinBudget };

std::optional<CutScore> ScoreCut(const Costs& c, Goal goal, const CutFigures& f) {
  CutScore score{0.0, 0.0};
  if (goal == Goal::kFewestBytes) {
    for (int64_t b : f.worker_bytes) {
      score.first = std::max(score.first, static_cast<double>(b));
      score.second += static_cast<double>(b) * static_cast<double>(b);
    }
    return score;
  }
  for (int64_t b : f.worker_bytes) {
    if (b > c.budget()) return std::nullopt;
  }
  for (double t : f.seconds) {
    score.first = std::max(score.first, t);
    score.second += t * t;
  }
  return score;
}

// A descent from `start` (a cut that the goal allows) over its cut points, by two moves, each
// taken when it lowers the goal's score: one cut point to its best place between its
// neighbours, and a run of consecutive cut points shifted by one layer together (which hands a
// layer along several stages, where single moves would first have to make another stage or
// worker the worst). Bounded: its moves cost at most kMaxDescentLayers layers (a score's pass
// over the stages and workers counted as theirs), so that a big problem ends quickly with the
// best cut by then. A local optimum: with kFewestBytes MinMaxPartition looks for a cut that
// fits when its per-stage caps find none (and for a smaller budget to name when none fits),
// with kFastestWithinBudget it speeds up a cut that fits.
constexpr int64_t kMaxDescentLayers = int64_t{1} << 22;

std::vector<LayerRange> DescendCuts(const Costs& c, Goal goal,
                                    const std::vector<LayerRange>& start) {
  const int n = c.num_layers(), p = c.num_stages();
  if (p == 1) return start;
  std::vector<int> at(p + 1);  // stage s holds [at[s], at[s + 1])
  for (int s = 0; s < p; ++s) at[s] = start[s].begin;
  at[p] = n;
  CutFigures now{std::vector<double>(p), std::vector<int64_t>(p),
                 std::vector<int64_t>(c.num_ranks(), 0)};
  for (int s = 0; s < p; ++s) {
    now.seconds[s] = c.StageSeconds(s, at[s], at[s + 1]);
    now.stage_bytes[s] = c.StageBytes(s, at[s], at[s + 1]);
    int64_t& w = now.worker_bytes[c.RankOf(s)];
    w = AddBytes(w, now.stage_bytes[s]);
  }
  const std::optional<CutScore> initial = ScoreCut(c, goal, now);
  if (!initial.has_value()) return start;
  CutScore current = *initial;
  int64_t costed = 0;
  // The figures with stages first..last at the cut points `moved` (at, some changed).
  CutFigures trial = now;
  const auto evaluate = [&](const std::vector<int>& moved, int first, int last) {
    trial.worker_bytes = now.worker_bytes;
    for (int s = first; s <= last; ++s) {
      trial.seconds[s] = c.StageSeconds(s, moved[s], moved[s + 1]);
      trial.stage_bytes[s] = c.StageBytes(s, moved[s], moved[s + 1]);
      int64_t& w = trial.worker_bytes[c.RankOf(s)];
      if (w != kNoBytes) w = AddBytes(w - now.stage_bytes[s], trial.stage_bytes[s]);
      costed += moved[s + 1] - moved[s];
    }
    costed += p + c.num_ranks();  // the score's pass
    return ScoreCut(c, goal, trial);
  };
  // Back to the current figures for stages first..last.
  const auto undo = [&](int first, int last) {
    for (int s = first; s <= last; ++s) {
      trial.seconds[s] = now.seconds[s];
      trial.stage_bytes[s] = now.stage_bytes[s];
    }
  };
  const auto take = [&](const std::vector<int>& moved, const CutScore& score) {
    at = moved;
    now = trial;
    current = score;
  };
  std::vector<int> moved;
  for (bool improved = true; improved && costed < kMaxDescentLayers;) {
    improved = false;
    // One cut point (between stages k - 1 and k) to its best place.
    for (int k = 1; k < p && costed < kMaxDescentLayers; ++k) {
      moved = at;
      int best_at = at[k];
      CutScore best = current;
      for (int x = at[k - 1] + 1; x < at[k + 1]; ++x) {
        if (x == at[k]) continue;
        moved[k] = x;
        const std::optional<CutScore> score = evaluate(moved, k - 1, k);
        undo(k - 1, k);
        if (score.has_value() && *score < best) {
          best = *score;
          best_at = x;
        }
      }
      if (best_at != at[k]) {
        moved[k] = best_at;
        evaluate(moved, k - 1, k);
        take(moved, best);
        improved = true;
      }
    }
    // Cut points a..b one layer earlier or later together.
    for (int a = 1; a < p && costed < kMaxDescentLayers; ++a) {
      for (int b = a + 1; b < p && costed < kMaxDescentLayers; ++b) {
        for (int d : {-1, 1}) {
          if (at[a] + d <= at[a - 1] || at[b] + d >= at[b + 1]) continue;
          moved = at;
          for (int k = a; k <= b; ++k) moved[k] += d;
          const std::optional<CutScore> score = evaluate(moved, a - 1, b);
          if (score.has_value() && *score < current) {
            take(moved, *score);
            improved = true;
          } else {
            undo(a - 1, b);
          }
        }
      }
    }
  }
  std::vector<LayerRange> ranges;
  for (int s = 0; s < p; ++s) ranges.push_back({at[s], at[s + 1]});
  return ranges;
}

// Rounds of MinMaxPartition's speed-up of a cut that fits.
constexpr int kMaxPolishRounds = 4;

// Per-stage caps under which every cut fits the budget, from a cut that fits: each stage
// its bytes in it plus a share of its worker's room under the budget, in proportion to them.
std::vector<int64_t> CapsWithin(const Costs& c, const Partition& fits) {
  std::vector<int64_t> caps(fits.stage_bytes);
  for (int s = 0; s < c.num_stages(); ++s) {
    const int64_t held = fits.worker_bytes[c.RankOf(s)];
    if (held <= 0) continue;
    const double room = static_cast<double>(c.budget() - held);  // >= 0: the cut fits
    caps[s] += static_cast<int64_t>(std::min(
        std::floor(room * static_cast<double>(fits.stage_bytes[s]) / static_cast<double>(held)),
        room));
  }
  return caps;
}

// No cut with one stage per worker fits: the smallest budget that would (exact), and where
// the cut that needs the least runs over.
absl::Status NoStageCutFits(const Costs& c, int64_t budget) {
  const int n = c.num_layers(), p = c.num_stages();
  const Partition lightest = Lightest(c);
  const int64_t needed =
      *std::max_element(lightest.stage_bytes.begin(), lightest.stage_bytes.end());
  std::vector<std::string> over;
  for (int s = 0; s < p; ++s) {
    if (lightest.stage_bytes[s] > budget) over.push_back(c.DescribeStage(s, lightest.ranges[s]));
  }
  absl::Status status = absl::ResourceExhaustedError(absl::StrCat(
      "partition: no cut of ", n, " layers into ", p, " stages fits the memory budget of ", budget,
      " bytes per worker; the smallest budget that fits is ", needed, " bytes, for stages ",
      RangesString(lightest.ranges), ", where ", absl::StrJoin(over, " and ")));
  status.SetPayload(kSmallestBudgetPayload, absl::Cord(absl::StrCat(needed)));
  return status;
}

// Whether C(a, b) (0 <= b <= a) is at most `limit` (never when it is 0 or less).
bool AtMostChoose(int a, int b, int64_t limit) {
  if (limit <= 0) return false;
  b = std::min(b, a - b);
  int64_t count = 1;
  for (int i = 1; i <= b; ++i) {
    // C(a - b + i, i) from C(a - b + i - 1, i - 1): exact at every step.
    if (__builtin_mul_overflow(count, a - b + i, &count)) return false;
    count /= i;
    if (count > limit) return false;
  }
  return true;
}

// Every cut tried, in increasing order of its cut points (C(n - 1, P - 1) of them): the best
// that fits (the least bottleneck, then the least fullest worker, then the earliest) and the
// cut of the least fullest worker (the earliest such).
struct EveryCut {
  std::optional<Partition> best;
  Partition least;
};

EveryCut TryEveryCut(const Costs& c) {
  const int n = c.num_layers(), p = c.num_stages();
  std::vector<int> at(p + 1);  // stage s holds [at[s], at[s + 1])
  for (int s = 0; s < p; ++s) at[s] = s;
  at[p] = n;
  const auto ranges = [&] {
    std::vector<LayerRange> r(p);
    for (int s = 0; s < p; ++s) r[s] = {at[s], at[s + 1]};
    return r;
  };
  std::vector<int64_t> worker(c.num_ranks());
  std::optional<std::pair<double, int64_t>> best;  // bottleneck, fullest worker
  int64_t least = kNoBytes;
  EveryCut out;
  for (bool first = true;; first = false) {
    std::fill(worker.begin(), worker.end(), 0);
    double slowest = 0.0;
    for (int s = 0; s < p; ++s) {
      slowest = std::max(slowest, c.StageSeconds(s, at[s], at[s + 1]));
      int64_t& w = worker[c.RankOf(s)];
      w = AddBytes(w, c.StageBytes(s, at[s], at[s + 1]));
    }
    const int64_t fullest = *std::max_element(worker.begin(), worker.end());
    if (first || fullest < least) {
      least = fullest;
      out.least = c.Figures(ranges());
    }
    if (fullest <= c.budget() && (!best.has_value() || std::make_pair(slowest, fullest) < *best)) {
      best = std::make_pair(slowest, fullest);
      out.best = c.Figures(ranges());
    }
    // The next cut points: the last that can move moves one layer on, those after it follow.
    int s = p - 1;
    while (s >= 1 && at[s] == n - (p - s)) --s;
    if (s < 1) break;
    ++at[s];
    for (int t = s + 1; t < p; ++t) at[t] = at[t - 1] + 1;
  }
  return out;
}

// The cuts of the fewest bytes on the fullest worker that MinMaxPartition knows, whatever the
// budget: the cut of the least peak stage (Lightest), and DescendCuts for the fewest bytes
// from it and from the fastest cut without a budget. None depends on the budget, so that a
// search within the budget a refusal names from them (NoWorkerCutFits) finds that cut again.
std::vector<Partition> FewestBytesCuts(const Costs& c) {
  const std::vector<int64_t> unlimited(c.num_stages(), kNoBytes);
  const Partition fastest = Cheapest(c, MinBottleneckSeconds(c, unlimited), unlimited);
  std::vector<Partition> cuts = {Lightest(c)};
  cuts.push_back(c.Figures(DescendCuts(c, Goal::kFewestBytes, cuts.front().ranges)));
  cuts.push_back(c.Figures(DescendCuts(c, Goal::kFewestBytes, fastest.ranges)));
  return cuts;
}

// How sure a refusal with several stages per worker is.
enum class Refusal {
  kExact,    // every cut was tried: the budget named is the least that fits
  kFound,    // the search ended: the budget named fits, the least may be smaller
  kStopped,  // the branch and bound stopped before it could say that no cut fits
};

// With several stages per worker, no cut fits: of `candidates` (every cut's least, or
// FewestBytesCuts), the one of the least fullest worker, whose bytes are named and are the
// payload.
absl::Status NoWorkerCutFits(const Costs& c, const std::vector<Partition>& candidates,
                             Refusal how) {
  const Partition& least = *std::min_element(candidates.begin(), candidates.end(),
                                             [](const Partition& x, const Partition& y) {
                                               return PeakWorkerBytes(x) < PeakWorkerBytes(y);
                                             });
  const int64_t needed = PeakWorkerBytes(least);
  std::vector<std::string> over;
  for (int r : WorkersOver(c, least)) over.push_back(c.DescribeWorker(r, least));
  absl::Status status = absl::ResourceExhaustedError(absl::StrCat(
      "partition: no cut of ", c.num_layers(), " layers into ", c.num_stages(), " stages on ",
      c.num_ranks(), " workers fits the memory budget of ", c.budget(),
      " bytes per worker (a worker's stages together)",
      how == Refusal::kStopped ? absl::StrCat(" among those tried (the search stops after ",
                                              kMaxWorkerBudgetNodes, " programmes)")
                               : "",
      how == Refusal::kExact ? "; the smallest budget that fits is "
                             : "; the least demanding found needs ",
      needed, " bytes, for stages ", RangesString(least.ranges), ", where ",
      absl::StrJoin(over, "; ")));
  status.SetPayload(kSmallestBudgetPayload, absl::Cord(absl::StrCat(needed)));
  return status;
}

}  // namespace

absl::StatusOr<Partition> MinMaxPartition(const PartitionProblem& problem) {
  ASSIGN_OR_RETURN(const Costs c, Costs::Make(problem));
  const int n = c.num_layers(), p = c.num_stages();
  if (n < p) {
    return absl::InvalidArgumentError(
        absl::StrCat("partition: cannot split ", n, " layers into ", p,
                     " stages: every stage needs at least one layer"));
  }
  // Where a budget couples stages and the cuts are few, every one is tried.
  if (c.Grouped() && problem.memory_budget_bytes > 0 &&
      AtMostChoose(n - 1, p - 1, problem.max_enumerated_cuts)) {
    EveryCut every = TryEveryCut(c);
    if (every.best.has_value()) return *std::move(every.best);
    return NoWorkerCutFits(c, {every.least}, Refusal::kExact);
  }
  // Every stage within the whole budget: exact with one stage per worker, and a relaxation
  // with several (a worker's stages together may exceed it).
  const std::vector<int64_t> root(p, c.budget());
  const double seconds = MinBottleneckSeconds(c, root);
  if (seconds == kNoSeconds) {
    if (!c.Grouped()) return NoStageCutFits(c, problem.memory_budget_bytes);
    return NoWorkerCutFits(c, FewestBytesCuts(c), Refusal::kFound);
  }
  // The per-stage optimum, when every worker fits it (always with one stage per worker).
  Partition cut = Cheapest(c, seconds, root);
  if (WorkersOver(c, cut).empty()) return cut;
  const int64_t budget = c.budget();
  int solved = 1;  // dynamic programmes run
  // A cut that fits, quickly: the stages of each worker over the budget capped at their
  // shares of it (in proportion to their bytes in the cut), and solved again.
  std::optional<Partition> best;
  {
    std::vector<int64_t> caps = root;
    for (;;) {
      const std::vector<int> over = WorkersOver(c, cut);
      if (over.empty()) {
        best = std::move(cut);
        break;
      }
      if (solved >= kMaxWorkerBudgetNodes) break;
      for (int r : over) {
        const double share = static_cast<double>(budget) / static_cast<double>(cut.worker_bytes[r]);
        for (int s : c.StagesOf(r)) {
          caps[s] = std::min<int64_t>(
              {caps[s], std::max<int64_t>(0, cut.stage_bytes[s] - 1),
               static_cast<int64_t>(std::floor(static_cast<double>(cut.stage_bytes[s]) * share))});
        }
      }
      ++solved;
      const double t = MinBottleneckSeconds(c, caps);
      if (t == kNoSeconds) break;
      cut = Cheapest(c, t, caps);
    }
  }
  // Else a cut that fits among those of the fewest bytes on the fullest worker.
  std::vector<Partition> fewest;  // computed only when needed
  if (!best.has_value()) {
    fewest = FewestBytesCuts(c);
    for (const Partition& light : fewest) {
      if (!best.has_value() && WorkersOver(c, light).empty()) best = light;
    }
  }
  // Then faster: cut points moved for the slowest stage among cuts that fit, and the fastest
  // cut under caps that keep every worker within the budget (the cut so found among them),
  // while that gains.
  for (int round = 0; best.has_value() && round < kMaxPolishRounds; ++round) {
    Partition moved = c.Figures(DescendCuts(c, Goal::kFastestWithinBudget, best->ranges));
    const std::vector<int64_t> caps = CapsWithin(c, moved);
    // (These programmes are bounded by kMaxPolishRounds, not counted against the branch and
    // bound's kMaxWorkerBudgetNodes, so that it explores what it did without them.)
    Partition capped = Cheapest(c, MinBottleneckSeconds(c, caps), caps);
    // (The caps' shares are rounded in floating point: the capped cut is checked as well.)
    const bool capped_fits = WorkersOver(c, capped).empty();
    Partition& faster =
        capped_fits && capped.bottleneck_seconds <= moved.bottleneck_seconds ? capped : moved;
    if (!(faster.bottleneck_seconds < best->bottleneck_seconds)) break;
    best = std::move(faster);
  }
  // Then best first over per-stage caps, for the optimum: a node's least bottleneck under its
  // caps bounds every cut within them. A cut that puts worker r over the budget has r's
  // stages s_1 < ... < s_k at x_1, ..., x_k, summing over it, so a cut that fits has a first
  // stage s_i below its x_i, and then the stages from s_i on within the budget less
  // x_1 + ... + x_(i-1): one child per i, and together they keep every cut that fits. Nodes
  // that cannot beat the cut in hand are dropped, so the first node whose cheapest cut fits,
  // or the cut in hand once none is left, is optimal.
  struct Node {
    double seconds;
    std::vector<int64_t> caps;
    bool operator>(const Node& o) const { return seconds > o.seconds; }
  };
  const auto beats = [&](double t) { return !best.has_value() || t < best->bottleneck_seconds; };
  std::priority_queue<Node, std::vector<Node>, std::greater<Node>> open;
  std::set<std::vector<int64_t>> seen = {root};
  if (beats(seconds)) open.push(Node{seconds, root});
  bool stopped = false;  // a node's children were left unsolved: the search is not exhaustive
  while (!open.empty() && !stopped) {
    Node node = open.top();
    open.pop();
    if (!beats(node.seconds)) break;
    Partition cut = Cheapest(c, node.seconds, node.caps);
    const std::vector<int> over = WorkersOver(c, cut);
    if (over.empty()) return cut;
    // The worker furthest over branches.
    const int r = *std::max_element(over.begin(), over.end(), [&](int x, int y) {
      return cut.worker_bytes[x] < cut.worker_bytes[y];
    });
    int64_t before = 0;  // x_1 + ... + x_(i-1)
    const std::vector<int> stages = c.StagesOf(r);
    for (size_t i = 0; i < stages.size(); ++i) {
      std::vector<int64_t> caps = node.caps;
      bool possible = true;
      for (size_t k = i; k < stages.size(); ++k) {
        caps[stages[k]] = std::min(caps[stages[k]], budget - before);
      }
      caps[stages[i]] = std::min(caps[stages[i]], cut.stage_bytes[stages[i]] - 1);
      for (size_t k = i; k < stages.size(); ++k) possible = possible && caps[stages[k]] >= 0;
      if (__builtin_add_overflow(before, cut.stage_bytes[stages[i]], &before)) before = kNoBytes;
      if (!possible || !seen.insert(caps).second) continue;
      if (solved >= kMaxWorkerBudgetNodes) {
        stopped = true;
        break;
      }
      ++solved;
      const double t = MinBottleneckSeconds(c, caps);
      if (t != kNoSeconds && beats(t)) open.push(Node{t, std::move(caps)});
    }
  }
  if (best.has_value()) return *std::move(best);
  return NoWorkerCutFits(c, fewest, stopped ? Refusal::kStopped : Refusal::kFound);
}

absl::StatusOr<Partition> EvaluatePartition(const PartitionProblem& problem,
                                            const std::vector<LayerRange>& ranges) {
  ASSIGN_OR_RETURN(const Costs c, Costs::Make(problem));
  const int n = c.num_layers(), p = c.num_stages();
  if (static_cast<int>(ranges.size()) != p) {
    return absl::InvalidArgumentError(
        absl::StrCat("partition: ", ranges.size(), " stage ranges for ", p, " stages"));
  }
  for (int s = 0; s < p; ++s) {
    const LayerRange& r = ranges[s];
    const int expected_begin = s == 0 ? 0 : ranges[s - 1].end;
    if (r.begin != expected_begin) {
      return absl::InvalidArgumentError(absl::StrCat(
          "partition: stage ", s, " holds layers ", RangeString(r), " but must begin at layer ",
          expected_begin, s == 0 ? "" : absl::StrCat(", where stage ", s - 1, " ends")));
    }
    if (r.end <= r.begin) {
      return absl::InvalidArgumentError(absl::StrCat("partition: stage ", s, " holds layers ",
                                                     RangeString(r),
                                                     ": every stage needs at least one layer"));
    }
    if (r.end > n) {
      return absl::InvalidArgumentError(absl::StrCat("partition: stage ", s, " holds layers ",
                                                     RangeString(r), " but the model has only ", n,
                                                     " layers"));
    }
  }
  if (ranges.back().end != n) {
    return absl::InvalidArgumentError(absl::StrCat("partition: the last stage ends at layer ",
                                                   ranges.back().end, " but the model has ", n,
                                                   " layers"));
  }
  Partition figures = c.Figures(ranges);
  std::vector<std::string> over;
  if (c.Grouped()) {
    for (int r : WorkersOver(c, figures)) over.push_back(c.DescribeWorker(r, figures));
  } else {
    for (int s = 0; s < p; ++s) {  // one stage per worker: its worker's bytes are the stage's
      if (figures.stage_bytes[s] > c.budget()) over.push_back(c.DescribeStage(s, ranges[s]));
    }
  }
  if (!over.empty()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "partition: ", absl::StrJoin(over, c.Grouped() ? "; " : " and "),
        ", over the memory budget of ", problem.memory_budget_bytes, " bytes per worker"));
  }
  return figures;
}

absl::StatusOr<std::vector<LayerRange>> RangesFromCuts(const std::vector<int>& cuts, int num_layers,
                                                       int num_stages) {
  if (num_stages < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("cuts: number of stages must be at least 1, got ", num_stages));
  }
  if (num_layers < num_stages) {
    return absl::InvalidArgumentError(
        absl::StrCat("cuts: cannot split ", num_layers, " layers into ", num_stages,
                     " stages: every stage needs at least one layer"));
  }
  std::vector<std::string> problems;
  if (static_cast<int>(cuts.size()) != num_stages - 1) {
    problems.push_back(absl::StrCat(
        num_stages, num_stages == 1 ? " stage needs " : " stages need ", num_stages - 1,
        num_stages == 2 ? " cut, got " : " cuts, got ", cuts.size(),
        cuts.empty() ? "" : absl::StrCat(" (layers ", absl::StrJoin(cuts, ", "), ")")));
  }
  for (size_t k = 0; k < cuts.size(); ++k) {
    if (cuts[k] <= 0 || cuts[k] >= num_layers) {
      problems.push_back(absl::StrCat(
          "cut ", k, " (layer ", cuts[k], ") is outside [1, ", num_layers - 1, "]",
          cuts[k] == 0 || cuts[k] == num_layers
              ? absl::StrCat(": it would leave stage ", cuts[k] == 0 ? k : k + 1, " empty")
              : ""));
    }
  }
  for (size_t k = 1; k < cuts.size(); ++k) {
    if (cuts[k] == cuts[k - 1]) {
      problems.push_back(absl::StrCat("cut ", k, " (layer ", cuts[k], ") repeats cut ", k - 1,
                                      ": it would leave stage ", k, " empty"));
    } else if (cuts[k] < cuts[k - 1]) {
      problems.push_back(absl::StrCat("cut ", k, " (layer ", cuts[k], ") comes before cut ", k - 1,
                                      " (layer ", cuts[k - 1],
                                      "): cuts must be strictly increasing"));
    }
  }
  if (!problems.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("cuts: ", absl::StrJoin(problems, "; "),
                     " (a cut is the first layer of a stage after the "
                     "first, for ",
                     num_layers, " layers into ", num_stages, " stages)"));
  }
  std::vector<LayerRange> ranges;
  int begin = 0;
  for (int cut : cuts) {
    ranges.push_back({begin, cut});
    begin = cut;
  }
  ranges.push_back({begin, num_layers});
  return ranges;
}

std::vector<int64_t> LayerParameterCounts(const v1::ModelSpec& model) {
  if (model.n_layer() < 0) return {};
  const int64_t d = model.d_model();
  const int64_t h = model.d_hidden() == 0 ? 4 * d : model.d_hidden();
  const int64_t v = model.vocab_size();
  int64_t embedding = 0, block = 0, head = 0;
  if (model.arch() == "gpt") {
    const int64_t t = model.seq_len();
    embedding = v * d + t * d;  // wte (V, C), wpe (seq_len, C)
    // ln_1, c_attn (3C, C) + (3C), attn.c_proj (C, C) + (C), ln_2, c_fc (H, C) + (H),
    // mlp.c_proj (C, H) + (C).
    block = 2 * d + (3 * d * d + 3 * d) + (d * d + d) + 2 * d + (h * d + h) + (d * h + d);
    head = 2 * d + v * d;  // ln_f and lm_head (V, C), or the head's own copy of a tied wte
  } else if (model.arch() == "llama") {
    const int64_t kv = model.n_head() > 0 ? d / model.n_head() * model.n_kv_head() : 0;
    embedding = v * d;  // embed_tokens (V, C); no learned positions
    // input_layernorm, q_proj (C, C), k_proj and v_proj (KV*hd, C), o_proj (C, C),
    // post_attention_layernorm, gate_proj and up_proj (H, C), down_proj (C, H); no biases.
    block = 2 * d + 2 * d * d + 2 * kv * d + 3 * h * d;
    head = d + v * d;  // model.norm and lm_head (V, C), or the head's own copy of a tied one
  } else if (model.arch() == "mlp_lm") {
    const int64_t k = model.context(), e = model.d_embed();
    embedding = v * e + k * e + (d * k * e + d);  // tok (V, E), pos (K, E), proj (D, K*E) + (D)
    block = 2 * d + (h * d + h) + (d * h + d);    // ln, fc1 (H, D) + (H), fc2 (D, H) + (D)
    head = 2 * d + (v * d + v);                   // ln, linear (V, D) + (V)
  } else {
    return {};
  }
  std::vector<int64_t> counts(model.n_layer() + 2, block);
  counts.front() = embedding;
  counts.back() = head;
  return counts;
}

int64_t ModelParameterCount(const v1::ModelSpec& model) {
  int64_t total = 0;
  for (int64_t n : LayerParameterCounts(model)) total += n;
  if (total > 0 && IsDecoder(model) && model.tie_embeddings()) {
    total -= int64_t{model.vocab_size()} * model.d_model();
  }
  return total;
}

double ModelFlopsPerToken(const v1::ModelSpec& model) {
  const std::vector<int64_t> params = LayerParameterCounts(model);
  if (params.size() < 2) return 0.0;
  double multiplied = 0.0;  // every layer but the embedding (a lookup, no multiply)
  for (size_t g = 1; g < params.size(); ++g) multiplied += static_cast<double>(params[g]);
  double flops = 6.0 * multiplied;
  if (IsDecoder(model)) {
    // Attention's scores and weighted sum: 2 T C multiply-adds per token and block, x 6.
    flops += 12.0 * model.n_layer() * static_cast<double>(model.d_model()) * model.seq_len();
  }
  return flops;
}

}  // namespace tandem
