#include "worker/model/optimizer.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace tandem::worker {

std::vector<OptimizerSlot> AdamW::Slots() {
  std::vector<OptimizerSlot> slots;
  for (size_t i = 0; i < state_.size(); ++i) {
    slots.push_back({i, "adam_m", &state_[i].m, nullptr, ranges_[i].begin});
    slots.push_back({i, "adam_v", &state_[i].v, nullptr, ranges_[i].begin});
    slots.push_back({i, "adam_step", nullptr, &state_[i].step});
  }
  return slots;
}

AdamW::AdamW(std::vector<Parameter*> params, const AdamWOptions& options,
             std::vector<ElementRange> shard)
    : params_(std::move(params)), options_(options) {
  state_.resize(params_.size());
  ranges_.resize(params_.size());
  for (size_t i = 0; i < params_.size(); ++i) {
    const size_t n = params_[i]->value.size();
    ranges_[i] = i < shard.size()
                     ? ElementRange{std::min(shard[i].begin, n),
                                    std::min(std::max(shard[i].begin, shard[i].end), n)}
                     : ElementRange{0, n};
    state_[i].m.assign(ranges_[i].size(), 0.0f);
    state_[i].v.assign(ranges_[i].size(), 0.0f);
  }
}

void AdamW::Step(float lr) {
  const float b1 = options_.beta1, b2 = options_.beta2;
  for (size_t i = 0; i < params_.size(); ++i) {
    Parameter& p = *params_[i];
    State& s = state_[i];
    ++s.step;
    const float c1 = 1.0f - static_cast<float>(std::pow(static_cast<double>(b1), s.step));
    const float c2 = 1.0f - static_cast<float>(std::pow(static_cast<double>(b2), s.step));
    const float wd = p.decay ? options_.weight_decay : 0.0f;
    const size_t begin = ranges_[i].begin;
    float* w = p.value.data() + begin;
    float* g = p.grad.data() + begin;
    for (size_t j = 0; j < ranges_[i].size(); ++j) {
      s.m[j] = b1 * s.m[j] + (1.0f - b1) * g[j];
      s.v[j] = b2 * s.v[j] + (1.0f - b2) * g[j] * g[j];
      const float mhat = s.m[j] / c1;
      const float vhat = s.v[j] / c2;
      w[j] -= lr * (mhat / (std::sqrt(vhat) + options_.eps) + wd * w[j]);
    }
    p.grad.Fill(0.0f);
  }
}

size_t AdamW::StateBytes() const {
  size_t n = 0;
  for (const State& s : state_) n += (s.m.size() + s.v.size()) * sizeof(float);
  return n;
}

Sgd::Sgd(std::vector<Parameter*> params, float weight_decay)
    : params_(std::move(params)), weight_decay_(weight_decay) {}

void Sgd::Step(float lr) {
  for (Parameter* p : params_) {
    const float wd = p->decay ? weight_decay_ : 0.0f;
    float* w = p->value.data();
    float* g = p->grad.data();
    for (size_t j = 0; j < p->value.size(); ++j) {
      w[j] -= lr * (g[j] + wd * w[j]);
      g[j] = 0.0f;
    }
  }
}

absl::StatusOr<std::unique_ptr<Optimizer>> MakeOptimizer(const v1::OptimizerSpec& spec,
                                                         std::vector<Parameter*> params,
                                                         std::vector<ElementRange> shard) {
  const std::string name = absl::AsciiStrToLower(spec.name());
  if (!(spec.weight_decay() >= 0.0f) || !std::isfinite(spec.weight_decay())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "optimizer.weight_decay must be a finite number >= 0, got ", spec.weight_decay()));
  }
  if (name == "sgd") return std::make_unique<Sgd>(std::move(params), spec.weight_decay());
  if (name != "adamw") {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer.name '", spec.name(), "' is not supported; expected adamw or sgd"));
  }
  for (auto [field, value] : {std::pair{"beta1", spec.beta1()}, {"beta2", spec.beta2()}}) {
    if (!(value >= 0.0f && value < 1.0f)) {
      return absl::InvalidArgumentError(
          absl::StrCat("optimizer.", field, " must be in [0, 1), got ", value));
    }
  }
  if (!(spec.eps() > 0.0f) || !std::isfinite(spec.eps())) {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer.eps must be a finite number > 0, got ", spec.eps()));
  }
  AdamWOptions options;
  options.beta1 = spec.beta1();
  options.beta2 = spec.beta2();
  options.eps = spec.eps();
  options.weight_decay = spec.weight_decay();
  return std::make_unique<AdamW>(std::move(params), options, std::move(shard));
}

}  // namespace tandem::worker
