// The speed check of a cached layer profile. A machine's speed drifts with its load (other
// tenants of a VM's host, its clocks): on the 2-vCPU VM of docs/benchmarks.md the same job ran
// 4-8% slower for a quarter of an hour and then as fast as its profile again, so a profile
// measured minutes earlier priced every job of that spell several percent short. Before a job
// is planned on a profile older than the coordinator's --profile-speed-check age, one of its
// layers (a block) is timed again on the job's workers; the ratio of its forward + backward now
// to the profile's says how fast the machine runs now against then. Within the noise the
// profile stands; beyond it the job is priced on the profile's compute times x the ratio; far
// beyond it (the machine changed, not drifted) the profile is measured again.
//
// Pure: the timing itself is CheckProfileSpeed (coordinator/model_profiler.h).
#ifndef TANDEM_COORDINATOR_PROFILE_SPEED_CHECK_H_
#define TANDEM_COORDINATOR_PROFILE_SPEED_CHECK_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "tandem/v1/common.pb.h"
#include "tandem/v1/spec.pb.h"

namespace tandem::coordinator {

// A profile at least this old is checked (tandem-coordinator --profile-speed-check).
inline constexpr absl::Duration kDefaultSpeedCheckAfter = absl::Seconds(60);
// |ratio - 1| within this: the profile stands (one layer timed three times is good to about
// 1%; correcting by less would add that noise to every prediction).
inline constexpr double kSpeedCheckNoise = 0.02;
// Beyond this either way (ratio above 1.25 or below 1 / 1.25) the profile is measured again.
inline constexpr double kSpeedCheckMaxDrift = 0.25;
// Timed runs of the checked layer (after one warm-up; the median).
inline constexpr int kSpeedCheckRepeats = 3;

// The layer a speed check times: one block (the middle of LayersToProfile), else the last
// layer profiled.
int SpeedCheckLayer(const v1::ModelSpec& model);

// What a speed check found and what the planner does with it.
struct SpeedCheck {
  int layer = -1;
  double then_seconds = 0;  // the layer's forward + backward in the profile
  double now_seconds = 0;   // ... timed now: the median over the workers
  double ratio = 1;         // now / then
  double scale = 1;         // what the job is priced with: 1 within the noise, else ratio
  bool remeasure = false;   // off by more than kSpeedCheckMaxDrift: measure the profile again
  // Each round's median over the workers, in order (CheckProfileSpeed; empty: not in rounds).
  std::vector<double> round_seconds;
};

// Judges the workers' timings `now` of `layer` (each a LayerProfile of that layer, from any
// number of rounds; the median of them all) against `profile`'s. INVALID_ARGUMENT when the profile
// has no such layer, or either side has no positive forward + backward; when no worker timed it.
absl::StatusOr<SpeedCheck> JudgeSpeed(const v1::ModelProfile& profile, int layer,
                                      const std::vector<v1::LayerProfile>& now);

// `profile` with every layer's compute times (forward, backward, input and weight backward,
// recompute, optimizer apply) x `scale`; bytes, parameter counts and the link as they were.
v1::ModelProfile ScaleProfileCompute(v1::ModelProfile profile, double scale);

// One line for the log: e.g. "layer 1 ran 245.1 ms against 235.0 ms when profiled (x1.043;
// rounds 246.0, 244.2 ms): priced at x1.043".
std::string DescribeSpeedCheck(const SpeedCheck& check);

}  // namespace tandem::coordinator

#endif  // TANDEM_COORDINATOR_PROFILE_SPEED_CHECK_H_
