// Security, with real processes on 127.0.0.1: TLS with mutual authentication between the
// coordinator and its workers, clients with a bearer token or a client certificate, and every
// refusal the access rules promise (common/tls.h); the metrics and dashboard port over HTTPS
// for a client certificate or a token, or plain HTTP when asked. Certificates are made at test
// time by scripts/dev-certs.sh in the test's directory.
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <signal.h>

#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <regex>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/rpc.h"
#include "common/tls.h"
#include "common/version.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tandem/v1/coordinator.grpc.pb.h"
#include "tandem/v1/worker.grpc.pb.h"
#include "tests/https_client.h"
#include "tests/integration/harness.h"

namespace tandem::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using namespace std::chrono_literals;

// TLS material as the test's own clients use it: the CA, and optionally a certificate.
ChannelSecurity Tls(const std::string& dir, const std::string& identity = "",
                    const std::string& token = "") {
  ChannelSecurity security;
  TlsMaterial tls;
  tls.ca_pem = ReadFile(dir + "/ca.crt");
  if (!identity.empty()) {
    tls.cert_pem = ReadFile(dir + "/" + identity + ".crt");
    tls.key_pem = ReadFile(dir + "/" + identity + ".key");
  }
  security.tls = tls;
  security.bearer_token = token;
  return security;
}

grpc::Status ListJobs(std::shared_ptr<grpc::Channel> channel) {
  auto stub = v1::Coordinator::NewStub(std::move(channel));
  grpc::ClientContext ctx;
  SetDeadline(ctx, 5s);
  v1::ListJobsRequest req;
  req.set_protocol_version(kProtocolVersion);
  v1::ListJobsResponse resp;
  return stub->ListJobs(&ctx, req, &resp);
}

grpc::Status WorkerGetStatus(std::shared_ptr<grpc::Channel> channel) {
  auto stub = v1::StageWorker::NewStub(std::move(channel));
  grpc::ClientContext ctx;
  SetDeadline(ctx, 5s);
  v1::GetStatusRequest req;
  req.set_protocol_version(kProtocolVersion);
  v1::WorkerStatus resp;
  return stub->GetStatus(&ctx, req, &resp);
}

grpc::Status WorkerRunStep(std::shared_ptr<grpc::Channel> channel) {
  auto stub = v1::StageWorker::NewStub(std::move(channel));
  grpc::ClientContext ctx;
  SetDeadline(ctx, 5s);
  v1::RunStepRequest req;
  req.set_protocol_version(kProtocolVersion);
  req.set_job_id("no-such-job");
  v1::RunStepResponse resp;
  return stub->RunStep(&ctx, req, &resp);
}

std::string WriteFile(const std::string& path, const std::string& text) {
  std::ofstream(path) << text;
  return path;
}

// One TLS cluster (a coordinator with a health port, two workers) for the whole suite. Its jobs
// go through the step relay (on from 2 workers), so that a worker's RunStep to another worker
// runs over mutual TLS too.
class SecurityTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    Cluster::Options options;
    options.workers = 2;
    options.tls = true;
    options.health = true;
    options.http = true;
    options.coordinator_args = {"--step_relay_min_workers=2"};
    cluster_ = new Cluster(options);
    start_status_ = new absl::Status(cluster_->Start());
  }
  static void TearDownTestSuite() {
    delete cluster_;
    delete start_status_;
    cluster_ = nullptr;
  }
  void SetUp() override { ASSERT_TRUE(start_status_->ok()) << *start_status_; }
  void TearDown() override {
    if (HasFailure()) {
      std::cerr << "coordinator log:\n" << ReadFile(cluster_->dir() + "/coordinator.log");
      for (int i = 0; i < 2; ++i) {
        std::cerr << "worker" << i << " log:\n"
                  << ReadFile(cluster_->dir() + "/worker" + std::to_string(i) + ".log");
      }
    }
  }
  static std::string Certs() { return cluster_->certs_dir(); }
  static std::string WorkerAddress() {
    auto workers = cluster_->Workers();
    return workers.ok() && !workers->empty() ? (*workers)[0].address() : "";
  }

  static Cluster* cluster_;
  static absl::Status* start_status_;
};
Cluster* SecurityTest::cluster_ = nullptr;
absl::Status* SecurityTest::start_status_ = nullptr;

