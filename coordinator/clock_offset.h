// How far a worker's clock is from the coordinator's, estimated from heartbeat round trips.
//
// Each heartbeat gives NTP's four timestamps: t0 the worker sent it (worker clock), t1 the
// coordinator received it and t2 answered (coordinator clock), t3 the worker received the
// answer (worker clock). The worker reports them with its next heartbeat. If both legs of the
// trip take equally long, the coordinator's clock minus the worker's is the round-trip midpoint
// ((t1 - t0) + (t2 - t3)) / 2; whatever the asymmetry, the error is at most half the network
// round trip (t3 - t0) - (t2 - t1). So the estimate is the offset of the sample with the
// shortest round trip among the last few (a delayed packet only lengthens the trip).
//
// Pure, thread-compatible; the WorkerRegistry keeps one per worker under its lock.
#ifndef TANDEM_COORDINATOR_CLOCK_OFFSET_H_
#define TANDEM_COORDINATOR_CLOCK_OFFSET_H_

#include <cstddef>
#include <cstdint>
#include <deque>

#include "absl/status/status.h"

namespace tandem::coordinator {

struct ClockRoundTrip {
  int64_t worker_send_us = 0;          // t0, worker clock
  int64_t coordinator_receive_us = 0;  // t1, coordinator clock
  int64_t coordinator_send_us = 0;     // t2, coordinator clock
  int64_t worker_receive_us = 0;       // t3, worker clock
};

// Coordinator clock minus worker clock: ((t1 - t0) + (t2 - t3)) / 2.
int64_t OffsetOf(const ClockRoundTrip& trip);
// Time on the network: (t3 - t0) - (t2 - t1).
int64_t RoundTripOf(const ClockRoundTrip& trip);

class ClockOffsetEstimator {
 public:
  // Round trips the estimate chooses from (heartbeats come about once a second).
  static constexpr size_t kWindow = 8;

  // Adds a round trip (the oldest beyond kWindow is forgotten). INVALID_ARGUMENT, and nothing
  // changes, if its timestamps cannot come from one round trip: a missing (zero) one, the
  // answer received before the request was sent (t3 < t0), answered before it arrived
  // (t2 < t1), or a negative network time.
  absl::Status Add(const ClockRoundTrip& trip);

  // Before any round trip: the coordinator's receive time minus the worker's send time, which
  // is the offset plus the one-way delay. Ignored once a round trip is known.
  void AddOneWay(int64_t worker_send_us, int64_t coordinator_receive_us);

  bool has_estimate() const { return !window_.empty() || has_one_way_; }
  // What to add to the worker's times to put them on the coordinator's clock (0 without any
  // estimate).
  int64_t offset_us() const;
  // The estimate's error bound: half the chosen round trip; -1 for a one-way estimate or none.
  int64_t uncertainty_us() const;
  size_t round_trips() const { return window_.size(); }

 private:
  // The round trip the estimate uses: the shortest in the window, the latest of equals.
  const ClockRoundTrip* Best() const;

  std::deque<ClockRoundTrip> window_;  // oldest first
  bool has_one_way_ = false;
  int64_t one_way_offset_us_ = 0;
};

}  // namespace tandem::coordinator

#endif  // TANDEM_COORDINATOR_CLOCK_OFFSET_H_
