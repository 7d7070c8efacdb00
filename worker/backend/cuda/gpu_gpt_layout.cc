#include "worker/backend/cuda/gpu_gpt_layout.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <tuple>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/limits.h"
#include "common/status_macros.h"
#include "worker/backend/cuda/gpu_gpt_buffers.h"
#include "worker/model/random.h"

namespace tandem::worker::cuda {
namespace gpu_gpt_internal {

StageShape ShapeOf(const GpuGptConfig& cfg) {
  return StageShapeOf(cfg.n_layer, cfg.layer_begin, cfg.layer_end);
}

LayoutIndex IndexOf(const GpuGptConfig& cfg) {
  const StageShape sh = ShapeOf(cfg);
  LayoutIndex ix;
  ix.b0 = sh.b0;
  ix.block_base = sh.embedding ? 2 : 0;
  ix.lnf = ix.block_base + static_cast<size_t>(sh.blocks()) * kTensorsPerBlock;
  ix.head_w = cfg.tie_embeddings && sh.embedding ? ix.wte : ix.lnf + 2;
  return ix;
}

void CarveWeightGradInputs(const GpuGptConfig& cfg, Carver& r, WeightGradInputs* g) {
  const StageShape sh = ShapeOf(cfg);
  const size_t n = static_cast<size_t>(cfg.batch * cfg.seq), c = static_cast<size_t>(cfg.d_model),
               h = static_cast<size_t>(cfg.d_hidden);
  g->blocks.assign(static_cast<size_t>(sh.blocks()), BlockGradients{});
  for (BlockGradients& b : g->blocks) {
    b.mlp_proj = r.Take<float>(n * c);
    b.fc = r.Take<float>(n * h);
    b.ln2 = r.Take<float>(n * c);
    b.attn_proj = r.Take<float>(n * c);
    b.attn = r.Take<float>(n * 3 * c);
    b.ln1 = r.Take<float>(n * c);
  }
  g->embedding = sh.embedding ? r.Take<float>(n * c) : nullptr;
}

GpuGptMemory PlanValidated(const GpuGptConfig& cfg, const std::vector<GpuGptTensor>& layout) {
  static_assert(sizeof(Bf16Bits) == sizeof(uint16_t));
  GpuGptMemory m = ParameterMemory(layout);
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

}  // namespace gpu_gpt_internal

namespace {

using gpu_gpt_internal::BlockTensor;
using gpu_gpt_internal::IndexOf;
using gpu_gpt_internal::LayoutIndex;
using gpu_gpt_internal::PlanValidated;
using gpu_gpt_internal::ShapeOf;
using gpu_gpt_internal::StageShape;
using enum BlockTensor;

// The CPU layers' constants (worker/model/gpt.cc; the limits from common/limits.h).
constexpr float kInitStd = kGpuInitStd;
using ::tandem::kMaxDim;
using ::tandem::kMaxLayers;
using ::tandem::kMaxTensorElements;
// No device holds more; keeps every size_t below free of overflow.
constexpr double kMaxDeviceBytes = 1125899906842624.0;  // 2^50

}  // namespace

absl::StatusOr<GpuGptConfig> ValidateGpuGptConfig(const GpuGptConfig& config) {
  GpuGptConfig cfg = config;
  if (cfg.n_layer < 0 || cfg.n_layer > kMaxLayers) {
    return absl::InvalidArgumentError(
        absl::StrCat("n_layer must be in [0, ", kMaxLayers, "], got ", cfg.n_layer));
  }
  if (cfg.d_hidden < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("d_hidden must be >= 0 (0 means 4 * d_model), got ", cfg.d_hidden));
  }
  if (cfg.d_hidden == 0) cfg.d_hidden = 4 * cfg.d_model;
  RETURN_IF_ERROR(ResolveLayerRange(cfg.n_layer, &cfg.layer_begin, &cfg.layer_end));
  for (auto [field, value] : {std::pair{"n_head", cfg.n_head},
                              {"d_model", cfg.d_model},
                              {"d_hidden", cfg.d_hidden},
                              {"seq_len", cfg.seq_len},
                              {"vocab", cfg.vocab}}) {
    if (value < 1 || value > kMaxDim) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, " must be in [1, ", kMaxDim, "], got ", value));
    }
  }
  if (cfg.d_model % cfg.n_head != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "d_model (", cfg.d_model, ") must be a multiple of n_head (", cfg.n_head, ")"));
  }
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
  for (auto [what, rows, cols] : {std::tuple{"wte", cfg.vocab, cfg.d_model},
                                  {"wpe", cfg.seq_len, cfg.d_model},
                                  {"c_attn", 3 * cfg.d_model, cfg.d_model},
                                  {"c_fc", cfg.d_hidden, cfg.d_model}}) {
    if (rows * cols > kMaxTensorElements) {
      return absl::InvalidArgumentError(absl::StrCat("model too large: ", what, " would have ",
                                                     rows, " x ", cols, " elements (limit ",
                                                     kMaxTensorElements, ")"));
    }
  }
  // Activation bytes in double (a hostile config must not overflow the size_t plan).
  const double n = static_cast<double>(cfg.batch) * static_cast<double>(cfg.seq);
  const double c = static_cast<double>(cfg.d_model), h = static_cast<double>(cfg.d_hidden);
  const double per_block =
      n * (8.0 * c + 2.0 * h) + static_cast<double>(cfg.n_head) * static_cast<double>(cfg.seq) * n;
  const double bytes = 4.0 * (static_cast<double>(cfg.n_layer) * per_block +
                              n * (2.0 * c + static_cast<double>(cfg.vocab) + h));
  if (bytes > kMaxDeviceBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("model and micro-batch too large: ~", bytes, " bytes of activations"));
  }
  return cfg;
}

