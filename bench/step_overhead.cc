// Coordinator overhead per step: for each step, the wall time from sending RunStep to every
// worker until all reports are in, minus the slowest worker's own execution time. Runs a real
// coordinator and real workers on 127.0.0.1 with a model small enough that the overhead is
// visible, and prints p50/p99 over the steps for P = 1, 2 and 4 stages.
//
//   build/bin/bench_step_overhead [--steps N]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/integration/harness.h"

namespace {

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(p / 100.0 * (v.size() - 1) + 0.5));
  return v[i];
}

std::string Spec(int stages, int steps) {
  return absl::StrCat("name: overhead\nsteps: ", steps,
                      "\nmodel:\n  arch: mlp_lm\n  n_layer: 2\n  d_model: 16\n  d_embed: 4\n  context: 4\n"
                      "pipeline:\n  stages: ",
                      stages, "\n  micro_batch_size: 2\n  micro_batches: ", stages * 2, "\n");
}

}  // namespace

int main(int argc, char** argv) {
  int steps = 300;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], "--steps") == 0) steps = std::atoi(argv[i + 1]);
  }
  using tandem::testing::Cluster;
  Cluster::Options options;
  options.workers = 4;
  Cluster cluster(options);
  if (absl::Status s = cluster.Start(); !s.ok()) {
    std::fprintf(stderr, "cannot start cluster: %s\n", s.ToString().c_str());
    return 1;
  }
  std::printf(
      "coordinator overhead per step (%d steps; RunStep fan-out to all reports, minus "
      "the slowest worker's execution)\n",
      steps);
  std::printf("%-7s %12s %12s %12s %14s\n", "stages", "p50 us", "p99 us", "max us", "step p50 us");
  for (int p : {1, 2, 4}) {
    auto id = cluster.Submit(Spec(p, steps));
    if (!id.ok()) {
      std::fprintf(stderr, "submit: %s\n", id.status().ToString().c_str());
      return 1;
    }
    auto job = cluster.WaitForEnd(*id, std::chrono::seconds(600));
    if (!job.ok() || job->state() != tandem::v1::SUCCEEDED) {
      std::fprintf(stderr, "job did not succeed: %s\n",
                   job.ok() ? job->reason().c_str() : job.status().ToString().c_str());
      return 1;
    }
    std::vector<double> overhead, step;
    // Skip the first steps (connection warm-up).
    for (int i = 5; i < job->history_size(); ++i) {
      overhead.push_back(job->history(i).coordinator_overhead_seconds() * 1e6);
      step.push_back(job->history(i).step_seconds() * 1e6);
    }
    std::printf("%-7d %12.0f %12.0f %12.0f %14.0f\n", p, Percentile(overhead, 50),
                Percentile(overhead, 99), Percentile(overhead, 100), Percentile(step, 50));
  }
  return 0;
}
