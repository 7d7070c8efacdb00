// Status load while a job trains: 50 concurrent WatchJob streams and a target rate of status
// RPCs (GetJob, ListJobs, ListWorkers in turn) against a real coordinator with two real
// workers on 127.0.0.1, for a fixed time. Prints the job's mean step time before, during and
// after the load (the ratio is taken in the same run: the machine is shared and noisy), the
// status RPCs per second reached, and every error.
//
//   build/bin/bench_status_load [--seconds 60] [--rate 500] [--watchers 50]
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "coordinator/cli/coordinator_client.h"
#include "tests/integration/harness.h"

namespace {

using Clock = std::chrono::steady_clock;

// Seconds per step over `seconds` of the job's progress.
double MeasureStepSeconds(tandem::testing::Cluster& cluster, const std::string& id,
                          double seconds) {
  auto steps_done = [&] {
    auto j = cluster.GetJob(id);
    return j.ok() ? j->steps_done() : int64_t{-1};
  };
  const int64_t s0 = steps_done();
  const auto t0 = Clock::now();
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  const int64_t s1 = steps_done();
  const double elapsed = std::chrono::duration<double>(Clock::now() - t0).count();
  return s1 > s0 ? elapsed / static_cast<double>(s1 - s0) : 0.0;
}

}  // namespace

int main(int argc, char** argv) {
  double seconds = 60;
  int rate = 500;
  int watchers = 50;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], "--seconds") == 0) seconds = std::atof(argv[i + 1]);
    if (std::strcmp(argv[i], "--rate") == 0) rate = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--watchers") == 0) watchers = std::atoi(argv[i + 1]);
  }
  tandem::testing::Cluster::Options options;
  options.workers = 2;
  tandem::testing::Cluster cluster(options);
  if (absl::Status s = cluster.Start(); !s.ok()) {
    std::fprintf(stderr, "cluster: %s\n", s.ToString().c_str());
    return 1;
  }
  // A GPT small enough to step many times a second, big enough that a step is real work.
  const std::string spec =
      "name: load\nsteps: 1000000\nmodel:\n  arch: gpt\n  n_layer: 4\n  d_model: 64\n"
      "  n_head: 4\n  seq_len: 32\n  vocab_size: 256\npipeline:\n  stages: 2\n"
      "  micro_batch_size: 4\n  micro_batches: 4\n  schedule: 1f1b\n";
  auto id = cluster.Submit(spec);
  if (!id.ok()) {
    std::fprintf(stderr, "submit: %s\n", id.status().ToString().c_str());
    return 1;
  }
  // Warm up: the job plans, configures and takes its first steps.
  while (true) {
    auto j = cluster.GetJob(*id);
    if (j.ok() && j->steps_done() >= 20) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  const double quiet = std::max(10.0, seconds / 3);
  const double before = MeasureStepSeconds(cluster, *id, quiet);

  std::atomic<bool> stop{false};
  std::atomic<int64_t> rpcs{0}, rpc_errors{0}, events{0}, watch_errors{0};
  std::vector<std::thread> threads;
  for (int w = 0; w < watchers; ++w) {
    threads.emplace_back([&] {
      auto client = tandem::cli::NewGrpcCoordinatorClient(cluster.address(), absl::Seconds(10),
                                                          absl::Hours(1));
      absl::Status s = client->WatchJob(*id, [&](const tandem::v1::JobEvent&) {
        events.fetch_add(1);
        return !stop.load();
      });
      if (!s.ok()) watch_errors.fetch_add(1);
    });
  }
  constexpr int kCallers = 10;
  for (int c = 0; c < kCallers; ++c) {
    threads.emplace_back([&, c] {
      auto client = tandem::cli::NewGrpcCoordinatorClient(cluster.address(), absl::Seconds(10),
                                                          absl::Hours(1));
      const auto every = std::chrono::duration<double>(kCallers / static_cast<double>(rate));
      auto next = Clock::now();
      for (int64_t n = c; !stop.load(); ++n) {
        absl::Status s;
        switch (n % 3) {
          case 0:
            s = client->GetJob(*id).status();
            break;
          case 1:
            s = client->ListJobs().status();
            break;
          default:
            s = client->ListWorkers().status();
        }
        rpcs.fetch_add(1);
        if (!s.ok()) rpc_errors.fetch_add(1);
        next += std::chrono::duration_cast<Clock::duration>(every);
        std::this_thread::sleep_until(next);
      }
    });
  }
  const auto load_start = Clock::now();
  const double loaded = MeasureStepSeconds(cluster, *id, seconds);
  const double load_seconds = std::chrono::duration<double>(Clock::now() - load_start).count();
  const int64_t calls = rpcs.load();
  stop.store(true);
  for (auto& t : threads) t.join();
  const double after = MeasureStepSeconds(cluster, *id, quiet);
  (void)cluster.Cancel(*id);

  const double unloaded = (before + after) / 2;
  std::printf("status load: %d WatchJob streams + %d status RPC/s target for %.0f s\n", watchers,
              rate, seconds);
  std::printf("  status RPCs: %lld in %.1f s = %.0f/s, errors %lld\n",
              static_cast<long long>(calls), load_seconds, calls / load_seconds,
              static_cast<long long>(rpc_errors.load()));
  std::printf("  watch events delivered: %lld, broken streams %lld\n",
              static_cast<long long>(events.load()), static_cast<long long>(watch_errors.load()));
  std::printf("  step time: before %.2f ms, during %.2f ms, after %.2f ms\n", before * 1e3,
              loaded * 1e3, after * 1e3);
  std::printf("  loaded / unloaded (mean of before and after): %.3f\n",
              unloaded > 0 ? loaded / unloaded : 0.0);
  return rpc_errors.load() == 0 && watch_errors.load() == 0 ? 0 : 1;
}
