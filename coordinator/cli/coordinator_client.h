// The coordinator's client API as the CLI sees it: an interface, so that the commands are
// tested against a fake, with one gRPC implementation (NewGrpcCoordinatorClient).
#ifndef TANDEM_COORDINATOR_CLI_COORDINATOR_CLIENT_H_
#define TANDEM_COORDINATOR_CLI_COORDINATOR_CLIENT_H_

#include <memory>
#include <string>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/tls.h"
#include "tandem/v1/coordinator.pb.h"

namespace tandem::cli {

// Not thread-safe: one command at a time. Every call carries a deadline and the protocol
// version. Errors are the server's status; UNAVAILABLE means the coordinator could not be
// reached.
class CoordinatorClient {
 public:
  virtual ~CoordinatorClient() = default;

  // Returns the new job's id; INVALID_ARGUMENT names the bad field of the spec.
  virtual absl::StatusOr<std::string> SubmitJob(const std::string& spec_yaml) = 0;
  // The job with every retained step summary in its history.
  absl::StatusOr<v1::Job> GetJob(const std::string& job_id) { return GetJob(job_id, 0); }
  // The job with at most the latest `history_limit` step summaries (0: all retained).
  virtual absl::StatusOr<v1::Job> GetJob(const std::string& job_id, uint32_t history_limit) = 0;
  virtual absl::StatusOr<v1::ListJobsResponse> ListJobs() = 0;
  virtual absl::StatusOr<v1::Job> CancelJob(const std::string& job_id) = 0;
  virtual absl::StatusOr<v1::ListWorkersResponse> ListWorkers() = 0;
  virtual absl::StatusOr<v1::WorkerInfo> GetWorker(const std::string& worker_id) = 0;

  // Streams the job's events to `on_event` until the server ends the stream (OK: the job
  // ended) or `on_event` returns false (OK: the stream is cancelled). A broken stream
  // returns its error.
  virtual absl::Status WatchJob(const std::string& job_id,
                                absl::FunctionRef<bool(const v1::JobEvent&)> on_event) = 0;

  // The layer profile of `spec`'s model on a worker of its device kind (cached by the
  // coordinator, or measured on an idle worker: this may take a while, so the call has its own
  // long deadline).
  virtual absl::StatusOr<v1::ModelProfile> ProfileModel(const v1::JobSpec& spec, bool refresh) = 0;

  // The planner's search for `spec` as `pipeline.plan: auto` would run it on the coordinator
  // (Coordinator.PlanJob): every candidate, fastest first, and the choice. It may profile the
  // model at several micro-batch sizes, so the call has the same long deadline.
  virtual absl::StatusOr<v1::PlanJobResponse> PlanJob(const v1::JobSpec& spec) = 0;

  // A rendered timeline of kept steps (Coordinator.GetJobTrace); the client sets the
  // protocol version. NOT_FOUND names the step that is not kept and the steps that are.
  virtual absl::StatusOr<v1::GetJobTraceResponse> GetJobTrace(
      const v1::GetJobTraceRequest& request) = 0;

  // Streams the export of the job's latest checkpoint to `on_chunk` (an error from it stops
  // the stream and is returned).
  virtual absl::Status ExportModel(
      const std::string& job_id,
      absl::FunctionRef<absl::Status(const v1::ExportChunk&)> on_chunk) = 0;
};

// A client of the coordinator at `address` (HOST:PORT), plaintext or with `security` (TLS,
// and a client certificate or a bearer token). Unary calls time out after `timeout`; the
// watch stream after `watch_timeout`.
std::unique_ptr<CoordinatorClient> NewGrpcCoordinatorClient(const std::string& address,
                                                            absl::Duration timeout,
                                                            absl::Duration watch_timeout,
                                                            const ChannelSecurity& security = {});

}  // namespace tandem::cli

#endif  // TANDEM_COORDINATOR_CLI_COORDINATOR_CLIENT_H_
