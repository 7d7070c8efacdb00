// The HTTP adapter over a real socket on 127.0.0.1: requests reach the handler as they were
// sent, responses come back with their status, type and headers, bodies are bounded; with TLS,
// HTTPS that only a client certificate from the CA or a token opens (certificates from
// scripts/dev-certs.sh, made into a temporary directory).
#include "coordinator/http_server.h"

#include <stdlib.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/http_client.h"
#include "tests/https_client.h"

namespace tandem::coordinator {
namespace {

using ::tandem::testing::HttpGet;
using ::testing::HasSubstr;

HttpResponse Echo(const HttpRequest& r) {
  HttpResponse out;
  out.status = r.path == "/missing" ? 404 : 200;
  out.content_type = "text/x-echo";
  out.body = absl::StrCat(r.method, " ", r.path);
  for (const auto& [k, v] : r.query) absl::StrAppend(&out.body, " ", k, "=", v);
  out.headers.emplace_back("X-Echo", "yes");
  return out;
}

TEST(HttpServerTest, ServesTheHandlerOnAnEphemeralPort) {
  auto server = HttpServer::Start("127.0.0.1:0", Echo);
  ASSERT_TRUE(server.ok()) << server.status();
  ASSERT_GT((*server)->port(), 0);
  auto r = HttpGet((*server)->port(), "/a%20b?x=1&y=%2Fz");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->body, "GET /a b x=1 y=/z");
  EXPECT_EQ(r->headers["content-type"], "text/x-echo");
  EXPECT_EQ(r->headers["x-echo"], "yes");
  EXPECT_EQ(r->headers["x-content-type-options"], "nosniff");

  r = HttpGet((*server)->port(), "/missing");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, 404);

  // Every method reaches the handler, which decides.
  r = testing::HttpRequest((*server)->port(), "DELETE", "/x");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->body, "DELETE /x");
}

TEST(HttpServerTest, RefusesBodies) {
  auto server = HttpServer::Start("127.0.0.1:0", Echo);
  ASSERT_TRUE(server.ok()) << server.status();
  for (const size_t size : {size_t{1}, size_t{100000}}) {
    auto r = testing::HttpRequest((*server)->port(), "POST", "/x", std::string(size, 'a'));
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->status, 413) << size;
  }
}

TEST(HttpServerTest, BadAddressesAndBusyPorts) {
  EXPECT_EQ(HttpServer::Start("nonsense", Echo).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(HttpServer::Start("127.0.0.1:99999", Echo).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(HttpServer::Start(":80", Echo).status().code(), absl::StatusCode::kInvalidArgument);
  auto first = HttpServer::Start("127.0.0.1:0", Echo);
  ASSERT_TRUE(first.ok()) << first.status();
  auto second = HttpServer::Start(absl::StrCat("127.0.0.1:", (*first)->port()), Echo);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(second.status().message(), HasSubstr("cannot listen"));
}

TEST(HttpServerTest, StopsOnDestruction) {
  int port = 0;
  {
    auto server = HttpServer::Start("127.0.0.1:0", Echo);
    ASSERT_TRUE(server.ok()) << server.status();
    port = (*server)->port();
    ASSERT_TRUE(HttpGet(port, "/").ok());
  }
  EXPECT_EQ(HttpGet(port, "/").status().code(), absl::StatusCode::kUnavailable);
}

// ---- HTTPS ----

using ::tandem::testing::HttpsGet;
using ::tandem::testing::HttpsOptions;

class HttpsServerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    char tmpl[] = "/tmp/tandem-https-test-XXXXXX";
    dir_ = new std::string(mkdtemp(tmpl));
    // Two CAs: ours, and another whose certificates ours must not accept.
    for (const std::string sub : {"", "/other"}) {
      const std::string cmd = std::string(TANDEM_SOURCE_DIR) + "/scripts/dev-certs.sh " + *dir_ +
                              sub + " --days 2 >/dev/null";
      ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
    }
  }
  static void TearDownTestSuite() {
    std::filesystem::remove_all(*dir_);
    delete dir_;
  }
  static std::string Read(const std::string& name) {
    std::ifstream in(*dir_ + "/" + name);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }
  static std::string Token(const std::string& name = "metrics-token") {
    return std::string(absl::StripAsciiWhitespace(Read(name)));
  }
  // The coordinator's certificate, as main.cc loads it.
  static TlsMaterial Coordinator() {
    auto m =
        LoadTls({*dir_ + "/coordinator.crt", *dir_ + "/coordinator.key", *dir_ + "/ca.crt", ""},
                TlsUse::kDaemon, Role::kCoordinator);
    EXPECT_TRUE(m.ok() && m->has_value()) << m.status();
    return m.ok() && m->has_value() ? **m : TlsMaterial{};
  }
  // A client that trusts our CA, with `identity`'s certificate (from `ca_dir`) and `headers`.
  static HttpsOptions Client(const std::string& identity = "",
                             std::vector<std::string> headers = {},
                             const std::string& ca_dir = "") {
    HttpsOptions o;
    o.ca_pem = Read("ca.crt");
    if (!identity.empty()) {
      o.cert_pem = Read(ca_dir + identity + ".crt");
      o.key_pem = Read(ca_dir + identity + ".key");
    }
    o.headers = std::move(headers);
    return o;
  }
  // A server whose handler counts the requests that reach it.
  absl::StatusOr<std::unique_ptr<HttpServer>> Serve(std::vector<std::string> tokens) {
    return HttpServer::Start(
        "127.0.0.1:0",
        [this](const HttpRequest& r) {
          served_.fetch_add(1);
          return Echo(r);
        },
        HttpSecurity{Coordinator(), std::move(tokens)});
  }

  static std::string* dir_;
  std::atomic<int> served_{0};
};
std::string* HttpsServerTest::dir_ = nullptr;

