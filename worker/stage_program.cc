#include "worker/stage_program.h"

#include <algorithm>
#include <set>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/model_desc.h"
#include "common/schedule.h"
#include "common/spec.h"
#include "common/status_macros.h"
#include "worker/model/model_layers.h"

namespace tandem::worker {
namespace {

constexpr int kMaxMicroBatches = 1 << 16;
constexpr int64_t kMaxMicroBatchSize = 1 << 20;

// What the stages of one worker look like to the replay: where each stage's neighbours are.
struct StageView {
  bool here = false;        // the stage is on this worker
  bool first = false;       // stage 0
  bool last = false;        // the last stage
  bool prev_local = false;  // stage - 1 is on this worker too
  bool next_local = false;  // stage + 1 is on this worker too
};

// Replays an action list: for every stage of this worker and micro-batch, F after its input
// (RECV_F, or F of the previous stage when that stage is here), SEND_F after F; and unless
// forward_only, the backward (B, or I then W) after its output gradient (RECV_B, or the
// backward of the next stage when it is here), SEND_B after B or I. Each action once, and
// only the transfers to stages on other workers.
// An R (recompute) at most once, after its F and before its backward.
// With `reduce` (a data-parallel program), each stage of this worker has exactly one
// REDUCE_GRAD, after the backward of every micro-batch (B, or W); without, none.
absl::Status ReplayActions(const google::protobuf::RepeatedPtrField<v1::Action>& actions,
                           absl::string_view field, int m, const std::vector<StageView>& stages,
                           bool forward_only, bool reduce = false) {
  enum Bit {
    kRecvF = 1,
    kF = 2,
    kSendF = 4,
    kRecvB = 8,
    kB = 16,
    kSendB = 32,
    kI = 64,
    kW = 128,
    kR = 256
  };
  const int num_stages = static_cast<int>(stages.size());
  std::vector<std::vector<int>> done(num_stages);
  for (int s = 0; s < num_stages; ++s) {
    if (stages[s].here) done[s].assign(m, 0);
  }
  auto backward_done = [](int d) { return (d & (kB | kI)) != 0; };
  std::vector<bool> reduced(num_stages, false);
  for (int i = 0; i < actions.size(); ++i) {
    const v1::Action& a = actions[i];
    const std::string where = absl::StrCat(field, "[", i, "] (", ActionToString(FromProto(a)), ")");
    if (a.stage() < 0 || a.stage() >= num_stages || !stages[a.stage()].here) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": stage ", a.stage(), " is not held by this worker"));
    }
    if (a.kind() == v1::ACTION_REDUCE_GRAD) {
      if (!reduce || forward_only) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, ": a gradient reduction in a program without data parallelism ",
            "(program.num_replicas < 2", forward_only ? ", or a forward-only one)" : ")"));
      }
      if (a.micro_batch() != 0 || reduced[a.stage()]) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, a.micro_batch() != 0 ? ": REDUCE_GRAD takes no micro-batch" : ": repeated"));
      }
      for (int mb = 0; mb < m; ++mb) {
        if ((done[a.stage()][mb] & (kB | kW)) == 0) {
          return absl::InvalidArgumentError(
              absl::StrCat(where, ": comes before the weight gradient of micro-batch ", mb));
        }
      }
      reduced[a.stage()] = true;
      continue;
    }
    if (a.micro_batch() < 0 || a.micro_batch() >= m) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": micro-batch outside [0, ", m, ")"));
    }
    const StageView& v = stages[a.stage()];
    int& d = done[a.stage()][a.micro_batch()];
    // Inputs that live on this worker: the previous stage's F, the next stage's backward.
    const int prev_d = v.prev_local ? done[a.stage() - 1][a.micro_batch()] : 0;
    const int next_d = v.next_local ? done[a.stage() + 1][a.micro_batch()] : 0;
    bool ready = true;
    bool allowed = true;
    int bit = 0;
    switch (a.kind()) {
      case v1::ACTION_RECV_F:
        bit = kRecvF;
        allowed = !v.first && !v.prev_local;
        break;
      case v1::ACTION_F:
        bit = kF;
        ready = v.first || (v.prev_local ? (prev_d & kF) != 0 : (d & kRecvF) != 0);
        break;
      case v1::ACTION_SEND_F:
        bit = kSendF;
        allowed = !v.last && !v.next_local;
        ready = (d & kF) != 0;
        break;
      case v1::ACTION_RECV_B:
        bit = kRecvB;
        allowed = !v.last && !v.next_local;
        ready = (d & kF) != 0;
        break;
      case v1::ACTION_B:
      case v1::ACTION_I:
        bit = a.kind() == v1::ACTION_B ? kB : kI;
        if (backward_done(d)) {
          return absl::InvalidArgumentError(
              absl::StrCat(where, ": the micro-batch's backward already ran"));
        }
        ready =
            (d & kF) != 0 && (v.last || (v.next_local ? backward_done(next_d) : (d & kRecvB) != 0));
        break;
      case v1::ACTION_W:
        bit = kW;
        ready = (d & kI) != 0;
        break;
      case v1::ACTION_R:  // recompute: after its F, before its backward
        bit = kR;
        if (backward_done(d)) {
          return absl::InvalidArgumentError(
              absl::StrCat(where, ": recomputes after the micro-batch's backward"));
        }
        ready = (d & kF) != 0;
        break;
      case v1::ACTION_SEND_B:
        bit = kSendB;
        allowed = !v.first && !v.prev_local;
        ready = backward_done(d);
        break;
      default:
        return absl::InvalidArgumentError(absl::StrCat(where, ": action kind ",
                                                       v1::ActionKind_Name(a.kind()),
                                                       " is not supported by this worker"));
    }
    if (forward_only && (bit & (kRecvB | kB | kI | kW | kSendB | kR)) != 0) allowed = false;
    if (!allowed) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": stage ", a.stage(), " of ", num_stages,
                       forward_only ? " runs forwards only here" : " has no such transfer",
                       " (its neighbours' placement makes it local or absent)"));
    }
    if (d & bit) return absl::InvalidArgumentError(absl::StrCat(where, ": repeated"));
    if (!ready) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": comes before the action it depends on"));
    }
    d |= bit;
  }
  for (int s = 0; s < num_stages; ++s) {
    const StageView& v = stages[s];
    if (!v.here) continue;
    if (reduce && !forward_only && !reduced[s]) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": stage ", s,
                       " has no REDUCE_GRAD (program.num_replicas > 1 needs one per stage)"));
    }
    const int transfers_f =
        (v.first || v.prev_local ? 0 : kRecvF) | (v.last || v.next_local ? 0 : kSendF);
    const int transfers_b =
        (v.first || v.prev_local ? 0 : kSendB) | (v.last || v.next_local ? 0 : kRecvB);
    for (int mb = 0; mb < m; ++mb) {
      const int d = done[s][mb];
      const int transfers = forward_only ? transfers_f : transfers_f | transfers_b;
      const bool backward_ok = forward_only || (d & kB) != 0 || ((d & kI) && (d & kW));
      if ((d & kF) == 0 || !backward_ok || (d & transfers) != transfers) {
        return absl::InvalidArgumentError(absl::StrCat(
            field, ": stage ", s, " micro-batch ", mb,
            " is missing some of its actions (each needs F",
            forward_only ? "" : " and B (or I and W)", (transfers & kRecvF) ? ", RECV_F" : "",
            (transfers & kSendF) ? ", SEND_F" : "", (transfers & kRecvB) ? ", RECV_B" : "",
            (transfers & kSendB) ? ", SEND_B" : "", ")"));
      }
    }
  }
  return absl::OkStatus();
}

