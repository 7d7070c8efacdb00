// The StageCompute conformance suite: the same stage programs run by the executor on every
// compute backend this build has, each against the CPU backend as the reference: the CPU
// itself (bit-exact: the suite's own check), and, in a build with CUDA, the CUDA backend in
// fp32 (relative tolerance kFp32Tol on losses and gradient norms) and in bf16 (kBf16Tol, on a
// wider model at a smaller learning rate: kBf16Scale). The CUDA cases skip, saying so, without
// a device. Every case runs for both decoders, gpt and llama (the "_llama" cases). What every
// backend must do:
//   - train a worker's single stage to the reference's losses and gradient norms;
//   - hand activations and gradients between two stages of one worker in its own memory (two
//     chunks, interleaved 1F1B), tied embeddings summed locally;
//   - write checkpoints under the same names that another backend restores and continues from;
//   - account its saved activations per stage and release them by the end of the step;
//   - recompute (pipeline.recompute full, and selective) to the same losses, holding less.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "common/spec.h"
#include "common/status_macros.h"
#include "tests/worker/pipeline_test_util.h"
#include "worker/cpu_stage_compute.h"
#include "worker/data/corpus.h"
#include "worker/executor.h"
#ifdef TANDEM_TEST_CUDA
#include "worker/backend/cuda/device.h"
#include "worker/cuda_stage_compute.h"
#endif

