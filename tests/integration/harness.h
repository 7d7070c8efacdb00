// Test harness for integration tests: starts real tandem-coordinator and tandem-worker
// processes on 127.0.0.1 with ephemeral ports, talks to them over gRPC, runs the CLI.
#ifndef TANDEM_TESTS_INTEGRATION_HARNESS_H_
#define TANDEM_TESTS_INTEGRATION_HARNESS_H_

#include <grpcpp/grpcpp.h>
#include <sys/types.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "coordinator/cli/coordinator_client.h"
#include "tandem/v1/coordinator.pb.h"

namespace tandem::testing {

// A child process; killed (SIGKILL) on destruction. Its stdout and stderr go to `log_path`.
class Process {
 public:
  Process(const std::string& binary, const std::vector<std::string>& args,
          const std::string& log_path);
  ~Process();
  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;

  pid_t pid() const { return pid_; }
  void Kill(int signal);
  // Waits for exit; returns the exit code, or 128+signal.
  int Wait();
  bool Running();
  const std::string& log_path() const { return log_path_; }

 private:
  pid_t pid_ = -1;
  bool reaped_ = false;
  int status_ = 0;
  std::string log_path_;
};

struct CommandResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};
// Runs a command to completion (argv[0] is a path), capturing stdout and stderr. The command
// runs in its own process group, which is killed when the command exits or after `timeout`
// (then err starts "timed out"): nothing it started outlives it.
CommandResult RunCommand(const std::vector<std::string>& argv,
                         std::chrono::seconds timeout = std::chrono::seconds(120));

std::string ReadFile(const std::string& path);

// What grpc.health.v1.Health/Check answered: the gRPC code and, when OK, the ServingStatus
// (1 SERVING, 2 NOT_SERVING; 0 for an empty answer).
struct HealthAnswer {
  grpc::StatusCode code = grpc::StatusCode::UNKNOWN;
  int status = 0;
};
// A real health client over the wire (5 s deadline), through the generic stub so that tests
// need no copy of health.proto: HealthCheckRequest is {1: string service},
// HealthCheckResponse is {1: enum status}.
HealthAnswer CheckHealth(std::shared_ptr<grpc::Channel> channel, const std::string& service = "");
// Polls until `pred` holds or `timeout` passes.
bool WaitFor(const std::function<bool()>& pred, std::chrono::milliseconds timeout,
             std::chrono::milliseconds every = std::chrono::milliseconds(50));

// A coordinator and N workers on 127.0.0.1.
class Cluster {
 public:
  struct Options {
    int workers = 2;
    int heartbeat_ms = 200;
    int worker_timeout_ms = 1500;
    std::vector<std::string> worker_args;       // appended to every worker's flags
    std::vector<std::string> coordinator_args;  // appended to the coordinator's flags
    // Serve metrics and the dashboard on an ephemeral 127.0.0.1 port (http_port()); with
    // `tls`, over HTTPS, and the coordinator also gets --metrics-token-file (certs_dir()'s
    // metrics-token).
    bool http = false;
    // The coordinator's plaintext health port on an ephemeral 127.0.0.1 port (health_port()).
    bool health = false;
    // TLS with mutual authentication: Start() makes a CA, certificates and a token with
    // scripts/dev-certs.sh in certs_dir(); the daemons get the --tls-* flags, the coordinator
    // --auth-token-file, and client() and Cli() authenticate with the token.
    bool tls = false;
    // The host the coordinator listens on: 0.0.0.0 makes it reachable from network namespaces
    // a test joined to its own (clients still use 127.0.0.1).
    std::string coordinator_listen_host = "127.0.0.1";
    // Where worker i runs, for tests that make network namespaces; unset: on 127.0.0.1.
    struct Placement {
      std::vector<std::string> prefix;  // its command line follows, e.g. ip netns exec NS
      std::string coordinator_host;     // the coordinator's host as seen from there
      std::string listen_host = "127.0.0.1";
      std::vector<std::string> args;  // flags of its own, e.g. --data-host
    };
    std::function<Placement(int worker)> place_worker;
  };
  explicit Cluster(Options options);
  ~Cluster();