TEST_F(HttpsServerTest, AClientCertificateOrATokenOpensIt) {
  auto server = Serve({Token("token"), Token()});
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  struct Case {
    std::string what;
    HttpsOptions client;
  };
  const std::vector<Case> cases = {
      {"a client certificate", Client("client")},
      {"a certificate of another role (the port only reads)", Client("worker")},
      {"the metrics token", Client("", {"Authorization: Bearer " + Token()})},
      {"the API token", Client("", {"Authorization: Bearer " + Token("token")})},
      {"lower-case 'bearer'", Client("", {"authorization: bearer " + Token()})},
      {"Basic with the token as the password",
       Client("", {"Authorization: Basic " + absl::Base64Escape("prometheus:" + Token())})},
      {"a certificate and a valid token", Client("client", {"Authorization: Bearer " + Token()})},
  };
  for (const Case& c : cases) {
    auto r = HttpsGet(port, "/metrics?x=1", c.client);
    ASSERT_TRUE(r.ok()) << c.what << ": " << r.status();
    EXPECT_EQ(r->status, 200) << c.what << ": " << r->body;
    EXPECT_EQ(r->body, "GET /metrics x=1") << c.what;
    EXPECT_EQ(r->headers["x-content-type-options"], "nosniff");
  }
  EXPECT_EQ(served_.load(), static_cast<int>(cases.size()));
}

TEST_F(HttpsServerTest, EverythingElseIsRefusedBeforeTheHandler) {
  auto server = Serve({Token()});
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  struct Case {
    std::string what;
    HttpsOptions client;
    std::string says;
  };
  const std::vector<Case> cases = {
      {"no credentials", Client(), "requires a client certificate signed by the coordinator's CA"},
      {"a wrong token", Client("", {"Authorization: Bearer " + std::string(64, 'a')}),
       "the token is not valid"},
      {"a token that is not the port's", Client("", {"Authorization: Bearer " + Token("token")}),
       "the token is not valid"},
      {"a wrong token next to a good certificate",
       Client("client", {"Authorization: Bearer " + std::string(64, 'a')}),
       "the token is not valid"},
      {"the token as a Basic user name",
       Client("", {"Authorization: Basic " + absl::Base64Escape(Token() + ":x")}),
       "the token is not valid"},
      {"Basic that is not base64", Client("", {"Authorization: Basic %%%"}), "not base64"},
      {"another scheme", Client("", {"Authorization: Digest " + Token()}),
       "neither 'Bearer TOKEN' nor 'Basic'"},
  };
  for (const Case& c : cases) {
    auto r = HttpsGet(port, "/metrics", c.client);
    ASSERT_TRUE(r.ok()) << c.what << ": " << r.status();
    EXPECT_EQ(r->status, 401) << c.what;
    EXPECT_THAT(r->body, HasSubstr(c.says)) << c.what;
    EXPECT_THAT(r->headers["www-authenticate"], HasSubstr("realm=\"tandem\"")) << c.what;
    EXPECT_THAT(r->body, ::testing::Not(HasSubstr(Token()))) << c.what;
  }
  // A certificate from another CA fails the handshake; plain HTTP gets no HTTP answer.
  auto foreign = HttpsGet(port, "/metrics", Client("client", {}, "other/"));
  EXPECT_EQ(foreign.status().code(), absl::StatusCode::kUnavailable) << foreign.status();
  auto plain = HttpGet(port, "/metrics");
  EXPECT_FALSE(plain.ok()) << plain->status << " " << plain->body;
  // A client that does not trust the coordinator's CA refuses the server.
  HttpsOptions distrust = Client("", {"Authorization: Bearer " + Token()});
  distrust.ca_pem = Read("other/ca.crt");
  EXPECT_EQ(HttpsGet(port, "/metrics", distrust).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(served_.load(), 0);
}

TEST_F(HttpsServerTest, WithoutATokenOnlyCertificatesOpenIt) {
  auto server = Serve({});
  ASSERT_TRUE(server.ok()) << server.status();
  auto r = HttpsGet((*server)->port(), "/", Client("", {"Authorization: Bearer " + Token()}));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, 401);
  EXPECT_THAT(r->body, HasSubstr("accepts no tokens"));
  r = HttpsGet((*server)->port(), "/", Client("client"));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, 200);
}

TEST_F(HttpsServerTest, RefusesHttpsThatNobodyCouldOpenOrThatOpenSslRefuses) {
  // Without a CA, only a token opens the port; without either, nothing would.
  TlsMaterial no_ca = Coordinator();
  no_ca.ca_pem.clear();
  auto none = HttpServer::Start("127.0.0.1:0", Echo, HttpSecurity{no_ca, {}});
  EXPECT_EQ(none.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(none.status().message(), HasSubstr("without a CA"));
  auto token_only = HttpServer::Start("127.0.0.1:0", Echo, HttpSecurity{no_ca, {Token()}});
  ASSERT_TRUE(token_only.ok()) << token_only.status();
  auto r = HttpsGet((*token_only)->port(), "/", Client("", {"Authorization: Bearer " + Token()}));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, 200);
  r = HttpsGet((*token_only)->port(), "/", Client("client"));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, 401);  // not asked for, so not presented

  TlsMaterial wrong_key = Coordinator();
  wrong_key.key_pem = Read("worker.key");
  auto bad = HttpServer::Start("127.0.0.1:0", Echo, HttpSecurity{wrong_key, {Token()}});
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("the key is not usable with the certificate"));
  TlsMaterial no_key = Coordinator();
  no_key.key_pem.clear();
  EXPECT_EQ(HttpServer::Start("127.0.0.1:0", Echo, HttpSecurity{no_key, {Token()}}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tandem::coordinator
