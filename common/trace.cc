#include "common/trace.h"

#include <algorithm>
#include <map>
#include <set>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/step_number.h"

namespace tandem {
namespace {

absl::Status Bad(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("step timeline: ", what));
}

bool IsSend(ActionKind kind) { return kind == v1::ACTION_SEND_F || kind == v1::ACTION_SEND_B; }
bool IsRecv(ActionKind kind) { return kind == v1::ACTION_RECV_F || kind == v1::ACTION_RECV_B; }

Action ActionOf(const TimelineSlice& s) { return {s.stage, s.kind, s.micro_batch}; }

// ------------------------------------------------------------------------------------------
// Trace-event JSON

std::string JsonString(absl::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          out += absl::StrFormat("\\u%04x", static_cast<unsigned char>(c));
        } else {
          out += c;
        }
    }
  }
  out += "\"";
  return out;
}

// Trace-event times are microseconds; ours are kept in nanoseconds (see JsonTrack) and printed
// as whole microseconds where they are.
std::string Micros(int64_t ns) {
  if (ns % 1000 == 0) return absl::StrCat(ns / 1000);
  return absl::StrFormat("%d.%03d", ns / 1000, ns % 1000);
}

// Stage s is process s + 1; its two threads get ids unique in the whole file, so that no
// viewer mistakes one stage's thread for another's.
int Pid(int stage) { return stage + 1; }
int Tid(int stage, bool compute) { return Pid(stage) * 100 + (compute ? 1 : 2); }

// A slice as written: start and duration in nanoseconds on the file's time axis.
struct JsonTime {
  int64_t ts_ns = 0;
  int64_t dur_ns = 0;
};

// The slices of one track in time order get strictly increasing starts: a slice that starts in
// the microsecond a zero-length one occupies (a send posted in under 1 us, then the next
// receive) is moved 1 ns later and shortened by as much. Viewers order slices of equal start
// longest first, which would nest the zero-length one inside its successor and bind its flow
// arrow to the wrong slice; 1 ns is far below the timings' resolution.
std::vector<JsonTime> JsonTimes(const StepTimeline& t, int64_t base_ns) {
  std::vector<JsonTime> out(t.slices.size());
  std::map<std::pair<int, bool>, std::vector<size_t>> tracks;
  for (size_t i = 0; i < t.slices.size(); ++i) {
    tracks[{t.slices[i].stage, IsComputeAction(t.slices[i].kind)}].push_back(i);
  }
  for (auto& [track, indices] : tracks) {
    std::sort(indices.begin(), indices.end(), [&](size_t a, size_t b) {
      const TimelineSlice &x = t.slices[a], &y = t.slices[b];
      return std::tie(x.start_us, x.rank, x.index) < std::tie(y.start_us, y.rank, y.index);
    });
    int64_t previous = -1;
    for (size_t i : indices) {
      const int64_t start = base_ns + t.slices[i].start_us * 1000;
      const int64_t end = base_ns + t.slices[i].end_us * 1000;
      const int64_t ts = std::max(start, previous + 1);
      out[i] = {ts, std::max<int64_t>(0, end - ts)};
      previous = ts;
    }
  }
  return out;
}

std::string ProcessName(int stage, int rank, const std::string& label) {
  return label.empty() ? absl::StrCat("stage ", stage, " (rank ", rank, ")")
                       : absl::StrCat("stage ", stage, " (rank ", rank, ", ", label, ")");
}

