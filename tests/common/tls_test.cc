// The access rules (Authorize), certificate loading (LoadTls) and token files, without a
// server: certificates come from scripts/dev-certs.sh, run into a temporary directory.
#include "common/tls.h"

#include <stdlib.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/escaping.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

Caller Cert(const std::string& cn) {
  Caller c;
  c.has_certificate = true;
  c.common_name = cn;
  return c;
}

Caller Token(const std::string& token) {
  Caller c;
  c.authorization = "Bearer " + token;
  return c;
}

constexpr char kToken[] = "0123456789abcdef0123456789abcdef";

TEST(Authorize, TheCoordinatorsRules) {
  const AccessPolicy p = CoordinatorAccessPolicy();
  const std::string list = "/tandem.v1.Coordinator/ListJobs";
  const std::string reg = "/tandem.v1.WorkerRegistry/Register";
  EXPECT_TRUE(Authorize(p, kToken, list, Cert("tandem-client")).ok());
  EXPECT_TRUE(Authorize(p, kToken, list, Token(kToken)).ok());
  EXPECT_TRUE(Authorize(p, kToken, reg, Cert("tandem-worker")).ok());
  EXPECT_TRUE(Authorize(p, kToken, "/tandem.v1.Rendezvous/Get", Cert("tandem-worker")).ok());
  EXPECT_TRUE(
      Authorize(p, kToken, "/tandem.v1.Checkpoints/ReadTensors", Cert("tandem-worker")).ok());
  EXPECT_TRUE(Authorize(p, kToken, "/grpc.health.v1.Health/Check", Cert("tandem-worker")).ok());
  EXPECT_TRUE(Authorize(p, kToken, "/grpc.health.v1.Health/Check", Token(kToken)).ok());

  absl::Status none = Authorize(p, kToken, list, Caller{});
  EXPECT_TRUE(absl::IsUnauthenticated(none)) << none;
  EXPECT_THAT(none.message(), HasSubstr("carried neither"));
  EXPECT_TRUE(absl::IsUnauthenticated(Authorize(p, kToken, list, Token("wrong-token-0123456789"))));
  EXPECT_TRUE(
      absl::IsUnauthenticated(Authorize(p, kToken, list, Token(std::string(kToken) + "x"))));
  // A wrong token is refused even with a good certificate.
  Caller both = Cert("tandem-client");
  both.authorization = "Bearer nope-nope-nope-nope";
  EXPECT_TRUE(absl::IsUnauthenticated(Authorize(p, kToken, list, both)));
  Caller basic;
  basic.authorization = "Basic dXNlcjpwdw==";
  EXPECT_TRUE(absl::IsUnauthenticated(Authorize(p, kToken, list, basic)));
  // Without an accepted token, a token is refused.
  EXPECT_TRUE(absl::IsUnauthenticated(Authorize(p, "", list, Token(kToken))));

  absl::Status worker_as_client = Authorize(p, kToken, list, Cert("tandem-worker"));
  EXPECT_TRUE(absl::IsPermissionDenied(worker_as_client)) << worker_as_client;
  EXPECT_THAT(worker_as_client.message(), HasSubstr("is for tandem-client only"));
  EXPECT_TRUE(absl::IsPermissionDenied(Authorize(p, kToken, reg, Cert("tandem-client"))));
  EXPECT_TRUE(absl::IsPermissionDenied(Authorize(p, kToken, reg, Token(kToken))));
  EXPECT_TRUE(absl::IsPermissionDenied(Authorize(p, kToken, reg, Cert("tandem-coordinator"))));
  EXPECT_TRUE(absl::IsPermissionDenied(Authorize(p, kToken, list, Cert("somebody"))));
  EXPECT_TRUE(absl::IsPermissionDenied(Authorize(p, kToken, "/other.Service/X", Token(kToken))));
  // Common Names are matched exactly.
  EXPECT_TRUE(absl::IsPermissionDenied(Authorize(p, kToken, reg, Cert("tandem-worker "))));
  EXPECT_TRUE(absl::IsPermissionDenied(Authorize(p, kToken, reg, Cert("Tandem-Worker"))));
}

