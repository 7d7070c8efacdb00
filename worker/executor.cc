#include "worker/executor.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/model_desc.h"
#include "common/schedule.h"
#include "common/spec.h"
#include "worker/model/gpt.h"
#include "worker/model/mlp_lm.h"

namespace tandem::worker {
namespace {

constexpr int kMaxMicroBatches = 1 << 16;
constexpr int64_t kMaxMicroBatchSize = 1 << 20;

absl::Status Annotate(const absl::Status& s, absl::string_view prefix) {
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat(prefix, ": ", s.message()));
}

const char* KindName(v1::ActionKind kind) {
  switch (kind) {
    case v1::ACTION_F:
      return "F";
    case v1::ACTION_B:
      return "B";
    case v1::ACTION_I:
      return "I";
    case v1::ACTION_W:
      return "W";
    case v1::ACTION_SEND_F:
      return "SEND_F";
    case v1::ACTION_RECV_F:
      return "RECV_F";
    case v1::ACTION_SEND_B:
      return "SEND_B";
    case v1::ACTION_RECV_B:
      return "RECV_B";
    default:
      return "?";
  }
}

// Replays an action list: each micro-batch must go RECV_F -> F -> SEND_F and (unless
// forward_only) RECV_B -> B -> SEND_B, with only the transfers a stage at this position has,
// each exactly once.
absl::Status ReplayActions(const google::protobuf::RepeatedPtrField<v1::Action>& actions,
                           absl::string_view field, int m, bool first, bool last, bool forward_only,
                           int stage, int num_stages) {
  enum Bit { kRecvF = 1, kF = 2, kSendF = 4, kRecvB = 8, kB = 16, kSendB = 32 };
  std::vector<int> done(m, 0);
  for (int i = 0; i < actions.size(); ++i) {
    const v1::Action& a = actions[i];
    const std::string where =
        absl::StrCat(field, "[", i, "] (", a.stage(), KindName(a.kind()), a.micro_batch(), ")");
    if (a.stage() != stage) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": belongs to stage ", a.stage(), ", not ", stage));
    }
    if (a.micro_batch() < 0 || a.micro_batch() >= m) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": micro-batch outside [0, ", m, ")"));
    }
    int& d = done[a.micro_batch()];
    int bit = 0;
    int needs = 0;
    bool allowed = true;
    switch (a.kind()) {
      case v1::ACTION_RECV_F:
        bit = kRecvF;
        allowed = !first;
        break;
      case v1::ACTION_F:
        bit = kF;
        needs = first ? 0 : kRecvF;
        break;
      case v1::ACTION_SEND_F:
        bit = kSendF;
        needs = kF;
        allowed = !last;
        break;
      case v1::ACTION_RECV_B:
        bit = kRecvB;
        needs = kF;
        allowed = !last;
        break;
      case v1::ACTION_B:
        bit = kB;
        needs = kF | (last ? 0 : kRecvB);
        break;
      case v1::ACTION_SEND_B:
        bit = kSendB;
        needs = kB;
        allowed = !first;
        break;
      default:
        return absl::InvalidArgumentError(absl::StrCat(where, ": action kind ",
                                                       v1::ActionKind_Name(a.kind()),
                                                       " is not supported by this worker"));
    }
    if (forward_only && (bit & (kRecvB | kB | kSendB)) != 0) allowed = false;
    if (!allowed) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": stage ", stage, " of ", num_stages, " has no such transfer"));
    }
    if (d & bit) return absl::InvalidArgumentError(absl::StrCat(where, ": repeated"));
    if ((d & needs) != needs) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": comes before the action it depends on"));
    }
    d |= bit;
  }
  const int want = forward_only
                       ? kF | (first ? 0 : kRecvF) | (last ? 0 : kSendF)
                       : kF | kB | (first ? 0 : kRecvF | kSendB) | (last ? 0 : kSendF | kRecvB);
  for (int mb = 0; mb < m; ++mb) {
    if (done[mb] != want) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": micro-batch ", mb, " is missing some of its actions (each needs F",
                       forward_only ? "" : " and B", first ? "" : ", RECV_F",
                       first || forward_only ? "" : ", SEND_B", last ? "" : ", SEND_F",
                       last || forward_only ? "" : ", RECV_B", ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

int MicroBatchesOf(const v1::StageProgram& program) {
  return program.micro_batches() != 0 ? program.micro_batches()
                                      : program.spec().pipeline().micro_batches();
}

bool StageNeedsCorpus(const v1::StageProgram& program) {
  return program.layer_begin() == 0 || program.layer_end() == NumLayers(program.spec().model());
}

absl::Status ValidateStageProgram(const v1::StageProgram& p) {
  if (p.job_id().empty()) return absl::InvalidArgumentError("program.job_id is empty");
  if (p.num_ranks() < 1 || p.rank() < 0 || p.rank() >= p.num_ranks()) {
    return absl::InvalidArgumentError(
        absl::StrCat("program.rank ", p.rank(), " is outside [0, num_ranks=", p.num_ranks(), ")"));
  }
  if (p.num_stages() != p.num_ranks() || p.stage() != p.rank()) {
    return absl::InvalidArgumentError(
        absl::StrCat("program: this release runs one stage per rank; got stage ", p.stage(), " of ",
                     p.num_stages(), " on rank ", p.rank(), " of ", p.num_ranks()));
  }
  const v1::DataSpec& data = p.spec().data();
  if ((data.source() == "synthetic" || data.format() == "bytes") &&
      p.spec().model().vocab_size() < 256) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.vocab_size must be at least 256 for byte data, got ",
                     p.spec().model().vocab_size()));
  }
  if (p.spec().model().arch() == "gpt") {
    absl::StatusOr<GptConfig> cfg = GptConfigFromSpec(p.spec().model());
    if (!cfg.ok()) return cfg.status();
  } else {
    absl::StatusOr<MlpLmConfig> cfg = MlpLmConfigFromSpec(p.spec().model());
    if (!cfg.ok()) return cfg.status();
  }
  const int num_layers = NumLayers(p.spec().model());
  if (p.layer_begin() < 0 || p.layer_begin() >= p.layer_end() || p.layer_end() > num_layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("program layers [", p.layer_begin(), ", ", p.layer_end(),
                     ") are not a non-empty range within the model's ", num_layers, " layers"));
  }
  const bool first = p.stage() == 0;
  const bool last = p.stage() == p.num_stages() - 1;
  if (first != (p.layer_begin() == 0) || last != (p.layer_end() == num_layers)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "program layers [", p.layer_begin(), ", ", p.layer_end(), ") of stage ", p.stage(), "/",
        p.num_stages(),
        ": the first stage must hold the embedding (layer 0) and only the last the head (layer ",
        num_layers - 1, ")"));
  }
  const int m = MicroBatchesOf(p);
  if (m < 1 || m > kMaxMicroBatches) {
    return absl::InvalidArgumentError(
        absl::StrCat("program.micro_batches must be in [1, ", kMaxMicroBatches, "], got ", m));
  }
  const int64_t b = p.spec().pipeline().micro_batch_size();
  if (b < 1 || b > kMaxMicroBatchSize) {
    return absl::InvalidArgumentError(absl::StrCat("pipeline.micro_batch_size must be in [1, ",
                                                   kMaxMicroBatchSize, "], got ", b));
  }
  if (absl::Status s = ReplayActions(p.actions(), "program.actions", m, first, last,
                                     /*forward_only=*/false, p.stage(), p.num_stages());
      !s.ok()) {
    return s;
  }
  if (p.eval_actions_size() > 0) {
    const int e = p.eval_micro_batches();
    if (e < 1 || e > kMaxMicroBatches) {
      return absl::InvalidArgumentError(absl::StrCat("program.eval_micro_batches must be in [1, ",
                                                     kMaxMicroBatches, "], got ", e));
    }
    if (absl::Status s = ReplayActions(p.eval_actions(), "program.eval_actions", e, first, last,
                                       /*forward_only=*/true, p.stage(), p.num_stages());
        !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

// Everything one micro-batch holds during a step.
struct StageExecutor::MicroBatch {
  IntTensor tokens;                 // (B, T) gpt or (B, K) mlp_lm; first stage only
  IntTensor targets;                // (B, T) gpt or (B,) mlp_lm; last stage only
  Tensor input;                     // (B, T, D) or (B, D) received activation; non-first
  std::vector<SavedContext> saved;  // one per layer, between F and B
  Tensor output;                    // (B, D) forward output, kept until the sends complete
  Tensor grad_output;               // (B, D) received gradient; non-last stages
  Tensor grad_input;                // (B, D) input gradient, kept until the sends complete

  size_t Bytes() const {
    size_t n = tokens.bytes() + targets.bytes() + input.bytes() + output.bytes() +
               grad_output.bytes() + grad_input.bytes();
    for (const SavedContext& c : saved) n += c.Bytes();
    return n;
  }
};

absl::StatusOr<std::unique_ptr<StageExecutor>> StageExecutor::Create(
    const v1::StageProgram& program, Dataset data, std::unique_ptr<Transport> transport) {
  if (absl::Status s = ValidateStageProgram(program); !s.ok()) return s;
  const std::string prefix = absl::StrCat("stage ", program.stage());
  if (program.num_ranks() > 1) {
    if (transport == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(prefix, ": a transport is required with ", program.num_ranks(), " ranks"));
    }
    if (transport->rank() != program.rank() || transport->size() != program.num_ranks()) {
      return absl::InvalidArgumentError(
          absl::StrCat(prefix, ": transport is rank ", transport->rank(), " of ", transport->size(),
                       ", program is rank ", program.rank(), " of ", program.num_ranks()));
    }
  }
  const bool needs_data = StageNeedsCorpus(program);
  const int64_t window = TrainingWindow(program.spec().model());
  if (needs_data) {
    if (data.train == nullptr || data.train->size() < window) {
      return absl::InvalidArgumentError(absl::StrCat(
          prefix, ": training data of at least one window (", window, " tokens) is required"));
    }
    if (program.eval_actions_size() > 0 && (data.val == nullptr || data.val->size() < window)) {
      return absl::InvalidArgumentError(
          absl::StrCat(prefix, ": eval.every is set but there is no validation split of at least ",
                       window, " tokens (set data.val_fraction or data.val_path)"));
    }
  } else {
    data = Dataset{};
  }
  std::unique_ptr<StageExecutor> ex(
      new StageExecutor(program, std::move(data), std::move(transport)));
  const v1::ModelSpec& model = program.spec().model();
  absl::StatusOr<std::vector<std::unique_ptr<Layer>>> layers =
      model.arch() == "gpt"
          ? BuildGptLayers(model, program.spec().seed(), program.layer_begin(), program.layer_end())
          : BuildMlpLmLayers(model, program.spec().seed(), program.layer_begin(),
                             program.layer_end());
  if (!layers.ok()) return Annotate(layers.status(), prefix);
  ex->layers_ = std::move(*layers);
  std::vector<Parameter*> params = ex->Parameters();
  for (const Parameter* p : params) ex->parameter_count_ += static_cast<int64_t>(p->value.size());
  absl::StatusOr<std::unique_ptr<Optimizer>> opt =
      MakeOptimizer(program.spec().optimizer(), std::move(params));
  if (!opt.ok()) return Annotate(opt.status(), prefix);
  ex->optimizer_ = std::move(*opt);
  return ex;
}

StageExecutor::StageExecutor(const v1::StageProgram& program, Dataset data,
                             std::unique_ptr<Transport> transport)
    : program_(program),
      stage_(program.stage()),
      num_stages_(program.num_stages()),
      micro_batches_(MicroBatchesOf(program)),
      eval_micro_batches_(program.eval_actions_size() > 0 ? program.eval_micro_batches() : 0),
      micro_batch_size_(program.spec().pipeline().micro_batch_size()),
      gpt_(program.spec().model().arch() == "gpt"),
      seq_len_(gpt_ ? program.spec().model().seq_len() : 1),
      window_(TrainingWindow(program.spec().model())),
      d_model_(program.spec().model().d_model()),
      first_(program.stage() == 0),
      last_(program.stage() == program.num_stages() - 1),
      mbs_(static_cast<size_t>(std::max(micro_batches_, eval_micro_batches_))),
      mb_bytes_(mbs_.size(), 0),
      transport_(std::move(transport)) {
  const uint64_t seed = DataSeed(program.spec());
  if (data.train != nullptr) {
    sampler_ = std::make_unique<WindowSampler>(std::move(data.train), seed, window_);
  }
  if (data.val != nullptr && eval_micro_batches_ > 0) {
    val_sampler_ = std::make_unique<WindowSampler>(std::move(data.val), seed, window_);
  }
}

StageExecutor::~StageExecutor() {
  if (transport_ != nullptr) transport_->Abort();
}

std::vector<Parameter*> StageExecutor::Parameters() {
  std::vector<Parameter*> out;
  for (const auto& layer : layers_) {
    for (Parameter* p : layer->Parameters()) out.push_back(p);
  }
  return out;
}

void StageExecutor::Abort() {
  aborted_.store(true);
  if (transport_ != nullptr) transport_->Abort();
}

void StageExecutor::Account(int mb) {
  const size_t now = mbs_[mb].Bytes();
  live_bytes_ = live_bytes_ - mb_bytes_[mb] + now;
  mb_bytes_[mb] = now;
  peak_bytes_ = std::max(peak_bytes_, live_bytes_);
}

absl::Status StageExecutor::Forward(int mb, int64_t step, bool eval) {
  MicroBatch& m = mbs_[mb];
  // Training samples step*G + mb*B + i; evaluation always the same windows mb*B + i, so that
  // validation losses are comparable across the run.
  const int64_t global_batch = micro_batch_size_ * (eval ? eval_micro_batches_ : micro_batches_);
  const int64_t first_sample = (eval ? 0 : step * global_batch) + mb * micro_batch_size_;
  if (first_ || last_) {
    // One window of `window_` tokens per sequence: gpt predicts every next token (tokens
    // w[0..T), targets w[1..T]); mlp_lm the one after its context (w[0..K) -> w[K]).
    const int64_t b = micro_batch_size_;
    windows_.resize(static_cast<size_t>(b * window_));
    (eval ? val_sampler_ : sampler_)->Sample(first_sample, b, windows_.data());
    const int64_t t = window_ - 1;
    if (first_) {
      m.tokens.Reset({b, t});
      for (int64_t i = 0; i < b; ++i) {
        std::copy_n(windows_.begin() + i * window_, t, m.tokens.vec().begin() + i * t);
      }
    }
    if (last_) {
      if (gpt_) {
        m.targets.Reset({b, t});
        for (int64_t i = 0; i < b; ++i) {
          std::copy_n(windows_.begin() + i * window_ + 1, t, m.targets.vec().begin() + i * t);
        }
      } else {
        m.targets.Reset({b});
        for (int64_t i = 0; i < b; ++i) m.targets[i] = windows_[i * window_ + t];
      }
    }
  }
  MicroBatchData data;
  data.tokens = &m.tokens;
  data.targets = &m.targets;
  data.loss_normalizer = global_batch * seq_len_;
  m.saved.assign(layers_.size(), SavedContext{});
  Tensor x = std::move(m.input);
  Tensor y;
  for (size_t l = 0; l < layers_.size(); ++l) {
    if (absl::Status s = layers_[l]->Forward(x, data, m.saved[l], y); !s.ok()) return s;
    std::swap(x, y);
  }
  // The layers saved what their backward needs.
  m.input.Clear();
  m.tokens.Clear();
  m.targets.Clear();
  if (last_) {
    loss_ += static_cast<double>(x[0]);
  } else {
    m.output = std::move(x);
  }
  return absl::OkStatus();
}

absl::Status StageExecutor::Backward(int mb) {
  MicroBatch& m = mbs_[mb];
  Tensor g = std::move(m.grad_output);  // empty on the last stage: the loss's gradient is 1
  Tensor gin;
  for (size_t l = layers_.size(); l-- > 0;) {
    if (absl::Status s = layers_[l]->Backward(g, m.saved[l], gin); !s.ok()) return s;
    m.saved[l].Clear();
    std::swap(g, gin);
  }
  m.saved.clear();
  m.grad_output.Clear();
  if (!first_) m.grad_input = std::move(g);
  return absl::OkStatus();
}

absl::Status StageExecutor::RunAction(const v1::Action& a, int64_t step, bool eval) {
  const int mb = a.micro_batch();
  MicroBatch& m = mbs_[mb];
  const std::vector<int64_t> act_shape =
      gpt_ ? std::vector<int64_t>{micro_batch_size_, seq_len_, d_model_}
           : std::vector<int64_t>{micro_batch_size_, d_model_};
  const size_t act_bytes =
      static_cast<size_t>(micro_batch_size_ * seq_len_ * d_model_) * sizeof(float);
  switch (a.kind()) {
    case v1::ACTION_RECV_F:
      m.input.Reset(act_shape);
      return transport_->Recv(stage_ - 1, MakeTransferTag(Payload::kActivation, mb), m.input.data(),
                              act_bytes);
    case v1::ACTION_F:
      return Forward(mb, step, eval);
    case v1::ACTION_SEND_F:
      return transport_->PostSend(stage_ + 1, MakeTransferTag(Payload::kActivation, mb),
                                  m.output.data(), m.output.bytes());
    case v1::ACTION_RECV_B:
      m.grad_output.Reset(act_shape);
      return transport_->Recv(stage_ + 1, MakeTransferTag(Payload::kGradient, mb),
                              m.grad_output.data(), act_bytes);
    case v1::ACTION_B:
      return Backward(mb);
    case v1::ACTION_SEND_B:
      return transport_->PostSend(stage_ - 1, MakeTransferTag(Payload::kGradient, mb),
                                  m.grad_input.data(), m.grad_input.bytes());
    default:
      return absl::InvalidArgumentError("unsupported action kind");
  }
}

absl::StatusOr<v1::StepReport> StageExecutor::RunStep(int64_t step, v1::StepMode mode) {
  const std::string prefix = absl::StrCat("stage ", stage_);
  if (step < 0) {
    return absl::InvalidArgumentError(absl::StrCat(prefix, ": step must be >= 0, got ", step));
  }
  const bool eval = mode == v1::STEP_MODE_EVAL;
  if (mode != v1::STEP_MODE_TRAIN && !eval) {
    return absl::InvalidArgumentError(absl::StrCat(prefix, ": unknown step mode ", mode));
  }
  if (eval && eval_micro_batches_ == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(prefix, ": the stage program has no eval actions (eval.every is 0)"));
  }
  if (!eval && pending_step_ >= 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        prefix, ": the gradients of step ", pending_step_, " await ApplyStep before step ", step));
  }
  if (running_.exchange(true)) {
    return absl::FailedPreconditionError(absl::StrCat(prefix, ": a step is already running"));
  }
  struct Done {
    std::atomic<bool>& flag;
    ~Done() { flag.store(false); }
  } done{running_};
  if (aborted_.load()) return absl::AbortedError(absl::StrCat(prefix, ": the stage was aborted"));
  if (broken_.load()) {
    return absl::FailedPreconditionError(
        absl::StrCat(prefix, ": an earlier step failed; configure the stage again"));
  }

  v1::StepReport report;
  report.set_step(step);
  report.set_rank(program_.rank());
  report.set_start_us(UnixMicros());
  const int64_t sent0 = transport_ ? transport_->bytes_sent() : 0;
  const int64_t recv0 = transport_ ? transport_->bytes_received() : 0;
  const auto t0 = std::chrono::steady_clock::now();
  loss_ = 0.0;
  live_bytes_ = 0;
  peak_bytes_ = 0;
  std::fill(mb_bytes_.begin(), mb_bytes_.end(), 0);

  auto fail = [&](absl::Status s, absl::string_view what) {
    broken_.store(true);
    if (aborted_.load() && s.code() != absl::StatusCode::kAborted) {
      s = absl::AbortedError(s.message());
    }
    return Annotate(s, absl::StrCat(prefix, ": ", what));
  };

  const auto& actions = eval ? program_.eval_actions() : program_.actions();
  for (int i = 0; i < actions.size(); ++i) {
    const v1::Action& a = actions[i];
    if (aborted_.load()) return fail(absl::AbortedError("the stage was aborted"), "step");
    v1::ActionTiming* timing = report.add_timings();
    timing->set_index(i);
    timing->set_start_us(UnixMicros());
    absl::Status s = RunAction(a, step, eval);
    timing->set_end_us(UnixMicros());
    if (!s.ok()) {
      std::string what = absl::StrCat(KindName(a.kind()), " mb ", a.micro_batch());
      switch (a.kind()) {
        case v1::ACTION_RECV_F:
          absl::StrAppend(&what, " from stage ", stage_ - 1);
          break;
        case v1::ACTION_SEND_B:
          absl::StrAppend(&what, " to stage ", stage_ - 1);
          break;
        case v1::ACTION_SEND_F:
          absl::StrAppend(&what, " to stage ", stage_ + 1);
          break;
        case v1::ACTION_RECV_B:
          absl::StrAppend(&what, " from stage ", stage_ + 1);
          break;
        default:
          break;
      }
      return fail(s, what);
    }
    Account(a.micro_batch());
  }
  if (transport_ != nullptr) {
    if (absl::Status s = transport_->WaitSends(); !s.ok()) return fail(s, "waiting for sends");
  }
  if (aborted_.load()) return fail(absl::AbortedError("the stage was aborted"), "step");
  for (MicroBatch& m : mbs_) m = MicroBatch{};
  if (!eval) {
    if (absl::Status s = SumTiedGradients(); !s.ok()) return fail(s, "tied gradients");
    double sum_sq = 0.0;
    bool finite = true;
    std::set<std::string> tied_counted;
    for (const Parameter* p : Parameters()) {
      // A tied parameter counts once in the global norm: on the first stage, one copy.
      if (p->tied && (!first_ || !tied_counted.insert(p->name).second)) continue;
      for (float g : p->grad.vec()) {
        finite = finite && std::isfinite(g);
        sum_sq += static_cast<double>(g) * g;
      }
    }
    report.set_grad_norm_sq(sum_sq);
    report.set_grads_finite(finite && std::isfinite(sum_sq));
    pending_step_ = step;
  }

  report.set_has_loss(last_);
  if (last_) report.set_loss(loss_);
  report.set_bytes_sent(transport_ ? transport_->bytes_sent() - sent0 : 0);
  report.set_bytes_received(transport_ ? transport_->bytes_received() - recv0 : 0);
  report.set_peak_activation_bytes(static_cast<int64_t>(peak_bytes_));
  report.set_exec_us(
      std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0)
          .count());
  report.set_end_us(UnixMicros());
  return report;
}

