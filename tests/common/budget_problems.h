// Partition problems that make a per-worker memory budget hard to meet, shared by the
// partitioner's test and bench_partition_budget: `layers` layers whose seconds ([1, 2)) and
// static bytes ([10, 30) MiB) are drawn independently, so that balancing bytes unbalances time;
// heavy first and last layers (200 and 250 MiB, as an embedding and a head); activations
// (1-5 MiB) weighted by 1F1B's live micro-batches; on 8 workers with 4 stages each (every
// third trial) or 2, interleaved, or V for odd trials with 2.
#ifndef TANDEM_TESTS_COMMON_BUDGET_PROBLEMS_H_
#define TANDEM_TESTS_COMMON_BUDGET_PROBLEMS_H_

#include <algorithm>
#include <cstdint>
#include <random>

#include "common/partitioner.h"

namespace tandem::testing {

inline PartitionProblem DrawBudgetProblem(int trial, int layers, std::mt19937& rng) {
  PartitionProblem p;
  const int workers = 8, v = trial % 3 == 0 ? 4 : 2;
  const bool v_shape = trial % 2 == 1 && v == 2;
  p.num_stages = workers * v;
  for (int l = 0; l < layers; ++l) {
    LayerCost cost;
    cost.seconds = 1.0 + static_cast<double>(rng() % 100) / 100.0;
    cost.static_bytes = static_cast<int64_t>(10 + rng() % 20) << 20;
    cost.activation_bytes = static_cast<int64_t>(1 + rng() % 5) << 20;
    cost.output_bytes = int64_t{1} << 20;
    p.layers.push_back(cost);
  }
  p.layers.front().static_bytes = int64_t{200} << 20;
  p.layers.back().static_bytes = int64_t{250} << 20;
  for (int s = 0; s < p.num_stages; ++s) {
    p.rank_of_stage.push_back(v_shape && s >= workers ? p.num_stages - 1 - s : s % workers);
    p.live_micro_batches.push_back(std::max(1, p.num_stages - s));
  }
  return p;
}

}  // namespace tandem::testing

#endif  // TANDEM_TESTS_COMMON_BUDGET_PROBLEMS_H_
