// Peer recovery on the coordinator (docs/architecture.md, "Peer recovery"): which surviving
// workers of a failed data-parallel run hold every stage's state, and from whom each worker of
// the next run reads its stage. Pure functions; the runner and the planner call them.
#ifndef TANDEM_COORDINATOR_PEER_RECOVERY_H_
#define TANDEM_COORDINATOR_PEER_RECOVERY_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/model_desc.h"
#include "common/pipeline_plan.h"
#include "coordinator/worker_registry.h"
#include "tandem/v1/coordinator.pb.h"
#include "tandem/v1/spec.pb.h"

namespace tandem::coordinator {

// Whether a run of `spec` can resume from its replicas: R > 1 and the optimizer state whole on
// every replica (a sharded one has a segment per replica, lost with its worker).
bool PeerRecoveryApplies(const v1::JobSpec& spec);

// The state that the surviving workers of a failed run kept after `step`: `workers` is the gang
// by rank (replica x P + pipeline rank), `lost[r]` whether rank r's worker is gone, `plan` the
// run's pipeline (its ranks' stages and layer ranges), `replicas` R. nullopt, with `why_not`
// set, when some pipeline rank has no surviving replica or `step` < 0 (nothing trained or
// restored to keep).
std::optional<v1::PeerState> SurvivorsState(int64_t step, const std::vector<WorkerRecord>& workers,
                                            const std::vector<bool>& lost, const PipelinePlan& plan,
                                            int replicas, std::string* why_not);

// The order in which a worker whose stages hold `layers` asks the holders for its tensors:
// those whose layers overlap first (in the state's order), then the rest (a tied parameter is
// kept by the first stage only). Addresses.
std::vector<std::string> PeerOrderFor(const v1::PeerState& state,
                                      const std::vector<LayerRange>& layers);

// The holders of `state` that are not workers of `gang`: once the gang has restored from
// them, their kept copies are of no further use (the gang's own workers drop theirs at their
// first step), so the runner tells them to drop it rather than hold it until another job
// configures them (a worker left out of a shrunken elastic gang, say).
std::vector<v1::StateHolder> HoldersOutside(const v1::PeerState& state,
                                            const std::vector<WorkerRecord>& gang);

}  // namespace tandem::coordinator

#endif  // TANDEM_COORDINATOR_PEER_RECOVERY_H_