absl::Status StageExecutor::SumTiedGradients() {
  std::map<std::string, std::vector<Parameter*>> tied;
  for (Parameter* p : Parameters()) {
    if (p->tied) tied[p->name].push_back(p);
  }
  if (tied.empty()) return absl::OkStatus();
  if (num_stages_ == 1) {
    // Both copies are here: each gets the sum.
    for (auto& [name, copies] : tied) {
      if (copies.size() != 2) continue;
      std::vector<float>& a = copies[0]->grad.vec();
      std::vector<float>& b = copies[1]->grad.vec();
      for (size_t i = 0; i < a.size(); ++i) a[i] = b[i] = a[i] + b[i];
    }
    return absl::OkStatus();
  }
  if (!first_ && !last_) return absl::OkStatus();
  // The first stage holds the embedding's copy, the last the head's: swap and add. a + b is
  // exactly b + a in IEEE arithmetic, so both copies stay bit-identical.
  const int peer = first_ ? num_stages_ - 1 : 0;
  std::vector<std::vector<float>> received;
  int index = 0;
  for (auto& [name, copies] : tied) {
    for (Parameter* p : copies) {
      const uint64_t tag = MakeTransferTag(Payload::kTiedGradient, index++);
      if (absl::Status s = transport_->PostSend(peer, tag, p->grad.vec().data(), p->grad.bytes());
          !s.ok()) {
        return s;
      }
      received.emplace_back(p->grad.size());
      if (absl::Status s = transport_->Recv(peer, tag, received.back().data(), p->grad.bytes());
          !s.ok()) {
        return s;
      }
    }
  }
  if (absl::Status s = transport_->WaitSends(); !s.ok()) return s;
  index = 0;
  for (auto& [name, copies] : tied) {
    for (Parameter* p : copies) {
      std::vector<float>& g = p->grad.vec();
      const std::vector<float>& other = received[index++];
      for (size_t i = 0; i < g.size(); ++i) g[i] += other[i];
    }
  }
  return absl::OkStatus();
}