namespace tandem::worker {
namespace {

using testing::MakePrograms;
using testing::TinyGptJob;

// The model and learning rate a backend's cases run. The default is TinyGptJob's (2 layers,
// d 16, 2 heads, T 8, V 256) at lr 0.01: fast, and what the CPU and fp32 cases use.
struct Scale {
  int64_t d_model = 0;  // 0: TinyGptJob's d_model, n_head and seq_len
  int64_t n_head = 0;
  int64_t seq_len = 0;
  float lr = 0.01f;
};
constexpr Scale kTinyScale{};
// At the tiny scale bf16 risks failing for the wrong reason: AdamW's first updates are
// ~lr sign(g) per element, so at lr 0.01 on weights of std 0.02 every small gradient element
// whose sign bf16 rounding flips moves its weight by 2 lr = 100% of its size, and the loss is
// a mean over only 8 x 8 positions per micro-batch: the amplified rounding, not the rounding,
// is what gets compared. At lr 1e-3 such a flip moves a weight by 10% of its size, and at
// d 128, T 64 the loss averages 8 x 64 positions of 128-term dot products, so the comparison
// measures bf16's rounding itself (kBf16Tol).
constexpr Scale kBf16Scale{128, 4, 64, 1e-3f};

constexpr double kFp32Tol = 1e-4;  // fp32 GEMMs and reductions in another order
// bf16 GEMM operands with fp32 accumulation (at kBf16Scale): each operand rounds to 8
// significant bits (relative error <= 2^-9), so a GEMM output differs by up to ~2^-8 = 4e-3
// relative to its scale, and the errors of 2 blocks and the head add to a few 2^-8 on the
// logits at worst. The loss, ~ln 256 = 5.5 over these three steps, depends on logits of spread
// ~0.2 (0.02 sqrt(128)), so it moves by far less: 1e-2 relative (2.5 x 2^-8) holds even if the
// three steps' errors all added the same way. The squared gradient norm doubles the relative
// error (ExpectClose: 2 tol).
constexpr double kBf16Tol = 1e-2;

struct Backend {
  std::string name;
  std::string arch;           // the model: gpt (TinyGptJob) or llama (TinyLlamaJob, 2 blocks)
  std::string precision;      // the spec's
  double tol = 0.0;           // relative, against the CPU reference
  bool device_clock = false;  // times its compute by the device's clock (device_us)
  Scale scale;                // the model and learning rate of its cases and their reference
  // Builds the compute for `program`.
  std::function<absl::StatusOr<std::unique_ptr<StageCompute>>(const v1::StageProgram&)> make;
  std::function<std::string()> unavailable;  // empty: usable here
};

void PrintTo(const Backend& b, std::ostream* os) { *os << b.name; }

std::vector<Backend> Backends() {
  std::vector<Backend> out;
  auto cpu = [](const v1::StageProgram& p) -> absl::StatusOr<std::unique_ptr<StageCompute>> {
    ASSIGN_OR_RETURN(auto c, CpuStageCompute::Create(p, StageExecutor::MicroBatchSlots(p)));
    return std::unique_ptr<StageCompute>(std::move(c));
  };
  auto usable = [] { return std::string(); };
  out.push_back({"cpu", "gpt", "", 0.0, false, kTinyScale, cpu, usable});
  out.push_back({"cpu_llama", "llama", "", 0.0, false, kTinyScale, cpu, usable});
#ifdef TANDEM_TEST_CUDA
  auto cuda = [](const v1::StageProgram& p) -> absl::StatusOr<std::unique_ptr<StageCompute>> {
    ASSIGN_OR_RETURN(auto c, CudaStageCompute::Create(p, 0));
    return std::unique_ptr<StageCompute>(std::move(c));
  };
  auto no_device = [] {
    absl::Status s = cuda::CudaAvailable();
    return s.ok() ? std::string() : absl::StrCat("no CUDA device: ", s.ToString());
  };
  for (const char* arch : {"gpt", "llama"}) {
    const std::string suffix = std::string(arch) == "gpt" ? "" : "_llama";
    out.push_back(
        {"cuda_fp32" + suffix, arch, "fp32", kFp32Tol, true, kTinyScale, cuda, no_device});
    out.push_back(
        {"cuda_bf16" + suffix, arch, "bf16", kBf16Tol, true, kBf16Scale, cuda, no_device});
  }
#endif
  return out;
}

// TinyGptJob, or TinyLlamaJob cut to 2 blocks, at `scale`, with `micro_batches` micro-batches.
// A llama keeps half as many kv heads as query heads and a SwiGLU of twice d_model.
v1::JobSpec ScaledJob(const Scale& scale, bool tied, int micro_batches,
                      const std::string& arch = "gpt") {
  v1::JobSpec spec = arch == "llama" ? testing::TinyLlamaJob(tied) : TinyGptJob(tied);
  if (arch == "llama") spec.mutable_model()->set_n_layer(2);
  spec.mutable_pipeline()->set_micro_batches(micro_batches);
  if (scale.d_model != 0) {
    spec.mutable_model()->set_d_model(scale.d_model);
    spec.mutable_model()->set_n_head(scale.n_head);
    spec.mutable_model()->set_seq_len(scale.seq_len);
    if (arch == "llama") {
      spec.mutable_model()->set_n_kv_head(scale.n_head / 2);
      spec.mutable_model()->set_d_hidden(2 * scale.d_model);
    }
  }
  spec.mutable_optimizer()->set_lr(scale.lr);
  return spec;
}

Dataset DataOf(const v1::JobSpec& spec) {
  return *LoadDataset(spec, ".", TrainingWindow(spec.model()));
}

// Steps [from, to) on `ex` at learning rate `lr`: each step's loss and squared gradient norm.
std::vector<std::pair<double, double>> TrainSteps(StageExecutor& ex, int from, int to, float lr) {
  std::vector<std::pair<double, double>> out;
  for (int step = from; step < to; ++step) {
    absl::StatusOr<v1::StepReport> r = ex.RunStep(step);
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) break;
    EXPECT_TRUE(r->grads_finite());
    EXPECT_TRUE(ex.ApplyStep(step, lr).ok());
    out.emplace_back(r->loss(), r->grad_norm_sq());
  }
  return out;
}

class ConformanceTest : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override {
    if (const std::string why = GetParam().unavailable(); !why.empty()) GTEST_SKIP() << why;
  }

  // The spec as the backend runs it (device and precision), and as the CPU reference does.
  v1::JobSpec Spec(bool tied, int micro_batches) const {
    v1::JobSpec spec = ScaledJob(GetParam().scale, tied, micro_batches, GetParam().arch);
    if (GetParam().name != "cpu") {
      spec.set_device("cuda");
      spec.set_precision(GetParam().precision);
    }
    return spec;
  }
  static v1::JobSpec Reference(v1::JobSpec spec) {
    spec.set_device("cpu");
    spec.clear_precision();
    return spec;
  }

