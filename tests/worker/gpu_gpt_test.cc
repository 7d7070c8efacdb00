// GpuGpt (worker/backend/cuda/gpu_gpt.h) against the CPU gpt layers (worker/model/gpt.h) run
// directly through the Layer interface, on a tiny GPT (2 layers, d 64, 4 heads, T 16, V 128)
// and at the gpt2 preset's shapes.
//
// Tolerances:
//  - fp32 mode, one micro-batch: |loss_gpu - loss_cpu| <= 1e-5 |loss_cpu|; every gradient
//    element within kGradTol = 1e-4 x max |grad| of its tensor (plus 1e-7 absolute, for
//    tensors whose gradient is ~0). cuBLAS and OpenBLAS sum in different orders, and the
//    device's tanhf / expf differ from the CPU's by a few ulps.
//  - fp32 mode, 3 AdamW steps: every step's loss and global gradient norm within 1e-4
//    relative of the CPU's (AdamW's update is ~lr sign(g) at first, so a gradient element that
//    is ~0 on both may move the weights differently by up to lr; with lr 1e-3 the losses still
//    agree far inside that).
//  - bf16 mode (bf16 GEMM operands, fp32 accumulation) against fp32 mode from the same weights:
//    loss within 2e-2 relative; global gradient norm within 5e-2 relative.
//  - the gpt2 preset's shapes (12 layers, d 768, 12 heads, V 50304, T 1024, one sequence) in
//    fp32 against the CPU layers, one forward and backward: loss within 1e-4 relative, global
//    gradient norm within 1e-3 relative, and for wte, the first block's c_attn weight, the last
//    block's mlp c_proj weight and ln_f every element within 1e-3 x max |grad| of its tensor
//    (see kGpt2* for why); then bf16 at those shapes against fp32 as above, over one AdamW
//    step.
// The host-only tests (validation, layout, initialisation, memory plan) are in
// gpu_gpt_layout_test.cc; these skip with "no CUDA device: <status>" when CudaAvailable() fails.
#include "worker/backend/cuda/gpu_gpt.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tests/worker/gpu_gpt_test_util.h"
#include "worker/backend/cuda/device.h"
#include "worker/backend/cuda/device_buffer.h"
#include "worker/model/gpt.h"
#include "worker/model/optimizer.h"
#include "worker/model/random.h"

namespace tandem::worker::cuda {
namespace {

constexpr double kGradTol = 1e-4;
constexpr double kGradAbsTol = 1e-7;
constexpr double kLossTol = 1e-5;
constexpr double kStepTol = 1e-4;
constexpr double kBf16LossTol = 2e-2;
constexpr double kBf16NormTol = 5e-2;
// At the gpt2 preset's shapes, fp32 on both sides, the differences are rounding only: cuBLAS
// and OpenBLAS sum the GEMMs' K terms (768, 3072, 1024 rows for the weight gradients, 50304
// for the head's input gradient) in other orders, the softmaxes run over up to 1024 keys and
// 50304 logits, and the device's expf / tanhf differ by a few ulps. Each GEMM output then
// differs by ~1e-6 relative, and through 12 blocks of backward by ~1e-5 at most. The loss (a
// mean of 1024 cross-entropies near ln 50304) keeps that: 1e-4 relative is 10x margin. The
// gradients get 10x the tiny model's 1e-4 (12 blocks deep instead of 2, K up to 50304
// instead of 128): every element within 1e-3 of its tensor's max |grad|, and the global norm
// within 1e-3 relative. A wrong index, a missing term or a mis-scaled tensor is off by O(1).
// Only named tensors are checked element by element: some gradients are zero in exact
// arithmetic (the key third of c_attn.bias: softmax ignores a per-row shift), so theirs is
// rounding noise on both sides, which no relative tolerance bounds; the test prints the
// worst tensors' figures to calibrate from.
constexpr double kGpt2LossTol = 1e-4;
constexpr double kGpt2NormTol = 1e-3;
constexpr double kGpt2GradTol = 1e-3;

#define SKIP_WITHOUT_DEVICE()                        \
  do {                                               \
    if (absl::Status s = CudaAvailable(); !s.ok()) { \
      GTEST_SKIP() << "no CUDA device: " << s;       \
    }                                                \
  } while (false)

void RandomBatch(uint64_t seed, const GpuGptConfig& c, IntTensor& tokens, IntTensor& targets) {
  Rng rng(seed);
  tokens.Reset({c.batch, c.seq});
  targets.Reset({c.batch, c.seq});
  for (size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] = static_cast<int32_t>(rng.Below(static_cast<uint64_t>(c.vocab)));
    targets[i] = static_cast<int32_t>(rng.Below(static_cast<uint64_t>(c.vocab)));
  }
}

TEST(GpuGptTest, CreateWithoutADeviceFails) {
  if (CudaAvailable().ok()) GTEST_SKIP() << "a CUDA device is present; nothing fails here";
  const absl::StatusOr<std::unique_ptr<GpuGpt>> g =
      GpuGpt::Create(TinyConfig(GpuPrecision::kFp32), AdamWHyper{});
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), absl::StatusCode::kFailedPrecondition) << g.status();
}