std::vector<StageExecutor::StateTensor> StageExecutor::CheckpointTensors() {
  std::vector<StateTensor> out;
  std::vector<Parameter*> params = Parameters();
  // A tied parameter is saved once: by the first stage, one copy.
  std::set<const Parameter*> skip;
  std::set<std::string> seen;
  for (const Parameter* p : params) {
    if (p->tied && (!first_ || !seen.insert(p->name).second)) skip.insert(p);
  }
  auto listed = [&](const Parameter* p) { return !skip.contains(p); };
  for (Parameter* p : params) {
    if (!listed(p)) continue;
    out.push_back({p->name, "F32", p->value.shape(), p->value.vec().data(), p->value.bytes()});
  }
  for (const OptimizerSlot& slot : optimizer_->Slots()) {
    const Parameter* p = params[slot.param];
    if (!listed(p)) continue;
    const std::string name = absl::StrCat(p->name, ".", slot.key);
    if (slot.f32 != nullptr) {
      out.push_back(
          {name, "F32", p->value.shape(), slot.f32->data(), slot.f32->size() * sizeof(float)});
    } else {
      out.push_back({name, "I64", {1}, slot.i64, sizeof(int64_t)});
    }
  }
  return out;
}

std::vector<std::string> StageExecutor::RestoreNames(bool weights_only) {
  std::vector<std::string> names;
  std::set<std::string> seen;  // both copies of a tied parameter read the same tensor
  auto add = [&](std::string n) {
    if (seen.insert(n).second) names.push_back(std::move(n));
  };
  std::vector<Parameter*> params = Parameters();
  for (const Parameter* p : params) add(p->name);
  if (weights_only) return names;
  for (const OptimizerSlot& slot : optimizer_->Slots()) {
    add(absl::StrCat(params[slot.param]->name, ".", slot.key));
  }
  return names;
}