void AppendMetadata(const std::vector<StepTimeline>& timelines, std::vector<std::string>* out) {
  // Stages, ranks and labels from the first timeline that has each stage (and a label).
  std::vector<int> rank_of;
  std::vector<std::string> label_of;
  for (const StepTimeline& t : timelines) {
    for (size_t s = 0; s < t.stages.size(); ++s) {
      if (s >= rank_of.size()) {
        rank_of.push_back(t.stages[s].rank);
        label_of.push_back(t.stages[s].label);
      } else if (label_of[s].empty()) {
        label_of[s] = t.stages[s].label;
      }
    }
  }
  for (size_t s = 0; s < rank_of.size(); ++s) {
    const int stage = static_cast<int>(s);
    const int pid = Pid(stage);
    out->push_back(absl::StrCat(R"({"name":"process_name","ph":"M","ts":0,"pid":)", pid,
                                R"(,"args":{"name":)",
                                JsonString(ProcessName(stage, rank_of[s], label_of[s])), "}}"));
    out->push_back(absl::StrCat(R"({"name":"process_sort_index","ph":"M","ts":0,"pid":)", pid,
                                R"(,"args":{"sort_index":)", stage, "}}"));
    for (bool compute : {true, false}) {
      const int tid = Tid(stage, compute);
      out->push_back(absl::StrCat(R"({"name":"thread_name","ph":"M","ts":0,"pid":)", pid,
                                  R"(,"tid":)", tid, R"(,"args":{"name":")",
                                  compute ? "compute" : "communication", R"("}})"));
      out->push_back(absl::StrCat(R"({"name":"thread_sort_index","ph":"M","ts":0,"pid":)", pid,
                                  R"(,"tid":)", tid, R"(,"args":{"sort_index":)", compute ? 0 : 1,
                                  "}}"));
    }
  }
}

// Flow events: both ends carry one name and category, which with the id identify the flow.
std::string FlowEvent(char phase, ActionKind payload, int64_t id, int64_t ts_ns, int stage) {
  return absl::StrCat(R"({"name":")", payload == v1::ACTION_SEND_F ? "activation" : "gradient",
                      R"(","cat":"transfer","ph":")", std::string(1, phase), "\"",
                      phase == 'f' ? R"(,"bp":"e")" : "", R"(,"id":)", id, R"(,"ts":)",
                      Micros(ts_ns), R"(,"pid":)", Pid(stage), R"(,"tid":)", Tid(stage, false),
                      "}");
}

// One timeline's events, starting at `base_ns` on the file's axis, flow ids from *next_id.
void AppendStep(const StepTimeline& t, int64_t base_ns, int64_t* next_id,
                std::vector<std::string>* out) {
  const std::vector<JsonTime> times = JsonTimes(t, base_ns);
  std::map<size_t, const TransferLink*> link_of_send;
  for (const TransferLink& l : t.transfers) link_of_send[l.send] = &l;
  std::map<const TransferLink*, int64_t> id_of;
  for (size_t i = 0; i < t.slices.size(); ++i) {
    const TimelineSlice& s = t.slices[i];
    const bool compute = IsComputeAction(s.kind);
    const bool reduction = IsReductionAction(s.kind);
    out->push_back(absl::StrCat(
        R"({"name":")", ActionKindName(s.kind), reduction ? "" : absl::StrCat(s.micro_batch),
        R"(","cat":")", compute ? "compute" : (reduction ? "reduction" : "communication"),
        R"(","ph":"X","ts":)", Micros(times[i].ts_ns), R"(,"dur":)", Micros(times[i].dur_ns),
        R"(,"pid":)", Pid(s.stage), R"(,"tid":)", Tid(s.stage, compute), R"(,"args":{"stage":)",
        s.stage, R"(,"micro_batch":)", s.micro_batch, R"(,"kind":")", ActionKindName(s.kind),
        R"(","step":)", StepNumber(t.step), R"(,"rank":)", s.rank,
        s.device_us > 0 ? absl::StrCat(R"(,"device_us":)", s.device_us) : "", "}}"));
    // The flow starts right after its send, so that at an equal timestamp the viewer has
    // already opened the send and binds the flow to it.
    if (auto it = link_of_send.find(i); it != link_of_send.end()) {
      const int64_t id = (*next_id)++;
      id_of[it->second] = id;
      out->push_back(FlowEvent('s', MessageOf(ActionOf(s)).payload, id, times[i].ts_ns, s.stage));
    }
  }
  // Flow ends after every slice, each inside its receive and no earlier than its send (a flow
  // that ends before it starts is dropped by the viewer), unless the receive ended before the
  // send began, which only misaligned clocks produce.
  for (const TransferLink& l : t.transfers) {
    const TimelineSlice& recv = t.slices[l.recv];
    const JsonTime& r = times[l.recv];
    const int64_t last = std::max(r.ts_ns, r.ts_ns + r.dur_ns - 1);
    const int64_t ts = std::clamp(times[l.send].ts_ns, r.ts_ns, last);
    out->push_back(FlowEvent('f', MessageOf(ActionOf(recv)).payload, id_of.at(&l), ts, recv.stage));
  }
}