std::unique_ptr<GpuGpt> MakeGpu(const GpuGptConfig& c, const AdamWHyper& hyper = AdamWHyper{}) {
  absl::StatusOr<std::unique_ptr<GpuGpt>> g = GpuGpt::Create(c, hyper);
  EXPECT_TRUE(g.ok()) << g.status();
  return g.ok() ? std::move(*g) : nullptr;
}

void ExpectGradientsMatch(GpuGpt& gpu, CpuGpt& cpu) {
  const std::vector<GpuGptTensor>& layout = gpu.layout();
  for (size_t i = 0; i < layout.size(); ++i) {
    std::vector<float> got(layout[i].count);
    ASSERT_TRUE(gpu.GetGradient(i, got.data(), got.size()).ok());
    ASSERT_EQ(cpu.matching[i]->grad.size(), got.size()) << layout[i].name;
    const GradError e = CompareGradient(got.data(), cpu.matching[i]->grad.data(), got.size());
    EXPECT_LE(e.max_err, kGradTol * e.max_ref + kGradAbsTol)
        << layout[i].name << ": max |grad| " << e.max_ref;
  }
}

TEST(GpuGptTest, Fp32LossAndGradientsMatchTheCpuLayers) {
  SKIP_WITHOUT_DEVICE();
  for (bool tied : {true, false}) {
    const GpuGptConfig c = TinyConfig(GpuPrecision::kFp32, tied);
    std::unique_ptr<GpuGpt> gpu = MakeGpu(c);
    ASSERT_NE(gpu, nullptr);
    CpuGpt cpu(c);
    IntTensor tokens, targets;
    RandomBatch(11, c, tokens, targets);
    const absl::StatusOr<float> loss = gpu->ForwardBackward(tokens.data(), targets.data());
    ASSERT_TRUE(loss.ok()) << loss.status();
    const float want = cpu.ForwardBackward(tokens, targets, c.batch * c.seq);
    EXPECT_NEAR(*loss, want, kLossTol * want) << "tied " << tied;
    cpu.TieGradients();
    ExpectGradientsMatch(*gpu, cpu);
    const absl::StatusOr<float> norm = gpu->GradNorm();
    ASSERT_TRUE(norm.ok()) << norm.status();
    EXPECT_NEAR(*norm, cpu.GradNorm(), kStepTol * cpu.GradNorm());
    EXPECT_GT(gpu->last_times().forward_ms, 0.0f);
    EXPECT_GT(gpu->last_times().backward_ms, 0.0f);
  }
}