  // Starts everything and waits until every worker is registered.
  absl::Status Start();
  // Kills the coordinator with `signal` (SIGKILL: no chance to clean up), waits for it to
  // exit, and starts a new one on the same data root and the same ports; then waits until
  // every running worker has registered again (they do when their heartbeat is refused).
  // The new coordinator's log is coordinator.<restarts>.log (coordinator().log_path()).
  absl::Status RestartCoordinator(int signal);
  // The coordinator's data root (--data-root).
  std::string data_root() const { return dir_ + "/store"; }
  // Starts one more worker (with `extra_flags`, e.g. "--test-fail-at=1:B") and waits until it
  // is registered.
  absl::Status AddWorker(const std::vector<std::string>& extra_flags = {});
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  // The coordinator's metrics and dashboard port (Options::http), else 0.
  int http_port() const { return http_port_; }
  // The coordinator's health port (Options::health), else 0.
  int health_port() const { return health_port_; }
  // Options::tls: where the certificates are (ca.crt, coordinator/worker/client .crt .key,
  // token, metrics-token), and the security of a client that sends the token.
  std::string certs_dir() const { return dir_ + "/certs"; }
  ChannelSecurity ClientSecurity() const;
  // The flags a worker needs to reach this coordinator: plaintext none, with TLS the worker
  // certificate's.
  std::vector<std::string> WorkerTlsFlags() const;
  const std::string& dir() const { return dir_; }
  Process& worker(int i) { return *workers_[i]; }
  int num_workers() const { return static_cast<int>(workers_.size()); }
  Process& coordinator() { return *coordinator_; }
  cli::CoordinatorClient& client() { return *client_; }

  // Client API helpers over the CLI's CoordinatorClient (deadline and protocol version set).
  absl::StatusOr<std::string> Submit(const std::string& yaml);
  absl::StatusOr<v1::Job> GetJob(const std::string& id);
  absl::StatusOr<std::vector<v1::WorkerInfo>> Workers();
  absl::Status Cancel(const std::string& id);
  // Waits until the job reaches a terminal state (or `timeout`); returns the final job.
  absl::StatusOr<v1::Job> WaitForEnd(const std::string& id, std::chrono::seconds timeout);
  // Whether the job is RUNNING with at least `steps` steps done within `timeout`.
  bool WaitForSteps(const std::string& id, int64_t steps,
                    std::chrono::seconds timeout = std::chrono::seconds(60));
  // Waits until the job has been restarted at least once; returns the seconds that took
  // (DEADLINE_EXCEEDED after `timeout`). For "detected within N s" after a fault.
  absl::StatusOr<double> SecondsUntilRestart(const std::string& id, std::chrono::seconds timeout);
  // Runs the `tandem` CLI against this cluster; with TLS, with --tls-ca and the token unless
  // `with_credentials` is false (then only --coordinator is added).
  CommandResult Cli(const std::vector<std::string>& args, bool with_credentials = true);

 private:
  absl::Status StartWorker(const std::vector<std::string>& extra_flags = {});
  // Starts the coordinator on `port` (0: an ephemeral one) and waits until it serves.
  absl::Status StartCoordinator(int port);
  // Waits until every running worker is registered and not LOST.
  absl::Status WaitForWorkers();

  Options options_;
  std::string dir_;
  int port_ = 0;
  int http_port_ = 0;
  int restarts_ = 0;
  int health_port_ = 0;
  std::unique_ptr<Process> coordinator_;
  std::vector<std::unique_ptr<Process>> workers_;
  std::unique_ptr<cli::CoordinatorClient> client_;
};

// Makes a development CA, certificates and a token in `dir` with scripts/dev-certs.sh.
absl::Status MakeDevCerts(const std::string& dir);

// A small mlp_lm job spec for tests: `stages` stages, M micro-batches, `steps` steps.
// `extra` is appended as top-level YAML (e.g. "checkpoint:\n  every: 4\n").
// The loss of each step in the job's history, in order.
std::vector<double> Losses(const v1::Job& job);

// The job ended SUCCEEDED with every one of its `steps` steps recorded once, in order, each
// with the reference run's loss (bit for bit: the same data and the same restored state).
void ExpectTheReferenceRun(const v1::Job& job, const v1::Job& reference, int steps);

std::string TinyJobYaml(int stages, int micro_batches, int steps,
                        const std::string& schedule = "1f1b", const std::string& extra = "",
                        const std::string& lr_schedule = "cosine");

}  // namespace tandem::testing

#endif  // TANDEM_TESTS_INTEGRATION_HARNESS_H_
