#include "worker/backend/cuda/gpu_llama_layout.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <string>
#include <tuple>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/limits.h"
#include "common/status_macros.h"
#include "worker/backend/cuda/gpu_llama_buffers.h"
#include "worker/model/random.h"

namespace tandem::worker::cuda {
namespace gpu_llama_internal {

LayoutIndex IndexOf(const GpuLlamaConfig& cfg) {
  const GpuStageShape sh = ShapeOf(cfg);
  LayoutIndex ix;
  ix.b0 = sh.b0;
  ix.block_base = sh.embedding ? 1 : 0;
  ix.norm = ix.block_base + static_cast<size_t>(sh.blocks()) * kTensorsPerBlock;
  ix.head_w = cfg.tie_embeddings && sh.embedding ? ix.embed : ix.norm + 1;
  return ix;
}

GpuStageMemory PlanValidated(const GpuLlamaConfig& cfg, const std::vector<GpuTensor>& layout) {
  static_assert(sizeof(Bf16Bits) == sizeof(uint16_t));
  GpuStageMemory m = ParameterMemory(layout);
  Carver act(0), work(0), split(0);
  Activations<Bf16Bits> a;
  Workspace<Bf16Bits> w;
  WeightGradInputs g;
  CarveActivations(cfg, act, &a);
  CarveWorkspace(cfg, work, &w);
  CarveWeightGradInputs(cfg, split, &g);
  m.activations = act.used();
  m.workspace = work.used();
  m.weight_grad_inputs = split.used();
  return m;
}

}  // namespace gpu_llama_internal

namespace {

using gpu_llama_internal::IndexOf;
using gpu_llama_internal::LayoutIndex;
using gpu_llama_internal::ShapeOf;
using enum gpu_llama_internal::BlockTensor;
using ::tandem::kMaxDim;
using ::tandem::kMaxLayers;
using ::tandem::kMaxTensorElements;
// No device holds more; keeps every size_t of the plan free of overflow.
constexpr double kMaxDeviceBytes = 1125899906842624.0;  // 2^50

absl::Status CheckPositive(const char* field, double value) {
  if (!std::isfinite(value) || value <= 0.0) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " must be a finite number > 0, got ", value));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<GpuLlamaConfig> ValidateGpuLlamaConfig(const GpuLlamaConfig& config) {
  GpuLlamaConfig cfg = config;
  if (cfg.n_layer < 0 || cfg.n_layer > kMaxLayers) {
    return absl::InvalidArgumentError(
        absl::StrCat("n_layer must be in [0, ", kMaxLayers, "], got ", cfg.n_layer));
  }
  RETURN_IF_ERROR(ResolveLayerRange(cfg.n_layer, &cfg.layer_begin, &cfg.layer_end));
  if (cfg.n_kv_head == 0) cfg.n_kv_head = cfg.n_head;
  for (auto [field, value] : {std::pair{"n_head", cfg.n_head},
                              {"n_kv_head", cfg.n_kv_head},
                              {"d_model", cfg.d_model},
                              {"d_hidden", cfg.d_hidden},
                              {"seq_len", cfg.seq_len},
                              {"vocab", cfg.vocab}}) {
    if (value < 1 || value > kMaxDim) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, " must be in [1, ", kMaxDim, "], got ", value));
    }
  }
  if (cfg.n_head % cfg.n_kv_head != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("n_kv_head (", cfg.n_kv_head, ") must divide n_head (", cfg.n_head, ")"));
  }
  if (cfg.d_model % cfg.n_head != 0 || (cfg.d_model / cfg.n_head) % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("d_model (", cfg.d_model, ") must be a multiple of n_head (", cfg.n_head,
                     ") with an even head size (RoPE rotates pairs)"));
  }
  RETURN_IF_ERROR(CheckPositive("rope_theta", cfg.rope_theta));
  RETURN_IF_ERROR(CheckPositive("rms_eps", cfg.rms_eps));
  if (cfg.batch < 1 || cfg.batch > kMaxDim) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch must be in [1, ", kMaxDim, "], got ", cfg.batch));
  }
  if (cfg.seq < 1 || cfg.seq > cfg.seq_len) {
    return absl::InvalidArgumentError(
        absl::StrCat("seq must be in [1, seq_len = ", cfg.seq_len, "], got ", cfg.seq));
  }
  if (cfg.batch * cfg.seq > INT_MAX || cfg.seq * cfg.seq > INT_MAX) {
    return absl::InvalidArgumentError(absl::StrCat("batch x seq (", cfg.batch, " x ", cfg.seq,
                                                   ") exceeds the kernels' int range"));
  }
  const int64_t kvd = cfg.n_kv_head * (cfg.d_model / cfg.n_head);
  for (auto [what, rows, cols] : {std::tuple{"embed_tokens", cfg.vocab, cfg.d_model},
                                  {"q_proj", cfg.d_model, cfg.d_model},
                                  {"k_proj", kvd, cfg.d_model},
                                  {"gate_proj", cfg.d_hidden, cfg.d_model}}) {
    if (rows * cols > kMaxTensorElements) {
      return absl::InvalidArgumentError(absl::StrCat("model too large: ", what, " would have ",
                                                     rows, " x ", cols, " elements (limit ",
                                                     kMaxTensorElements, ")"));
    }
  }
  // Activation bytes in double (a hostile config must not overflow the size_t plan).
  const double n = static_cast<double>(cfg.batch) * static_cast<double>(cfg.seq);
  const double c = static_cast<double>(cfg.d_model), h = static_cast<double>(cfg.d_hidden);
  const double per_block = n * (6.0 * c + 2.0 * static_cast<double>(kvd) + 3.0 * h + 2.0) +
                           static_cast<double>(cfg.n_head) * static_cast<double>(cfg.seq) * n;
  const double bytes = 4.0 * (static_cast<double>(cfg.n_layer) * per_block +
                              n * (2.0 * c + static_cast<double>(cfg.vocab) + h));
  if (bytes > kMaxDeviceBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("model and micro-batch too large: ~", bytes, " bytes of activations"));
  }
  return cfg;
}

