// The coordinator's Prometheus metrics: what its job store and worker registry hold, as the
// text exposition format 0.0.4 (https://prometheus.io/docs/instrumenting/exposition_formats/).
//
// Nothing here serves HTTP (coordinator/http_server.h does). RenderMetrics() is a pure function
// of a MetricsSnapshot; CoordinatorMetrics takes snapshots from the JobStore and the
// WorkerRegistry at scrape time and keeps the one thing they do not: each job's running totals
// over its steps (the step-duration histogram, per-stage busy seconds), accumulated from the
// step summaries recorded since the previous scrape, so that they keep counting past the
// store's bounded history. Every other figure is read from the store or registry as it stands.
//
// Names follow Prometheus practice: a tandem_ prefix, base units (_seconds, _bytes, _ratio),
// _total on counters; labels job, stage, worker, state. docs/architecture.md lists them.
#ifndef TANDEM_COORDINATOR_METRICS_H_
#define TANDEM_COORDINATOR_METRICS_H_

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/job_store.h"
#include "coordinator/worker_registry.h"
#include "tandem/v1/coordinator.pb.h"

namespace tandem::coordinator {

inline constexpr char kExpositionContentType[] = "text/plain; version=0.0.4; charset=utf-8";

// Upper bounds (seconds) of the step-duration histogram's buckets; +Inf follows.
inline constexpr double kStepSecondsBuckets[] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1,
                                                 2.5,   5,    10,    25,   60,  120,  300};
inline constexpr size_t kNumStepSecondsBuckets = std::size(kStepSecondsBuckets);

// Writes one metric family at a time: HELP and TYPE, then its samples. Label values and help
// texts are escaped as the format requires; values are printed in the shortest form that
// reads back exactly (+Inf, -Inf, NaN as the format spells them).
class ExpositionWriter {
 public:
  using Labels = std::vector<std::pair<std::string, std::string>>;
  enum class Type { kCounter, kGauge, kHistogram };

  void Family(absl::string_view name, Type type, absl::string_view help);
  // A sample of the current family: `suffix` is appended to its name ("_bucket", "_sum").
  void Sample(const Labels& labels, double value, absl::string_view suffix = "");
  // A histogram's samples from per-bucket counts (not cumulative; one per bound, then the
  // count above the last bound), with `le` added to `labels`.
  void Histogram(const Labels& labels, const std::vector<double>& bounds,
                 const std::vector<int64_t>& counts, double sum);
  const std::string& text() const { return out_; }

 private:
  std::string family_;
  std::string out_;
};

// "1.5", "3", "+Inf", "NaN": the shortest decimal that parses back to `value`.
std::string FormatMetricValue(double value);

// One job's running totals over the steps fed to it (AddStep), in step order.
struct JobStepTotals {
  int64_t last_step = -1;              // the last step added
  int64_t steps = 0;                   // how many were added
  std::vector<int64_t> bucket_counts;  // per kStepSecondsBuckets bound, then above the last
  double seconds_sum = 0.0;
  std::vector<double> stage_busy_seconds;  // per stage, StepSummary.stage_busy_seconds summed
  bool has_last = false;
  v1::StepSummary last;  // the latest step added

  // Adds a step after last_step (an earlier one is ignored: it was counted already).
  void AddStep(const v1::StepSummary& step);
};

// What RenderMetrics shows about one job.
struct JobMetrics {
  v1::Job job;           // without history
  JobStepTotals totals;  // its steps so far
  // Per rank, the bytes sent and received over its steps (v1::JobTimings' totals).
  std::vector<int64_t> rank_bytes_sent;
  std::vector<int64_t> rank_bytes_received;
};

struct MetricsSnapshot {
  std::vector<JobMetrics> jobs;          // submission order
  std::vector<WorkerRecord> workers;     // registration order
  Clock::time_point now = Clock::now();  // for heartbeat ages
};

// The exposition of `snapshot` (see docs/architecture.md for every family).
std::string RenderMetrics(const MetricsSnapshot& snapshot);

// Takes snapshots of a JobStore and a WorkerRegistry, which must outlive it. Thread-safe.
class CoordinatorMetrics {
 public:
  CoordinatorMetrics(const JobStore* store, const WorkerRegistry* registry)
      : store_(store), registry_(registry) {}

  // The state now, with every job's totals brought up to date with the steps recorded since
  // the previous call.
  MetricsSnapshot Snapshot();
  // RenderMetrics(Snapshot()).
  std::string Render();

 private:
  const JobStore* const store_;
  const WorkerRegistry* const registry_;
  absl::Mutex mu_;
  std::map<std::string, JobStepTotals> totals_ ABSL_GUARDED_BY(mu_);  // by job id
};

}  // namespace tandem::coordinator

#endif  // TANDEM_COORDINATOR_METRICS_H_
