#include "worker/profiler.h"

#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/model_desc.h"
#include "worker/model/gpt.h"
#include "worker/model/mlp_lm.h"
#include "worker/model/optimizer.h"
#include "worker/model/random.h"

namespace tandem::worker {
namespace {

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

template <typename F>
double Seconds(F&& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Optimizer state per parameter element, in floats (AdamW: two moments; SGD: none).
int64_t OptimizerFloatsPerElement(const v1::OptimizerSpec& opt) {
  return opt.name() == "sgd" ? 0 : 2;
}

}  // namespace

absl::StatusOr<std::vector<v1::LayerProfile>> ProfileLayers(const v1::JobSpec& spec,
                                                            const std::vector<int>& layers,
                                                            int repeats) {
  const v1::ModelSpec& model = spec.model();
  const bool gpt = model.arch() == "gpt";
  const int num_layers = NumLayers(model);
  std::vector<int> which = layers;
  if (which.empty()) {
    for (int g = 0; g < num_layers; ++g) which.push_back(g);
  }
  repeats = repeats <= 0 ? 3 : std::min(repeats, 20);
  const int64_t b = spec.pipeline().micro_batch_size();
  if (b < 1 || b > (1 << 20)) {
    return absl::InvalidArgumentError(
        absl::StrCat("profile: pipeline.micro_batch_size must be in [1, 2^20], got ", b));
  }
  int64_t t = 1, c = model.d_model(), vocab = model.vocab_size(), k = 1;
  if (gpt) {
    absl::StatusOr<GptConfig> cfg = GptConfigFromSpec(model);
    if (!cfg.ok()) return cfg.status();
    t = cfg->seq_len;
    c = cfg->d_model;
    vocab = cfg->vocab;
  } else {
    absl::StatusOr<MlpLmConfig> cfg = MlpLmConfigFromSpec(model);
    if (!cfg.ok()) return cfg.status();
    k = model.context();
  }
  const int64_t state_floats = 2 + OptimizerFloatsPerElement(spec.optimizer());
  std::vector<v1::LayerProfile> out;
  for (int g : which) {
    if (g < 0 || g >= num_layers) {
      return absl::InvalidArgumentError(
          absl::StrCat("profile: layer ", g, " is outside the model's ", num_layers, " layers"));
    }
    absl::StatusOr<std::vector<std::unique_ptr<Layer>>> built =
        gpt ? BuildGptLayers(model, spec.seed(), g, g + 1)
            : BuildMlpLmLayers(model, spec.seed(), g, g + 1);
    if (!built.ok()) return built.status();
    Layer& layer = *(*built)[0];
    // Inputs of the job's shape: tokens and targets drawn uniformly, activations normal.
    Rng rng(MixSeed(spec.seed(), 0x9e3779b9u + static_cast<uint64_t>(g)));
    IntTensor tokens(gpt ? std::vector<int64_t>{b, t} : std::vector<int64_t>{b, k});
    for (size_t i = 0; i < tokens.size(); ++i) {
      tokens[i] = static_cast<int32_t>(rng.Below(static_cast<uint64_t>(vocab)));
    }
    IntTensor targets(gpt ? std::vector<int64_t>{b, t} : std::vector<int64_t>{b});
    for (size_t i = 0; i < targets.size(); ++i) {
      targets[i] = static_cast<int32_t>(rng.Below(static_cast<uint64_t>(vocab)));
    }
    Tensor input(gpt ? std::vector<int64_t>{b, t, c} : std::vector<int64_t>{b, c});
    for (size_t i = 0; i < input.size(); ++i) input[i] = static_cast<float>(rng.Normal());
    MicroBatchData data{&tokens, &targets, b * t * 4};
    const Tensor none;
    const Tensor& x = layer.reads_tokens() ? none : input;

    v1::LayerProfile p;
    p.set_layer(g);
    int64_t params = 0;
    for (const Parameter* q : layer.Parameters()) params += static_cast<int64_t>(q->value.size());
    p.set_parameter_count(params);
    p.set_static_bytes(params * state_floats * static_cast<int64_t>(sizeof(float)));
    std::vector<double> fwd, bwd, in, wt;
    double timed = 0.0;  // seconds spent in timed repeats so far
    for (int r = 0; r <= repeats && timed < kProfileBudgetSeconds; ++r) {
      SavedContext ctx;
      Tensor y, gin;
      absl::Status s;
      const double f = Seconds([&] { s = layer.Forward(x, data, ctx, y); });
      if (!s.ok()) return s;
      p.set_activation_bytes(static_cast<int64_t>(ctx.Bytes()));
      p.set_output_bytes(layer.is_loss() ? 0 : static_cast<int64_t>(y.bytes()));
      Tensor dout = layer.is_loss() ? Tensor() : Tensor(y.shape());
      for (size_t i = 0; i < dout.size(); ++i) dout[i] = 1e-3f * static_cast<float>(rng.Normal());
      // Full backward on a copy of the context, then the split pair on the original.
      SavedContext copy = ctx;
      const double bb = Seconds([&] { s = layer.Backward(dout, copy, gin); });
      if (!s.ok()) return s;
      const double ii = Seconds([&] { s = layer.BackwardInput(dout, ctx, gin); });
      if (!s.ok()) return s;
      const double ww = Seconds([&] { s = layer.BackwardWeight(ctx); });
      if (!s.ok()) return s;
      if (r == 0) continue;  // warm-up
      timed += f + bb + ii + ww;
      fwd.push_back(f);
      bwd.push_back(bb);
      in.push_back(ii);
      wt.push_back(ww);
    }
    // The once-per-step phase: the gradient-norm pass over the layer's gradients and the
    // optimizer update (which also zeroes them).
    std::vector<Parameter*> weights = layer.Parameters();
    absl::StatusOr<std::unique_ptr<Optimizer>> opt = MakeOptimizer(spec.optimizer(), weights);
    if (!opt.ok()) return opt.status();
    std::vector<double> apply;
    for (int r = 0; r <= repeats; ++r) {
      double norm = 0.0;
      const double a = Seconds([&] {
        for (const Parameter* q : weights) {
          for (float x : q->grad.vec()) norm += static_cast<double>(x) * x;
        }
        (*opt)->Step(1e-6f);
      });
      if (r > 0) apply.push_back(a + (norm < 0 ? 1 : 0));  // (norm keeps the pass alive)
    }
    p.set_apply_seconds(Median(apply));
    p.set_forward_seconds(Median(fwd));
    p.set_backward_seconds(Median(bwd));
    p.set_backward_input_seconds(Median(in));
    p.set_backward_weight_seconds(Median(wt));
    out.push_back(std::move(p));
  }
  return out;
}

absl::StatusOr<std::vector<v1::LayerProfile>> ProfileLayersOn(const v1::JobSpec& spec,
                                                              const std::vector<int>& layers,
                                                              int repeats,
                                                              const ComputeFactory& make) {
  const v1::ModelSpec& model = spec.model();
  const bool gpt = model.arch() == "gpt";
  const int num_layers = NumLayers(model);
  std::vector<int> which = layers;
  if (which.empty()) {
    for (int g = 0; g < num_layers; ++g) which.push_back(g);
  }
  repeats = repeats <= 0 ? 3 : std::min(repeats, 20);
  const int64_t b = spec.pipeline().micro_batch_size();
  if (b < 1 || b > (1 << 20)) {
    return absl::InvalidArgumentError(
        absl::StrCat("profile: pipeline.micro_batch_size must be in [1, 2^20], got ", b));
  }
  const int64_t t = gpt ? model.seq_len() : 1, k = gpt ? model.seq_len() : model.context();
  const int64_t c = model.d_model(), vocab = model.vocab_size();
  std::vector<v1::LayerProfile> out;
  for (int g : which) {
    if (g < 0 || g >= num_layers) {
      return absl::InvalidArgumentError(
          absl::StrCat("profile: layer ", g, " is outside the model's ", num_layers, " layers"));
    }
    v1::StageProgram program;
    program.set_job_id("profile");
    program.set_num_ranks(1);
    program.set_num_stages(1);
    *program.mutable_spec() = spec;
    v1::StageChunk* chunk = program.add_chunks();
    chunk->set_layer_begin(g);
    chunk->set_layer_end(g + 1);
    absl::StatusOr<std::unique_ptr<StageCompute>> built = make(program);
    if (!built.ok()) return built.status();
    StageCompute& compute = **built;
    const bool first = g == 0, last = g == num_layers - 1;
    Rng rng(MixSeed(spec.seed(), 0x9e3779b9u + static_cast<uint64_t>(g)));
    IntTensor tokens(gpt ? std::vector<int64_t>{b, t} : std::vector<int64_t>{b, k});
    for (size_t i = 0; i < tokens.size(); ++i) {
      tokens[i] = static_cast<int32_t>(rng.Below(static_cast<uint64_t>(vocab)));
    }
    IntTensor targets(gpt ? std::vector<int64_t>{b, t} : std::vector<int64_t>{b});
    for (size_t i = 0; i < targets.size(); ++i) {
      targets[i] = static_cast<int32_t>(rng.Below(static_cast<uint64_t>(vocab)));
    }
    const MicroBatchData data{&tokens, &targets, b * t * 4};
    const std::vector<int64_t> shape =
        gpt ? std::vector<int64_t>{b, t, c} : std::vector<int64_t>{b, c};

    v1::LayerProfile p;
    p.set_layer(g);
    p.set_parameter_count(compute.parameter_count());
    p.set_static_bytes(compute.static_bytes(0));
    std::vector<double> fwd, bwd, in, wt;
    double timed = 0.0;
    absl::Status s;
    // One forward and its backward: B on micro-batch 0, I then W on micro-batch 1.
    auto forward = [&](int mb, size_t* saved, size_t* output) -> double {
      StageBufferPtr x, y;
      if (!first) {
        absl::StatusOr<StageBufferPtr> buf = compute.NewBuffer(shape);
        if (!buf.ok()) {
          s = buf.status();
          return 0.0;
        }
        x = *std::move(buf);
      }
      const double f =
          Seconds([&] { s = compute.Forward(0, mb, std::move(x), data, true, &y).status(); });
      if (saved != nullptr) *saved = compute.SavedBytes(0, mb);
      if (output != nullptr) *output = y == nullptr ? 0 : y->bytes();
      return f;
    };
    auto grad = [&]() -> StageBufferPtr {
      if (last) return nullptr;
      absl::StatusOr<StageBufferPtr> buf = compute.NewBuffer(shape);
      if (!buf.ok()) {
        s = buf.status();
        return nullptr;
      }
      return *std::move(buf);
    };
    for (int r = 0; r <= repeats && timed < kProfileBudgetSeconds; ++r) {
      size_t saved = 0, output = 0;
      const double f = forward(0, &saved, &output);
      if (!s.ok()) return s;
      p.set_activation_bytes(static_cast<int64_t>(saved));
      p.set_output_bytes(static_cast<int64_t>(output));
      StageBufferPtr gin;
      StageBufferPtr dout = grad();
      if (!s.ok()) return s;
      const double bb =
          Seconds([&] { s = compute.Backward(0, 0, v1::ACTION_B, std::move(dout), &gin); });
      if (!s.ok()) return s;
      forward(1, nullptr, nullptr);
      if (!s.ok()) return s;
      dout = grad();
      if (!s.ok()) return s;
      const double ii =
          Seconds([&] { s = compute.Backward(0, 1, v1::ACTION_I, std::move(dout), &gin); });
      if (!s.ok()) return s;
      const double ww =
          Seconds([&] { s = compute.Backward(0, 1, v1::ACTION_W, nullptr, nullptr); });
      if (!s.ok()) return s;
      if (r == 0) continue;  // warm-up
      timed += f + bb + ii + ww;
      fwd.push_back(f);
      bwd.push_back(bb);
      in.push_back(ii);
      wt.push_back(ww);
    }
    compute.DropSaved();
    // The once-per-step phase: the gradient norm and the optimizer update.
    std::vector<double> apply;
    for (int r = 0; r <= repeats; ++r) {
      const double a = Seconds([&] {
        s = compute.GradientStats(/*count_tied=*/true).status();
        if (s.ok()) s = compute.Apply(1e-6f, 1.0f, /*skip=*/false);
      });
      if (!s.ok()) return s;
      if (r > 0) apply.push_back(a);
    }
    p.set_apply_seconds(Median(apply));
    p.set_forward_seconds(Median(fwd));
    p.set_backward_seconds(Median(bwd));
    p.set_backward_input_seconds(Median(in));
    p.set_backward_weight_seconds(Median(wt));
    out.push_back(std::move(p));
  }
  return out;
}

double MeasurePeakFlops() {
  constexpr int n = 768;
  std::vector<float> a(size_t{n} * n, 0.5f), b(size_t{n} * n, 0.25f), c(size_t{n} * n, 0.0f);
  double best = 0.0;
  for (int r = 0; r < 4; ++r) {
    const double t = Seconds([&] {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(),
                  n, 0.0f, c.data(), n);
    });
    if (r > 0 && t > 0) best = std::max(best, 2.0 * n * n * n / t);
  }
  return best;
}

}  // namespace tandem::worker
