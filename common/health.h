// A plaintext gRPC server on its own port that serves only grpc.health.v1 (gRPC's stock
// health service), for Kubernetes' gRPC probes: they speak plaintext, so this port keeps
// answering when the API port moves to TLS, and it says whether the daemon is ready, not only
// whether its port accepts connections.
//
// The service names it answers:
//   ""          SERVING once the daemon is ready (SetReady(true)), NOT_SERVING before, in
//               between (SetReady(false)) and after Shutdown.
//   `service`   the same, except NOT_FOUND until the daemon is ready for the first time; so a
//               probe that names it never sees the instant after start-up in which the stock
//               service still holds its built-in SERVING for "". Readiness probes use it.
//   "liveness"  SERVING from start to Shutdown: the process is up and its gRPC server answers.
//               Liveness probes use it, so that a worker waiting for its coordinator is not
//               restarted for waiting.
// Thread-safe.
#ifndef TANDEM_COMMON_HEALTH_H_
#define TANDEM_COMMON_HEALTH_H_

#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace grpc {
class CallbackGenericService;
class Server;
}  // namespace grpc

namespace tandem {

class HealthServer {
 public:
  static constexpr char kLivenessService[] = "liveness";

  // Serves on `address` (HOST:PORT; port 0 picks a free one). UNAVAILABLE when the address
  // cannot be bound. `service` is the daemon's main service name, e.g. "tandem.v1.StageWorker".
  static absl::StatusOr<std::unique_ptr<HealthServer>> Start(const std::string& address,
                                                             const std::string& service);
  ~HealthServer();  // Shutdown()
  HealthServer(const HealthServer&) = delete;
  HealthServer& operator=(const HealthServer&) = delete;

  int port() const { return port_; }
  void SetReady(bool ready);
  // Everything NOT_SERVING (later SetReady calls are ignored), then stops the server within
  // a second. Idempotent.
  void Shutdown();

 private:
  HealthServer(std::unique_ptr<grpc::CallbackGenericService> unimplemented,
               std::unique_ptr<grpc::Server> server, int port, std::string service);

  // Answers every method but health with UNIMPLEMENTED. gRPC builds no server without a
  // service of its own; the stock health service is added only when the server starts.
  const std::unique_ptr<grpc::CallbackGenericService> unimplemented_;
  const int port_;
  const std::string service_;
  absl::Mutex mu_;
  std::unique_ptr<grpc::Server> server_ ABSL_GUARDED_BY(mu_);  // null after Shutdown
};

}  // namespace tandem

#endif  // TANDEM_COMMON_HEALTH_H_
