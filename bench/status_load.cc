// Status load while a job trains: 50 concurrent WatchJob streams and a target rate of status
// RPCs (GetJob as `tandem status` asks for it, ListJobs, ListWorkers in turn) against a real
// coordinator with two real workers on 127.0.0.1. The job's step time is measured in windows
// that alternate, unloaded and loaded (U L U L U L U), so that each loaded window is compared
// with the unloaded ones on either side of it in the same run: the machine is shared and
// noisy, and its speed drifts over minutes. Prints every window, the status RPCs per second
// reached, the watch events delivered, and every error.
//
//   build/bin/bench_status_load [--seconds 60] [--windows 3] [--rate 500] [--watchers 50]
//                               [--client-nice N | --client-idle] [--rpc-nice N]
//                               [--coordinator-cpus LIST --worker-cpus LIST]
//
// --seconds is the total loaded time, in --windows loaded windows (each unloaded window is as
// long as a loaded one). More, shorter windows follow the machine's drift more closely: each
// ratio is then less noisy, and the median over the windows is printed beside the mean.
// --client-nice N runs the load generator's threads at nice N: on a machine with few cores
// the generator (which stands for clients on other machines) otherwise competes with the
// workers itself; --client-idle runs them under SCHED_IDLE instead (below every nice value).
// --rpc-nice N is the coordinator's flag (default 10: its RPC threads below its job runners; 0 runs
// the whole coordinator at normal priority).
// --coordinator-cpus and --worker-cpus (CPU lists as taskset takes them, e.g. 0 or 2-3,6) run the
// coordinator and the load generator on some cores and the workers on others, in the unloaded
// and the loaded windows alike: the shape of a deployment, where the coordinator and its clients
// run on other machines than the workers, on a machine with few cores.
#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "coordinator/cli/coordinator_client.h"
#include "coordinator/cli/format.h"
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

// The load generator's threads at nice `nice`, or under SCHED_IDLE (`idle`): they then run only
// on a core nothing else wants, and a waking worker preempts them at once. Either needs no
// privilege (it only lowers the thread).
void LowerThisThread(int nice, bool idle) {
  if (idle) {
    sched_param param{};
    param.sched_priority = 0;
    (void)sched_setscheduler(0, SCHED_IDLE, &param);  // 0: the calling thread
  } else if (nice != 0) {
    (void)setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), nice);
  }
}

