#include "coordinator/worker_registry.h"

#include <algorithm>

#include "absl/algorithm/container.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/limits.h"
#include "common/spec.h"
#include "coordinator/placement.h"

namespace tandem::coordinator {
namespace {

bool ParseWorkerId(const std::string& id, int64_t* n) {
  return id.size() > 2 && id.rfind("w-", 0) == 0 && absl::SimpleAtoi(id.substr(2), n);
}

}  // namespace

int64_t FirstWorkerId(int64_t incarnation) {
  return incarnation <= 1 ? 1 : (incarnation - 1) * 1000000 + 1;
}

WorkerRegistry::WorkerRegistry(std::chrono::milliseconds heartbeat_timeout, int64_t first_id)
    : heartbeat_timeout_(heartbeat_timeout), next_id_(first_id) {}

void WorkerRegistry::SetHeartbeatInterval(std::chrono::milliseconds base,
                                          std::chrono::microseconds per_worker) {
  absl::MutexLock lock(&mu_);
  base_interval_ = std::max(std::chrono::milliseconds(1), base);
  per_worker_ = std::max(std::chrono::microseconds(0), per_worker);
}

std::chrono::milliseconds WorkerRegistry::IntervalLocked() const {
  // Capped at a minute: beyond that a lost idle worker would go unnoticed for too long.
  const auto scaled = std::chrono::duration_cast<std::chrono::milliseconds>(per_worker_ * alive_);
  return std::min(std::max(base_interval_, scaled),
                  std::max(base_interval_, std::chrono::milliseconds(60000)));
}

std::chrono::milliseconds WorkerRegistry::TimeoutLocked() const {
  const auto interval = IntervalLocked();
  if (interval <= base_interval_) return heartbeat_timeout_;
  return std::chrono::milliseconds(heartbeat_timeout_.count() * interval.count() /
                                   base_interval_.count());
}

std::chrono::milliseconds WorkerRegistry::heartbeat_interval() const {
  absl::MutexLock lock(&mu_);
  return IntervalLocked();
}

std::chrono::milliseconds WorkerRegistry::heartbeat_timeout() const {
  absl::MutexLock lock(&mu_);
  return TimeoutLocked();
}

void WorkerRegistry::CountAliveLocked() {
  alive_ = 0;
  for (const auto& [n, w] : workers_) alive_ += w.state != v1::LOST;
}

absl::StatusOr<std::string> WorkerRegistry::Register(const v1::RegisterRequest& request) {
  if (request.address().empty()) {
    return absl::InvalidArgumentError("register: address is empty; expected HOST:PORT");
  }
  const std::string kind = DeviceKind(request.device());
  if (kind != "cpu" && kind != "cuda") {
    return absl::InvalidArgumentError(
        absl::StrCat("register: device '", request.device(), "' is not one of cpu, cuda:N"));
  }
  if (request.threads() < 0) {
    return absl::InvalidArgumentError("register: threads must be >= 0");
  }
  if (request.device_uuid().size() > 64) {
    return absl::InvalidArgumentError(absl::StrCat(
        "register: device_uuid is ", request.device_uuid().size(),
        " bytes; expected a GPU uuid such as GPU-8c7f2b1e-0f3a-4c1d-9e2b-5a6b7c8d9e0f"));
  }
  if (request.device_name().size() > kMaxDeviceNameBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("register: device_name is ", request.device_name().size(), " bytes; at most ",
                     kMaxDeviceNameBytes, " (the GPU's or the processor's name)"));
  }
  if (absl::c_any_of(request.device_name(),
                     [](char c) { return absl::ascii_iscntrl(static_cast<unsigned char>(c)); })) {
    return absl::InvalidArgumentError(
        "register: device_name holds a control character; expected one line of text (the GPU's "
        "or the processor's name)");
  }
  if (!(request.peak_flops() >= 0) || request.peak_flops() > 1e18) {
    return absl::InvalidArgumentError(absl::StrCat(
        "register: peak_flops must be a FLOP/s figure in [0, 1e18], got ", request.peak_flops()));
  }
  if (request.peak_method().size() > 512) {
    return absl::InvalidArgumentError(
        absl::StrCat("register: peak_method is ", request.peak_method().size(),
                     " bytes; at most 512 (how the peak was measured)"));
  }
  if (request.peak_measured_unix_ms() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("register: peak_measured_unix_ms must be >= 0 (Unix milliseconds), got ",
                     request.peak_measured_unix_ms()));
  }
  absl::MutexLock lock(&mu_);
  // A worker restarted at the same address replaces its old record.
  for (auto& [n, w] : workers_) {
    if (w.address == request.address() && w.state != v1::LOST) w.state = v1::LOST;
  }
  const int64_t n = next_id_++;
  WorkerRecord& w = workers_[n];
  w.id = absl::StrCat("w-", n);
  w.address = request.address();
  w.device = request.device();
  w.threads = request.threads();
  w.hostname = request.hostname();
  w.node = request.node().empty() ? request.hostname() : request.node();
  w.version = request.version();
  w.peak_flops = request.peak_flops();
  w.peak_method = request.peak_method();
  w.peak_measured_unix_ms = request.peak_measured_unix_ms();
  w.device_uuid = request.device_uuid();
  w.device_name = request.device_name();
  w.state = v1::IDLE;
  w.last_heartbeat = Clock::now();
  CountAliveLocked();
  return w.id;
}

