// The clock-offset estimate from heartbeat round trips, with synthetic timestamps.
#include "coordinator/clock_offset.h"

#include <chrono>

#include "coordinator/worker_registry.h"
#include "gtest/gtest.h"

namespace tandem::coordinator {
namespace {

using namespace std::chrono_literals;

// A heartbeat sent at `send_us` on a worker clock that reads `offset_us` less than the
// coordinator's: `out_us` on the way there, `handle_us` in the handler, `back_us` back.
ClockRoundTrip Trip(int64_t send_us, int64_t offset_us, int64_t out_us, int64_t back_us,
                    int64_t handle_us = 50) {
  ClockRoundTrip t;
  t.worker_send_us = send_us;
  t.coordinator_receive_us = send_us + out_us + offset_us;
  t.coordinator_send_us = t.coordinator_receive_us + handle_us;
  t.worker_receive_us = t.coordinator_send_us - offset_us + back_us;
  return t;
}

constexpr int64_t kT0 = 1'700'000'000'000'000;  // 2023, in microseconds since the epoch

TEST(ClockOffsetTest, SymmetricTripGivesTheExactOffset) {
  const ClockRoundTrip t = Trip(kT0, 5000, 300, 300);
  EXPECT_EQ(OffsetOf(t), 5000);
  EXPECT_EQ(RoundTripOf(t), 600);  // the handler's 50 us are not network time
  // A worker ahead of the coordinator.
  EXPECT_EQ(OffsetOf(Trip(kT0, -123456, 80, 80)), -123456);
}

TEST(ClockOffsetTest, AsymmetryErrsByAtMostHalfTheRoundTrip) {
  const ClockRoundTrip t = Trip(kT0, 5000, 100, 900);
  EXPECT_EQ(OffsetOf(t), 5000 - 400);  // ((100 - 900) / 2)
  EXPECT_LE(std::abs(OffsetOf(t) - 5000), RoundTripOf(t) / 2);
}

TEST(ClockOffsetTest, TheShortestRoundTripOfTheWindowWins) {
  ClockOffsetEstimator e;
  EXPECT_FALSE(e.has_estimate());
  EXPECT_EQ(e.offset_us(), 0);
  EXPECT_EQ(e.uncertainty_us(), -1);
  ASSERT_TRUE(e.Add(Trip(kT0, 5000, 2000, 200)).ok());  // congested on the way out
  EXPECT_EQ(e.offset_us(), 5000 + 900);
  ASSERT_TRUE(e.Add(Trip(kT0 + 1'000'000, 5000, 150, 150)).ok());  // the best
  ASSERT_TRUE(e.Add(Trip(kT0 + 2'000'000, 5000, 100, 3000)).ok());
  EXPECT_EQ(e.offset_us(), 5000);
  EXPECT_EQ(e.uncertainty_us(), 150);
  EXPECT_EQ(e.round_trips(), 3u);

  // Once kWindow newer trips arrive, the best one is forgotten: the estimate follows a clock
  // that was stepped (here by +1 s) within a window.
  for (size_t i = 0; i < ClockOffsetEstimator::kWindow; ++i) {
    ASSERT_TRUE(e.Add(Trip(kT0 + 10'000'000 + i * 1'000'000, 1'005'000, 250 + i, 250 + i)).ok());
  }
  EXPECT_EQ(e.round_trips(), ClockOffsetEstimator::kWindow);
  EXPECT_EQ(e.offset_us(), 1'005'000);
  EXPECT_EQ(e.uncertainty_us(), 250);
}

TEST(ClockOffsetTest, ImpossibleTripsAreRefusedAndChangeNothing) {
  ClockOffsetEstimator e;
  ASSERT_TRUE(e.Add(Trip(kT0, 700, 100, 100)).ok());
  ClockRoundTrip back_in_time = Trip(kT0, 700, 100, 100);
  back_in_time.worker_receive_us = back_in_time.worker_send_us - 1;
  EXPECT_EQ(e.Add(back_in_time).code(), absl::StatusCode::kInvalidArgument);
  ClockRoundTrip answered_early = Trip(kT0, 700, 100, 100);
  answered_early.coordinator_send_us = answered_early.coordinator_receive_us - 1;
  EXPECT_EQ(e.Add(answered_early).code(), absl::StatusCode::kInvalidArgument);
  // A slow handler is not network time...
  EXPECT_EQ(e.Add(Trip(kT0, 700, 100, 100, /*handle_us=*/1000)).code(), absl::StatusCode::kOk);
  // ... but it cannot take longer than the whole trip.
  ClockRoundTrip slow_handler = Trip(kT0, 700, 100, 100, 1000);
  slow_handler.worker_receive_us -= 500;
  EXPECT_EQ(e.Add(slow_handler).code(), absl::StatusCode::kInvalidArgument);
  ClockRoundTrip missing = Trip(kT0, 700, 100, 100);
  missing.coordinator_receive_us = 0;
  EXPECT_EQ(e.Add(missing).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(e.round_trips(), 2u);
  EXPECT_EQ(e.offset_us(), 700);
}

TEST(ClockOffsetTest, OneWayEstimateOnlyUntilTheFirstRoundTrip) {
  ClockOffsetEstimator e;
  e.AddOneWay(kT0, kT0 + 5000 + 300);  // includes the 300 us one-way delay
  EXPECT_TRUE(e.has_estimate());
  EXPECT_EQ(e.offset_us(), 5300);
  EXPECT_EQ(e.uncertainty_us(), -1);
  ASSERT_TRUE(e.Add(Trip(kT0, 5000, 300, 300)).ok());
  e.AddOneWay(kT0 + 1'000'000, kT0 + 1'000'000 + 5000 + 9000);
  EXPECT_EQ(e.offset_us(), 5000);
  EXPECT_EQ(e.uncertainty_us(), 300);
}

TEST(ClockOffsetTest, TheRegistryKeepsEachWorkersOffsetFromItsHeartbeats) {
  WorkerRegistry registry(1000ms);
  v1::RegisterRequest req;
  req.set_address("a:1");
  req.set_device("cpu");
  const std::string a = *registry.Register(req);
  req.set_address("b:1");
  const std::string b = *registry.Register(req);

  // First heartbeat: one way only. Then each heartbeat carries the previous round trip.
  HeartbeatClock first;
  first.worker_send_us = kT0;
  first.coordinator_receive_us = kT0 - 2000 + 400;  // worker a is 2 ms ahead
  ASSERT_TRUE(registry.Heartbeat(a, first).ok());
  EXPECT_EQ(registry.Get(a)->clock_offset_us, -1600);
  EXPECT_EQ(registry.Get(a)->clock_uncertainty_us, -1);
  HeartbeatClock next;
  next.previous_round = Trip(kT0, -2000, 400, 400);
  ASSERT_TRUE(registry.Heartbeat(a, next).ok());
  EXPECT_EQ(registry.Get(a)->clock_offset_us, -2000);
  EXPECT_EQ(registry.Get(a)->clock_uncertainty_us, 400);

  // A garbled round trip is ignored; the heartbeat still counts.
  HeartbeatClock garbled;
  garbled.previous_round = Trip(kT0, 0, 100, 100);
  garbled.previous_round->worker_receive_us = 1;
  EXPECT_TRUE(registry.Heartbeat(a, garbled).ok());
  EXPECT_EQ(registry.Get(a)->clock_offset_us, -2000);

  HeartbeatClock for_b;
  for_b.previous_round = Trip(kT0, 31337, 90, 110);
  ASSERT_TRUE(registry.Heartbeat(b, for_b).ok());
  EXPECT_EQ(registry.ClockOffsets({b, a, "w-99"}), (std::vector<int64_t>{31337 - 10, -2000, 0}));
  EXPECT_EQ(registry.Heartbeat("w-99").code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace tandem::coordinator