// ------------------------------------------------------------------------------------------
// SVG

std::string XmlText(absl::string_view s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string Px(double x) { return absl::StrFormat("%.1f", x); }
std::string Ms(int64_t us) { return absl::StrFormat("%.3f", static_cast<double>(us) / 1000.0); }

constexpr int kLeftPx = 170;  // stage labels
constexpr int kRightPx = 90;  // bubble figures
constexpr int kTopPx = 44;    // title and column header
constexpr int kRowPx = 38;    // per stage: compute bar, transfer lane, gap
constexpr int kBarTopPx = 5;  // compute bar within the row
constexpr int kBarPx = 22;
constexpr int kLaneTopPx = 30;  // transfer lane within the row
constexpr int kLanePx = 4;
constexpr int kMaxLabelChars = 26;

struct KindStyle {
  ActionKind kind;
  const char* fill;
  const char* legend;
};
constexpr KindStyle kStyles[] = {
    {v1::ACTION_F, "#4e79a7", "F forward"},
    {v1::ACTION_B, "#e15759", "B backward"},
    {v1::ACTION_I, "#f28e2b", "I input gradient"},
    {v1::ACTION_W, "#59a14f", "W weight gradient"},
    {v1::ACTION_SEND_F, "#6f6f6f", "send"},
    {v1::ACTION_RECV_F, "#bdbdbd", "receive (and wait)"},
    {v1::ACTION_R, "#76b7b2", "R recompute"},
};

const char* Fill(ActionKind kind) {
  if (IsSend(kind)) return kStyles[4].fill;
  if (IsRecv(kind)) return kStyles[5].fill;
  for (const KindStyle& k : kStyles) {
    if (k.kind == kind) return k.fill;
  }
  return "#000000";
}

// The axis step in microseconds: the smallest 1, 2 or 5 times a power of ten that gives at
// most 10 intervals.
int64_t TickStepUs(int64_t span_us) {
  for (int64_t decade = 1;; decade *= 10) {
    for (int64_t m : {1, 2, 5}) {
      if (span_us <= 10 * m * decade) return m * decade;
    }
  }
}

std::string Truncated(const std::string& s, size_t n) {
  return s.size() <= n ? s : s.substr(0, n - 3) + "...";
}

}  // namespace

