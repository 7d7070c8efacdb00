#include "common/recompute_placement.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

Schedule Recomputed(const std::string& name, int p, int m) {
  absl::StatusOr<Schedule> s = GenerateSchedule(name, p, m);
  EXPECT_TRUE(s.ok()) << s.status();
  return AddRecomputation(LowerWithTransfers(*s));
}

ActionCosts Costs(double forward, double backward) {
  ActionCosts c;
  c.forward = forward;
  c.backward = backward;
  c.backward_input = c.backward_weight = backward / 2;
  c.activation_bytes = 1000;
  c.input_bytes = 10;
  c.layer_bytes = 300;
  return c;
}

// A moved R: not right before its backward any more, and before a receive.
int CountEarly(const Schedule& s) {
  int n = 0;
  for (const auto& list : s.program) {
    const std::vector<bool> inside = RecomputeAtBackward(list);
    for (size_t i = 0; i < list.size(); ++i) n += list[i].kind == v1::ACTION_R && !inside[i];
  }
  return n;
}

// Uneven stages: the rank before a slower stage waits for its gradients every micro-batch,
// and its recomputation fits in that wait. Without a memory limit the pass hides it there,
// and the step is as short as if that rank did not recompute at all.
TEST(PlaceRecomputation, HidesTheFasterRanksRecomputationInItsWaits) {
  const int p = 2, m = 8;
  const Schedule lowered = Recomputed("1f1b", p, m);
  std::vector<ActionCosts> stages = {Costs(1, 2), Costs(1.5, 3)};  // stage 1 50% slower
  absl::StatusOr<RecomputePlacement> placed = PlaceRecomputation(lowered, {}, stages, {});
  ASSERT_TRUE(placed.ok()) << placed.status();
  EXPECT_TRUE(ValidateSchedule(placed->schedule).ok()) << ValidateSchedule(placed->schedule);
  EXPECT_EQ(placed->total, 2 * m);
  EXPECT_GT(placed->moved, 0);
  EXPECT_EQ(CountEarly(placed->schedule), placed->moved);
  EXPECT_LT(placed->after.step_time, placed->before.step_time);
  // Rank 0's R's out of the critical path: the step of a program where only rank 1 recomputes.
  Schedule only_last = LowerWithTransfers(*GenerateSchedule("1f1b", p, m));
  only_last.program[1] = lowered.program[1];
  absl::StatusOr<SimulationResult> floor = SimulateSchedule(only_last, {}, stages);
  ASSERT_TRUE(floor.ok());
  EXPECT_NEAR(placed->after.step_time, floor->step_time, 1e-9)
      << "before " << placed->before.step_time << " after " << placed->after.step_time;
  // The price: rank 0 holds whole working sets from the moved R's to their backwards.
  EXPECT_GT(placed->after.peak_activation_bytes[0], placed->before.peak_activation_bytes[0]);
}

// Within a memory limit: the peak never goes above it, and a limit at the input's own peak
// moves nothing that would raise it.
TEST(PlaceRecomputation, KeepsEveryRankWithinItsMemoryLimit) {
  const int p = 4, m = 8;
  const Schedule lowered = Recomputed("1f1b", p, m);
  std::vector<ActionCosts> stages = {Costs(1, 2), Costs(1, 2), Costs(1.3, 2.6), Costs(1, 2)};
  absl::StatusOr<RecomputePlacement> free = PlaceRecomputation(lowered, {}, stages, {});
  ASSERT_TRUE(free.ok()) << free.status();
  ASSERT_GT(free->moved, 0);
  std::vector<double> tight = free->before.peak_activation_bytes;
  absl::StatusOr<RecomputePlacement> held = PlaceRecomputation(lowered, {}, stages, tight);
  ASSERT_TRUE(held.ok()) << held.status();
  for (int r = 0; r < p; ++r) {
    EXPECT_LE(held->after.peak_activation_bytes[r], tight[r]) << "rank " << r;
  }
  EXPECT_LE(held->moved, free->moved);
  EXPECT_LE(held->after.step_time, held->before.step_time);
  EXPECT_GE(held->after.step_time, free->after.step_time);
  // Room for one more working set (1000) on every rank: some moves, still within it.
  std::vector<double> middle(p);
  for (int r = 0; r < p; ++r) middle[r] = tight[r] + 1000;
  absl::StatusOr<RecomputePlacement> some = PlaceRecomputation(lowered, {}, stages, middle);
  ASSERT_TRUE(some.ok());
  for (int r = 0; r < p; ++r) EXPECT_LE(some->after.peak_activation_bytes[r], middle[r]);
  EXPECT_GT(some->moved, 0);
  EXPECT_LT(some->after.step_time, some->before.step_time);
  std::cout << "1f1b P4 M8, stage 2 30% slower: step " << free->before.step_time << " -> "
            << free->after.step_time << " (" << free->moved << " of " << free->total
            << " R's moved, no limit), " << some->after.step_time << " (" << some->moved
            << " moved, room for one more working set), " << held->after.step_time << " ("
            << held->moved << " moved, limit at the input's peak)\n";
}

