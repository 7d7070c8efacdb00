#include "common/health.h"

#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>

#include <chrono>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace tandem {

absl::StatusOr<std::unique_ptr<HealthServer>> HealthServer::Start(const std::string& address,
                                                                  const std::string& service) {
  // Process-wide switch; every server built after it gets its own stock health service.
  grpc::EnableDefaultHealthCheckService(true);
  auto unimplemented = std::make_unique<grpc::CallbackGenericService>();
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(address, grpc::InsecureServerCredentials(), &port);
  builder.RegisterCallbackGenericService(unimplemented.get());
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0 || server->GetHealthCheckService() == nullptr) {
    return absl::UnavailableError(absl::StrCat("cannot serve health on ", address));
  }
  grpc::HealthCheckServiceInterface* health = server->GetHealthCheckService();
  health->SetServingStatus(false);  // "" and every service set so far
  health->SetServingStatus(kLivenessService, true);
  return std::unique_ptr<HealthServer>(
      new HealthServer(std::move(unimplemented), std::move(server), port, service));
}

HealthServer::HealthServer(std::unique_ptr<grpc::CallbackGenericService> unimplemented,
                           std::unique_ptr<grpc::Server> server, int port, std::string service)
    : unimplemented_(std::move(unimplemented)),
      port_(port),
      service_(std::move(service)),
      server_(std::move(server)) {}

HealthServer::~HealthServer() { Shutdown(); }

void HealthServer::SetReady(bool ready) {
  absl::MutexLock lock(&mu_);
  if (server_ == nullptr) return;
  grpc::HealthCheckServiceInterface* health = server_->GetHealthCheckService();
  health->SetServingStatus("", ready);
  health->SetServingStatus(service_, ready);
}

void HealthServer::Shutdown() {
  absl::MutexLock lock(&mu_);
  if (server_ == nullptr) return;
  // The stock service's Shutdown sets every name NOT_SERVING and ignores later updates.
  server_->GetHealthCheckService()->Shutdown();
  server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  server_.reset();
}

}  // namespace tandem