// Checks the placement and the chunks; fills the replay's view of every stage.
absl::Status CheckChunks(const v1::StageProgram& p, std::vector<StageView>& view) {
  const int num_stages = p.num_stages();
  if (num_stages < p.num_ranks() || num_stages > (1 << 20)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "program.num_stages ", num_stages, " must be at least num_ranks (", p.num_ranks(), ")"));
  }
  if (p.stage_ranks_size() != num_stages) {
    return absl::InvalidArgumentError(absl::StrCat("program.stage_ranks has ", p.stage_ranks_size(),
                                                   " entries for ", num_stages, " stages"));
  }
  for (int s = 0; s < num_stages; ++s) {
    if (p.stage_ranks(s) < 0 || p.stage_ranks(s) >= p.num_ranks()) {
      return absl::InvalidArgumentError(absl::StrCat("program.stage_ranks[", s,
                                                     "] = ", p.stage_ranks(s),
                                                     " is not a rank of [0, ", p.num_ranks(), ")"));
    }
  }
  if (p.chunks_size() == 0) {
    return absl::InvalidArgumentError("program.chunks is empty: the worker holds no stage");
  }
  const int num_layers = NumLayers(p.spec().model());
  view.assign(num_stages, StageView{});
  int previous = -1;
  for (const v1::StageChunk& c : p.chunks()) {
    const std::string name = absl::StrCat("program chunk of stage ", c.stage());
    if (c.stage() <= previous || c.stage() >= num_stages) {
      return absl::InvalidArgumentError(absl::StrCat(
          name, ": chunks must list distinct stages of [0, ", num_stages, ") in ascending order"));
    }
    previous = c.stage();
    if (p.stage_ranks(c.stage()) != p.rank()) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": stage_ranks places it on rank ",
                                                     p.stage_ranks(c.stage()), ", not on rank ",
                                                     p.rank()));
    }
    if (c.layer_begin() < 0 || c.layer_begin() >= c.layer_end() || c.layer_end() > num_layers) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": layers [", c.layer_begin(), ", ", c.layer_end(),
                       ") are not a non-empty range within the model's ", num_layers, " layers"));
    }
    const bool first = c.stage() == 0;
    const bool last = c.stage() == num_stages - 1;
    if (first != (c.layer_begin() == 0) || last != (c.layer_end() == num_layers)) {
      return absl::InvalidArgumentError(absl::StrCat(
          name, ": layers [", c.layer_begin(), ", ", c.layer_end(), ") of stage ", c.stage(), "/",
          num_stages,
          ": the first stage must hold the embedding (layer 0) and only the last the head (layer ",
          num_layers - 1, ")"));
    }
    view[c.stage()] = StageView{true, first, last, false, false};
  }
  for (int s = 0; s < num_stages; ++s) {
    if (!view[s].here) {
      if (p.stage_ranks(s) == p.rank()) {
        return absl::InvalidArgumentError(absl::StrCat("program.stage_ranks places stage ", s,
                                                       " on this rank, but chunks do not hold it"));
      }
      continue;
    }
    view[s].prev_local = s > 0 && view[s - 1].here;
    view[s].next_local = s + 1 < num_stages && p.stage_ranks(s + 1) == p.rank();
  }
  // Two neighbouring stages on one worker must be adjacent in layers.
  for (int i = 1; i < p.chunks_size(); ++i) {
    const v1::StageChunk& a = p.chunks(i - 1);
    const v1::StageChunk& b = p.chunks(i);
    if (b.stage() == a.stage() + 1 && b.layer_begin() != a.layer_end()) {
      return absl::InvalidArgumentError(absl::StrCat("program chunks of stages ", a.stage(),
                                                     " and ", b.stage(),
                                                     " are not contiguous in layers"));
    }
  }
  return absl::OkStatus();
}

