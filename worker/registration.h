// Registration and heartbeats with the coordinator's WorkerRegistry.
//
// A background thread registers this worker (retrying with exponential backoff until the
// coordinator answers), stores the worker id in the StageManager, then heartbeats at the
// interval the coordinator asked for with the manager's state (IDLE / BUSY + job id). A
// NOT_FOUND heartbeat (the coordinator forgot the worker, e.g. after a restart) triggers a
// fresh registration. Every RPC carries a deadline. `on_connected` (optional) hears, from the
// client's thread, each change between connected (the last Register or Heartbeat succeeded)
// and not (it failed, or the coordinator forgot this worker); it starts out not connected.
// Thread-safety: Start/Stop from one owner thread; worker_id() from any thread.
#ifndef TANDEM_WORKER_REGISTRATION_H_
#define TANDEM_WORKER_REGISTRATION_H_

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "tandem/v1/coordinator.grpc.pb.h"
#include "worker/peak_flops.h"
#include "worker/stage_manager.h"

namespace tandem::worker {

struct RegistrationOptions {
  std::string address;  // where this worker serves StageWorker (HOST:PORT)
  std::string device;   // "cpu"
  int threads = 1;
  std::string hostname;
  std::string node;         // for placement (--node); empty: the hostname
  PeakFlops peak;           // measured at start (worker/peak_flops.h); flops 0 = unknown
  std::string device_uuid;  // cuda: the GPU's uuid, "GPU-..." (cuda::DeviceUuid); cpu: empty
  std::string device_name;  // the GPU's or the processor's name (worker/device_name.h)
  // Used until the coordinator's RegisterResponse names its own interval.
  std::chrono::milliseconds heartbeat_interval{1000};
  std::chrono::milliseconds rpc_timeout{5000};
  std::chrono::milliseconds initial_backoff{100};
  std::chrono::milliseconds max_backoff{5000};
  std::function<void(bool connected)> on_connected;
  // Appended to the warning of a registration that fails UNAVAILABLE (e.g. what to check when
  // a TLS handshake may be the cause).
  std::string unavailable_hint;
};

class RegistrationClient {
 public:
  // `manager` must outlive this client.
  RegistrationClient(std::shared_ptr<grpc::Channel> coordinator, RegistrationOptions options,
                     StageManager* manager);
  ~RegistrationClient();  // Stop()

  void Start();
  // Wakes the thread and joins it; idempotent.
  void Stop();

  // Empty until registered.
  std::string worker_id() const;

 private:
  void Run();
  grpc::Status Register();
  // Sleeps up to `d`; false when stopping.
  bool SleepFor(std::chrono::milliseconds d);
  // Calls options_.on_connected when `connected` differs from the last state told.
  void SetConnected(bool connected);

  std::unique_ptr<v1::WorkerRegistry::Stub> stub_;
  const RegistrationOptions options_;
  StageManager* const manager_;
  std::thread thread_;
  bool connected_ = false;  // only the client's thread touches it

  mutable absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::string worker_id_ ABSL_GUARDED_BY(mu_);
  std::chrono::milliseconds interval_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tandem::worker

#endif  // TANDEM_WORKER_REGISTRATION_H_
