// The speed check of a cached layer profile. A machine's speed drifts with its load (other
// tenants of a VM's host, its clocks): on the 2-vCPU VM of docs/benchmarks.md the same job ran
// 4-8% slower for a quarter of an hour and then as fast as its profile again, so a profile
// measured minutes earlier priced every job of that spell several percent short. Before a job
// is planned on a profile older than the coordinator's --profile-speed-check age, every layer
// kind the profile timed (embedding, a block, the head: LayersToProfile) has its forward and
// backward timed again on the job's workers, at once, in rounds, as the profile timed them. The
// model's ratio weighs each kind's time now over its time then by the kind's share of the
// model (a 1 x 2 GPT-2 job spends some 45% of its compute in the head's GEMM, which a block
// alone does not speak for). The profile stands within the noise, and also when the rounds
// disagree on the side of it (the host jitters rather than drifts); when every round is beyond
// the noise on one side, the job is priced on the profile's compute times x the model's ratio,
// one factor for all layers, so that a check's noise never moves a cut; far beyond it (the
// machine changed, not drifted) the profile is measured again.
//
// Pure: the timing itself is CheckProfileSpeed (coordinator/model_profiler.h).
#ifndef TANDEM_COORDINATOR_PROFILE_SPEED_CHECK_H_
#define TANDEM_COORDINATOR_PROFILE_SPEED_CHECK_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "tandem/v1/common.pb.h"
#include "tandem/v1/spec.pb.h"

namespace tandem::coordinator {

// A profile at least this old is checked (tandem-coordinator --profile-speed-check).
inline constexpr absl::Duration kDefaultSpeedCheckAfter = absl::Seconds(60);
// The model's |ratio - 1| within this, or any round's: the profile stands (a round is good to
// a few percent on a jittery host; correcting by less would add that noise to every
// prediction).
inline constexpr double kSpeedCheckNoise = 0.02;
// The model's ratio or a major kind's beyond this either way (above 1.25 or below 1 / 1.25):
// the machine changed rather than drifted, and the profile is measured again.
inline constexpr double kSpeedCheckMaxDrift = 0.25;
// A kind under this share of the model's forward + backward (a GPT's embedding: a gather of a
// few ms) is minor: it cannot call for a new profile, since its own ratio is mostly timer
// noise and moves nothing.
inline constexpr double kSpeedCheckMinorShare = 0.05;
// Timed runs of each checked layer (after one warm-up; the median; fewer for a layer whose
// passes outlast the worker's profile budget).
inline constexpr int kSpeedCheckRepeats = 3;

// One layer kind of a speed check.
struct SpeedCheckKind {
  int layer = -1;           // the profiled layer that stands for the kind (LayersToProfile)
  int count = 0;            // the model's layers it stands for
  double then_seconds = 0;  // its forward + backward in the profile
  double now_seconds = 0;   // ... timed now (merged over the workers and rounds)
  double ratio = 1;         // now / then
};

// What a speed check found and what the planner does with it.
struct SpeedCheck {
  std::vector<SpeedCheckKind> kinds;  // in LayersToProfile's order
  double then_seconds = 0;  // the model's forward + backward (each layer once) in the profile
  double now_seconds = 0;   // ... at the kinds' times now
  double ratio = 1;         // the model's now / then
  // The model's ratio in each round, in order (CheckProfileSpeed; empty: not in rounds).
  std::vector<double> round_ratios;
  bool scaled = false;     // ratio and every round beyond kSpeedCheckNoise: priced at x ratio
  bool remeasure = false;  // beyond kSpeedCheckMaxDrift (above): measure the profile again
};

// How long before `now` `profile` was measured (ModelProfile.created_unix_ms; decades for one
// that carries no time): what a speed check is due by.
absl::Duration ProfileAge(const v1::ModelProfile& profile, absl::Time now = absl::Now());

// Whether a profile measured `age` ago is speed-checked before it prices a job or a plan, with
// checks due at `after` (--profile-speed-check; infinite: never).
inline bool SpeedCheckDue(absl::Duration age, absl::Duration after) {
  return after != absl::InfiniteDuration() && age >= after;
}

// The layers a speed check times: those the profile timed (LayersToProfile).
std::vector<int> SpeedCheckLayers(const v1::ModelSpec& model);

// Judges `now` (one LayerProfile per layer of SpeedCheckLayers, each the workers' timings
// merged as a profile merges them) against `profile` (the model's expanded profile), with the
// model's ratio in each round the timings came from (`round_ratios`, kept in the result; none:
// the merged ratio alone decides). INVALID_ARGUMENT when a layer is missing, unknown or timed
// twice in `now`, the profile is not the model's, or either side has no positive, finite
// forward + backward for a layer.
absl::StatusOr<SpeedCheck> JudgeSpeed(const v1::ModelSpec& model, const v1::ModelProfile& profile,
                                      const std::vector<v1::LayerProfile>& now,
                                      const std::vector<double>& round_ratios = {});

// `profile` with every layer's compute times (forward, backward, input and weight backward,
// recompute, optimizer apply) x `scale`; bytes, parameter counts and the link as they were.
v1::ModelProfile ScaleProfileCompute(v1::ModelProfile profile, double scale);

// One line for the log: e.g. "layer 0 2.1/2.0 ms (x1.050), layer 1 245.1/235.0 ms (x1.043),
// layer 7 1210.0/1100.0 ms (x1.100); the model x1.081 (rounds x1.079, x1.083): priced at
// x1.081".
std::string DescribeSpeedCheck(const SpeedCheck& check);

}  // namespace tandem::coordinator

#endif  // TANDEM_COORDINATOR_PROFILE_SPEED_CHECK_H_
