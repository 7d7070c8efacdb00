// The step relay's tree (see docs/architecture.md, "The step relay"): which workers of a gang
// the coordinator calls for a step, and which workers each of them forwards the step to
// (RunStepRequest.relay). A gang of N >= `min_workers` workers is cut into groups of
// ceil(sqrt(N)) workers, consecutive in (node, rank) order, so that a group's forwarded calls
// stay on a node where they can; the first worker of each group is called by the coordinator
// and forwards to the rest. The coordinator then makes about sqrt(N) calls per step, each
// relaying worker about sqrt(N) more, and every step's reports still reach the coordinator, one
// per rank.
//
// Pure functions; thread-compatible.
#ifndef TANDEM_COORDINATOR_STEP_RELAY_PLAN_H_
#define TANDEM_COORDINATOR_STEP_RELAY_PLAN_H_

#include <string>
#include <vector>

#include "tandem/v1/worker.pb.h"

namespace tandem::coordinator {

// A worker of the gang as the relay sees it.
struct RelayMember {
  std::string address;  // its StageWorker API address
  std::string node;     // where it runs (groups stay within a node where they can)
};

struct RelayGroup {
  int root = -1;                        // the rank the coordinator calls
  std::vector<v1::StepRelay> children;  // what it forwards to (RunStepRequest.relay)
};

// The groups for `members` (by rank). Empty when the relay is off: min_workers <= 0, or fewer
// members than min_workers (the coordinator then calls every worker itself).
std::vector<RelayGroup> PlanStepRelay(const std::vector<RelayMember>& members, int min_workers);

}  // namespace tandem::coordinator

#endif  // TANDEM_COORDINATOR_STEP_RELAY_PLAN_H_