std::vector<GpuTensor> GpuLlamaParameterLayout(const GpuLlamaConfig& cfg) {
  const GpuStageShape sh = ShapeOf(cfg);
  const int64_t c = cfg.d_model, h = cfg.d_hidden, v = cfg.vocab;
  const int64_t kvd = cfg.n_kv_head * (cfg.d_model / cfg.n_head);
  // A tied embed_tokens is the pipeline's to sum when this stage has only one of its readers.
  const bool tied_split = cfg.tie_embeddings && sh.embedding != sh.head;
  LayoutBuilder layout(cfg.precision);
  if (sh.embedding) {
    // The tied embedding is also the LM head's GEMM weight.
    layout.Add("model.embed_tokens.weight", {v, c}, true, cfg.tie_embeddings && sh.head).tied =
        tied_split;
  }
  for (int64_t i = sh.b0; i < sh.b1; ++i) {
    const std::string p = absl::StrCat("model.layers.", i, ".");
    layout.Add(p + "input_layernorm.weight", {c}, false, false);
    layout.Add(p + "self_attn.q_proj.weight", {c, c}, true, true);
    layout.Add(p + "self_attn.k_proj.weight", {kvd, c}, true, true);
    layout.Add(p + "self_attn.v_proj.weight", {kvd, c}, true, true);
    layout.Add(p + "self_attn.o_proj.weight", {c, c}, true, true);
    layout.Add(p + "post_attention_layernorm.weight", {c}, false, false);
    layout.Add(p + "mlp.gate_proj.weight", {h, c}, true, true);
    layout.Add(p + "mlp.up_proj.weight", {h, c}, true, true);
    layout.Add(p + "mlp.down_proj.weight", {c, h}, true, true);
  }
  if (sh.head) {
    layout.Add("model.norm.weight", {c}, false, false);
    if (!cfg.tie_embeddings) {
      layout.Add("lm_head.weight", {v, c}, true, true);
    } else if (!sh.embedding) {
      GpuTensor& copy = layout.Add("model.embed_tokens.weight", {v, c}, true, true);
      copy.tied = true;
      copy.tied_copy = true;
    }
  }
  return layout.Take();
}

