// tandem-coordinator: holds jobs, the worker registry and the step driver; serves the client
// API, worker registration and transport rendezvous over gRPC, plus grpc.health.v1 (on the
// API port, and in plaintext on --health-listen for Kubernetes probes); with --metrics-listen,
// Prometheus metrics and the dashboard: over HTTPS for authenticated readers when the API serves
// TLS, else (or with --metrics-plaintext) over plain HTTP.
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <signal.h>

#include <chrono>
#include <iostream>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/flags.h"
#include "common/health.h"
#include "common/log_context.h"
#include "common/rpc.h"
#include "common/tls.h"
#include "common/version.h"
#include "coordinator/checkpoint_store.h"
#include "coordinator/http_server.h"
#include "coordinator/job_store.h"
#include "coordinator/metrics.h"
#include "coordinator/priority.h"
#include "coordinator/profile_speed_check.h"
#include "coordinator/profile_store.h"
#include "coordinator/rendezvous_store.h"
#include "coordinator/scheduler.h"
#include "coordinator/services.h"
#include "coordinator/web_handlers.h"
#include "coordinator/worker_client.h"
#include "coordinator/worker_registry.h"
#include "spdlog/spdlog.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:7070", "HOST:PORT to serve on (port 0: ephemeral)");
ABSL_FLAG(std::string, data_root, "",
          "directory for the job store; empty keeps jobs in memory only");
ABSL_FLAG(int64_t, checkpoint_min_free_mb, 64,
          "MiB of the data root's disk a checkpoint leaves free for the job store: a checkpoint "
          "that would leave less is refused before it is written (and the job trains on)");
ABSL_FLAG(absl::Duration, profile_max_age, absl::Hours(24 * 7),
          "how long a measured layer profile plans jobs (90s, 12h, inf): a job that needs an "
          "older one measures it again on its workers, as the machines' speed drifts with their "
          "load, drivers and libraries; 0 measures for every job that needs one");
ABSL_FLAG(absl::Duration, profile_speed_check, tandem::coordinator::kDefaultSpeedCheckAfter,
          "a cached layer profile at least this old (90s, 10m, inf: never) is checked before it "
          "prices a job: each layer kind's forward and backward is timed again on the job's "
          "workers, and the job is priced on the profile's compute times x the model's ratio of "
          "now to then when it and every round of the check are off by more than 2% on one "
          "side (the profile is measured again beyond 25%); `tandem plan` is priced the "
          "same way, one check a model per this age on idle workers");
ABSL_FLAG(std::string, port_file, "", "write the bound port to this file once serving");
ABSL_FLAG(std::string, health_listen, "",
          "also serve grpc.health.v1 in plaintext on this HOST:PORT (for Kubernetes probes): "
          "\"\" and tandem.v1.Coordinator are SERVING once the job store is loaded and the API "
          "serves, \"liveness\" while the process runs; empty: no health port");
ABSL_FLAG(std::string, health_port_file, "", "write the bound health port to this file");
ABSL_FLAG(int, heartbeat_ms, 1000, "heartbeat interval the workers are told to use");
ABSL_FLAG(int, worker_timeout_ms, 5000, "a worker silent this long is marked LOST");
ABSL_FLAG(int, heartbeat_per_worker_us, 10000,
          "with many workers the heartbeat interval grows to workers x this (and the LOST "
          "timeout with it), so that the coordinator answers about one heartbeat per this "
          "interval whatever the count; 0 keeps --heartbeat-ms fixed");
ABSL_FLAG(int, step_timeout_s, 600,
          "a step that takes longer fails the run (the job restarts up to its max_restarts)");
ABSL_FLAG(int, step_deadline_floor_ms, 10000,
          "once a run has measured steps, a step fails after 5x its slowest step so far, but "
          "never sooner than this");
ABSL_FLAG(int, restart_backoff_ms, 1000,
          "a job restarted after a fault waits this long before its next run, doubling with "
          "each further restart up to 60 s (0: no wait)");