absl::StatusOr<StepTimeline> BuildStepTimeline(const Schedule& lowered,
                                               const std::vector<v1::StepReport>& reports,
                                               const std::vector<int64_t>& clock_offsets_us,
                                               const std::vector<std::string>& stage_labels) {
  const Placement& placement = lowered.placement;
  if (absl::Status s = ValidatePlacement(placement); !s.ok()) return Bad(s.message());
  const int num_ranks = placement.num_ranks;
  const int num_stages = placement.num_stages();
  if (static_cast<int>(lowered.program.size()) != num_ranks) {
    return Bad(absl::StrCat("the schedule has ", lowered.program.size(), " action lists for ",
                            num_ranks, " ranks"));
  }
  if (!clock_offsets_us.empty() && static_cast<int>(clock_offsets_us.size()) != num_ranks) {
    return Bad(absl::StrCat(clock_offsets_us.size(), " clock offsets for ", num_ranks,
                            " ranks; give one per rank or none"));
  }
  if (!stage_labels.empty() && static_cast<int>(stage_labels.size()) != num_stages) {
    return Bad(absl::StrCat(stage_labels.size(), " stage labels for ", num_stages,
                            " stages; give one per stage or none"));
  }
  std::vector<const v1::StepReport*> by_rank(num_ranks, nullptr);
  for (const v1::StepReport& report : reports) {
    const int r = report.rank();
    if (r < 0 || r >= num_ranks) {
      return Bad(absl::StrCat("a report names rank ", r, ", but the schedule has ", num_ranks,
                              " ranks (0..", num_ranks - 1, ")"));
    }
    if (by_rank[r] != nullptr) return Bad(absl::StrCat("two reports from rank ", r));
    by_rank[r] = &report;
  }
  for (int r = 0; r < num_ranks; ++r) {
    if (by_rank[r] == nullptr) return Bad(absl::StrCat("no report from rank ", r));
    if (by_rank[r]->step() != by_rank[0]->step()) {
      return Bad(absl::StrCat("rank ", r, " reports step ", StepNumber(by_rank[r]->step()),
                              ", rank 0 step ", StepNumber(by_rank[0]->step()),
                              "; the reports must be of one step"));
    }
  }

  StepTimeline out;
  out.step = by_rank[0]->step();
  out.schedule = lowered.name;
  out.num_ranks = num_ranks;
  out.num_micro_batches = lowered.num_micro_batches;
  for (int r = 0; r < num_ranks; ++r) {
    const std::vector<Action>& actions = lowered.program[r];
    const int64_t offset = clock_offsets_us.empty() ? 0 : clock_offsets_us[r];
    std::vector<bool> seen(actions.size(), false);
    for (const v1::ActionTiming& t : by_rank[r]->timings()) {
      const int i = t.index();
      if (i < 0 || i >= static_cast<int>(actions.size())) {
        return Bad(absl::StrCat("rank ", r, " timing index ", i, " is outside its ", actions.size(),
                                " actions"));
      }
      const Action& a = actions[i];
      if (seen[i]) {
        return Bad(
            absl::StrCat("rank ", r, " reports action ", i, " (", ActionToString(a), ") twice"));
      }
      seen[i] = true;
      if (t.end_us() < t.start_us()) {
        return Bad(absl::StrCat("rank ", r, " action ", i, " (", ActionToString(a),
                                ") ends before it starts: start_us ", t.start_us(), ", end_us ",
                                t.end_us()));
      }
      if (a.stage < 0 || a.stage >= num_stages) {
        return Bad(absl::StrCat("rank ", r, " action ", i, " (", ActionToString(a),
                                ") names a stage outside the ", num_stages, " stages"));
      }
      out.slices.push_back({r, i, a.stage, a.kind, a.micro_batch, t.start_us() + offset,
                            t.end_us() + offset, IsComputeAction(a.kind) ? t.device_us() : 0});
    }
  }
  std::sort(out.slices.begin(), out.slices.end(),
            [](const TimelineSlice& a, const TimelineSlice& b) {
              return std::tie(a.rank, a.index) < std::tie(b.rank, b.index);
            });

  if (!out.slices.empty()) {
    int64_t first = out.slices[0].start_us, last = out.slices[0].end_us;
    for (const TimelineSlice& s : out.slices) {
      first = std::min(first, s.start_us);
      last = std::max(last, s.end_us);
    }
    out.origin_us = first;
    out.span_us = last - first;
    for (TimelineSlice& s : out.slices) {
      s.start_us -= first;
      s.end_us -= first;
    }
  }

  out.stages.resize(num_stages);
  for (int s = 0; s < num_stages; ++s) {
    out.stages[s].rank = placement.rank_of_stage[s];
    if (!stage_labels.empty()) out.stages[s].label = stage_labels[s];
  }
  // Per rank: when its last compute ended (a reduction's exposed part comes after it).
  std::vector<int64_t> compute_end(static_cast<size_t>(num_ranks), 0);
  for (const TimelineSlice& s : out.slices) {
    if (IsComputeAction(s.kind)) {
      compute_end[s.rank] = std::max(compute_end[s.rank], s.end_us);
    }
  }
  for (const TimelineSlice& s : out.slices) {
    StageTimes& st = out.stages[s.stage];
    if (IsComputeAction(s.kind)) {
      st.busy_us += s.busy_us();
    } else if (IsReductionAction(s.kind)) {
      st.reduce_us += s.duration_us();
      st.reduce_exposed_us +=
          std::max<int64_t>(0, s.end_us - std::max(s.start_us, compute_end[s.rank]));
    } else {
      st.comm_us += s.duration_us();
    }
  }
  for (StageTimes& st : out.stages) {
    st.idle_us = std::max<int64_t>(0, out.span_us - st.busy_us - st.comm_us - st.reduce_exposed_us);
    st.bubble = out.span_us > 0
                    ? 1.0 - static_cast<double>(st.busy_us) / static_cast<double>(out.span_us)
                    : 0.0;
  }

  // Each message's two ends; a send is linked once even if a (malformed) program repeats it.
  std::map<TransferMessage, size_t> send_of;
  for (size_t i = 0; i < out.slices.size(); ++i) {
    if (IsSend(out.slices[i].kind)) send_of.emplace(MessageOf(ActionOf(out.slices[i])), i);
  }
  for (size_t i = 0; i < out.slices.size(); ++i) {
    if (!IsRecv(out.slices[i].kind)) continue;
    auto it = send_of.find(MessageOf(ActionOf(out.slices[i])));
    if (it == send_of.end()) continue;
    out.transfers.push_back({it->second, i});
    send_of.erase(it);
  }
  std::sort(out.transfers.begin(), out.transfers.end(),
            [](const TransferLink& a, const TransferLink& b) { return a.send < b.send; });
  return out;
}

