// The coordinator's registry of stage workers: who is registered, alive, idle or allocated.
//
// Owns every worker record. Thread-safe: all methods may be called concurrently (gRPC
// handlers register and heartbeat, the scheduler sweeps and allocates, job runners release).
#ifndef TANDEM_COORDINATOR_WORKER_REGISTRY_H_
#define TANDEM_COORDINATOR_WORKER_REGISTRY_H_

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/clock_offset.h"
#include "tandem/v1/coordinator.pb.h"

namespace tandem::coordinator {

using Clock = std::chrono::steady_clock;

struct WorkerRecord {
  std::string id;
  std::string address;
  std::string device;  // "cpu" or "cuda:N"
  int threads = 1;
  std::string hostname;
  std::string node;  // RegisterRequest.node, or the hostname: what placement groups by
  std::string version;
  double peak_flops = 0.0;  // measured SGEMM FLOP/s (RegisterRequest.peak_flops); 0 = unknown
  std::string peak_method;  // how (RegisterRequest.peak_method)
  int64_t peak_measured_unix_ms = 0;  // when, worker clock (0 = unknown)
  std::string device_uuid;  // a cuda worker's GPU, "GPU-..." (RegisterRequest.device_uuid)
  // The GPU's or the processor's name (RegisterRequest.device_name): part of a layer
  // profile's key (ProfileKeyFor).
  std::string device_name;
  v1::WorkerState state = v1::IDLE;
  std::string job_id;  // set while allocated
  int stage = -1;
  Clock::time_point last_heartbeat;
  // Coordinator clock minus worker clock (add it to the worker's times), estimated from the
  // heartbeats' round trips (ClockOffsetEstimator), and its error bound (-1: one-way only).
  int64_t clock_offset_us = 0;
  int64_t clock_uncertainty_us = -1;
};

// What a heartbeat tells about the worker's clock.
struct HeartbeatClock {
  int64_t worker_send_us = 0;          // this heartbeat's send time, worker clock (0: unknown)
  int64_t coordinator_receive_us = 0;  // its arrival, coordinator clock
  // The previous heartbeat's four timestamps, when the worker reported them.
  std::optional<ClockRoundTrip> previous_round;
};

// The first worker id number of a coordinator's `incarnation`-th start on its data root
// (JobStore::incarnation(); 0 or 1: 1). Each start issues ids from its own range of 10^6
// (w-1, ...; then w-1000001, ...), so that a worker still heartbeating with an id the previous
// coordinator gave it is refused (NOT_FOUND) and registers again, rather than being taken for
// the worker the new coordinator gave the same id.
int64_t FirstWorkerId(int64_t incarnation);

class WorkerRegistry {
 public:
  // Ids are issued from "w-<first_id>" on; see FirstWorkerId.
  explicit WorkerRegistry(std::chrono::milliseconds heartbeat_timeout, int64_t first_id = 1);

  // Adds a worker and returns its new id ("w-1", "w-2", ...). A worker that registers again
  // (after a restart) gets a new id; its old record, if still present, is marked LOST.
  absl::StatusOr<std::string> Register(const v1::RegisterRequest& request);

  // Records a heartbeat and updates the worker's clock offset from it. NOT_FOUND for an
  // unknown id (the worker re-registers). A LOST worker that heartbeats again and holds no
  // job becomes IDLE. A round trip whose timestamps are inconsistent is ignored.
  absl::Status Heartbeat(const std::string& worker_id, const HeartbeatClock& clock = {});

  // The clock offsets (WorkerRecord::clock_offset_us) of `worker_ids`, in their order; 0 for
  // an unknown id.
  std::vector<int64_t> ClockOffsets(const std::vector<std::string>& worker_ids) const;

  // Marks workers whose last heartbeat is older than the timeout as LOST and returns the
  // records of those that were allocated to a job at that moment.
  std::vector<WorkerRecord> SweepLost();
  // A job found the worker unreachable: LOST now, so that the job's restart does not pick it
  // (a heartbeat brings it back, IDLE, once it no longer serves a job).
  void MarkLost(const std::string& worker_id);

  // Gang allocation: atomically takes `count` IDLE workers of `device_kind` for `job_id` and
  // marks them BUSY with stages (gang ranks) 0..count-1. With `stages` dividing `count` the
  // gang is stages x count/stages replicas, chosen and ordered by their nodes
  // (coordinator/placement.h); otherwise (0) in registration order. UNAVAILABLE if not enough
  // are idle; nothing is taken then.
  absl::StatusOr<std::vector<WorkerRecord>> Allocate(const std::string& device_kind, int count,
                                                     const std::string& job_id, int stages = 0);

  // Returns the job's workers to IDLE (LOST ones stay LOST).
  void Release(const std::string& job_id);

  // "waiting for 3 idle cpu workers: 2 registered and alive, 2 idle; 1 more must register":
  // why a job that needs `count` must wait. `gang` (optional) says what the count is made of,
  // e.g. "2 stages x 2 replicas", in parentheses after it.
  std::string AvailabilityText(const std::string& device_kind, int count,
                               const std::string& gang = "") const;

  // IDLE workers of `device_kind` (alive, no job): what an elastic job may take.
  int IdleCount(const std::string& device_kind) const;

  std::vector<WorkerRecord> List() const;
  absl::StatusOr<WorkerRecord> Get(const std::string& worker_id) const;
  // Heartbeats at scale. Every heartbeat costs the coordinator an RPC (a few hundred
  // microseconds of its CPU), so the interval the workers are told (RegisterResponse,
  // HeartbeatResponse) is `base` until alive workers x `per_worker` exceeds it, then grows with
  // them: the coordinator answers about one heartbeat per `per_worker` whatever the count (100 a
  // second at 10 ms). The loss timeout grows in the same proportion, so a worker is still
  // declared lost after the same number of missed heartbeats. per_worker 0: a fixed `base`.
  // Until called: a fixed 1 s.
  void SetHeartbeatInterval(std::chrono::milliseconds base, std::chrono::microseconds per_worker);
  std::chrono::milliseconds heartbeat_interval() const;
  // The loss timeout now: the constructor's, scaled as heartbeat_interval() is.
  std::chrono::milliseconds heartbeat_timeout() const;

 private:
  std::chrono::milliseconds TimeoutLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::chrono::milliseconds IntervalLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CountAliveLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::chrono::milliseconds heartbeat_timeout_;
  mutable absl::Mutex mu_;
  std::chrono::milliseconds base_interval_ ABSL_GUARDED_BY(mu_){1000};
  std::chrono::microseconds per_worker_ ABSL_GUARDED_BY(mu_){0};
  int64_t alive_ ABSL_GUARDED_BY(mu_) = 0;  // workers not LOST, as of the last count
  int64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  // Keyed by numeric id so iteration is registration order.
  std::map<int64_t, WorkerRecord> workers_ ABSL_GUARDED_BY(mu_);
  std::map<int64_t, ClockOffsetEstimator> clocks_ ABSL_GUARDED_BY(mu_);  // by worker
};

}  // namespace tandem::coordinator

#endif  // TANDEM_COORDINATOR_WORKER_REGISTRY_H_
