// MeasurePeak (worker/peak_flops.h): workers started together on one host measure their peaks
// one at a time, so that none measures against another's GEMMs; the best sample is the peak;
// the method says how it was measured.
#include "worker/peak_flops.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem::worker {
namespace {

using ::testing::HasSubstr;

std::string TempLockPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir != nullptr ? dir : "/tmp") + "/peak-flops-test-" + name + "-" +
         std::to_string(::getpid()) + ".lock";
}

// Intervals during which each measurer's samples ran.
struct Intervals {
  absl::Mutex mu;
  std::vector<std::pair<std::chrono::steady_clock::time_point, int>> events;  // (time, who)
  // Each measurer's [first sample start, last sample end].
  std::vector<
      std::pair<std::chrono::steady_clock::time_point, std::chrono::steady_clock::time_point>>
      spans;
};

TEST(PeakFlopsTest, WorkersStartedTogetherMeasureOneAtATime) {
  constexpr int kWorkers = 4;
  const std::string lock = TempLockPath("serial");
  Intervals seen;
  seen.spans.resize(kWorkers);
  std::vector<absl::StatusOr<PeakFlops>> results(kWorkers, absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int w = 0; w < kWorkers; ++w) {
    threads.emplace_back([&, w] {
      PeakOptions o;
      o.lock_path = lock;
      o.samples = 3;
      o.warmup = 1;
      o.gap = absl::Milliseconds(2);
      o.what = "fake GEMM";
      bool first = true;
      results[w] = MeasurePeak(
          [&]() -> absl::StatusOr<double> {
            const auto start = std::chrono::steady_clock::now();
            std::this_thread::sleep_for(std::chrono::milliseconds(3));
            const auto end = std::chrono::steady_clock::now();
            absl::MutexLock l(&seen.mu);
            if (first) seen.spans[w].first = start;
            first = false;
            seen.spans[w].second = end;
            return 1e9;
          },
          o);
    });
  }
  for (std::thread& t : threads) t.join();
  for (int w = 0; w < kWorkers; ++w) {
    ASSERT_TRUE(results[w].ok()) << results[w].status();
    EXPECT_TRUE(results[w]->serialized);
    EXPECT_THAT(results[w]->method, HasSubstr("one worker of this host at a time"));
  }
  // No two measurements overlap: each one's samples all ran while no other's did.
  std::vector<
      std::pair<std::chrono::steady_clock::time_point, std::chrono::steady_clock::time_point>>
      spans = seen.spans;
  std::sort(spans.begin(), spans.end());
  for (int i = 1; i < kWorkers; ++i) {
    EXPECT_LE(spans[i - 1].second, spans[i].first)
        << "measurements " << i - 1 << " and " << i << " ran at the same time";
  }
  ::unlink(lock.c_str());
}

TEST(PeakFlopsTest, TheBestSampleIsThePeakAndTheWarmUpIsDropped) {
  const std::vector<double> flops = {9e9, 2e9, 5e9, 3e9};  // the first is the warm-up
  size_t i = 0;
  PeakOptions o;
  o.lock_path = "";
  o.warmup = 1;
  o.samples = 3;
  o.gap = absl::ZeroDuration();
  o.what = "fake GEMM";
  const absl::Time before = absl::Now();
  absl::StatusOr<PeakFlops> p = MeasurePeak(
      [&]() -> absl::StatusOr<double> { return flops[std::min(i++, flops.size() - 1)]; }, o);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->flops, 5e9);
  EXPECT_EQ(p->samples, 3);
  EXPECT_EQ(i, 4u);
  EXPECT_GE(p->measured_at, before);
  EXPECT_FALSE(p->serialized);
  EXPECT_THAT(p->method, HasSubstr("fake GEMM, best of 3 samples"));
  EXPECT_THAT(p->method, HasSubstr("not serialised with other workers (no lock file)"));
}

TEST(PeakFlopsTest, ALockHeldTooLongIsWaitedForBoundedlyThenMeasuredWithout) {
  const std::string lock = TempLockPath("held");
  const int fd = ::open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::flock(fd, LOCK_EX), 0);
  PeakOptions o;
  o.lock_path = lock;
  o.lock_wait = absl::Milliseconds(50);
  o.samples = 1;
  o.warmup = 0;
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<PeakFlops> p = MeasurePeak([]() -> absl::StatusOr<double> { return 1e9; }, o);
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_FALSE(p->serialized);
  EXPECT_THAT(p->method, HasSubstr("still held by another measurement"));
  EXPECT_LT(waited, 10.0);  // bounded, not a hang (the wait is 50 ms)
  ::close(fd);
  ::unlink(lock.c_str());
}

TEST(PeakFlopsTest, AnUnopenableLockFileIsNamedAndTheMeasurementStillRuns) {
  PeakOptions o;
  o.lock_path = "/nonexistent-dir-for-tandem/peak.lock";
  o.samples = 1;
  o.warmup = 0;
  absl::StatusOr<PeakFlops> p = MeasurePeak([]() -> absl::StatusOr<double> { return 1e9; }, o);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_FALSE(p->serialized);
  EXPECT_THAT(p->method, HasSubstr("cannot open /nonexistent-dir-for-tandem/peak.lock"));
}

TEST(PeakFlopsTest, BadOptionsAndBadSamplesAreErrorsThatSayWhat) {
  PeakOptions o;
  o.lock_path = "";
  o.samples = 0;
  EXPECT_EQ(MeasurePeak([]() -> absl::StatusOr<double> { return 1e9; }, o).status().code(),
            absl::StatusCode::kInvalidArgument);
  o.samples = 2;
  o.gap = absl::ZeroDuration();
  absl::StatusOr<PeakFlops> nan =
      MeasurePeak([]() -> absl::StatusOr<double> { return std::nan(""); }, o);
  EXPECT_EQ(nan.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(nan.status().message(), HasSubstr("not a positive figure"));
  absl::StatusOr<PeakFlops> failed = MeasurePeak(
      []() -> absl::StatusOr<double> { return absl::UnavailableError("no device"); }, o);
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kUnavailable);
}

TEST(PeakFlopsTest, TheCpuSampleIsARealGemm) {
  absl::StatusOr<double> f = CpuSgemmSample(128)();
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_GT(*f, 1e6);  // any CPU of this century does a 128^3 SGEMM at over 1 MFLOP/s
  EXPECT_EQ(CpuSgemmSample(0)().status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tandem::worker
