// tandem-worker: the stage-worker daemon. Serves the StageWorker API and grpc.health.v1 (also in
// plaintext on --health-listen), registers with the coordinator and heartbeats. Flags live here
// only; they become a validated WorkerConfig / RegistrationOptions passed down by value.
#include <cblas.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/flags.h"
#include "common/health.h"
#include "common/log_context.h"
#include "common/rpc.h"
#include "common/status_macros.h"
#include "common/tls.h"
#include "common/version.h"
#include "worker/backend/cuda/module_loading.h"
#include "worker/blas_core_restart.h"
#include "worker/checkpoint_client.h"
#include "worker/device_name.h"
#include "worker/executor.h"
#include "worker/heap_release.h"
#include "worker/peak_flops.h"
#include "worker/registration.h"
#include "worker/stage_manager.h"
#include "worker/stage_service.h"
#include "worker/transport/gloo_transport.h"
#include "worker/transport/grpc_rendezvous_store.h"
#include "worker/transport/ring_collectives.h"
#ifdef TANDEM_WORKER_CUDA
// None of these names a CUDA type: the build gives this file no CUDA headers.
#include "worker/backend/cuda/cuda_device_copier.h"
#include "worker/backend/cuda/device.h"
#include "worker/backend/cuda/gemm_peak.h"
#include "worker/cuda_stage_compute.h"
#include "worker/transport/host_staged_transport.h"
#include "worker/transport/nccl_collectives.h"
#include "worker/transport/nccl_transport.h"
#endif

ABSL_FLAG(std::string, coordinator, "",
          "coordinator address HOST:PORT (required; default: $TANDEM_COORDINATOR)");
ABSL_FLAG(std::string, listen, "127.0.0.1:0", "address to serve on, HOST:PORT (port 0 = any)");
ABSL_FLAG(std::string, advertise, "",
          "address the coordinator and peers should use, HOST:PORT (default: the listen host "
          "with the bound port)");
ABSL_FLAG(std::string, data_host, "",
          "host (name or IP) of the data plane: the address this worker's transport listens on "
          "and gives its peers for activations and gradients, e.g. that of a separate fast "
          "network (default: the advertised host, else the listen host)");
ABSL_FLAG(std::string, device, "cpu",
          "compute device: cpu, or cuda:N (GPU N: the stages run on it and the data plane is "
          "NCCL; needs a build with CUDA)");
ABSL_FLAG(int, threads, 1, "OpenBLAS threads");
ABSL_FLAG(std::string, blas_core, "auto",
          "auto: when OpenBLAS chose GEMM kernels older than the processor runs (a model it does "
          "not know) and OPENBLAS_CORETYPE is unset, start again with OPENBLAS_CORETYPE naming "
          "the processor's kernels; keep: OpenBLAS's own choice; an OpenBLAS core type (e.g. "
          "SkylakeX, Haswell): start with those kernels");
ABSL_FLAG(std::string, node, "",
          "the node (machine) this worker runs on, for placement: workers of one node are taken "
          "to share the cheapest links (default: the host name)");
ABSL_FLAG(std::string, data_root, ".", "directory that job data paths resolve under");
ABSL_FLAG(std::string, peak_lock, "/tmp/tandem-peak-flops.lock",
          "file the workers of one host lock while each measures its peak FLOP/s at start, so "
          "that workers started together do not measure against each other (empty: no lock)");
ABSL_FLAG(std::string, port_file, "", "write the bound port to this file");
ABSL_FLAG(std::string, health_listen, "",
          "also serve grpc.health.v1 in plaintext on this HOST:PORT (for Kubernetes probes): "
          "\"\" and tandem.v1.StageWorker are SERVING while registered with the coordinator, "
          "\"liveness\" while the process runs; empty: no health port");
