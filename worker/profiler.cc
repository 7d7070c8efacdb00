#include "worker/profiler.h"

#include <cblas.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <fstream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/model_desc.h"
#include "common/spec.h"
#include "common/status_macros.h"
#include "worker/model/kernels.h"
#include "worker/model/model_layers.h"
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

// The time of the compute call `f` makes on `compute`: the device's own where the backend
// measures one (as the executor reports each action, so that the plan and the measured steps
// share a clock), never more than the host's interval around the call; else the host's.
template <typename F>
double ComputeSeconds(const StageCompute& compute, F&& f) {
  const double host = Seconds(std::forward<F>(f));
  const int64_t us = compute.last_device_us(0);  // a profile runs one chunk
  return us > 0 ? std::min(host, static_cast<double>(us) * 1e-6) : host;
}

// The last-level cache's size: sysfs's (Linux), else sysconf's, else 32 MiB.
int64_t LastLevelCacheBytes() {
  for (const char* path : {"/sys/devices/system/cpu/cpu0/cache/index3/size",
                           "/sys/devices/system/cpu/cpu0/cache/index2/size"}) {
    std::ifstream f(path);
    std::string text;
    if (f >> text && !text.empty()) {
      int64_t n = 0;
      size_t i = 0;
      for (; i < text.size() && std::isdigit(static_cast<unsigned char>(text[i])); ++i) {
        n = n * 10 + (text[i] - '0');
      }
      const char unit = i < text.size() ? text[i] : ' ';
      n *= unit == 'K' ? 1024 : unit == 'M' ? 1024 * 1024 : 1;
      if (n > 0) return n;
    }
  }
  const long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
  return l3 > 0 ? l3 : int64_t{32} << 20;
}

// In a stage a layer's pass follows other layers' passes, which have displaced its weights and
// inputs from the cache; a layer timed over and over alone finds them there. Reading a buffer
// twice the last-level cache's size before each timed pass makes the profile see what the stage
// sees (measured: a 30-block SmolLM2 stage ran 2-5% slower than its layers timed warm).
class CacheFlusher {
 public:
  CacheFlusher()
      : buffer_(static_cast<size_t>(std::clamp<int64_t>(2 * LastLevelCacheBytes(), int64_t{8} << 20,
                                                        int64_t{512} << 20) /
                                    static_cast<int64_t>(sizeof(float))),
                1.0f) {}
  void Flush() {
    float sum = 0.0f;
    for (size_t i = 0; i < buffer_.size(); i += 16) sum += buffer_[i];  // one read per line
    sink_ = sum;
  }

 private:
  std::vector<float> buffer_;
  volatile float sink_ = 0.0f;
};

// Optimizer state per parameter element, in floats (AdamW: two moments; SGD: none).
int64_t OptimizerFloatsPerElement(const v1::OptimizerSpec& opt) {
  return opt.name() == "sgd" ? 0 : 2;
}

// A profile request, checked, and the job's micro-batch shape.
struct ProfileRequest {
  std::vector<int> layers;  // the global layers to profile (all when the request names none)
  int repeats = 3;
  int num_layers = 0;
  bool decoder = false;  // gpt or llama: (B, T) tokens, (B, T, C) activations
  int64_t b = 1;         // micro-batch size
  int64_t t = 1;         // positions per sequence (a decoder), else 1
  int64_t c = 1;         // d_model
  int64_t vocab = 1;     // token ids are below it
  int64_t k = 1;         // context of an mlp_lm sample
};

absl::StatusOr<ProfileRequest> CheckProfileRequest(const v1::JobSpec& spec,
                                                   const std::vector<int>& layers, int repeats) {
  const v1::ModelSpec& model = spec.model();
  ProfileRequest r;
  r.decoder = IsDecoder(model);
  r.num_layers = NumLayers(model);
  r.layers = layers;
  if (r.layers.empty()) {
    for (int g = 0; g < r.num_layers; ++g) r.layers.push_back(g);
  }
  r.repeats = repeats <= 0 ? 3 : std::min(repeats, 20);
  r.b = spec.pipeline().micro_batch_size();
  if (r.b < 1 || r.b > (1 << 20)) {
    return absl::InvalidArgumentError(
        absl::StrCat("profile: pipeline.micro_batch_size must be in [1, 2^20], got ", r.b));
  }
  r.c = model.d_model();
  r.vocab = model.vocab_size();
  RETURN_IF_ERROR(CheckModelSpec(model));
  if (r.decoder) {
    r.t = model.seq_len();
  } else {
    r.k = model.context();
  }
  return r;
}

// INVALID_ARGUMENT when `g` is not a layer of the model.
absl::Status CheckProfiledLayer(const ProfileRequest& r, int g) {
  if (g >= 0 && g < r.num_layers) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("profile: layer ", g, " is outside the model's ", r.num_layers, " layers"));
}

