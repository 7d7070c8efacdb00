// Human-readable and JSON renderings of the coordinator's messages for the `tandem` CLI.
// Pure functions of their inputs (no I/O, no clock), except WatchPrinter, which writes to the
// stream it is given.
#ifndef TANDEM_COORDINATOR_CLI_FORMAT_H_
#define TANDEM_COORDINATOR_CLI_FORMAT_H_

#include <cstdint>
#include <deque>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "coordinator/cli/args.h"
#include "google/protobuf/message.h"
#include "tandem/v1/coordinator.pb.h"

namespace tandem::cli {

// A text table: columns separated by two spaces, each as wide as its widest cell.
class Table {
 public:
  explicit Table(std::vector<std::string> header);
  // Missing cells are blank; extra cells are dropped.
  void AddRow(std::vector<std::string> cells);
  // One line per row, header first, no trailing spaces.
  std::string Render() const;

 private:
  std::vector<std::vector<std::string>> rows_;
};

// The message as JSON with the proto field names (snake_case, like the job YAML) and every
// field printed, defaults included. `pretty`: indented over several lines; else one line.
absl::StatusOr<std::string> ToJson(const google::protobuf::Message& message, bool pretty);

// "2026-12-06 13:46:02" in the local time zone; "-" for 0 (not set).
std::string FormatTimestamp(int64_t unix_ms);
// "0:06", "12:34", "1:02:03"; "--:--" when unknown (negative or not finite).
std::string FormatEta(double seconds);
// 134515008 -> "134,515,008".
std::string WithThousands(int64_t n);
// "[#####---------------]" for done/total over `width` cells.
std::string ProgressBar(int64_t done, int64_t total, int width);
// Integer percentage, rounded down, clamped to [0, 100].
int Percent(int64_t done, int64_t total);

// "embedding", "block_0..block_2", "block_3..head" for the global layers [begin, end).
std::string LayerRangeName(const v1::ModelSpec& model, int begin, int end);

// StepSummary.step is the step's 0-based index (the one sent to the workers); the CLI shows
// the number of steps done, step + 1.
inline int64_t StepsDone(const v1::StepSummary& step) { return step.step() + 1; }

// Whether a job in `state` has ended (SUCCEEDED, FAILED or CANCELLED).
inline bool IsTerminal(v1::JobState state) {
  return state == v1::SUCCEEDED || state == v1::FAILED || state == v1::CANCELLED;
}

// The line printed per step by `tandem watch`, e.g.
// "step 12/50  loss 3.4512  142.1 ms/step  1802 tok/s  [####----------------]  24%  ETA 0:06".
// `seconds_per_step` (a recent average) sets the ETA; <= 0 means unknown.
std::string FormatStepLine(const v1::StepSummary& step, int64_t total_steps,
                           double seconds_per_step);

// "job j-1 (tiny): RUNNING", with ": reason" or the progress where there is one.
std::string FormatStateLine(const v1::JobEvent& event, const std::string& job_name);

std::string FormatJobsTable(const v1::ListJobsResponse& jobs);
std::string FormatWorkersTable(const v1::ListWorkersResponse& workers);
// One worker, a field per line: device, threads, peak, state, job and stage, heartbeat age,
// version, host, clock offset.
// A worker's peak FLOP/s with how and when it was measured ("-" when unknown).
std::string FormatPeak(const v1::WorkerInfo& w);
std::string FormatWorkerDetails(const v1::WorkerInfo& w);
// "3 workers: 2 idle, 1 busy, 0 lost"
std::string FormatWorkersSummary(const v1::ListWorkersResponse& workers);
// How many of the latest steps `tandem status JOB` lists (and asks the coordinator for).
inline constexpr int kRecentSteps = 10;
// Everything `tandem status JOB` shows; of the history, the last kRecentSteps steps.
std::string FormatJobDetails(const v1::Job& job);

// Renders a WatchJob stream: a line per step (redrawn in place when `live`, i.e. on a
// terminal) and a line per state change; or one JSON object per line per event.
class WatchPrinter {
 public:
  WatchPrinter(std::ostream& out, OutputFormat format, bool live);

  absl::Status OnEvent(const v1::JobEvent& event);
  // Ends a line left open by a live step line.
  void Finish();

  v1::JobState state() const { return state_; }
  const std::string& reason() const { return reason_; }

 private:
  static constexpr size_t kRateWindow = 10;

  void EndLiveLine();
  void PrintLine(const std::string& line);

  std::ostream& out_;
  const OutputFormat format_;
  const bool live_;
  bool line_open_ = false;
  std::string job_name_;
  int64_t total_steps_ = 0;
  v1::JobState state_ = v1::JOB_STATE_UNSPECIFIED;
  std::string reason_;
  std::deque<double> recent_step_seconds_;
};

}  // namespace tandem::cli

#endif  // TANDEM_COORDINATOR_CLI_FORMAT_H_
