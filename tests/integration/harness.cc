#include "tests/integration/harness.h"

#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <condition_variable>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/status_macros.h"
#include "grpcpp/generic/generic_stub.h"
#include "gtest/gtest.h"

namespace tandem::testing {
namespace {

// Starts argv with stdin from /dev/null and stdout/stderr to files, and no other descriptor
// of the test's (a helper process that outlives its parent must not hold the test's pipes or
// sockets open). With `own_group` the child leads a new process group, so that the whole of a
// command (a browser and its renderers, a shell and what it started) can be killed at once.
pid_t Spawn(const std::vector<std::string>& argv, const std::string& out_path,
            const std::string& err_path, bool own_group = false) {
  std::vector<char*> cargv;
  for (const auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  const pid_t parent = getpid();
  pid_t pid = fork();
  if (pid == 0) {
    // Die with the test process, whatever happens to it.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    int out = open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int err =
        err_path == out_path ? out : open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int in = open("/dev/null", O_RDONLY);
    dup2(in, 0);
    dup2(out, 1);
    dup2(err, 2);
    // Every other descriptor closes at exec (close_range(2), Linux 5.11; glibc 2.34).
    if (close_range(3, ~0U, CLOSE_RANGE_CLOEXEC) != 0) {
      for (int fd = 3; fd < 65536; ++fd) fcntl(fd, F_SETFD, FD_CLOEXEC);  // an older kernel
    }
    if (own_group) setpgid(0, 0);
    execv(cargv[0], cargv.data());
    _exit(127);
  }
  return pid;
}

}  // namespace

Process::Process(const std::string& binary, const std::vector<std::string>& args,
                 const std::string& log_path)
    : log_path_(log_path) {
  std::vector<std::string> argv{binary};
  argv.insert(argv.end(), args.begin(), args.end());
  pid_ = Spawn(argv, log_path, log_path);
}

Process::~Process() {
  if (pid_ > 0 && !reaped_) {
    kill(pid_, SIGKILL);
    Wait();
  }
}

void Process::Kill(int signal) {
  if (pid_ > 0 && !reaped_) kill(pid_, signal);
}

int Process::Wait() {
  if (!reaped_) {
    waitpid(pid_, &status_, 0);
    reaped_ = true;
  }
  if (WIFEXITED(status_)) return WEXITSTATUS(status_);
  if (WIFSIGNALED(status_)) return 128 + WTERMSIG(status_);
  return -1;
}

bool Process::Running() {
  if (reaped_) return false;
  pid_t r = waitpid(pid_, &status_, WNOHANG);
  if (r == pid_) reaped_ = true;
  return !reaped_;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

HealthAnswer CheckHealth(std::shared_ptr<grpc::Channel> channel, const std::string& service) {
  grpc::GenericStub stub(std::move(channel));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  std::string request_bytes;
  if (!service.empty()) {
    request_bytes = std::string("\x0a", 1) + static_cast<char>(service.size()) + service;
  }
  grpc::Slice slice(request_bytes);
  grpc::ByteBuffer request(&slice, 1);
  grpc::ByteBuffer response;
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  grpc::Status status;
  stub.UnaryCall(&ctx, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request, &response,
                 [&](grpc::Status s) {
                   std::lock_guard<std::mutex> lock(mu);
                   status = s;
                   done = true;
                   cv.notify_one();
                 });
  std::unique_lock<std::mutex> lock(mu);
  cv.wait(lock, [&] { return done; });
  HealthAnswer answer;
  answer.code = status.error_code();
  if (!status.ok()) return answer;
  std::vector<grpc::Slice> slices;
  (void)response.Dump(&slices);
  std::string bytes;
  for (const auto& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  // An empty message is status 0 (UNKNOWN); otherwise field 1, varint: 08 NN.
  answer.status = bytes.size() == 2 && bytes[0] == '\x08' ? bytes[1] : 0;
  return answer;
}

CommandResult RunCommand(const std::vector<std::string>& argv, std::chrono::seconds timeout) {
  char dir_template[] = "/tmp/tandem-cmd-XXXXXX";
  std::string dir = mkdtemp(dir_template);
  const std::string out = dir + "/out", err = dir + "/err";
  pid_t pid = Spawn(argv, out, err, /*own_group=*/true);
  // The parent sets the group too: whichever of the two runs first, a kill of -pid below
  // cannot miss the child.
  setpgid(pid, pid);
  CommandResult result;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  int status = 0;
  while (true) {
    pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) break;
    if (std::chrono::steady_clock::now() > deadline) {
      kill(-pid, SIGKILL);
      waitpid(pid, &status, 0);
      result.err = "timed out\n";
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  // What the command left running in its group (a browser's renderers and crash handler, a
  // shell's background job) goes with it.
  kill(-pid, SIGKILL);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  result.out = ReadFile(out);
  result.err += ReadFile(err);
  std::remove(out.c_str());
  std::remove(err.c_str());
  rmdir(dir.c_str());
  return result;
}

bool WaitFor(const std::function<bool()>& pred, std::chrono::milliseconds timeout,
             std::chrono::milliseconds every) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(every);
  }
  return pred();
}

Cluster::Cluster(Options options) : options_(options) {
  char dir_template[] = "/tmp/tandem-it-XXXXXX";
  dir_ = mkdtemp(dir_template);
}

Cluster::~Cluster() {
  workers_.clear();
  coordinator_.reset();
  if (std::getenv("TANDEM_KEEP_TEST_DIRS") == nullptr) {
    std::string cmd = "rm -rf '" + dir_ + "'";
    if (std::system(cmd.c_str()) != 0) {
      // Best effort.
    }
  }
}

absl::Status MakeDevCerts(const std::string& dir) {
  const CommandResult r =
      RunCommand({std::string(TANDEM_SOURCE_DIR) + "/scripts/dev-certs.sh", dir, "--days", "2"},
                 std::chrono::seconds(60));
  if (r.exit_code != 0) {
    return absl::InternalError(absl::StrCat("scripts/dev-certs.sh ", dir, ": ", r.err));
  }
  return absl::OkStatus();
}

ChannelSecurity Cluster::ClientSecurity() const {
  ChannelSecurity security;
  if (!options_.tls) return security;
  TlsMaterial tls;
  tls.ca_pem = ReadFile(certs_dir() + "/ca.crt");
  security.tls = tls;
  security.bearer_token = std::string(absl::StripAsciiWhitespace(ReadFile(certs_dir() + "/token")));
  return security;
}

std::vector<std::string> Cluster::WorkerTlsFlags() const {
  if (!options_.tls) return {};
  return {"--tls-cert=" + certs_dir() + "/worker.crt", "--tls-key=" + certs_dir() + "/worker.key",
          "--tls-ca=" + certs_dir() + "/ca.crt"};
}

absl::Status Cluster::StartCoordinator(int port) {
  const std::string port_file = dir_ + "/coordinator.port";
  const std::string http_port_file = dir_ + "/coordinator-http.port";
  const std::string health_port_file = dir_ + "/coordinator-health.port";
  std::remove(port_file.c_str());
  std::remove(http_port_file.c_str());
  std::remove(health_port_file.c_str());
  std::vector<std::string> args{
      absl::StrCat("--listen=", options_.coordinator_listen_host, ":", port),
      "--port-file=" + port_file, "--data-root=" + data_root(),
      absl::StrCat("--heartbeat-ms=", options_.heartbeat_ms),
      absl::StrCat("--worker-timeout-ms=", options_.worker_timeout_ms)};
  if (options_.http) {
    args.push_back(absl::StrCat("--metrics-listen=127.0.0.1:", http_port_));
    args.push_back("--metrics-port-file=" + http_port_file);
  }
  if (options_.health) {
    args.push_back(absl::StrCat("--health-listen=127.0.0.1:", health_port_));
    args.push_back("--health-port-file=" + health_port_file);
  }
  if (options_.tls) {
    if (restarts_ == 0) {
      RETURN_IF_ERROR(MakeDevCerts(certs_dir()));
    }
    args.push_back("--tls-cert=" + certs_dir() + "/coordinator.crt");
    args.push_back("--tls-key=" + certs_dir() + "/coordinator.key");
    args.push_back("--tls-ca=" + certs_dir() + "/ca.crt");
    args.push_back("--auth-token-file=" + certs_dir() + "/token");
    if (options_.http) args.push_back("--metrics-token-file=" + certs_dir() + "/metrics-token");
  }
  args.insert(args.end(), options_.coordinator_args.begin(), options_.coordinator_args.end());
  const std::string log = restarts_ == 0 ? dir_ + "/coordinator.log"
                                         : absl::StrCat(dir_, "/coordinator.", restarts_, ".log");
  coordinator_ =
      std::make_unique<Process>(std::string(TANDEM_BIN_DIR) + "/tandem-coordinator", args, log);
  if (!WaitFor([&] { return !ReadFile(port_file).empty(); }, std::chrono::seconds(20))) {
    return absl::DeadlineExceededError("coordinator did not start: " + ReadFile(log));
  }
  port_ = std::stoi(ReadFile(port_file));
  // The HTTP port is written before the gRPC one.
  if (options_.http) http_port_ = std::stoi(ReadFile(http_port_file));
  if (options_.health) health_port_ = std::stoi(ReadFile(health_port_file));
  return absl::OkStatus();
}

absl::Status Cluster::Start() {
  RETURN_IF_ERROR(StartCoordinator(0));
  client_ =
      cli::NewGrpcCoordinatorClient(address(), absl::Seconds(10), absl::Hours(1), ClientSecurity());
  for (int i = 0; i < options_.workers; ++i) {
    RETURN_IF_ERROR(StartWorker());
  }
  return WaitForWorkers();
}

absl::Status Cluster::WaitForWorkers() {
  size_t want = 0;
  for (auto& w : workers_) want += w->Running();
  std::vector<v1::WorkerInfo> seen;
  if (!WaitFor(
          [&] {
            auto w = Workers();
            if (!w.ok()) return false;
            seen = *w;
            size_t alive = 0;
            for (const auto& info : *w) alive += info.state() != v1::LOST;
            return alive >= want;
          },
          std::chrono::seconds(20))) {
    return absl::DeadlineExceededError(
        absl::StrCat("workers did not register: ", seen.size(), " registered, ", want, " running"));
  }
  return absl::OkStatus();
}

absl::Status Cluster::RestartCoordinator(int signal) {
  coordinator_->Kill(signal);
  coordinator_->Wait();
  ++restarts_;
  const int port = port_;
  RETURN_IF_ERROR(StartCoordinator(port));
  if (port_ != port) {
    return absl::InternalError(
        absl::StrCat("the coordinator came back on port ", port_, ", not ", port));
  }
  return WaitForWorkers();
}

absl::Status Cluster::StartWorker(const std::vector<std::string>& extra_flags) {
  const int i = static_cast<int>(workers_.size());
  Options::Placement place;
  place.coordinator_host = "127.0.0.1";
  if (options_.place_worker) place = options_.place_worker(i);
  std::vector<std::string> args = {
      absl::StrCat("--coordinator=", place.coordinator_host, ":", port_),
      absl::StrCat("--listen=", place.listen_host, ":0"),
      "--device=cpu",
      "--threads=1",
      "--data-root=" + dir_,
      absl::StrCat("--port-file=", dir_, "/worker", i, ".port")};
  const std::vector<std::string> tls = WorkerTlsFlags();
  args.insert(args.end(), tls.begin(), tls.end());
  args.insert(args.end(), options_.worker_args.begin(), options_.worker_args.end());
  args.insert(args.end(), place.args.begin(), place.args.end());
  args.insert(args.end(), extra_flags.begin(), extra_flags.end());
  std::string binary = std::string(TANDEM_BIN_DIR) + "/tandem-worker";
  if (!place.prefix.empty()) {
    args.insert(args.begin(), binary);
    args.insert(args.begin(), place.prefix.begin() + 1, place.prefix.end());
    binary = place.prefix[0];
  }
  workers_.push_back(
      std::make_unique<Process>(binary, args, absl::StrCat(dir_, "/worker", i, ".log")));
  return absl::OkStatus();
}

absl::Status Cluster::AddWorker(const std::vector<std::string>& extra_flags) {
  const int i = static_cast<int>(workers_.size());
  RETURN_IF_ERROR(StartWorker(extra_flags));
  // Registered: the coordinator lists a live worker at the new process's port.
  const std::string port_file = absl::StrCat(dir_, "/worker", i, ".port");
  if (!WaitFor(
          [&] {
            const std::string port(absl::StripAsciiWhitespace(ReadFile(port_file)));
            if (port.empty()) return false;
            auto w = Workers();
            if (!w.ok()) return false;
            for (const auto& info : *w) {
              if (info.state() != v1::LOST && absl::EndsWith(info.address(), ":" + port)) {
                return true;
              }
            }
            return false;
          },
          std::chrono::seconds(20))) {
    return absl::DeadlineExceededError(
        absl::StrCat("worker did not register: ", ReadFile(workers_.back()->log_path())));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> Cluster::Submit(const std::string& yaml) {
  return client_->SubmitJob(yaml);
}

absl::StatusOr<v1::Job> Cluster::GetJob(const std::string& id) { return client_->GetJob(id); }

absl::StatusOr<std::vector<v1::WorkerInfo>> Cluster::Workers() {
  auto resp = client_->ListWorkers();
  if (!resp.ok()) return resp.status();
  return std::vector<v1::WorkerInfo>(resp->workers().begin(), resp->workers().end());
}

absl::Status Cluster::Cancel(const std::string& id) { return client_->CancelJob(id).status(); }

bool Cluster::WaitForSteps(const std::string& id, int64_t steps, std::chrono::seconds timeout) {
  return WaitFor(
      [&] {
        auto j = GetJob(id);
        return j.ok() && j->state() == v1::RUNNING && j->steps_done() >= steps;
      },
      timeout, std::chrono::milliseconds(5));
}

absl::StatusOr<double> Cluster::SecondsUntilRestart(const std::string& id,
                                                    std::chrono::seconds timeout) {
  const auto start = std::chrono::steady_clock::now();
  if (!WaitFor(
          [&] {
            auto j = GetJob(id);
            return j.ok() && j->restarts() >= 1;
          },
          timeout, std::chrono::milliseconds(10))) {
    return absl::DeadlineExceededError(
        absl::StrCat(id, " was not restarted within ", timeout.count(), " s"));
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

absl::StatusOr<v1::Job> Cluster::WaitForEnd(const std::string& id, std::chrono::seconds timeout) {
  absl::StatusOr<v1::Job> job;
  WaitFor(
      [&] {
        job = GetJob(id);
        return !job.ok() || job->state() == v1::SUCCEEDED || job->state() == v1::FAILED ||
               job->state() == v1::CANCELLED;
      },
      timeout, std::chrono::milliseconds(100));
  return job;
}

CommandResult Cluster::Cli(const std::vector<std::string>& args, bool with_credentials) {
  std::vector<std::string> argv{std::string(TANDEM_BIN_DIR) + "/tandem",
                                "--coordinator=" + address()};
  if (options_.tls && with_credentials) {
    argv.push_back("--tls-ca=" + certs_dir() + "/ca.crt");
    argv.push_back("--token-file=" + certs_dir() + "/token");
  }
  argv.insert(argv.end(), args.begin(), args.end());
  return RunCommand(argv);
}

std::vector<double> Losses(const v1::Job& job) {
  std::vector<double> out;
  for (const auto& s : job.history()) out.push_back(s.loss());
  return out;
}

void ExpectTheReferenceRun(const v1::Job& job, const v1::Job& reference, int steps) {
  ASSERT_EQ(job.state(), v1::SUCCEEDED) << job.reason();
  ASSERT_EQ(job.history_size(), steps);
  ASSERT_EQ(reference.history_size(), steps);
  for (int i = 0; i < steps; ++i) {
    ASSERT_EQ(job.history(i).step(), i);
    EXPECT_EQ(job.history(i).loss(), reference.history(i).loss()) << "step " << i + 1;
  }
  EXPECT_EQ(job.steps_done(), steps);
}

std::string TinyJobYaml(int stages, int micro_batches, int steps, const std::string& schedule,
                        const std::string& extra, const std::string& lr_schedule) {
  return absl::StrCat(
      "name: tiny\nsteps: ", steps,
      "\nseed: 7\nmodel:\n  arch: mlp_lm\n  n_layer: 3\n  d_model: 32\n  d_embed: 8\n  context: 4\n"
      "optimizer:\n  lr: 0.01\n  lr_schedule: ",
      lr_schedule, "\npipeline:\n  stages: ", stages,
      "\n  micro_batch_size: 8\n  micro_batches: ", micro_batches, "\n  schedule: ", schedule, "\n",
      extra);
}

}  // namespace tandem::testing
