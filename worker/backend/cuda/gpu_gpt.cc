#include "worker/backend/cuda/gpu_gpt.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
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
constexpr size_t kWte = 0, kWpe = 1, kFirstBlock = 2;

size_t BlockIndex(int64_t layer, int k) {
  return kFirstBlock + static_cast<size_t>(layer) * kTensorsPerBlock + static_cast<size_t>(k);
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

struct Activations {
  std::vector<float*> resid;  // L + 1 of (N, C): resid[0] embedding out, resid[l + 1] block l out
  std::vector<BlockActivations> blocks;
  float* lnf_f = nullptr;  // (N, C) ln_f(x), the input of the LM head
  bf16* lnf_h = nullptr;
  float* meanf = nullptr;   // (N)
  float* rstdf = nullptr;   // (N)
  float* logits = nullptr;  // (N, V); softmax - onehot after the loss
  float* losses = nullptr;  // (N)
};

struct Workspace {
  int32_t* tokens = nullptr;     // (N)
  int32_t* targets = nullptr;    // (N)
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
  const size_t n = static_cast<size_t>(cfg.batch * cfg.seq), c = static_cast<size_t>(cfg.d_model),
               h = static_cast<size_t>(cfg.d_hidden), v = static_cast<size_t>(cfg.vocab);
  const size_t att = static_cast<size_t>(cfg.batch * cfg.n_head) * static_cast<size_t>(cfg.seq) *
                     static_cast<size_t>(cfg.seq);
  a->resid.clear();
  for (int64_t l = 0; l <= cfg.n_layer; ++l) a->resid.push_back(r.Take<float>(n * c));
  a->blocks.assign(static_cast<size_t>(cfg.n_layer), BlockActivations{});
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
  if (h16) {
    a->lnf_h = r.Take<bf16>(n * c);
  } else {
    a->lnf_f = r.Take<float>(n * c);
  }
  a->meanf = r.Take<float>(n);
  a->rstdf = r.Take<float>(n);
  a->logits = r.Take<float>(n * v);
  a->losses = r.Take<float>(n);
}

void CarveWorkspace(const GpuGptConfig& cfg, Carver& r, Workspace* w) {
  const bool h16 = cfg.precision == GpuPrecision::kBf16;
  const size_t n = static_cast<size_t>(cfg.batch * cfg.seq), c = static_cast<size_t>(cfg.d_model),
               h = static_cast<size_t>(cfg.d_hidden), v = static_cast<size_t>(cfg.vocab);
  w->tokens = r.Take<int32_t>(n);
  w->targets = r.Take<int32_t>(n);
  w->loss_sum = r.Take<double>(1);
  w->norm_sq = r.Take<double>(1);
  if (h16) {
    w->out_f = r.Take<float>(n * std::max(c, h));
    w->dout_h = r.Take<bf16>(n * std::max({v, h, 3 * c}));
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
  Carver act(0), work(0);
  Activations a;
  Workspace w;
  CarveActivations(cfg, act, &a);
  CarveWorkspace(cfg, work, &w);
  m.activations = act.used();
  m.workspace = work.used();
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
  const int64_t c = cfg.d_model, h = cfg.d_hidden, v = cfg.vocab;
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
  // The tied wte is also the LM head's GEMM weight.
  add("transformer.wte.weight", {v, c}, true, cfg.tie_embeddings);
  add("transformer.wpe.weight", {cfg.seq_len, c}, true, false);
  for (int64_t i = 0; i < cfg.n_layer; ++i) {
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
  add("transformer.ln_f.weight", {c}, false, false);
  add("transformer.ln_f.bias", {c}, false, false);
  if (!cfg.tie_embeddings) add("lm_head.weight", {v, c}, true, true);
  return layout;
}

std::vector<float> InitGpuGptParameters(const GpuGptConfig& cfg,
                                        const std::vector<GpuGptTensor>& layout) {
  std::vector<float> p(ParameterElements(layout), 0.0f);
  auto at = [&](size_t i) { return p.data() + layout[i].offset; };
  // Embedding: Rng(MixSeed(seed, 0)) draws wte, then wpe.
  {
    Rng rng(MixSeed(cfg.seed, 0));
    FillNormal(rng, kInitStd, at(kWte), layout[kWte].count);
    FillNormal(rng, kInitStd, at(kWpe), layout[kWpe].count);
  }
  const float proj_std =
      kInitStd / std::sqrt(2.0f * static_cast<float>(std::max<int64_t>(cfg.n_layer, 1)));
  for (int64_t l = 0; l < cfg.n_layer; ++l) {
    std::fill_n(at(BlockIndex(l, kLn1G)), layout[BlockIndex(l, kLn1G)].count, 1.0f);
    std::fill_n(at(BlockIndex(l, kLn2G)), layout[BlockIndex(l, kLn2G)].count, 1.0f);
    // Rng(MixSeed(seed, l + 1)): c_attn, attn.c_proj, c_fc, mlp.c_proj.
    Rng rng(MixSeed(cfg.seed, static_cast<uint64_t>(l) + 1));
    for (auto [k, stddev] : {std::pair{kAttnW, kInitStd},
                             {kAttnProjW, proj_std},
                             {kFcW, kInitStd},
                             {kMlpProjW, proj_std}}) {
      FillNormal(rng, stddev, at(BlockIndex(l, k)), layout[BlockIndex(l, k)].count);
    }
  }
  const size_t lnf_g = BlockIndex(cfg.n_layer, 0);
  std::fill_n(at(lnf_g), layout[lnf_g].count, 1.0f);
  if (!cfg.tie_embeddings) {
    Rng rng(MixSeed(cfg.seed, static_cast<uint64_t>(cfg.n_layer) + 1));
    FillNormal(rng, kInitStd, at(lnf_g + 2), layout[lnf_g + 2].count);
  }
  return p;
}

absl::StatusOr<GpuGptMemory> PlanGpuGptMemory(const GpuGptConfig& config) {
  absl::StatusOr<GpuGptConfig> cfg = ValidateGpuGptConfig(config);
  if (!cfg.ok()) return cfg.status();
  return PlanValidated(*cfg, GpuGptParameterLayout(*cfg));
}

// ---------------------------------------------------------------------------------------

struct GpuGpt::Impl {
  GpuGptConfig cfg;
  const std::vector<GpuGptTensor>* layout = nullptr;
  CudaStream stream;
  CublasHandle blas;
  DeviceBuffer<float> params, grads, m, v;  // (P) each, layout order
  DeviceBuffer<bf16> compute;               // the GEMM weights' bf16 copies (kBf16)
  DeviceBuffer<char> act_mem, work_mem;
  Activations a;
  Workspace w;
  // fwd_start, fwd_end (= bwd_start), bwd_end, opt_start, opt_end.
  CudaEvent ev[5];
  size_t head_w = 0;  // the LM head's weight: wte when tied, lm_head.weight otherwise

  bool bf16_mode() const { return cfg.precision == GpuPrecision::kBf16; }
  cudaStream_t s() const { return stream.get(); }
  int64_t n() const { return cfg.batch * cfg.seq; }
  float* P(size_t i) { return params.data() + (*layout)[i].offset; }
  float* G(size_t i) { return grads.data() + (*layout)[i].offset; }
  const bf16* H(size_t i) { return compute.data() + (*layout)[i].compute_offset; }

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

  absl::Status Forward();
  absl::Status Backward(float loss_scale);
  absl::Status SquaredNorm();
};

#define GPT_RETURN_IF_ERROR(expr)                                           \
  do {                                                                      \
    if (absl::Status tandem_s_ = (expr); !tandem_s_.ok()) return tandem_s_; \
  } while (false)

absl::Status GpuGpt::Impl::Forward() {
  const int64_t b = cfg.batch, t = cfg.seq, c = cfg.d_model, h = cfg.d_hidden, nh = cfg.n_head;
  const int64_t rows = n();
  GPT_RETURN_IF_ERROR(EmbeddingForward(s(), w.tokens, P(kWte), P(kWpe), a.resid[0], b, t, c));
  for (int64_t l = 0; l < cfg.n_layer; ++l) {
    BlockActivations& ba = a.blocks[static_cast<size_t>(l)];
    const float* x = a.resid[static_cast<size_t>(l)];
    float* out = a.resid[static_cast<size_t>(l) + 1];
    auto idx = [&](int k) { return BlockIndex(l, k); };
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
  // Head: ln_f, logits = ln_f W^T, softmax cross-entropy in place.
  const size_t lnf = BlockIndex(cfg.n_layer, 0);
  GPT_RETURN_IF_ERROR(LayerNormForward(s(), a.resid[static_cast<size_t>(cfg.n_layer)], P(lnf),
                                       P(lnf + 1), OutF(a.lnf_f), a.meanf, a.rstdf, rows, c));
  GPT_RETURN_IF_ERROR(Round(a.lnf_h, rows * c));
  GPT_RETURN_IF_ERROR(Linear(a.lnf_f, a.lnf_h, head_w, -1, a.logits, rows, c, cfg.vocab));
  return SoftmaxCrossEntropyInPlace(s(), a.logits, w.targets, a.losses, w.loss_sum, rows,
                                    cfg.vocab);
}

absl::Status GpuGpt::Impl::Backward(float loss_scale) {
  const int64_t b = cfg.batch, t = cfg.seq, c = cfg.d_model, h = cfg.d_hidden, nh = cfg.n_head;
  const int64_t v = cfg.vocab, rows = n();
  // Head: d ln_f = scale (p - onehot) W; dW += scale (p - onehot)^T ln_f.
  const size_t lnf = BlockIndex(cfg.n_layer, 0);
  GPT_RETURN_IF_ERROR(Zero(w.dsmall, rows * c));
  if (bf16_mode()) {
    GPT_RETURN_IF_ERROR(ScaledConvertToBf16(s(), a.logits, loss_scale, w.dout_h, rows * v));
    GPT_RETURN_IF_ERROR(LinearBackward(blas.get(), s(), w.dout_h, a.lnf_h, H(head_w), w.dsmall,
                                       G(head_w), nullptr, rows, c, v));
  } else {
    GPT_RETURN_IF_ERROR(ScaledLinearBackward(blas.get(), s(), a.logits, a.lnf_f, P(head_w),
                                             loss_scale, w.dsmall, G(head_w), rows, c, v));
  }
  float* cur = w.dres_a;    // d loss / d (the current block's output)
  float* other = w.dres_b;  // becomes d loss / d (its input)
  GPT_RETURN_IF_ERROR(Zero(cur, rows * c));
  GPT_RETURN_IF_ERROR(LayerNormBackward(s(), w.dsmall, a.resid[static_cast<size_t>(cfg.n_layer)],
                                        P(lnf), a.meanf, a.rstdf, cur, G(lnf), G(lnf + 1), rows,
                                        c));
  for (int64_t l = cfg.n_layer - 1; l >= 0; --l) {
    BlockActivations& ba = a.blocks[static_cast<size_t>(l)];
    const float* x = a.resid[static_cast<size_t>(l)];
    auto idx = [&](int k) { return BlockIndex(l, k); };
    // MLP branch: dx1 = dout + ln_2'(c_fc'(gelu'(c_proj'(dout)))).
    float* dact = w.dbig;
    GPT_RETURN_IF_ERROR(Zero(dact, rows * h));
    GPT_RETURN_IF_ERROR(
        LinearGrad(cur, ba.act_f, ba.act_h, idx(kMlpProjW), idx(kMlpProjB), dact, rows, h, c));
    GPT_RETURN_IF_ERROR(Zero(w.dpre, rows * h));
    GPT_RETURN_IF_ERROR(GeluBackward(s(), ba.pre, dact, w.dpre, rows * h));
    GPT_RETURN_IF_ERROR(Zero(w.dsmall, rows * c));
    GPT_RETURN_IF_ERROR(
        LinearGrad(w.dpre, ba.ln2_f, ba.ln2_h, idx(kFcW), idx(kFcB), w.dsmall, rows, c, h));
    TANDEM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(
        other, cur, static_cast<size_t>(rows * c) * sizeof(float), cudaMemcpyDeviceToDevice, s()));
    GPT_RETURN_IF_ERROR(LayerNormBackward(s(), w.dsmall, ba.x1, P(idx(kLn2G)), ba.mean2, ba.rstd2,
                                          other, G(idx(kLn2G)), G(idx(kLn2B)), rows, c));
    // Attention branch: dx = dx1 + ln_1'(c_attn'(attn'(c_proj'(dx1)))).
    GPT_RETURN_IF_ERROR(Zero(w.dsmall, rows * c));
    GPT_RETURN_IF_ERROR(
        LinearGrad(other, ba.y_f, ba.y_h, idx(kAttnProjW), idx(kAttnProjB), w.dsmall, rows, c, c));
    float* dqkv = w.dbig;
    GPT_RETURN_IF_ERROR(Zero(dqkv, rows * 3 * c));
    GPT_RETURN_IF_ERROR(CausalAttentionBackward(blas.get(), s(), w.dsmall, ba.qkv, ba.att, dqkv,
                                                w.att_scratch, b, t, c, nh));
    GPT_RETURN_IF_ERROR(Zero(w.dsmall, rows * c));
    GPT_RETURN_IF_ERROR(
        LinearGrad(dqkv, ba.ln1_f, ba.ln1_h, idx(kAttnW), idx(kAttnB), w.dsmall, rows, c, 3 * c));
    GPT_RETURN_IF_ERROR(LayerNormBackward(s(), w.dsmall, x, P(idx(kLn1G)), ba.mean1, ba.rstd1,
                                          other, G(idx(kLn1G)), G(idx(kLn1B)), rows, c));
    std::swap(cur, other);
  }
  return EmbeddingBackward(s(), w.tokens, cur, G(kWte), G(kWpe), b, t, c);
}

absl::Status GpuGpt::Impl::SquaredNorm() {
  TANDEM_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(w.norm_sq, 0, sizeof(double), s()));
  for (size_t i = 0; i < layout->size(); ++i) {
    GPT_RETURN_IF_ERROR(
        GradSquaredNorm(s(), G(i), static_cast<int64_t>((*layout)[i].count), w.norm_sq));
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
  im.layout = &g->layout_;
  im.head_w = cfg->tie_embeddings ? kWte : g->layout_.size() - 1;

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
  absl::StatusOr<DeviceBuffer<char>> act = DeviceBuffer<char>::Create(g->memory_.activations);
  if (!act.ok()) return act.status();
  im.act_mem = std::move(*act);
  absl::StatusOr<DeviceBuffer<char>> work = DeviceBuffer<char>::Create(g->memory_.workspace);
  if (!work.ok()) return work.status();
  im.work_mem = std::move(*work);
  Carver act_carver(reinterpret_cast<uintptr_t>(im.act_mem.data()));
  Carver work_carver(reinterpret_cast<uintptr_t>(im.work_mem.data()));
  CarveActivations(*cfg, act_carver, &im.a);
  CarveWorkspace(*cfg, work_carver, &im.w);

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

absl::StatusOr<float> GpuGpt::ForwardBackward(const int32_t* tokens, const int32_t* targets,
                                              int64_t accumulation) {
  Impl& im = *impl_;
  const int64_t rows = im.n();
  if (tokens == nullptr || targets == nullptr) {
    return absl::InvalidArgumentError("ForwardBackward: null tokens or targets");
  }
  if (accumulation < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("ForwardBackward: accumulation must be >= 1, got ", accumulation));
  }
  for (int64_t i = 0; i < rows; ++i) {
    for (auto [what, id] : {std::pair{"token", tokens[i]}, {"target", targets[i]}}) {
      if (id < 0 || id >= config_.vocab) {
        return absl::InvalidArgumentError(
            absl::StrCat("ForwardBackward: ", what, " ", id, " at position ", i,
                         " is outside the vocabulary [0, ", config_.vocab, ")"));
      }
    }
  }
  const size_t id_bytes = static_cast<size_t>(rows) * sizeof(int32_t);
  TANDEM_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(im.w.tokens, tokens, id_bytes, cudaMemcpyHostToDevice, im.s()));
  TANDEM_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(im.w.targets, targets, id_bytes, cudaMemcpyHostToDevice, im.s()));
  TANDEM_CUDA_RETURN_IF_ERROR(cudaEventRecord(im.ev[0].get(), im.s()));
  GPT_RETURN_IF_ERROR(im.Forward());
  TANDEM_CUDA_RETURN_IF_ERROR(cudaEventRecord(im.ev[1].get(), im.s()));
  const float scale =
      static_cast<float>(1.0 / (static_cast<double>(rows) * static_cast<double>(accumulation)));
  GPT_RETURN_IF_ERROR(im.Backward(scale));
  TANDEM_CUDA_RETURN_IF_ERROR(cudaEventRecord(im.ev[2].get(), im.s()));
  double loss_sum = 0.0;
  TANDEM_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(&loss_sum, im.w.loss_sum, sizeof(double), cudaMemcpyDeviceToHost, im.s()));
  GPT_RETURN_IF_ERROR(im.stream.Synchronize());
  TANDEM_CUDA_RETURN_IF_ERROR(
      cudaEventElapsedTime(&times_.forward_ms, im.ev[0].get(), im.ev[1].get()));
  TANDEM_CUDA_RETURN_IF_ERROR(
      cudaEventElapsedTime(&times_.backward_ms, im.ev[1].get(), im.ev[2].get()));
  return static_cast<float>(loss_sum / static_cast<double>(rows));
}

