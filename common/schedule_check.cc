#include "common/schedule_check.h"

#include <algorithm>
#include <map>
#include <tuple>

#include "absl/strings/str_cat.h"

namespace tandem {
namespace {

using Kind = v1::ActionKind;

// The per-rank grid, one line per rank, with action (rank, index) in [brackets].
std::string Grid(const Program& p, int mark_rank, size_t mark_index) {
  std::string out;
  for (size_t r = 0; r < p.size(); ++r) {
    absl::StrAppend(&out, "\n  rank ", r, ":");
    for (size_t i = 0; i < p[r].size(); ++i) {
      const std::string a = ActionToString(p[r][i]);
      const bool marked = static_cast<int>(r) == mark_rank && i == mark_index;
      absl::StrAppend(&out, " ", marked ? "[" : "", a, marked ? "]" : "");
    }
    if (static_cast<int>(r) == mark_rank && mark_index >= p[r].size()) {
      absl::StrAppend(&out, " [end]");
    }
  }
  return out;
}

absl::Status Bad(const Program& p, int rank, size_t index, absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat("invalid schedule: rank ", rank, " action ", index, " (",
                   index < p[rank].size() ? ActionToString(p[rank][index]) : std::string("end"),
                   "): ", what, Grid(p, rank, index)));
}

// A message key: (kind of the send, destination stage, micro-batch).
using Key = std::tuple<int, int, int>;

}  // namespace

