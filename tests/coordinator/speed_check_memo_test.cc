// The coordinator's recent speed checks: a verdict stands for its family for the check's age,
// and an older verdict never replaces a newer one.
#include "coordinator/speed_check_memo.h"

#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace tandem::coordinator {
namespace {

SpeedCheck Ratio(double r) {
  SpeedCheck c;
  c.ratio = r;
  return c;
}

TEST(SpeedCheckMemoTest, AVerdictStandsForItsFamilyForTheChecksAge) {
  SpeedCheckMemo memo(absl::Seconds(60));
  const absl::Time t0 = absl::FromUnixSeconds(1'000'000);
  EXPECT_FALSE(memo.Find("gpt-B0-cpu", t0).has_value());
  memo.Put("gpt-B0-cpu", Ratio(1.1), t0);
  std::optional<SpeedCheckMemo::Verdict> v = memo.Find("gpt-B0-cpu", t0 + absl::Seconds(59));
  ASSERT_TRUE(v.has_value());
  EXPECT_DOUBLE_EQ(v->check.ratio, 1.1);
  EXPECT_EQ(v->made, t0);
  EXPECT_FALSE(memo.Find("gpt-B0-cpu", t0 + absl::Seconds(60)).has_value());  // as old as a profile
  EXPECT_FALSE(memo.Find("llama-B0-cpu", t0).has_value());                    // another family

  memo.Put("gpt-B0-cpu", Ratio(0.9), t0 + absl::Seconds(30));
  memo.Put("gpt-B0-cpu", Ratio(1.5), t0 + absl::Seconds(10));  // made earlier: dropped
  v = memo.Find("gpt-B0-cpu", t0 + absl::Seconds(80));
  ASSERT_TRUE(v.has_value());
  EXPECT_DOUBLE_EQ(v->check.ratio, 0.9);
}

TEST(SpeedCheckMemoTest, ChecksProfilesAtLeastItsAgeOldAndNoneWhenInfinite) {
  SpeedCheckMemo memo(absl::Seconds(60));
  EXPECT_FALSE(memo.Checks(absl::Seconds(59)));
  EXPECT_TRUE(memo.Checks(absl::Seconds(60)));
  SpeedCheckMemo never(absl::InfiniteDuration());
  EXPECT_FALSE(never.Checks(absl::Hours(24 * 365)));
}

}  // namespace
}  // namespace tandem::coordinator