std::string TraceEventJson(const std::vector<StepTimeline>& timelines) {
  std::vector<std::string> events;
  AppendMetadata(timelines, &events);
  int64_t base_ns = 0;
  int64_t next_id = 1;
  for (const StepTimeline& t : timelines) {
    AppendStep(t, base_ns, &next_id, &events);
    base_ns += t.span_us * 1000;
  }
  return absl::StrCat("{\"traceEvents\":[\n", absl::StrJoin(events, ",\n"),
                      "\n],\n\"displayTimeUnit\":\"ms\"}\n");
}

std::string TraceEventJson(const StepTimeline& timeline) {
  return TraceEventJson(std::vector<StepTimeline>{timeline});
}

std::string GanttSvg(const StepTimeline& t, const GanttOptions& options) {
  const int chart_px = std::max(100, options.chart_width_px);
  const int num_stages = static_cast<int>(t.stages.size());
  const int width = kLeftPx + chart_px + kRightPx;
  const int axis_y = kTopPx + num_stages * kRowPx + 2;
  const int legend_y = axis_y + 38;
  const int height = legend_y + 12;
  const double scale = t.span_us > 0 ? static_cast<double>(chart_px) / t.span_us : 0.0;
  auto x_of = [&](int64_t us) { return kLeftPx + us * scale; };

  std::string out;
  absl::StrAppend(&out, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n",
                  "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"", width, "\" height=\"",
                  height, "\" viewBox=\"0 0 ", width, " ", height,
                  "\" font-family=\"sans-serif\">\n");
  absl::StrAppend(&out, "<rect x=\"0\" y=\"0\" width=\"", width, "\" height=\"", height,
                  "\" fill=\"#ffffff\"/>\n");
  const std::string title =
      !options.title.empty()
          ? options.title
          : absl::StrCat("step ", StepNumber(t.step), ": ", t.schedule, ", ", t.num_ranks,
                         " ranks, ", t.num_micro_batches, " micro-batches, ", Ms(t.span_us), " ms");
  absl::StrAppend(&out, "<text x=\"8\" y=\"22\" font-size=\"15\">", XmlText(title), "</text>\n");
  absl::StrAppend(&out, "<text x=\"", kLeftPx + chart_px + 10, "\" y=\"", kTopPx - 6,
                  "\" font-size=\"11\" fill=\"#555555\">bubble</text>\n");

  // Grid and axis.
  const int64_t step_us = TickStepUs(std::max<int64_t>(1, t.span_us));
  const int decimals = step_us >= 1000 ? 0 : step_us >= 100 ? 1 : step_us >= 10 ? 2 : 3;
  absl::StrAppend(&out, "<g class=\"axis\" font-size=\"10\" fill=\"#555555\">\n");
  for (int64_t us = 0; us <= t.span_us; us += step_us) {
    const std::string x = Px(x_of(us));
    absl::StrAppend(&out, "<line x1=\"", x, "\" y1=\"", kTopPx, "\" x2=\"", x, "\" y2=\"",
                    axis_y + 4, "\" stroke=\"#e4e4e4\"/>\n");
    absl::StrAppend(&out, "<text x=\"", x, "\" y=\"", axis_y + 16, "\" text-anchor=\"middle\">",
                    absl::StrFormat("%.*f", decimals, static_cast<double>(us) / 1000.0),
                    "</text>\n");
    if (t.span_us == 0) break;
  }
  absl::StrAppend(&out, "<line x1=\"", kLeftPx, "\" y1=\"", axis_y, "\" x2=\"", kLeftPx + chart_px,
                  "\" y2=\"", axis_y, "\" stroke=\"#888888\"/>\n");
  absl::StrAppend(&out, "<text x=\"", kLeftPx + chart_px + 10, "\" y=\"", axis_y + 16,
                  "\">ms</text>\n</g>\n");

  // One row per stage.
  for (int s = 0; s < num_stages; ++s) {
    const StageTimes& st = t.stages[s];
    const int y = kTopPx + s * kRowPx;
    absl::StrAppend(&out, "<g class=\"row\" id=\"stage-", s, "\">\n");
    absl::StrAppend(&out, "<rect x=\"", kLeftPx, "\" y=\"", y + kBarTopPx - 2, "\" width=\"",
                    chart_px, "\" height=\"", kLaneTopPx + kLanePx - kBarTopPx + 4,
                    "\" fill=\"#f6f6f6\"/>\n");
    absl::StrAppend(&out, "<text x=\"8\" y=\"", y + 17, "\" font-size=\"13\">stage ", s,
                    "</text>\n");
    const std::string sub = st.label.empty() ? absl::StrCat("rank ", st.rank)
                                             : absl::StrCat("rank ", st.rank, ", ",
                                                            Truncated(st.label, kMaxLabelChars));
    absl::StrAppend(&out, "<text x=\"8\" y=\"", y + 31, "\" font-size=\"10\" fill=\"#555555\">",
                    XmlText(sub), "</text>\n");
    absl::StrAppend(&out, "<text x=\"", kLeftPx + chart_px + 10, "\" y=\"", y + 21,
                    "\" font-size=\"12\">", absl::StrFormat("%.1f%%", 100.0 * st.bubble),
                    "</text>\n");
    absl::StrAppend(&out, "</g>\n");
  }

  // The actions, after the rows so that they are drawn on top.
  absl::StrAppend(&out, "<g class=\"actions\" font-size=\"11\" text-anchor=\"middle\">\n");
  for (const TimelineSlice& a : t.slices) {
    const bool compute = IsComputeAction(a.kind);
    const int y = kTopPx + a.stage * kRowPx + (compute ? kBarTopPx : kLaneTopPx);
    const double x = x_of(a.start_us);
    const double w = std::max(compute ? 0.5 : 1.0, a.duration_us() * scale);
    absl::StrAppend(&out, "<rect class=\"", compute ? "act " : "xfer ", ActionKindName(a.kind),
                    "\" x=\"", Px(x), "\" y=\"", y, "\" width=\"", Px(w), "\" height=\"",
                    compute ? kBarPx : kLanePx, "\" fill=\"", Fill(a.kind),
                    compute ? "\" stroke=\"#ffffff\" stroke-width=\"0.5" : "", "\"><title>",
                    ActionToString(ActionOf(a)), " (rank ", a.rank, "): ", Ms(a.start_us), " to ",
                    Ms(a.end_us), " ms</title></rect>\n");
    const std::string mb = absl::StrCat(a.micro_batch);
    if (compute && w >= 6.5 * mb.size() + 4) {
      absl::StrAppend(&out, "<text x=\"", Px(x + w / 2), "\" y=\"", y + 15, "\" fill=\"#ffffff\">",
                      mb, "</text>\n");
    }
  }
  absl::StrAppend(&out, "</g>\n");

  // Legend: the kinds present.
  std::set<ActionKind> present;
  bool sends = false, recvs = false;
  for (const TimelineSlice& a : t.slices) {
    present.insert(a.kind);
    sends = sends || IsSend(a.kind);
    recvs = recvs || IsRecv(a.kind);
  }
  absl::StrAppend(&out, "<g class=\"legend\" font-size=\"11\">\n");
  double lx = kLeftPx;
  for (const KindStyle& k : kStyles) {
    const bool shown = IsSend(k.kind) ? sends : IsRecv(k.kind) ? recvs : present.count(k.kind) > 0;
    if (!shown) continue;
    absl::StrAppend(&out, "<rect x=\"", Px(lx), "\" y=\"", legend_y - 10,
                    "\" width=\"12\" height=\"12\" fill=\"", k.fill, "\"/>\n");
    absl::StrAppend(&out, "<text x=\"", Px(lx + 17), "\" y=\"", legend_y, "\">", k.legend,
                    "</text>\n");
    lx += 17 + 6.5 * std::string(k.legend).size() + 18;
  }
  absl::StrAppend(&out, "</g>\n</svg>\n");
  return out;
}

}  // namespace tandem