TEST(Authorize, TheWorkersRules) {
  const AccessPolicy p = WorkerAccessPolicy();
  const std::string run = "/tandem.v1.StageWorker/RunStep";
  EXPECT_TRUE(Authorize(p, "", run, Cert("tandem-coordinator")).ok());
  EXPECT_TRUE(absl::IsPermissionDenied(Authorize(p, "", run, Cert("tandem-client"))));
  // Another worker may forward a RunStep (the step relay) and read a kept state (peer
  // recovery), and call nothing else.
  EXPECT_TRUE(Authorize(p, "", run, Cert("tandem-worker")).ok());
  EXPECT_TRUE(Authorize(p, "", "/tandem.v1.StageWorker/ReadState", Cert("tandem-worker")).ok());
  EXPECT_TRUE(absl::IsPermissionDenied(
      Authorize(p, "", "/tandem.v1.StageWorker/ReadState", Cert("tandem-client"))));
  EXPECT_TRUE(absl::IsPermissionDenied(
      Authorize(p, "", "/tandem.v1.StageWorker/Configure", Cert("tandem-worker"))));
  EXPECT_TRUE(absl::IsPermissionDenied(
      Authorize(p, "", "/tandem.v1.StageWorker/Abort", Cert("tandem-worker"))));
  EXPECT_TRUE(Authorize(p, "", "/tandem.v1.StageWorker/Abort", Cert("tandem-coordinator")).ok());
  EXPECT_TRUE(absl::IsUnauthenticated(Authorize(p, "", run, Token(kToken))));
  EXPECT_TRUE(absl::IsUnauthenticated(Authorize(p, "", run, Caller{})));
  EXPECT_TRUE(Authorize(p, "", "/grpc.health.v1.Health/Check", Cert("tandem-client")).ok());
}

TEST(AuthorizeMetricsReader, ACertificateOfAnyNameOrAnAcceptedToken) {
  const std::vector<std::string> tokens = {kToken, "fedcba9876543210fedcba9876543210"};
  EXPECT_TRUE(AuthorizeMetricsReader(tokens, Cert("tandem-client")).ok());
  EXPECT_TRUE(AuthorizeMetricsReader(tokens, Cert("prometheus")).ok());  // no role needed
  EXPECT_TRUE(AuthorizeMetricsReader(tokens, Token(kToken)).ok());
  EXPECT_TRUE(AuthorizeMetricsReader(tokens, Token(tokens[1])).ok());
  Caller basic;
  basic.authorization = "Basic " + absl::Base64Escape(std::string("anyone:") + kToken);
  EXPECT_TRUE(AuthorizeMetricsReader(tokens, basic).ok());

  const absl::Status none = AuthorizeMetricsReader(tokens, Caller{});
  EXPECT_TRUE(absl::IsUnauthenticated(none)) << none;
  EXPECT_THAT(none.message(), HasSubstr("carried neither"));
  absl::Status wrong = AuthorizeMetricsReader(tokens, Token("wrong-token-0123456789"));
  EXPECT_TRUE(absl::IsUnauthenticated(wrong));
  EXPECT_THAT(wrong.message(), HasSubstr("the token is not valid"));
  EXPECT_THAT(wrong.message(), Not(HasSubstr("wrong-token")));  // never echoed
  Caller both = Cert("tandem-client");
  both.authorization = "Bearer nope-nope-nope-nope";
  EXPECT_TRUE(absl::IsUnauthenticated(AuthorizeMetricsReader(tokens, both)));
  Caller user_is_token;
  user_is_token.authorization = "Basic " + absl::Base64Escape(std::string(kToken) + ":");
  EXPECT_TRUE(absl::IsUnauthenticated(AuthorizeMetricsReader(tokens, user_is_token)));
  Caller not_base64;
  not_base64.authorization = "Basic ***";
  EXPECT_TRUE(absl::IsUnauthenticated(AuthorizeMetricsReader(tokens, not_base64)));
  Caller digest;
  digest.authorization = std::string("Digest ") + kToken;
  EXPECT_TRUE(absl::IsUnauthenticated(AuthorizeMetricsReader(tokens, digest)));
  const absl::Status no_tokens = AuthorizeMetricsReader({}, Token(kToken));
  EXPECT_TRUE(absl::IsUnauthenticated(no_tokens));
  EXPECT_THAT(no_tokens.message(), HasSubstr("accepts no tokens"));
  EXPECT_TRUE(AuthorizeMetricsReader({}, Cert("tandem-worker")).ok());
}

TEST(Roles, CommonNames) {
  for (Role r : {Role::kCoordinator, Role::kWorker, Role::kClient}) {
    EXPECT_EQ(RoleFromCommonName(RoleName(r)), r);
  }
  EXPECT_EQ(RoleFromCommonName("tandem"), std::nullopt);
}

class TlsFilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/tandem-tls-test-XXXXXX";
    dir_ = mkdtemp(tmpl);
    const std::string cmd =
        std::string(TANDEM_SOURCE_DIR) + "/scripts/dev-certs.sh " + dir_ + " --days 2 >/dev/null";
    ASSERT_EQ(std::system(cmd.c_str()), 0);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string F(const std::string& name) const { return dir_ + "/" + name; }
  std::string Write(const std::string& name, const std::string& text) const {
    std::ofstream(F(name)) << text;
    return F(name);
  }
  std::string dir_;
};