std::vector<float> InitGpuLlamaParameters(const GpuLlamaConfig& cfg,
                                          const std::vector<GpuTensor>& layout) {
  const GpuStageShape sh = ShapeOf(cfg);
  const LayoutIndex ix = IndexOf(cfg);
  std::vector<float> p(ParameterElements(layout), 0.0f);
  auto fill = [&](Rng& rng, size_t i, float stddev) {
    FillNormal(rng, stddev, p.data() + layout[i].offset, layout[i].count);
  };
  auto ones = [&](size_t i) { std::fill_n(p.data() + layout[i].offset, layout[i].count, 1.0f); };
  // embed_tokens: Rng(MixSeed(seed, 0)); the head's tied copy is drawn the same way.
  if (sh.embedding) {
    Rng rng(MixSeed(cfg.seed, 0));
    fill(rng, ix.embed, kGpuInitStd);
  }
  const float proj_std = ResidualProjectionStd(cfg.n_layer);
  for (int64_t l = sh.b0; l < sh.b1; ++l) {
    ones(ix.Block(l, kRms1));
    ones(ix.Block(l, kRms2));
    // Rng(MixSeed(seed, l + 1)): q, k, v, o (scaled), gate, up, down (scaled).
    Rng rng(MixSeed(cfg.seed, static_cast<uint64_t>(l) + 1));
    for (auto [k, stddev] : {std::pair{kQW, kGpuInitStd},
                             {kKW, kGpuInitStd},
                             {kVW, kGpuInitStd},
                             {kOW, proj_std},
                             {kGateW, kGpuInitStd},
                             {kUpW, kGpuInitStd},
                             {kDownW, proj_std}}) {
      fill(rng, ix.Block(l, k), stddev);
    }
  }
  if (sh.head) {
    ones(ix.norm);
    if (!cfg.tie_embeddings) {
      Rng rng(MixSeed(cfg.seed, static_cast<uint64_t>(cfg.n_layer) + 1));
      fill(rng, ix.head_w, kGpuInitStd);
    } else if (!sh.embedding) {
      Rng rng(MixSeed(cfg.seed, 0));
      fill(rng, ix.head_w, kGpuInitStd);
    }
  }
  return p;
}

void GpuRopeTables(int64_t max_t, int64_t hd, double theta, float* cos, float* sin) {
  // As kernels::RopeTables: HF's inv_freq = 1 / (base ** (arange(0, hd, 2).float() / hd)), all
  // float32, and cos / sin of the float32 angle, correctly rounded.
  const int64_t half = hd / 2;
  std::vector<float> inv_freq(static_cast<size_t>(half));
  const double base = static_cast<float>(theta);
  for (int64_t j = 0; j < half; ++j) {
    const float e = static_cast<float>(2 * j) / static_cast<float>(hd);
    inv_freq[static_cast<size_t>(j)] =
        1.0f / static_cast<float>(std::pow(base, static_cast<double>(e)));
  }
  for (int64_t p = 0; p < max_t; ++p) {
    for (int64_t j = 0; j < half; ++j) {
      const float angle = static_cast<float>(p) * inv_freq[static_cast<size_t>(j)];
      const size_t at = static_cast<size_t>(p * half + j);
      cos[at] = static_cast<float>(std::cos(static_cast<double>(angle)));
      sin[at] = static_cast<float>(std::sin(static_cast<double>(angle)));
    }
  }
}

absl::StatusOr<GpuStageMemory> PlanGpuLlamaMemory(const GpuLlamaConfig& config) {
  ASSIGN_OR_RETURN(const GpuLlamaConfig cfg, ValidateGpuLlamaConfig(config));
  return gpu_llama_internal::PlanValidated(cfg, GpuLlamaParameterLayout(cfg));
}

}  // namespace tandem::worker::cuda