  std::unique_ptr<StageExecutor> Make(const v1::StageProgram& program, bool on_backend) {
    const Dataset data = DataOf(program.spec());
    absl::StatusOr<std::unique_ptr<StageExecutor>> ex;
    if (on_backend) {
      absl::StatusOr<std::unique_ptr<StageCompute>> compute = GetParam().make(program);
      EXPECT_TRUE(compute.ok()) << compute.status();
      if (!compute.ok()) return nullptr;
      ex = StageExecutor::Create(program, data, nullptr, *std::move(compute));
    } else {
      ex = StageExecutor::Create(program, data, nullptr);
    }
    EXPECT_TRUE(ex.ok()) << ex.status();
    return ex.ok() ? *std::move(ex) : nullptr;
  }

  // The peak activation bytes of one GPipe step of `spec` on one stage of the backend (-1 when
  // it fails).
  int64_t PeakUnderGPipe(const v1::JobSpec& spec) {
    auto ex = Make(MakePrograms(spec, 1, "gpipe")[0], true);
    if (!ex) return -1;
    absl::StatusOr<v1::StepReport> r = ex->RunStep(0);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? r->stage_memory(0).peak_activation_bytes() : -1;
  }

  // Steps [from, to) on `ex` at the backend's learning rate.
  std::vector<std::pair<double, double>> Train(StageExecutor& ex, int from, int to) const {
    return TrainSteps(ex, from, to, GetParam().scale.lr);
  }

  void ExpectClose(const std::vector<std::pair<double, double>>& got,
                   const std::vector<std::pair<double, double>>& want) const {
    ASSERT_EQ(got.size(), want.size());
    const double tol = GetParam().tol;
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_NEAR(got[i].first, want[i].first, tol * std::fabs(want[i].first)) << "loss " << i;
      // The norm of the gradient grows the relative error of bf16 a little: twice the loss's.
      EXPECT_NEAR(got[i].second, want[i].second, 2 * tol * std::fabs(want[i].second) + 1e-12)
          << "grad_norm_sq " << i;
    }
  }
};

TEST_P(ConformanceTest, OneStageTrainsToTheReferenceLossesAndNorms) {
  for (bool tied : {true, false}) {
    const v1::JobSpec spec = Spec(tied, 2);
    auto ex = Make(MakePrograms(spec, 1, "1f1b")[0], true);
    auto ref = Make(MakePrograms(Reference(spec), 1, "1f1b")[0], false);
    ASSERT_TRUE(ex && ref);
    // Untied, the same parameters; tied, a stage holding both ends may keep one wte (CUDA).
    if (!tied) {
      EXPECT_EQ(ex->parameter_count(), ref->parameter_count());
    }
    ExpectClose(Train(*ex, 0, 3), Train(*ref, 0, 3));
  }
}

// Data parallelism reduces what LayerGradients hands over, bucket by bucket: every gradient of
// every chunk must be in exactly one bucket (on the CPU one per layer, on CUDA one device
// buffer per chunk), or the replicas would drift apart.
TEST_P(ConformanceTest, EveryGradientIsInOneDataParallelBucket) {
  const v1::JobSpec spec = Spec(/*tied=*/false, 2);
  for (int stages : {1, 2}) {
    for (const v1::StageProgram& program : MakePrograms(spec, stages, "1f1b")) {
      absl::StatusOr<std::unique_ptr<StageCompute>> compute = GetParam().make(program);
      ASSERT_TRUE(compute.ok()) << compute.status();
      int64_t elements = 0;
      for (int c = 0; c < program.chunks_size(); ++c) {
        ASSERT_GT((*compute)->num_layers(c), 0);
        for (int l = 0; l < (*compute)->num_layers(c); ++l) {
          absl::StatusOr<std::vector<absl::Span<float>>> grads = (*compute)->LayerGradients(c, l);
          ASSERT_TRUE(grads.ok()) << grads.status();
          for (const absl::Span<float>& g : *grads) {
            EXPECT_NE(g.data(), nullptr);
            elements += static_cast<int64_t>(g.size());
          }
        }
      }
      EXPECT_EQ(elements, (*compute)->parameter_count()) << stages << " stage(s)";
    }
  }
}