ABSL_FLAG(std::string, health_port_file, "", "write the bound health port to this file");
ABSL_FLAG(int, heartbeat_ms, 1000, "heartbeat interval until the coordinator sets one");
ABSL_FLAG(std::string, log_level, "info", "trace, debug, info, warn, error");
ABSL_FLAG(std::string, test_fail_at, "",
          "for tests only: fail the action STEP:KIND[:MICRO_BATCH] of a training step (e.g. "
          "2:B:1: the second step's backward of micro-batch 1; steps count from 1) with an "
          "injected error, as a failed kernel would");
ABSL_FLAG(bool, keep_heap, true,
          "keep freed memory in the process heap instead of returning it to the OS: a training "
          "step allocates the same large activation buffers every time, and re-faulting them "
          "in costs ~10% of a transformer block's time; the free part is returned whenever the "
          "worker goes idle (a job's stage dropped, a layer profile done)");
ABSL_FLAG(std::string, tls_cert, "",
          "PEM certificate (chain) of this worker, subject CN=tandem-worker, with a "
          "subjectAltName for the --advertise host: served on --listen and presented to the "
          "coordinator; with --tls-key and --tls-ca turns on TLS with mutual authentication "
          "(none of the three: plaintext, for one trusted machine only)");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls-cert");
ABSL_FLAG(std::string, tls_ca, "", "PEM CA certificate(s) that sign the coordinator's certificate");
ABSL_FLAG(std::string, tls_server_name, "",
          "the name the coordinator's certificate must carry, when it is not the host of "
          "--coordinator (e.g. dialling it by IP address)");
// Flags may be written with dashes (--data-root) or underscores (--data_root).

namespace tandem::worker {
namespace {

// Where a program's ranks meet (its transport's or its data-parallel group's): under its
// rendezvous prefix, giving up once `cancelled` is set.
GrpcRendezvousStoreOptions RendezvousOptionsFor(const v1::StageProgram& program,
                                                const std::atomic<bool>& cancelled) {
  GrpcRendezvousStoreOptions options;
  options.prefix = program.rendezvous_prefix();
  options.cancelled = &cancelled;
  return options;
}

PeakOptions PeakOptionsFromFlags() {
  PeakOptions o;
  o.lock_path = absl::GetFlag(FLAGS_peak_lock);
  return o;
}

struct HostPort {
  std::string host;  // without IPv6 brackets
  int port = 0;
};

absl::StatusOr<HostPort> ParseHostPort(const std::string& flag, const std::string& value) {
  const size_t colon = value.rfind(':');
  HostPort hp;
  if (colon == std::string::npos || colon == 0 ||
      !absl::SimpleAtoi(value.substr(colon + 1), &hp.port) || hp.port < 0 || hp.port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag, "=", value, ": expected HOST:PORT"));
  }
  absl::string_view host(value.data(), colon);
  if (absl::ConsumePrefix(&host, "[")) {
    if (!absl::ConsumeSuffix(&host, "]")) {
      return absl::InvalidArgumentError(absl::StrCat("--", flag, "=", value, ": bad IPv6 host"));
    }
  }
  hp.host = std::string(host);
  return hp;
}

std::string JoinHostPort(const std::string& host, int port) {
  return absl::StrContains(host, ':') ? absl::StrCat("[", host, "]:", port)
                                      : absl::StrCat(host, ":", port);
}

std::string Hostname() {
  char buf[256] = {};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "localhost";
  return buf;
}

// Write end of the self-pipe that OnSignal writes to. The one piece of process-global state:
// a signal handler cannot reach anything else.
volatile sig_atomic_t g_signal_fd = -1;

void OnSignal(int sig) {
  const unsigned char byte = static_cast<unsigned char>(sig);
  if (g_signal_fd >= 0) (void)!write(g_signal_fd, &byte, 1);
}

bool IsWildcard(const std::string& host) {
  return host.empty() || host == "0.0.0.0" || host == "::" || host == "*";
}

