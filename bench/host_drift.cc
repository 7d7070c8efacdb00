// How steady this machine's compute is: one thread per core runs the same single-threaded
// OpenBLAS sgemm over and over (the shape of a GPT block's projection at micro-batch 4 x
// seq_len 128, d_model 768) and counts its rate in windows of 0.2 s; then prints, per thread,
// the median rate, the medians of consecutive blocks of --block seconds against it (the
// drift: minutes-long changes of speed) and the share of windows under 0.85x of it (bursts).
// A planner's prediction is made minutes before the job it prices runs, so a host whose
// blocks move by more than the target cannot judge a prediction to that target; the last
// line says whether this one can (partition_bench.sh runs this before and after its jobs).
//
//   build/bin/bench_host_drift [--seconds 30] [--block 10] [--threads N] [--target 0.03]
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/median.h"

namespace {

using tandem::Median;

constexpr int kM = 512, kK = 768, kN = 768;
constexpr double kWindowSeconds = 0.2;

// GEMMs per second in each window of kWindowSeconds until `seconds` have passed.
std::vector<double> Rates(double seconds) {
  std::vector<float> a(static_cast<size_t>(kM) * kK, 0.5f), b(static_cast<size_t>(kK) * kN, 0.25f),
      c(static_cast<size_t>(kM) * kN, 0.0f);
  using Clock = std::chrono::steady_clock;
  const Clock::time_point end = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                                   std::chrono::duration<double>(seconds));
  std::vector<double> rates;
  while (Clock::now() < end) {
    const Clock::time_point start = Clock::now();
    int n = 0;
    double elapsed = 0;
    while (elapsed < kWindowSeconds) {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, kM, kN, kK, 1.0f, a.data(), kK,
                  b.data(), kN, 0.0f, c.data(), kN);
      ++n;
      elapsed = std::chrono::duration<double>(Clock::now() - start).count();
    }
    rates.push_back(n / elapsed);
  }
  return rates;
}

bool ParseFlag(int argc, char** argv, int& i, const char* name, double& out) {
  if (std::strcmp(argv[i], name) != 0 || i + 1 >= argc) return false;
  if (!absl::SimpleAtod(argv[i + 1], &out) || !(out > 0)) {
    std::fprintf(stderr, "bench_host_drift: %s takes a positive number, not '%s'\n", name,
                 argv[i + 1]);
    std::exit(2);
  }
  ++i;
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  double seconds = 30, block = 10, target = 0.03;
  double threads = std::max(1u, std::thread::hardware_concurrency());
  for (int i = 1; i < argc; ++i) {
    if (ParseFlag(argc, argv, i, "--seconds", seconds) ||
        ParseFlag(argc, argv, i, "--block", block) ||
        ParseFlag(argc, argv, i, "--threads", threads) ||
        ParseFlag(argc, argv, i, "--target", target)) {
      continue;
    }
    std::fprintf(stderr,
                 "usage: bench_host_drift [--seconds 30] [--block 10] [--threads N] "
                 "[--target 0.03]\n");
    return 2;
  }
  if (block < kWindowSeconds || block > seconds) {
    std::fprintf(stderr, "bench_host_drift: --block must lie within [0.2, --seconds]\n");
    return 2;
  }
  openblas_set_num_threads(1);  // each thread's GEMM on its own core, as a --threads 1 worker's
  const int n = static_cast<int>(threads);
  std::vector<std::vector<double>> rates(static_cast<size_t>(n));
  std::vector<std::thread> pool;
  for (int t = 0; t < n; ++t)
    pool.emplace_back([&, t] { rates[static_cast<size_t>(t)] = Rates(seconds); });
  for (std::thread& t : pool) t.join();

  const double flop = 2.0 * kM * kN * kK;
  const size_t per_block = std::max<size_t>(1, static_cast<size_t>(block / kWindowSeconds + 0.5));
  std::printf(
      "host drift: %d thread(s) x %.0f s of sgemm %dx%dx%d (OpenBLAS, 1 thread each), "
      "windows of %.1f s, blocks of %.0f s\n",
      n, seconds, kM, kK, kN, kWindowSeconds, block);
  double low = 0, high = 0;
  bool first = true;
  for (int t = 0; t < n; ++t) {
    const std::vector<double>& r = rates[static_cast<size_t>(t)];
    const double median = Median(r);
    if (median <= 0) continue;
    const long slow =
        std::count_if(r.begin(), r.end(), [&](double x) { return x < 0.85 * median; });
    std::string blocks;
    // Whole blocks only (a window runs a little over 0.2 s, so a block's last may fall past
    // the end): a short last block is a few windows, noise rather than drift.
    for (size_t b = 0; b < r.size() && 5 * (r.size() - b) >= 4 * per_block; b += per_block) {
      const double m = Median(std::vector<double>(
                           r.begin() + static_cast<long>(b),
                           r.begin() + static_cast<long>(std::min(r.size(), b + per_block)))) /
                       median;
      absl::StrAppend(&blocks, blocks.empty() ? "x" : " ", absl::StrFormat("%.2f", m));
      low = first ? m : std::min(low, m);
      high = first ? m : std::max(high, m);
      first = false;
    }
    std::printf(
        "  thread %d: %.1f GFLOP/s median; blocks %s; %ld of %zu windows (%.0f%%) under "
        "0.85x\n",
        t, median * flop * 1e-9, blocks.c_str(), slow, r.size(),
        100.0 * static_cast<double>(slow) / static_cast<double>(r.size()));
  }
  if (first) {
    std::printf("  too short for one block\n");
    return 0;
  }
  const std::string verdict =
      high / low - 1 <= target
          ? absl::StrCat("steady enough to judge predictions to ", 100 * target, "%")
          : absl::StrCat("moving by more than the ", 100 * target,
                         "% predictions are judged to: a miss here may be the host's");
  std::printf("drift: blocks x%.3f-%.3f of their thread's median (spread %.1f%%): %s\n", low, high,
              100 * (high / low - 1), verdict.c_str());
  return 0;
}