// Two stages on one worker (interleaved 1F1B, 2 chunks): the activation and its gradient go
// from chunk to chunk in the backend's memory, and the tied wte's two copies are summed here.
// The data does not depend on the partition, so the losses are the single-stage reference's.
TEST_P(ConformanceTest, TwoChunksOnOneWorkerHandOverInTheBackendsMemory) {
  const v1::JobSpec spec = Spec(/*tied=*/true, 2);
  const auto programs = MakePrograms(spec, 1, "interleaved_1f1b", "job-1", /*chunks=*/2);
  ASSERT_EQ(programs.size(), 1u);
  ASSERT_EQ(programs[0].chunks_size(), 2);
  auto ex = Make(programs[0], true);
  auto ref = Make(MakePrograms(Reference(spec), 1, "1f1b")[0], false);
  ASSERT_TRUE(ex && ref);
  ExpectClose(Train(*ex, 0, 3), Train(*ref, 0, 3));
}

// Schedules that split the backward into I (input gradient) and W (weight gradient), on one
// stage (ZB-H1) and on two chunks of one worker (ZB-V, DualPipeV), train to the 1F1B
// reference: however a backend divides its backward between I and W, the sum is the whole
// backward. DualPipeV's overlapped pairs (F of one chunk with B of the other) run at once on a
// backend that runs two chunks concurrently (CUDA: a stream each).
TEST_P(ConformanceTest, SplitBackwardSchedulesTrainToTheReference) {
  const v1::JobSpec spec = Spec(/*tied=*/true, 4);
  auto ref = Make(MakePrograms(Reference(spec), 1, "1f1b")[0], false);
  ASSERT_TRUE(ref);
  const auto want = Train(*ref, 0, 3);
  for (auto [schedule, chunks] :
       {std::pair<const char*, int>{"zb_h1", 1}, {"zb_v", 2}, {"dualpipe_v", 2}}) {
    SCOPED_TRACE(schedule);
    const auto programs = MakePrograms(spec, 1, schedule, "job-1", chunks);
    ASSERT_EQ(programs.size(), 1u);
    bool has_w = false;
    for (const v1::Action& a : programs[0].actions()) has_w = has_w || a.kind() == v1::ACTION_W;
    EXPECT_TRUE(has_w);
    auto ex = Make(programs[0], true);
    ASSERT_TRUE(ex);
    ExpectClose(Train(*ex, 0, 3), want);
  }
}

// Full recomputation (an R before every backward) trains to the reference's losses and
// norms for the same schedule without it: on one stage under GPipe and ZB-H1 (the R before an
// I), and on two chunks of one worker (interleaved 1F1B). The CPU recomputes layer by layer inside
// the backward, CUDA a stage at once; either way the backward finds what the saving forward would
// have left. And it holds less: GPipe's four micro-batches keep their inputs only, against their
// whole working sets.
TEST_P(ConformanceTest, FullRecomputationTrainsToTheReferenceAndHoldsLess) {
  v1::JobSpec spec = Spec(/*tied=*/true, 4);
  v1::JobSpec full = spec;
  full.mutable_pipeline()->set_recompute("full");
  for (auto [schedule, chunks] :
       {std::pair<const char*, int>{"gpipe", 1}, {"zb_h1", 1}, {"interleaved_1f1b", 2}}) {
    SCOPED_TRACE(schedule);
    const auto programs = MakePrograms(full, 1, schedule, "job-1", chunks);
    ASSERT_EQ(programs.size(), 1u);
    int rs = 0;
    for (const v1::Action& a : programs[0].actions()) rs += a.kind() == v1::ACTION_R ? 1 : 0;
    EXPECT_EQ(rs, 4 * programs[0].chunks_size());
    // (The same schedule: its order of adding the micro-batches' gradients is the reference's.)
    auto ref = Make(MakePrograms(Reference(spec), 1, schedule, "job-1", chunks)[0], false);
    auto ex = Make(programs[0], true);
    ASSERT_TRUE(ex && ref);
    ExpectClose(Train(*ex, 0, 3), Train(*ref, 0, 3));
  }
  const int64_t plain = PeakUnderGPipe(spec), recomputed = PeakUnderGPipe(full);
  EXPECT_GT(recomputed, 0);
  EXPECT_LT(recomputed, plain);
}

