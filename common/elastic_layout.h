// Elastic training (JobSpec.elastic): which layout an elastic job runs on with the workers it
// can have. The global batch is kept (the losses do not depend on the layout, so a resized run
// trains as an unresized one would); what changes is how many pipelines (replicas) and stages
// share it.
//
// The rule, without measurements (the planner's pipeline.plan: auto, where set, re-plans the
// chosen worker count from its profile afterwards):
//   1. use as many workers as can be used: from min(available, the job's maximum) down to
//      elastic.min_workers, the first count that has a layout that runs;
//   2. among that count's stages x replicas, the stage count nearest the one as written (a
//      stage's layers, so its memory, change least; fewer stages first at equal distance), then
//      fewer replicas (less reduction traffic);
//   3. a layout runs when it passes the spec validation and PlanPipeline (the schedule's
//      constraints, the partition, the memory budget): stages <= layers, replicas dividing the
//      global batch, each replica's share in micro-batches of the size as written where they
//      divide it (WithFactorization).
// Manual cut points (pipeline.cuts) fit one stage count only: such a job can change replicas
// only.
//
// Pure functions.
#ifndef TANDEM_COMMON_ELASTIC_LAYOUT_H_
#define TANDEM_COMMON_ELASTIC_LAYOUT_H_

#include "absl/status/statusor.h"
#include "tandem/v1/spec.pb.h"

namespace tandem {

// The most workers an elastic job takes: elastic.max_workers, or stages x replicas as written
// when that is 0. For a job without elastic: stages x replicas.
int ElasticMaxWorkers(const v1::JobSpec& written);

// `written` (defaults filled in, valid; IsElastic, else it takes exactly its gang) re-laid-out for at most `available`
// workers, by the rule above. FAILED_PRECONDITION when fewer than elastic.min_workers are
// available, or when no count in [min_workers, available] has a layout that runs (the message
// says which counts were tried and why the nearest failed).
absl::StatusOr<v1::JobSpec> ElasticLayoutFor(const v1::JobSpec& written, int available);

}  // namespace tandem

#endif  // TANDEM_COMMON_ELASTIC_LAYOUT_H_