TEST_F(SecurityTest, TlsClusterTrainsATinyJobEndToEnd) {
  EXPECT_THAT(ReadFile(cluster_->dir() + "/coordinator.log"),
              HasSubstr("TLS with mutual authentication: certificate CN=tandem-coordinator"));
  EXPECT_THAT(ReadFile(cluster_->dir() + "/worker0.log"),
              HasSubstr("TLS with mutual authentication: certificate CN=tandem-worker"));
  // Through the CLI, with the token: the job runs over both workers (Configure, RunStep and
  // checkpoints are coordinator -> worker calls; rendezvous and checkpoint reads are worker ->
  // coordinator calls), all over mutual TLS.
  const std::string job = WriteFile(cluster_->dir() + "/tiny.yaml",
                                    TinyJobYaml(2, 4, 6, "1f1b", "checkpoint:\n  every: 3\n"));
  CommandResult submit = cluster_->Cli({"submit", job, "--watch"});
  ASSERT_EQ(submit.exit_code, 0) << submit.out << submit.err;
  const std::string id = submit.out.substr(0, submit.out.find('\n'));
  auto done = cluster_->WaitForEnd(id, 120s);
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->state(), v1::SUCCEEDED) << done->reason();
  EXPECT_EQ(done->history_size(), 6);
  EXPECT_THAT(ReadFile(cluster_->dir() + "/coordinator.log"),
              HasSubstr(id + ": the step relay: 1 group(s)"));
  // A resumed job reads the checkpoint through the coordinator's Checkpoints service.
  auto resumed =
      cluster_->Submit(TinyJobYaml(2, 4, 8, "1f1b", absl::StrCat("init:\n  from_job: ", id, "\n")));
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  auto end = cluster_->WaitForEnd(*resumed, 120s);
  ASSERT_TRUE(end.ok()) << end.status();
  EXPECT_EQ(end->state(), v1::SUCCEEDED) << end->reason();
}

TEST_F(SecurityTest, CliWithoutATokenIsUnauthenticatedWithAClearMessage) {
  CommandResult r = cluster_->Cli({"list", "--tls-ca", Certs() + "/ca.crt"}, false);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("UNAUTHENTICATED"));
  EXPECT_THAT(r.err, HasSubstr("requires a client certificate signed by its CA or a bearer token"));
  EXPECT_THAT(r.err, HasSubstr("--token-file"));
  // Plaintext against the TLS port: it cannot even connect, and the CLI says what to give.
  CommandResult plain = cluster_->Cli({"list"}, false);
  EXPECT_EQ(plain.exit_code, 1);
  EXPECT_THAT(plain.err, HasSubstr("cannot reach coordinator"));
  EXPECT_THAT(plain.err, HasSubstr("give --tls-ca"));
}

TEST_F(SecurityTest, AWrongTokenIsUnauthenticated) {
  const std::string wrong =
      WriteFile(cluster_->dir() + "/wrong-token", std::string(64, 'a') + "\n");
  CommandResult r =
      cluster_->Cli({"list", "--tls-ca", Certs() + "/ca.crt", "--token-file", wrong}, false);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("UNAUTHENTICATED"));
  EXPECT_THAT(r.err, HasSubstr("the bearer token is not valid"));
  // A wrong token is refused even next to a valid client certificate.
  EXPECT_EQ(ListJobs(MakeChannel(cluster_->address(), Tls(Certs(), "client", std::string(64, 'a'))))
                .error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
}

