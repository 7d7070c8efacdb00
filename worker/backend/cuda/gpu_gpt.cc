#include "worker/backend/cuda/gpu_gpt.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "worker/backend/cuda/cuda_handles.h"
#include "worker/backend/cuda/cuda_status.h"
#include "worker/backend/cuda/device_buffer.h"
#include "worker/backend/cuda/gpu_gpt_kernels.h"
#include "worker/model/random.h"

namespace tandem::worker::cuda {
namespace {

// The CPU layers' constants (worker/model/gpt.cc).
constexpr float kInitStd = 0.02f;
constexpr int64_t kMaxDim = 1 << 20;
constexpr int64_t kMaxLayers = 4096;
constexpr int64_t kMaxTensorElements = INT_MAX;
// No device holds more; keeps every size_t below free of overflow.
constexpr double kMaxDeviceBytes = 1125899906842624.0;  // 2^50
constexpr size_t kAlign = 256;

// Tensors per block, in GptBlock::Parameters() order.
enum BlockTensor {
  kLn1G,
  kLn1B,
  kAttnW,
  kAttnB,
  kAttnProjW,
  kAttnProjB,
  kLn2G,
  kLn2B,
  kFcW,
  kFcB,
  kMlpProjW,
  kMlpProjB,
  kTensorsPerBlock
};
// Which layers a (validated) config's stage holds: blocks [b0, b1) by block index.
struct StageShape {
  bool embedding = false;
  bool head = false;
  int64_t b0 = 0;
  int64_t b1 = 0;
  int64_t blocks() const { return b1 - b0; }
};

StageShape ShapeOf(const GpuGptConfig& cfg) {
  StageShape s;
  s.embedding = cfg.layer_begin == 0;
  s.head = cfg.layer_end == cfg.n_layer + 2;
  s.b0 = std::max<int64_t>(cfg.layer_begin, 1) - 1;
  s.b1 = std::min<int64_t>(cfg.layer_end, cfg.n_layer + 1) - 1;
  if (s.b1 < s.b0) s.b1 = s.b0;
  return s;
}

// Positions in a stage's layout: wte, wpe (embedding), 12 per block from block_base, ln_f gain
// and bias (head), then lm_head.weight (untied) or the head's wte copy (tied, no embedding).
struct LayoutIndex {
  size_t wte = 0, wpe = 1;
  size_t block_base = 0;
  size_t lnf = 0;
  size_t head_w = 0;  // the LM head's GEMM weight
  int64_t b0 = 0;
  size_t Block(int64_t layer, int k) const {
    return block_base + static_cast<size_t>(layer - b0) * kTensorsPerBlock + static_cast<size_t>(k);
  }
};

LayoutIndex IndexOf(const GpuGptConfig& cfg) {
  const StageShape sh = ShapeOf(cfg);
  LayoutIndex ix;
  ix.b0 = sh.b0;
  ix.block_base = sh.embedding ? 2 : 0;
  ix.lnf = ix.block_base + static_cast<size_t>(sh.blocks()) * kTensorsPerBlock;
  ix.head_w = cfg.tie_embeddings && sh.embedding ? ix.wte : ix.lnf + 2;
  return ix;
}

// Carves typed sub-buffers out of one allocation (or, with base 0, only sizes them).
class Carver {
 public:
  explicit Carver(uintptr_t base) : base_(base) {}
  template <typename T>
  T* Take(size_t count) {
    used_ = (used_ + kAlign - 1) / kAlign * kAlign;
    T* p = reinterpret_cast<T*>(base_ + used_);
    used_ += count * sizeof(T);
    return p;
  }
  size_t used() const { return used_; }