absl::Status WorkerRegistry::Heartbeat(const std::string& worker_id, const HeartbeatClock& clock) {
  int64_t n = 0;
  absl::MutexLock lock(&mu_);
  auto it = ParseWorkerId(worker_id, &n) ? workers_.find(n) : workers_.end();
  if (it == workers_.end()) {
    return absl::NotFoundError(absl::StrCat("worker '", worker_id, "' is not registered"));
  }
  WorkerRecord& w = it->second;
  w.last_heartbeat = Clock::now();
  ClockOffsetEstimator& estimator = clocks_[n];
  if (clock.previous_round.has_value()) {
    // An inconsistent sample (a clock stepped mid-trip) only loses one estimate.
    (void)estimator.Add(*clock.previous_round);
  }
  estimator.AddOneWay(clock.worker_send_us, clock.coordinator_receive_us);
  if (estimator.has_estimate()) {
    w.clock_offset_us = estimator.offset_us();
    w.clock_uncertainty_us = estimator.uncertainty_us();
  }
  if (w.state == v1::LOST && w.job_id.empty()) w.state = v1::IDLE;
  return absl::OkStatus();
}

std::vector<int64_t> WorkerRegistry::ClockOffsets(
    const std::vector<std::string>& worker_ids) const {
  absl::MutexLock lock(&mu_);
  std::vector<int64_t> out;
  for (const std::string& id : worker_ids) {
    int64_t n = 0;
    auto it = ParseWorkerId(id, &n) ? workers_.find(n) : workers_.end();
    out.push_back(it == workers_.end() ? 0 : it->second.clock_offset_us);
  }
  return out;
}

std::vector<WorkerRecord> WorkerRegistry::SweepLost() {
  std::vector<WorkerRecord> lost_busy;
  const auto now = Clock::now();
  absl::MutexLock lock(&mu_);
  const auto timeout = TimeoutLocked();
  for (auto& [n, w] : workers_) {
    if (w.state == v1::LOST || now - w.last_heartbeat <= timeout) continue;
    if (w.state == v1::BUSY) lost_busy.push_back(w);
    w.state = v1::LOST;
  }
  CountAliveLocked();
  return lost_busy;
}

void WorkerRegistry::MarkLost(const std::string& worker_id) {
  int64_t n = 0;
  absl::MutexLock lock(&mu_);
  auto it = ParseWorkerId(worker_id, &n) ? workers_.find(n) : workers_.end();
  if (it != workers_.end()) it->second.state = v1::LOST;
}

absl::StatusOr<std::vector<WorkerRecord>> WorkerRegistry::Allocate(const std::string& device_kind,
                                                                   int count,
                                                                   const std::string& job_id,
                                                                   int stages) {
  absl::MutexLock lock(&mu_);
  std::vector<WorkerRecord*> idle;
  std::vector<std::string> nodes;
  for (auto& [n, w] : workers_) {
    if (w.state == v1::IDLE && DeviceKind(w.device) == device_kind) {
      idle.push_back(&w);
      nodes.push_back(w.node);
    }
  }
  if (count <= 0 || static_cast<int>(idle.size()) < count) {
    return absl::UnavailableError("not enough idle workers");
  }
  const bool grid = stages > 0 && count % stages == 0;
  const std::vector<int> order = PlaceGang(nodes, grid ? stages : count, grid ? count / stages : 1);
  std::vector<WorkerRecord*> picked;
  for (int i : order) picked.push_back(idle[static_cast<size_t>(i)]);
  std::vector<WorkerRecord> out;
  for (int s = 0; s < count; ++s) {
    picked[s]->state = v1::BUSY;
    picked[s]->job_id = job_id;
    picked[s]->stage = s;
    out.push_back(*picked[s]);
  }
  return out;
}

void WorkerRegistry::Release(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  for (auto& [n, w] : workers_) {
    if (w.job_id != job_id) continue;
    w.job_id.clear();
    w.stage = -1;
    if (w.state == v1::BUSY) w.state = v1::IDLE;
  }
}

std::string WorkerRegistry::AvailabilityText(const std::string& device_kind, int count,
                                             const std::string& gang) const {
  int registered = 0;
  int idle = 0;
  absl::MutexLock lock(&mu_);
  for (const auto& [n, w] : workers_) {
    if (DeviceKind(w.device) != device_kind || w.state == v1::LOST) continue;
    ++registered;
    if (w.state == v1::IDLE) ++idle;
  }
  std::string text =
      absl::StrCat("waiting for ", count, " idle ", device_kind, " worker", count == 1 ? "" : "s",
                   gang.empty() ? "" : " (", gang, gang.empty() ? "" : ")", ": ", registered,
                   " registered and alive, ", idle, " idle");
  if (registered < count) {
    absl::StrAppend(&text, "; ", count - registered, " more must register");
  }
  return text;
}

int WorkerRegistry::IdleCount(const std::string& device_kind) const {
  int idle = 0;
  absl::MutexLock lock(&mu_);
  for (const auto& [n, w] : workers_) {
    if (DeviceKind(w.device) == device_kind && w.state == v1::IDLE) ++idle;
  }
  return idle;
}

std::vector<WorkerRecord> WorkerRegistry::List() const {
  absl::MutexLock lock(&mu_);
  std::vector<WorkerRecord> out;
  for (const auto& [n, w] : workers_) out.push_back(w);
  return out;
}

absl::StatusOr<WorkerRecord> WorkerRegistry::Get(const std::string& worker_id) const {
  int64_t n = 0;
  absl::MutexLock lock(&mu_);
  auto it = ParseWorkerId(worker_id, &n) ? workers_.find(n) : workers_.end();
  if (it == workers_.end()) return absl::NotFoundError(absl::StrCat("no worker ", worker_id));
  return it->second;
}

}  // namespace tandem::coordinator