TEST_F(SecurityTest, TheTokenWorksFromAFileAndFromTheEnvironment) {
  CommandResult r = cluster_->Cli({"workers"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("IDLE"));
  const std::string token = ReadFile(Certs() + "/token");
  CommandResult env = RunCommand({"/usr/bin/env", "TANDEM_TLS_CA=" + Certs() + "/ca.crt",
                                  "TANDEM_TOKEN=" + token.substr(0, token.find('\n')),
                                  std::string(TANDEM_BIN_DIR) + "/tandem",
                                  "--coordinator=" + cluster_->address(), "list"});
  EXPECT_EQ(env.exit_code, 0) << env.err;
}

TEST_F(SecurityTest, AClientCertificateWorksWithoutAToken) {
  CommandResult r = cluster_->Cli({"list", "--tls-ca", Certs() + "/ca.crt", "--tls-cert",
                                   Certs() + "/client.crt", "--tls-key", Certs() + "/client.key"},
                                  false);
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

TEST_F(SecurityTest, EachApiTakesOnlyItsRole) {
  // A worker's certificate does not open the client API, and a client's does not register.
  grpc::Status as_worker = ListJobs(MakeChannel(cluster_->address(), Tls(Certs(), "worker")));
  EXPECT_EQ(as_worker.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(as_worker.error_message(), HasSubstr("is for tandem-client only"));
  EXPECT_THAT(as_worker.error_message(), HasSubstr("CN=tandem-worker"));

  auto registry = v1::WorkerRegistry::NewStub(
      MakeChannel(cluster_->address(), Tls(Certs(), "client", ReadFile(Certs() + "/token"))));
  grpc::ClientContext ctx;
  SetDeadline(ctx, 5s);
  v1::RegisterRequest req;
  req.set_protocol_version(kProtocolVersion);
  req.set_address("127.0.0.1:1");
  req.set_device("cpu");
  req.set_threads(1);
  v1::RegisterResponse resp;
  grpc::Status registered = registry->Register(&ctx, req, &resp);
  EXPECT_EQ(registered.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(registered.error_message(), HasSubstr("is for tandem-worker only"));
  auto workers = cluster_->Workers();
  ASSERT_TRUE(workers.ok()) << workers.status();
  EXPECT_EQ(workers->size(), 2u);
}

TEST_F(SecurityTest, AWorkerWithACertificateFromAnotherCaCannotRegister) {
  const std::string other = cluster_->dir() + "/other-ca";
  ASSERT_TRUE(MakeDevCerts(other).ok());
  // The intruder trusts the real CA (so it can verify the coordinator), but its own
  // certificate is signed by a CA the coordinator does not trust.
  Process intruder(std::string(TANDEM_BIN_DIR) + "/tandem-worker",
                   {"--coordinator=" + cluster_->address(), "--listen=127.0.0.1:0", "--device=cpu",
                    "--threads=1", "--heartbeat-ms=200", "--tls-cert=" + other + "/worker.crt",
                    "--tls-key=" + other + "/worker.key", "--tls-ca=" + Certs() + "/ca.crt"},
                   cluster_->dir() + "/intruder.log");
  // It keeps trying and failing; the coordinator keeps serving the others.
  EXPECT_TRUE(WaitFor(
      [&] {
        const std::string log = ReadFile(intruder.log_path());
        return absl::StrContains(log, "registration with the coordinator failed") &&
               absl::StrContains(log, "a failed handshake looks like this");
      },
      20s))
      << ReadFile(intruder.log_path());
  std::this_thread::sleep_for(2s);
  EXPECT_TRUE(intruder.Running());
  auto workers = cluster_->Workers();
  ASSERT_TRUE(workers.ok()) << workers.status();
  EXPECT_EQ(workers->size(), 2u);
  EXPECT_TRUE(cluster_->coordinator().Running());
  CommandResult r = cluster_->Cli({"workers"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  // And a client certificate from the other CA fails the handshake: the call never arrives.
  ChannelSecurity foreign = Tls(other, "client");
  foreign.tls->ca_pem = ReadFile(Certs() + "/ca.crt");
  EXPECT_EQ(ListJobs(MakeChannel(cluster_->address(), foreign)).error_code(),
            grpc::StatusCode::UNAVAILABLE);
}

TEST_F(SecurityTest, OnlyTheCoordinatorMayCallTheWorkerApi) {
  const std::string worker = WorkerAddress();
  ASSERT_FALSE(worker.empty());
  const std::string token = ReadFile(Certs() + "/token");
  // A client's certificate, another worker's, a token, no credentials, plaintext: all refused.
  grpc::Status client_cert = WorkerGetStatus(MakeChannel(worker, Tls(Certs(), "client")));
  EXPECT_EQ(client_cert.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(client_cert.error_message(), HasSubstr("is for tandem-coordinator only"));
  EXPECT_EQ(WorkerGetStatus(MakeChannel(worker, Tls(Certs(), "worker"))).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  // Another worker may call RunStep only (the step relay forwards it): past the access check,
  // the worker itself refuses a step of a job it does not run.
  grpc::Status relayed = WorkerRunStep(MakeChannel(worker, Tls(Certs(), "worker")));
  EXPECT_NE(relayed.error_code(), grpc::StatusCode::PERMISSION_DENIED) << relayed.error_message();
  EXPECT_NE(relayed.error_code(), grpc::StatusCode::OK);
  EXPECT_EQ(WorkerRunStep(MakeChannel(worker, Tls(Certs(), "client"))).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  grpc::Status with_token = WorkerGetStatus(MakeChannel(worker, Tls(Certs(), "", token)));
  EXPECT_EQ(with_token.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_THAT(with_token.error_message(), HasSubstr("accepts no bearer tokens"));
  EXPECT_EQ(WorkerGetStatus(MakeChannel(worker, Tls(Certs()))).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(WorkerGetStatus(MakeInsecureChannel(worker)).error_code(),
            grpc::StatusCode::UNAVAILABLE);
  // The coordinator's certificate is the one that works.
  EXPECT_TRUE(WorkerGetStatus(MakeChannel(worker, Tls(Certs(), "coordinator"))).ok());
}

TEST_F(SecurityTest, TheHealthPortAnswersWithoutCredentialsWhileTheApiPortRequiresTls) {
  const std::string health = absl::StrCat("127.0.0.1:", cluster_->health_port());
  const HealthAnswer open = CheckHealth(MakeInsecureChannel(health));
  EXPECT_EQ(open.code, grpc::StatusCode::OK);
  EXPECT_EQ(open.status, 1);
  // The API port: plaintext cannot connect; TLS without credentials is UNAUTHENTICATED; any
  // authenticated caller may ask.
  EXPECT_EQ(CheckHealth(MakeInsecureChannel(cluster_->address())).code,
            grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(CheckHealth(MakeChannel(cluster_->address(), Tls(Certs()))).code,
            grpc::StatusCode::UNAUTHENTICATED);
  const HealthAnswer authenticated =
      CheckHealth(MakeChannel(cluster_->address(), Tls(Certs(), "worker")));
  EXPECT_EQ(authenticated.code, grpc::StatusCode::OK);
  EXPECT_EQ(authenticated.status, 1);
}

// The metrics and dashboard port of a TLS coordinator: HTTPS with its certificate, opened by a
// client certificate from the CA (of any role) or a token (--metrics-token-file's, or the
// API's), and by nothing else.
TEST_F(SecurityTest, TheMetricsPortServesHttpsToACertificateOrATokenOnly) {
  const int port = cluster_->http_port();
  ASSERT_GT(port, 0);
  const std::string metrics_token =
      std::string(absl::StripAsciiWhitespace(ReadFile(Certs() + "/metrics-token")));
  const std::string api_token =
      std::string(absl::StripAsciiWhitespace(ReadFile(Certs() + "/token")));
  auto client = [&](const std::string& identity, std::vector<std::string> headers,
                    const std::string& dir = "") {
    HttpsOptions o;
    o.ca_pem = ReadFile(Certs() + "/ca.crt");
    if (!identity.empty()) {
      o.cert_pem = ReadFile((dir.empty() ? Certs() : dir) + "/" + identity + ".crt");
      o.key_pem = ReadFile((dir.empty() ? Certs() : dir) + "/" + identity + ".key");
    }
    o.headers = std::move(headers);
    return o;
  };

  // Plain HTTP gets no HTTP answer at all.
  auto plain = HttpGet(port, "/metrics");
  EXPECT_FALSE(plain.ok()) << plain->status << "\n" << plain->body;
  // HTTPS without credentials, or with a wrong token: 401, saying what is needed.
  auto anonymous = HttpsGet(port, "/metrics", client("", {}));
  ASSERT_TRUE(anonymous.ok()) << anonymous.status();
  EXPECT_EQ(anonymous->status, 401);
  EXPECT_THAT(anonymous->body,
              HasSubstr("requires a client certificate signed by the coordinator's CA or a "
                        "bearer token"));
  EXPECT_THAT(anonymous->body, Not(HasSubstr("tandem_build_info")));
  auto wrong =
      HttpsGet(port, "/api/jobs", client("", {"Authorization: Bearer " + std::string(64, 'a')}));
  ASSERT_TRUE(wrong.ok()) << wrong.status();
  EXPECT_EQ(wrong->status, 401);
  EXPECT_THAT(wrong->body, HasSubstr("the token is not valid"));
  // A client certificate from another CA fails the handshake.
  const std::string other = cluster_->dir() + "/metrics-other-ca";
  ASSERT_TRUE(MakeDevCerts(other).ok());
  EXPECT_EQ(HttpsGet(port, "/metrics", client("client", {}, other)).status().code(),
            absl::StatusCode::kUnavailable);

  // Each way in: the metrics token (Prometheus), the API token, a client certificate, another
  // role's certificate, the token as a Basic password (a browser).
  struct Case {
    std::string what;
    HttpsOptions options;
  };
  const std::vector<Case> cases = {
      {"the metrics token", client("", {"Authorization: Bearer " + metrics_token})},
      {"the API token", client("", {"Authorization: Bearer " + api_token})},
      {"a client certificate", client("client", {})},
      {"a worker certificate", client("worker", {})},
      {"Basic",
       client("", {"Authorization: Basic " + absl::Base64Escape("dashboard:" + metrics_token)})},
  };
  for (const Case& c : cases) {
    auto r = HttpsGet(port, "/metrics", c.options);
    ASSERT_TRUE(r.ok()) << c.what << ": " << r.status();
    EXPECT_EQ(r->status, 200) << c.what << ": " << r->body;
    EXPECT_THAT(r->body, HasSubstr("tandem_build_info")) << c.what;
  }
  auto page = HttpsGet(port, "/", cases[0].options);
  ASSERT_TRUE(page.ok()) << page.status();
  EXPECT_EQ(page->status, 200);
  EXPECT_THAT(page->headers["content-type"], HasSubstr("text/html"));
  auto workers = HttpsGet(port, "/api/workers", cases[2].options);
  ASSERT_TRUE(workers.ok()) << workers.status();
  EXPECT_EQ(workers->status, 200);
  EXPECT_THAT(workers->body, HasSubstr("127.0.0.1"));

  const std::string log = ReadFile(cluster_->dir() + "/coordinator.log");
  EXPECT_THAT(log, HasSubstr("metrics and dashboard (HTTPS) on port"));
  EXPECT_THAT(log, HasSubstr("metrics port: refused a request for /metrics"));
  EXPECT_THAT(log, Not(HasSubstr(metrics_token)));
  EXPECT_THAT(log, Not(HasSubstr(api_token)));
}

// --metrics-plaintext: a TLS coordinator whose metrics port serves plain HTTP all the same,
// for a trusted network, and says so at start.
TEST(MetricsPlaintextTest, TheOptOutServesPlainHttpAndWarns) {
  char dir_template[] = "/tmp/tandem-metrics-plain-XXXXXX";
  const std::string dir = mkdtemp(dir_template);
  ASSERT_TRUE(MakeDevCerts(dir + "/certs").ok());
  const std::string certs = dir + "/certs";
  {
    Process coordinator(
        std::string(TANDEM_BIN_DIR) + "/tandem-coordinator",
        {"--listen=127.0.0.1:0", "--port-file=" + dir + "/api.port", "--metrics-listen=127.0.0.1:0",
         "--metrics-port-file=" + dir + "/metrics.port", "--tls-cert=" + certs + "/coordinator.crt",
         "--tls-key=" + certs + "/coordinator.key", "--tls-ca=" + certs + "/ca.crt",
         "--auth-token-file=" + certs + "/token", "--metrics-plaintext"},
        dir + "/coordinator.log");
    ASSERT_TRUE(WaitFor([&] { return !ReadFile(dir + "/api.port").empty(); }, 20s))
        << ReadFile(dir + "/coordinator.log");
    const int port = std::stoi(ReadFile(dir + "/metrics.port"));
    auto r = HttpGet(port, "/metrics");
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->status, 200);
    EXPECT_THAT(r->body, HasSubstr("tandem_build_info"));
    HttpsOptions https;
    https.ca_pem = ReadFile(certs + "/ca.crt");
    EXPECT_FALSE(HttpsGet(port, "/metrics", https).ok());
    const std::string log = ReadFile(dir + "/coordinator.log");
    EXPECT_THAT(log, HasSubstr("metrics and dashboard (HTTP) on port"));
    EXPECT_THAT(log, HasSubstr("--metrics-plaintext: the metrics port serves plain HTTP without "
                               "authentication although the API serves TLS"));
    // The API itself still requires TLS.
    EXPECT_THAT(log, HasSubstr("TLS with mutual authentication"));
  }
  std::filesystem::remove_all(dir);
}

// Without TLS the metrics port is plain HTTP, as it always was, and warns of nothing more.
TEST(MetricsPlaintextTest, WithoutTlsTheMetricsPortIsPlainHttp) {
  Cluster::Options options;
  options.workers = 0;
  options.http = true;
  Cluster cluster(options);
  ASSERT_TRUE(cluster.Start().ok());
  auto r = HttpGet(cluster.http_port(), "/metrics");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, 200);
  const std::string log = ReadFile(cluster.dir() + "/coordinator.log");
  EXPECT_THAT(log, HasSubstr("metrics and dashboard (HTTP) on port"));
  EXPECT_THAT(log, Not(HasSubstr("--metrics-plaintext")));
}

TEST(PlaintextTest, PlaintextModeWorksAndLogsItsWarning) {
  Cluster::Options options;
  options.workers = 1;
  Cluster cluster(options);
  ASSERT_TRUE(cluster.Start().ok());
  for (const char* log : {"/coordinator.log", "/worker0.log"}) {
    const std::string text = ReadFile(cluster.dir() + log);
    EXPECT_THAT(text, HasSubstr("PLAINTEXT mode"));
    EXPECT_THAT(text, HasSubstr("only on a single trusted machine"));
  }
  CommandResult r = cluster.Cli({"workers"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

// Half configurations and unusable files are refused at start, naming the flag or the file.
TEST(TlsFlagsTest, DaemonsAndTheCliRefuseHalfConfigurations) {
  char dir_template[] = "/tmp/tandem-tlsflags-XXXXXX";
  const std::string dir = mkdtemp(dir_template);
  ASSERT_TRUE(MakeDevCerts(dir).ok());
  const std::string coordinator = std::string(TANDEM_BIN_DIR) + "/tandem-coordinator";
  const std::string worker = std::string(TANDEM_BIN_DIR) + "/tandem-worker";
  const std::string cli = std::string(TANDEM_BIN_DIR) + "/tandem";
  const std::string listen = "--listen=127.0.0.1:0";
  struct Case {
    std::vector<std::string> argv;
    std::string says;
  };
  const std::vector<Case> cases = {
      {{coordinator, listen, "--tls-cert=" + dir + "/coordinator.crt"}, "--tls-ca is missing"},
      {{coordinator, listen, "--tls-cert=" + dir + "/coordinator.crt",
        "--tls-ca=" + dir + "/ca.crt"},
       "--tls-cert without --tls-key"},
      {{coordinator, listen, "--tls-ca=" + dir + "/ca.crt"}, "needs a certificate of its own"},
      {{coordinator, listen, "--tls-cert=" + dir + "/nope.crt", "--tls-key=" + dir + "/x.key",
        "--tls-ca=" + dir + "/ca.crt"},
       "--tls-cert=" + dir + "/nope.crt: cannot read the file: No such file or directory"},
      {{coordinator, listen, "--tls-cert=" + dir + "/coordinator.crt",
        "--tls-key=" + dir + "/worker.key", "--tls-ca=" + dir + "/ca.crt"},
       "is not the key of --tls-cert"},
      {{coordinator, listen, "--tls-cert=" + dir + "/worker.crt",
        "--tls-key=" + dir + "/worker.key", "--tls-ca=" + dir + "/ca.crt"},
       "must say CN=tandem-coordinator"},
      {{coordinator, listen, "--auth-token-file=" + dir + "/token"}, "--auth-token-file needs TLS"},
      {{coordinator, listen, "--tls-cert=" + dir + "/coordinator.crt",
        "--tls-key=" + dir + "/coordinator.key", "--tls-ca=" + dir + "/ca.crt",
        "--auth-token-file=" + WriteFile(dir + "/short", "abc\n")},
       "at least 16 are needed"},
      {{worker, "--coordinator=127.0.0.1:1", "--tls-key=" + dir + "/worker.key",
        "--tls-ca=" + dir + "/ca.crt"},
       "--tls-key without --tls-cert"},
      {{worker, "--coordinator=127.0.0.1:1", "--tls-cert=" + dir + "/client.crt",
        "--tls-key=" + dir + "/client.key", "--tls-ca=" + dir + "/ca.crt"},
       "must say CN=tandem-worker"},
      {{cli, "--coordinator=127.0.0.1:1", "--token-file=" + dir + "/token", "list"},
       "is sent only over TLS"},
      // The metrics port's token is only ever checked over HTTPS.
      {{coordinator, listen, "--metrics-listen=127.0.0.1:0",
        "--metrics-token-file=" + dir + "/metrics-token"},
       "--metrics-token-file needs the metrics port to serve HTTPS"},
      {{coordinator, listen, "--tls-cert=" + dir + "/coordinator.crt",
        "--tls-key=" + dir + "/coordinator.key", "--tls-ca=" + dir + "/ca.crt",
        "--metrics-listen=127.0.0.1:0", "--metrics-plaintext",
        "--metrics-token-file=" + dir + "/metrics-token"},
       "--metrics-token-file needs the metrics port to serve HTTPS (the --tls-* flags, without "
       "--metrics-plaintext)"},
      {{coordinator, listen, "--tls-cert=" + dir + "/coordinator.crt",
        "--tls-key=" + dir + "/coordinator.key", "--tls-ca=" + dir + "/ca.crt",
        "--metrics-listen=127.0.0.1:0", "--metrics-token-file=" + dir + "/short"},
       "--metrics-token-file: the token in"},
      {{cli, "--coordinator=127.0.0.1:1", "--tls-ca=" + dir + "/ca.key", "list"},
       "holds no PEM certificate"},
  };
  for (const Case& c : cases) {
    CommandResult r = RunCommand(c.argv, 30s);
    EXPECT_NE(r.exit_code, 0) << c.says;
    EXPECT_THAT(r.out + r.err, HasSubstr(c.says));
  }
  std::filesystem::remove_all(dir);
}

// Nothing in a spec is executed: the daemons run no shell and no other program (no call to
// system, popen, fork or exec in their sources), and a spec full of shell syntax is data. The
// one exec is the worker starting its own image again at start, before it reads anything from
// the network, with OPENBLAS_CORETYPE set (worker/blas_core_restart.cc): execv of
// /proc/self/exe, nothing else, in that file alone.
TEST(SpecExecutionTest, NothingInASpecIsExecuted) {
  const std::regex forbidden(
      R"(\b(system|popen|fork|vfork|execv|execvp|execve|execl|execlp|posix_spawnp?)\s*\()");
  const std::string restart_file = "/worker/blas_core_restart.cc";
  const std::string own_image = "execv(\"/proc/self/exe\", ";
  int files = 0;
  for (const char* sub : {"coordinator", "worker", "common"}) {
    for (const auto& entry : std::filesystem::recursive_directory_iterator(
             std::string(TANDEM_SOURCE_DIR) + "/" + sub)) {
      const std::string path = entry.path().string();
      if (!absl::EndsWith(path, ".cc") && !absl::EndsWith(path, ".h")) continue;
      ++files;
      std::string text = ReadFile(path);
      if (absl::EndsWith(path, restart_file)) {
        const size_t at = text.find(own_image);
        EXPECT_NE(at, std::string::npos) << path << " no longer starts its own image again";
        if (at != std::string::npos) text.erase(at, own_image.size());  // that call only
      }
      std::smatch m;
      EXPECT_FALSE(std::regex_search(text, m, forbidden)) << path << " calls " << m.str();
    }
  }
  EXPECT_GT(files, 50);

  Cluster::Options options;
  options.workers = 1;
  Cluster cluster(options);
  ASSERT_TRUE(cluster.Start().ok());
  const std::string marker = cluster.dir() + "/executed";
  const std::string shell = absl::StrCat("$(touch ", marker, ") `touch ", marker, "` ; touch ",
                                         marker, " | touch ", marker);
  auto id = cluster.Submit(absl::StrCat(
      "name: \"", shell, "\"\n", TinyJobYaml(1, 2, 2).substr(TinyJobYaml(1, 2, 2).find('\n') + 1),
      "data:\n  source: file\n  path: \"", shell, "\"\n"));
  if (id.ok()) {
    auto job = cluster.WaitForEnd(*id, 60s);
    ASSERT_TRUE(job.ok()) << job.status();
  }
  EXPECT_FALSE(std::filesystem::exists(marker));
}

// Peer recovery over mutual TLS: a 1 x 2 job loses a replica's worker; the fresh worker that
// takes its place reads the state the survivor kept (StageWorker.ReadState, a worker -> worker
// call with the workers' certificates), and the job redoes no step. Last in the suite: it
// replaces one of the shared cluster's two workers.
TEST_F(SecurityTest, APeerRecoveryReadsTheKeptStateOverMutualTls) {
  auto id = cluster_->Submit(TinyJobYaml(1, 4, 400, "1f1b", "  replicas: 2\n"));
  ASSERT_TRUE(id.ok()) << id.status();
  ASSERT_TRUE(cluster_->WaitForSteps(*id, 20));
  cluster_->worker(1).Kill(SIGKILL);
  ASSERT_TRUE(cluster_->AddWorker().ok());
  auto end = cluster_->WaitForEnd(*id, 120s);
  ASSERT_TRUE(end.ok()) << end.status();
  EXPECT_EQ(end->state(), v1::SUCCEEDED) << end->reason();
  EXPECT_EQ(end->restarts(), 1);
  EXPECT_EQ(end->peer_recoveries(), 1);
  EXPECT_EQ(end->steps_redone(), 0);
  EXPECT_THAT(ReadFile(cluster_->dir() + "/worker2.log"),
              HasSubstr("from the workers that kept them"));
}

}  // namespace
}  // namespace tandem::testing
