// The coordinator at scale (issue 20, figure 5): how the coordinator's own cost per training
// step grows with the gang. For each gang size N it starts the real tandem-coordinator (a
// separate process on 127.0.0.1, as the integration harness does) and N fake workers in this
// process that answer the real RPCs with no compute: each registers and heartbeats through
// WorkerRegistry over a connection of its own, and serves StageWorker (Configure, RunStep,
// ApplyStep, SaveCheckpoint, Abort, GetStatus) with well-formed answers (the last stage of every
// replica reports a loss; one 1 us timing per action). A data-parallel job of 4 stages x N/4
// replicas then runs K steps, and the bench measures per step:
//   - the coordinator's CPU time (all its threads: clock_getcpuclockid on its pid, read when the
//     first RunStep of each step arrives, so that one sample spans one whole step cycle);
//   - the wall time of the cycle, and the coordinator's own step_seconds (RunStep fan-out to the
//     last ApplyStep; the fake compute is ~0, so this is all overhead);
//   - its memory (VmRSS, VmHWM from /proc/<pid>/status).
// Heartbeats cost the coordinator CPU whether or not a job runs: their cost is measured on the
// idle gang first and shown beside the per-step figure, which includes them (a job's workers
// heartbeat too). `--heartbeat-ms 10000` (workers told to heartbeat 10x less often) leaves
// mostly the step's own cost.
//
// The fake gang is one gRPC callback server listening on N ports: a call is routed to its fake
// worker by the :authority the coordinator dialled ("127.0.0.1:PORT", one per worker), so that
// N workers cost a few threads rather than N servers with thread pools of their own.
//
//   build/bin/bench_coordinator_scale [--workers 64,256,1024] [--steps 30] [--warmup 3]
//                                     [--heartbeat-ms 1000] [--idle-s 3]
//                                     [--heartbeat-per-worker-us N]
//                                     [--step-relay-min-workers N]
// --heartbeat-per-worker-us: passed to the coordinator (0 keeps the heartbeat interval at
// --heartbeat-ms whatever the gang; by default it grows to workers x 10 ms, and the fake
// workers follow the interval the coordinator tells them, as real ones do).
// --step-relay-min-workers: passed to the coordinator (0: no step relay, the coordinator calls
// every worker; by default gangs of 64 and more get the relay). The fake workers forward a
// relayed RunStep as real ones do, through the worker's own StepRelay (worker/step_relay.h).
#include <dirent.h>
#include <grpcpp/grpcpp.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "common/rpc.h"
#include "common/status_macros.h"
#include "common/version.h"
#include "tandem/v1/coordinator.grpc.pb.h"
#include "tandem/v1/worker.grpc.pb.h"
#include "tests/integration/harness.h"
#include "worker/step_relay.h"

namespace {

namespace v1 = tandem::v1;
using Steady = std::chrono::steady_clock;

struct BenchOptions {
  std::vector<int> workers = {64, 256, 1024};
  int steps = 30;
  int warmup = 3;  // step cycles left out of the statistics (connections, first allocations)
  int heartbeat_ms = 1000;  // the coordinator's default
  int idle_seconds = 3;     // the window that measures the idle gang's heartbeat cost
  // The coordinator's --heartbeat-per-worker-us (-1: its default, which stretches the interval
  // to workers x 10 ms; 0: a fixed --heartbeat-ms, as before it existed).
  int heartbeat_per_worker_us = -1;
  // The coordinator's --step-relay-min-workers (-1: its default).
  int step_relay_min_workers = -1;
};

constexpr int kStages = 4;

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(p / 100.0 * (v.size() - 1) + 0.5));
  return v[i];
}

// ------------------------------------------------------------------------------------------
// The coordinator process, seen from outside.

// CPU time (user + system, every thread) of another process in nanoseconds, through its CPU-time
// clock: nanosecond resolution, where /proc/<pid>/stat counts 10 ms ticks.
class ProcessCpu {
 public:
  static absl::StatusOr<ProcessCpu> Of(pid_t pid) {
    clockid_t clock;
    if (int e = clock_getcpuclockid(pid, &clock); e != 0) {
      return absl::InternalError(
          absl::StrCat("clock_getcpuclockid(", pid, "): ", std::strerror(e)));
    }
    ProcessCpu cpu(clock);
    RETURN_IF_ERROR(cpu.Nanos().status());
    return cpu;
  }
  absl::StatusOr<int64_t> Nanos() const {
    timespec ts;
    if (clock_gettime(clock_, &ts) != 0) {
      return absl::InternalError(absl::StrCat("clock_gettime: ", std::strerror(errno)));
    }
    return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
  }

 private:
  explicit ProcessCpu(clockid_t clock) : clock_(clock) {}
  clockid_t clock_;
};

