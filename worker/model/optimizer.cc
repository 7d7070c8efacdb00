#include "worker/model/optimizer.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "worker/model/simd.h"

namespace tandem::worker {
namespace {

struct AdamWConstants {
  float b1, b2, c1, c2, lr, eps, wd;
};

// One element of the update, in the order of operations every lane below keeps too.
inline void AdamWElement(const AdamWConstants& k, float& w, float g, float& m, float& v) {
  m = k.b1 * m + (1.0f - k.b1) * g;
  v = k.b2 * v + (1.0f - k.b2) * g * g;
  const float mhat = m / k.c1;
  const float vhat = v / k.c2;
  w -= k.lr * (mhat / (std::sqrt(vhat) + k.eps) + k.wd * w);
}

// AdamWElement over [0, n) with the gradients times `scale`, four lanes at a time, zeroing each
// gradient once it is used. Every operation is an IEEE single-precision one (no fused
// multiply-add), so each lane computes what the scalar element does, bit for bit.
void AdamWRange(const AdamWConstants& k, float scale, float* w, float* g, float* m, float* v,
                size_t n) {
  namespace simd = kernels::simd;
  const simd::F4 b1 = simd::Splat(k.b1), b2 = simd::Splat(k.b2);
  const simd::F4 one_b1 = simd::Splat(1.0f - k.b1), one_b2 = simd::Splat(1.0f - k.b2);
  const simd::F4 c1 = simd::Splat(k.c1), c2 = simd::Splat(k.c2), lr = simd::Splat(k.lr);
  const simd::F4 eps = simd::Splat(k.eps), wd = simd::Splat(k.wd), s = simd::Splat(scale);
  size_t j = 0;
  for (; j + simd::kLanes <= n; j += simd::kLanes) {
    const simd::F4 gj = simd::Load(g + j) * s;
    const simd::F4 mj = b1 * simd::Load(m + j) + one_b1 * gj;
    const simd::F4 vj = b2 * simd::Load(v + j) + one_b2 * gj * gj;
    const simd::F4 wj = simd::Load(w + j);
    simd::Store(m + j, mj);
    simd::Store(v + j, vj);
    simd::Store(w + j, wj - lr * ((mj / c1) / (simd::Sqrt(vj / c2) + eps) + wd * wj));
    simd::Store(g + j, simd::F4{});
  }
  for (; j < n; ++j) {
    AdamWElement(k, w[j], g[j] * scale, m[j], v[j]);
    g[j] = 0.0f;
  }
}

}  // namespace

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

void AdamW::Step(float lr, float grad_scale) {
  const float b1 = options_.beta1, b2 = options_.beta2;
  for (size_t i = 0; i < params_.size(); ++i) {
    Parameter& p = *params_[i];
    State& s = state_[i];
    ++s.step;
    const float c1 = 1.0f - static_cast<float>(std::pow(static_cast<double>(b1), s.step));
    const float c2 = 1.0f - static_cast<float>(std::pow(static_cast<double>(b2), s.step));
    const AdamWConstants k{
        b1, b2, c1, c2, lr, options_.eps, p.decay ? options_.weight_decay : 0.0f};
    const ElementRange r = ranges_[i];
    float* g = p.grad.data();
    AdamWRange(k, grad_scale, p.value.data() + r.begin, g + r.begin, s.m.data(), s.v.data(),
               r.size());
    // The gradient is zeroed whole: a shard's update leaves the other replicas' elements.
    std::fill(g, g + r.begin, 0.0f);
    std::fill(g + r.end, g + p.grad.size(), 0.0f);
  }
}

size_t AdamW::StateBytes() const {
  size_t n = 0;
  for (const State& s : state_) n += (s.m.size() + s.v.size()) * sizeof(float);
  return n;
}

Sgd::Sgd(std::vector<Parameter*> params, float weight_decay)
    : params_(std::move(params)), weight_decay_(weight_decay) {}

void Sgd::Step(float lr, float grad_scale) {
  for (Parameter* p : params_) {
    const float wd = p->decay ? weight_decay_ : 0.0f;
    float* w = p->value.data();
    float* g = p->grad.data();
    for (size_t j = 0; j < p->value.size(); ++j) {
      w[j] -= lr * (g[j] * grad_scale + wd * w[j]);
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
