#include "worker/step_relay.h"

#include <algorithm>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/rpc.h"
#include "common/version.h"

namespace tandem::worker {
namespace {

absl::Status ValidateNodes(const google::protobuf::RepeatedPtrField<v1::StepRelay>& relay,
                           int max_nodes, int depth, std::set<int>* seen) {
  if (depth > 64) return absl::InvalidArgumentError("relay: deeper than 64 levels");
  for (const v1::StepRelay& node : relay) {
    if (node.rank() < 0) {
      return absl::InvalidArgumentError(absl::StrCat("relay: rank ", node.rank(), " is negative"));
    }
    if (node.address().empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("relay: rank ", node.rank(), " has no address"));
    }
    if (!seen->insert(node.rank()).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("relay: rank ", node.rank(), " appears more than once"));
    }
    if (static_cast<int>(seen->size()) > max_nodes) {
      return absl::InvalidArgumentError(
          absl::StrCat("relay: more than ", max_nodes, " workers to forward to"));
    }
    if (absl::Status s = ValidateNodes(node.children(), max_nodes, depth + 1, seen); !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateRelay(const google::protobuf::RepeatedPtrField<v1::StepRelay>& relay,
                           int max_nodes) {
  std::set<int> seen;
  return ValidateNodes(relay, max_nodes, 0, &seen);
}

// One Forward: a call per relay entry, and what they answered.
struct StepRelay::Batch {
  struct Call {
    grpc::ClientContext ctx;
    v1::RunStepRequest req;
    v1::RunStepResponse resp;
    int rank = -1;
  };
  absl::Mutex mu;
  int pending ABSL_GUARDED_BY(mu) = 0;
  Outcome outcome ABSL_GUARDED_BY(mu);
  std::function<void(const absl::Status&, int)> on_failure;
  std::function<void(Outcome)> done;
  std::vector<std::unique_ptr<Call>> calls;
};

StepRelay::StepRelay(Dial dial) : dial_(std::move(dial)) {}

StepRelay::~StepRelay() {
  absl::MutexLock lock(&mu_);
  for (grpc::ClientContext* ctx : in_flight_) ctx->TryCancel();
  mu_.Await(absl::Condition(
      +[](int* n) { return *n == 0; }, &callbacks_pending_));
}

v1::StageWorker::Stub* StepRelay::StubFor(const std::string& address) {
  absl::MutexLock lock(&mu_);
  auto& stub = stubs_[address];
  if (stub == nullptr) stub = v1::StageWorker::NewStub(dial_(address));
  return stub.get();
}

void StepRelay::Track(grpc::ClientContext* ctx) {
  absl::MutexLock lock(&mu_);
  in_flight_.push_back(ctx);
  ++callbacks_pending_;
}

void StepRelay::CallbackFinished() {
  absl::MutexLock lock(&mu_);
  --callbacks_pending_;
}

void StepRelay::Untrack(grpc::ClientContext* ctx) {
  absl::MutexLock lock(&mu_);
  in_flight_.erase(std::find(in_flight_.begin(), in_flight_.end(), ctx));
}

void StepRelay::Forward(const v1::RunStepRequest& request,
                        std::chrono::system_clock::time_point deadline,
                        std::function<void(const absl::Status&, int rank)> on_failure,
                        std::function<void(Outcome)> done) {
  auto batch = std::make_shared<Batch>();
  batch->on_failure = std::move(on_failure);
  batch->done = std::move(done);
  if (request.relay_size() == 0) {
    batch->done(Outcome{});
    return;
  }
  for (const v1::StepRelay& node : request.relay()) {
    auto call = std::make_unique<Batch::Call>();
    call->rank = node.rank();
    call->req = request;
    call->req.set_protocol_version(kProtocolVersion);
    *call->req.mutable_relay() = node.children();
    call->ctx.set_deadline(deadline);
    batch->calls.push_back(std::move(call));
  }
  {
    absl::MutexLock lock(&batch->mu);
    batch->pending = static_cast<int>(batch->calls.size());
  }
  for (size_t i = 0; i < batch->calls.size(); ++i) {
    Batch::Call* call = batch->calls[i].get();
    v1::StageWorker::Stub* stub = StubFor(request.relay(static_cast<int>(i)).address());
    Track(&call->ctx);
    stub->async()->RunStep(
        &call->ctx, &call->req, &call->resp, [this, batch, call](grpc::Status s) mutable {
          absl::Status status = FromGrpcCall(s, call->ctx);
          // No longer cancellable (the destructor cancels only calls still in flight).
          Untrack(&call->ctx);
          absl::Status failure;
          int failed_rank = -1;
          {
            absl::MutexLock lock(&batch->mu);
            if (status.ok()) {
              v1::RelayedStep mine;
              mine.set_rank(call->rank);
              *mine.mutable_report() = std::move(*call->resp.mutable_report());
              batch->outcome.relayed.push_back(std::move(mine));
              for (v1::RelayedStep& r : *call->resp.mutable_relayed()) {
                batch->outcome.relayed.push_back(std::move(r));
              }
            } else if (batch->outcome.status.ok()) {
              failed_rank = RelayedRank(status) >= 0 ? RelayedRank(status) : call->rank;
              batch->outcome.status = WithRelayedRank(status, failed_rank);
              batch->outcome.failed_rank = failed_rank;
              failure = batch->outcome.status;
            }
          }
          // The failure is reported before this call counts as ended, so that it never comes
          // after `done`.
          if (!failure.ok() && batch->on_failure) batch->on_failure(failure, failed_rank);
          bool last = false;
          {
            absl::MutexLock lock(&batch->mu);
            last = --batch->pending == 0;
          }
          if (last) {
            Outcome outcome;
            {
              absl::MutexLock lock(&batch->mu);
              outcome = std::move(batch->outcome);
            }
            if (!outcome.status.ok()) outcome.relayed.clear();
            batch->done(std::move(outcome));
          }
          // This callback's hold on the batch ends here (the last one frees the calls'
          // contexts), and only then does it count as finished: the destructor waits for every
          // callback to finish, not only for the calls to end.
          batch.reset();
          CallbackFinished();
        });
  }
}

}  // namespace tandem::worker
