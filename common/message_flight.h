// How long a step's messages took from sender to receiver, as the workers' timings show it,
// to set against what the plan priced them at (ActionCosts.transfer, from the profile's idle
// link probe). In a running pipeline a message may take longer than the probe measured: its
// copies share the cores with the compute, and the thread that moves it waits to be scheduled.
//
// A message's flight is from its send being posted (its SEND's start) to its data being in the
// receiver's hands (its RECV's end), on the step's common clock. Only a message whose receiver
// was already waiting when the send was posted (its RECV started no later than its SEND) is
// counted: its RECV's end is then the arrival, where a receiver that came later ends its RECV
// whenever it gets there. The two ranks' clocks are aligned by the heartbeats' offsets, which
// may be off (before the first heartbeat round trip, by a whole one-way delay); since the two
// directions of a cut carry the same bytes, a cut timed both ways has half the difference of
// its two directions' medians taken for that error and taken out. Pure code, no I/O.
#ifndef TANDEM_COMMON_MESSAGE_FLIGHT_H_
#define TANDEM_COMMON_MESSAGE_FLIGHT_H_

#include <vector>

#include "common/trace.h"

namespace tandem {

struct MessageFlights {
  // Per sending stage (the stage whose SEND posted the message: a forward's activation, or a
  // backward's input gradient): the median flight of its counted messages, in seconds, each
  // with its cut's offset error taken out; 0 where none was counted (or where, timed one way
  // only, the median came out below zero: the offset's error alone).
  std::vector<double> stage_seconds;
  std::vector<int> stage_counted;  // messages counted, per sending stage
  int messages = 0;                // messages with both ends in the timeline
};

// The flights of `timeline`'s messages, over stages [0, num_stages) (a message from a stage
// outside it, as a data-parallel replica's timeline numbers them, is not counted).
MessageFlights MeasureMessageFlights(const StepTimeline& timeline, int num_stages);

}  // namespace tandem

#endif  // TANDEM_COMMON_MESSAGE_FLIGHT_H_