// Every schedule: the pass keeps the program valid and never slows it.
TEST(PlaceRecomputation, EveryScheduleStaysValidAndNoSlower) {
  for (const std::string& name : AllScheduleNames()) {
    for (int p : {2, 4}) {
      const int m = 2 * p;
      absl::StatusOr<Schedule> s = GenerateSchedule(name, p, m);
      if (!s.ok()) continue;  // a generator's stated limits (e.g. M >= 2P)
      SCOPED_TRACE(absl::StrCat(name, " P", p));
      const Schedule lowered = AddRecomputation(LowerWithTransfers(*s));
      absl::StatusOr<RecomputePlacement> placed = PlaceRecomputation(lowered, Costs(1, 2), {}, {});
      ASSERT_TRUE(placed.ok()) << placed.status();
      EXPECT_TRUE(ValidateSchedule(placed->schedule).ok()) << ValidateSchedule(placed->schedule);
      EXPECT_LE(placed->after.step_time, placed->before.step_time);
      // Dropping, then placing, within room for one more working set on every rank.
      std::vector<double> limit = placed->before.peak_activation_bytes;
      for (double& l : limit) l += 1000;
      absl::StatusOr<RecomputePlacement> kept = DropRecomputation(lowered, Costs(1, 2), {}, limit);
      ASSERT_TRUE(kept.ok()) << kept.status();
      EXPECT_TRUE(ValidateSchedule(kept->schedule).ok()) << ValidateSchedule(kept->schedule);
      EXPECT_GT(kept->dropped, 0);
      for (size_t r = 0; r < limit.size(); ++r) {
        EXPECT_LE(kept->after.peak_activation_bytes[r], limit[r]) << "rank " << r;
      }
      absl::StatusOr<RecomputePlacement> both =
          PlaceRecomputation(kept->schedule, Costs(1, 2), {}, limit);
      ASSERT_TRUE(both.ok()) << both.status();
      EXPECT_TRUE(ValidateSchedule(both->schedule).ok()) << ValidateSchedule(both->schedule);
      EXPECT_LE(both->after.step_time, kept->after.step_time);
      EXPECT_LE(kept->after.step_time, kept->before.step_time);
      for (size_t r = 0; r < limit.size(); ++r) {
        EXPECT_LE(both->after.peak_activation_bytes[r], limit[r]) << "rank " << r;
      }
    }
  }
}

int CountRecomputes(const std::vector<Action>& list) {
  int n = 0;
  for (const Action& a : list) n += a.kind == v1::ACTION_R;
  return n;
}