 private:
  uintptr_t base_;
  size_t used_ = 0;
};

// Saved for backward, one micro-batch. Of each "_f" / "_h" pair only the fp32 (kFp32) or the
// bf16 (kBf16) member is allocated; the other stays null.
struct BlockActivations {
  float* ln1_f = nullptr;  // (N, C) ln_1(x), the input of c_attn
  bf16* ln1_h = nullptr;
  float* mean1 = nullptr;  // (N)
  float* rstd1 = nullptr;  // (N)
  float* qkv = nullptr;    // (N, 3C)
  float* att = nullptr;    // (B, NH, T, T) probabilities
  float* y_f = nullptr;    // (N, C) merged heads, the input of attn.c_proj
  bf16* y_h = nullptr;
  float* x1 = nullptr;     // (N, C) x + attn
  float* ln2_f = nullptr;  // (N, C) ln_2(x1), the input of c_fc
  bf16* ln2_h = nullptr;
  float* mean2 = nullptr;  // (N)
  float* rstd2 = nullptr;  // (N)
  float* pre = nullptr;    // (N, H) c_fc output
  float* act_f = nullptr;  // (N, H) gelu(pre), the input of mlp.c_proj
  bf16* act_h = nullptr;
};

// One slot: what one micro-batch's forward saves for its backward.
struct Activations {
  // nb + 1 of (N, C): resid[0] the stage's input (the embedding's output, or the received
  // activation), resid[j + 1] the output of the stage's j-th block.
  std::vector<float*> resid;
  std::vector<BlockActivations> blocks;
  int32_t* tokens = nullptr;  // (N) the embedding's input (embedding stage)
  float* dhead = nullptr;     // (N, C) d loss / d (the head's input), from the forward (head)
};

// What a micro-batch's I keeps for its W (the split backward): the output gradient of each
// GEMM and each LayerNorm of every block, and on the embedding stage the gradient of the
// embedding's output. W reads them with the slot's saved inputs.
struct BlockGradients {
  float* mlp_proj = nullptr;   // (N, C) d out of mlp.c_proj
  float* fc = nullptr;         // (N, H) d out of c_fc (gelu' applied)
  float* ln2 = nullptr;        // (N, C) d out of ln_2
  float* attn_proj = nullptr;  // (N, C) d out of attn.c_proj
  float* attn = nullptr;       // (N, 3C) d out of c_attn
  float* ln1 = nullptr;        // (N, C) d out of ln_1
};
struct WeightGradInputs {
  std::vector<BlockGradients> blocks;
  float* embedding = nullptr;  // (N, C) d resid[0] (embedding stage)
};

struct Workspace {
  int32_t* targets = nullptr;  // (N)
  float* lnf_f = nullptr;      // (N, C) ln_f(x), the input of the LM head (head)
  bf16* lnf_h = nullptr;
  float* meanf = nullptr;        // (N)
  float* rstdf = nullptr;        // (N)
  float* logits = nullptr;       // (N, V); softmax - onehot after the loss (head)
  float* losses = nullptr;       // (N)
  double* loss_sum = nullptr;    // (1)
  double* norm_sq = nullptr;     // (1)
  float* out_f = nullptr;        // (N, max(C, H)) fp32 outputs before rounding (kBf16 only)
  bf16* dout_h = nullptr;        // (N, max(V, H, 3C)) a GEMM's dout in bf16 (kBf16 only)
  float* dres_a = nullptr;       // (N, C) the residual stream's gradient, ping
  float* dres_b = nullptr;       // (N, C) pong
  float* dbig = nullptr;         // (N, max(H, 3C)) d act, then d qkv
  float* dpre = nullptr;         // (N, H)
  float* dsmall = nullptr;       // (N, C) d ln_2, d y, d ln_1, d ln_f
  float* att_scratch = nullptr;  // (NH, T, T)
};

void CarveActivations(const GpuGptConfig& cfg, Carver& r, Activations* a) {
  const bool h16 = cfg.precision == GpuPrecision::kBf16;
  const StageShape sh = ShapeOf(cfg);
  const size_t n = static_cast<size_t>(cfg.batch * cfg.seq), c = static_cast<size_t>(cfg.d_model),
               h = static_cast<size_t>(cfg.d_hidden);
  const size_t att = static_cast<size_t>(cfg.batch * cfg.n_head) * static_cast<size_t>(cfg.seq) *
                     static_cast<size_t>(cfg.seq);
  a->resid.clear();
  for (int64_t l = 0; l <= sh.blocks(); ++l) a->resid.push_back(r.Take<float>(n * c));
  a->blocks.assign(static_cast<size_t>(sh.blocks()), BlockActivations{});
  for (BlockActivations& b : a->blocks) {
    if (h16) {
      b.ln1_h = r.Take<bf16>(n * c);
    } else {
      b.ln1_f = r.Take<float>(n * c);
    }
    b.mean1 = r.Take<float>(n);
    b.rstd1 = r.Take<float>(n);
    b.qkv = r.Take<float>(n * 3 * c);
    b.att = r.Take<float>(att);
    if (h16) {
      b.y_h = r.Take<bf16>(n * c);
    } else {
      b.y_f = r.Take<float>(n * c);
    }
    b.x1 = r.Take<float>(n * c);
    if (h16) {
      b.ln2_h = r.Take<bf16>(n * c);
    } else {
      b.ln2_f = r.Take<float>(n * c);
    }
    b.mean2 = r.Take<float>(n);
    b.rstd2 = r.Take<float>(n);
    b.pre = r.Take<float>(n * h);
    if (h16) {
      b.act_h = r.Take<bf16>(n * h);
    } else {
      b.act_f = r.Take<float>(n * h);
    }
  }
  if (sh.embedding) a->tokens = r.Take<int32_t>(n);
  if (sh.head) a->dhead = r.Take<float>(n * c);
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

void CarveWorkspace(const GpuGptConfig& cfg, Carver& r, Workspace* w) {
  const bool h16 = cfg.precision == GpuPrecision::kBf16;
  const StageShape sh = ShapeOf(cfg);
  const size_t n = static_cast<size_t>(cfg.batch * cfg.seq), c = static_cast<size_t>(cfg.d_model),
               h = static_cast<size_t>(cfg.d_hidden), v = static_cast<size_t>(cfg.vocab);
  if (sh.head) {
    w->targets = r.Take<int32_t>(n);
    if (h16) {
      w->lnf_h = r.Take<bf16>(n * c);
    } else {
      w->lnf_f = r.Take<float>(n * c);
    }
    w->meanf = r.Take<float>(n);
    w->rstdf = r.Take<float>(n);
    w->logits = r.Take<float>(n * v);
    w->losses = r.Take<float>(n);
  }
  w->loss_sum = r.Take<double>(1);
  w->norm_sq = r.Take<double>(1);
  if (h16) {
    w->out_f = r.Take<float>(n * std::max(c, h));
    w->dout_h = r.Take<bf16>(n * std::max({sh.head ? v : size_t{0}, h, 3 * c}));
  }
  w->dres_a = r.Take<float>(n * c);
  w->dres_b = r.Take<float>(n * c);
  w->dbig = r.Take<float>(n * std::max(h, 3 * c));
  w->dpre = r.Take<float>(n * h);
  w->dsmall = r.Take<float>(n * c);
  w->att_scratch =
      r.Take<float>(static_cast<size_t>(cfg.n_head * cfg.seq) * static_cast<size_t>(cfg.seq));
}

size_t ComputeCopyElements(const std::vector<GpuGptTensor>& layout) {
  size_t n = 0;
  for (const GpuGptTensor& t : layout) {
    if (t.compute_copy) n = std::max(n, t.compute_offset + t.count);
  }
  return n;
}

size_t ParameterElements(const std::vector<GpuGptTensor>& layout) {
  return layout.empty() ? 0 : layout.back().offset + layout.back().count;
}

GpuGptMemory PlanValidated(const GpuGptConfig& cfg, const std::vector<GpuGptTensor>& layout) {
  GpuGptMemory m;
  const size_t p = ParameterElements(layout);
  m.parameters = p * sizeof(float);
  m.compute_weights = ComputeCopyElements(layout) * sizeof(bf16);
  m.gradients = p * sizeof(float);
  m.optimizer_state = 2 * p * sizeof(float);
  Carver act(0), work(0), split(0);
  Activations a;
  Workspace w;
  WeightGradInputs g;
  CarveActivations(cfg, act, &a);
  CarveWorkspace(cfg, work, &w);
  CarveWeightGradInputs(cfg, split, &g);
  m.activations = act.used();
  m.workspace = work.used();
  m.weight_grad_inputs = split.used();
  return m;
}

void FillNormal(Rng& rng, float stddev, float* out, size_t count) {
  for (size_t i = 0; i < count; ++i) out[i] = static_cast<float>(rng.Normal() * stddev);
}

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
  if (cfg.layer_end == -1) cfg.layer_end = cfg.n_layer + 2;
  if (cfg.layer_begin < 0 || cfg.layer_begin >= cfg.layer_end || cfg.layer_end > cfg.n_layer + 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "layers [", cfg.layer_begin, ", ", config.layer_end,
        ") are not a non-empty range within the model's ", cfg.n_layer + 2, " layers"));
  }
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
  const bool h16 = cfg.precision == GpuPrecision::kBf16;
  const StageShape sh = ShapeOf(cfg);
  const int64_t c = cfg.d_model, h = cfg.d_hidden, v = cfg.vocab;
  // A tied wte is the pipeline's to sum when this stage has only one of its two readers.
  const bool tied_split = cfg.tie_embeddings && sh.embedding != sh.head;
  std::vector<GpuGptTensor> layout;
  size_t offset = 0, compute_offset = 0;
  auto add = [&](std::string name, std::vector<int64_t> shape, bool decay, bool gemm) {
    GpuGptTensor t;
    t.name = std::move(name);
    t.count = 1;
    for (int64_t d : shape) t.count *= static_cast<size_t>(d);
    t.shape = std::move(shape);
    t.offset = offset;
    offset += t.count;
    t.decay = decay;
    t.compute_copy = h16 && gemm;
    if (t.compute_copy) {
      t.compute_offset = compute_offset;
      compute_offset += t.count;
    }
    layout.push_back(std::move(t));
  };
  if (sh.embedding) {
    // The tied wte is also the LM head's GEMM weight.
    add("transformer.wte.weight", {v, c}, true, cfg.tie_embeddings && sh.head);
    layout.back().tied = tied_split;
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
      add("transformer.wte.weight", {v, c}, true, true);
      layout.back().tied = true;
      layout.back().tied_copy = true;
    }
  }
  return layout;
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
  absl::StatusOr<GpuGptConfig> cfg = ValidateGpuGptConfig(config);
  if (!cfg.ok()) return cfg.status();
  return PlanValidated(*cfg, GpuGptParameterLayout(*cfg));
}

