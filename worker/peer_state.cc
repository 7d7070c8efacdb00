#include "worker/peer_state.h"

#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/step_number.h"
#include "spdlog/spdlog.h"

namespace tandem::worker {

absl::StatusOr<std::shared_ptr<const KeptState>> KeptState::Copy(
    const std::string& job_id, int64_t step, const std::vector<StateTensor>& tensors) {
  std::shared_ptr<KeptState> kept(new KeptState(job_id, step));
  for (const StateTensor& t : tensors) {
    if (t.shard.has_value()) {
      return absl::FailedPreconditionError(
          absl::StrCat("tensor ", t.name, " is a segment of a sharded optimizer state"));
    }
    Tensor& dst = kept->tensors_[t.name];
    dst.dtype = t.dtype;
    dst.shape = t.shape;
    dst.data.assign(static_cast<const char*>(t.data), t.bytes);
    kept->bytes_ += static_cast<int64_t>(t.bytes);
  }
  return std::shared_ptr<const KeptState>(std::move(kept));
}

std::vector<StateTensor> KeptState::Select(const std::vector<std::string>& names) const {
  std::vector<StateTensor> out;
  for (const std::string& name : names) {
    auto it = tensors_.find(name);
    if (it == tensors_.end()) continue;
    out.push_back(StateTensor{.name = name,
                              .dtype = it->second.dtype,
                              .shape = it->second.shape,
                              .data = it->second.data.data(),
                              .bytes = it->second.data.size()});
  }
  return out;
}

absl::Status FetchPeerState(const v1::CheckpointRef& restore, const std::vector<std::string>& names,
                            const KeptState* own, const PeerStateReader& read,
                            std::map<std::string, std::string>* out) {
  const std::string what = absl::StrCat("peer recovery of job ", restore.job_id(), " after step ",
                                        StepNumber(restore.step()));
  std::set<std::string> missing(names.begin(), names.end());
  if (own != nullptr && own->Holds(restore.job_id(), restore.step())) {
    for (const StateTensor& t : own->Select(names)) {
      (*out)[t.name].assign(static_cast<const char*>(t.data), t.bytes);
      missing.erase(t.name);
    }
  }
  int failed = 0;
  for (const std::string& peer : restore.peers()) {
    if (missing.empty()) break;
    if (!read) break;
    std::map<std::string, std::string> got;
    const absl::Status s = read(peer, restore, {missing.begin(), missing.end()}, &got);
    if (!s.ok()) {
      ++failed;
      spdlog::warn("{}: the worker at {} cannot serve it: {}", what, peer, s.ToString());
      continue;
    }
    for (auto& [name, bytes] : got) {
      if (missing.erase(name) > 0) (*out)[name] = std::move(bytes);
    }
  }
  if (missing.empty()) return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat(
      what, ": ", missing.size(), " of ", names.size(), " tensors (", *missing.begin(),
      " first) are held by none of the ", restore.peers_size(), " workers that kept the state (",
      failed, " of them failed to answer)", read ? "" : "; this worker cannot read peers"));
}

}  // namespace tandem::worker