std::vector<GpuGptTensor> GpuGptParameterLayout(const GpuGptConfig& cfg) {
  const StageShape sh = ShapeOf(cfg);
  const int64_t c = cfg.d_model, h = cfg.d_hidden, v = cfg.vocab;
  // A tied wte is the pipeline's to sum when this stage has only one of its two readers.
  const bool tied_split = cfg.tie_embeddings && sh.embedding != sh.head;
  LayoutBuilder layout(cfg.precision);
  auto add = [&](std::string name, std::vector<int64_t> shape, bool decay, bool gemm) {
    return &layout.Add(std::move(name), std::move(shape), decay, gemm);
  };
  if (sh.embedding) {
    // The tied wte is also the LM head's GEMM weight.
    add("transformer.wte.weight", {v, c}, true, cfg.tie_embeddings && sh.head)->tied = tied_split;
    add("transformer.wpe.weight", {cfg.seq_len, c}, true, false);
  }
  for (int64_t i = sh.b0; i < sh.b1; ++i) {
    const std::string p = absl::StrCat("transformer.h.", i, ".");
    add(p + "ln_1.weight", {c}, false, false);
    add(p + "ln_1.bias", {c}, false, false);
    add(p + "attn.c_attn.weight", {3 * c, c}, true, true);
    add(p + "attn.c_attn.bias", {3 * c}, false, false);
    add(p + "attn.c_proj.weight", {c, c}, true, true);
    add(p + "attn.c_proj.bias", {c}, false, false);
    add(p + "ln_2.weight", {c}, false, false);
    add(p + "ln_2.bias", {c}, false, false);
    add(p + "mlp.c_fc.weight", {h, c}, true, true);
    add(p + "mlp.c_fc.bias", {h}, false, false);
    add(p + "mlp.c_proj.weight", {c, h}, true, true);
    add(p + "mlp.c_proj.bias", {c}, false, false);
  }
  if (sh.head) {
    add("transformer.ln_f.weight", {c}, false, false);
    add("transformer.ln_f.bias", {c}, false, false);
    if (!cfg.tie_embeddings) {
      add("lm_head.weight", {v, c}, true, true);
    } else if (!sh.embedding) {
      GpuGptTensor* copy = add("transformer.wte.weight", {v, c}, true, true);
      copy->tied = true;
      copy->tied_copy = true;
    }
  }
  return layout.Take();
}

std::vector<float> InitGpuGptParameters(const GpuGptConfig& cfg,
                                        const std::vector<GpuGptTensor>& layout) {
  const StageShape sh = ShapeOf(cfg);
  const LayoutIndex ix = IndexOf(cfg);
  std::vector<float> p(ParameterElements(layout), 0.0f);
  auto at = [&](size_t i) { return p.data() + layout[i].offset; };
  // Embedding: Rng(MixSeed(seed, 0)) draws wte, then wpe; the head's tied copy of wte is
  // drawn the same way, so the copies start equal.
  if (sh.embedding) {
    Rng rng(MixSeed(cfg.seed, 0));
    FillNormal(rng, kInitStd, at(ix.wte), layout[ix.wte].count);
    FillNormal(rng, kInitStd, at(ix.wpe), layout[ix.wpe].count);
  }
  const float proj_std =
      kInitStd / std::sqrt(2.0f * static_cast<float>(std::max<int64_t>(cfg.n_layer, 1)));
  for (int64_t l = sh.b0; l < sh.b1; ++l) {
    std::fill_n(at(ix.Block(l, kLn1G)), layout[ix.Block(l, kLn1G)].count, 1.0f);
    std::fill_n(at(ix.Block(l, kLn2G)), layout[ix.Block(l, kLn2G)].count, 1.0f);
    // Rng(MixSeed(seed, l + 1)): c_attn, attn.c_proj, c_fc, mlp.c_proj.
    Rng rng(MixSeed(cfg.seed, static_cast<uint64_t>(l) + 1));
    for (auto [k, stddev] : {std::pair{kAttnW, kInitStd},
                             {kAttnProjW, proj_std},
                             {kFcW, kInitStd},
                             {kMlpProjW, proj_std}}) {
      FillNormal(rng, stddev, at(ix.Block(l, k)), layout[ix.Block(l, k)].count);
    }
  }
  if (sh.head) {
    std::fill_n(at(ix.lnf), layout[ix.lnf].count, 1.0f);
    if (!cfg.tie_embeddings) {
      Rng rng(MixSeed(cfg.seed, static_cast<uint64_t>(cfg.n_layer) + 1));
      FillNormal(rng, kInitStd, at(ix.head_w), layout[ix.head_w].count);
    } else if (!sh.embedding) {
      Rng rng(MixSeed(cfg.seed, 0));
      FillNormal(rng, kInitStd, at(ix.head_w), layout[ix.head_w].count);
    }
  }
  return p;
}

absl::StatusOr<GpuGptMemory> PlanGpuGptMemory(const GpuGptConfig& config) {
  ASSIGN_OR_RETURN(const GpuGptConfig cfg, ValidateGpuGptConfig(config));
  return PlanValidated(cfg, GpuGptParameterLayout(cfg));
}

}  // namespace tandem::worker::cuda