// A field of /proc/<pid>/status in KiB ("VmRSS", "VmHWM"); -1 when absent.
int64_t StatusKib(pid_t pid, const std::string& field) {
  const std::string text = tandem::testing::ReadFile(absl::StrCat("/proc/", pid, "/status"));
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (!absl::ConsumePrefix(&line, field + ":")) continue;
    int64_t kib = -1;
    line = absl::StripAsciiWhitespace(line);
    absl::ConsumeSuffix(&line, " kB");
    return absl::SimpleAtoi(line, &kib) ? kib : -1;
  }
  return -1;
}

// CPU seconds per thread name (/proc/<pid>/task/*/stat: comm, utime, stime in clock ticks), to
// say which of the coordinator's threads a step's time goes to.
std::map<std::string, double> ThreadCpu(pid_t pid) {
  std::map<std::string, double> out;
  const std::string dir = absl::StrCat("/proc/", pid, "/task");
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return out;
  const double tick = 1.0 / static_cast<double>(sysconf(_SC_CLK_TCK));
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    const std::string stat = tandem::testing::ReadFile(dir + "/" + e->d_name + "/stat");
    const size_t open = stat.find('('), close = stat.rfind(')');
    if (open == std::string::npos || close == std::string::npos) continue;
    const std::string name = stat.substr(open + 1, close - open - 1);
    // After ") ": state is field 3; utime and stime are fields 14 and 15.
    std::vector<std::string> fields = absl::StrSplit(stat.substr(close + 2), ' ');
    int64_t utime = 0, stime = 0;
    if (fields.size() < 13 || !absl::SimpleAtoi(fields[11], &utime) ||
        !absl::SimpleAtoi(fields[12], &stime)) {
      continue;
    }
    out[name] += static_cast<double>(utime + stime) * tick;
  }
  closedir(d);
  return out;
}

// ------------------------------------------------------------------------------------------
// The fake gang.

// One fake worker: where it serves, its registration, and the program the coordinator gave it.
struct FakeWorker {
  int port = 0;
  std::string address;
  std::unique_ptr<v1::WorkerRegistry::Stub> registry;  // a connection of its own
  std::atomic<bool> heartbeat_in_flight{false};

  absl::Mutex mu;
  std::string worker_id ABSL_GUARDED_BY(mu);
  std::optional<v1::ClockSample> previous_round ABSL_GUARDED_BY(mu);
  std::string job_id ABSL_GUARDED_BY(mu);
  int32_t attempt ABSL_GUARDED_BY(mu) = 0;
  int rank ABSL_GUARDED_BY(mu) = 0;
  int num_actions ABSL_GUARDED_BY(mu) = 0;
  int num_replicas ABSL_GUARDED_BY(mu) = 1;
  bool last_stage ABSL_GUARDED_BY(mu) = false;  // holds the pipeline's last stage: reports the loss
  std::vector<int> stages ABSL_GUARDED_BY(mu);
  int64_t last_step ABSL_GUARDED_BY(mu) = -1;
};

// When each step's first RunStep arrived, and the coordinator's CPU time then.
struct StepMark {
  int64_t step = -1;
  Steady::time_point at;
  int64_t coordinator_cpu_ns = 0;
};

// Streams one small stage checkpoint: the index, then the data.
class CheckpointWriter final : public grpc::ServerWriteReactor<v1::TensorChunk> {
 public:
  explicit CheckpointWriter(int stage) {
    v1::TensorMeta* meta = chunks_[0].add_index();
    meta->set_name(absl::StrCat("stage", stage, ".weight"));
    meta->set_dtype("F32");
    meta->add_shape(4);
    chunks_[1].set_data(std::string(4 * sizeof(float), '\0'));
    StartWrite(&chunks_[0]);
  }
  void OnWriteDone(bool ok) override {
    if (!ok) return Finish(grpc::Status(grpc::StatusCode::CANCELLED, "stream closed"));
    if (++next_ < 2) return StartWrite(&chunks_[next_]);
    Finish(grpc::Status::OK);
  }
  void OnDone() override { delete this; }

 private:
  v1::TensorChunk chunks_[2];
  int next_ = 0;
};

// Registration calls in flight, at most kMaxInFlight at a time, and the first error.
class Registrations {
 public:
  static constexpr int kMaxInFlight = 64;
  void Reserve() {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(this, &Registrations::HasRoom));
    ++in_flight_;
  }
  void Done(const std::string& error) {
    absl::MutexLock lock(&mu_);
    if (!error.empty() && first_error_.empty()) first_error_ = error;
    --in_flight_;
    ++done_;
  }
  // Waits until `total` calls are done; returns the first error ("" if none).
  std::string AwaitAll(int total) {
    absl::MutexLock lock(&mu_);
    total_ = total;
    mu_.Await(absl::Condition(this, &Registrations::AllDone));
    return first_error_;
  }

 private:
  bool HasRoom() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return in_flight_ < kMaxInFlight; }
  bool AllDone() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return done_ >= total_; }

  absl::Mutex mu_;
  int in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  int done_ ABSL_GUARDED_BY(mu_) = 0;
  int total_ ABSL_GUARDED_BY(mu_) = 0;
  std::string first_error_ ABSL_GUARDED_BY(mu_);
};