TEST_F(TlsFilesTest, LoadsADaemonsCertificate) {
  auto m =
      LoadTls({F("worker.crt"), F("worker.key"), F("ca.crt"), ""}, TlsUse::kDaemon, Role::kWorker);
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_TRUE(m->has_value());
  EXPECT_EQ((*m)->common_name, "tandem-worker");
  EXPECT_THAT((*m)->cert_pem, HasSubstr("BEGIN CERTIFICATE"));
  EXPECT_THAT((*m)->key_pem, HasSubstr("PRIVATE KEY"));
  EXPECT_FALSE((*m)->not_after.empty());
  // No flags: plaintext.
  auto none = LoadTls({}, TlsUse::kDaemon, Role::kWorker);
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());
  // A client may go without a certificate.
  auto client =
      LoadTls({"", "", F("ca.crt"), "tandem-coordinator"}, TlsUse::kClient, Role::kClient);
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_TRUE((*client)->cert_pem.empty());
  EXPECT_EQ((*client)->server_name, "tandem-coordinator");
}

TEST_F(TlsFilesTest, RefusesHalfConfigurationsAndBadFilesNamingThem) {
  struct Case {
    TlsFiles files;
    TlsUse use;
    std::string says;
  };
  const std::vector<Case> cases = {
      {{F("worker.crt"), F("worker.key"), "", ""}, TlsUse::kDaemon, "--tls-ca is missing"},
      {{F("worker.crt"), "", F("ca.crt"), ""}, TlsUse::kDaemon, "--tls-cert without --tls-key"},
      {{"", F("worker.key"), F("ca.crt"), ""}, TlsUse::kClient, "--tls-key without --tls-cert"},
      {{"", "", F("ca.crt"), ""}, TlsUse::kDaemon, "needs a certificate of its own"},
      {{"", "", "", "name"}, TlsUse::kClient, "--tls-ca is missing"},
      {{F("worker.crt"), F("worker.key"), F("missing.crt"), ""},
       TlsUse::kDaemon,
       "--tls-ca=" + F("missing.crt") + ": cannot read the file: No such file or directory"},
      {{F("worker.crt"), F("worker.key"), dir_, ""}, TlsUse::kDaemon, "not a regular file"},
      {{F("worker.crt"), F("worker.key"), F("worker.key"), ""},
       TlsUse::kDaemon,
       "holds no PEM certificate"},
      {{F("worker.key"), F("worker.key"), F("ca.crt"), ""},
       TlsUse::kDaemon,
       "--tls-cert=" + F("worker.key") + ": holds no PEM certificate"},
      {{F("worker.crt"), F("worker.crt"), F("ca.crt"), ""},
       TlsUse::kDaemon,
       "holds no PEM private key"},
      {{F("worker.crt"), F("client.key"), F("ca.crt"), ""},
       TlsUse::kDaemon,
       "is not the key of --tls-cert"},
      {{F("client.crt"), F("client.key"), F("ca.crt"), ""},
       TlsUse::kDaemon,
       "its subject Common Name is 'tandem-client', but a tandem-worker's certificate must say "
       "CN=tandem-worker"},
  };
  for (const Case& c : cases) {
    auto m = LoadTls(c.files, c.use, Role::kWorker);
    ASSERT_FALSE(m.ok()) << c.says;
    EXPECT_TRUE(absl::IsInvalidArgument(m.status()));
    EXPECT_THAT(m.status().message(), HasSubstr(c.says));
  }
}

TEST_F(TlsFilesTest, RefusesAnExpiredCertificate) {
  // Valid from now until a day ago: expired.
  const std::string cmd = "cd " + dir_ +
                          " && openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 "
                          "-nodes -keyout old.key -out old.csr -subj /CN=tandem-worker 2>/dev/null"
                          " && openssl x509 -req -in old.csr -CA ca.crt -CAkey ca.key "
                          "-CAcreateserial -days -1 -out old.crt 2>/dev/null";
  if (std::system(cmd.c_str()) != 0) GTEST_SKIP() << "this openssl cannot back-date a certificate";
  auto m = LoadTls({F("old.crt"), F("old.key"), F("ca.crt"), ""}, TlsUse::kDaemon, Role::kWorker);
  ASSERT_FALSE(m.ok());
  EXPECT_THAT(m.status().message(), HasSubstr("expired on"));
}

TEST_F(TlsFilesTest, TokenFiles) {
  auto token = ReadTokenFile(F("token"));
  ASSERT_TRUE(token.ok()) << token.status();
  EXPECT_EQ(token->size(), 64u);
  EXPECT_EQ(*ReadTokenFile(Write("t1", "  0123456789abcdef\n\n")), "0123456789abcdef");
  EXPECT_THAT(ReadTokenFile(Write("t2", "\n")).status().message(), HasSubstr("is empty"));
  EXPECT_THAT(ReadTokenFile(Write("t3", "short\n")).status().message(), HasSubstr("at least 16"));
  EXPECT_THAT(ReadTokenFile(Write("t4", "0123456789abcdef\nsecond-line-0123\n")).status().message(),
              HasSubstr("one line"));
  EXPECT_THAT(ReadTokenFile(F("none")).status().message(), HasSubstr("No such file"));
}

}  // namespace
}  // namespace tandem