int Run() {
  const std::string level_name = absl::GetFlag(FLAGS_log_level);
  const spdlog::level::level_enum level = spdlog::level::from_str(level_name);
  if (level == spdlog::level::off && level_name != "off") {
    std::fprintf(stderr, "tandem-worker: --log_level=%s is not a log level\n", level_name.c_str());
    return 2;
  }
  spdlog::set_level(level);
  InstallLogFormat();

  std::string coordinator = absl::GetFlag(FLAGS_coordinator);
  if (const char* env = std::getenv("TANDEM_COORDINATOR"); coordinator.empty() && env != nullptr) {
    coordinator = env;
  }
  if (coordinator.empty()) {
    spdlog::error("--coordinator HOST:PORT (or $TANDEM_COORDINATOR) is required");
    return 2;
  }
  const std::string device = absl::GetFlag(FLAGS_device);
  int cuda_device = -1;  // the ordinal of --device=cuda:N
  int64_t device_memory = 0;
  PeakFlops device_peak;    // measured on cuda:N
  std::string device_uuid;  // cuda:N's "GPU-..." (how the coordinator tells a shared GPU)
  std::string device_name;  // cuda:N's name; a cpu worker's is CpuDeviceName()
  if (device != "cpu") {
#ifdef TANDEM_WORKER_CUDA
    absl::StatusOr<int> ordinal = ParseCudaDevice(device);
    if (!ordinal.ok()) {
      spdlog::error("--device={}: expected cpu or cuda:N", device);
      return 2;
    }
    absl::StatusOr<cuda::DeviceInfo> usable = cuda::OpenDevice(*ordinal);
    if (!usable.ok()) {
      spdlog::error("--device={}: no usable CUDA device: {}", device,
                    std::string(usable.status().message()));
      return 2;
    }
    // The device's bf16 GEMM: the denominator of a GPU job's model-FLOPs utilisation. Each
    // sample is itself a warmed-up best of five 4096^3 GEMMs; two workers sharing the GPU
    // measure one at a time (worker/peak_flops.h).
    PeakOptions peak_options = PeakOptionsFromFlags();
    peak_options.warmup = 0;
    peak_options.samples = 2;
    peak_options.what = "bf16 GEMM 4096^3 on the GPU";
    absl::StatusOr<PeakFlops> peak =
        MeasurePeak([] { return cuda::MeasureGemmFlops(/*bf16=*/true); }, peak_options);
    if (!peak.ok()) {
      spdlog::error("--device={}: measuring the GEMM peak: {}", device,
                    std::string(peak.status().message()));
      return 2;
    }
    device_peak = *peak;
    absl::StatusOr<std::string> uuid = cuda::DeviceUuid(*ordinal);
    if (!uuid.ok()) {
      spdlog::error("--device={}: reading the GPU's uuid: {}", device,
                    std::string(uuid.status().message()));
      return 2;
    }
    device_uuid = *std::move(uuid);
    device_name = RegisteredDeviceName(usable->name);
    cuda_device = *ordinal;
    device_memory = usable->total_memory_bytes;
#else
    spdlog::error("--device={}: {}", device,
                  absl::StartsWith(device, "cuda:")
                      ? "this build of tandem-worker has no CUDA support (build it with the "
                        "CUDA toolkit and NCCL installed, or use --device=cpu)"
                      : "unknown device; expected cpu or cuda:N");
    return 2;
#endif
  }
  const int threads = absl::GetFlag(FLAGS_threads);
  if (threads < 1 || threads > 1024) {
    spdlog::error("--threads={}: expected 1..1024", threads);
    return 2;
  }
  const int heartbeat_ms = absl::GetFlag(FLAGS_heartbeat_ms);
  if (heartbeat_ms < 10) {
    spdlog::error("--heartbeat_ms={}: expected at least 10", heartbeat_ms);
    return 2;
  }
  absl::StatusOr<HostPort> listen = ParseHostPort("listen", absl::GetFlag(FLAGS_listen));
  if (!listen.ok()) {
    spdlog::error("{}", std::string(listen.status().message()));
    return 2;
  }
  std::optional<HostPort> advertise_flag;
  if (!absl::GetFlag(FLAGS_advertise).empty()) {
    absl::StatusOr<HostPort> a = ParseHostPort("advertise", absl::GetFlag(FLAGS_advertise));
    if (!a.ok()) {
      spdlog::error("{}", std::string(a.status().message()));
      return 2;
    }
    advertise_flag = *a;
  }
  const std::string health_listen = absl::GetFlag(FLAGS_health_listen);
  if (!health_listen.empty()) {
    if (absl::StatusOr<HostPort> h = ParseHostPort("health_listen", health_listen); !h.ok()) {
      spdlog::error("{}", std::string(h.status().message()));
      return 2;
    }
  }
  // Transport security: the StageWorker API for the coordinator's certificate only, and this
  // worker's certificate on the channel to the coordinator.
  ServerSecurity security;
  security.policy = WorkerAccessPolicy();
  {
    absl::StatusOr<std::optional<TlsMaterial>> tls =
        LoadTls({absl::GetFlag(FLAGS_tls_cert), absl::GetFlag(FLAGS_tls_key),
                 absl::GetFlag(FLAGS_tls_ca), absl::GetFlag(FLAGS_tls_server_name)},
                TlsUse::kDaemon, Role::kWorker);
    if (!tls.ok()) {
      spdlog::error("{}", std::string(tls.status().message()));
      return 2;
    }
    security.tls = *std::move(tls);
  }
  openblas_set_num_threads(threads);

  // Shutdown signals go through a self-pipe: the handler (which may run on any thread,
  // OpenBLAS's included) only writes a byte; a normal thread reads it and stops the server.
  int signal_pipe[2];
  if (pipe(signal_pipe) != 0) {
    spdlog::error("pipe: {}", std::strerror(errno));
    return 1;
  }
  g_signal_fd = signal_pipe[1];
  struct sigaction action = {};
  action.sa_handler = OnSignal;
  action.sa_flags = SA_RESTART;
  sigemptyset(&action.sa_mask);
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGINT, &action, nullptr);
  // A write to a socket its peer closed (a Gloo pair whose job was aborted while this worker
  // hung, a client gone mid-stream) must fail with EPIPE, not end the daemon.
  signal(SIGPIPE, SIG_IGN);

  std::shared_ptr<grpc::Channel> coordinator_channel =
      MakeChannel(coordinator, ChannelSecurity{security.tls, ""});

  // The data-plane host: --data-host, else the advertised host, else the listen host, else
  // this machine's name.
  std::string data_host = absl::GetFlag(FLAGS_data_host);
  if (data_host.empty()) data_host = advertise_flag ? advertise_flag->host : listen->host;
  if (IsWildcard(data_host)) data_host = Hostname();
  if (data_host.find_first_of(" :/") != std::string::npos) {
    spdlog::error("--data-host={}: expected a host name or an IPv4 address, without a port",
                  data_host);
    return 2;
  }

  WorkerConfig config;
  config.device = device;
  config.memory_bytes = device_memory;  // 0 (the host's memory) on cpu
  if (absl::GetFlag(FLAGS_keep_heap)) config.release_heap = ReleaseFreeHeap;