// N fake workers behind one callback server on N ports, registering and heartbeating with a
// coordinator; each step's first RunStep samples the coordinator's CPU time (`coordinator_cpu`).
// Thread-safe; handlers never block on anything but a worker's own short critical section.
class FakeGang final : public v1::StageWorker::CallbackService {
 public:
  explicit FakeGang(ProcessCpu coordinator_cpu) : coordinator_cpu_(coordinator_cpu) {}
  ~FakeGang() override { Stop(); }

  // Listens on `n` ephemeral 127.0.0.1 ports.
  absl::Status Serve(int n) {
    workers_.reserve(static_cast<size_t>(n));
    std::vector<int> ports(static_cast<size_t>(n), 0);  // written by BuildAndStart
    grpc::ServerBuilder builder;
    for (int i = 0; i < n; ++i) {
      builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &ports[i]);
    }
    builder.RegisterService(this);
    server_ = builder.BuildAndStart();
    if (server_ == nullptr) {
      return absl::InternalError(absl::StrCat("cannot serve on ", n, " ports"));
    }
    for (int i = 0; i < n; ++i) {
      if (ports[i] <= 0 || ports[i] >= 65536 || worker_of_port_[ports[i]] >= 0) {
        return absl::InternalError(absl::StrCat("listening port ", i, " did not bind"));
      }
      auto w = std::make_unique<FakeWorker>();
      w->port = ports[i];
      w->address = absl::StrCat("127.0.0.1:", ports[i]);
      worker_of_port_[ports[i]] = i;
      workers_.push_back(std::move(w));
    }
    return absl::OkStatus();
  }

  // Registers every worker (at most 64 at a time), each over a connection of its own, and starts
  // heartbeating every `interval`, spread evenly over the interval as independent workers would.
  absl::Status Register(const std::string& coordinator, std::chrono::milliseconds interval,
                        std::chrono::seconds timeout) {
    grpc::ChannelArguments args;
    // Its own subchannel pool: a TCP connection per worker, as N processes would have.
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    for (auto& w : workers_) {
      w->registry = v1::WorkerRegistry::NewStub(
          grpc::CreateCustomChannel(coordinator, grpc::InsecureChannelCredentials(), args));
    }
    heartbeats_ = std::thread([this, interval] { HeartbeatLoop(interval); });
    Registrations pending;
    for (auto& w : workers_) {
      pending.Reserve();
      auto call = std::make_shared<Call<v1::RegisterRequest, v1::RegisterResponse>>(timeout);
      call->req.set_protocol_version(tandem::kProtocolVersion);
      call->req.set_address(w->address);
      call->req.set_device("cpu");
      call->req.set_threads(1);
      call->req.set_hostname("bench");
      call->req.set_version(tandem::kVersion);
      FakeWorker* fw = w.get();
      w->registry->async()->Register(
          &call->ctx, &call->req, &call->resp, [this, call, fw, &pending](grpc::Status s) {
            if (s.ok()) {
              absl::MutexLock lock(&fw->mu);
              fw->worker_id = call->resp.worker_id();
            }
            if (s.ok() && call->resp.heartbeat_interval_ms() > 0) {
              told_interval_ms_.store(call->resp.heartbeat_interval_ms());
            }
            pending.Done(s.ok() ? "" : absl::StrCat(fw->address, ": ", s.error_message()));
          });
    }
    // Each call has its deadline, so this wait ends.
    const std::string error = pending.AwaitAll(static_cast<int>(workers_.size()));
    if (!error.empty()) return absl::UnavailableError("register: " + error);
    return absl::OkStatus();
  }

  void Stop() {
    stop_.store(true);
    if (heartbeats_.joinable()) heartbeats_.join();
    if (server_ != nullptr) {
      server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
      server_.reset();
    }
  }

  int size() const { return static_cast<int>(workers_.size()); }
  int64_t heartbeat_failures() const { return heartbeat_failures_.load(); }
  std::vector<StepMark> marks() const {
    absl::MutexLock lock(&marks_mu_);
    return marks_;
  }
  std::string first_error() const {
    absl::MutexLock lock(&marks_mu_);
    return first_error_;
  }

  // ---- StageWorker, with no compute.

  grpc::ServerUnaryReactor* Configure(grpc::CallbackServerContext* ctx,
                                      const v1::ConfigureRequest* req,
                                      v1::ConfigureResponse* resp) override {
    auto* reactor = ctx->DefaultReactor();
    FakeWorker* w = WorkerOf(ctx);
    if (w == nullptr) return Refuse(reactor, ctx);
    const v1::StageProgram& p = req->program();
    {
      absl::MutexLock lock(&w->mu);
      w->job_id = p.job_id();
      w->attempt = p.attempt();
      w->rank = p.rank();
      w->num_actions = p.actions_size();
      w->num_replicas = std::max(1, p.num_replicas());
      w->stages.clear();
      for (const v1::StageChunk& c : p.chunks()) w->stages.push_back(c.stage());
      w->last_stage = p.num_stages() > 0 && p.stage_ranks_size() == p.num_stages() &&
                      p.stage_ranks(p.num_stages() - 1) == p.rank();
      w->last_step = -1;
    }
    resp->set_parameter_count(1000);
    resp->set_parameter_bytes(4000);
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

  grpc::ServerUnaryReactor* RunStep(grpc::CallbackServerContext* ctx, const v1::RunStepRequest* req,
                                    v1::RunStepResponse* resp) override {
    auto* reactor = ctx->DefaultReactor();
    FakeWorker* w = WorkerOf(ctx);
    if (w == nullptr) return Refuse(reactor, ctx);
    if (req->mode() == v1::STEP_MODE_TRAIN) MarkStep(req->step());
    v1::StepReport* rep = resp->mutable_report();
    absl::MutexLock lock(&w->mu);
    if (req->job_id() != w->job_id || req->attempt() != w->attempt) {
      reactor->Finish(grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                                   absl::StrCat("not configured for ", req->job_id())));
      return reactor;
    }
    w->last_step = req->step();
    const int64_t start = tandem::UnixMicros();
    rep->set_step(req->step());
    rep->set_rank(w->rank);
    // One microsecond per action, in program order: well formed and next to nothing.
    for (int i = 0; i < w->num_actions; ++i) {
      v1::ActionTiming* t = rep->add_timings();
      t->set_index(i);
      t->set_start_us(start + i);
      t->set_end_us(start + i + 1);
    }
    rep->set_exec_us(w->num_actions);
    rep->set_start_us(start);
    rep->set_end_us(start + w->num_actions);
    if (w->last_stage) {
      rep->set_has_loss(true);
      // Each replica's share of the global batch's mean (the coordinator sums them).
      rep->set_loss(5.5 / (1.0 + 0.01 * static_cast<double>(req->step())) / w->num_replicas);
      rep->set_tokens(64);
    }
    rep->set_grad_norm_sq(1e-4);
    rep->set_grads_finite(true);
    rep->set_bytes_sent(4096);
    rep->set_bytes_received(4096);
    rep->set_peak_activation_bytes(8192);
    if (w->num_replicas > 1) rep->set_reduced_bytes(4000);
    for (int s : w->stages) {
      v1::StageMemory* m = rep->add_stage_memory();
      m->set_stage(s);
      m->set_parameter_bytes(4000);
      m->set_gradient_bytes(4000);
      m->set_optimizer_bytes(8000);
      m->set_static_bytes(16000);
      m->set_peak_activation_bytes(8192);
    }
    if (req->relay_size() == 0) {
      reactor->Finish(grpc::Status::OK);
      return reactor;
    }
    // The step relay: forward as a real worker does, answer when every forwarded call has.
    relay_.Forward(*req, ctx->deadline(), nullptr,
                   [reactor, ctx, resp](tandem::worker::StepRelay::Outcome outcome) {
                     if (!outcome.status.ok()) {
                       ctx->AddTrailingMetadata(tandem::kRelayedRankKey,
                                                absl::StrCat(outcome.failed_rank));
                       reactor->Finish(tandem::ToGrpcStatus(outcome.status));
                       return;
                     }
                     for (v1::RelayedStep& r : outcome.relayed) {
                       *resp->add_relayed() = std::move(r);
                     }
                     reactor->Finish(grpc::Status::OK);
                   });
    return reactor;
  }

  grpc::ServerUnaryReactor* ApplyStep(grpc::CallbackServerContext* ctx,
                                      const v1::ApplyStepRequest* req,
                                      v1::ApplyStepResponse*) override {
    auto* reactor = ctx->DefaultReactor();
    FakeWorker* w = WorkerOf(ctx);
    if (w == nullptr) return Refuse(reactor, ctx);
    absl::MutexLock lock(&w->mu);
    if (req->job_id() != w->job_id || req->step() != w->last_step) {
      reactor->Finish(grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                                   absl::StrCat("no gradients pending for step ", req->step())));
      return reactor;
    }
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

  grpc::ServerWriteReactor<v1::TensorChunk>* SaveCheckpoint(
      grpc::CallbackServerContext* ctx, const v1::SaveCheckpointRequest*) override {
    FakeWorker* w = WorkerOf(ctx);
    int stage = 0;
    if (w != nullptr) {
      absl::MutexLock lock(&w->mu);
      stage = w->stages.empty() ? 0 : w->stages[0];
    }
    return new CheckpointWriter(stage);
  }

  grpc::ServerUnaryReactor* Abort(grpc::CallbackServerContext* ctx, const v1::AbortRequest* req,
                                  v1::AbortResponse*) override {
    auto* reactor = ctx->DefaultReactor();
    if (FakeWorker* w = WorkerOf(ctx); w != nullptr) {
      absl::MutexLock lock(&w->mu);
      if (req->job_id() == w->job_id) w->job_id.clear();
    }
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

  grpc::ServerUnaryReactor* GetStatus(grpc::CallbackServerContext* ctx, const v1::GetStatusRequest*,
                                      v1::WorkerStatus* resp) override {
    auto* reactor = ctx->DefaultReactor();
    FakeWorker* w = WorkerOf(ctx);
    if (w == nullptr) return Refuse(reactor, ctx);
    absl::MutexLock lock(&w->mu);
    resp->set_worker_id(w->worker_id);
    resp->set_state(w->job_id.empty() ? v1::IDLE : v1::BUSY);
    resp->set_job_id(w->job_id);
    resp->set_last_step(w->last_step);
    resp->set_version(tandem::kVersion);
    resp->set_device("cpu");
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

 private:
  // A client call's state, alive until its callback has run.
  template <typename Req, typename Resp>
  struct Call {
    explicit Call(std::chrono::milliseconds timeout) {
      ctx.set_deadline(std::chrono::system_clock::now() + timeout);
    }
    grpc::ClientContext ctx;
    Req req;
    Resp resp;
  };

  // The worker a call was dialled at: the coordinator's channel to "127.0.0.1:PORT" sends that
  // as its :authority.
  FakeWorker* WorkerOf(grpc::CallbackServerContext* ctx) const {
    const grpc::string_ref authority = ctx->ExperimentalGetAuthority();
    const absl::string_view a(authority.data(), authority.size());
    const size_t colon = a.rfind(':');
    int port = 0;
    if (colon == absl::string_view::npos || !absl::SimpleAtoi(a.substr(colon + 1), &port) ||
        port <= 0 || port >= 65536 || worker_of_port_[port] < 0) {
      return nullptr;
    }
    return workers_[static_cast<size_t>(worker_of_port_[port])].get();
  }

  grpc::ServerUnaryReactor* Refuse(grpc::ServerUnaryReactor* reactor,
                                   grpc::CallbackServerContext* ctx) {
    const grpc::string_ref a = ctx->ExperimentalGetAuthority();
    const std::string message =
        absl::StrCat("no fake worker at authority '", std::string(a.data(), a.size()), "'");
    {
      absl::MutexLock lock(&marks_mu_);
      if (first_error_.empty()) first_error_ = message;
    }
    reactor->Finish(grpc::Status(grpc::StatusCode::NOT_FOUND, message));
    return reactor;
  }

  // The first RunStep of a step: a step cycle boundary.
  void MarkStep(int64_t step) {
    int64_t seen = last_marked_.load();
    while (step > seen) {
      if (!last_marked_.compare_exchange_weak(seen, step)) continue;
      StepMark m;
      m.step = step;
      m.at = Steady::now();
      absl::StatusOr<int64_t> cpu = coordinator_cpu_.Nanos();
      m.coordinator_cpu_ns = cpu.ok() ? *cpu : -1;
      absl::MutexLock lock(&marks_mu_);
      marks_.push_back(m);
      return;
    }
  }

  void Heartbeat(FakeWorker* w, std::chrono::milliseconds timeout) {
    auto call = std::make_shared<Call<v1::HeartbeatRequest, v1::HeartbeatResponse>>(timeout);
    {
      absl::MutexLock lock(&w->mu);
      if (w->worker_id.empty()) return;
      call->req.set_worker_id(w->worker_id);
      call->req.set_state(w->job_id.empty() ? v1::IDLE : v1::BUSY);
      call->req.set_job_id(w->job_id);
      if (w->previous_round.has_value()) *call->req.mutable_previous_round() = *w->previous_round;
    }
    if (w->heartbeat_in_flight.exchange(true)) return;  // the last one has not come back yet
    call->req.set_protocol_version(tandem::kProtocolVersion);
    const int64_t sent = tandem::UnixMicros();
    call->req.set_worker_unix_us(sent);
    w->registry->async()->Heartbeat(
        &call->ctx, &call->req, &call->resp, [this, w, call, sent](grpc::Status s) {
          const int64_t received = tandem::UnixMicros();
          {
            // The round trip's four timestamps go with the next heartbeat, as a worker's do.
            absl::MutexLock lock(&w->mu);
            w->previous_round.reset();
            if (s.ok()) {
              v1::ClockSample& c = w->previous_round.emplace();
              c.set_worker_send_unix_us(sent);
              c.set_coordinator_receive_unix_us(call->resp.coordinator_receive_unix_us());
              c.set_coordinator_send_unix_us(call->resp.coordinator_unix_us());
              c.set_worker_receive_unix_us(received);
            }
          }
          if (!s.ok()) heartbeat_failures_.fetch_add(1);
          // As a worker does: the interval the coordinator tells (it grows with the gang).
          if (s.ok() && call->resp.heartbeat_interval_ms() > 0) {
            told_interval_ms_.store(call->resp.heartbeat_interval_ms());
          }
          w->heartbeat_in_flight.store(false);
        });
  }

  // Every worker once per interval (`interval` until the coordinator tells another, as it does
  // in its responses), evenly spread; until Stop().
  void HeartbeatLoop(std::chrono::milliseconds interval) {
    auto next = Steady::now();
    while (!stop_.load()) {
      const int told = told_interval_ms_.load();
      if (told > 0) interval = std::chrono::milliseconds(told);
      const auto gap = interval / std::max<size_t>(1, workers_.size());
      for (auto& w : workers_) {
        if (stop_.load()) break;
        next += gap;
        std::this_thread::sleep_until(next);
        Heartbeat(w.get(), interval * 5);
      }
      // Fell behind (a starved machine): start the next round now rather than bursting.
      next = std::max(next, Steady::now());
    }
    // Wait (bounded) for the calls in flight: their callbacks use the workers.
    const auto deadline = Steady::now() + interval * 6;
    for (auto& w : workers_) {
      while (w->heartbeat_in_flight.load() && Steady::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
    }
  }

  const ProcessCpu coordinator_cpu_;
  tandem::worker::StepRelay relay_{
      [](const std::string& address) { return tandem::MakeInsecureChannel(address); }};
  std::unique_ptr<grpc::Server> server_;
  std::vector<std::unique_ptr<FakeWorker>> workers_;  // fixed once Serve returns
  std::vector<int> worker_of_port_ = std::vector<int>(65536, -1);
  std::thread heartbeats_;
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> heartbeat_failures_{0};
  std::atomic<int> told_interval_ms_{0};  // the coordinator's latest heartbeat_interval_ms
  std::atomic<int64_t> last_marked_{-1};
  mutable absl::Mutex marks_mu_;
  std::vector<StepMark> marks_ ABSL_GUARDED_BY(marks_mu_);
  std::string first_error_ ABSL_GUARDED_BY(marks_mu_);
};

// ------------------------------------------------------------------------------------------
// One gang size.

struct Row {
  int workers = 0;
  int steps = 0;                 // step cycles in the statistics
  double idle_cpu_ms_per_s = 0;  // heartbeats of the idle gang
  double cpu_p50_ms = 0, cpu_p99_ms = 0;
  double cycle_p50_ms = 0, step_p50_ms = 0, step_p99_ms = 0;
  double rss_idle_mib = 0, rss_mib = 0, hwm_mib = 0;
  std::vector<std::pair<std::string, double>> threads;  // CPU s per thread name over the job
};

std::string Spec(int workers, int steps) {
  return absl::StrCat("name: scale-", workers, "\nsteps: ", steps,
                      "\nseed: 7\nmax_restarts: 0\n"
                      "model:\n  arch: mlp_lm\n  n_layer: 2\n  d_model: 16\n  d_embed: 4\n"
                      "  context: 4\n"
                      "pipeline:\n  stages: ",
                      kStages, "\n  replicas: ", workers / kStages,
                      "\n  micro_batch_size: 1\n  micro_batches: ", kStages,
                      "\n  schedule: 1f1b\n  partition: uniform\n");
}

absl::StatusOr<Row> RunGang(int n, const BenchOptions& opt) {
  using tandem::testing::Cluster;
  Cluster::Options options;
  options.workers = 0;
  options.heartbeat_ms = opt.heartbeat_ms;
  // Generous: on a 2-core machine the fake gang and the coordinator share the cores, and a
  // heartbeat a few seconds late must not fail the job.
  options.worker_timeout_ms = std::max(15000, opt.heartbeat_ms * 10);
  if (opt.heartbeat_per_worker_us >= 0) {
    options.coordinator_args.push_back(
        absl::StrCat("--heartbeat_per_worker_us=", opt.heartbeat_per_worker_us));
  }
  if (opt.step_relay_min_workers >= 0) {
    options.coordinator_args.push_back(
        absl::StrCat("--step_relay_min_workers=", opt.step_relay_min_workers));
  }
  Cluster cluster(options);
  RETURN_IF_ERROR(cluster.Start());
  const pid_t pid = cluster.coordinator().pid();
  ASSIGN_OR_RETURN(const ProcessCpu cpu, ProcessCpu::Of(pid));

  FakeGang gang(cpu);
  RETURN_IF_ERROR(gang.Serve(n));
  const auto t_register = Steady::now();
  RETURN_IF_ERROR(gang.Register(cluster.address(), std::chrono::milliseconds(opt.heartbeat_ms),
                                std::chrono::seconds(60)));
  size_t idle = 0;
  if (!tandem::testing::WaitFor(
          [&] {
            auto w = cluster.Workers();
            if (!w.ok()) return false;
            idle = 0;
            for (const auto& info : *w) idle += info.state() == v1::IDLE;
            return idle >= static_cast<size_t>(n);
          },
          std::chrono::seconds(60), std::chrono::milliseconds(200))) {
    return absl::DeadlineExceededError(
        absl::StrCat(idle, " of ", n, " fake workers idle at the coordinator after 60 s"));
  }
  std::fprintf(stderr, "  %d workers registered in %.1f s\n", n,
               std::chrono::duration<double>(Steady::now() - t_register).count());

  Row row;
  row.workers = n;
  // The idle gang: heartbeats only (after one full round, so that every worker's are flowing).
  std::this_thread::sleep_for(std::chrono::milliseconds(opt.heartbeat_ms));
  ASSIGN_OR_RETURN(const int64_t idle0, cpu.Nanos());
  const auto t_idle = Steady::now();
  std::this_thread::sleep_for(std::chrono::seconds(opt.idle_seconds));
  ASSIGN_OR_RETURN(const int64_t idle1, cpu.Nanos());
  const double idle_s = std::chrono::duration<double>(Steady::now() - t_idle).count();
  row.idle_cpu_ms_per_s = static_cast<double>(idle1 - idle0) * 1e-6 / idle_s;
  row.rss_idle_mib = static_cast<double>(StatusKib(pid, "VmRSS")) / 1024.0;

  ASSIGN_OR_RETURN(const std::string id, cluster.Submit(Spec(n, opt.steps)));
  // Bounded: a step of 1,024 fake workers takes well under a second here; allow 10 s each.
  const auto budget = std::chrono::seconds(60 + 10 * opt.steps);
  // Polled for its state only (history_limit 1), twice a second: a poll costs the coordinator
  // CPU too, and the whole history is read once at the end.
  // The threads' CPU is read while the job runs (its runner thread ends with it): from the
  // first poll after the warm-up to the last poll before the end.
  absl::StatusOr<v1::Job> job;
  std::map<std::string, double> threads0, threads1;
  tandem::testing::WaitFor(
      [&] {
        if (threads0.empty()) {
          const std::vector<StepMark> marks = gang.marks();
          if (!marks.empty() && marks.back().step >= opt.warmup) threads0 = ThreadCpu(pid);
        } else {
          threads1 = ThreadCpu(pid);
        }
        job = cluster.client().GetJob(id, 1);
        return !job.ok() || job->state() == v1::SUCCEEDED || job->state() == v1::FAILED ||
               job->state() == v1::CANCELLED;
      },
      budget, std::chrono::milliseconds(500));
  const int64_t rss_kib = StatusKib(pid, "VmRSS");
  const int64_t hwm_kib = StatusKib(pid, "VmHWM");
  if (!job.ok()) return job.status();
  if (job->state() == v1::SUCCEEDED) job = cluster.GetJob(id);
  if (!job.ok()) return job.status();
  if (job->state() != v1::SUCCEEDED) {
    std::string why = job->reason();
    if (const std::string e = gang.first_error(); !e.empty()) absl::StrAppend(&why, "; ", e);
    return absl::InternalError(absl::StrCat("job ", id, " ended ", v1::JobState_Name(job->state()),
                                            " (after ", budget.count(), " s at most): ", why));
  }
  row.rss_mib = static_cast<double>(rss_kib) / 1024.0;
  row.hwm_mib = static_cast<double>(hwm_kib) / 1024.0;
  for (const auto& [name, s] : threads1) {
    auto it = threads0.find(name);
    const double d = s - (it == threads0.end() ? 0.0 : it->second);
    if (d > 0) row.threads.emplace_back(name, d);
  }
  std::sort(row.threads.begin(), row.threads.end(),
            [](const auto& a, const auto& b) { return a.second > b.second; });

  // Step cycles: from one step's first RunStep to the next's. The last step (followed by the
  // checkpoint and the job's end) is in none.
  const std::vector<StepMark> marks = gang.marks();
  std::vector<double> cpu_ms, cycle_ms;
  for (size_t i = 0; i + 1 < marks.size(); ++i) {
    if (marks[i].step < opt.warmup || marks[i + 1].step != marks[i].step + 1) continue;
    if (marks[i].coordinator_cpu_ns < 0 || marks[i + 1].coordinator_cpu_ns < 0) continue;
    const double c =
        static_cast<double>(marks[i + 1].coordinator_cpu_ns - marks[i].coordinator_cpu_ns) * 1e-6;
    const double w =
        std::chrono::duration<double, std::milli>(marks[i + 1].at - marks[i].at).count();
    cpu_ms.push_back(c);
    cycle_ms.push_back(w);
  }
  if (cpu_ms.empty()) {
    return absl::InternalError(absl::StrCat("no step cycle measured (", marks.size(),
                                            " step marks; --steps must exceed --warmup + 1)"));
  }
  std::vector<double> step_ms;
  for (const v1::StepSummary& s : job->history()) {
    if (s.step() >= opt.warmup) step_ms.push_back(s.step_seconds() * 1e3);
  }
  row.steps = static_cast<int>(cpu_ms.size());
  row.cpu_p50_ms = Percentile(cpu_ms, 50);
  row.cpu_p99_ms = Percentile(cpu_ms, 99);
  row.cycle_p50_ms = Percentile(cycle_ms, 50);
  row.step_p50_ms = Percentile(step_ms, 50);
  row.step_p99_ms = Percentile(step_ms, 99);
  if (gang.heartbeat_failures() > 0) {
    std::fprintf(stderr, "  warning: %lld heartbeats failed\n",
                 static_cast<long long>(gang.heartbeat_failures()));
  }
  gang.Stop();
  return row;
}

bool ParseFlags(int argc, char** argv, BenchOptions* opt) {
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "%s needs a value\n", flag.c_str());
      return false;
    }
    const std::string value = argv[++i];
    int* target = flag == "--steps"                     ? &opt->steps
                  : flag == "--warmup"                  ? &opt->warmup
                  : flag == "--heartbeat-ms"            ? &opt->heartbeat_ms
                  : flag == "--idle-s"                  ? &opt->idle_seconds
                  : flag == "--heartbeat-per-worker-us" ? &opt->heartbeat_per_worker_us
                  : flag == "--step-relay-min-workers"  ? &opt->step_relay_min_workers
                                                        : nullptr;
    if (flag == "--workers") {
      opt->workers.clear();
      for (absl::string_view part : absl::StrSplit(value, ',')) {
        int n = 0;
        if (!absl::SimpleAtoi(part, &n) || n < kStages || n % kStages != 0 || n > 4096) {
          std::fprintf(stderr, "--workers: '%s' is not a multiple of %d in [%d, 4096]\n",
                       std::string(part).c_str(), kStages, kStages);
          return false;
        }
        opt->workers.push_back(n);
      }
    } else if (target == nullptr || !absl::SimpleAtoi(value, target)) {
      std::fprintf(stderr, "unknown flag or bad value: %s %s\n", flag.c_str(), value.c_str());
      return false;
    }
  }
  if (opt->steps < opt->warmup + 3 || opt->steps > 100000 || opt->warmup < 0 ||
      opt->heartbeat_ms < 10 || opt->idle_seconds < 1 || opt->idle_seconds > 600) {
    std::fprintf(stderr,
                 "need --steps >= --warmup + 3, --warmup >= 0, --heartbeat-ms >= 10, "
                 "--idle-s in [1, 600]\n");
    return false;
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  BenchOptions opt;
  if (!ParseFlags(argc, argv, &opt)) {
    std::fprintf(stderr,
                 "usage: %s [--workers 64,256,1024] [--steps 30] [--warmup 3] "
                 "[--heartbeat-ms 1000] [--idle-s 3]\n",
                 argv[0]);
    return 2;
  }
  // Each fake worker holds a listening socket, the coordinator's connection to it and its own
  // connection to the coordinator; the coordinator (a child: it inherits the limit) two.
  rlimit files;
  if (getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur < files.rlim_max) {
    files.rlim_cur = files.rlim_max;
    (void)setrlimit(RLIMIT_NOFILE, &files);
  }
  std::vector<Row> rows;
  for (int n : opt.workers) {
    std::fprintf(stderr, "gang of %d fake workers (%d stages x %d replicas), %d steps\n", n,
                 kStages, n / kStages, opt.steps);
    absl::StatusOr<Row> row = RunGang(n, opt);
    if (!row.ok()) {
      std::fprintf(stderr, "%d workers: %s\n", n, row.status().ToString().c_str());
      return 1;
    }
    rows.push_back(*row);
  }
  std::printf(
      "coordinator at scale: %d steps per gang (first %d left out), heartbeats every %d ms%s; "
      "fake workers, no compute\n",
      opt.steps, opt.warmup, opt.heartbeat_ms,
      opt.heartbeat_per_worker_us == 0
          ? ""
          : absl::StrCat(" or workers x ",
                         opt.heartbeat_per_worker_us < 0 ? 10000 : opt.heartbeat_per_worker_us,
                         " us, the longer (the coordinator's interval)")
                .c_str());
  // cpu: the coordinator's CPU per step cycle (p50, p99) and per worker (p50 / N); idle cpu:
  // its CPU per second for the idle gang's heartbeats; step: its own step_seconds (RunStep
  // fan-out to the last ApplyStep); cycle: one step's first RunStep to the next's.
  std::printf("%7s %9s %9s %9s %11s %10s %10s %9s %9s %9s\n", "workers", "cpu p50", "cpu p99",
              "cpu/wkr", "idle cpu", "step p50", "cycle p50", "RSS idle", "RSS", "HWM");
  std::printf("%7s %9s %9s %9s %11s %10s %10s %9s %9s %9s\n", "", "ms/step", "ms/step", "us",
              "ms/s", "ms", "ms", "MiB", "MiB", "MiB");
  for (const Row& r : rows) {
    std::printf("%7d %9.2f %9.2f %9.1f %11.1f %10.2f %10.2f %9.1f %9.1f %9.1f\n", r.workers,
                r.cpu_p50_ms, r.cpu_p99_ms, r.cpu_p50_ms * 1e3 / r.workers, r.idle_cpu_ms_per_s,
                r.step_p50_ms, r.cycle_p50_ms, r.rss_idle_mib, r.rss_mib, r.hwm_mib);
  }
  // Where the time goes at the largest gang: the coordinator's threads by name over the job.
  const Row& last = rows.back();
  std::printf("\ncoordinator threads at %d workers, CPU s while the job ran (after the warm-up):\n",
              last.workers);
  if (last.threads.empty()) std::printf("  (the job ended before a second sample)\n");
  for (size_t i = 0; i < last.threads.size() && i < 8; ++i) {
    std::printf("  %-20s %8.2f\n", last.threads[i].first.c_str(), last.threads[i].second);
  }
  return 0;
}
