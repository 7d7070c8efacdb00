// The timeline of a pipeline step as the workers measured it, and two ways to look at it.
//
// BuildStepTimeline() puts the per-action timings of one step's reports (one per rank, each on
// its worker's clock) on one clock and relative to the step's start, and measures per stage how
// long it computed, moved data and stood idle. TraceEventJson() writes timelines as Chrome
// trace-event JSON, which ui.perfetto.dev and chrome://tracing open: one process per stage,
// a compute and a communication thread in each, an arrow from every send to its receive.
// GanttSvg() draws one step as a self-contained SVG Gantt chart, deterministic to the byte so
// that it can be compared with a golden file.
//
// Pure code, no I/O: the coordinator supplies the reports and clock offsets and writes the
// files. Every function is thread-compatible (no shared state).
#ifndef TANDEM_COMMON_TRACE_H_
#define TANDEM_COMMON_TRACE_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/schedule.h"
#include "common/step_profile.h"
#include "tandem/v1/common.pb.h"

namespace tandem {

// One reported action on the common clock, in microseconds since the step's start.
struct TimelineSlice {
  int rank = 0;
  int index = 0;  // into the rank's lowered action list
  int stage = 0;
  ActionKind kind = v1::ACTION_F;
  int micro_batch = 0;
  int64_t start_us = 0;
  int64_t end_us = 0;
  // A compute action's time by the device's clock (ActionTiming.device_us), or 0.
  int64_t device_us = 0;

  int64_t duration_us() const { return end_us - start_us; }
  // What the action kept its device busy (ComputeBusyMicros).
  int64_t busy_us() const { return ComputeBusyMicros(start_us, end_us, device_us); }
};

// What one stage did during the step. busy + comm + idle = the step's span (idle is never
// negative), counted over the stage's own actions: on a rank with several stages, the time it
// spends on one stage is idle time of the others.
struct StageTimes {
  int rank = 0;
  std::string label;    // as given to BuildStepTimeline (e.g. the worker's address), or empty
  int64_t busy_us = 0;  // compute: F, B, I, W (by the device's clock where it has one)
  int64_t comm_us = 0;  // SEND_* and RECV_* (a receive's time is mostly waiting for its data)
  // Data parallelism: the stage's gradient reduction (REDUCE_GRAD, from its first bucket's
  // start to its last one's end), and the part of it after the last compute of the stage's
  // rank ended: what the step waited for, not hidden under compute.
  int64_t reduce_us = 0;
  int64_t reduce_exposed_us = 0;
  int64_t idle_us = 0;  // none of the above (exposed reduction excluded)
  double bubble = 0.0;  // 1 - busy / span: the share of the step the stage did not compute
};

// A send and the receive of the same message (MessageOf), as indices into StepTimeline::slices.
struct TransferLink {
  size_t send = 0;
  size_t recv = 0;
};

struct StepTimeline {
  int64_t step = 0;
  std::string schedule;  // Schedule::name
  int num_ranks = 0;
  int num_micro_batches = 0;
  int64_t origin_us = 0;                // the earliest action start, on the common clock
  int64_t span_us = 0;                  // from the earliest action start to the latest action end
  std::vector<TimelineSlice> slices;    // by rank, then action index
  std::vector<StageTimes> stages;       // one per stage
  std::vector<TransferLink> transfers;  // every message whose two ends were both reported
};

// The timeline of one step of `lowered` (a lowered schedule, as the workers ran it) from
// `reports`, one per rank in any order, matched by their `rank` field; their `timings` index
// into that rank's action list. A rank may report only some of its actions (the timeline then
// lacks the others). `clock_offsets_us[r]` is added to rank r's times to put every rank on one
// clock (empty: all zero). `stage_labels` names each stage in the renderings (empty: none).
//
// INVALID_ARGUMENT, naming the rank and where it applies the timing index, when: the schedule's
// program does not have one list per rank; there are not exactly one offset per rank or one
// label per stage (unless empty); a report names a rank outside [0, P) or the same rank as
// another, a rank has no report, two reports name different steps; a timing index is outside
// its rank's action list or appears twice; a timing ends before it starts.
absl::StatusOr<StepTimeline> BuildStepTimeline(const Schedule& lowered,
                                               const std::vector<v1::StepReport>& reports,
                                               const std::vector<int64_t>& clock_offsets_us = {},
                                               const std::vector<std::string>& stage_labels = {});

// The Chrome trace-event JSON object of `timelines`, laid end to end on one time axis (each
// step starts where the previous one's span ends; ts in microseconds, "displayTimeUnit": "ms").
// Stage s is process s + 1 ("stage s (rank r, label)", sorted by stage) with two threads,
// "compute" (F, B, I, W) and "communication" (SEND_*, RECV_*). Every action is an "X" event
// named kind + micro-batch ("F3", "SEND_B0") with args {stage, micro_batch, kind, step, rank};
// every TransferLink is a flow: an "s" event bound to the send and an "f" event ("bp": "e")
// bound to the receive, with an id unique in the file.
std::string TraceEventJson(const std::vector<StepTimeline>& timelines);
std::string TraceEventJson(const StepTimeline& timeline);

struct GanttOptions {
  // Drawn above the chart; empty: "step N: schedule, P ranks, M micro-batches, T ms".
  std::string title;
  // Width of the time axis in pixels, not counting the label and bubble margins; at least 100.
  int chart_width_px = 960;
};

// A self-contained SVG (no scripts, fonts or links) of one step: one row per stage, labelled
// with the stage, its rank and label; time across, with an axis in ms; one rect per compute
// action coloured by kind (F, B, I, W), with the micro-batch number inside where it fits, and
// transfers as a thin grey lane under it; idle time left empty; the stage's bubble in percent
// in the right margin; a legend of the kinds present. Hovering a rect shows its action and
// times (an SVG <title>). Numbers are printed with fixed precision, so the same timeline always
// gives the same bytes.
std::string GanttSvg(const StepTimeline& timeline, const GanttOptions& options = {});

}  // namespace tandem

#endif  // TANDEM_COMMON_TRACE_H_