TEST(GpuGptTest, Fp32ThreeAdamWStepsMatchTheCpu) {
  SKIP_WITHOUT_DEVICE();
  const GpuGptConfig c = TinyConfig(GpuPrecision::kFp32);
  AdamWHyper hyper;
  hyper.beta1 = 0.9f;
  hyper.beta2 = 0.95f;
  hyper.eps = 1e-8f;
  hyper.weight_decay = 0.1f;
  constexpr float kLr = 1e-3f;
  std::unique_ptr<GpuGpt> gpu = MakeGpu(c, hyper);
  ASSERT_NE(gpu, nullptr);
  CpuGpt cpu(c);
  AdamWOptions options;
  options.beta1 = hyper.beta1;
  options.beta2 = hyper.beta2;
  options.eps = hyper.eps;
  options.weight_decay = hyper.weight_decay;
  AdamW cpu_opt(cpu.params, options);
  for (int step = 0; step < 4; ++step) {
    IntTensor tokens, targets;
    RandomBatch(100 + step, c, tokens, targets);
    const absl::StatusOr<float> loss = gpu->ForwardBackward(tokens.data(), targets.data());
    ASSERT_TRUE(loss.ok()) << loss.status();
    const float want = cpu.ForwardBackward(tokens, targets, c.batch * c.seq);
    EXPECT_NEAR(*loss, want, kStepTol * want) << "step " << step;
    if (step == 3) break;  // the loss after three updates
    cpu.TieGradients();
    const double cpu_norm = cpu.GradNorm();
    cpu_opt.Step(kLr);
    const absl::StatusOr<float> norm = gpu->Step(kLr);
    ASSERT_TRUE(norm.ok()) << norm.status();
    EXPECT_NEAR(*norm, cpu_norm, kStepTol * cpu_norm) << "step " << step;
    EXPECT_GT(gpu->last_times().optimizer_ms, 0.0f);
  }
  EXPECT_EQ(gpu->steps(), 3);
}

TEST(GpuGptTest, Bf16StaysCloseToFp32) {
  SKIP_WITHOUT_DEVICE();
  std::unique_ptr<GpuGpt> f32 = MakeGpu(TinyConfig(GpuPrecision::kFp32));
  std::unique_ptr<GpuGpt> b16 = MakeGpu(TinyConfig(GpuPrecision::kBf16));
  ASSERT_NE(f32, nullptr);
  ASSERT_NE(b16, nullptr);
  const GpuGptConfig c = f32->config();
  for (int step = 0; step < 3; ++step) {
    IntTensor tokens, targets;
    RandomBatch(200 + step, c, tokens, targets);
    const absl::StatusOr<float> l32 = f32->ForwardBackward(tokens.data(), targets.data());
    const absl::StatusOr<float> l16 = b16->ForwardBackward(tokens.data(), targets.data());
    ASSERT_TRUE(l32.ok()) << l32.status();
    ASSERT_TRUE(l16.ok()) << l16.status();
    EXPECT_NEAR(*l16, *l32, kBf16LossTol * *l32) << "step " << step;
    const absl::StatusOr<float> n32 = f32->Step(1e-3f);
    const absl::StatusOr<float> n16 = b16->Step(1e-3f);
    ASSERT_TRUE(n32.ok()) << n32.status();
    ASSERT_TRUE(n16.ok()) << n16.status();
    EXPECT_NEAR(*n16, *n32, kBf16NormTol * *n32) << "step " << step;
  }
}

TEST(GpuGptTest, AccumulationSumsToTheMeanOverMicroBatches) {
  SKIP_WITHOUT_DEVICE();
  const GpuGptConfig c = TinyConfig(GpuPrecision::kFp32);
  std::unique_ptr<GpuGpt> gpu = MakeGpu(c);
  ASSERT_NE(gpu, nullptr);
  IntTensor tokens, targets;
  RandomBatch(300, c, tokens, targets);
  ASSERT_TRUE(gpu->ForwardBackward(tokens.data(), targets.data(), 1).ok());
  const absl::StatusOr<float> once = gpu->GradNorm();
  ASSERT_TRUE(gpu->ZeroGradients().ok());
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(gpu->ForwardBackward(tokens.data(), targets.data(), 2).ok());
  }
  const absl::StatusOr<float> twice = gpu->GradNorm();
  ASSERT_TRUE(once.ok() && twice.ok());
  EXPECT_NEAR(*twice, *once, 1e-6 * *once);
}