// ---------------------------------------------------------------------------------------

// One activation slot: its memory and the pointers carved out of it.
struct Slot {
  DeviceBuffer<char> mem;
  Activations a;
  // The split backward's: allocated at the slot's first I, kept with the slot.
  DeviceBuffer<char> grad_mem;
  WeightGradInputs g;
  bool awaiting_w = false;  // I ran, W not yet
};

struct GpuGpt::Impl {
  GpuGptConfig cfg;
  StageShape sh;
  LayoutIndex ix;
  const std::vector<GpuGptTensor>* layout = nullptr;
  CudaStream stream;
  CublasHandle blas;
  DeviceBuffer<float> params, grads, m, v;  // (P) each, layout order
  DeviceBuffer<bf16> compute;               // the GEMM weights' bf16 copies (kBf16)
  DeviceBuffer<char> work_mem;
  Workspace w;
  size_t slot_bytes = 0;
  size_t grad_bytes = 0;                     // a slot's WeightGradInputs
  std::vector<std::unique_ptr<Slot>> slots;  // every slot allocated so far
  std::vector<Slot*> free_slots;
  std::map<int, Slot*> in_use;  // micro-batch -> its saved forward
  // fwd_start, fwd_end, bwd_start, bwd_end, opt_start, opt_end.
  CudaEvent ev[6];

  bool bf16_mode() const { return cfg.precision == GpuPrecision::kBf16; }
  cudaStream_t s() const { return stream.get(); }
  int64_t n() const { return cfg.batch * cfg.seq; }
  float* P(size_t i) { return params.data() + (*layout)[i].offset; }
  float* G(size_t i) { return grads.data() + (*layout)[i].offset; }
  const bf16* H(size_t i) { return compute.data() + (*layout)[i].compute_offset; }

  // A free slot (allocated when none is).
  absl::StatusOr<Slot*> Acquire() {
    if (!free_slots.empty()) {
      Slot* slot = free_slots.back();
      free_slots.pop_back();
      return slot;
    }
    auto slot = std::make_unique<Slot>();
    absl::StatusOr<DeviceBuffer<char>> mem = DeviceBuffer<char>::Create(slot_bytes);
    if (!mem.ok()) return mem.status();
    slot->mem = std::move(*mem);
    Carver carver(reinterpret_cast<uintptr_t>(slot->mem.data()));
    CarveActivations(cfg, carver, &slot->a);
    slots.push_back(std::move(slot));
    return slots.back().get();
  }
  void Release(Slot* slot) {
    slot->awaiting_w = false;
    free_slots.push_back(slot);
  }
  // Runs `body` between the backward events and sets *ms to its device time; waits for the
  // device.
  template <typename Body>
  absl::Status TimedBackward(float* ms, Body body) {
    TANDEM_CUDA_RETURN_IF_ERROR(cudaEventRecord(ev[2].get(), s()));
    if (absl::Status st = body(); !st.ok()) return st;
    TANDEM_CUDA_RETURN_IF_ERROR(cudaEventRecord(ev[3].get(), s()));
    if (absl::Status st = stream.Synchronize(); !st.ok()) return st;
    TANDEM_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(ms, ev[2].get(), ev[3].get()));
    return absl::OkStatus();
  }
  // The slot's WeightGradInputs, allocated on its first I.
  absl::Status EnsureGradInputs(Slot* slot) {
    if (slot->grad_mem.data() != nullptr || grad_bytes == 0) return absl::OkStatus();
    absl::StatusOr<DeviceBuffer<char>> mem = DeviceBuffer<char>::Create(grad_bytes);
    if (!mem.ok()) return mem.status();
    slot->grad_mem = std::move(*mem);
    Carver carver(reinterpret_cast<uintptr_t>(slot->grad_mem.data()));
    CarveWeightGradInputs(cfg, carver, &slot->g);
    return absl::OkStatus();
  }

  // out (N, OC) = in w^T + b (fp32 out; bias index < 0: none). The fp32 or the bf16 input is
  // read, as the mode says.
  absl::Status Linear(const float* in_f, const bf16* in_h, size_t wi, int64_t bi, float* out,
                      int64_t rows, int64_t c, int64_t oc) {
    const float* b = bi < 0 ? nullptr : P(static_cast<size_t>(bi));
    if (bf16_mode()) return LinearForward(blas.get(), s(), in_h, H(wi), b, out, rows, c, oc);
    return LinearForward(blas.get(), s(), in_f, P(wi), b, out, rows, c, oc);
  }

  // din += dout w; dw += dout^T in; db += colsum(dout) (the bias sum from the fp32 dout in
  // both modes).
  absl::Status LinearGrad(const float* dout, const float* in_f, const bf16* in_h, size_t wi,
                          size_t bi, float* din, int64_t rows, int64_t c, int64_t oc) {
    if (!bf16_mode()) {
      return LinearBackward(blas.get(), s(), dout, in_f, P(wi), din, G(wi), G(bi), rows, c, oc);
    }
    if (absl::Status st = ConvertToBf16(s(), dout, w.dout_h, rows * oc); !st.ok()) return st;
    if (absl::Status st = LinearBackward(blas.get(), s(), w.dout_h, in_h, H(wi), din, G(wi),
                                         nullptr, rows, c, oc);
        !st.ok()) {
      return st;
    }
    return LinearBackward(blas.get(), s(), dout, nullptr, nullptr, nullptr, nullptr, G(bi), rows, c,
                          oc);
  }

  // The two halves of LinearGrad, for the split backward: din += dout w (I) ...
  absl::Status LinearInputGrad(const float* dout, size_t wi, float* din, int64_t rows, int64_t c,
                               int64_t oc) {
    if (!bf16_mode()) {
      return LinearBackward(blas.get(), s(), dout, nullptr, P(wi), din, nullptr, nullptr, rows, c,
                            oc);
    }
    if (absl::Status st = ConvertToBf16(s(), dout, w.dout_h, rows * oc); !st.ok()) return st;
    return LinearBackward(blas.get(), s(), w.dout_h, nullptr, H(wi), din, nullptr, nullptr, rows, c,
                          oc);
  }
  // ... and dw += dout^T in, db += colsum(dout) (W): the same operations as LinearGrad's, so
  // I then W adds the same gradients as B.
  absl::Status LinearWeightGrad(const float* dout, const float* in_f, const bf16* in_h, size_t wi,
                                size_t bi, int64_t rows, int64_t c, int64_t oc) {
    if (!bf16_mode()) {
      return LinearBackward(blas.get(), s(), dout, in_f, nullptr, nullptr, G(wi), G(bi), rows, c,
                            oc);
    }
    if (absl::Status st = ConvertToBf16(s(), dout, w.dout_h, rows * oc); !st.ok()) return st;
    if (absl::Status st = LinearBackward(blas.get(), s(), w.dout_h, in_h, nullptr, nullptr, G(wi),
                                         nullptr, rows, c, oc);
        !st.ok()) {
      return st;
    }
    return LinearBackward(blas.get(), s(), dout, nullptr, nullptr, nullptr, nullptr, G(bi), rows, c,
                          oc);
  }

  // A row kernel's fp32 output: the saved buffer itself (kFp32) or the scratch that is then
  // rounded into the saved bf16 buffer (Round).
  float* OutF(float* saved_f) { return bf16_mode() ? w.out_f : saved_f; }
  absl::Status Round(bf16* saved_h, int64_t count) {
    if (!bf16_mode()) return absl::OkStatus();
    return ConvertToBf16(s(), w.out_f, saved_h, count);
  }

  absl::Status Zero(float* p, int64_t count) {
    TANDEM_CUDA_RETURN_IF_ERROR(
        cudaMemsetAsync(p, 0, static_cast<size_t>(count) * sizeof(float), s()));
    return absl::OkStatus();
  }
  absl::Status Copy(float* dst, const float* src, int64_t count) {
    TANDEM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(
        dst, src, static_cast<size_t>(count) * sizeof(float), cudaMemcpyDeviceToDevice, s()));
    return absl::OkStatus();
  }

  // The blocks from resid[0] (already there), then, on the head stage, the loss into
  // w.loss_sum and, with `grad_scale` > 0, the head's backward into a.dhead.
  absl::Status Forward(Activations& a, float grad_scale);
  // From d loss / d (the last block's output) in `cur` (w.dres_a) down to d loss / d resid[0],
  // left in the returned buffer (one of w.dres_a / w.dres_b). With `g` null (B) the parameter
  // gradients are added on the way; otherwise (I, the split backward) only the input gradient
  // is computed, and each output gradient the weight gradients need is kept in `g` for
  // BackwardWeight (W), which adds them.
  absl::StatusOr<float*> Backward(Activations& a, WeightGradInputs* g = nullptr);
  absl::Status BackwardWeight(Activations& a, const WeightGradInputs& g);
  absl::Status SquaredNorm(bool include_tied_copy);
};

