#include "worker/executor.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <system_error>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/clock.h"
#include "common/schedule.h"
#include "common/shard_range.h"
#include "common/spec.h"
#include "common/status_macros.h"
#include "common/step_number.h"
#include "worker/cpu_stage_compute.h"

namespace tandem::worker {
namespace {

// "stage 2", or "rank 1 (stages 1, 6)" for a worker of several stages: prefixes messages.
std::string PrefixOf(const v1::StageProgram& p) {
  if (p.chunks_size() == 1) return absl::StrCat("stage ", p.chunks(0).stage());
  std::vector<int> stages;
  for (const v1::StageChunk& c : p.chunks()) stages.push_back(c.stage());
  return absl::StrCat("rank ", p.rank(), " (stages ", absl::StrJoin(stages, ", "), ")");
}

}  // namespace

// Everything one micro-batch of one chunk holds during a step, besides what the compute saved
// from its forward for its backward (StageCompute::SavedBytes). Buffers are the compute's.
struct StageExecutor::MicroBatch {
  IntTensor tokens;            // (B, T) decoder or (B, K) mlp_lm; first stage only
  IntTensor targets;           // (B, T) decoder or (B,) mlp_lm; last stage only
  StageBufferPtr input;        // (B, T, D) or (B, D) received activation, until F
  StageBufferPtr output;       // forward output, until sent or handed to the next stage
  StageBufferPtr grad_output;  // received output gradient, until B or I
  StageBufferPtr grad_input;   // input gradient, until sent or handed to stage - 1

  size_t Bytes() const {
    size_t n = tokens.bytes() + targets.bytes();
    for (const StageBufferPtr* b : {&input, &output, &grad_output, &grad_input}) {
      if (*b != nullptr) n += (*b)->bytes();
    }
    return n;
  }
};

size_t StageExecutor::MicroBatchSlots(const v1::StageProgram& program) {
  const int eval = program.eval_actions_size() > 0 ? program.eval_micro_batches() : 0;
  return static_cast<size_t>(std::max(MicroBatchesOf(program), eval));
}

absl::StatusOr<std::unique_ptr<StageExecutor>> StageExecutor::Create(
    const v1::StageProgram& program, Dataset data, std::unique_ptr<Transport> transport) {
  RETURN_IF_ERROR(ValidateStageProgram(program));
  absl::StatusOr<std::unique_ptr<CpuStageCompute>> compute =
      CpuStageCompute::Create(program, MicroBatchSlots(program));
  if (!compute.ok()) return WithPrefix(compute.status(), PrefixOf(program));
  return CreateValidated(program, std::move(data), std::move(transport), *std::move(compute),
                         nullptr);
}

absl::StatusOr<std::unique_ptr<StageExecutor>> StageExecutor::Create(
    const v1::StageProgram& program, Dataset data, std::unique_ptr<Transport> transport,
    std::unique_ptr<StageCompute> compute, std::unique_ptr<GradReducer> reducer) {
  RETURN_IF_ERROR(ValidateStageProgram(program));
  return CreateValidated(program, std::move(data), std::move(transport), std::move(compute),
                         std::move(reducer));
}

absl::StatusOr<std::unique_ptr<StageExecutor>> StageExecutor::CreateValidated(
    const v1::StageProgram& program, Dataset data, std::unique_ptr<Transport> transport,
    std::unique_ptr<StageCompute> compute, std::unique_ptr<GradReducer> reducer) {
  const std::string prefix = absl::StrCat("rank ", program.rank());
  if (compute == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(prefix, ": no compute backend"));
  }
  if (program.num_replicas() > 1) {
    if (reducer == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          prefix, ": a gradient reducer is required with ", program.num_replicas(), " replicas"));
    }
    if (reducer->replica() != program.replica() || reducer->replicas() != program.num_replicas()) {
      return absl::InvalidArgumentError(
          absl::StrCat(prefix, ": the data-parallel group is rank ", reducer->replica(), " of ",
                       reducer->replicas(), ", the program is replica ", program.replica(), " of ",
                       program.num_replicas()));
    }
    for (int c = 0; c < program.chunks_size(); ++c) {
      // A backend whose gradients are not on the host says so here, not mid-step.
      RETURN_IF_ERROR(WithPrefix(compute->LayerGradients(c, 0).status(), prefix));
      if (ShardsOptimizerState(program.spec())) {
        RETURN_IF_ERROR(WithPrefix(compute->LayerParameters(c, 0).status(), prefix));
      }
    }
  } else {
    reducer = nullptr;
  }
  if (!compute->recomputes() &&
      std::any_of(program.actions().begin(), program.actions().end(),
                  [](const v1::Action& a) { return a.kind() == v1::ACTION_R; })) {
    return absl::FailedPreconditionError(
        absl::StrCat(prefix,
                     ": the program recomputes activations (R actions, "
                     "pipeline.recompute), which the ",
                     compute->device(), " backend cannot do"));
  }
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
  std::unique_ptr<StageExecutor> ex(new StageExecutor(
      program, std::move(data), std::move(transport), std::move(compute), std::move(reducer)));
  // A run resumed from a checkpoint continues after its step.
  if (!program.restore().job_id().empty() && !program.restore().weights_only()) {
    ex->last_applied_step_ = program.restore().step();
  }
  ex->chunk_live_bytes_.assign(ex->chunks_.size(), 0);
  ex->chunk_peak_bytes_.assign(ex->chunks_.size(), 0);
  return ex;
}