// Checkpoint skipping: with room for one more working set (1000) than full recomputation's
// peak, 1F1B's last stage (one micro-batch in flight) keeps every micro-batch's activations,
// and its first (two in flight) every other one: the R's of micro-batches 0, 2, 4, 6 go, since
// two kept working sets at once would not fit. The peaks stay within the limit, the step is
// shorter, and the same limit at the plain peak drops nothing.
TEST(DropRecomputation, KeepsTheActivationsWhereTheLimitHoldsThem) {
  const int p = 2, m = 8;
  const Schedule lowered = Recomputed("1f1b", p, m);
  const std::vector<ActionCosts> stages = {Costs(1, 2), Costs(1, 2)};
  absl::StatusOr<RecomputePlacement> plain = DropRecomputation(
      lowered, {}, stages, SimulateSchedule(lowered, {}, stages)->peak_activation_bytes);
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(plain->dropped, 0);
  EXPECT_EQ(plain->total, 2 * m);
  // Full recomputation's peaks: two checkpoints and a layer's working set, one and a layer's.
  ASSERT_THAT(plain->before.peak_activation_bytes, ::testing::ElementsAre(320, 310));
  const std::vector<double> limit = {1320, 1310};
  absl::StatusOr<RecomputePlacement> kept = DropRecomputation(lowered, {}, stages, limit);
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_TRUE(ValidateSchedule(kept->schedule).ok()) << ValidateSchedule(kept->schedule);
  EXPECT_EQ(kept->dropped, m + m / 2);
  EXPECT_EQ(CountRecomputes(kept->schedule.program[1]), 0);
  std::vector<int> still;
  for (const Action& a : kept->schedule.program[0]) {
    if (a.kind == v1::ACTION_R) still.push_back(a.micro_batch);
  }
  EXPECT_THAT(still, ::testing::ElementsAre(1, 3, 5, 7));
  for (int r = 0; r < p; ++r) EXPECT_LE(kept->after.peak_activation_bytes[r], limit[r]);
  EXPECT_LT(kept->after.step_time, kept->before.step_time);
  // What is left can still move into idle time; the result validates within the same limit.
  absl::StatusOr<RecomputePlacement> placed = PlaceRecomputation(kept->schedule, {}, stages, limit);
  ASSERT_TRUE(placed.ok()) << placed.status();
  EXPECT_EQ(placed->total, m / 2);
  EXPECT_LE(placed->after.step_time, kept->after.step_time);
  for (int r = 0; r < p; ++r) EXPECT_LE(placed->after.peak_activation_bytes[r], limit[r]);
}

// A stage of one layer holds that layer's working set in a recomputing backward anyway, so
// keeping the F's activations needs less than recomputing (no checkpoint beside them): its
// R's go even with the limit at the plain peak, while the deeper stage keeps all of its own.
TEST(DropRecomputation, AOneLayerStageNeedsNoRecomputationInOneF1B) {
  const int p = 2, m = 8;
  const Schedule lowered = Recomputed("1f1b", p, m);
  std::vector<ActionCosts> stages = {Costs(1, 2), Costs(1, 2)};
  stages[1].activation_bytes = stages[1].layer_bytes;  // one layer
  const std::vector<double> plain_peak =
      SimulateSchedule(lowered, {}, stages)->peak_activation_bytes;
  absl::StatusOr<RecomputePlacement> kept = DropRecomputation(lowered, {}, stages, plain_peak);
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_EQ(CountRecomputes(kept->schedule.program[0]), m);
  EXPECT_EQ(CountRecomputes(kept->schedule.program[1]), 0);
  EXPECT_LT(kept->after.peak_activation_bytes[1], plain_peak[1]);
  EXPECT_LT(kept->after.step_time, kept->before.step_time);
}

// Without a limit nothing needs recomputing: every R goes, and the step is the program's
// without recomputation.
TEST(DropRecomputation, WithoutALimitDropsEveryR) {
  const Schedule plain = LowerWithTransfers(*GenerateSchedule("zb_h1", 4, 8));
  const Schedule lowered = AddRecomputation(plain);
  absl::StatusOr<RecomputePlacement> kept = DropRecomputation(lowered, Costs(1, 2), {}, {});
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_EQ(kept->dropped, kept->total);
  EXPECT_GT(kept->total, 0);
  absl::StatusOr<SimulationResult> none = SimulateSchedule(plain, Costs(1, 2), {});
  ASSERT_TRUE(none.ok());
  EXPECT_NEAR(kept->after.step_time, none->step_time, 1e-9);
}

TEST(PlaceRecomputation, RefusesAMemoryLimitPerRankOfTheWrongLength) {
  absl::StatusOr<RecomputePlacement> placed =
      PlaceRecomputation(Recomputed("1f1b", 2, 4), Costs(1, 2), {}, {1.0, 2.0, 3.0});
  EXPECT_EQ(placed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(placed.status().message(), ::testing::HasSubstr("3 memory limits for 2 ranks"));
  absl::StatusOr<RecomputePlacement> kept =
      DropRecomputation(Recomputed("1f1b", 2, 4), Costs(1, 2), {}, {1.0});
  EXPECT_EQ(kept.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(kept.status().message(), ::testing::HasSubstr("1 memory limits for 2 ranks"));
}

}  // namespace
}  // namespace tandem