#define GPT_RETURN_IF_ERROR(expr)                                           \
  do {                                                                      \
    if (absl::Status tandem_s_ = (expr); !tandem_s_.ok()) return tandem_s_; \
  } while (false)

absl::Status GpuGpt::Impl::Forward(Activations& a, float grad_scale) {
  const int64_t b = cfg.batch, t = cfg.seq, c = cfg.d_model, h = cfg.d_hidden, nh = cfg.n_head;
  const int64_t rows = n();
  for (int64_t l = sh.b0; l < sh.b1; ++l) {
    const size_t j = static_cast<size_t>(l - sh.b0);
    BlockActivations& ba = a.blocks[j];
    const float* x = a.resid[j];
    float* out = a.resid[j + 1];
    auto idx = [&](int k) { return ix.Block(l, k); };
    // x1 = x + c_proj(attn(c_attn(ln_1(x)))).
    GPT_RETURN_IF_ERROR(LayerNormForward(s(), x, P(idx(kLn1G)), P(idx(kLn1B)), OutF(ba.ln1_f),
                                         ba.mean1, ba.rstd1, rows, c));
    GPT_RETURN_IF_ERROR(Round(ba.ln1_h, rows * c));
    GPT_RETURN_IF_ERROR(Linear(ba.ln1_f, ba.ln1_h, idx(kAttnW), static_cast<int64_t>(idx(kAttnB)),
                               ba.qkv, rows, c, 3 * c));
    GPT_RETURN_IF_ERROR(
        CausalAttentionForward(blas.get(), s(), ba.qkv, ba.att, OutF(ba.y_f), b, t, c, nh));
    GPT_RETURN_IF_ERROR(Round(ba.y_h, rows * c));
    GPT_RETURN_IF_ERROR(Linear(ba.y_f, ba.y_h, idx(kAttnProjW),
                               static_cast<int64_t>(idx(kAttnProjB)), ba.x1, rows, c, c));
    GPT_RETURN_IF_ERROR(Add(s(), ba.x1, x, ba.x1, rows * c));
    // out = x1 + c_proj(gelu(c_fc(ln_2(x1)))).
    GPT_RETURN_IF_ERROR(LayerNormForward(s(), ba.x1, P(idx(kLn2G)), P(idx(kLn2B)), OutF(ba.ln2_f),
                                         ba.mean2, ba.rstd2, rows, c));
    GPT_RETURN_IF_ERROR(Round(ba.ln2_h, rows * c));
    GPT_RETURN_IF_ERROR(
        Linear(ba.ln2_f, ba.ln2_h, idx(kFcW), static_cast<int64_t>(idx(kFcB)), ba.pre, rows, c, h));
    GPT_RETURN_IF_ERROR(GeluForward(s(), ba.pre, OutF(ba.act_f), rows * h));
    GPT_RETURN_IF_ERROR(Round(ba.act_h, rows * h));
    GPT_RETURN_IF_ERROR(Linear(ba.act_f, ba.act_h, idx(kMlpProjW),
                               static_cast<int64_t>(idx(kMlpProjB)), out, rows, h, c));
    GPT_RETURN_IF_ERROR(Add(s(), out, ba.x1, out, rows * c));
  }
  if (!sh.head) return absl::OkStatus();
  // Head: ln_f, logits = ln_f W^T, softmax cross-entropy in place (logits become p - onehot).
  const float* x = a.resid[static_cast<size_t>(sh.blocks())];
  GPT_RETURN_IF_ERROR(
      LayerNormForward(s(), x, P(ix.lnf), P(ix.lnf + 1), OutF(w.lnf_f), w.meanf, w.rstdf, rows, c));
  GPT_RETURN_IF_ERROR(Round(w.lnf_h, rows * c));
  GPT_RETURN_IF_ERROR(Linear(w.lnf_f, w.lnf_h, ix.head_w, -1, w.logits, rows, c, cfg.vocab));
  GPT_RETURN_IF_ERROR(
      SoftmaxCrossEntropyInPlace(s(), w.logits, w.targets, w.losses, w.loss_sum, rows, cfg.vocab));
  if (grad_scale <= 0.0f) return absl::OkStatus();
  // The head's backward: d ln_f = scale (p - onehot) W; dW += scale (p - onehot)^T ln_f; then
  // ln_f's backward into a.dhead.
  GPT_RETURN_IF_ERROR(Zero(w.dsmall, rows * c));
  if (bf16_mode()) {
    GPT_RETURN_IF_ERROR(ScaledConvertToBf16(s(), w.logits, grad_scale, w.dout_h, rows * cfg.vocab));
    GPT_RETURN_IF_ERROR(LinearBackward(blas.get(), s(), w.dout_h, w.lnf_h, H(ix.head_w), w.dsmall,
                                       G(ix.head_w), nullptr, rows, c, cfg.vocab));
  } else {
    GPT_RETURN_IF_ERROR(ScaledLinearBackward(blas.get(), s(), w.logits, w.lnf_f, P(ix.head_w),
                                             grad_scale, w.dsmall, G(ix.head_w), rows, c,
                                             cfg.vocab));
  }
  GPT_RETURN_IF_ERROR(Zero(a.dhead, rows * c));
  return LayerNormBackward(s(), w.dsmall, x, P(ix.lnf), w.meanf, w.rstdf, a.dhead, G(ix.lnf),
                           G(ix.lnf + 1), rows, c);
}