StageExecutor::StageExecutor(const v1::StageProgram& program, Dataset data,
                             std::unique_ptr<Transport> transport,
                             std::unique_ptr<StageCompute> compute,
                             std::unique_ptr<GradReducer> reducer)
    : program_(program),
      rank_(program.rank()),
      num_stages_(program.num_stages()),
      micro_batches_(MicroBatchesOf(program)),
      eval_micro_batches_(program.eval_actions_size() > 0 ? program.eval_micro_batches() : 0),
      micro_batch_size_(program.spec().pipeline().micro_batch_size()),
      decoder_(IsDecoder(program.spec().model())),
      seq_len_(decoder_ ? program.spec().model().seq_len() : 1),
      window_(TrainingWindow(program.spec().model())),
      d_model_(program.spec().model().d_model()),
      replica_(program.num_replicas() > 1 ? program.replica() : 0),
      replicas_(std::max(1, program.num_replicas())),
      shard_state_(program.num_replicas() > 1 && ShardsOptimizerState(program.spec())),
      prefix_(PrefixOf(program)),
      chunk_of_stage_(program.num_stages(), -1),
      mb_slots_(MicroBatchSlots(program)),
      compute_(std::move(compute)),
      reducer_(std::move(reducer)),
      transport_(std::move(transport)) {
  for (const v1::StageChunk& pc : program.chunks()) {
    Chunk c;
    c.stage = pc.stage();
    c.layer_begin = pc.layer_begin();
    c.layer_end = pc.layer_end();
    c.first = c.stage == 0;
    c.last = c.stage == num_stages_ - 1;
    c.prev_rank = c.first ? -1 : program.stage_ranks(c.stage - 1);
    c.next_rank = c.last ? -1 : program.stage_ranks(c.stage + 1);
    holds_first_ = holds_first_ || c.first;
    holds_last_ = holds_last_ || c.last;
    chunk_of_stage_[c.stage] = static_cast<int>(chunks_.size());
    chunks_.push_back(std::move(c));
  }
  for (Chunk& c : chunks_) {
    if (!c.first) c.prev = chunk_of_stage_[c.stage - 1];
    if (!c.last) c.next = chunk_of_stage_[c.stage + 1];
  }
  last_grad_action_.assign(chunks_.size(), -1);
  layer_posted_.resize(chunks_.size());
  for (int i = 0; i < program.actions_size(); ++i) {
    const v1::Action& a = program.actions(i);
    if (a.kind() == v1::ACTION_B || a.kind() == v1::ACTION_W) {
      last_grad_action_[chunk_of_stage_[a.stage()]] = i;
    }
  }
  for (size_t c = 0; c < chunks_.size(); ++c) {
    layer_posted_[c].assign(static_cast<size_t>(chunks_[c].layer_end - chunks_[c].layer_begin),
                            false);
  }
  // The micro-batches the training program recomputes: their F keeps only the input.
  recomputed_.assign(chunks_.size() * mb_slots_, false);
  recompute_at_backward_.assign(chunks_.size() * mb_slots_, false);
  std::vector<Action> actions;
  for (const v1::Action& a : program.actions()) actions.push_back(FromProto(a));
  const std::vector<bool> at_backward = RecomputeAtBackward(actions);
  for (size_t i = 0; i < actions.size(); ++i) {
    if (actions[i].kind != v1::ACTION_R) continue;
    const size_t slot = static_cast<size_t>(chunk_of_stage_[actions[i].stage]) * mb_slots_ +
                        static_cast<size_t>(actions[i].micro_batch);
    recomputed_[slot] = true;
    recompute_at_backward_[slot] = at_backward[i];
  }
  next_recv_ = NextReceives(program.actions());
  eval_next_recv_ = NextReceives(program.eval_actions());
  mbs_.resize(chunks_.size() * mb_slots_);
  mb_bytes_.assign(mbs_.size(), 0);
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
  if (reducer_ != nullptr) reducer_->Abort();
}

void StageExecutor::Abort() {
  aborted_.store(true);
  if (transport_ != nullptr) transport_->Abort();
  if (reducer_ != nullptr) reducer_->Abort();
}

StageExecutor::MicroBatch& StageExecutor::Mb(int chunk, int mb) {
  return mbs_[static_cast<size_t>(chunk) * mb_slots_ + static_cast<size_t>(mb)];
}