// A layer's token inputs of the job's shape: tokens and targets drawn uniformly from `rng`.
void DrawIds(const ProfileRequest& r, Rng& rng, IntTensor& tokens, IntTensor& targets) {
  tokens.Reset(r.decoder ? std::vector<int64_t>{r.b, r.t} : std::vector<int64_t>{r.b, r.k});
  for (size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] = static_cast<int32_t>(rng.Below(static_cast<uint64_t>(r.vocab)));
  }
  targets.Reset(r.decoder ? std::vector<int64_t>{r.b, r.t} : std::vector<int64_t>{r.b});
  for (size_t i = 0; i < targets.size(); ++i) {
    targets[i] = static_cast<int32_t>(rng.Below(static_cast<uint64_t>(r.vocab)));
  }
}

// The activation (and gradient) shape between layers.
std::vector<int64_t> ActivationShape(const ProfileRequest& r) {
  return r.decoder ? std::vector<int64_t>{r.b, r.t, r.c} : std::vector<int64_t>{r.b, r.c};
}

// The timed repeats of one layer: its passes (forward, backward, I, W) and its applies.
struct Timings {
  std::vector<double> fwd, bwd, in, wt, rec, apply;
  double timed = 0.0;  // seconds spent in timed passes so far

  // `r` < 0: the recomputation was not timed.
  void AddPass(double f, double b, double i, double w, double r = -1.0) {
    timed += f + b + i + w + std::max(0.0, r);
    fwd.push_back(f);
    bwd.push_back(b);
    in.push_back(i);
    wt.push_back(w);
    if (r >= 0) rec.push_back(r);
  }
  // The medians into `p`.
  void Report(v1::LayerProfile& p) const {
    p.set_apply_seconds(Median(apply));
    p.set_forward_seconds(Median(fwd));
    p.set_backward_seconds(Median(bwd));
    p.set_backward_input_seconds(Median(in));
    p.set_backward_weight_seconds(Median(wt));
    if (!rec.empty()) p.set_recompute_seconds(Median(rec));
  }
};

}  // namespace

absl::StatusOr<std::vector<v1::LayerProfile>> ProfileLayers(const v1::JobSpec& spec,
                                                            const std::vector<int>& layers,
                                                            int repeats, ProfilePasses passes) {
  const bool all = passes == ProfilePasses::kAll;
  ASSIGN_OR_RETURN(const ProfileRequest r, CheckProfileRequest(spec, layers, repeats));
  const int64_t b = r.b, t = r.t;
  const int64_t state_floats = 2 + OptimizerFloatsPerElement(spec.optimizer());
  std::vector<v1::LayerProfile> out;
  for (int g : r.layers) {
    RETURN_IF_ERROR(CheckProfiledLayer(r, g));
    ASSIGN_OR_RETURN(std::vector<std::unique_ptr<Layer>> built, BuildModelLayers(spec, g, g + 1));
    Layer& layer = *built[0];
    // Inputs of the job's shape: tokens and targets drawn uniformly, activations normal.
    Rng rng(MixSeed(spec.seed(), 0x9e3779b9u + static_cast<uint64_t>(g)));
    IntTensor tokens, targets;
    DrawIds(r, rng, tokens, targets);
    Tensor input(ActivationShape(r));
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
    Timings times;
    CacheFlusher cold;
    for (int rep = 0; rep <= r.repeats && times.timed < kProfileBudgetSeconds; ++rep) {
      SavedContext ctx;
      Tensor y, gin;
      absl::Status s;
      cold.Flush();
      const double f = Seconds([&] { s = layer.Forward(x, data, ctx, y); });
      RETURN_IF_ERROR(s);
      p.set_activation_bytes(static_cast<int64_t>(ctx.Bytes()));
      p.set_output_bytes(layer.is_loss() ? 0 : static_cast<int64_t>(y.bytes()));
      Tensor dout = layer.is_loss() ? Tensor() : Tensor(y.shape());
      for (size_t i = 0; i < dout.size(); ++i) dout[i] = 1e-3f * static_cast<float>(rng.Normal());
      // Full backward on a copy of the context, then the split pair on the original.
      SavedContext copy = all ? ctx : SavedContext();
      cold.Flush();
      const double bb = Seconds([&] { s = layer.Backward(dout, all ? copy : ctx, gin); });
      RETURN_IF_ERROR(s);
      if (!all) {
        if (rep > 0) times.AddPass(f, bb, 0.0, 0.0);  // the first is a warm-up
        continue;
      }
      cold.Flush();
      const double ii = Seconds([&] { s = layer.BackwardInput(dout, ctx, gin); });
      RETURN_IF_ERROR(s);
      cold.Flush();
      const double ww = Seconds([&] { s = layer.BackwardWeight(ctx); });
      RETURN_IF_ERROR(s);
      // The recomputation before a backward (pipeline.recompute full): the context again.
      SavedContext again;
      cold.Flush();
      const double rr = Seconds([&] { s = layer.RecomputeContext(x, data, again); });
      RETURN_IF_ERROR(s);
      if (rep > 0) times.AddPass(f, bb, ii, ww, rr);  // the first is a warm-up
    }
    // The once-per-step phase: the gradient-norm pass over the layer's gradients and the
    // optimizer update (which also zeroes them).
    std::vector<Parameter*> weights = layer.Parameters();
    ASSIGN_OR_RETURN(std::unique_ptr<Optimizer> opt, MakeOptimizer(spec.optimizer(), weights));
    for (int rep = 0; all && rep <= r.repeats; ++rep) {
      double norm = 0.0;
      const double a = Seconds([&] {
        // The worker's own passes (CpuStageCompute::GradientStats, then Apply).
        for (const Parameter* q : weights) {
          norm += kernels::SumOfSquares(q->grad.data(), static_cast<int64_t>(q->grad.size()));
        }
        opt->Step(1e-6f);
      });
      if (rep > 0) times.apply.push_back(a + (norm < 0 ? 1 : 0));  // (norm keeps the pass alive)
    }
    times.Report(p);
    out.push_back(std::move(p));
  }
  return out;
}

