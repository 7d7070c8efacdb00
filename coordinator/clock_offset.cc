#include "coordinator/clock_offset.h"

#include "absl/strings/str_cat.h"

namespace tandem::coordinator {

int64_t OffsetOf(const ClockRoundTrip& t) {
  // Halve the sum, not each term: one rounding, to within half a microsecond.
  return ((t.coordinator_receive_us - t.worker_send_us) +
          (t.coordinator_send_us - t.worker_receive_us)) /
         2;
}

int64_t RoundTripOf(const ClockRoundTrip& t) {
  return (t.worker_receive_us - t.worker_send_us) -
         (t.coordinator_send_us - t.coordinator_receive_us);
}

absl::Status ClockOffsetEstimator::Add(const ClockRoundTrip& t) {
  if (t.worker_send_us <= 0 || t.coordinator_receive_us <= 0 || t.coordinator_send_us <= 0 ||
      t.worker_receive_us <= 0) {
    return absl::InvalidArgumentError("clock sample: a timestamp is missing");
  }
  if (t.worker_receive_us < t.worker_send_us || t.coordinator_send_us < t.coordinator_receive_us ||
      RoundTripOf(t) < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("clock sample: not one round trip: worker sent ", t.worker_send_us,
                     " and received ", t.worker_receive_us, ", coordinator received ",
                     t.coordinator_receive_us, " and sent ", t.coordinator_send_us));
  }
  window_.push_back(t);
  while (window_.size() > kWindow) window_.pop_front();
  return absl::OkStatus();
}

void ClockOffsetEstimator::AddOneWay(int64_t worker_send_us, int64_t coordinator_receive_us) {
  if (worker_send_us <= 0 || coordinator_receive_us <= 0) return;
  has_one_way_ = true;
  one_way_offset_us_ = coordinator_receive_us - worker_send_us;
}

const ClockRoundTrip* ClockOffsetEstimator::Best() const {
  const ClockRoundTrip* best = nullptr;
  for (const ClockRoundTrip& t : window_) {
    if (best == nullptr || RoundTripOf(t) <= RoundTripOf(*best)) best = &t;
  }
  return best;
}

int64_t ClockOffsetEstimator::offset_us() const {
  if (const ClockRoundTrip* best = Best(); best != nullptr) return OffsetOf(*best);
  return has_one_way_ ? one_way_offset_us_ : 0;
}

int64_t ClockOffsetEstimator::uncertainty_us() const {
  if (const ClockRoundTrip* best = Best(); best != nullptr) return (RoundTripOf(*best) + 1) / 2;
  return -1;
}

}  // namespace tandem::coordinator
