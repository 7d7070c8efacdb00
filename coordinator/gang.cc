#include "coordinator/gang.h"

#include <algorithm>
#include <future>
#include <optional>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/relayed_rank.h"
#include "common/status_macros.h"
#include "spdlog/spdlog.h"

namespace tandem::coordinator {
namespace {

// The payload that carries a worker's own code on Gang's diagnosis of its error.
constexpr char kWorkerErrorCodePayload[] = "type.tandem.dev/worker_error_code";

}  // namespace

std::optional<absl::StatusCode> WorkerErrorCode(const absl::Status& status) {
  const auto payload = status.GetPayload(kWorkerErrorCodePayload);
  int code = 0;
  if (!payload.has_value() || !absl::SimpleAtoi(std::string(*payload), &code)) {
    return std::nullopt;
  }
  return static_cast<absl::StatusCode>(code);
}

Gang::Gang(std::string job_id, std::vector<WorkerRecord> workers, StageWorkerClientFactory& clients,
           WorkerRegistry* registry, absl::Duration abort_timeout,
           std::function<std::string(int rank)> name)
    : job_id_(std::move(job_id)),
      workers_(std::move(workers)),
      registry_(registry),
      abort_timeout_(abort_timeout),
      name_(std::move(name)) {
  for (const auto& w : workers_) clients_.push_back(clients.Connect(w.address));
}

absl::Status Gang::Reorder(const std::vector<int>& order) {
  std::vector<bool> seen(workers_.size(), false);
  if (order.size() != workers_.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("a reorder of ", order.size(), " ranks for a gang of ", workers_.size()));
  }
  for (int r : order) {
    if (r < 0 || static_cast<size_t>(r) >= seen.size() || seen[r]) {
      return absl::InvalidArgumentError(
          absl::StrCat("the reorder is not a permutation of the gang's ranks (rank ", r, ")"));
    }
    seen[r] = true;
  }
  absl::MutexLock lock(&mu_);
  if (!interrupt_.ok() || !lost_ranks_.empty()) {
    return absl::FailedPreconditionError("a gang is reordered before anything happened to it");
  }
  std::vector<WorkerRecord> workers;
  std::vector<std::unique_ptr<StageWorkerClient>> clients;
  for (int r : order) {
    workers.push_back(workers_[r]);
    clients.push_back(std::move(clients_[r]));
  }
  workers_ = std::move(workers);
  clients_ = std::move(clients);
  return absl::OkStatus();
}

bool Gang::Interrupt(absl::Status status, const std::vector<int>& lost_ranks) {
  absl::MutexLock lock(&mu_);
  if (!interrupt_.ok()) return false;
  interrupt_ = std::move(status);
  lost_ranks_.insert(lost_ranks.begin(), lost_ranks.end());
  return true;
}

absl::Status Gang::InterruptStatus() const {
  absl::MutexLock lock(&mu_);
  return interrupt_;
}

bool Gang::RankLost(int rank) const {
  absl::MutexLock lock(&mu_);
  return lost_ranks_.count(rank) > 0;
}

StageWorkerClient::Done Gang::Completion(Batch* batch, int rank) {
  return [this, batch, rank](absl::Status s) {
    absl::MutexLock lock(&mu_);
    // A relayed failure is the relayed worker's: the caller only carried it.
    const int relayed = RelayedRank(s);
    const int at = relayed >= 0 && relayed < size() ? relayed : rank;
    s.ErasePayload(kRelayedRankPayload);  // attributed: messages need not show it
    if (!s.ok() && batch->failed++ == 0) batch->first_failure = at;
    if (at != rank) batch->results[at] = s;
    batch->results[rank] = std::move(s);
    --batch->pending;
  };
}

absl::Status Gang::AwaitBatch(Batch* batch, absl::Duration timeout, const std::string& what) {
  std::string abort_reason;
  {
    absl::MutexLock lock(&mu_);
    auto settled = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return batch->pending == 0 || batch->failed > 0 || !interrupt_.ok();
    };
    mu_.AwaitWithTimeout(absl::Condition(&settled), timeout);
    if (batch->pending == 0) return absl::OkStatus();
    if (!interrupt_.ok()) {
      abort_reason = std::string(interrupt_.message());
    } else if (batch->failed > 0) {
      const int r = batch->first_failure;
      abort_reason = absl::StrCat(what, ": ", name_(r), " failed: ", batch->results[r].message());
    } else {
      abort_reason = absl::StrCat(what, " timed out after ", absl::FormatDuration(timeout));
    }
  }
  // Abort makes the workers return promptly; cancel the calls if they still do not (at once
  // for a worker known lost).
  AbortAll(abort_reason);
  for (size_t r = 0; r < clients_.size(); ++r) {
    if (RankLost(static_cast<int>(r))) clients_[r]->CancelPending();
  }
  auto done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return batch->pending == 0; };
  bool all_done;
  {
    absl::MutexLock lock(&mu_);
    all_done = mu_.AwaitWithTimeout(absl::Condition(&done), abort_timeout_);
  }
  if (!all_done) {
    for (auto& c : clients_) c->CancelPending();
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(&done));
  }
  return InterruptStatus();
}