absl::StatusOr<float*> GpuGpt::Impl::Backward(Activations& a, WeightGradInputs* g) {
  const int64_t b = cfg.batch, t = cfg.seq, c = cfg.d_model, h = cfg.d_hidden, nh = cfg.n_head;
  const int64_t rows = n();
  float* cur = w.dres_a;    // d loss / d (the current block's output)
  float* other = w.dres_b;  // becomes d loss / d (its input)
  for (int64_t l = sh.b1 - 1; l >= sh.b0; --l) {
    const size_t j = static_cast<size_t>(l - sh.b0);
    BlockActivations& ba = a.blocks[j];
    BlockGradients* bg = g == nullptr ? nullptr : &g->blocks[j];
    const float* x = a.resid[j];
    auto idx = [&](int k) { return ix.Block(l, k); };
    // A linear's backward: B adds its weight gradients now; I only its input gradient.
    auto linear = [&](const float* dout, const float* in_f, const bf16* in_h, int wk, int bk,
                      float* din, int64_t in_c, int64_t out_c) {
      return bg != nullptr ? LinearInputGrad(dout, idx(wk), din, rows, in_c, out_c)
                           : LinearGrad(dout, in_f, in_h, idx(wk), idx(bk), din, rows, in_c, out_c);
    };
    // A LayerNorm's: the same, its gain's and bias's gradients in B only.
    auto layer_norm = [&](const float* dout, const float* in, int gk, int bk, const float* mean,
                          const float* rstd, float* din) {
      return LayerNormBackward(s(), dout, in, P(idx(gk)), mean, rstd, din,
                               bg != nullptr ? nullptr : G(idx(gk)),
                               bg != nullptr ? nullptr : G(idx(bk)), rows, c);
    };
    // MLP branch: dx1 = dout + ln_2'(c_fc'(gelu'(c_proj'(dout)))). I keeps each output gradient
    // W needs in bg (the buffers B uses are scratch).
    if (bg != nullptr) GPT_RETURN_IF_ERROR(Copy(bg->mlp_proj, cur, rows * c));
    float* dact = w.dbig;
    GPT_RETURN_IF_ERROR(Zero(dact, rows * h));
    GPT_RETURN_IF_ERROR(linear(cur, ba.act_f, ba.act_h, kMlpProjW, kMlpProjB, dact, h, c));
    float* dpre = bg != nullptr ? bg->fc : w.dpre;
    GPT_RETURN_IF_ERROR(Zero(dpre, rows * h));
    GPT_RETURN_IF_ERROR(GeluBackward(s(), ba.pre, dact, dpre, rows * h));
    float* dln2 = bg != nullptr ? bg->ln2 : w.dsmall;
    GPT_RETURN_IF_ERROR(Zero(dln2, rows * c));
    GPT_RETURN_IF_ERROR(linear(dpre, ba.ln2_f, ba.ln2_h, kFcW, kFcB, dln2, c, h));
    GPT_RETURN_IF_ERROR(Copy(other, cur, rows * c));
    GPT_RETURN_IF_ERROR(layer_norm(dln2, ba.x1, kLn2G, kLn2B, ba.mean2, ba.rstd2, other));
    // Attention branch: dx = dx1 + ln_1'(c_attn'(attn'(c_proj'(dx1)))).
    if (bg != nullptr) GPT_RETURN_IF_ERROR(Copy(bg->attn_proj, other, rows * c));
    GPT_RETURN_IF_ERROR(Zero(w.dsmall, rows * c));
    GPT_RETURN_IF_ERROR(linear(other, ba.y_f, ba.y_h, kAttnProjW, kAttnProjB, w.dsmall, c, c));
    float* dqkv = bg != nullptr ? bg->attn : w.dbig;
    GPT_RETURN_IF_ERROR(Zero(dqkv, rows * 3 * c));
    GPT_RETURN_IF_ERROR(CausalAttentionBackward(blas.get(), s(), w.dsmall, ba.qkv, ba.att, dqkv,
                                                w.att_scratch, b, t, c, nh));
    float* dln1 = bg != nullptr ? bg->ln1 : w.dsmall;
    GPT_RETURN_IF_ERROR(Zero(dln1, rows * c));
    GPT_RETURN_IF_ERROR(linear(dqkv, ba.ln1_f, ba.ln1_h, kAttnW, kAttnB, dln1, c, 3 * c));
    GPT_RETURN_IF_ERROR(layer_norm(dln1, x, kLn1G, kLn1B, ba.mean1, ba.rstd1, other));
    std::swap(cur, other);
  }
  if (sh.embedding) {
    if (g != nullptr) {
      GPT_RETURN_IF_ERROR(Copy(g->embedding, cur, rows * c));
    } else {
      GPT_RETURN_IF_ERROR(EmbeddingBackward(s(), a.tokens, cur, G(ix.wte), G(ix.wpe), b, t, c));
    }
  }
  return cur;
}

absl::Status GpuGpt::Impl::BackwardWeight(Activations& a, const WeightGradInputs& g) {
  const int64_t b = cfg.batch, t = cfg.seq, c = cfg.d_model, h = cfg.d_hidden;
  const int64_t rows = n();
  // Backward's order, so that each parameter gets the same sum.
  for (int64_t l = sh.b1 - 1; l >= sh.b0; --l) {
    const size_t j = static_cast<size_t>(l - sh.b0);
    const BlockActivations& ba = a.blocks[j];
    const BlockGradients& bg = g.blocks[j];
    auto idx = [&](int k) { return ix.Block(l, k); };
    GPT_RETURN_IF_ERROR(LinearWeightGrad(bg.mlp_proj, ba.act_f, ba.act_h, idx(kMlpProjW),
                                         idx(kMlpProjB), rows, h, c));
    GPT_RETURN_IF_ERROR(
        LinearWeightGrad(bg.fc, ba.ln2_f, ba.ln2_h, idx(kFcW), idx(kFcB), rows, c, h));
    GPT_RETURN_IF_ERROR(LayerNormBackward(s(), bg.ln2, ba.x1, P(idx(kLn2G)), ba.mean2, ba.rstd2,
                                          nullptr, G(idx(kLn2G)), G(idx(kLn2B)), rows, c));
    GPT_RETURN_IF_ERROR(LinearWeightGrad(bg.attn_proj, ba.y_f, ba.y_h, idx(kAttnProjW),
                                         idx(kAttnProjB), rows, c, c));
    GPT_RETURN_IF_ERROR(
        LinearWeightGrad(bg.attn, ba.ln1_f, ba.ln1_h, idx(kAttnW), idx(kAttnB), rows, c, 3 * c));
    GPT_RETURN_IF_ERROR(LayerNormBackward(s(), bg.ln1, a.resid[j], P(idx(kLn1G)), ba.mean1,
                                          ba.rstd1, nullptr, G(idx(kLn1G)), G(idx(kLn1B)), rows,
                                          c));
  }
  if (sh.embedding) {
    GPT_RETURN_IF_ERROR(
        EmbeddingBackward(s(), a.tokens, g.embedding, G(ix.wte), G(ix.wpe), b, t, c));
  }
  return absl::OkStatus();
}