// Data parallelism: the replica within [0, num_replicas) and, with several, the group's
// rendezvous prefix.
absl::Status CheckReplicas(const v1::StageProgram& p) {
  if (p.num_replicas() < 0 || p.num_replicas() > (1 << 20)) {
    return absl::InvalidArgumentError(
        absl::StrCat("program.num_replicas ", p.num_replicas(), " is out of range"));
  }
  const int replicas = std::max(1, p.num_replicas());
  if (p.replica() < 0 || p.replica() >= replicas) {
    return absl::InvalidArgumentError(absl::StrCat("program.replica ", p.replica(),
                                                   " is outside [0, num_replicas=", replicas, ")"));
  }
  if (replicas > 1 && p.dp_rendezvous_prefix().empty()) {
    return absl::InvalidArgumentError(
        "program.dp_rendezvous_prefix is empty but num_replicas > 1: the data-parallel group "
        "cannot meet");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateStageProgram(const v1::StageProgram& p) {
  if (p.job_id().empty()) return absl::InvalidArgumentError("program.job_id is empty");
  if (p.num_ranks() < 1 || p.rank() < 0 || p.rank() >= p.num_ranks()) {
    return absl::InvalidArgumentError(
        absl::StrCat("program.rank ", p.rank(), " is outside [0, num_ranks=", p.num_ranks(), ")"));
  }
  const v1::DataSpec& data = p.spec().data();
  if ((data.source() == "synthetic" || data.format() == "bytes") &&
      p.spec().model().vocab_size() < 256) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.vocab_size must be at least 256 for byte data, got ",
                     p.spec().model().vocab_size()));
  }
  RETURN_IF_ERROR(CheckModelSpec(p.spec().model()));
  std::vector<StageView> view;
  RETURN_IF_ERROR(CheckChunks(p, view));
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
  RETURN_IF_ERROR(CheckReplicas(p));
  RETURN_IF_ERROR(ReplayActions(p.actions(), "program.actions", m, view, /*forward_only=*/false,
                                /*reduce=*/p.num_replicas() > 1));
  if (p.eval_actions_size() > 0) {
    const int e = p.eval_micro_batches();
    if (e < 1 || e > kMaxMicroBatches) {
      return absl::InvalidArgumentError(absl::StrCat("program.eval_micro_batches must be in [1, ",
                                                     kMaxMicroBatches, "], got ", e));
    }
    RETURN_IF_ERROR(
        ReplayActions(p.eval_actions(), "program.eval_actions", e, view, /*forward_only=*/true));
  }
  return absl::OkStatus();
}