// Selective recomputation (the attention probabilities, and gpt's gelu(c_fc), rebuilt in the
// backward instead of kept) trains to the plain reference's losses and norms, under 1F1B, with
// the split backward (ZB-H1: W rebuilds what it reads too) and on two chunks of one worker;
// and it holds less.
TEST_P(ConformanceTest, SelectiveRecomputationTrainsToTheReferenceAndHoldsLess) {
  const v1::JobSpec spec = Spec(/*tied=*/true, 4);
  v1::JobSpec selective = spec;
  selective.mutable_pipeline()->set_recompute("selective");
  for (auto [schedule, chunks] :
       {std::pair<const char*, int>{"1f1b", 1}, {"zb_h1", 1}, {"interleaved_1f1b", 2}}) {
    SCOPED_TRACE(schedule);
    auto ref = Make(MakePrograms(Reference(spec), 1, schedule, "job-1", chunks)[0], false);
    auto ex = Make(MakePrograms(selective, 1, schedule, "job-1", chunks)[0], true);
    ASSERT_TRUE(ex && ref);
    ExpectClose(Train(*ex, 0, 3), Train(*ref, 0, 3));
  }
  const int64_t plain = PeakUnderGPipe(spec), kept = PeakUnderGPipe(selective);
  EXPECT_GT(kept, 0);
  EXPECT_LT(kept, plain);
}

// A backend's checkpoint carries the CPU's names, and the CPU restored from it continues as
// the backend does.
TEST_P(ConformanceTest, CheckpointsMoveBetweenBackends) {
  const v1::JobSpec spec = Spec(/*tied=*/true, 2);
  const v1::StageProgram program = MakePrograms(spec, 1, "1f1b")[0];
  const v1::StageProgram ref_program = MakePrograms(Reference(spec), 1, "1f1b")[0];
  auto ex = Make(program, true);
  auto ref = Make(ref_program, false);
  ASSERT_TRUE(ex && ref);
  Train(*ex, 0, 2);
  Train(*ref, 0, 2);
  absl::StatusOr<std::vector<StateTensor>> tensors = ex->CheckpointTensors();
  ASSERT_TRUE(tensors.ok()) << tensors.status();
  absl::StatusOr<std::vector<StateTensor>> ref_tensors = ref->CheckpointTensors();
  ASSERT_TRUE(ref_tensors.ok());
  std::map<std::string, std::string> saved;
  for (const StateTensor& t : *tensors) {
    saved[t.name] = std::string(static_cast<const char*>(t.data), t.bytes);
  }
  std::map<std::string, size_t> ref_bytes;
  for (const StateTensor& t : *ref_tensors) ref_bytes[t.name] = t.bytes;
  ASSERT_EQ(saved.size(), ref_bytes.size());
  for (const auto& [name, bytes] : ref_bytes) {
    ASSERT_TRUE(saved.contains(name)) << name;
    EXPECT_EQ(saved[name].size(), bytes) << name;
  }
  auto restored = Make(ref_program, false);
  ASSERT_TRUE(restored);
  ASSERT_TRUE(
      restored
          ->Restore([&](const std::string& name) -> absl::StatusOr<absl::Span<const uint8_t>> {
            auto it = saved.find(name);
            if (it == saved.end()) return absl::NotFoundError(name);
            return absl::Span<const uint8_t>(reinterpret_cast<const uint8_t*>(it->second.data()),
                                             it->second.size());
          })
          .ok());
  // The executor refuses steps at or before a restored checkpoint's only when the program
  // says it resumes; this one continues at step 2 either way.
  const auto next = Train(*restored, 2, 3);
  const auto want = Train(*ex, 2, 3);
  ASSERT_EQ(next.size(), 1u);
  ASSERT_EQ(want.size(), 1u);
  // The restored CPU starts from the backend's values: as close as the backend's own step.
  EXPECT_NEAR(next[0].first, want[0].first, (GetParam().tol + 1e-6) * std::fabs(want[0].first));
}