#ifdef TANDEM_WORKER_CUDA
  if (cuda_device >= 0) {
    config.compute =
        [cuda_device](
            const v1::StageProgram& program) -> absl::StatusOr<std::unique_ptr<StageCompute>> {
      ASSIGN_OR_RETURN(std::unique_ptr<CudaStageCompute> c,
                       CudaStageCompute::Create(program, cuda_device));
      return std::unique_ptr<StageCompute>(std::move(c));
    };
    config.device_buffers = [cuda_device](size_t bytes) {
      return NewDeviceBuffer(cuda_device, bytes);
    };
  }
#endif
  config.data_root = absl::GetFlag(FLAGS_data_root);
  if (const std::string fault = absl::GetFlag(FLAGS_test_fail_at); !fault.empty()) {
    absl::StatusOr<InjectedFault> f = ParseInjectedFault(fault);
    if (!f.ok()) {
      spdlog::error("--test-fail-at: {}", std::string(f.status().message()));
      return 2;
    }
    config.fault = *f;
    spdlog::warn("--test-fail-at {}: this worker will fail that action on purpose", fault);
  }
  TransportFactory factory =
      [coordinator_channel, data_host, cuda_device](
          const v1::StageProgram& program,
          const std::atomic<bool>& cancelled) -> absl::StatusOr<std::unique_ptr<Transport>> {
    GrpcRendezvousStore store(coordinator_channel, RendezvousOptionsFor(program, cancelled));
    GlooTransportOptions options;
    options.rank = program.rank();
    options.size = program.num_ranks();
    options.hostname = data_host;
#ifdef TANDEM_WORKER_CUDA
    // A GPU job's activations live in device memory: NCCL moves them, or, where the coordinator
    // resolved pipeline.transport to "gloo" (two workers on one GPU, which NCCL refuses), the
    // host-staged transport: device -> host -> Gloo -> host -> device. A "cuda" link probe's
    // program names the device and the transport the same way. No transport (an older
    // coordinator): NCCL.
    if (cuda_device >= 0 && program.spec().device() == "cuda" &&
        program.spec().pipeline().transport() == "gloo") {
      ASSIGN_OR_RETURN(std::unique_ptr<DeviceCopier> copier,
                       cuda::NewCudaDeviceCopier(cuda_device));
      ASSIGN_OR_RETURN(std::unique_ptr<GlooTransport> inner,
                       GlooTransport::Connect(options, store));
      return std::unique_ptr<Transport>(
          std::make_unique<HostStagedTransport>(std::move(inner), std::move(copier)));
    }
    if (cuda_device >= 0 && program.spec().device() == "cuda") {
      NcclTransportOptions nccl;
      nccl.rank = program.rank();
      nccl.size = program.num_ranks();
      nccl.device = cuda_device;
      nccl.peers = TransferPeers(program);  // links to the pipeline neighbours only
      nccl.cancelled = &cancelled;
      ASSIGN_OR_RETURN(std::unique_ptr<NcclTransport> t, NcclTransport::Connect(nccl, store));
      return std::unique_ptr<Transport>(std::move(t));
    }
#endif
    ASSIGN_OR_RETURN(std::unique_ptr<GlooTransport> t, GlooTransport::Connect(options, store));
    return std::unique_ptr<Transport>(std::move(t));
  };
