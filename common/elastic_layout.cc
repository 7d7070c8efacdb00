#include "common/elastic_layout.h"

#include <algorithm>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/limits.h"
#include "common/model_desc.h"
#include "common/pipeline_plan.h"
#include "common/planner.h"
#include "common/spec.h"
#include "common/spec_validation.h"

namespace tandem {

int ElasticMaxWorkers(const v1::JobSpec& written) {
  if (IsElastic(written) && written.elastic().max_workers() > 0) {
    return written.elastic().max_workers();
  }
  return GangSize(written);
}

absl::StatusOr<v1::JobSpec> ElasticLayoutFor(const v1::JobSpec& written, int available) {
  const int least =
      written.has_elastic() ? std::max(1, written.elastic().min_workers()) : GangSize(written);
  const int most = std::min(available, ElasticMaxWorkers(written));
  if (most < least) {
    return absl::FailedPreconditionError(absl::StrCat(
        "elastic: ", available, " worker(s) available, the job needs at least ", least));
  }
  const int stages = written.pipeline().stages();
  const int64_t batch = EffectiveBatch(written);
  std::string nearest_error;
  for (int n = most; n >= least; --n) {
    std::vector<std::pair<int, int>> layouts;  // (stages, replicas)
    for (int p = 1; p <= n; ++p) {
      if (n % p != 0) continue;
      const int r = n / p;
      if (r > kMaxReplicas || batch % r != 0) continue;
      layouts.push_back({p, r});
    }
    std::sort(layouts.begin(), layouts.end(), [&](const auto& a, const auto& b) {
      const int da = std::abs(a.first - stages), db = std::abs(b.first - stages);
      if (da != db) return da < db;
      if (a.first != b.first) return a.first < b.first;
      return a.second < b.second;
    });
    for (const auto& [p, r] : layouts) {
      v1::JobSpec candidate = p == stages && r == std::max(1, written.pipeline().replicas())
                                  ? written
                                  : WithFactorization(written, p, r);
      absl::Status s = ValidateJobSpec(candidate);
      if (s.ok()) s = PlanPipeline(candidate, nullptr).status();
      if (s.ok()) return candidate;
      if (nearest_error.empty()) {
        nearest_error = absl::StrCat(p, " stage(s) x ", r, " replica(s): ", s.message());
      }
    }
  }
  return absl::FailedPreconditionError(
      absl::StrCat("elastic: no layout of ",
                   least == most ? absl::StrCat(most) : absl::StrCat(least, " to ", most),
                   " worker(s) runs at the global batch of ", batch, " sequences",
                   nearest_error.empty() ? "" : absl::StrCat(" (", nearest_error, ")")));
}

}  // namespace tandem