absl::Status StageExecutor::Restore(const TensorLookup& lookup, bool weights_only) {
  const std::string prefix = absl::StrCat("stage ", stage_, ": restore");
  if (pending_step_ >= 0) {
    return absl::FailedPreconditionError(absl::StrCat(prefix, ": gradients are pending"));
  }
  auto copy = [&](const std::string& name, void* dst, size_t bytes) -> absl::Status {
    absl::StatusOr<absl::Span<const uint8_t>> src = lookup(name);
    if (!src.ok()) return Annotate(src.status(), prefix);
    if (src->size() != bytes) {
      return absl::InvalidArgumentError(absl::StrCat(prefix, ": tensor ", name, " has ",
                                                     src->size(), " bytes, this stage needs ",
                                                     bytes, " (a different model shape?)"));
    }
    std::memcpy(dst, src->data(), bytes);
    return absl::OkStatus();
  };
  std::vector<Parameter*> params = Parameters();
  for (Parameter* p : params) {
    if (absl::Status s = copy(p->name, p->value.vec().data(), p->value.bytes()); !s.ok()) return s;
    p->grad.Fill(0.0f);
  }
  if (weights_only) return absl::OkStatus();
  for (const OptimizerSlot& slot : optimizer_->Slots()) {
    const std::string name = absl::StrCat(params[slot.param]->name, ".", slot.key);
    absl::Status s = slot.f32 != nullptr
                         ? copy(name, slot.f32->data(), slot.f32->size() * sizeof(float))
                         : copy(name, slot.i64, sizeof(int64_t));
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status StageExecutor::ApplyStep(int64_t step, float learning_rate, float grad_scale,
                                      bool skip) {
  const std::string prefix = absl::StrCat("stage ", stage_);
  if (pending_step_ != step) {
    return absl::FailedPreconditionError(
        pending_step_ < 0
            ? absl::StrCat(prefix, ": no gradients are pending (apply of step ", step, ")")
            : absl::StrCat(prefix, ": the pending gradients are step ", pending_step_,
                           "'s, not step ", step, "'s"));
  }
  if (!skip) {
    if (!std::isfinite(learning_rate) || learning_rate < 0.0f) {
      return absl::InvalidArgumentError(absl::StrCat(
          prefix, ": learning_rate must be a finite number >= 0, got ", learning_rate));
    }
    if (!(grad_scale > 0.0f && grad_scale <= 1.0f)) {
      return absl::InvalidArgumentError(
          absl::StrCat(prefix, ": grad_scale must be in (0, 1], got ", grad_scale));
    }
  }
  std::vector<Parameter*> params = Parameters();
  if (skip) {
    for (Parameter* p : params) p->grad.Fill(0.0f);
  } else {
    if (grad_scale != 1.0f) {
      for (Parameter* p : params) {
        for (float& g : p->grad.vec()) g *= grad_scale;
      }
    }
    optimizer_->Step(learning_rate);
  }
  pending_step_ = -1;
  return absl::OkStatus();
}

}  // namespace tandem::worker
