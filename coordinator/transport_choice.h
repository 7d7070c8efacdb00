// pipeline.transport resolved for one run of a job on its gang of workers: the data plane every
// rank of the run uses (written into the spec each StageProgram carries) and the one the link
// probe between two of its workers times.
//
// NCCL refuses a communicator with the same device twice, so two cuda workers on one GPU must
// use the host-staged transport (worker/transport/host_staged_transport.h: device -> host ->
// Gloo -> host -> device). Pure functions: no I/O, thread-safe.
#ifndef TANDEM_COORDINATOR_TRANSPORT_CHOICE_H_
#define TANDEM_COORDINATOR_TRANSPORT_CHOICE_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "coordinator/worker_registry.h"
#include "tandem/v1/spec.pb.h"

namespace tandem::coordinator {

// Whether two cuda workers use the same GPU: both registered a device uuid and they are equal;
// or, when either did not (an older worker), both name a host and the same host and device
// string ("cuda:0"). Workers whose host is unknown are taken to be apart. False for cpu workers.
bool ShareDevice(const WorkerRecord& a, const WorkerRecord& b);

// The transport of a run of `spec` on `gang` (its workers in rank order): "gloo" or "nccl".
//   device cpu                 -> "gloo";
//   cuda, transport gloo       -> "gloo" (host-staged);
//   cuda, transport auto       -> "gloo" when any two workers of the gang ShareDevice, else "nccl";
//   cuda, transport nccl       -> "nccl"; FAILED_PRECONDITION when two workers share a device:
//     "pipeline.transport: nccl: workers w-1 and w-2 share GPU-... (cuda:0 on host h); NCCL
//     cannot put two ranks on one device: use pipeline.transport: gloo or auto".
// INVALID_ARGUMENT for a transport other than auto, nccl and gloo (ValidateJobSpec refuses it).
absl::StatusOr<std::string> ChooseTransport(const v1::JobSpec& spec,
                                            const std::vector<WorkerRecord>& gang);

}  // namespace tandem::coordinator

#endif  // TANDEM_COORDINATOR_TRANSPORT_CHOICE_H_