int MicroBatchesOf(const v1::StageProgram& program) {
  return program.micro_batches() != 0 ? program.micro_batches()
                                      : program.spec().pipeline().micro_batches();
}

std::vector<int> TransferPeers(const v1::StageProgram& program) {
  const int me = program.rank();
  const int num_stages = program.stage_ranks_size();
  std::set<int> peers;
  auto link = [&](int a, int b) {
    if (a == me && b != me) peers.insert(b);
    if (b == me && a != me) peers.insert(a);
  };
  for (int s = 0; s + 1 < num_stages; ++s) link(program.stage_ranks(s), program.stage_ranks(s + 1));
  const v1::ModelSpec& model = program.spec().model();
  if (num_stages > 1 && IsDecoder(model) && model.tie_embeddings()) {
    link(program.stage_ranks(0), program.stage_ranks(num_stages - 1));
  }
  return {peers.begin(), peers.end()};
}

bool StageNeedsCorpus(const v1::StageProgram& program) {
  const int num_layers = NumLayers(program.spec().model());
  for (const v1::StageChunk& c : program.chunks()) {
    if (c.layer_begin() == 0 || c.layer_end() == num_layers) return true;
  }
  return false;
}

v1::StageProgram DataParallelGroupProgram(const v1::StageProgram& program) {
  v1::StageProgram group;
  group.set_job_id(program.job_id());
  *group.mutable_spec() = program.spec();
  group.set_rank(program.replica());
  group.set_num_ranks(program.num_replicas());
  group.set_rendezvous_prefix(program.dp_rendezvous_prefix());
  group.set_attempt(program.attempt());
  return group;
}

std::vector<int> NextReceives(const google::protobuf::RepeatedPtrField<v1::Action>& actions) {
  std::vector<int> next(actions.size(), -1);
  for (int i = actions.size() - 2; i >= 0; --i) {
    const v1::ActionKind k = actions[i + 1].kind();
    next[i] = k == v1::ACTION_RECV_F || k == v1::ACTION_RECV_B ? i + 1 : next[i + 1];
  }
  return next;
}

}  // namespace tandem::worker