TEST_P(ConformanceTest, SavedActivationsAreAccountedAndReleasedByTheEndOfTheStep) {
  const v1::JobSpec spec = Spec(/*tied=*/false, 4);
  auto ex = Make(MakePrograms(spec, 1, "gpipe")[0], true);
  ASSERT_TRUE(ex);
  absl::StatusOr<v1::StepReport> r = ex->RunStep(0);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->stage_memory_size(), 1);
  EXPECT_GT(r->stage_memory(0).peak_activation_bytes(), 0);
  EXPECT_GT(r->stage_memory(0).static_bytes(), 0);
  const v1::StageMemory& mem = r->stage_memory(0);
  EXPECT_EQ(mem.static_bytes(), mem.parameter_bytes() + mem.gradient_bytes() +
                                    mem.optimizer_bytes() + mem.workspace_bytes());
  EXPECT_GT(mem.optimizer_bytes(), 0);  // AdamW's moments
  // fp32 gradients; a bf16 device adds compute copies to the parameters and keeps a workspace.
  EXPECT_GE(mem.parameter_bytes(), mem.gradient_bytes());
  if (GetParam().device_clock) {
    EXPECT_GT(mem.workspace_bytes(), 0);
  }
  // A second step runs from released slots (and the gradients of the first are pending).
  ASSERT_TRUE(ex->ApplyStep(0, GetParam().scale.lr).ok());
  absl::StatusOr<v1::StepReport> again = ex->RunStep(1);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->stage_memory(0).peak_activation_bytes(),
            r->stage_memory(0).peak_activation_bytes());
}

// A device backend reports each compute action's device time (CUDA events), within the host
// interval that brackets it; the CPU reports none (its interval is the compute).
TEST_P(ConformanceTest, ComputeActionsCarryTheDevicesOwnTime) {
  const v1::JobSpec spec = Spec(/*tied=*/false, 4);
  const v1::StageProgram program = MakePrograms(spec, 1, "gpipe")[0];
  auto ex = Make(program, true);
  ASSERT_TRUE(ex);
  absl::StatusOr<v1::StepReport> r = ex->RunStep(0);
  ASSERT_TRUE(r.ok()) << r.status();
  int compute = 0;
  for (const v1::ActionTiming& t : r->timings()) {
    const v1::ActionKind kind = program.actions(t.index()).kind();
    if (!IsComputeAction(kind)) {
      EXPECT_EQ(t.device_us(), 0) << t.index();
      continue;
    }
    ++compute;
    if (GetParam().device_clock) {
      EXPECT_GT(t.device_us(), 0) << t.index();
      // Event times and the host's clock differ by microseconds: 1 ms of slack.
      EXPECT_LE(t.device_us(), t.end_us() - t.start_us() + 1000) << t.index();
    } else {
      EXPECT_EQ(t.device_us(), 0) << t.index();
    }
  }
  EXPECT_EQ(compute, 8);  // 4 F + 4 B
}

// The bf16 case's scale is a job the CPU reference trains: checked in every build, so that the
// device run cannot fail for a reason of the spec's (a bad shape, too little data).
TEST(ConformanceScaleTest, TheBf16ScaleTrainsOnTheCpu) {
  for (const char* arch : {"gpt", "llama"}) {
    SCOPED_TRACE(arch);
    const v1::JobSpec spec = ScaledJob(kBf16Scale, /*tied=*/true, 2, arch);
    EXPECT_EQ(spec.model().d_model(), 128);
    const std::vector<v1::StageProgram> programs = MakePrograms(spec, 1, "1f1b");
    ASSERT_EQ(programs.size(), 1u);
    const absl::StatusOr<Dataset> data = LoadDataset(spec, ".", TrainingWindow(spec.model()));
    ASSERT_TRUE(data.ok()) << data.status();
    absl::StatusOr<std::unique_ptr<StageExecutor>> ex =
        StageExecutor::Create(programs[0], *data, nullptr);
    ASSERT_TRUE(ex.ok()) << ex.status();
    const std::vector<std::pair<double, double>> steps = TrainSteps(**ex, 0, 3, kBf16Scale.lr);
    ASSERT_EQ(steps.size(), 3u);
    // Near-uniform predictions over 256 bytes at first, then learning (the trajectory the bf16
    // case compares is not flat: 5.5, 4.8, 4.5 here).
    EXPECT_NEAR(steps[0].first, std::log(256.0), 0.1);
    EXPECT_LT(steps[2].first, steps[0].first - 0.5);
    for (const auto& [loss, norm_sq] : steps) {
      EXPECT_TRUE(std::isfinite(loss));
      EXPECT_GT(norm_sq, 0.0);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, ConformanceTest, ::testing::ValuesIn(Backends()),
                         [](const ::testing::TestParamInfo<Backend>& info) {
                           return info.param.name;
                         });

}  // namespace
}  // namespace tandem::worker