absl::Status GpuGpt::Impl::SquaredNorm(bool include_tied_copy) {
  TANDEM_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(w.norm_sq, 0, sizeof(double), s()));
  for (size_t i = 0; i < layout->size(); ++i) {
    if ((*layout)[i].tied_copy && !include_tied_copy) continue;
    GPT_RETURN_IF_ERROR(
        cuda::GradSquaredNorm(s(), G(i), static_cast<int64_t>((*layout)[i].count), w.norm_sq));
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------

GpuGpt::GpuGpt() : impl_(std::make_unique<Impl>()) {}
GpuGpt::~GpuGpt() = default;

absl::StatusOr<std::unique_ptr<GpuGpt>> GpuGpt::Create(const GpuGptConfig& config,
                                                       const AdamWHyper& hyper) {
  absl::StatusOr<GpuGptConfig> cfg = ValidateGpuGptConfig(config);
  if (!cfg.ok()) return cfg.status();
  GPT_RETURN_IF_ERROR(CudaAvailable());
  std::unique_ptr<GpuGpt> g(new GpuGpt());
  g->config_ = *cfg;
  g->hyper_ = hyper;
  g->layout_ = GpuGptParameterLayout(*cfg);
  g->num_params_ = ParameterElements(g->layout_);
  g->memory_ = PlanValidated(*cfg, g->layout_);
  Impl& im = *g->impl_;
  im.cfg = *cfg;
  im.sh = ShapeOf(*cfg);
  im.ix = IndexOf(*cfg);
  im.layout = &g->layout_;
  im.slot_bytes = g->memory_.activations;
  im.grad_bytes = g->memory_.weight_grad_inputs;

  absl::StatusOr<CudaStream> stream = CudaStream::Create();
  if (!stream.ok()) return stream.status();
  im.stream = std::move(*stream);
  absl::StatusOr<CublasHandle> blas = CublasHandle::Create(im.stream.get());
  if (!blas.ok()) return blas.status();
  im.blas = std::move(*blas);
  for (CudaEvent& e : im.ev) {
    absl::StatusOr<CudaEvent> ev = CudaEvent::Create(cudaEventDefault);
    if (!ev.ok()) return ev.status();
    e = std::move(*ev);
  }
  for (DeviceBuffer<float>* b : {&im.params, &im.grads, &im.m, &im.v}) {
    absl::StatusOr<DeviceBuffer<float>> buf = DeviceBuffer<float>::Create(g->num_params_);
    if (!buf.ok()) return buf.status();
    *b = std::move(*buf);
  }
  absl::StatusOr<DeviceBuffer<bf16>> compute =
      DeviceBuffer<bf16>::Create(ComputeCopyElements(g->layout_));
  if (!compute.ok()) return compute.status();
  im.compute = std::move(*compute);
  absl::StatusOr<DeviceBuffer<char>> work = DeviceBuffer<char>::Create(g->memory_.workspace);
  if (!work.ok()) return work.status();
  im.work_mem = std::move(*work);
  Carver work_carver(reinterpret_cast<uintptr_t>(im.work_mem.data()));
  CarveWorkspace(*cfg, work_carver, &im.w);
  // The first slot now, so that a model that cannot hold one micro-batch fails here.
  absl::StatusOr<Slot*> first = im.Acquire();
  if (!first.ok()) return first.status();
  im.Release(*first);

  const std::vector<float> init = InitGpuGptParameters(*cfg, g->layout_);
  GPT_RETURN_IF_ERROR(im.params.CopyFromHost(init.data(), init.size()));
  for (DeviceBuffer<float>* b : {&im.grads, &im.m, &im.v}) {
    GPT_RETURN_IF_ERROR(b->Zero(im.s()));
  }
  for (size_t i = 0; i < g->layout_.size(); ++i) {
    const GpuGptTensor& t = g->layout_[i];
    if (t.compute_copy) {
      GPT_RETURN_IF_ERROR(ConvertToBf16(im.s(), im.P(i), im.compute.data() + t.compute_offset,
                                        static_cast<int64_t>(t.count)));
    }
  }
  GPT_RETURN_IF_ERROR(im.stream.Synchronize());
  return g;
}

bool GpuGpt::has_embedding() const { return impl_->sh.embedding; }
bool GpuGpt::has_head() const { return impl_->sh.head; }
size_t GpuGpt::activation_slots() const { return impl_->slots.size(); }

namespace {
absl::Status CheckIds(const char* what, const int32_t* ids, int64_t rows, int64_t vocab) {
  if (ids == nullptr) return absl::InvalidArgumentError(absl::StrCat("null ", what, "s"));
  for (int64_t i = 0; i < rows; ++i) {
    if (ids[i] < 0 || ids[i] >= vocab) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, " ", ids[i], " at position ", i, " is outside the vocabulary [0, ", vocab, ")"));
    }
  }
  return absl::OkStatus();
}
}  // namespace

absl::StatusOr<double> GpuGpt::Forward(int mb, const int32_t* tokens, const int32_t* targets,
                                       const float* input, float* output, float grad_scale,
                                       bool save) {
  Impl& im = *impl_;
  const int64_t rows = im.n(), c = config_.d_model;
  if (save && im.in_use.contains(mb)) {
    return absl::FailedPreconditionError(
        absl::StrCat("forward of micro-batch ", mb, ": it already has a saved forward"));
  }
  if (im.sh.embedding) {
    GPT_RETURN_IF_ERROR(CheckIds("token", tokens, rows, config_.vocab));
  } else if (input == nullptr) {
    return absl::InvalidArgumentError("forward: a stage without the embedding needs an input");
  }
  if (im.sh.head) {
    GPT_RETURN_IF_ERROR(CheckIds("target", targets, rows, config_.vocab));
  } else if (output == nullptr) {
    return absl::InvalidArgumentError("forward: a stage without the head needs an output");
  }
  absl::StatusOr<Slot*> slot = im.Acquire();
  if (!slot.ok()) return slot.status();
  Activations& a = (*slot)->a;
  auto run = [&]() -> absl::StatusOr<double> {
    const size_t id_bytes = static_cast<size_t>(rows) * sizeof(int32_t);
    TANDEM_CUDA_RETURN_IF_ERROR(cudaEventRecord(im.ev[0].get(), im.s()));
    if (im.sh.embedding) {
      TANDEM_CUDA_RETURN_IF_ERROR(
          cudaMemcpyAsync(a.tokens, tokens, id_bytes, cudaMemcpyHostToDevice, im.s()));
      GPT_RETURN_IF_ERROR(EmbeddingForward(im.s(), a.tokens, im.P(im.ix.wte), im.P(im.ix.wpe),
                                           a.resid[0], config_.batch, config_.seq, c));
    } else {
      GPT_RETURN_IF_ERROR(im.Copy(a.resid[0], input, rows * c));
    }
    if (im.sh.head) {
      TANDEM_CUDA_RETURN_IF_ERROR(
          cudaMemcpyAsync(im.w.targets, targets, id_bytes, cudaMemcpyHostToDevice, im.s()));
    }
    GPT_RETURN_IF_ERROR(im.Forward(a, save ? grad_scale : 0.0f));
    if (!im.sh.head) {
      GPT_RETURN_IF_ERROR(im.Copy(output, a.resid[static_cast<size_t>(im.sh.blocks())], rows * c));
    }
    TANDEM_CUDA_RETURN_IF_ERROR(cudaEventRecord(im.ev[1].get(), im.s()));
    double loss_sum = 0.0;
    if (im.sh.head) {
      TANDEM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(&loss_sum, im.w.loss_sum, sizeof(double),
                                                  cudaMemcpyDeviceToHost, im.s()));
    }
    GPT_RETURN_IF_ERROR(im.stream.Synchronize());
    TANDEM_CUDA_RETURN_IF_ERROR(
        cudaEventElapsedTime(&times_.forward_ms, im.ev[0].get(), im.ev[1].get()));
    return loss_sum;
  };
  absl::StatusOr<double> loss = run();
  if (loss.ok() && save) {
    im.in_use[mb] = *slot;
  } else {
    im.Release(*slot);
  }
  return loss;
}