absl::Status Gang::CallAll(const std::string& what, absl::Duration timeout,
                           const std::function<void(int, StageWorkerClient::Done)>& issue,
                           int count) {
  const int p = count < 0 ? size() : std::min(count, size());
  std::vector<int> ranks(static_cast<size_t>(p));
  for (int r = 0; r < p; ++r) ranks[r] = r;
  return CallRanks(what, timeout, ranks, issue);
}

absl::Status Gang::CallRanks(const std::string& what, absl::Duration timeout,
                             const std::vector<int>& ranks,
                             const std::function<void(int, StageWorkerClient::Done)>& issue) {
  Batch batch(size());
  batch.pending = static_cast<int>(ranks.size());
  batch.deadline = timeout;
  for (int r : ranks) issue(r, Completion(&batch, r));
  RETURN_IF_ERROR(AwaitBatch(&batch, timeout + absl::Seconds(5), what));
  if (batch.failed > 0) return Diagnose(what, batch.results, batch.first_failure, batch.deadline);
  return absl::OkStatus();
}

absl::Status Gang::Diagnose(const std::string& what, const std::vector<absl::Status>& results,
                            absl::Duration deadline) {
  int first_failure = -1;
  for (size_t r = 0; r < results.size() && first_failure < 0; ++r) {
    if (!results[r].ok()) first_failure = static_cast<int>(r);
  }
  return Diagnose(what, results, first_failure, deadline);
}

absl::Status Gang::Diagnose(const std::string& what, const std::vector<absl::Status>& results,
                            int first_failure, absl::Duration deadline) {
  RETURN_IF_ERROR(InterruptStatus());
  const int p = size();
  std::vector<std::future<absl::Status>> probes;
  for (int r = 0; r < p; ++r) {
    probes.push_back(
        std::async(std::launch::async, [this, r] { return clients_[r]->Probe(absl::Seconds(2)); }));
  }
  std::string first_error;
  if (first_failure >= 0) {
    const int r = first_failure;
    const absl::Status& e = results[r];
    if (e.code() == absl::StatusCode::kDeadlineExceeded) {
      // The call's own deadline passed: say which, and what that usually means.
      first_error = absl::StrCat(name_(r), " timed out: no answer within ",
                                 absl::FormatDuration(deadline), " (", e.message(),
                                 "); it may be hung, or waiting on a peer or a link that is down");
    } else {
      first_error = absl::StrCat(name_(r), ": ", e.ToString());
    }
  }
  // Every unreachable worker is marked lost (not only the first), so that the restart, which
  // may come before their heartbeats are missed, picks none of them.
  std::optional<absl::Status> unreachable;
  for (int r = 0; r < p; ++r) {
    absl::Status probe = probes[r].get();
    if (!probe.ok()) {
      {
        absl::MutexLock lock(&mu_);
        lost_ranks_.insert(r);
      }
      registry_->MarkLost(workers_[r].id);
      if (!unreachable.has_value()) {
        unreachable =
            absl::UnavailableError(absl::StrCat(what, ": ", name_(r), " is unreachable (",
                                                probe.ToString(), "); first error: ", first_error));
      }
    }
  }
  if (unreachable.has_value()) return *unreachable;
  absl::Status diagnosis = absl::InternalError(absl::StrCat(what, ": ", first_error));
  if (first_failure >= 0) {
    diagnosis.SetPayload(kWorkerErrorCodePayload,
                         absl::Cord(absl::StrCat(static_cast<int>(results[first_failure].code()))));
  }
  return diagnosis;
}

void Gang::set_retain_step(int64_t step, const v1::ApplyStepRequest* apply) {
  absl::MutexLock lock(&retain_mu_);
  retain_step_ = step;
  retain_apply_.reset();
  if (apply != nullptr && step >= 0) retain_apply_ = *apply;
}

int64_t Gang::retain_step() const {
  absl::MutexLock lock(&retain_mu_);
  return retain_step_;
}

void Gang::AbortAll(const std::string& reason) {
  v1::AbortRequest req;
  req.set_job_id(job_id_);
  req.set_reason(reason);
  {
    absl::MutexLock lock(&retain_mu_);
    if (retain_step_ >= 0) {
      req.set_retain_state(true);
      req.set_retain_step(retain_step_);
      if (retain_apply_.has_value()) *req.mutable_retain_apply() = *retain_apply_;
    }
  }
  std::vector<std::future<absl::Status>> calls;
  for (size_t r = 0; r < clients_.size(); ++r) {
    if (RankLost(static_cast<int>(r))) {
      calls.push_back(std::async(std::launch::deferred, [] { return absl::OkStatus(); }));
      continue;
    }
    calls.push_back(std::async(
        std::launch::async, [this, r, &req] { return clients_[r]->Abort(req, abort_timeout_); }));
  }
  for (size_t r = 0; r < calls.size(); ++r) {
    absl::Status s = calls[r].get();
    if (!s.ok()) {
      spdlog::warn("{}: abort of {} failed: {}", job_id_, name_(static_cast<int>(r)), s.ToString());
    }
  }
}

}  // namespace tandem::coordinator