// Selective recomputation rebuilds the probabilities and gelu(c_fc) with the forward's own
// calls on the same saved inputs, so the loss and every gradient are those of the plain model
// bit for bit, in both precisions (the token embedding's to its atomics' rounding); and each
// slot holds less.
TEST(GpuGptTest, SelectiveRecomputationGivesTheSameGradientsBitForBit) {
  SKIP_WITHOUT_DEVICE();
  for (GpuPrecision p : {GpuPrecision::kFp32, GpuPrecision::kBf16}) {
    SCOPED_TRACE(p == GpuPrecision::kFp32 ? "fp32" : "bf16");
    GpuGptConfig c = TinyConfig(p);
    std::unique_ptr<GpuGpt> plain = MakeGpu(c);
    c.selective_recompute = true;
    std::unique_ptr<GpuGpt> selective = MakeGpu(c);
    ASSERT_TRUE(plain && selective);
    EXPECT_LT(selective->memory().activations, plain->memory().activations);
    IntTensor tokens, targets;
    RandomBatch(700, c, tokens, targets);
    const absl::StatusOr<float> a = plain->ForwardBackward(tokens.data(), targets.data());
    const absl::StatusOr<float> b = selective->ForwardBackward(tokens.data(), targets.data());
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(*a, *b);
    ExpectSameGradients(*plain, *selective, "wte");
  }
}