void StageExecutor::Account(int chunk, int mb, size_t saved_during) {
  std::lock_guard<std::mutex> lock(account_mu_);
  const size_t i = static_cast<size_t>(chunk) * mb_slots_ + static_cast<size_t>(mb);
  if (saved_during > 0) {
    // The moment inside the action when the compute held saved_during for this micro-batch.
    const size_t during = mbs_[i].Bytes() + saved_during;
    if (during > mb_bytes_[i]) {
      peak_bytes_ = std::max(peak_bytes_, live_bytes_ - mb_bytes_[i] + during);
      const size_t chunk_live = chunk_live_bytes_[static_cast<size_t>(chunk)];
      chunk_peak_bytes_[static_cast<size_t>(chunk)] = std::max(
          chunk_peak_bytes_[static_cast<size_t>(chunk)], chunk_live - mb_bytes_[i] + during);
    }
  }
  const size_t now = mbs_[i].Bytes() + compute_->SavedBytes(chunk, mb);
  live_bytes_ = live_bytes_ - mb_bytes_[i] + now;
  size_t& chunk_live = chunk_live_bytes_[static_cast<size_t>(chunk)];
  chunk_live = chunk_live - mb_bytes_[i] + now;
  mb_bytes_[i] = now;
  peak_bytes_ = std::max(peak_bytes_, live_bytes_);
  chunk_peak_bytes_[static_cast<size_t>(chunk)] =
      std::max(chunk_peak_bytes_[static_cast<size_t>(chunk)], chunk_live);
}

void StageExecutor::AccountHandover(int chunk, int mb) {
  {
    std::lock_guard<std::mutex> lock(account_mu_);
    if (pair_running_) {
      deferred_accounts_.push_back({chunk, mb});
      return;
    }
  }
  Account(chunk, mb);
}

StageBuffer& StageExecutor::KeepForSend(StageBufferPtr b) {
  send_bytes_ += b->bytes();
  send_buffers_.push_back(std::move(b));
  return *send_buffers_.back();
}