ABSL_FLAG(int, step_relay_min_workers, 64,
          "a job of at least this many workers gets each step's RunStep through about "
          "sqrt(workers) of them, which forward it to the rest (the step relay), so that the "
          "coordinator makes sqrt(N) calls per step instead of N; 0: always call every worker");
ABSL_FLAG(bool, peer_recovery, true,
          "a data-parallel job whose worker fails resumes from the state its surviving replicas "
          "kept after the last completed step (only the step in flight is trained again), "
          "instead of from its latest checkpoint; false: always from the checkpoint");
ABSL_FLAG(std::string, log_level, "info", "trace, debug, info, warn, error");
ABSL_FLAG(int, rpc_nice, 10,
          "nice value (0..19) of every thread but the scheduler and the job runners (gRPC's, "
          "which serve status, watch and registration RPCs, and the HTTP server's), so that "
          "monitoring load on a machine shared with workers does not slow the training step; "
          "0 keeps them at the process's priority");
ABSL_FLAG(std::string, metrics_listen, "",
          "HOST:PORT to serve Prometheus metrics at /metrics, the dashboard at /, its JSON under "
          "/api/ (port 0: ephemeral); empty: none. Plain HTTP without the --tls-* flags; with "
          "them HTTPS with the same certificate, and a request needs a client certificate "
          "signed by --tls-ca (any Common Name) or a token of --metrics-token-file or "
          "--auth-token-file (Authorization: Bearer TOKEN, or Basic with the token as the "
          "password); else 401");
ABSL_FLAG(std::string, metrics_port_file, "", "write the bound metrics port to this file");
ABSL_FLAG(std::string, metrics_token_file, "",
          "with TLS: a file holding a bearer token (one line, >= 16 characters) that opens "
          "--metrics-listen and nothing else: give it to Prometheus (authorization: "
          "credentials_file); read once at start");
ABSL_FLAG(bool, metrics_plaintext, false,
          "with TLS: serve --metrics-listen in plain HTTP without authentication all the same, "
          "for a network that only trusted readers reach (logged as a warning)");
ABSL_FLAG(std::string, tls_cert, "",
          "PEM certificate (chain) of this coordinator, subject CN=tandem-coordinator: served "
          "on --listen and presented to workers; with --tls-key and --tls-ca turns on TLS with "
          "mutual authentication (none of the three: plaintext, for one trusted machine only)");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls-cert");
ABSL_FLAG(std::string, tls_ca, "",
          "PEM CA certificate(s) that sign the workers' and clients' certificates");
ABSL_FLAG(std::string, auth_token_file, "",
          "with TLS: a file holding a bearer token (one line, >= 16 characters); a client that "
          "sends 'authorization: Bearer TOKEN' may call the client API without a certificate");