absl::StatusOr<std::vector<v1::LayerProfile>> ProfileLayersOn(const v1::JobSpec& spec,
                                                              const std::vector<int>& layers,
                                                              int repeats,
                                                              const ComputeFactory& make,
                                                              ProfilePasses passes) {
  const bool all = passes == ProfilePasses::kAll;
  ASSIGN_OR_RETURN(const ProfileRequest r, CheckProfileRequest(spec, layers, repeats));
  std::vector<v1::LayerProfile> out;
  for (int g : r.layers) {
    RETURN_IF_ERROR(CheckProfiledLayer(r, g));
    v1::StageProgram program;
    program.set_job_id("profile");
    program.set_num_ranks(1);
    program.set_num_stages(1);
    *program.mutable_spec() = spec;
    v1::StageChunk* chunk = program.add_chunks();
    chunk->set_layer_begin(g);
    chunk->set_layer_end(g + 1);
    ASSIGN_OR_RETURN(std::unique_ptr<StageCompute> built, make(program));
    StageCompute& compute = *built;
    const bool first = g == 0, last = g == r.num_layers - 1;
    Rng rng(MixSeed(spec.seed(), 0x9e3779b9u + static_cast<uint64_t>(g)));
    IntTensor tokens, targets;
    DrawIds(r, rng, tokens, targets);
    const MicroBatchData data{&tokens, &targets, r.b * r.t * 4};
    const std::vector<int64_t> shape = ActivationShape(r);

    v1::LayerProfile p;
    p.set_layer(g);
    p.set_parameter_count(compute.parameter_count());
    // The workspace apart: a stage of several layers holds one, not one per layer.
    const StageCompute::StaticMemory memory = compute.static_memory(0);
    p.set_static_bytes(memory.total() - memory.workspace);
    p.set_workspace_bytes(memory.workspace);
    Timings times;
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
      const double f = ComputeSeconds(
          compute, [&] { s = compute.Forward(0, mb, std::move(x), data, true, &y).status(); });
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
    for (int rep = 0; rep <= r.repeats && times.timed < kProfileBudgetSeconds; ++rep) {
      size_t saved = 0, output = 0;
      const double f = forward(0, &saved, &output);
      RETURN_IF_ERROR(s);
      p.set_activation_bytes(static_cast<int64_t>(saved));
      p.set_output_bytes(static_cast<int64_t>(output));
      StageBufferPtr gin;
      StageBufferPtr dout = grad();
      RETURN_IF_ERROR(s);
      const double bb = ComputeSeconds(
          compute, [&] { s = compute.Backward(0, 0, v1::ACTION_B, std::move(dout), &gin); });
      RETURN_IF_ERROR(s);
      if (!all) {
        if (rep > 0) times.AddPass(f, bb, 0.0, 0.0);  // the first is a warm-up
        continue;
      }
      forward(1, nullptr, nullptr);
      RETURN_IF_ERROR(s);
      dout = grad();
      RETURN_IF_ERROR(s);
      const double ii = ComputeSeconds(
          compute, [&] { s = compute.Backward(0, 1, v1::ACTION_I, std::move(dout), &gin); });
      RETURN_IF_ERROR(s);
      const double ww = ComputeSeconds(
          compute, [&] { s = compute.Backward(0, 1, v1::ACTION_W, nullptr, nullptr); });
      RETURN_IF_ERROR(s);
      if (rep > 0) times.AddPass(f, bb, ii, ww);  // the first is a warm-up
    }
    compute.DropSaved();
    // The once-per-step phase: the gradient norm and the optimizer update.
    for (int rep = 0; all && rep <= r.repeats; ++rep) {
      const double a = Seconds([&] {
        s = compute.GradientStats(/*count_tied=*/true).status();
        if (s.ok()) s = compute.Apply(1e-6f, 1.0f, /*skip=*/false);
      });
      RETURN_IF_ERROR(s);
      if (rep > 0) times.apply.push_back(a);
    }
    times.Report(p);
    out.push_back(std::move(p));
  }
  return out;
}

}  // namespace tandem::worker
