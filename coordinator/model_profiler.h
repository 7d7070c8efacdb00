// Getting a model's layer profile (for partition: profile and for `tandem plan`): from the
// ProfileStore when a profile of the same key exists, else measured on a worker through
// StageWorker.ProfileLayers (the embedding, one block and the head; blocks cost the same) and
// kept in the store. No gRPC here: workers are reached through StageWorkerClient.
#ifndef TANDEM_COORDINATOR_MODEL_PROFILER_H_
#define TANDEM_COORDINATOR_MODEL_PROFILER_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "coordinator/profile_store.h"
#include "coordinator/worker_client.h"
#include "coordinator/worker_registry.h"
#include "tandem/v1/common.pb.h"
#include "tandem/v1/spec.pb.h"

namespace tandem::coordinator {

// Measures the profile of `spec` on `worker` (which must be idle) and puts it in `store`
// (optional). Errors name the worker.
absl::StatusOr<v1::ModelProfile> MeasureProfile(const v1::JobSpec& spec, const WorkerRecord& worker,
                                                StageWorkerClient& client, absl::Duration timeout,
                                                ProfileStore* store);

// For `tandem plan`: a cached profile for any registered worker of the spec's device kind, or
// one measured on an idle such worker, which is held (BUSY, job "profile") meanwhile so that
// the scheduler does not hand it to a job. FAILED_PRECONDITION when no worker of that kind is
// registered; UNAVAILABLE when none is idle.
absl::StatusOr<v1::ModelProfile> ProfileModel(const v1::JobSpec& spec, WorkerRegistry& registry,
                                              StageWorkerClientFactory& clients,
                                              ProfileStore& store, absl::Duration timeout,
                                              bool refresh);

}  // namespace tandem::coordinator

#endif  // TANDEM_COORDINATOR_MODEL_PROFILER_H_
