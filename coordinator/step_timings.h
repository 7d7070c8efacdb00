// The workers' per-action timings as the job store keeps them (v1::JobTimings), which steps
// it keeps, and the step timelines rebuilt from them for GetJobTrace.
//
// A step's record holds, per rank, only (action index, start, end) relative to the rank's
// first start: the actions themselves are the lowered program's, kept once per job. The store
// keeps the most recent steps and steps sampled evenly across the run (multiples of a stride
// that doubles when too many are kept), within a bound on the timings kept in all.
//
// Pure functions; thread-compatible.
#ifndef TANDEM_COORDINATOR_STEP_TIMINGS_H_
#define TANDEM_COORDINATOR_STEP_TIMINGS_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/schedule.h"
#include "common/trace.h"
#include "tandem/v1/coordinator.pb.h"

namespace tandem::coordinator {

// The lowered program in the record's form (one text action list per rank), and back.
v1::TraceProgram TraceProgramOf(const Schedule& lowered);
// INVALID_ARGUMENT naming the rank and the action that does not parse, or a placement that
// does not hold.
absl::StatusOr<Schedule> ScheduleOf(const v1::TraceProgram& program);

// One step's record from its reports (any order) and the ranks' clock offsets (one per rank,
// or empty for none), with each rank's bytes sent and received.
v1::StepTimings StepTimingsOf(int64_t step, const std::vector<v1::StepReport>& reports,
                              const std::vector<int64_t>& clock_offsets_us);
// The reports again, with only the step, rank and timings (as BuildStepTimeline reads them).
std::vector<v1::StepReport> ReportsOf(const v1::StepTimings& step);
size_t TimingCount(const v1::StepTimings& step);

struct TimingRetention {
  size_t recent = 20;   // the last steps recorded
  size_t sampled = 32;  // at most this many older steps, multiples of the stride
  // At most this many action timings in all (about 20 bytes each in memory and in JSON): with
  // bigger steps, fewer are kept, and at least the latest.
  size_t max_timings = size_t{1} << 19;
};

// Adds `step` to `timings` (replacing any records of that step or later, which a rerun
// supersedes) and drops what `policy` no longer keeps. Records stay in ascending step order.
// Every step adds its ranks' bytes to the per-rank byte totals, whether it is kept or not.
void KeepStepTimings(v1::JobTimings* timings, v1::StepTimings step,
                     const TimingRetention& policy = {});

std::vector<int64_t> KeptSteps(const v1::JobTimings& timings);

// "0, 4, 8, 12..31": ascending steps with runs of three or more written as first..last.
std::string FormatSteps(const std::vector<int64_t>& steps);

// The timeline of one kept step (BuildStepTimeline over the record, its offsets and the
// program); `stage_labels` one per stage, or empty.
absl::StatusOr<StepTimeline> TimelineOf(const Schedule& lowered, const v1::StepTimings& step,
                                        const std::vector<std::string>& stage_labels = {});

// Documents bigger than this are refused (the CLI's channel takes 64 MiB).
inline constexpr size_t kMaxTraceBytes = size_t{32} << 20;

// GetJobTrace's answer for `job` from its kept `timings`: the steps `request` selects (its
// step; else every kept step in [first_step, last_step]; else the latest kept), rendered as
// trace-event JSON or an SVG Gantt chart with a stage labelled by its worker, plus the steps
// shown and all kept steps. NOT_FOUND names the job when nothing is kept yet, or the step or
// range that is not kept together with the kept steps; INVALID_ARGUMENT for a selection with
// both a step and a range, half a range, or an SVG of several steps; RESOURCE_EXHAUSTED when
// the document would pass `max_bytes`; DATA_LOSS when a record does not fit the program.
absl::StatusOr<v1::GetJobTraceResponse> RenderJobTrace(const v1::Job& job,
                                                       const v1::JobTimings& timings,
                                                       const v1::GetJobTraceRequest& request,
                                                       size_t max_bytes = kMaxTraceBytes);

}  // namespace tandem::coordinator

#endif  // TANDEM_COORDINATOR_STEP_TIMINGS_H_
