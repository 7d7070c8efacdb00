// gRPC adapters of the coordinator: they check the protocol version, validate, hand the call
// to the component that owns the state (JobStore, WorkerRegistry, Scheduler, RendezvousStore)
// and translate the result. No business logic lives here.
#ifndef TANDEM_COORDINATOR_SERVICES_H_
#define TANDEM_COORDINATOR_SERVICES_H_

#include <grpcpp/impl/codegen/service_type.h>

#include <memory>

#include "coordinator/checkpoint_store.h"
#include "coordinator/job_store.h"
#include "coordinator/profile_store.h"
#include "coordinator/rendezvous_store.h"
#include "coordinator/scheduler.h"
#include "coordinator/speed_check_memo.h"
#include "coordinator/worker_client.h"
#include "coordinator/worker_registry.h"

namespace tandem::coordinator {

struct ServiceEnv {
  JobStore* store = nullptr;
  WorkerRegistry* registry = nullptr;
  Scheduler* scheduler = nullptr;
  RendezvousStore* rendezvous = nullptr;
  CheckpointStore* checkpoints = nullptr;
  ProfileStore* profiles = nullptr;             // ProfileModel: UNAVAILABLE without
  StageWorkerClientFactory* clients = nullptr;  // ... and these
  // ProfileModel and PlanJob speed-check the cached profiles they serve, as a job's planning
  // does (coordinator --profile-speed-check); null: served as cached.
  SpeedCheckMemo* speed_checks = nullptr;
};

std::unique_ptr<grpc::Service> MakeCoordinatorService(const ServiceEnv& env);
std::unique_ptr<grpc::Service> MakeWorkerRegistryService(const ServiceEnv& env);
std::unique_ptr<grpc::Service> MakeRendezvousService(const ServiceEnv& env);
std::unique_ptr<grpc::Service> MakeCheckpointsService(const ServiceEnv& env);

}  // namespace tandem::coordinator

#endif  // TANDEM_COORDINATOR_SERVICES_H_