#ifdef TANDEM_WORKER_CUDA
  // A GPU job's data-parallel group sums its device gradients with NCCL (one GPU per worker:
  // NCCL refuses two ranks of a group on one GPU, and says so); anything else keeps the ring
  // over a transport from the factory (the stage manager's default).
  if (cuda_device >= 0) {
    config.data_parallel_group = [coordinator_channel, cuda_device](
                                     const v1::StageProgram& group,
                                     const std::atomic<bool>& cancelled)
        -> absl::StatusOr<std::unique_ptr<GroupCollectives>> {
      // (a cuda worker runs cuda jobs only: the stage manager refuses the others)
      GrpcRendezvousStore store(coordinator_channel, RendezvousOptionsFor(group, cancelled));
      NcclCollectivesOptions nccl;
      nccl.rank = group.rank();
      nccl.size = group.num_ranks();
      nccl.device = cuda_device;
      nccl.cancelled = &cancelled;
      ASSIGN_OR_RETURN(std::unique_ptr<NcclCollectives> c, NcclCollectives::Connect(nccl, store));
      return NewNcclGroupCollectives(std::move(c));
    };
  }
#endif
  // The step relay and peer recovery dial the other workers' API ports as the coordinator
  // does: with this worker's certificate, checking theirs against the address dialled.
  std::optional<TlsMaterial> peer_tls = security.tls;
  if (peer_tls.has_value()) peer_tls->server_name.clear();
  auto peer_channel = [peer_tls](const std::string& address) {
    return MakeChannel(address, ChannelSecurity{peer_tls, ""});
  };
  config.read_peer_state = MakeGrpcPeerStateReader(peer_channel);
  StageManager manager(config, std::move(factory), MakeGrpcTensorSource(coordinator_channel));
  StepRelay relay(peer_channel);
  StageWorkerService service(&manager, &relay);

  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  int bound_port = 0;
  builder.AddListeningPort(JoinHostPort(listen->host, listen->port),
                           MakeServerCredentials(security), &bound_port);
  builder.SetMaxReceiveMessageSize(64 << 20);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || bound_port == 0) {
    spdlog::error("cannot listen on {}", absl::GetFlag(FLAGS_listen));
    return 1;
  }
  const std::string advertise =
      JoinHostPort(advertise_flag             ? advertise_flag->host
                   : IsWildcard(listen->host) ? Hostname()
                                              : listen->host,
                   advertise_flag && advertise_flag->port != 0 ? advertise_flag->port : bound_port);
  if (const std::string port_file = absl::GetFlag(FLAGS_port_file); !port_file.empty()) {
    if (absl::Status s = WritePortFile(port_file, bound_port); !s.ok()) {
      spdlog::error("{}", s.ToString());
      server->Shutdown();
      return 1;
    }
  }
  spdlog::info("tandem-worker {} serving on port {} (advertised as {}), device {}, {} thread(s)",
               kVersion, bound_port, advertise, device, threads);
  LogSecurity("tandem-worker", security);
  if (security.tls.has_value()) {
    spdlog::info(
        "tandem-worker: the Gloo data plane to the other workers stays plain TCP (no TLS)");
  }

  // Health on its own plaintext port: ready while registered with the coordinator.
  std::unique_ptr<HealthServer> health;
  if (!health_listen.empty()) {
    absl::StatusOr<std::unique_ptr<HealthServer>> h =
        HealthServer::Start(health_listen, "tandem.v1.StageWorker");
    if (!h.ok()) {
      spdlog::error("--health_listen={}: {}", health_listen, h.status().ToString());
      server->Shutdown();
      return 1;
    }
    health = *std::move(h);
    if (const std::string f = absl::GetFlag(FLAGS_health_port_file); !f.empty()) {
      if (absl::Status s = WritePortFile(f, health->port()); !s.ok()) {
        spdlog::error("{}", s.ToString());
        server->Shutdown();
        return 1;
      }
    }
    spdlog::info("health (grpc.health.v1, plaintext) on port {}", health->port());
  }

  RegistrationOptions reg;
  reg.address = advertise;
  reg.device = device;
  reg.threads = threads;
  reg.hostname = Hostname();
  reg.node = absl::GetFlag(FLAGS_node).empty() ? reg.hostname : absl::GetFlag(FLAGS_node);
  reg.device_uuid = device_uuid;
  reg.device_name = cuda_device >= 0 ? device_name : CpuDeviceName();
  spdlog::info("device {}: {}", device, reg.device_name);
  if (cuda_device < 0) {
    if (const std::string note = TakeBlasCoreRestartNote(OpenBlasCoreName()); !note.empty()) {
      spdlog::info("{}", note);
    }
    if (const std::string advice = BlasCoreAdvice(); !advice.empty()) spdlog::warn("{}", advice);
  }
  if (cuda_device >= 0) {
    reg.peak = device_peak;
    spdlog::info("peak bf16 GEMM on {} ({}): {:.1f} TFLOP/s ({})", device, device_uuid,
                 reg.peak.flops / 1e12, reg.peak.method);
  } else {
    PeakOptions peak_options = PeakOptionsFromFlags();
    peak_options.what =
        absl::StrCat("fp32 SGEMM 768^3 on ", threads, " thread", threads == 1 ? "" : "s");
    absl::StatusOr<PeakFlops> peak = MeasurePeak(CpuSgemmSample(768), peak_options);
    if (!peak.ok()) {
      spdlog::error("measuring the peak GEMM: {}", std::string(peak.status().message()));
      return 2;
    }
    reg.peak = *peak;
    spdlog::info("peak single-precision GEMM: {:.1f} GFLOP/s ({})", reg.peak.flops / 1e9,
                 reg.peak.method);
  }
  reg.heartbeat_interval = std::chrono::milliseconds(heartbeat_ms);
  if (security.tls.has_value()) {
    reg.unavailable_hint =
        " (with TLS, a failed handshake looks like this: check that the coordinator's --tls-ca "
        "signs this worker's certificate, that this worker's --tls-ca signs the coordinator's, "
        "and that the coordinator's certificate names the host of --coordinator, or give "
        "--tls-server-name)";
  }
  if (health != nullptr) {
    reg.on_connected = [h = health.get()](bool connected) { h->SetReady(connected); };
  }
  RegistrationClient registration(coordinator_channel, reg, &manager);
  registration.Start();

  std::thread signal_thread([&] {
    unsigned char sig = 0;
    while (read(signal_pipe[0], &sig, 1) < 0 && errno == EINTR) {
    }
    if (sig == 0) return;  // the pipe closed: Run() is ending without a signal
    spdlog::info("received {}, shutting down", sig == SIGTERM ? "SIGTERM" : "SIGINT");
    if (health != nullptr) health->Shutdown();  // NOT_SERVING from now on
    // Unblock a running step first so that the server's handlers can finish.
    manager.Shutdown();
    server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  });
  server->Wait();
  signal_thread.join();
  close(signal_pipe[0]);
  registration.Stop();
  spdlog::info("tandem-worker stopped");
  return 0;
}

}  // namespace
}  // namespace tandem::worker