TEST(GpuGptTest, RejectsOutOfRangeIdsAndBadIndices) {
  SKIP_WITHOUT_DEVICE();
  const GpuGptConfig c = TinyConfig(GpuPrecision::kBf16);
  std::unique_ptr<GpuGpt> gpu = MakeGpu(c);
  ASSERT_NE(gpu, nullptr);
  IntTensor tokens, targets;
  RandomBatch(400, c, tokens, targets);
  tokens[5] = static_cast<int32_t>(c.vocab);
  EXPECT_EQ(gpu->ForwardBackward(tokens.data(), targets.data()).status().code(),
            absl::StatusCode::kInvalidArgument);
  tokens[5] = 0;
  targets[3] = -1;
  EXPECT_EQ(gpu->ForwardBackward(tokens.data(), targets.data()).status().code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<float> buf(3);
  EXPECT_EQ(gpu->GetParameter(0, buf.data(), buf.size()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(gpu->GetParameter(gpu->layout().size(), buf.data(), buf.size()).code(),
            absl::StatusCode::kInvalidArgument);
  const absl::StatusOr<GpuGptMemory> plan = PlanGpuGptMemory(c);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(gpu->memory().total(), plan->total());
}

TEST(GpuGptTest, SetParameterRoundTrips) {
  SKIP_WITHOUT_DEVICE();
  std::unique_ptr<GpuGpt> gpu = MakeGpu(TinyConfig(GpuPrecision::kBf16));
  ASSERT_NE(gpu, nullptr);
  const GpuGptTensor& t = gpu->layout()[2];
  std::vector<float> in(t.count), out(t.count);
  for (size_t j = 0; j < in.size(); ++j) in[j] = 0.001f * static_cast<float>(j % 97);
  ASSERT_TRUE(gpu->SetParameter(2, in.data(), in.size()).ok());
  ASSERT_TRUE(gpu->GetParameter(2, out.data(), out.size()).ok());
  EXPECT_EQ(in, out);
}

// The model split into three stages [0, 2), [2, 3), [3, 4), run as a pipeline of Forward and
// Backward calls with the activations handed over in device memory, computes what the whole
// model computes: the same loss, and every tensor's gradient (the tied wte's as the sum of its
// two copies). Two micro-batches are in flight at once (both forwards before either backward,
// as GPipe runs them), each in its own slot.
std::vector<float> ToHostVector(const DeviceBuffer<float>& b) {
  std::vector<float> h(b.size());
  EXPECT_TRUE(b.CopyToHost(h.data(), h.size()).ok());
  return h;
}

// I then W adds the gradients B adds (the same kernels on the same operands, in each
// precision), I's input gradient is B's, the memory between them is accounted, and misuse is
// INTERNAL.
TEST(GpuGptTest, SplitBackwardAddsWhatBackwardAdds) {
  SKIP_WITHOUT_DEVICE();
  for (GpuPrecision p : {GpuPrecision::kFp32, GpuPrecision::kBf16}) {
    SCOPED_TRACE(p == GpuPrecision::kBf16 ? "bf16" : "fp32");
    GpuGptConfig c = TinyConfig(p);
    c.layer_begin = 0;
    c.layer_end = 3;  // embedding and both blocks: tokens in, activation out, weights in W
    std::unique_ptr<GpuGpt> fused = MakeGpu(c), split = MakeGpu(c);
    ASSERT_TRUE(fused && split);
    GpuGptConfig mid = TinyConfig(p);
    mid.layer_begin = 1;
    mid.layer_end = 3;  // blocks only: an input gradient out
    std::unique_ptr<GpuGpt> mid_fused = MakeGpu(mid), mid_split = MakeGpu(mid);
    ASSERT_TRUE(mid_fused && mid_split);
    const size_t act = static_cast<size_t>(c.batch * c.seq * c.d_model);
    auto out = *DeviceBuffer<float>::Create(act), mid_out = *DeviceBuffer<float>::Create(act);
    std::vector<float> host(act);
    Rng rng(7);
    for (float& x : host) x = static_cast<float>(rng.Normal() * 0.1);
    auto dout = *DeviceBuffer<float>::FromHost(host.data(), act);
    auto din_fused = *DeviceBuffer<float>::Create(act),
         din_split = *DeviceBuffer<float>::Create(act);
    IntTensor tokens, targets;
    for (int mb = 0; mb < 2; ++mb) {
      RandomBatch(60 + mb, c, tokens, targets);
      for (GpuGpt* g : {fused.get(), split.get()}) {
        ASSERT_TRUE(g->Forward(mb, tokens.data(), nullptr, nullptr, out.data(), 1.0f, true).ok());
      }
      for (GpuGpt* g : {mid_fused.get(), mid_split.get()}) {
        ASSERT_TRUE(g->Forward(mb, nullptr, nullptr, out.data(), mid_out.data(), 1.0f, true).ok());
      }
    }
    const size_t slot = split->SavedBytes(0);
    const absl::StatusOr<GpuGptMemory> plan = PlanGpuGptMemory(c);
    ASSERT_TRUE(plan.ok());
    EXPECT_EQ(split->BackwardWeight(0).code(), absl::StatusCode::kInternal);  // W before I
    for (int mb = 1; mb >= 0; --mb) {
      ASSERT_TRUE(fused->Backward(mb, dout.data(), nullptr).ok());
      ASSERT_TRUE(split->BackwardInput(mb, dout.data(), nullptr).ok());
      EXPECT_EQ(split->SavedBytes(mb), slot + plan->weight_grad_inputs);
      EXPECT_EQ(split->BackwardInput(mb, dout.data(), nullptr).code(),
                absl::StatusCode::kInternal);  // I twice
      EXPECT_EQ(split->Backward(mb, dout.data(), nullptr).code(),
                absl::StatusCode::kInternal);  // B after I
      ASSERT_TRUE(mid_fused->Backward(mb, dout.data(), din_fused.data()).ok());
      ASSERT_TRUE(mid_split->BackwardInput(mb, dout.data(), din_split.data()).ok());
      EXPECT_EQ(ToHostVector(din_split), ToHostVector(din_fused)) << "mb " << mb;
    }
    // W in another order than I's, as ZB-V may run them.
    for (int mb : {0, 1}) {
      ASSERT_TRUE(split->BackwardWeight(mb).ok());
      ASSERT_TRUE(mid_split->BackwardWeight(mb).ok());
      EXPECT_EQ(split->SavedBytes(mb), 0u);
    }
    for (auto [a, b] : {std::pair{fused.get(), split.get()}, {mid_fused.get(), mid_split.get()}}) {
      for (size_t i = 0; i < a->layout().size(); ++i) {
        std::vector<float> ga(a->layout()[i].count), gb(ga.size());
        ASSERT_TRUE(a->GetGradient(i, ga.data(), ga.size()).ok());
        ASSERT_TRUE(b->GetGradient(i, gb.data(), gb.size()).ok());
        const GradError e = CompareGradient(gb.data(), ga.data(), ga.size());
        // The two sums per parameter run in another order (W of mb 0 first), so allow fp32
        // rounding of a two-term sum.
        EXPECT_LE(e.max_err, 1e-6 * e.max_ref + 1e-9) << a->layout()[i].name;
      }
    }
  }
}

TEST(GpuGptTest, Fp32StagesComputeWhatTheWholeModelComputes) {
  SKIP_WITHOUT_DEVICE();
  for (bool tied : {true, false}) {
    const GpuGptConfig c = TinyConfig(GpuPrecision::kFp32, tied);
    std::unique_ptr<GpuGpt> whole = MakeGpu(c);
    ASSERT_NE(whole, nullptr);
    std::vector<std::unique_ptr<GpuGpt>> stages;
    for (auto [begin, end] : {std::pair<int64_t, int64_t>{0, 2}, {2, 3}, {3, 4}}) {
      GpuGptConfig s = c;
      s.layer_begin = begin;
      s.layer_end = end;
      stages.push_back(MakeGpu(s));
      ASSERT_NE(stages.back(), nullptr);
    }
    const size_t act = static_cast<size_t>(c.batch * c.seq * c.d_model);
    std::vector<DeviceBuffer<float>> bufs;
    for (int i = 0; i < 4; ++i) bufs.push_back(*DeviceBuffer<float>::Create(act));
    const int64_t rows = c.batch * c.seq;
    const float scale = 1.0f / static_cast<float>(2 * rows);
    IntTensor tokens[2], targets[2];
    double want = 0.0, got = 0.0;
    for (int mb = 0; mb < 2; ++mb) {
      RandomBatch(40 + mb, c, tokens[mb], targets[mb]);
      absl::StatusOr<float> loss = whole->ForwardBackward(tokens[mb].data(), targets[mb].data(), 2);
      ASSERT_TRUE(loss.ok()) << loss.status();
      want += *loss / 2.0;
    }
    for (int mb = 0; mb < 2; ++mb) {
      // bufs[0], bufs[1]: stage outputs; the micro-batches take turns using them.
      float* out0 = bufs[2 * mb].data();
      float* out1 = bufs[2 * mb + 1].data();
      ASSERT_TRUE(
          stages[0]->Forward(mb, tokens[mb].data(), nullptr, nullptr, out0, scale, true).ok());
      ASSERT_TRUE(stages[1]->Forward(mb, nullptr, nullptr, out0, out1, scale, true).ok());
      absl::StatusOr<double> sum =
          stages[2]->Forward(mb, nullptr, targets[mb].data(), out1, nullptr, scale, true);
      ASSERT_TRUE(sum.ok()) << sum.status();
      got += *sum * scale;
      EXPECT_GT(stages[1]->SavedBytes(mb), 0u);
    }
    EXPECT_EQ(stages[1]->activation_slots(), 2u);
    for (int mb = 1; mb >= 0; --mb) {
      float* g1 = bufs[2 * mb].data();  // d (stage 1's output), then reused
      float* g0 = bufs[2 * mb + 1].data();
      ASSERT_TRUE(stages[2]->Backward(mb, nullptr, g1).ok());
      ASSERT_TRUE(stages[1]->Backward(mb, g1, g0).ok());
      ASSERT_TRUE(stages[0]->Backward(mb, g0, nullptr).ok());
      EXPECT_EQ(stages[1]->SavedBytes(mb), 0u);
    }
    EXPECT_NEAR(got, want, kLossTol * want) << "tied " << tied;
    std::map<std::string, std::vector<float>> grads;
    for (const auto& st : stages) {
      for (size_t i = 0; i < st->layout().size(); ++i) {
        std::vector<float> g(st->layout()[i].count);
        ASSERT_TRUE(st->GetGradient(i, g.data(), g.size()).ok());
        std::vector<float>& sum = grads[st->layout()[i].name];
        if (sum.empty()) sum.assign(g.size(), 0.0f);
        for (size_t j = 0; j < g.size(); ++j) sum[j] += g[j];
      }
    }
    for (size_t i = 0; i < whole->layout().size(); ++i) {
      const GpuGptTensor& t = whole->layout()[i];
      std::vector<float> w(t.count);
      ASSERT_TRUE(whole->GetGradient(i, w.data(), w.size()).ok());
      ASSERT_TRUE(grads.contains(t.name)) << t.name;
      ASSERT_EQ(grads[t.name].size(), w.size()) << t.name;
      const GradError e = CompareGradient(grads[t.name].data(), w.data(), w.size());
      EXPECT_LE(e.max_err, kGradTol * e.max_ref + kGradAbsTol) << t.name << " tied " << tied;
    }
    // Misuse: a second forward of a micro-batch in flight, a backward without a forward.
    ASSERT_TRUE(stages[0]
                    ->Forward(5, tokens[0].data(), nullptr, nullptr, bufs[0].data(), scale, true)
                    .ok());
    EXPECT_EQ(stages[0]
                  ->Forward(5, tokens[0].data(), nullptr, nullptr, bufs[0].data(), scale, true)
                  .status()
                  .code(),
              absl::StatusCode::kFailedPrecondition);
    EXPECT_EQ(stages[1]->Backward(9, bufs[0].data(), bufs[1].data()).code(),
              absl::StatusCode::kInternal);
    stages[0]->DropSaved();
    EXPECT_EQ(stages[0]->SavedBytes(5), 0u);
  }
}

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// The gpt2 preset's shapes (GPT-2 124M), one (1, 1024) micro-batch:
//  1. fp32 on the device against the CPU layers from the same initial values (the same seed)
//     on the same tokens: one forward and backward, no optimizer step (kGpt2* tolerances);
//  2. bf16 against that fp32 model: the same micro-batch's loss and gradient norm, one AdamW
//     step of each, and the next micro-batch's loss (kBf16LossTol, kBf16NormTol, as the tiny
//     model's: the logits are 768-term dot products of bf16 operands, 2^-8 relative each, of
//     spread ~0.5 (0.02 sqrt(768)), against a loss near ln 50304 = 10.8).
// One test so that the fp32 model (124M initial values drawn on the host) serves both. Host
// time on a 16-core machine, estimated from a 1-core run of the CPU half here (66 s: 12 s
// drawing the CPU layers' weights, 6.5 s GpuGpt's, 47 s forward and backward, two thirds in
// OpenBLAS): ~40 s for both parts, inside gpu-check's 150 s for this binary.
TEST(GpuGptTest, Gpt2ShapesMatchTheCpuLayers) {
  SKIP_WITHOUT_DEVICE();
  const GpuGptConfig c = Gpt2Config(GpuPrecision::kFp32, /*batch=*/1);
  auto start = std::chrono::steady_clock::now();
  std::unique_ptr<GpuGpt> f32 = MakeGpu(c);
  ASSERT_NE(f32, nullptr);
  const double create_s = SecondsSince(start);
  EXPECT_EQ(f32->num_parameters(), 124475904);
  IntTensor tokens, targets;
  RandomBatch(500, c, tokens, targets);
  const absl::StatusOr<float> loss = f32->ForwardBackward(tokens.data(), targets.data());
  ASSERT_TRUE(loss.ok()) << loss.status();
  const absl::StatusOr<float> norm = f32->GradNorm();
  ASSERT_TRUE(norm.ok()) << norm.status();

  {  // 1. fp32 against the CPU layers (the CPU model's ~3 GB freed at the end).
    start = std::chrono::steady_clock::now();
    CpuGpt cpu(c);
    const float want = cpu.ForwardBackward(tokens, targets, c.batch * c.seq);
    cpu.TieGradients();
    const double want_norm = cpu.GradNorm();
    std::printf(
        "gpt2 fp32: loss device %.7f cpu %.7f; grad norm device %.7g cpu %.7g; device "
        "fwd %.1f ms bwd %.1f ms; host: GpuGpt::Create %.1f s, CPU init + fwd + bwd "
        "%.1f s\n",
        *loss, want, *norm, want_norm, f32->last_times().forward_ms, f32->last_times().backward_ms,
        create_s, SecondsSince(start));
    EXPECT_NEAR(*loss, want, kGpt2LossTol * want);
    EXPECT_NEAR(*norm, want_norm, kGpt2NormTol * want_norm);

    const std::vector<GpuGptTensor>& layout = f32->layout();
    ASSERT_EQ(cpu.matching.size(), layout.size());
    // Every tensor's max |got - want| / max |want| for the log; the named ones are checked.
    std::vector<std::pair<double, std::string>> ratios;
    std::map<std::string, GradError> errors;
    for (size_t i = 0; i < layout.size(); ++i) {
      std::vector<float> got(layout[i].count);
      ASSERT_TRUE(f32->GetGradient(i, got.data(), got.size()).ok()) << layout[i].name;
      ASSERT_EQ(cpu.matching[i]->grad.size(), got.size()) << layout[i].name;
      const GradError e = CompareGradient(got.data(), cpu.matching[i]->grad.data(), got.size());
      errors[layout[i].name] = e;
      const double ratio = e.max_ref > 0.0 ? e.max_err / e.max_ref : e.max_err;
      ratios.emplace_back(std::isnan(ratio) ? HUGE_VAL : ratio, layout[i].name);
    }
    std::sort(ratios.rbegin(), ratios.rend());
    for (size_t i = 0; i < ratios.size() && i < 8; ++i) {
      std::printf("gpt2 fp32 grad %-36s max |err| / max |grad| %.3g (max |grad| %.3g)\n",
                  ratios[i].second.c_str(), ratios[i].first, errors[ratios[i].second].max_ref);
    }
    for (const char* name : {"transformer.wte.weight", "transformer.h.0.attn.c_attn.weight",
                             "transformer.h.11.mlp.c_proj.weight", "transformer.ln_f.weight",
                             "transformer.ln_f.bias"}) {
      ASSERT_TRUE(errors.contains(name)) << name;
      const GradError& e = errors[name];
      EXPECT_GT(e.max_ref, 0.0) << name;
      EXPECT_LE(e.max_err, kGpt2GradTol * e.max_ref) << name << ": max |grad| " << e.max_ref;
    }
  }

  // 2. bf16 against fp32, whose gradients of this micro-batch are pending.
  std::unique_ptr<GpuGpt> b16 = MakeGpu(Gpt2Config(GpuPrecision::kBf16, /*batch=*/1));
  ASSERT_NE(b16, nullptr);
  const absl::StatusOr<float> l16 = b16->ForwardBackward(tokens.data(), targets.data());
  ASSERT_TRUE(l16.ok()) << l16.status();
  EXPECT_NEAR(*l16, *loss, kBf16LossTol * *loss);
  const absl::StatusOr<float> n32 = f32->Step(6e-4f);
  const absl::StatusOr<float> n16 = b16->Step(6e-4f);
  ASSERT_TRUE(n32.ok()) << n32.status();
  ASSERT_TRUE(n16.ok()) << n16.status();
  EXPECT_NEAR(*n16, *n32, kBf16NormTol * *n32);
  RandomBatch(501, c, tokens, targets);
  const absl::StatusOr<float> next32 = f32->ForwardBackward(tokens.data(), targets.data());
  const absl::StatusOr<float> next16 = b16->ForwardBackward(tokens.data(), targets.data());
  ASSERT_TRUE(next32.ok()) << next32.status();
  ASSERT_TRUE(next16.ok()) << next16.status();
  std::printf(
      "gpt2 bf16: loss %.7f (fp32 %.7f), grad norm %.7g (fp32 %.7g); after a step: "
      "loss %.7f (fp32 %.7f)\n",
      *l16, *loss, *n16, *n32, *next16, *next32);
  EXPECT_NEAR(*next16, *next32, kBf16LossTol * *next32);
  EXPECT_EQ(b16->steps(), 1);
}

}  // namespace
}  // namespace tandem::worker::cuda
