// The partitioner under a tight per-worker memory budget with several stages per worker
// (interleaved and V placements): how often it finds a cut that fits, how fast that cut is
// against the bound without the workers' coupling, and how long the search takes.
//
//   ninja -C build bench_partition_budget && build/bin/bench_partition_budget [--layers N]
//
// Problems: N layers (default 130) with seconds in [1, 2) and static bytes in [10, 30) MiB
// drawn independently (so that balancing bytes unbalances time), heavy first and last
// layers, activations weighted by 1F1B's live micro-batches, on 8 workers with 2 or 4 stages
// each, interleaved or V (v = 2); 40 of them from a fixed seed. For each, searches at budgets
// that are shares of what the uniform cut needs on its fullest worker (a reference that does
// not depend on the search, so that versions of it compare), and the least budget that a
// refusal names. Bound: the same problem with every stage on a worker of its own.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "common/partitioner.h"
#include "tests/common/budget_problems.h"

namespace {

using tandem::MinMaxPartition;
using tandem::Partition;
using tandem::PartitionProblem;

double Quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(q * static_cast<double>(v.size() - 1))];
}

}  // namespace

int main(int argc, char** argv) {
  int layers = 130;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--layers") == 0 && i + 1 < argc) {
      layers = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: %s [--layers N]\n", argv[0]);
      return 2;
    }
  }
  if (layers < 32) {
    std::fprintf(stderr, "--layers must be at least 32 (the stages of the largest problem)\n");
    return 2;
  }
  constexpr int kProblems = 40;
  // Budgets as shares of what the uniform cut (equal layer counts) needs on its fullest worker,
  // which does not depend on the partitioner's search.
  const std::vector<double> shares = {0.65, 0.70, 0.75, 0.80, 0.90, 1.00};
  const size_t m = shares.size();
  std::vector<std::vector<double>> ratio(m), ms(m);
  std::vector<int> fits(m, 0);
  std::vector<double> named_share;
  std::mt19937 rng(7);
  for (int trial = 0; trial < kProblems; ++trial) {
    PartitionProblem p = tandem::testing::DrawBudgetProblem(trial, layers, rng);
    std::vector<tandem::LayerRange> uniform;
    for (int s = 0; s < p.num_stages; ++s) {
      uniform.push_back({s * layers / p.num_stages, (s + 1) * layers / p.num_stages});
    }
    const Partition even = *tandem::EvaluatePartition(p, uniform);
    const double reference =
        static_cast<double>(*std::max_element(even.worker_bytes.begin(), even.worker_bytes.end()));
    p.memory_budget_bytes = 1;  // refused: the payload is the least budget it knows a cut for
    named_share.push_back(
        static_cast<double>(tandem::SmallestBudgetBytes(MinMaxPartition(p).status())) / reference);
    PartitionProblem relaxed = p;  // the bound: stages on workers of their own
    relaxed.rank_of_stage.clear();
    for (size_t k = 0; k < m; ++k) {
      p.memory_budget_bytes = static_cast<int64_t>(reference * shares[k]);
      relaxed.memory_budget_bytes = p.memory_budget_bytes;
      const auto start = std::chrono::steady_clock::now();
      absl::StatusOr<Partition> got = MinMaxPartition(p);
      ms[k].push_back(
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
              .count());
      absl::StatusOr<Partition> bound = MinMaxPartition(relaxed);
      if (!got.ok() || !bound.ok()) continue;
      ++fits[k];
      ratio[k].push_back(got->bottleneck_seconds / bound->bottleneck_seconds);
    }
  }
  std::printf("%d problems, %d layers, 16 or 32 stages on 8 workers (interleaved or V)\n",
              kProblems, layers);
  std::printf("least budget a refusal names, / the uniform cut's: median %.3f, max %.3f\n",
              Quantile(named_share, 0.5), Quantile(named_share, 1.0));
  std::printf("%-26s %6s %28s %20s\n", "budget / uniform cut's", "fits",
              "bottleneck / bound med max", "search ms med max");
  for (size_t k = 0; k < m; ++k) {
    std::printf("%-26.2f %3d/%d %14.3f %6.3f %14.1f %6.1f\n", shares[k], fits[k], kProblems,
                Quantile(ratio[k], 0.5), Quantile(ratio[k], 1.0), Quantile(ms[k], 0.5),
                Quantile(ms[k], 1.0));
  }
  return 0;
}