// The CPUs in `list` ("0", "2-3,6", as taskset takes them) into `set`. False, with a message
// naming `flag`, on a list it cannot parse.
bool ParseCpuList(const char* flag, const std::string& list, cpu_set_t* set) {
  CPU_ZERO(set);
  for (absl::string_view part : absl::StrSplit(list, ',')) {
    std::vector<absl::string_view> range = absl::StrSplit(part, absl::MaxSplits('-', 1));
    int lo = 0, hi = 0;
    if (!absl::SimpleAtoi(range[0], &lo) ||
        !absl::SimpleAtoi(range.size() == 2 ? range[1] : range[0], &hi) || lo < 0 || hi < lo ||
        hi >= CPU_SETSIZE) {
      std::fprintf(stderr, "%s: '%s' is not a CPU list like 0 or 2-3,6\n", flag, list.c_str());
      return false;
    }
    for (int cpu = lo; cpu <= hi; ++cpu) CPU_SET(cpu, set);
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  double seconds = 60;
  int rate = 500;
  int watchers = 50;
  int client_nice = 0;
  int windows = 3;
  bool client_idle = false;
  std::string rpc_nice;                       // the coordinator's default unless given
  std::string coordinator_cpus, worker_cpus;  // unset: every process on every core
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--client-idle") == 0) client_idle = true;
    if (i + 1 == argc) break;  // the flags below take a value
    if (std::strcmp(argv[i], "--seconds") == 0) seconds = std::atof(argv[i + 1]);
    if (std::strcmp(argv[i], "--rate") == 0) rate = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--windows") == 0) windows = std::max(1, std::atoi(argv[i + 1]));
    if (std::strcmp(argv[i], "--watchers") == 0) watchers = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--client-nice") == 0) client_nice = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--rpc-nice") == 0) rpc_nice = argv[i + 1];
    if (std::strcmp(argv[i], "--coordinator-cpus") == 0) coordinator_cpus = argv[i + 1];
    if (std::strcmp(argv[i], "--worker-cpus") == 0) worker_cpus = argv[i + 1];
  }
  // Both lists are checked before anything starts; this process (and so the coordinator and the
  // load generator, which it starts after this) runs on the first, each worker under taskset on
  // the second.
  cpu_set_t cpus;
  if (!worker_cpus.empty() && !ParseCpuList("--worker-cpus", worker_cpus, &cpus)) return 2;
  if (!coordinator_cpus.empty()) {
    if (!ParseCpuList("--coordinator-cpus", coordinator_cpus, &cpus)) return 2;
    if (sched_setaffinity(0, sizeof(cpus), &cpus) != 0) {
      std::fprintf(stderr, "--coordinator-cpus %s: %s\n", coordinator_cpus.c_str(),
                   std::strerror(errno));
      return 2;
    }
  }
  tandem::testing::Cluster::Options options;
  options.workers = 2;
  if (!rpc_nice.empty()) options.coordinator_args.push_back("--rpc-nice=" + rpc_nice);
  if (!worker_cpus.empty()) {
    options.place_worker = [&](int) {
      tandem::testing::Cluster::Options::Placement place;
      place.coordinator_host = "127.0.0.1";
      place.prefix = {"/usr/bin/taskset", "-c", worker_cpus};
      return place;
    };
  }
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
  // Its first seconds still run slower (allocators and caches settle): they are not measured.
  std::this_thread::sleep_for(std::chrono::seconds(5));

  std::atomic<bool> stop{false}, loaded{false};
  std::atomic<int64_t> rpcs{0}, rpc_errors{0}, events{0}, watch_errors{0};
  std::vector<std::thread> threads;
  // Each watcher holds a stream open while the load is on, and closes it when it goes off.
  for (int w = 0; w < watchers; ++w) {
    threads.emplace_back([&] {
      LowerThisThread(client_nice, client_idle);
      auto client = tandem::cli::NewGrpcCoordinatorClient(cluster.address(), absl::Seconds(10),
                                                          absl::Hours(1));
      while (!stop.load()) {
        if (!loaded.load()) {
          std::this_thread::sleep_for(std::chrono::milliseconds(20));
          continue;
        }
        absl::Status s = client->WatchJob(*id, [&](const tandem::v1::JobEvent&) {
          events.fetch_add(1);
          return loaded.load() && !stop.load();
        });
        if (!s.ok()) watch_errors.fetch_add(1);
      }
    });
  }
  constexpr int kCallers = 10;
  for (int c = 0; c < kCallers; ++c) {
    threads.emplace_back([&, c] {
      LowerThisThread(client_nice, client_idle);
      auto client = tandem::cli::NewGrpcCoordinatorClient(cluster.address(), absl::Seconds(10),
                                                          absl::Hours(1));
      const auto every = std::chrono::duration_cast<Clock::duration>(
          std::chrono::duration<double>(kCallers / static_cast<double>(rate)));
      auto next = Clock::now();
      for (int64_t n = c; !stop.load(); ++n) {
        if (!loaded.load()) {
          std::this_thread::sleep_for(std::chrono::milliseconds(20));
          next = Clock::now();
          continue;
        }
        absl::Status s;
        switch (n % 3) {
          case 0:  // what `tandem status JOB` asks for
            s = client->GetJob(*id, tandem::cli::kRecentSteps).status();
            break;
          case 1:
            s = client->ListJobs().status();
            break;
          default:
            s = client->ListWorkers().status();
        }
        rpcs.fetch_add(1);
        if (!s.ok()) rpc_errors.fetch_add(1);
        next += every;
        std::this_thread::sleep_until(next);
      }
    });
  }

  const int kLoadedWindows = windows;
  const double window = seconds / kLoadedWindows;
  std::vector<double> unloaded_s, loaded_s;
  double load_seconds = 0;
  unloaded_s.push_back(MeasureStepSeconds(cluster, *id, window));
  for (int w = 0; w < kLoadedWindows; ++w) {
    loaded.store(true);
    const auto t0 = Clock::now();
    loaded_s.push_back(MeasureStepSeconds(cluster, *id, window));
    load_seconds += std::chrono::duration<double>(Clock::now() - t0).count();
    loaded.store(false);
    unloaded_s.push_back(MeasureStepSeconds(cluster, *id, window));
  }
  const int64_t calls = rpcs.load();
  stop.store(true);
  for (auto& t : threads) t.join();
  (void)cluster.Cancel(*id);

  std::printf(
      "status load: %d WatchJob streams + %d status RPC/s target, %d x %.0f s loaded, "
      "client %s, coordinator --rpc-nice %s, CPUs: coordinator and clients %s, workers %s\n",
      watchers, rate, kLoadedWindows, window,
      client_idle ? "SCHED_IDLE" : absl::StrCat("nice ", client_nice).c_str(),
      rpc_nice.empty() ? "default (10)" : rpc_nice.c_str(),
      coordinator_cpus.empty() ? "all" : coordinator_cpus.c_str(),
      worker_cpus.empty() ? "all" : worker_cpus.c_str());
  std::printf("  status RPCs: %lld in %.1f s = %.0f/s, errors %lld\n",
              static_cast<long long>(calls), load_seconds, calls / load_seconds,
              static_cast<long long>(rpc_errors.load()));
  std::printf("  watch events delivered: %lld, broken streams %lld\n",
              static_cast<long long>(events.load()), static_cast<long long>(watch_errors.load()));
  double ratio_sum = 0;
  std::vector<double> ratios;
  for (int w = 0; w < kLoadedWindows; ++w) {
    const double around = (unloaded_s[w] + unloaded_s[w + 1]) / 2;
    const double ratio = around > 0 ? loaded_s[w] / around : 0.0;
    ratio_sum += ratio;
    ratios.push_back(ratio);
    std::printf("  window %d: step %.2f ms unloaded before, %.2f ms loaded, %.2f ms after: %.3f\n",
                w + 1, unloaded_s[w] * 1e3, loaded_s[w] * 1e3, unloaded_s[w + 1] * 1e3, ratio);
  }
  std::sort(ratios.begin(), ratios.end());
  const size_t n = ratios.size();
  const double median = n % 2 == 1 ? ratios[n / 2] : (ratios[n / 2 - 1] + ratios[n / 2]) / 2;
  std::printf("  loaded / unloaded, mean over the windows: %.3f, median %.3f\n",
              ratio_sum / kLoadedWindows, median);
  return rpc_errors.load() == 0 && watch_errors.load() == 0 ? 0 : 1;
}
