// Link probing: times messages between this worker and one other over the data plane, so that
// the planner knows what moving an activation between two stage workers costs before a job
// runs (StageWorker.ProbeLink; the coordinator fits the samples, common/link_model.h).
//
// Both workers run a probe at the same time, as ranks 0 and 1 of a 2-rank transport that they
// connect as a job's workers do. For each size rank 0 sends a ping and rank 1 answers with a
// pong of the same size: one warm-up exchange, then `repeats` timed ones. Rank 0 times each
// exchange from its send to the pong's arrival; rank 1 times the interval between consecutive
// pings' arrivals (also one round trip), so that both ends report what they saw. Receives are
// posted before the matching send, as the executor does. The transport is torn down at the
// end, whatever the outcome.
//
// No gRPC; the StageWorker service calls it (through StageManager) while the worker is idle.
#ifndef TANDEM_WORKER_LINK_PROBE_H_
#define TANDEM_WORKER_LINK_PROBE_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "tandem/v1/common.pb.h"
#include "tandem/v1/worker.pb.h"
#include "worker/stage_compute.h"
#include "worker/transport/transport.h"

namespace tandem::worker {

inline constexpr int64_t kMaxProbeBytes = int64_t{1} << 30;  // per message
inline constexpr int kMaxProbeSizes = 16;
inline constexpr int kMaxProbeRepeats = 1000;
inline constexpr int kDefaultProbeRepeats = 5;
inline constexpr std::chrono::milliseconds kDefaultProbeTimeout{30000};
inline constexpr std::chrono::milliseconds kMaxProbeTimeout{600000};

// A validated ProbeLinkRequest with its defaults applied.
struct LinkProbeOptions {
  int rank = 0;                // 0 or 1; the peer is the other
  std::vector<int64_t> sizes;  // message bytes, each timed separately
  int repeats = kDefaultProbeRepeats;
  std::chrono::milliseconds timeout = kDefaultProbeTimeout;  // the whole probe
  std::string device = "cpu";  // the data plane: "cpu" (Gloo, host) or "cuda" (NCCL, device)
  // device "cuda" only: "nccl" (the default) or "gloo" (host-staged: device buffers over Gloo,
  // as a job on two workers sharing a GPU moves them).
  std::string transport = "nccl";
  // device "cpu" only: bytes of floats to sum-all-reduce with the data-parallel ring after the
  // messages (a multiple of 4); 0: none.
  int64_t allreduce_bytes = 0;
};

// What a probe measured: one sample per message size, in order, and every timed all-reduce.
struct LinkProbeResult {
  std::vector<v1::LinkSample> samples;
  std::vector<double> allreduce_seconds;
};

// INVALID_ARGUMENT naming the field for an empty rendezvous prefix, a rank other than 0 or 1,
// no sizes or more than kMaxProbeSizes, a size <= 0 or > 1 GiB, repeats outside
// [0, kMaxProbeRepeats], a timeout outside [0, kMaxProbeTimeout] (0 picks the default), a
// device other than "", "cpu" and "cuda" ("" is "cpu"), a transport other than "", "nccl"
// and "gloo" ("" is "nccl"; "gloo" with device "cuda" only), or allreduce_bytes outside
// [0, 1 GiB] or set with device "cuda".
absl::StatusOr<LinkProbeOptions> LinkProbeOptionsFrom(const v1::ProbeLinkRequest& request);

// Connects the probe's 2-rank transport as this rank (in the daemon: Gloo through the
// coordinator's rendezvous under the request's prefix). Must give up promptly, with any
// error, once `cancelled` becomes true.
using LinkConnector =
    std::function<absl::StatusOr<std::unique_ptr<Transport>>(const std::atomic<bool>& cancelled)>;

// A buffer of `bytes` bytes in the memory the transport moves (a device's, for NCCL).
using ProbeBufferAllocator = std::function<absl::StatusOr<StageBufferPtr>(size_t bytes)>;

// One probe. Thread-safety: Run() is called once, from one thread; Cancel() from any thread
// at any time.
class LinkProbe {
 public:
  explicit LinkProbe(LinkProbeOptions options);
  LinkProbe(const LinkProbe&) = delete;
  LinkProbe& operator=(const LinkProbe&) = delete;

  // Connects through `connect`, times every size (and the all-reduce, when asked) and tears the
  // transport down. Returns one sample per size, in order, with one_way_seconds = median round
  // trip / 2, and the all-reduce's timed runs.
  // DEADLINE_EXCEEDED when the timeout passes first (the peer never connected, or stopped
  // answering); ABORTED after Cancel(); RESOURCE_EXHAUSTED when the buffers cannot be
  // allocated; otherwise the transport's error (UNAVAILABLE when the peer fails). The two
  // message buffers come from `allocate` (a device's memory), or from the host when it is
  // null.
  absl::StatusOr<LinkProbeResult> Run(const LinkConnector& connect,
                                      const ProbeBufferAllocator& allocate = nullptr);

  // Makes Run() return ABORTED promptly (at once if it has not started). Idempotent.
  void Cancel();

 private:
  enum class Stop { kNone, kCancelled, kTimedOut };

  // Records why the probe stops (the first reason wins) and unblocks the connect and any
  // transfer.
  void StopLocked(Stop why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<LinkProbeResult> Probe(const LinkConnector& connect,
                                        const ProbeBufferAllocator& allocate);
  absl::StatusOr<std::vector<v1::LinkSample>> PingPong(Transport& transport, char* out, char* in);
  // The all-reduce's warm-up and timed runs over `data` (allreduce_bytes / 4 floats), with the
  // ring's `scratch`; both must outlive the transport, which may still reference them after a
  // failure.
  absl::StatusOr<std::vector<double>> AllReduce(Transport& transport, std::vector<float>& data,
                                                std::vector<float>& scratch);
  // `s` (a failure while doing `what`) as the caller should see it, given why we stopped.
  absl::Status Explain(const absl::Status& s, const char* what);

  const LinkProbeOptions options_;
  std::atomic<bool> cancelled_{false};  // handed to the connector

  absl::Mutex mu_;
  Stop stop_ ABSL_GUARDED_BY(mu_) = Stop::kNone;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  Transport* transport_ ABSL_GUARDED_BY(mu_) = nullptr;  // while connected
};

}  // namespace tandem::worker

#endif  // TANDEM_WORKER_LINK_PROBE_H_
