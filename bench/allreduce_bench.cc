// Tandem's gradient reduction (GradReducer: a ring all-reduce over GlooTransport) between two
// CPU workers on loopback: two processes (this one and a forked child), each a rank of one
// data-parallel group that meets through a gloo FileStore in a fresh temporary directory.
//
//   build/bin/bench_allreduce [--sizes-mib 16,64,256] [--repeats 5]
//
// Per size: one warm-up reduction, then `repeats` timed ones (each after a 4-byte reduction
// that lines the ranks up), median; the bandwidth printed is the algorithm bandwidth,
// bytes / seconds (decimal GB/s), as torch.distributed benchmarks print it (the peer:
// bench/torch_allreduce.py). The result is checked (rank 0 holds 1s, rank 1 2s: every element
// must be 3). Rank 0 prints one JSON line per size:
// {"impl":"tandem","bytes":N,"seconds":S,"gbps":G}
#include <gloo/rendezvous/file_store.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/types/span.h"
#include "worker/grad_reducer.h"
#include "worker/transport/gloo_transport.h"

namespace {

using tandem::worker::GlooTransport;
using tandem::worker::GlooTransportOptions;
using tandem::worker::GradBucket;
using tandem::worker::GradReducer;
using Clock = std::chrono::steady_clock;

int Run(int rank, const std::string& store_dir, const std::vector<int64_t>& sizes_mib,
        int repeats) {
  gloo::rendezvous::FileStore store(store_dir);
  GlooTransportOptions o;
  o.rank = rank;
  o.size = 2;
  o.hostname = "127.0.0.1";
  o.connect_timeout = std::chrono::milliseconds(30000);
  o.op_timeout = std::chrono::milliseconds(120000);
  auto t = GlooTransport::Connect(o, store);
  if (!t.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", rank, t.status().ToString().c_str());
    return 1;
  }
  GradReducer reducer(*std::move(t));
  std::vector<float> token(1);
  auto reduce = [&](std::vector<float>& data) -> bool {
    if (!reducer.BeginStep().ok()) return false;
    reducer.Post(GradBucket{0, 0, {absl::MakeSpan(data)}});
    const absl::Status s = reducer.Wait();
    if (!s.ok()) std::fprintf(stderr, "rank %d: %s\n", rank, s.ToString().c_str());
    return s.ok();
  };
  for (int64_t mib : sizes_mib) {
    const size_t count = static_cast<size_t>(mib) << 18;  // floats
    std::vector<float> data(count, 0.0f);
    if (!reduce(data)) return 1;  // warm-up (pages touched, connections warm)
    std::vector<double> times;
    for (int i = 0; i < repeats; ++i) {
      std::fill(data.begin(), data.end(), static_cast<float>(rank + 1));
      if (!reduce(token)) return 1;  // line up
      const auto start = Clock::now();
      if (!reduce(data)) return 1;
      times.push_back(std::chrono::duration<double>(Clock::now() - start).count());
      if (std::any_of(data.begin(), data.end(), [](float v) { return v != 3.0f; })) {
        std::fprintf(stderr, "rank %d: wrong sum at %lld MiB\n", rank, static_cast<long long>(mib));
        return 1;
      }
    }
    std::sort(times.begin(), times.end());
    const double median = times[times.size() / 2];
    const double bytes = static_cast<double>(count * sizeof(float));
    if (rank == 0) {
      std::printf("{\"impl\":\"tandem\",\"bytes\":%.0f,\"seconds\":%.6f,\"gbps\":%.3f}\n", bytes,
                  median, bytes / median / 1e9);
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int64_t> sizes_mib = {16, 64, 256};
  int repeats = 5;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (arg == "--sizes-mib") {
      sizes_mib.clear();
      for (absl::string_view s : absl::StrSplit(value(), ',')) {
        int64_t v = 0;
        if (!absl::SimpleAtoi(s, &v) || v < 1 || v > 4096) {
          std::fprintf(stderr, "--sizes-mib: expected MiB in [1, 4096], got '%s'\n",
                       std::string(s).c_str());
          return 2;
        }
        sizes_mib.push_back(v);
      }
    } else if (arg == "--repeats") {
      if (!absl::SimpleAtoi(value(), &repeats) || repeats < 1 || repeats > 1000) {
        std::fprintf(stderr, "--repeats: expected 1..1000\n");
        return 2;
      }
    } else {
      std::fprintf(stderr, "usage: %s [--sizes-mib 16,64,256] [--repeats 5]\n", argv[0]);
      return 2;
    }
  }
  char dir_template[] = "/tmp/tandem-allreduce-XXXXXX";
  if (mkdtemp(dir_template) == nullptr) {
    std::perror("mkdtemp");
    return 1;
  }
  const std::string dir = dir_template;
  std::fflush(stdout);
  const pid_t child = fork();
  if (child < 0) {
    std::perror("fork");
    return 1;
  }
  if (child == 0) _exit(Run(1, dir, sizes_mib, repeats));
  const int rc = Run(0, dir, sizes_mib, repeats);
  int status = 0;
  waitpid(child, &status, 0);
  std::filesystem::remove_all(dir);
  const int child_rc = WIFEXITED(status) ? WEXITSTATUS(status) : 1;
  return rc != 0 ? rc : child_rc;
}