int main(int argc, char** argv) {
  // Before anything can make a CUDA call (and while there is one thread): every kernel module
  // loads at the runtime's start, never behind a pending NCCL receive (module_loading.h).
  tandem::worker::cuda::UseEagerModuleLoading();
  const std::vector<std::string> args(argv, argv + argc);  // as given, to start again with
  tandem::DisableDebugMutexChecksInRelease();
  absl::SetProgramUsageMessage(
      "tandem-worker --coordinator HOST:PORT [--tls-cert FILE --tls-key FILE --tls-ca FILE] "
      "[flags]: without the --tls-* flags its API is plaintext and unauthenticated (one trusted "
      "machine only)");
  // Accept --data-root as well as --data_root (Abseil flag names are identifiers).
  tandem::NormalizeFlagDashes(argc, argv);
  tandem::HelpListsFlagsOf("worker/main.cc");
  absl::ParseCommandLine(argc, argv);
  {
    // OpenBLAS read OPENBLAS_CORETYPE as it loaded: other kernels need a new start, taken now,
    // before the worker opens a socket or a file or starts a thread (worker/blas_core_restart.h).
    const bool cpu = absl::GetFlag(FLAGS_device) == "cpu";
    absl::StatusOr<std::string> coretype = tandem::worker::BlasCoreToRestartWith(
        absl::GetFlag(FLAGS_blas_core), std::getenv("OPENBLAS_CORETYPE"),
        cpu ? tandem::worker::BetterBlasCoreType() : "");
    if (!coretype.ok()) {
      std::fprintf(stderr, "tandem-worker: %s\n", std::string(coretype.status().message()).c_str());
      return 2;
    }
    if (!coretype->empty()) {
      const absl::Status restarted =
          tandem::worker::RestartWithBlasCore(args, *coretype, tandem::worker::OpenBlasCoreName());
      std::fprintf(stderr, "tandem-worker: could not start again with OPENBLAS_CORETYPE=%s: %s\n",
                   coretype->c_str(), std::string(restarted.message()).c_str());
    }
  }
  if (absl::GetFlag(FLAGS_keep_heap)) {
    // Serve every allocation from the heap and never trim it, so the step's big buffers are
    // reused instead of being mmapped and page-faulted afresh on every forward pass. One arena:
    // steps run on whichever gRPC thread takes the RunStep, and with an arena per thread each
    // new thread grew (and faulted in) its own copy of the step's peak; a thread arena also
    // cannot hold a buffer over 64 MiB (the head's logits) and mmaps it on every use.
    mallopt(M_ARENA_MAX, 1);
    mallopt(M_MMAP_MAX, 0);
    mallopt(M_TRIM_THRESHOLD, std::numeric_limits<int>::max());
  }
  return tandem::worker::Run();
}
