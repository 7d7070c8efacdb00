#include "common/link_model.h"

#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace tandem {
namespace {

v1::LinkProfile LinkOf(const std::vector<std::pair<int64_t, double>>& points) {
  v1::LinkProfile link;
  for (const auto& [bytes, seconds] : points) {
    v1::LinkSample* s = link.add_samples();
    s->set_bytes(bytes);
    s->set_one_way_seconds(seconds);
  }
  return link;
}

TEST(LinkModelTest, ExactLineIsRecovered) {
  // 10 us latency, 1 ns per byte.
  v1::LinkProfile link = LinkOf({{1000, 11e-6}, {2000, 12e-6}, {4000, 14e-6}});
  ASSERT_TRUE(FitLink(&link).ok());
  EXPECT_NEAR(link.latency_seconds(), 10e-6, 1e-15);
  EXPECT_NEAR(link.seconds_per_byte(), 1e-9, 1e-18);
  EXPECT_NEAR(TransferSeconds(link, 8000), 18e-6, 1e-15);
}

TEST(LinkModelTest, LeastSquaresOfThreePoints) {
  // x = 1, 2, 3; y = 2, 3, 5: mean x 2, mean y 10/3, Sxx = 2, Sxy = 3, so b = 1.5 and
  // a = 10/3 - 3 = 1/3.
  v1::LinkProfile link = LinkOf({{1, 2.0}, {2, 3.0}, {3, 5.0}});
  ASSERT_TRUE(FitLink(&link).ok());
  EXPECT_NEAR(link.seconds_per_byte(), 1.5, 1e-12);
  EXPECT_NEAR(link.latency_seconds(), 1.0 / 3.0, 1e-12);
}

TEST(LinkModelTest, NegativeSlopeIsClampedToAllLatency) {
  // Free fit: b = -2. Edges: b = 0, a = 4 (squared error 2) beats a = 0, b = 11/5 (9.8).
  v1::LinkProfile link = LinkOf({{1, 5.0}, {2, 3.0}});
  ASSERT_TRUE(FitLink(&link).ok());
  EXPECT_DOUBLE_EQ(link.latency_seconds(), 4.0);
  EXPECT_DOUBLE_EQ(link.seconds_per_byte(), 0.0);
}

TEST(LinkModelTest, NegativeLatencyIsClampedToAllBandwidth) {
  // Free fit: b = 2, a = -1. Edges: a = 0, b = 7/5 (squared error 0.2) beats b = 0, a = 2 (2).
  v1::LinkProfile link = LinkOf({{1, 1.0}, {2, 3.0}});
  ASSERT_TRUE(FitLink(&link).ok());
  EXPECT_DOUBLE_EQ(link.latency_seconds(), 0.0);
  EXPECT_NEAR(link.seconds_per_byte(), 1.4, 1e-12);
  EXPECT_NEAR(TransferSeconds(link, 10), 14.0, 1e-9);
}

TEST(LinkModelTest, OneDistinctSizeIsAllLatency) {
  v1::LinkProfile link = LinkOf({{4096, 2e-5}, {4096, 4e-5}});
  ASSERT_TRUE(FitLink(&link).ok());
  EXPECT_NEAR(link.latency_seconds(), 3e-5, 1e-18);
  EXPECT_EQ(link.seconds_per_byte(), 0.0);
}

TEST(LinkModelTest, BadSamplesAreRefusedAndLeaveTheLinkUnchanged) {
  v1::LinkProfile empty;
  EXPECT_EQ(FitLink(&empty).code(), absl::StatusCode::kInvalidArgument);
  v1::LinkProfile zero = LinkOf({{1000, 1e-5}, {0, 1e-5}});
  zero.set_latency_seconds(7.0);
  absl::Status s = FitLink(&zero);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("samples[1].bytes"), absl::string_view::npos) << s;
  EXPECT_EQ(zero.latency_seconds(), 7.0);
  v1::LinkProfile negative = LinkOf({{1000, -1e-5}});
  EXPECT_EQ(FitLink(&negative).code(), absl::StatusCode::kInvalidArgument);
  v1::LinkProfile nan = LinkOf({{1000, std::numeric_limits<double>::quiet_NaN()}});
  EXPECT_EQ(FitLink(&nan).code(), absl::StatusCode::kInvalidArgument);
}

TEST(LinkModelTest, TransferSecondsOfNothingOrAnUnmeasuredLinkIsZero) {
  v1::LinkProfile link;
  link.set_latency_seconds(1e-5);
  link.set_seconds_per_byte(1e-9);
  EXPECT_DOUBLE_EQ(TransferSeconds(link, 1000), 1e-5 + 1e-6);
  EXPECT_EQ(TransferSeconds(link, 0), 0.0);
  EXPECT_EQ(TransferSeconds(link, -5), 0.0);
  EXPECT_EQ(TransferSeconds(v1::LinkProfile(), 1 << 20), 0.0);
}

// The ring from the fit: 2 (R - 1) steps of a 1/R piece; from a measured all-reduce: its own
// per-byte cost (copies and sums included), which on 2 ranks gives back the measurement.
TEST(LinkModelTest, AllReduceFromTheFitOrFromTheMeasuredRing) {
  v1::LinkProfile link;
  link.set_latency_seconds(1e-5);
  link.set_seconds_per_byte(1e-9);
  EXPECT_DOUBLE_EQ(AllReduceSeconds(link, 4000, 2), 2 * (1e-5 + 2000 * 1e-9));
  EXPECT_DOUBLE_EQ(AllReduceSeconds(link, 4000, 4), 6 * (1e-5 + 1000 * 1e-9));
  EXPECT_EQ(AllReduceSeconds(link, 4000, 1), 0.0);
  EXPECT_EQ(AllReduceSeconds(link, 0, 2), 0.0);
  EXPECT_EQ(AllReduceSeconds(v1::LinkProfile(), 4000, 2), 0.0);

  // Measured: 64 MiB in 0.1 s on two ranks, three times what the messages alone would take.
  link.set_allreduce_bytes(int64_t{64} << 20);
  link.set_allreduce_seconds(0.1);
  EXPECT_NEAR(AllReduceSeconds(link, int64_t{64} << 20, 2), 0.1, 1e-12);
  const double k = (0.1 - 2e-5) / static_cast<double>(int64_t{64} << 20);
  EXPECT_NEAR(AllReduceSeconds(link, int64_t{32} << 20, 2), 2 * (1e-5 + (16 << 20) * k), 1e-12);
  EXPECT_NEAR(AllReduceSeconds(link, int64_t{64} << 20, 4), 6 * (1e-5 + (16 << 20) * k), 1e-12);
}

}  // namespace
}  // namespace tandem