namespace {

int Fail(const std::string& message) {
  std::cerr << "tandem-coordinator: " << message << "\n";
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  tandem::DisableDebugMutexChecksInRelease();
  absl::SetProgramUsageMessage(
      "tandem-coordinator --listen HOST:PORT [--data-root DIR] [--metrics-listen HOST:PORT] "
      "[--tls-cert FILE --tls-key FILE --tls-ca FILE [--auth-token-file FILE] "
      "[--metrics-token-file FILE]]: the Tandem "
      "coordinator. With --metrics-listen it also serves Prometheus metrics at /metrics and the "
      "dashboard at /: over HTTPS, to a client certificate or a token, with the --tls-* flags; "
      "else over plain HTTP. Without the --tls-* flags its API is plaintext and "
      "unauthenticated (one trusted machine only). --helpon=main lists its flags.");
  tandem::NormalizeFlagDashes(argc, argv);
  tandem::HelpListsFlagsOf("coordinator/main.cc");
  absl::ParseCommandLine(argc, argv);
  spdlog::set_level(spdlog::level::from_str(absl::GetFlag(FLAGS_log_level)));
  tandem::InstallLogFormat();
  using tandem::coordinator::JobStore;
  namespace tc = tandem::coordinator;

  // Before anything starts a thread: the launcher keeps this priority for the scheduler and
  // the job runners; this thread, and so every thread started from here on (gRPC's, the HTTP
  // server's), runs at --rpc-nice.
  tc::PriorityLauncher orchestration;
  if (const int nice = absl::GetFlag(FLAGS_rpc_nice); nice != 0) {
    if (absl::Status s = tc::LowerCallingThread(nice); !s.ok()) {
      return Fail(absl::StrCat("--rpc-nice=", nice, ": ", s.message()));
    }
  }

  if (absl::GetFlag(FLAGS_heartbeat_ms) < 10 ||
      absl::GetFlag(FLAGS_worker_timeout_ms) <= absl::GetFlag(FLAGS_heartbeat_ms)) {
    return Fail("--worker-timeout-ms must exceed --heartbeat-ms, which must be >= 10");
  }
  if (absl::GetFlag(FLAGS_step_timeout_s) < 1) return Fail("--step-timeout-s must be >= 1");
  if (absl::GetFlag(FLAGS_step_deadline_floor_ms) < 100) {
    return Fail("--step-deadline-floor-ms must be >= 100");
  }
  if (absl::GetFlag(FLAGS_restart_backoff_ms) < 0) return Fail("--restart-backoff-ms must be >= 0");
  if (absl::GetFlag(FLAGS_step_relay_min_workers) < 0) {
    return Fail("--step-relay-min-workers must be >= 0");
  }

  // Transport security, checked before anything starts: a half configuration or an unreadable
  // file is refused here, naming the flag and the file.
  tandem::ServerSecurity security;
  security.policy = tandem::CoordinatorAccessPolicy();
  {
    auto tls = tandem::LoadTls({absl::GetFlag(FLAGS_tls_cert), absl::GetFlag(FLAGS_tls_key),
                                absl::GetFlag(FLAGS_tls_ca), ""},
                               tandem::TlsUse::kDaemon, tandem::Role::kCoordinator);
    if (!tls.ok()) return Fail(std::string(tls.status().message()));
    security.tls = *std::move(tls);
  }
  if (const std::string f = absl::GetFlag(FLAGS_auth_token_file); !f.empty()) {
    if (!security.tls.has_value()) {
      return Fail(
          "--auth-token-file needs TLS (--tls-cert, --tls-key, --tls-ca): a bearer token sent "
          "in plaintext is readable by anyone on the path");
    }
    auto token = tandem::ReadTokenFile(f);
    if (!token.ok()) return Fail("--auth-token-file: " + std::string(token.status().message()));
    security.token = *std::move(token);
  }
  // The metrics port follows the API: HTTPS with its certificate when it serves TLS, opened by
  // a certificate from its CA or a token; plain HTTP on request, and without TLS.
  tc::HttpSecurity metrics_security;
  const bool metrics_plaintext = absl::GetFlag(FLAGS_metrics_plaintext);
  if (security.tls.has_value() && !metrics_plaintext) {
    metrics_security.tls = security.tls;
    if (!security.token.empty()) metrics_security.tokens.push_back(security.token);
  }
  if (const std::string f = absl::GetFlag(FLAGS_metrics_token_file); !f.empty()) {
    if (!security.tls.has_value() || metrics_plaintext) {
      return Fail(
          "--metrics-token-file needs the metrics port to serve HTTPS (the --tls-* flags, "
          "without --metrics-plaintext): a bearer token sent in plain HTTP is readable by anyone "
          "on the path");
    }
    auto token = tandem::ReadTokenFile(f);
    if (!token.ok()) {
      return Fail("--metrics-token-file: " + std::string(token.status().message()));
    }
    metrics_security.tokens.push_back(*std::move(token));
  }
  if (metrics_security.tls.has_value() && metrics_security.tls->ca_pem.empty() &&
      metrics_security.tokens.empty()) {
    return Fail(
        "--metrics-listen with TLS needs a way in: --tls-ca (client certificates), "
        "--metrics-token-file or --auth-token-file (tokens), or --metrics-plaintext for a "
        "trusted network");
  }

  // Block the shutdown signals before any thread starts; main waits for them below.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  // A write to a socket its peer closed fails with EPIPE instead of ending the daemon.
  signal(SIGPIPE, SIG_IGN);

  // The health port first, NOT_SERVING until the rest is up: a probe then sees "not ready"
  // rather than "refused" while the job store loads.
  std::unique_ptr<tandem::HealthServer> health;
  if (const std::string h = absl::GetFlag(FLAGS_health_listen); !h.empty()) {
    auto started = tandem::HealthServer::Start(h, "tandem.v1.Coordinator");
    if (!started.ok()) {
      return Fail(absl::StrCat("--health-listen=", h, ": ", started.status().ToString()));
    }
    health = *std::move(started);
    if (const std::string f = absl::GetFlag(FLAGS_health_port_file); !f.empty()) {
      if (auto s = tandem::WritePortFile(f, health->port()); !s.ok()) return Fail(s.ToString());
    }
    spdlog::info("health (grpc.health.v1, plaintext) on port {}", health->port());
  }

  const std::string data_root = absl::GetFlag(FLAGS_data_root);
  const int64_t min_free_mb = absl::GetFlag(FLAGS_checkpoint_min_free_mb);
  if (min_free_mb < 0 || min_free_mb > (int64_t{1} << 40)) {
    return Fail(absl::StrCat("--checkpoint-min-free-mb must be in [0, 2^40], got ", min_free_mb));
  }
  tc::CheckpointStore checkpoints(data_root.empty() ? "" : data_root + "/checkpoints",
                                  {.min_free_bytes = min_free_mb << 20});
  auto store = JobStore::Open(data_root, &checkpoints);
  if (!store.ok()) return Fail(store.status().ToString());
  tc::WorkerRegistry registry(std::chrono::milliseconds(absl::GetFlag(FLAGS_worker_timeout_ms)),
                              tc::FirstWorkerId((*store)->incarnation()));
  registry.SetHeartbeatInterval(
      std::chrono::milliseconds(absl::GetFlag(FLAGS_heartbeat_ms)),
      std::chrono::microseconds(std::max(0, absl::GetFlag(FLAGS_heartbeat_per_worker_us))));
  tc::RendezvousStore rendezvous;
  const absl::Duration profile_max_age = absl::GetFlag(FLAGS_profile_max_age);
  if (profile_max_age < absl::ZeroDuration()) {
    return Fail(absl::StrCat("--profile-max-age must not be negative, got ",
                             absl::FormatDuration(profile_max_age)));
  }
  if (absl::GetFlag(FLAGS_profile_speed_check) < absl::ZeroDuration()) {
    return Fail(absl::StrCat("--profile-speed-check must not be negative, got ",
                             absl::FormatDuration(absl::GetFlag(FLAGS_profile_speed_check))));
  }
  tc::ProfileStore profiles(data_root.empty() ? "" : data_root + "/profiles", profile_max_age);
  // Workers are dialled with the coordinator's certificate (their StageWorker API requires it).
  auto clients = tc::MakeGrpcStageWorkerClientFactory({security.tls, ""});
  tc::RunnerEnv runner_env;
  runner_env.store = store->get();
  runner_env.registry = &registry;
  runner_env.clients = clients.get();
  runner_env.rendezvous = &rendezvous;
  runner_env.checkpoints = &checkpoints;
  runner_env.profiles = &profiles;
  runner_env.models_root = data_root.empty() ? "" : data_root + "/models";
  runner_env.options.step_timeout = absl::Seconds(absl::GetFlag(FLAGS_step_timeout_s));
  runner_env.options.step_deadline_floor =
      absl::Milliseconds(absl::GetFlag(FLAGS_step_deadline_floor_ms));
  runner_env.options.restart_backoff = absl::Milliseconds(absl::GetFlag(FLAGS_restart_backoff_ms));
  runner_env.options.step_relay_min_workers = absl::GetFlag(FLAGS_step_relay_min_workers);
  runner_env.options.peer_recovery = absl::GetFlag(FLAGS_peer_recovery);
  runner_env.options.profile_speed_check_after = absl::GetFlag(FLAGS_profile_speed_check);
  tc::Scheduler scheduler(runner_env);

  tc::ServiceEnv env;
  env.store = store->get();
  env.registry = &registry;
  env.scheduler = &scheduler;
  env.rendezvous = &rendezvous;
  env.checkpoints = &checkpoints;
  env.profiles = &profiles;
  env.clients = clients.get();
  // `tandem plan` is priced as its job would be: the same speed checks of cached profiles.
  tc::SpeedCheckMemo speed_checks(absl::GetFlag(FLAGS_profile_speed_check));
  env.speed_checks = &speed_checks;
  auto coordinator_service = tc::MakeCoordinatorService(env);
  auto registry_service = tc::MakeWorkerRegistryService(env);
  auto rendezvous_service = tc::MakeRendezvousService(env);
  auto checkpoints_service = tc::MakeCheckpointsService(env);

  // Metrics and the dashboard read the same state as the services.
  tc::CoordinatorMetrics metrics(store->get(), &registry);
  const tc::WebHandlers web({store->get(), &registry, &metrics});
  std::unique_ptr<tc::HttpServer> http;
  if (const std::string m = absl::GetFlag(FLAGS_metrics_listen); !m.empty()) {
    auto started = tc::HttpServer::Start(
        m, [&web](const tc::HttpRequest& r) { return web.Handle(r); }, metrics_security);
    if (!started.ok()) {
      return Fail(absl::StrCat("--metrics-listen=", m, ": ", started.status().ToString()));
    }
    http = *std::move(started);
    if (metrics_security.tls.has_value()) {
      const size_t tokens = metrics_security.tokens.size();
      spdlog::info(
          "metrics and dashboard (HTTPS) on port {}: a request needs a client certificate "
          "signed by the CA{}",
          http->port(),
          tokens == 0 ? " (no token is accepted)"
                      : absl::StrCat(" or a bearer token (", tokens, " accepted)"));
    } else {
      spdlog::info("metrics and dashboard (HTTP) on port {}", http->port());
    }
    if (security.tls.has_value() && metrics_plaintext) {
      spdlog::warn(
          "--metrics-plaintext: the metrics port serves plain HTTP without authentication "
          "although the API serves TLS: whoever reaches port {} reads job names, losses and "
          "worker addresses (no call changes anything); keep it to a trusted network",
          http->port());
    }
    if (const std::string f = absl::GetFlag(FLAGS_metrics_port_file); !f.empty()) {
      if (auto s = tandem::WritePortFile(f, http->port()); !s.ok()) return Fail(s.ToString());
    }
  }

  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(absl::GetFlag(FLAGS_listen), tandem::MakeServerCredentials(security),
                           &port);
  builder.SetMaxReceiveMessageSize(8 << 20);
  builder.RegisterService(coordinator_service.get());
  builder.RegisterService(registry_service.get());
  builder.RegisterService(rendezvous_service.get());
  builder.RegisterService(checkpoints_service.get());
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || port == 0) {
    return Fail(absl::StrCat("cannot listen on ", absl::GetFlag(FLAGS_listen)));
  }
  orchestration.Run([&] { scheduler.Start(); });
  spdlog::info("tandem-coordinator {} serving on port {} (protocol {})", tandem::kVersion, port,
               tandem::kProtocolVersion);
  tandem::LogSecurity("tandem-coordinator", security);
  if (!absl::GetFlag(FLAGS_port_file).empty()) {
    if (auto s = tandem::WritePortFile(absl::GetFlag(FLAGS_port_file), port); !s.ok()) {
      return Fail(s.ToString());
    }
  }
  if (health != nullptr) health->SetReady(true);

  int sig = 0;
  sigwait(&signals, &sig);
  spdlog::info("signal {}: shutting down", sig);
  if (health != nullptr) health->Shutdown();  // NOT_SERVING from now on
  http.reset();
  scheduler.Stop();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  return 0;
}
