#include "common/message_flight.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "common/schedule.h"
#include "common/schedule_check.h"
#include "common/trace.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

using ::testing::DoubleNear;
using ::testing::ElementsAre;
using ::testing::Gt;

constexpr int64_t kT0 = 1'700'000'000'000'000;  // a Unix time in microseconds

Schedule Lowered(const char* name, int ranks, int micro_batches) {
  absl::StatusOr<Schedule> s = GenerateSchedule(name, ranks, micro_batches);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? LowerWithTransfers(*s) : Schedule{};
}

// The timeline of a step that ran exactly as the simulator says it would on `costs`: each
// action's timing is the simulator's, rank r's clock `skew_us[r]` ahead of the common one, and
// the offset that puts it back off by `offset_error_us[r]`.
StepTimeline SimulatedTimeline(const Schedule& lowered, const std::vector<ActionCosts>& costs,
                               const std::vector<int64_t>& skew_us,
                               const std::vector<int64_t>& offset_error_us) {
  absl::StatusOr<SimulationResult> sim = SimulateSchedule(lowered, ActionCosts{}, costs);
  EXPECT_TRUE(sim.ok()) << sim.status();
  if (!sim.ok()) return {};
  std::vector<v1::StepReport> reports(lowered.placement.num_ranks);
  std::vector<int64_t> offsets;
  for (int r = 0; r < lowered.placement.num_ranks; ++r) {
    reports[r].set_step(3);
    reports[r].set_rank(r);
    for (size_t i = 0; i < lowered.program[r].size(); ++i) {
      v1::ActionTiming* t = reports[r].add_timings();
      t->set_index(static_cast<int>(i));
      t->set_start_us(kT0 + std::llround(sim->start[r][i] * 1e6) + skew_us[r]);
      t->set_end_us(kT0 + std::llround(sim->end[r][i] * 1e6) + skew_us[r]);
    }
    offsets.push_back(-skew_us[r] + offset_error_us[r]);
  }
  absl::StatusOr<StepTimeline> t = BuildStepTimeline(lowered, reports, offsets);
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? *t : StepTimeline{};
}

// Four stages, the last (the head) the slowest, every message at 150 us (the plan prices a
// cut's two directions alike: the same bytes over the same link).
const std::vector<ActionCosts> kFourStages = {{0.0010, 0.0021, 0, 0, 0.000150},
                                              {0.0012, 0.0024, 0, 0, 0.000150},
                                              {0.0011, 0.0022, 0, 0, 0.000150},
                                              {0.0016, 0.0030, 0, 0, 0.000150}};

TEST(MeasureMessageFlights, AStepThatRanAsSimulatedFliesAtItsPrice) {
  // Rank 2's clock runs 2.5 ms ahead and rank 3's 1 ms behind, which the offsets undo.
  for (const char* name : {"1f1b", "gpipe"}) {
    const StepTimeline t =
        SimulatedTimeline(Lowered(name, 4, 8), kFourStages, {0, 0, 2500, -1000}, {0, 0, 0, 0});
    const MessageFlights f = MeasureMessageFlights(t, 4);
    EXPECT_EQ(f.messages, 2 * 3 * 8) << name;  // 3 cuts, each way, per micro-batch
    for (int s = 0; s < 4; ++s) {
      EXPECT_THAT(f.stage_seconds[s], DoubleNear(150e-6, 1.5e-6)) << name << " " << s;
      EXPECT_THAT(f.stage_counted[s], Gt(0)) << name << " " << s;
    }
  }
}

TEST(MeasureMessageFlights, AnOffsetErrorCancelsOutOverACutsTwoDirections) {
  // The offsets leave rank 1 at 1.6 ms behind rank 0 and rank 2 0.4 ms ahead: raw flights of
  // -1450 us one way and 1750 us the other across the first cut. Each cut timed both ways
  // recovers the 150 us.
  const StepTimeline t =
      SimulatedTimeline(Lowered("1f1b", 4, 8), kFourStages, {0, 0, 0, 0}, {0, -1600, 400, 0});
  const MessageFlights f = MeasureMessageFlights(t, 4);
  for (int s = 0; s < 4; ++s) {
    EXPECT_THAT(f.stage_seconds[s], DoubleNear(150e-6, 1.5e-6)) << s;
  }
}