absl::StatusOr<float> GpuGpt::GradNorm() {
  Impl& im = *impl_;
  GPT_RETURN_IF_ERROR(im.SquaredNorm());
  double sum_sq = 0.0;
  TANDEM_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(&sum_sq, im.w.norm_sq, sizeof(double), cudaMemcpyDeviceToHost, im.s()));
  GPT_RETURN_IF_ERROR(im.stream.Synchronize());
  return static_cast<float>(std::sqrt(sum_sq));
}

absl::StatusOr<float> GpuGpt::Step(float lr) {
  Impl& im = *impl_;
  if (!std::isfinite(lr)) {
    return absl::InvalidArgumentError(absl::StrCat("Step: lr must be finite, got ", lr));
  }
  TANDEM_CUDA_RETURN_IF_ERROR(cudaEventRecord(im.ev[3].get(), im.s()));
  GPT_RETURN_IF_ERROR(im.SquaredNorm());
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
  TANDEM_CUDA_RETURN_IF_ERROR(cudaEventRecord(im.ev[4].get(), im.s()));
  double sum_sq = 0.0;
  TANDEM_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(&sum_sq, im.w.norm_sq, sizeof(double), cudaMemcpyDeviceToHost, im.s()));
  GPT_RETURN_IF_ERROR(im.stream.Synchronize());
  step_ = step;
  TANDEM_CUDA_RETURN_IF_ERROR(
      cudaEventElapsedTime(&times_.optimizer_ms, im.ev[3].get(), im.ev[4].get()));
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

