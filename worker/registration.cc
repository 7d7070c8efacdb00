#include "worker/registration.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <optional>
#include <utility>

#include "common/rpc.h"
#include "common/version.h"

namespace tandem::worker {

RegistrationClient::RegistrationClient(std::shared_ptr<grpc::Channel> coordinator,
                                       RegistrationOptions options, StageManager* manager)
    : stub_(v1::WorkerRegistry::NewStub(coordinator)),
      options_(std::move(options)),
      manager_(manager),
      interval_(options_.heartbeat_interval) {}

RegistrationClient::~RegistrationClient() { Stop(); }

void RegistrationClient::Start() {
  thread_ = std::thread([this] { Run(); });
}

void RegistrationClient::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

std::string RegistrationClient::worker_id() const {
  absl::MutexLock lock(&mu_);
  return worker_id_;
}

bool RegistrationClient::SleepFor(std::chrono::milliseconds d) {
  absl::MutexLock lock(&mu_);
  mu_.AwaitWithTimeout(absl::Condition(&stop_), absl::FromChrono(d));
  return !stop_;
}

void RegistrationClient::SetConnected(bool connected) {
  if (connected == connected_) return;
  connected_ = connected;
  if (options_.on_connected) options_.on_connected(connected);
}

grpc::Status RegistrationClient::Register() {
  v1::RegisterRequest req;
  req.set_protocol_version(kProtocolVersion);
  req.set_address(options_.address);
  req.set_device(options_.device);
  req.set_threads(options_.threads);
  req.set_hostname(options_.hostname);
  req.set_node(options_.node);
  req.set_version(kVersion);
  req.set_peak_flops(options_.peak.flops);
  req.set_peak_method(options_.peak.method);
  if (options_.peak.flops > 0) {
    req.set_peak_measured_unix_ms(absl::ToUnixMillis(options_.peak.measured_at));
  }
  req.set_device_uuid(options_.device_uuid);
  req.set_device_name(options_.device_name);
  grpc::ClientContext ctx;
  SetDeadline(ctx, options_.rpc_timeout);
  v1::RegisterResponse resp;
  const grpc::Status s = stub_->Register(&ctx, req, &resp);
  if (!s.ok()) return s;
  {
    absl::MutexLock lock(&mu_);
    worker_id_ = resp.worker_id();
    if (resp.heartbeat_interval_ms() > 0) {
      interval_ = std::chrono::milliseconds(resp.heartbeat_interval_ms());
    }
  }
  manager_->set_worker_id(resp.worker_id());
  spdlog::info("registered with the coordinator as {} ({}, heartbeat every {} ms)",
               resp.worker_id(), options_.address,
               resp.heartbeat_interval_ms() > 0 ? resp.heartbeat_interval_ms()
                                                : options_.heartbeat_interval.count());
  return grpc::Status::OK;
}

void RegistrationClient::Run() {
  std::chrono::milliseconds backoff = options_.initial_backoff;
  bool warned = false;
  std::optional<v1::ClockSample> previous_round;
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (stop_) return;
    }
    if (worker_id().empty()) {
      const grpc::Status s = Register();
      SetConnected(s.ok());
      if (s.ok()) {
        backoff = options_.initial_backoff;
        warned = false;
        continue;
      }
      if (!warned) {
        spdlog::warn("registration with the coordinator failed ({}){}; retrying with backoff",
                     FromGrpcStatus(s).ToString(),
                     s.error_code() == grpc::StatusCode::UNAVAILABLE ? options_.unavailable_hint
                                                                     : std::string());
        warned = true;
      }
      if (!SleepFor(backoff)) return;
      backoff = std::min(backoff * 2, options_.max_backoff);
      continue;
    }
    const StageManager::Snapshot snap = manager_->GetSnapshot();
    v1::HeartbeatRequest req;
    req.set_protocol_version(kProtocolVersion);
    req.set_worker_id(worker_id());
    req.set_state(snap.state);
    req.set_job_id(snap.job_id);
    if (previous_round.has_value()) *req.mutable_previous_round() = *previous_round;
    grpc::ClientContext ctx;
    SetDeadline(ctx, options_.rpc_timeout);
    v1::HeartbeatResponse resp;
    const int64_t sent_us = UnixMicros();
    req.set_worker_unix_us(sent_us);
    const grpc::Status s = stub_->Heartbeat(&ctx, req, &resp);
    const int64_t received_us = UnixMicros();
    // This round trip's four timestamps go with the next heartbeat, for the coordinator's
    // clock-offset estimate (an older coordinator answers only when it sent the response).
    previous_round.reset();
    if (s.ok() && resp.coordinator_unix_us() > 0) {
      previous_round.emplace();
      previous_round->set_worker_send_unix_us(sent_us);
      previous_round->set_coordinator_receive_unix_us(resp.coordinator_receive_unix_us() > 0
                                                          ? resp.coordinator_receive_unix_us()
                                                          : resp.coordinator_unix_us());
      previous_round->set_coordinator_send_unix_us(resp.coordinator_unix_us());
      previous_round->set_worker_receive_unix_us(received_us);
    }
    SetConnected(s.ok());
    if (s.ok() && resp.heartbeat_interval_ms() > 0) {
      // The coordinator stretches the interval as workers join (bounded heartbeat load).
      absl::MutexLock lock(&mu_);
      interval_ = std::chrono::milliseconds(resp.heartbeat_interval_ms());
    }
    if (s.error_code() == grpc::StatusCode::NOT_FOUND) {
      spdlog::warn("coordinator does not know worker {}; registering again", req.worker_id());
      absl::MutexLock lock(&mu_);
      worker_id_.clear();
      continue;
    }
    if (!s.ok() && !warned) {
      spdlog::warn("heartbeat failed: {}", FromGrpcStatus(s).ToString());
      warned = true;
    } else if (s.ok()) {
      warned = false;
    }
    std::chrono::milliseconds interval;
    {
      absl::MutexLock lock(&mu_);
      interval = interval_;
    }
    if (!SleepFor(interval)) return;
  }
}

}  // namespace tandem::worker