// 2-stage 1F1B over 2 micro-batches, timed by hand (microseconds after kT0):
//   rank 0: 0F0 0SEND_F0 0F1 0SEND_F1 0RECV_B0 0B0 0RECV_B1 0B1
//   rank 1: 1RECV_F0 1F0 1B0 1SEND_B0 1RECV_F1 1F1 1B1 1SEND_B1
StepTimeline TwoStageTimeline() {
  const Schedule lowered = Lowered("1f1b", 2, 2);
  const int64_t times[2][8][2] = {{{0, 100},
                                   {100, 105},
                                   {105, 205},
                                   {205, 210},
                                   {210, 420},
                                   {420, 620},
                                   {620, 728},
                                   {728, 928}},
                                  {{0, 130},
                                   {130, 230},
                                   {230, 410},
                                   {410, 415},
                                   {415, 416},
                                   {416, 516},
                                   {516, 716},
                                   {716, 720}}};
  std::vector<v1::StepReport> reports(2);
  for (int r = 0; r < 2; ++r) {
    reports[r].set_rank(r);
    for (int i = 0; i < 8; ++i) {
      v1::ActionTiming* t = reports[r].add_timings();
      t->set_index(i);
      t->set_start_us(kT0 + times[r][i][0]);
      t->set_end_us(kT0 + times[r][i][1]);
    }
  }
  absl::StatusOr<StepTimeline> t = BuildStepTimeline(lowered, reports);
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? *t : StepTimeline{};
}

TEST(MeasureMessageFlights, CountsOnlyMessagesTheReceiverWaitedFor) {
  const MessageFlights f = MeasureMessageFlights(TwoStageTimeline(), 2);
  EXPECT_EQ(f.messages, 4);
  // Counted: SEND_F0 posted at 100, its receiver waiting since 0, data in hand at 130 (30 us);
  // SEND_B0 at 410 into a receive waiting since 210, done at 420 (10 us); SEND_B1 at 716 into
  // one waiting since 620, done at 728 (12 us). Rank 1 reached RECV_F1 at 415, after SEND_F1
  // (205): when that data came is not known.
  EXPECT_THAT(f.stage_counted, ElementsAre(1, 2));
  // The cut's two directions, 30 us and 11 us (the median of 10 and 12), differ by twice an
  // offset error of 9.5 us, taken out of both: 20.5 us each way.
  EXPECT_THAT(f.stage_seconds[0], DoubleNear(20.5e-6, 1e-9));
  EXPECT_THAT(f.stage_seconds[1], DoubleNear(20.5e-6, 1e-9));
}

// Rank 1's times in the timeline moved `us` earlier: an error of its clock offset.
StepTimeline WithRank1Earlier(StepTimeline t, int64_t us) {
  for (TimelineSlice& s : t.slices) {
    if (s.rank == 1) {
      s.start_us -= us;
      s.end_us -= us;
    }
  }
  return t;
}

TEST(MeasureMessageFlights, AnOffsetErrorDoesNotMoveACutTimedBothWays) {
  // 50 us off: the activation reads -20 us, the gradients 60 and 62; the same 20.5 us result.
  const MessageFlights f = MeasureMessageFlights(WithRank1Earlier(TwoStageTimeline(), 50), 2);
  EXPECT_THAT(f.stage_counted, ElementsAre(1, 2));
  EXPECT_THAT(f.stage_seconds[0], DoubleNear(20.5e-6, 1e-9));
  EXPECT_THAT(f.stage_seconds[1], DoubleNear(20.5e-6, 1e-9));
}

TEST(MeasureMessageFlights, AOneWayFlightBelowZeroIsTheOffsetsAndNotCounted) {
  // The gradients left out: the cut is timed one way only, and its activation's -20 us is
  // the offset's error, not a flight.
  StepTimeline t = WithRank1Earlier(TwoStageTimeline(), 50);
  t.transfers.erase(
      std::remove_if(t.transfers.begin(), t.transfers.end(),
                     [&](const TransferLink& l) { return t.slices[l.send].rank == 1; }),
      t.transfers.end());
  const MessageFlights f = MeasureMessageFlights(t, 2);
  EXPECT_THAT(f.stage_counted, ElementsAre(0, 0));
  EXPECT_THAT(f.stage_seconds, ElementsAre(0.0, 0.0));
  // Timed one way and above zero, a flight stands as it is.
  const MessageFlights raw = MeasureMessageFlights(WithRank1Earlier(t, -50), 2);
  EXPECT_THAT(raw.stage_counted, ElementsAre(1, 0));
  EXPECT_THAT(raw.stage_seconds[0], DoubleNear(30e-6, 1e-9));
}

TEST(MeasureMessageFlights, StagesOutsideTheRangeAreNotCounted) {
  const MessageFlights one = MeasureMessageFlights(TwoStageTimeline(), 1);
  EXPECT_EQ(one.messages, 4);
  EXPECT_THAT(one.stage_counted, ElementsAre(0));  // stage 0's messages go to stage 1
  const MessageFlights none = MeasureMessageFlights(TwoStageTimeline(), 0);
  EXPECT_TRUE(none.stage_seconds.empty());
  EXPECT_TRUE(MeasureMessageFlights(StepTimeline{}, 2).stage_counted == std::vector<int>({0, 0}));
}

}  // namespace
}  // namespace tandem