absl::Status GpuGpt::Backward(int mb, const float* dout, float* din) {
  Impl& im = *impl_;
  const int64_t rows = im.n(), c = config_.d_model;
  auto it = im.in_use.find(mb);
  if (it == im.in_use.end()) {
    return absl::InternalError(absl::StrCat("backward of micro-batch ", mb, " without a forward"));
  }
  if (!im.sh.head && dout == nullptr) {
    return absl::InvalidArgumentError("backward: a stage without the head needs dout");
  }
  if (!im.sh.embedding && din == nullptr) {
    return absl::InvalidArgumentError("backward: a stage without the embedding needs din");
  }
  if (it->second->awaiting_w) {
    return absl::InternalError(
        absl::StrCat("backward of micro-batch ", mb, " whose input gradient already ran (I)"));
  }
  Slot* slot = it->second;
  im.in_use.erase(it);
  absl::Status s = im.TimedBackward(&times_.backward_ms, [&]() -> absl::Status {
    GPT_RETURN_IF_ERROR(im.Copy(im.w.dres_a, im.sh.head ? slot->a.dhead : dout, rows * c));
    absl::StatusOr<float*> dx = im.Backward(slot->a);
    if (!dx.ok()) return dx.status();
    if (!im.sh.embedding) GPT_RETURN_IF_ERROR(im.Copy(din, *dx, rows * c));
    return absl::OkStatus();
  });
  im.Release(slot);
  return s;
}

absl::Status GpuGpt::BackwardInput(int mb, const float* dout, float* din) {
  Impl& im = *impl_;
  const int64_t rows = im.n(), c = config_.d_model;
  auto it = im.in_use.find(mb);
  if (it == im.in_use.end()) {
    return absl::InternalError(absl::StrCat("I of micro-batch ", mb, " without a forward"));
  }
  if (it->second->awaiting_w) {
    return absl::InternalError(absl::StrCat("I of micro-batch ", mb, " twice"));
  }
  if (!im.sh.head && dout == nullptr) {
    return absl::InvalidArgumentError("backward: a stage without the head needs dout");
  }
  if (!im.sh.embedding && din == nullptr) {
    return absl::InvalidArgumentError("backward: a stage without the embedding needs din");
  }
  Slot* slot = it->second;
  GPT_RETURN_IF_ERROR(im.EnsureGradInputs(slot));
  GPT_RETURN_IF_ERROR(im.TimedBackward(&times_.backward_ms, [&]() -> absl::Status {
    GPT_RETURN_IF_ERROR(im.Copy(im.w.dres_a, im.sh.head ? slot->a.dhead : dout, rows * c));
    absl::StatusOr<float*> dx = im.Backward(slot->a, &slot->g);
    if (!dx.ok()) return dx.status();
    if (!im.sh.embedding) GPT_RETURN_IF_ERROR(im.Copy(din, *dx, rows * c));
    return absl::OkStatus();
  }));
  slot->awaiting_w = true;
  return absl::OkStatus();
}

absl::Status GpuGpt::BackwardWeight(int mb) {
  Impl& im = *impl_;
  auto it = im.in_use.find(mb);
  if (it == im.in_use.end() || !it->second->awaiting_w) {
    return absl::InternalError(absl::StrCat("W of micro-batch ", mb, " before its I"));
  }
  Slot* slot = it->second;
  im.in_use.erase(it);
  absl::Status s =
      im.TimedBackward(&times_.backward_ms, [&] { return im.BackwardWeight(slot->a, slot->g); });
  im.Release(slot);
  return s;
}

size_t GpuGpt::SavedBytes(int mb) const {
  auto it = impl_->in_use.find(mb);
  if (it == impl_->in_use.end()) return 0;
  return impl_->slot_bytes + (it->second->awaiting_w ? impl_->grad_bytes : 0);
}

void GpuGpt::DropSaved() {
  for (auto& [mb, slot] : impl_->in_use) impl_->Release(slot);
  impl_->in_use.clear();
}

absl::StatusOr<float> GpuGpt::ForwardBackward(const int32_t* tokens, const int32_t* targets,
                                              int64_t accumulation) {
  Impl& im = *impl_;
  const int64_t rows = im.n();
  if (!im.sh.embedding || !im.sh.head) {
    return absl::InvalidArgumentError("ForwardBackward: the config is a stage, not the model");
  }
  if (tokens == nullptr || targets == nullptr) {
    return absl::InvalidArgumentError("ForwardBackward: null tokens or targets");
  }
  if (accumulation < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("ForwardBackward: accumulation must be >= 1, got ", accumulation));
  }
  const float scale =
      static_cast<float>(1.0 / (static_cast<double>(rows) * static_cast<double>(accumulation)));
  constexpr int kOnly = 0;
  absl::StatusOr<double> loss_sum = Forward(kOnly, tokens, targets, nullptr, nullptr, scale, true);
  if (!loss_sum.ok()) {
    return absl::Status(loss_sum.status().code(),
                        absl::StrCat("ForwardBackward: ", loss_sum.status().message()));
  }
  GPT_RETURN_IF_ERROR(Backward(kOnly, nullptr, nullptr));
  return static_cast<float>(*loss_sum / static_cast<double>(rows));
}

absl::StatusOr<double> GpuGpt::GradSquaredNorm(bool include_tied_copy) {
  Impl& im = *impl_;
  GPT_RETURN_IF_ERROR(im.SquaredNorm(include_tied_copy));
  double sum_sq = 0.0;
  TANDEM_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(&sum_sq, im.w.norm_sq, sizeof(double), cudaMemcpyDeviceToHost, im.s()));
  GPT_RETURN_IF_ERROR(im.stream.Synchronize());
  return sum_sq;
}