absl::Status StageExecutor::Forward(int chunk, int mb, int64_t step, bool eval) {
  Chunk& c = chunks_[chunk];
  MicroBatch& m = Mb(chunk, mb);
  // Training samples step*G + r*M*B + mb*B + i (replica r's share of the global batch G);
  // evaluation always the same windows mb*B + i, so that validation losses are comparable
  // across the run.
  const int64_t share = micro_batch_size_ * (eval ? eval_micro_batches_ : micro_batches_);
  const int64_t global_batch = eval ? share : share * replicas_;
  const int64_t first_sample =
      (eval ? 0 : step * global_batch + replica_ * share) + mb * micro_batch_size_;
  if (c.first || c.last) {
    // One window of `window_` tokens per sequence: gpt predicts every next token (tokens
    // w[0..T), targets w[1..T]); mlp_lm the one after its context (w[0..K) -> w[K]).
    const int64_t b = micro_batch_size_;
    windows_.resize(static_cast<size_t>(b * window_));
    (eval ? val_sampler_ : sampler_)->Sample(first_sample, b, windows_.data());
    const int64_t t = window_ - 1;
    if (c.first) {
      m.tokens.Reset({b, t});
      for (int64_t i = 0; i < b; ++i) {
        std::copy_n(windows_.begin() + i * window_, t, m.tokens.vec().begin() + i * t);
      }
    }
    if (c.last) {
      if (decoder_) {
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
  const bool keep_input_only =
      !eval && recomputed_[static_cast<size_t>(chunk) * mb_slots_ + static_cast<size_t>(mb)];
  // The input: received, or handed over by the previous stage on this worker.
  StageBufferPtr x;
  if (c.prev >= 0) {
    x = std::move(Mb(c.prev, mb).output);
    AccountHandover(c.prev, mb);
  } else {
    x = std::move(m.input);
  }
  // The compute saves what the backward needs (nothing in evaluation: no backward follows;
  // only the input when the program recomputes the micro-batch, whose R then needs the
  // tokens and targets again).
  absl::StatusOr<double> loss =
      keep_input_only ? compute_->ForwardKeepingInput(chunk, mb, std::move(x), data, &m.output)
                      : compute_->Forward(chunk, mb, std::move(x), data, !eval, &m.output);
  if (!keep_input_only) {
    m.tokens.Clear();
    m.targets.Clear();
  }
  if (!loss.ok()) return loss.status();
  if (c.last) loss_ += *loss;
  return absl::OkStatus();
}

absl::Status StageExecutor::Recompute(int chunk, int mb) {
  MicroBatch& m = Mb(chunk, mb);
  MicroBatchData data;
  data.tokens = &m.tokens;
  data.targets = &m.targets;
  // As its F had it (training: the global batch's predictions).
  data.loss_normalizer = micro_batch_size_ * micro_batches_ * replicas_ * seq_len_;
  const bool at_backward =
      recompute_at_backward_[static_cast<size_t>(chunk) * mb_slots_ + static_cast<size_t>(mb)];
  absl::Status s = compute_->Recompute(chunk, mb, data, at_backward);
  // Armed for the backward, the compute reads the tokens and targets there.
  if (!at_backward) {
    m.tokens.Clear();
    m.targets.Clear();
  }
  return s;
}

absl::Status StageExecutor::Backward(int chunk, int mb, v1::ActionKind kind) {
  const Chunk& c = chunks_[chunk];
  MicroBatch& m = Mb(chunk, mb);
  if (kind == v1::ACTION_W) return compute_->Backward(chunk, mb, kind, nullptr, nullptr);
  // The output gradient: received, handed over by the next stage on this worker, or (last
  // stage) none: the loss's gradient is 1.
  StageBufferPtr g;
  if (c.next >= 0) {
    g = std::move(Mb(c.next, mb).grad_input);
    AccountHandover(c.next, mb);
  } else {
    g = std::move(m.grad_output);
  }
  absl::Status s =
      compute_->Backward(chunk, mb, kind, std::move(g), c.first ? nullptr : &m.grad_input);
  // A micro-batch recomputed inside this backward kept them until now.
  m.tokens.Clear();
  m.targets.Clear();
  return s;
}

StageExecutor::RecvEnds StageExecutor::RecvEndsOf(const v1::Action& a) const {
  const Chunk& c = chunks_[chunk_of_stage_[a.stage()]];
  if (a.kind() == v1::ACTION_RECV_F) {
    return {c.prev_rank, MakeTransferTag(Payload::kActivation, c.stage - 1, a.micro_batch())};
  }
  return {c.next_rank, MakeTransferTag(Payload::kGradient, c.stage + 1, a.micro_batch())};
}

absl::Status StageExecutor::PostRecv(const v1::Action& a) {
  const RecvEnds ends = RecvEndsOf(a);
  if (transport_->posted_recv(ends.peer, ends.tag)) return absl::OkStatus();
  const int chunk = chunk_of_stage_[a.stage()];
  MicroBatch& m = Mb(chunk, a.micro_batch());
  StageBufferPtr& buffer = a.kind() == v1::ACTION_RECV_F ? m.input : m.grad_output;
  ASSIGN_OR_RETURN(
      buffer,
      compute_->NewBuffer(decoder_ ? std::vector<int64_t>{micro_batch_size_, seq_len_, d_model_}
                                   : std::vector<int64_t>{micro_batch_size_, d_model_}));
  absl::Status s = transport_->PostRecv(ends.peer, ends.tag, buffer->data(), buffer->bytes());
  Account(chunk, a.micro_batch());
  return s;
}

std::string StageExecutor::Where(const v1::Action& a) const {
  const Chunk& c = chunks_[chunk_of_stage_[a.stage()]];
  std::string what = absl::StrCat(ActionKindName(a.kind()), " mb ", a.micro_batch());
  if (chunks_.size() > 1) what = absl::StrCat("stage ", a.stage(), " ", what);
  switch (a.kind()) {
    case v1::ACTION_RECV_F:
      absl::StrAppend(&what, " from stage ", a.stage() - 1, " (rank ", c.prev_rank, ")");
      break;
    case v1::ACTION_SEND_B:
      absl::StrAppend(&what, " to stage ", a.stage() - 1, " (rank ", c.prev_rank, ")");
      break;
    case v1::ACTION_SEND_F:
      absl::StrAppend(&what, " to stage ", a.stage() + 1, " (rank ", c.next_rank, ")");
      break;
    case v1::ACTION_RECV_B:
      absl::StrAppend(&what, " from stage ", a.stage() + 1, " (rank ", c.next_rank, ")");
      break;
    default:
      break;
  }
  return what;
}

absl::Status StageExecutor::RunAction(const v1::Action& a, int64_t step, bool eval) {
  const int chunk = chunk_of_stage_[a.stage()];
  const Chunk& c = chunks_[chunk];
  const int mb = a.micro_batch();
  MicroBatch& m = Mb(chunk, mb);
  switch (a.kind()) {
    case v1::ACTION_RECV_F:
    case v1::ACTION_RECV_B: {
      // Posted ahead by the previous compute action, or now.
      RETURN_IF_ERROR(PostRecv(a));
      const RecvEnds ends = RecvEndsOf(a);
      return transport_->WaitRecv(ends.peer, ends.tag);
    }
    case v1::ACTION_F:
      return Forward(chunk, mb, step, eval);
    case v1::ACTION_R:
      return Recompute(chunk, mb);
    case v1::ACTION_SEND_F: {
      if (m.output == nullptr) return absl::InternalError("no forward output to send");
      StageBuffer& out = KeepForSend(std::move(m.output));
      return transport_->PostSend(c.next_rank, MakeTransferTag(Payload::kActivation, c.stage, mb),
                                  out.data(), out.bytes());
    }
    case v1::ACTION_B:
    case v1::ACTION_I:
    case v1::ACTION_W:
      return Backward(chunk, mb, a.kind());
    case v1::ACTION_REDUCE_GRAD:
      if (reducer_ == nullptr) return absl::InternalError("no data-parallel group");
      return PostChunkReduction(chunk);
    case v1::ACTION_SEND_B: {
      if (m.grad_input == nullptr) return absl::InternalError("no input gradient to send");
      StageBuffer& gin = KeepForSend(std::move(m.grad_input));
      return transport_->PostSend(c.prev_rank, MakeTransferTag(Payload::kGradient, c.stage, mb),
                                  gin.data(), gin.bytes());
    }
    default:
      return absl::InvalidArgumentError("unsupported action kind");
  }
}

absl::Status StageExecutor::CheckStepRequest(int64_t step, v1::StepMode mode) const {
  if (step < 0) {
    return absl::InvalidArgumentError(absl::StrCat(prefix_, ": step must be >= 0, got ", step));
  }
  const bool eval = mode == v1::STEP_MODE_EVAL;
  if (mode != v1::STEP_MODE_TRAIN && !eval) {
    return absl::InvalidArgumentError(absl::StrCat(prefix_, ": unknown step mode ", mode));
  }
  if (eval && eval_micro_batches_ == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(prefix_, ": the stage program has no eval actions (eval.every is 0)"));
  }
  if (!eval && step <= last_applied_step_) {
    return absl::FailedPreconditionError(absl::StrCat(
        prefix_, ": step ", StepNumber(step), " was already applied (the stage is at step ",
        StepNumber(last_applied_step_), "); a late or repeated call"));
  }
  if (!eval && pending_step_ >= 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(prefix_, ": the gradients of step ", StepNumber(pending_step_),
                     " await ApplyStep before step ", StepNumber(step)));
  }
  return absl::OkStatus();
}

absl::Status StageExecutor::CheckRunnable() const {
  if (aborted_.load()) return absl::AbortedError(absl::StrCat(prefix_, ": the stage was aborted"));
  if (broken_.load()) {
    return absl::FailedPreconditionError(
        absl::StrCat(prefix_, ": an earlier step failed; configure the stage again"));
  }
  return absl::OkStatus();
}

void StageExecutor::ResetStepCounters() {
  loss_ = 0.0;
  live_bytes_ = 0;
  peak_bytes_ = 0;
  std::fill(chunk_live_bytes_.begin(), chunk_live_bytes_.end(), 0);
  std::fill(chunk_peak_bytes_.begin(), chunk_peak_bytes_.end(), 0);
  send_bytes_ = 0;
  std::fill(mb_bytes_.begin(), mb_bytes_.end(), 0);
}

absl::Status StageExecutor::FailStep(absl::Status s, absl::string_view what) {
  broken_.store(true);
  // The group's peers must not wait for this worker's buckets: abort the reduction (and stop
  // its thread touching the gradients) before anything else.
  if (reducer_ != nullptr) reducer_->Abort();
  compute_->DropSaved();
  if (aborted_.load() && s.code() != absl::StatusCode::kAborted) {
    s = absl::AbortedError(s.message());
  }
  return WithPrefix(s, absl::StrCat(prefix_, ": ", what));
}

absl::Status StageExecutor::RunActions(int64_t step, bool eval, v1::StepReport* report) {
  const auto& actions = eval ? program_.eval_actions() : program_.actions();
  const std::vector<int>& next_recv = eval ? eval_next_recv_ : next_recv_;
  for (int i = 0; i < actions.size(); ++i) {
    const v1::Action& a = actions[i];
    if (aborted_.load()) return FailStep(absl::AbortedError("the stage was aborted"), "step");
    if (!eval && RunsConcurrently(actions, i, step)) {
      RETURN_IF_ERROR(RunOverlappedPair(actions, next_recv, i, step, report));
      ++i;
      continue;
    }
    if (IsComputeAction(a.kind())) RETURN_IF_ERROR(PostNextRecv(actions, next_recv, i));
    v1::ActionTiming* timing = report->add_timings();
    timing->set_index(i);
    timing->set_start_us(UnixMicros());
    // The chunk's last weight gradient hands each layer to the reducer as it finishes.
    const int chunk = chunk_of_stage_[a.stage()];
    const bool post_layers = reducer_ != nullptr && !eval && i == last_grad_action_[chunk];
    if (post_layers) {
      compute_->set_layer_done_hook(
          [this](int c, int layer) { (void)PostLayerReduction(c, layer); });
    }
    absl::Status s =
        !eval && fault_.Matches(step, a) ? InjectedFaultError() : RunAction(a, step, eval);
    if (post_layers) compute_->set_layer_done_hook(nullptr);
    timing->set_end_us(UnixMicros());
    if (!s.ok()) return FailStep(s, Where(a));
    AccountAction(a, timing, eval);
  }
  if (transport_ != nullptr) {
    if (absl::Status s = transport_->WaitSends(); !s.ok()) return FailStep(s, "waiting for sends");
  }
  if (aborted_.load()) return FailStep(absl::AbortedError("the stage was aborted"), "step");
  for (MicroBatch& m : mbs_) m = MicroBatch{};
  compute_->DropSaved();
  send_buffers_.clear();
  return absl::OkStatus();
}

bool StageExecutor::RunsConcurrently(const google::protobuf::RepeatedPtrField<v1::Action>& actions,
                                     int i, int64_t step) const {
  if (!compute_->runs_chunks_concurrently() || i + 1 >= actions.size()) return false;
  const v1::Action& a = actions[i];
  const v1::Action& b = actions[i + 1];
  // The validator's pair: the F of one chunk, then the B or I of another (never two forwards,
  // which would share the sampler's scratch).
  if (!a.overlap_with_next() || !OverlapPartners(FromProto(a), FromProto(b))) return false;
  if (fault_.Matches(step, a) || fault_.Matches(step, b)) return false;
  const int ca = chunk_of_stage_[a.stage()], cb = chunk_of_stage_[b.stage()];
  // A chunk's last weight gradient hands its layers to the reducer from the compute's hook,
  // which one thread sets: such an action runs alone.
  if (reducer_ != nullptr && (i == last_grad_action_[ca] || i + 1 == last_grad_action_[cb])) {
    return false;
  }
  // The micro-batch slots each touches: its own, and the neighbouring chunk's it takes its
  // input (F) or output gradient (B, I) from.
  auto touched = [&](const v1::Action& x, int c) {
    std::vector<std::pair<int, int>> out{{c, x.micro_batch()}};
    const Chunk& ch = chunks_[c];
    if (x.kind() == v1::ACTION_F && ch.prev >= 0) out.push_back({ch.prev, x.micro_batch()});
    if ((x.kind() == v1::ACTION_B || x.kind() == v1::ACTION_I) && ch.next >= 0) {
      out.push_back({ch.next, x.micro_batch()});
    }
    return out;
  };
  for (const auto& p : touched(a, ca)) {
    for (const auto& q : touched(b, cb)) {
      if (p == q) return false;
    }
  }
  return true;
}

absl::Status StageExecutor::RunOverlappedPair(
    const google::protobuf::RepeatedPtrField<v1::Action>& actions,
    const std::vector<int>& next_recv, int i, int64_t step, v1::StepReport* report) {
  for (int k : {i, i + 1}) RETURN_IF_ERROR(PostNextRecv(actions, next_recv, k));
  v1::ActionTiming* first = report->add_timings();
  v1::ActionTiming* second = report->add_timings();
  first->set_index(i);
  second->set_index(i + 1);
  const int64_t start = UnixMicros();
  first->set_start_us(start);
  second->set_start_us(start);
  absl::Status second_status;
  int64_t second_end = 0;
  {
    std::lock_guard<std::mutex> lock(account_mu_);
    pair_running_ = true;
  }
  const auto run_second = [&] {
    second_status = RunAction(actions[i + 1], step, false);
    second_end = UnixMicros();
  };
  std::thread other;
  try {
    other = std::thread(run_second);
  } catch (const std::system_error&) {
    // No thread for the pair's second action (the process is at its limit): it runs after
    // the first on this one, as the CPU backend may anyway.
  }
  const absl::Status first_status = RunAction(actions[i], step, false);
  first->set_end_us(UnixMicros());
  if (other.joinable()) {
    other.join();
  } else {
    run_second();
  }
  second->set_end_us(second_end);
  std::vector<std::pair<int, int>> handovers;
  {
    std::lock_guard<std::mutex> lock(account_mu_);
    pair_running_ = false;
    handovers.swap(deferred_accounts_);
  }
  for (const auto& [chunk, mb] : handovers) Account(chunk, mb);
  if (!first_status.ok()) return FailStep(first_status, Where(actions[i]));
  if (!second_status.ok()) return FailStep(second_status, Where(actions[i + 1]));
  // The forward first, so that the peak counts the moment both micro-batches were held.
  AccountAction(actions[i], first, /*eval=*/false);
  AccountAction(actions[i + 1], second, /*eval=*/false);
  return absl::OkStatus();
}

absl::Status StageExecutor::PostNextRecv(
    const google::protobuf::RepeatedPtrField<v1::Action>& actions,
    const std::vector<int>& next_recv, int i) {
  // The program's next receive is posted before a compute action, so that its transfer
  // overlaps the compute (posting never blocks, so a valid program cannot deadlock).
  if (next_recv[i] < 0) return absl::OkStatus();
  if (absl::Status s = PostRecv(actions[next_recv[i]]); !s.ok()) {
    return FailStep(s, Where(actions[next_recv[i]]));
  }
  return absl::OkStatus();
}

void StageExecutor::AccountAction(const v1::Action& a, v1::ActionTiming* timing, bool eval) {
  const int chunk = chunk_of_stage_[a.stage()];
  if (IsComputeAction(a.kind())) timing->set_device_us(compute_->last_device_us(chunk));
  // R, the backwards and the F of a recomputed micro-batch report their transient peak (a
  // backward that recomputes layer by layer holds more inside than before or after it, and an
  // F that keeps only its layers' inputs holds a layer's working set while it runs).
  const bool recomputed_forward =
      a.kind() == v1::ACTION_F && !eval &&
      recomputed_[static_cast<size_t>(chunk) * mb_slots_ + static_cast<size_t>(a.micro_batch())];
  const bool transient = a.kind() == v1::ACTION_R || a.kind() == v1::ACTION_B ||
                         a.kind() == v1::ACTION_I || a.kind() == v1::ACTION_W || recomputed_forward;
  Account(chunk, a.micro_batch(), transient ? compute_->LastCallPeakSavedBytes(chunk) : 0);
}

absl::Status StageExecutor::PostLayerReduction(int chunk, int layer) {
  std::vector<bool>& posted = layer_posted_[chunk];
  if (layer < 0 || static_cast<size_t>(layer) >= posted.size() || posted[layer]) {
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(std::vector<absl::Span<float>> grads, compute_->LayerGradients(chunk, layer));
  posted[layer] = true;
  reducer_->Post(
      GradBucket{.chunk = chunk,
                 .layer = chunks_[chunk].layer_begin + layer,
                 .tensors = std::move(grads),
                 .op = shard_state_ ? GradBucket::Op::kReduceScatter : GradBucket::Op::kAllReduce});
  return absl::OkStatus();
}

absl::Status StageExecutor::PostChunkReduction(int chunk) {
  for (int l = static_cast<int>(layer_posted_[chunk].size()); l-- > 0;) {
    RETURN_IF_ERROR(PostLayerReduction(chunk, l));
  }
  return absl::OkStatus();
}

absl::Status StageExecutor::FinishReductions(v1::StepReport* report) {
  if (reducer_ == nullptr) return absl::OkStatus();
  RETURN_IF_ERROR(reducer_->Wait());
  for (v1::ActionTiming& t : *report->mutable_timings()) {
    const v1::Action& a = program_.actions(t.index());
    if (a.kind() != v1::ACTION_REDUCE_GRAD) continue;
    const GradReducer::ChunkSpan span = reducer_->span_of(chunk_of_stage_[a.stage()]);
    if (span.first_post_us > 0) {
      // From the first bucket handed over (possibly inside the last backward) to the last
      // one summed.
      t.set_start_us(span.first_post_us);
      t.set_end_us(std::max(span.end_us, span.first_post_us));
    }
  }
  report->set_reduced_bytes(reducer_->step_bytes());
  return absl::OkStatus();
}

absl::Status StageExecutor::FinishTrainingStep(int64_t step, v1::StepReport* report) {
  // The replicas' gradients summed first, so that the tied copies' exchange below adds equal
  // sums on both ends and every replica reports the same norm.
  if (absl::Status s = FinishReductions(report); !s.ok()) return FailStep(s, "gradient reduction");
  if (absl::Status s = SumTiedGradients(); !s.ok()) return FailStep(s, "tied gradients");
  // A tied parameter counts once in the global norm: on the first stage's worker.
  const auto norm_start = std::chrono::steady_clock::now();
  absl::StatusOr<StageCompute::GradStats> stats = compute_->GradientStats(holds_first_);
  if (!stats.ok()) return FailStep(stats.status(), "gradient norm");
  report->set_grad_norm_us(std::chrono::duration_cast<std::chrono::microseconds>(
                               std::chrono::steady_clock::now() - norm_start)
                               .count());
  report->set_grad_norm_sq(stats->sum_sq);
  report->set_grads_finite(stats->finite);
  pending_step_ = step;
  return absl::OkStatus();
}

void StageExecutor::FillReport(const StepStart& start, v1::StepReport* report) const {
  report->set_has_loss(holds_last_);
  if (holds_last_) report->set_loss(loss_);
  report->set_bytes_sent(transport_ ? transport_->bytes_sent() - start.bytes_sent : 0);
  report->set_bytes_received(transport_ ? transport_->bytes_received() - start.bytes_received : 0);
  report->set_peak_activation_bytes(static_cast<int64_t>(peak_bytes_));
  for (size_t c = 0; c < chunks_.size(); ++c) {
    v1::StageMemory* m = report->add_stage_memory();
    m->set_stage(chunks_[c].stage);
    const StageCompute::StaticMemory mem = compute_->static_memory(static_cast<int>(c));
    m->set_static_bytes(mem.total());
    m->set_parameter_bytes(mem.parameters);
    m->set_gradient_bytes(mem.gradients);
    m->set_optimizer_bytes(mem.optimizer);
    m->set_workspace_bytes(mem.workspace);
    m->set_peak_activation_bytes(static_cast<int64_t>(chunk_peak_bytes_[c]));
  }
  report->set_peak_send_buffer_bytes(static_cast<int64_t>(send_bytes_));
  report->set_exec_us(std::chrono::duration_cast<std::chrono::microseconds>(
                          std::chrono::steady_clock::now() - start.time)
                          .count());
  report->set_end_us(UnixMicros());
}

absl::StatusOr<v1::StepReport> StageExecutor::RunStep(int64_t step, v1::StepMode mode) {
  RETURN_IF_ERROR(CheckStepRequest(step, mode));
  if (running_.exchange(true)) {
    return absl::FailedPreconditionError(absl::StrCat(prefix_, ": a step is already running"));
  }
  struct Done {
    std::atomic<bool>& flag;
    ~Done() { flag.store(false); }
  } done{running_};
  RETURN_IF_ERROR(CheckRunnable());

  const bool eval = mode == v1::STEP_MODE_EVAL;
  v1::StepReport report;
  report.set_step(step);
  report.set_rank(program_.rank());
  report.set_start_us(UnixMicros());
  StepStart start;
  start.bytes_sent = transport_ ? transport_->bytes_sent() : 0;
  start.bytes_received = transport_ ? transport_->bytes_received() : 0;
  start.time = std::chrono::steady_clock::now();
  ResetStepCounters();
  if (reducer_ != nullptr && !eval) {
    if (absl::Status s = reducer_->BeginStep(); !s.ok()) return FailStep(s, "gradient reduction");
    for (std::vector<bool>& posted : layer_posted_) std::fill(posted.begin(), posted.end(), false);
  }
  RETURN_IF_ERROR(RunActions(step, eval, &report));
  if (!eval) RETURN_IF_ERROR(FinishTrainingStep(step, &report));
  FillReport(start, &report);
  return report;
}

absl::Status StageExecutor::SumTiedGradients() {
  std::vector<TiedGradient> tied = compute_->TiedGradients();
  if (tied.empty()) return absl::OkStatus();
  const int first_rank = program_.stage_ranks(0);
  const int last_rank = program_.stage_ranks(num_stages_ - 1);
  // Both copies are here: each gets the sum.
  if (first_rank == last_rank) return compute_->SumLocalTiedGradients();
  if (!holds_first_ && !holds_last_) return absl::OkStatus();
  // The first stage's worker holds the embedding's copy, the last stage's the head's: swap
  // and add (a + b is exactly b + a, so both copies stay bit-identical).
  const int peer = holds_first_ ? last_rank : first_rank;
  std::vector<StageBufferPtr> received;
  for (size_t i = 0; i < tied.size(); ++i) {
    const uint64_t tag = MakeTransferTag(Payload::kTiedGradient, 0, static_cast<int>(i));
    ASSIGN_OR_RETURN(StageBufferPtr other,
                     compute_->NewBuffer({static_cast<int64_t>(tied[i].bytes / sizeof(float))}));
    received.push_back(std::move(other));
    RETURN_IF_ERROR(
        transport_->SendRecv(peer, tag, tied[i].data, received.back()->data(), tied[i].bytes));
  }
  RETURN_IF_ERROR(transport_->WaitSends());
  for (size_t i = 0; i < tied.size(); ++i) {
    RETURN_IF_ERROR(compute_->AddToTiedGradient(i, *received[i]));
  }
  return absl::OkStatus();
}

absl::Status StageExecutor::GatherParameters() {
  for (int c = 0; c < static_cast<int>(chunks_.size()); ++c) {
    for (int l = 0; l < compute_->num_layers(c); ++l) {
      ASSIGN_OR_RETURN(std::vector<absl::Span<float>> values, compute_->LayerParameters(c, l));
      reducer_->Post(GradBucket{.chunk = c,
                                .layer = chunks_[c].layer_begin + l,
                                .tensors = std::move(values),
                                .op = GradBucket::Op::kAllGather});
    }
  }
  return reducer_->Wait();
}

absl::StatusOr<std::vector<StageExecutor::StateTensor>> StageExecutor::CheckpointTensors() {
  // A tied parameter is saved once: by the first stage.
  ASSIGN_OR_RETURN(std::vector<StateTensor> tensors, compute_->CheckpointTensors(holds_first_));
  if (!shard_state_) return tensors;
  // Sharded optimizer state: every replica holds a segment of each moment; the group gathers
  // them whole (every replica calls this, in the same order), and replica 0 writes them.
  gathered_.clear();
  gathered_.reserve(tensors.size());
  for (StateTensor& t : tensors) {
    if (!t.shard.has_value()) continue;
    size_t elements = 1;
    for (int64_t d : t.shape) elements *= static_cast<size_t>(d);
    if (t.shard->end > elements || t.shard->size() * sizeof(float) != t.bytes ||
        *t.shard != OwnedSegment(elements, replicas_, replica_)) {
      return absl::InternalError(absl::StrCat(prefix_, ": checkpoint: ", t.name,
                                              " holds elements [", t.shard->begin, ", ",
                                              t.shard->end, "), not this replica's segment"));
    }
    std::vector<float>& whole = gathered_.emplace_back(elements, 0.0f);
    std::memcpy(whole.data() + t.shard->begin, t.data, t.bytes);
    reducer_->Post(
        GradBucket{.tensors = {absl::MakeSpan(whole)}, .op = GradBucket::Op::kAllGather});
    t.data = whole.data();
    t.bytes = elements * sizeof(float);
    t.shard.reset();
  }
  if (absl::Status s = reducer_->Wait(); !s.ok()) {
    broken_.store(true);
    return WithPrefix(s, absl::StrCat(prefix_, ": checkpoint"));
  }
  if (replica_ > 0) return std::vector<StateTensor>{};  // replica 0 writes the checkpoint
  return tensors;
}

std::vector<std::string> StageExecutor::RestoreNames(bool weights_only) {
  return compute_->RestoreNames(weights_only);
}

absl::Status StageExecutor::Restore(const TensorLookup& lookup, bool weights_only) {
  const std::string prefix = absl::StrCat(prefix_, ": restore");
  if (pending_step_ >= 0) {
    return absl::FailedPreconditionError(absl::StrCat(prefix, ": gradients are pending"));
  }
  return compute_->Restore(lookup, weights_only, prefix);
}

absl::Status StageExecutor::ApplyStep(int64_t step, float learning_rate, float grad_scale,
                                      bool skip) {
  const std::string& prefix = prefix_;
  if (pending_step_ != step) {
    return absl::FailedPreconditionError(
        pending_step_ < 0
            ? absl::StrCat(prefix, ": no gradients are pending (apply of step ", StepNumber(step),
                           ")")
            : absl::StrCat(prefix, ": the pending gradients are step ", StepNumber(pending_step_),
                           "'s, not step ", StepNumber(step), "'s"));
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
  if (absl::Status s = compute_->Apply(learning_rate, grad_scale, skip); !s.ok()) {
    broken_.store(true);
    state_torn_ = true;
    return WithPrefix(s, prefix);
  }
  if (shard_state_ && !skip) {
    // Each replica updated its segment of every parameter: gather the rest from the others.
    if (absl::Status s = GatherParameters(); !s.ok()) {
      broken_.store(true);
      state_torn_ = true;
      return WithPrefix(s, prefix);
    }
  }
  pending_step_ = -1;
  last_applied_step_ = step;
  return absl::OkStatus();
}

}  // namespace tandem::worker
