#include "coordinator/profile_speed_check.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/pipeline_plan.h"

namespace tandem::coordinator {

int SpeedCheckLayer(const v1::ModelSpec& model) {
  const std::vector<int> layers = LayersToProfile(model);
  return layers.size() >= 3 ? layers[1] : layers.back();
}

absl::StatusOr<SpeedCheck> JudgeSpeed(const v1::ModelProfile& profile, int layer,
                                      const std::vector<v1::LayerProfile>& now) {
  const auto passes = [](const v1::LayerProfile& l) {
    return l.forward_seconds() + l.backward_seconds();
  };
  const v1::LayerProfile* then = nullptr;
  for (const v1::LayerProfile& l : profile.layers()) {
    if (l.layer() == layer) then = &l;
  }
  if (then == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("speed check: the profile has no layer ", layer));
  }
  if (!(passes(*then) > 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "speed check: layer ", layer, "'s forward + backward in the profile is ", passes(*then)));
  }
  std::vector<double> times;
  for (const v1::LayerProfile& l : now) {
    if (l.layer() != layer || !(passes(l) > 0) || !std::isfinite(passes(l))) {
      return absl::InvalidArgumentError(absl::StrCat("speed check: a worker timed layer ",
                                                     l.layer(), " at ", passes(l), " s, not layer ",
                                                     layer, " at > 0 s"));
    }
    times.push_back(passes(l));
  }
  if (times.empty()) return absl::InvalidArgumentError("speed check: no worker timed the layer");
  std::sort(times.begin(), times.end());
  const size_t n = times.size();
  SpeedCheck c;
  c.layer = layer;
  c.then_seconds = passes(*then);
  c.now_seconds = n % 2 == 1 ? times[n / 2] : (times[n / 2 - 1] + times[n / 2]) / 2;
  c.ratio = c.now_seconds / c.then_seconds;
  c.remeasure = c.ratio > 1 + kSpeedCheckMaxDrift || c.ratio < 1 / (1 + kSpeedCheckMaxDrift);
  c.scale = std::abs(c.ratio - 1) <= kSpeedCheckNoise ? 1.0 : c.ratio;
  return c;
}

v1::ModelProfile ScaleProfileCompute(v1::ModelProfile profile, double scale) {
  for (v1::LayerProfile& l : *profile.mutable_layers()) {
    l.set_forward_seconds(l.forward_seconds() * scale);
    l.set_backward_seconds(l.backward_seconds() * scale);
    l.set_backward_input_seconds(l.backward_input_seconds() * scale);
    l.set_backward_weight_seconds(l.backward_weight_seconds() * scale);
    l.set_recompute_seconds(l.recompute_seconds() * scale);
    l.set_apply_seconds(l.apply_seconds() * scale);
  }
  return profile;
}

std::string DescribeSpeedCheck(const SpeedCheck& c) {
  const std::string what =
      c.remeasure
          ? absl::StrFormat("beyond %.0f%%: measuring the profile again", 100 * kSpeedCheckMaxDrift)
      : c.scale == 1.0
          ? absl::StrFormat("within %.0f%%: the profile stands", 100 * kSpeedCheckNoise)
          : absl::StrFormat("priced at x%.3f", c.scale);
  std::string rounds;
  for (size_t i = 0; i < c.round_seconds.size(); ++i) {
    absl::StrAppend(&rounds, i == 0 ? "; rounds " : ", ",
                    absl::StrFormat("%.1f", 1000 * c.round_seconds[i]));
  }
  if (!rounds.empty()) absl::StrAppend(&rounds, " ms");
  return absl::StrFormat("layer %d ran %.1f ms against %.1f ms when profiled (x%.3f%s): %s",
                         c.layer, 1000 * c.now_seconds, 1000 * c.then_seconds, c.ratio, rounds,
                         what);
}

}  // namespace tandem::coordinator