absl::StatusOr<float> GpuGpt::GradNorm() {
  absl::StatusOr<double> sum_sq = GradSquaredNorm(/*include_tied_copy=*/true);
  if (!sum_sq.ok()) return sum_sq.status();
  return static_cast<float>(std::sqrt(*sum_sq));
}

absl::StatusOr<float> GpuGpt::Step(float lr, float grad_scale) {
  Impl& im = *impl_;
  if (!std::isfinite(lr)) {
    return absl::InvalidArgumentError(absl::StrCat("Step: lr must be finite, got ", lr));
  }
  if (!(grad_scale > 0.0f) || !std::isfinite(grad_scale)) {
    return absl::InvalidArgumentError(
        absl::StrCat("Step: grad_scale must be finite and > 0, got ", grad_scale));
  }
  TANDEM_CUDA_RETURN_IF_ERROR(cudaEventRecord(im.ev[4].get(), im.s()));
  GPT_RETURN_IF_ERROR(im.SquaredNorm(/*include_tied_copy=*/true));
  if (grad_scale != 1.0f && num_params_ > 0) {
    TANDEM_CUBLAS_RETURN_IF_ERROR(
        cublasSscal(im.blas.get(), static_cast<int>(num_params_), &grad_scale, im.grads.data(), 1));
  }
  AdamWHyper hyper = hyper_;
  hyper.lr = lr;
  const int64_t step = step_ + 1;
  for (size_t i = 0; i < layout_.size(); ++i) {
    const GpuGptTensor& t = layout_[i];
    GPT_RETURN_IF_ERROR(AdamWStep(im.s(), im.P(i), im.G(i), im.m.data() + t.offset,
                                  im.v.data() + t.offset, static_cast<int64_t>(t.count), hyper,
                                  t.decay, step));
    if (t.compute_copy) {
      GPT_RETURN_IF_ERROR(ConvertToBf16(im.s(), im.P(i), im.compute.data() + t.compute_offset,
                                        static_cast<int64_t>(t.count)));
    }
  }
  TANDEM_CUDA_RETURN_IF_ERROR(cudaEventRecord(im.ev[5].get(), im.s()));
  double sum_sq = 0.0;
  TANDEM_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(&sum_sq, im.w.norm_sq, sizeof(double), cudaMemcpyDeviceToHost, im.s()));
  GPT_RETURN_IF_ERROR(im.stream.Synchronize());
  step_ = step;
  TANDEM_CUDA_RETURN_IF_ERROR(
      cudaEventElapsedTime(&times_.optimizer_ms, im.ev[4].get(), im.ev[5].get()));
  return static_cast<float>(std::sqrt(sum_sq));
}

absl::Status GpuGpt::ZeroGradients() {
  GPT_RETURN_IF_ERROR(impl_->grads.Zero(impl_->s()));
  return impl_->stream.Synchronize();
}

absl::Status GpuGpt::CheckIndex(size_t index, size_t count) const {
  if (index >= layout_.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("parameter index ", index, " out of range [0, ", layout_.size(), ")"));
  }
  if (count != layout_[index].count) {
    return absl::InvalidArgumentError(
        absl::StrCat(layout_[index].name, " has ", layout_[index].count, " elements, got ", count));
  }
  return absl::OkStatus();
}

namespace {
// A synchronous device-to-host copy of `count` floats.
absl::Status Download(const float* device, float* host, size_t count) {
  TANDEM_CUDA_RETURN_IF_ERROR(
      cudaMemcpy(host, device, count * sizeof(float), cudaMemcpyDeviceToHost));
  return absl::OkStatus();
}
absl::Status Upload(const float* host, float* device, size_t count) {
  TANDEM_CUDA_RETURN_IF_ERROR(
      cudaMemcpy(device, host, count * sizeof(float), cudaMemcpyHostToDevice));
  TANDEM_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(cudaStreamLegacy));
  return absl::OkStatus();
}
}  // namespace

absl::Status GpuGpt::SetParameter(size_t index, const float* host, size_t count) {
  GPT_RETURN_IF_ERROR(CheckIndex(index, count));
  Impl& im = *impl_;
  const GpuGptTensor& t = layout_[index];
  // Ordered after any work on the model's stream that still reads the old values.
  GPT_RETURN_IF_ERROR(im.stream.Synchronize());
  GPT_RETURN_IF_ERROR(Upload(host, im.P(index), count));
  if (t.compute_copy) {
    GPT_RETURN_IF_ERROR(ConvertToBf16(im.s(), im.P(index), im.compute.data() + t.compute_offset,
                                      static_cast<int64_t>(t.count)));
  }
  return im.stream.Synchronize();
}

absl::Status GpuGpt::GetParameter(size_t index, float* host, size_t count) const {
  GPT_RETURN_IF_ERROR(CheckIndex(index, count));
  GPT_RETURN_IF_ERROR(impl_->stream.Synchronize());
  return Download(impl_->P(index), host, count);
}

absl::Status GpuGpt::GetGradient(size_t index, float* host, size_t count) const {
  GPT_RETURN_IF_ERROR(CheckIndex(index, count));
  GPT_RETURN_IF_ERROR(impl_->stream.Synchronize());
  return Download(impl_->G(index), host, count);
}

absl::Status GpuGpt::GetMoments(size_t index, float* m, float* v, size_t count) const {
  GPT_RETURN_IF_ERROR(CheckIndex(index, count));
  GPT_RETURN_IF_ERROR(impl_->stream.Synchronize());
  const size_t offset = layout_[index].offset;
  GPT_RETURN_IF_ERROR(Download(impl_->m.data() + offset, m, count));
  return Download(impl_->v.data() + offset, v, count);
}

absl::Status GpuGpt::SetMoments(size_t index, const float* m, const float* v, size_t count) {
  GPT_RETURN_IF_ERROR(CheckIndex(index, count));
  GPT_RETURN_IF_ERROR(impl_->stream.Synchronize());
  const size_t offset = layout_[index].offset;
  GPT_RETURN_IF_ERROR(Upload(m, impl_->m.data() + offset, count));
  return Upload(v, impl_->v.data() + offset, count);
}

float* GpuGpt::DeviceGradient(size_t index) {
  return index < layout_.size() ? impl_->G(index) : nullptr;
}

absl::Status GpuGpt::AddToGradient(size_t index, const float* other) {
  GPT_RETURN_IF_ERROR(CheckIndex(index, index < layout_.size() ? layout_[index].count : 0));
  Impl& im = *impl_;
  float* g = im.G(index);
  GPT_RETURN_IF_ERROR(Add(im.s(), g, other, g, static_cast<int64_t>(layout_[index].count)));
  return im.stream.Synchronize();
}

absl::Status GpuGpt::CopyGradientFrom(size_t index, const float* other) {
  GPT_RETURN_IF_ERROR(CheckIndex(index, index < layout_.size() ? layout_[index].count : 0));
  Impl& im = *impl_;
  GPT_RETURN_IF_ERROR(im.Copy(im.G(index), other, static_cast<int64_t>(layout_[index].count)));
  return im.stream.Synchronize();
}

#undef GPT_RETURN_IF_ERROR

}  // namespace tandem::worker::cuda
