#include "coordinator/profile_speed_check.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/model_desc.h"
#include "common/pipeline_plan.h"

namespace tandem::coordinator {
namespace {

double Passes(const v1::LayerProfile& l) { return l.forward_seconds() + l.backward_seconds(); }

bool Positive(double seconds) { return seconds > 0 && std::isfinite(seconds); }

// Whether `k` weighs in `c`'s verdict and is priced at its own ratio: at least
// kSpeedCheckMinorShare of the model's forward + backward.
bool Major(const SpeedCheck& c, const SpeedCheckKind& k) {
  return k.count * k.then_seconds >= kSpeedCheckMinorShare * c.then_seconds;
}

}  // namespace

absl::Duration ProfileAge(const v1::ModelProfile& profile, absl::Time now) {
  return now - absl::FromUnixMillis(profile.created_unix_ms());
}

std::vector<int> SpeedCheckLayers(const v1::ModelSpec& model) { return LayersToProfile(model); }

absl::StatusOr<SpeedCheck> JudgeSpeed(const v1::ModelSpec& model, const v1::ModelProfile& profile,
                                      const std::vector<v1::LayerProfile>& now,
                                      const std::vector<double>& round_ratios) {
  const int n = NumLayers(model);
  if (profile.layers_size() != n) {
    return absl::InvalidArgumentError(absl::StrCat(
        "speed check: the profile has ", profile.layers_size(), " layers, the model ", n));
  }
  SpeedCheck c;
  for (int layer : SpeedCheckLayers(model)) {
    SpeedCheckKind k;
    k.layer = layer;
    for (int g = 0; g < n; ++g) k.count += ProfiledLayerOf(model, g) == layer ? 1 : 0;
    k.then_seconds = Passes(profile.layers(layer));
    if (!Positive(k.then_seconds)) {
      return absl::InvalidArgumentError(absl::StrCat("speed check: layer ", layer,
                                                     "'s forward + backward in the profile is ",
                                                     k.then_seconds, " s"));
    }
    c.kinds.push_back(k);
  }
  for (const v1::LayerProfile& l : now) {
    const auto kind = std::find_if(c.kinds.begin(), c.kinds.end(),
                                   [&](const SpeedCheckKind& k) { return k.layer == l.layer(); });
    if (kind == c.kinds.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("speed check: layer ", l.layer(), " was timed, but is not one it times"));
    }
    if (kind->now_seconds > 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("speed check: layer ", l.layer(), " was timed twice"));
    }
    if (!Positive(Passes(l))) {
      return absl::InvalidArgumentError(absl::StrCat("speed check: layer ", l.layer(),
                                                     " was timed at ", Passes(l), " s, not > 0"));
    }
    kind->now_seconds = Passes(l);
  }
  for (SpeedCheckKind& k : c.kinds) {
    if (k.now_seconds == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("speed check: no worker timed layer ", k.layer));
    }
    k.ratio = k.now_seconds / k.then_seconds;
    c.then_seconds += k.count * k.then_seconds;
    c.now_seconds += k.count * k.now_seconds;
  }
  c.ratio = c.now_seconds / c.then_seconds;
  const auto far = [](double ratio) {
    return ratio > 1 + kSpeedCheckMaxDrift || ratio < 1 / (1 + kSpeedCheckMaxDrift);
  };
  c.remeasure = far(c.ratio);
  for (const SpeedCheckKind& k : c.kinds) {
    if (Major(c, k)) c.remeasure = c.remeasure || far(k.ratio);
  }
  // Scaled when the merged ratio is beyond the noise and so is every round's, on its side: a
  // host whose speed jitters from one round to the next (rounds of x0.997, x1.090, x1.094
  // within 30 s, docs/benchmarks.md) has not drifted, and a job priced on such a reading is
  // priced on the jitter.
  const auto beyond = [&](double r) {
    return c.ratio > 1 ? r > 1 + kSpeedCheckNoise : r < 1 - kSpeedCheckNoise;
  };
  c.round_ratios = round_ratios;
  c.scaled = beyond(c.ratio) && std::all_of(round_ratios.begin(), round_ratios.end(), beyond);
  return c;
}

v1::ModelProfile ScaleProfileCompute(v1::ModelProfile profile, double s) {
  for (v1::LayerProfile& l : *profile.mutable_layers()) {
    l.set_forward_seconds(l.forward_seconds() * s);
    l.set_backward_seconds(l.backward_seconds() * s);
    l.set_backward_input_seconds(l.backward_input_seconds() * s);
    l.set_backward_weight_seconds(l.backward_weight_seconds() * s);
    l.set_recompute_seconds(l.recompute_seconds() * s);
    l.set_apply_seconds(l.apply_seconds() * s);
  }
  return profile;
}

std::string DescribeSpeedCheck(const SpeedCheck& c) {
  std::string out;
  for (const SpeedCheckKind& k : c.kinds) {
    absl::StrAppend(&out, out.empty() ? "" : ", ",
                    absl::StrFormat("layer %d %.1f/%.1f ms (x%.3f)", k.layer, 1000 * k.now_seconds,
                                    1000 * k.then_seconds, k.ratio));
  }
  absl::StrAppend(&out, absl::StrFormat("; the model x%.3f", c.ratio));
  for (size_t i = 0; i < c.round_ratios.size(); ++i) {
    absl::StrAppend(&out, i == 0 ? " (rounds " : ", ", absl::StrFormat("x%.3f", c.round_ratios[i]),
                    i + 1 == c.round_ratios.size() ? ")" : "");
  }
  std::string verdict;
  if (c.remeasure) {
    verdict =
        absl::StrFormat("beyond %.0f%%: measuring the profile again", 100 * kSpeedCheckMaxDrift);
  } else if (c.scaled) {
    verdict = absl::StrFormat("priced at x%.3f", c.ratio);
  } else if (std::abs(c.ratio - 1) <= kSpeedCheckNoise) {
    verdict = absl::StrFormat("within %.0f%%: the profile stands", 100 * kSpeedCheckNoise);
  } else {
    verdict = absl::StrFormat("a round within %.0f%%: the profile stands", 100 * kSpeedCheckNoise);
  }
  absl::StrAppend(&out, ": ", verdict);
  return out;
}

}  // namespace tandem::coordinator