absl::Status GpuGpt::SetParameter(size_t index, const float* host, size_t count) {
  GPT_RETURN_IF_ERROR(CheckIndex(index, count));
  Impl& im = *impl_;
  const GpuGptTensor& t = layout_[index];
  // Ordered after any work on the model's stream that still reads the old values.
  GPT_RETURN_IF_ERROR(im.stream.Synchronize());
  TANDEM_CUDA_RETURN_IF_ERROR(
      cudaMemcpy(im.P(index), host, count * sizeof(float), cudaMemcpyHostToDevice));
  TANDEM_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(cudaStreamLegacy));
  if (t.compute_copy) {
    GPT_RETURN_IF_ERROR(ConvertToBf16(im.s(), im.P(index), im.compute.data() + t.compute_offset,
                                      static_cast<int64_t>(t.count)));
  }
  return im.stream.Synchronize();
}

absl::Status GpuGpt::GetParameter(size_t index, float* host, size_t count) const {
  GPT_RETURN_IF_ERROR(CheckIndex(index, count));
  GPT_RETURN_IF_ERROR(impl_->stream.Synchronize());
  TANDEM_CUDA_RETURN_IF_ERROR(
      cudaMemcpy(host, impl_->P(index), count * sizeof(float), cudaMemcpyDeviceToHost));
  return absl::OkStatus();
}

absl::Status GpuGpt::GetGradient(size_t index, float* host, size_t count) const {
  GPT_RETURN_IF_ERROR(CheckIndex(index, count));
  GPT_RETURN_IF_ERROR(impl_->stream.Synchronize());
  TANDEM_CUDA_RETURN_IF_ERROR(
      cudaMemcpy(host, impl_->G(index), count * sizeof(float), cudaMemcpyDeviceToHost));
  return absl::OkStatus();
}

#undef GPT_RETURN_IF_ERROR

}  // namespace tandem::worker::cuda
