#include "common/message_flight.h"

#include <algorithm>
#include <cmath>

#include "common/median.h"

namespace tandem {
namespace {

struct Message {
  size_t cut = 0;        // between stages cut and cut + 1
  bool forward = false;  // an activation (from stage cut), else a gradient (from cut + 1)
  size_t sender = 0;
  int64_t send_us = 0;  // the SEND's start
  int64_t recv_start_us = 0;
  int64_t recv_end_us = 0;
};

// Passes of choosing the waited-for messages and estimating the offsets' errors from them (an
// error of a few actions' length settles in three or four).
constexpr int kPasses = 8;

}  // namespace

MessageFlights MeasureMessageFlights(const StepTimeline& timeline, int num_stages) {
  MessageFlights out;
  const size_t stages = static_cast<size_t>(std::max(0, num_stages));
  std::vector<Message> messages;
  for (const TransferLink& link : timeline.transfers) {
    if (link.send >= timeline.slices.size() || link.recv >= timeline.slices.size()) continue;
    const TimelineSlice& send = timeline.slices[link.send];
    const TimelineSlice& recv = timeline.slices[link.recv];
    ++out.messages;
    if (send.stage < 0 || recv.stage < 0 || static_cast<size_t>(send.stage) >= stages ||
        static_cast<size_t>(recv.stage) >= stages) {
      continue;
    }
    messages.push_back({.cut = static_cast<size_t>(std::min(send.stage, recv.stage)),
                        .forward = send.stage < recv.stage,
                        .sender = static_cast<size_t>(send.stage),
                        .send_us = send.start_us,
                        .recv_start_us = recv.start_us,
                        .recv_end_us = recv.end_us});
  }
  // The two directions of a cut carry the same bytes (an activation forward, its gradient
  // back) between the same two ranks, so they fly alike, while an error e in the two ranks'
  // clock offset (heartbeats give it to within half a round trip, but before the first round
  // trip only a one-way estimate, off by the whole delay) lengthens the forward flights by e
  // and shortens the backward ones by as much. So, per cut: take e as half the difference of
  // the two directions' medians, move the receiver's times by it, and choose the waited-for
  // messages again on the corrected clock, until the errors hold (to 1 us; at most kPasses).
  std::vector<double> error_us(stages, 0.0);
  std::vector<std::vector<double>> sent(stages);
  for (int pass = 0; pass < kPasses; ++pass) {
    std::vector<std::vector<double>> way(2 * stages);
    for (std::vector<double>& v : sent) v.clear();
    for (const Message& m : messages) {
      const double shift = m.forward ? -error_us[m.cut] : error_us[m.cut];
      // A receiver that came after the send was posted may have found the data there
      // already: its RECV's end says when it arrived, not when the data did.
      if (static_cast<double>(m.recv_start_us) + shift > static_cast<double>(m.send_us)) continue;
      const double flight_us = static_cast<double>(m.recv_end_us - m.send_us) + shift;
      way[2 * m.cut + (m.forward ? 0 : 1)].push_back(flight_us);
      sent[m.sender].push_back(flight_us * 1e-6);
    }
    bool moved = false;
    for (size_t k = 0; k < stages; ++k) {
      if (way[2 * k].empty() || way[2 * k + 1].empty()) continue;
      const double more = 0.5 * (Median(way[2 * k]) - Median(way[2 * k + 1]));
      error_us[k] += more;
      moved = moved || std::abs(more) >= 1.0;
    }
    if (!moved) break;
  }
  out.stage_seconds.assign(stages, 0.0);
  out.stage_counted.assign(stages, 0);
  for (size_t s = 0; s < stages; ++s) {
    const double median = Median(sent[s]);
    // Below zero a flight timed one way only is nothing but its offset's error.
    if (sent[s].empty() || median < 0) continue;
    out.stage_seconds[s] = median;
    out.stage_counted[s] = static_cast<int>(sent[s].size());
  }
  return out;
}

}  // namespace tandem