absl::Status ValidateProgram(const Program& p, int num_stages, int num_micro_batches) {
  const int P = num_stages, M = num_micro_batches;
  if (static_cast<int>(p.size()) != P) {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid schedule: ", p.size(), " rank lists for ", P, " stages"));
  }
  // Static checks per rank: stage, range, each compute action once, B after F.
  for (int r = 0; r < P; ++r) {
    std::vector<int> f(M, 0), b(M, 0);
    for (size_t i = 0; i < p[r].size(); ++i) {
      const Action& a = p[r][i];
      if (a.stage != r) return Bad(p, r, i, absl::StrCat("belongs to stage ", a.stage));
      if (a.micro_batch < 0 || a.micro_batch >= M) return Bad(p, r, i, "micro-batch out of range");
      if (a.kind == v1::ACTION_F && f[a.micro_batch]++ > 0) return Bad(p, r, i, "repeated forward");
      if (a.kind == v1::ACTION_B) {
        if (f[a.micro_batch] == 0) return Bad(p, r, i, "backward before its forward");
        if (b[a.micro_batch]++ > 0) return Bad(p, r, i, "repeated backward");
      }
      if (a.kind == v1::ACTION_I || a.kind == v1::ACTION_W) {
        return Bad(p, r, i, "split backward (I/W) is not supported by this release");
      }
    }
    for (int m = 0; m < M; ++m) {
      if (f[m] == 0 || b[m] == 0) {
        return Bad(p, r, p[r].size(),
                   absl::StrCat("micro-batch ", m, " has no ", f[m] == 0 ? "forward" : "backward"));
      }
    }
  }
  // Dynamic check: run the blocking semantics. A send is posted at once; a receive waits for
  // the matching send; a compute action needs its input (received, or local on the ends).
  std::vector<size_t> pc(P, 0);
  std::map<Key, int> posted;  // sends posted and not yet received
  std::vector<std::vector<bool>> has_input_f(P, std::vector<bool>(M, false));
  std::vector<std::vector<bool>> has_input_b(P, std::vector<bool>(M, false));
  std::vector<std::vector<bool>> done_f(P, std::vector<bool>(M, false));
  std::vector<std::vector<bool>> done_b(P, std::vector<bool>(M, false));
  for (int r = 0; r < P; ++r) {
    for (int m = 0; m < M; ++m) {
      has_input_f[r][m] = r == 0;
      has_input_b[r][m] = r == P - 1;
    }
  }
  bool progress = true;
  while (progress) {
    progress = false;
    for (int r = 0; r < P; ++r) {
      while (pc[r] < p[r].size()) {
        const Action& a = p[r][pc[r]];
        const int m = a.micro_batch;
        bool ran = true;
        switch (a.kind) {
          case v1::ACTION_SEND_F:
            if (r == P - 1) return Bad(p, r, pc[r], "the last stage has no next stage");
            if (!done_f[r][m]) return Bad(p, r, pc[r], "sends an activation not computed yet");
            ++posted[{v1::ACTION_SEND_F, r + 1, m}];
            break;
          case v1::ACTION_SEND_B:
            if (r == 0) return Bad(p, r, pc[r], "the first stage has no previous stage");
            if (!done_b[r][m]) return Bad(p, r, pc[r], "sends a gradient not computed yet");
            ++posted[{v1::ACTION_SEND_B, r - 1, m}];
            break;
          case v1::ACTION_RECV_F:
          case v1::ACTION_RECV_B: {
            const bool fwd = a.kind == v1::ACTION_RECV_F;
            if ((fwd && r == 0) || (!fwd && r == P - 1)) {
              return Bad(p, r, pc[r], "receives from a stage that does not exist");
            }
            auto it = posted.find({fwd ? v1::ACTION_SEND_F : v1::ACTION_SEND_B, r, m});
            if (it == posted.end() || it->second == 0) {
              ran = false;  // blocked until the peer posts its send
              break;
            }
            --it->second;
            (fwd ? has_input_f : has_input_b)[r][m] = true;
            break;
          }
          case v1::ACTION_F:
            if (!has_input_f[r][m]) return Bad(p, r, pc[r], "forward before its input arrives");
            done_f[r][m] = true;
            break;
          case v1::ACTION_B:
            if (!has_input_b[r][m]) return Bad(p, r, pc[r], "backward before its gradient arrives");
            done_b[r][m] = true;
            break;
          default:
            return Bad(p, r, pc[r], "unknown action kind");
        }
        if (!ran) break;
        ++pc[r];
        progress = true;
      }
    }
  }
  for (int r = 0; r < P; ++r) {
    if (pc[r] < p[r].size()) {
      return Bad(p, r, pc[r], "deadlock: this receive waits for a send that is never posted");
    }
  }
  for (const auto& [key, n] : posted) {
    if (n > 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "invalid schedule: a ", std::get<0>(key) == v1::ACTION_SEND_F ? "SEND_F" : "SEND_B",
          " of micro-batch ", std::get<2>(key), " to stage ", std::get<1>(key),
          " is never received", Grid(p, -1, 0)));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<SimulationResult> SimulateProgram(const Program& p, int num_stages,
                                                 int num_micro_batches, const ActionCosts& costs) {
  if (absl::Status s = ValidateProgram(p, num_stages, num_micro_batches); !s.ok()) return s;
  const int P = num_stages, M = num_micro_batches;
  std::vector<size_t> pc(P, 0);
  std::vector<double> clock(P, 0.0);
  std::map<Key, double> arrival;  // when a posted message becomes receivable
  std::vector<std::vector<double>> input_f(P, std::vector<double>(M, 0.0));
  std::vector<std::vector<double>> input_b(P, std::vector<double>(M, 0.0));
  SimulationResult out;
  out.busy.assign(P, 0.0);
  out.peak_live_micro_batches.assign(P, 0);
  std::vector<int> live(P, 0);
  bool progress = true;
  while (progress) {
    progress = false;
    for (int r = 0; r < P; ++r) {
      while (pc[r] < p[r].size()) {
        const Action& a = p[r][pc[r]];
        const int m = a.micro_batch;
        if (a.kind == v1::ACTION_RECV_F || a.kind == v1::ACTION_RECV_B) {
          const bool fwd = a.kind == v1::ACTION_RECV_F;
          auto it = arrival.find({fwd ? v1::ACTION_SEND_F : v1::ACTION_SEND_B, r, m});
          if (it == arrival.end()) break;  // not posted yet in this pass
          (fwd ? input_f : input_b)[r][m] = it->second;
          arrival.erase(it);
        } else if (a.kind == v1::ACTION_SEND_F) {
          arrival[{v1::ACTION_SEND_F, r + 1, m}] = clock[r] + costs.transfer;
        } else if (a.kind == v1::ACTION_SEND_B) {
          arrival[{v1::ACTION_SEND_B, r - 1, m}] = clock[r] + costs.transfer;
        } else {
          const bool fwd = a.kind == v1::ACTION_F;
          const double start = std::max(clock[r], fwd ? input_f[r][m] : input_b[r][m]);
          const double cost = fwd ? costs.forward : costs.backward;
          clock[r] = start + cost;
          out.busy[r] += cost;
          live[r] += fwd ? 1 : -1;
          out.peak_live_micro_batches[r] = std::max(out.peak_live_micro_batches[r], live[r]);
        }
        ++pc[r];
        progress = true;
      }
    }
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

}  // namespace tandem
