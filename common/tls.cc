#include "common/tls.h"

#include <grpcpp/grpcpp.h>
#include <grpcpp/security/auth_metadata_processor.h>
#include <openssl/bio.h>
#include <openssl/crypto.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/rpc.h"
#include "common/status_macros.h"
#include "spdlog/spdlog.h"

namespace tandem {
namespace {

constexpr char kCoordinatorName[] = "tandem-coordinator";
constexpr char kWorkerName[] = "tandem-worker";
constexpr char kClientName[] = "tandem-client";

// The whole file, or INVALID_ARGUMENT naming the flag, the file and why it cannot be read.
absl::StatusOr<std::string> ReadSmallFile(absl::string_view flag, const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, "=", path, ": cannot read the file: ", std::strerror(errno)));
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(flag, "=", path, ": not a regular file"));
  }
  if (st.st_size > (1 << 20)) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, "=", path, ": ", st.st_size, " bytes; a PEM file or token is < 1 MiB"));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, "=", path, ": cannot open the file: ", std::strerror(errno)));
  }
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct BioDeleter {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct X509Deleter {
  void operator()(X509* x) const { X509_free(x); }
};
struct KeyDeleter {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
using BioPtr = std::unique_ptr<BIO, BioDeleter>;
using X509Ptr = std::unique_ptr<X509, X509Deleter>;
using KeyPtr = std::unique_ptr<EVP_PKEY, KeyDeleter>;

BioPtr MemoryBio(const std::string& text) {
  return BioPtr(BIO_new_mem_buf(text.data(), static_cast<int>(text.size())));
}

// Every certificate in a PEM text, in order.
std::vector<X509Ptr> ParseCertificates(const std::string& pem) {
  std::vector<X509Ptr> out;
  BioPtr bio = MemoryBio(pem);
  while (bio != nullptr) {
    X509Ptr cert(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
    if (cert == nullptr) break;
    out.push_back(std::move(cert));
  }
  return out;
}

std::string CommonName(X509* cert) {
  X509_NAME* subject = X509_get_subject_name(cert);
  const int index = X509_NAME_get_index_by_NID(subject, NID_commonName, -1);
  if (index < 0) return "";
  unsigned char* utf8 = nullptr;
  const int n =
      ASN1_STRING_to_UTF8(&utf8, X509_NAME_ENTRY_get_data(X509_NAME_get_entry(subject, index)));
  if (n < 0) return "";
  std::string cn(reinterpret_cast<char*>(utf8), static_cast<size_t>(n));
  OPENSSL_free(utf8);
  return cn;
}

std::string TimeText(const ASN1_TIME* t) {
  BioPtr bio(BIO_new(BIO_s_mem()));
  if (bio == nullptr || ASN1_TIME_print(bio.get(), t) != 1) return "?";
  char* data = nullptr;
  const long n = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, static_cast<size_t>(n));
}

// Compares without an early exit, so that the time taken says nothing about the token.
bool ConstantTimeEquals(absl::string_view a, absl::string_view b) {
  if (a.size() != b.size()) return false;
  return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

std::string RoleList(const std::vector<Role>& roles) {
  std::vector<std::string> names;
  for (Role r : roles) names.emplace_back(RoleName(r));
  return absl::StrJoin(names, " or ");
}

// Runs Authorize on every call of a TLS server, before its handler.
class AccessProcessor final : public grpc::AuthMetadataProcessor {
 public:
  AccessProcessor(AccessPolicy policy, std::string token)
      : policy_(std::move(policy)), token_(std::move(token)) {}

  bool IsBlocking() const override { return false; }  // in-memory checks only

  grpc::Status Process(const InputMetadata& metadata, grpc::AuthContext* context,
                       OutputMetadata* consumed, OutputMetadata* /*response*/) override {
    Caller caller;
    std::string path;
    for (const auto& [key, value] : metadata) {
      const absl::string_view k(key.data(), key.size());
      if (k == ":path") path.assign(value.data(), value.size());
      if (k == "authorization") caller.authorization = std::string(value.data(), value.size());
    }
    caller.has_certificate = !context->FindPropertyValues(GRPC_X509_PEM_CERT_PROPERTY_NAME).empty();
    for (const grpc::string_ref& cn : context->FindPropertyValues(GRPC_X509_CN_PROPERTY_NAME)) {
      caller.common_name.assign(cn.data(), cn.size());
    }
    const absl::Status status = Authorize(policy_, token_, path, caller);
    if (!status.ok()) {
      refusals_.Log(policy_.server, absl::StrCat("a call of ", path), status);
      return ToGrpcStatus(status);
    }
    // The handlers never see the token.
    if (caller.authorization.has_value()) {
      consumed->insert(std::make_pair(std::string("authorization"), *caller.authorization));
    }
    return grpc::Status::OK;
  }

 private:
  const AccessPolicy policy_;
  const std::string token_;
  RefusalLog refusals_;
};

}  // namespace

absl::string_view RoleName(Role role) {
  switch (role) {
    case Role::kCoordinator:
      return kCoordinatorName;
    case Role::kWorker:
      return kWorkerName;
    case Role::kClient:
      return kClientName;
  }
  return "?";
}

std::optional<Role> RoleFromCommonName(absl::string_view common_name) {
  if (common_name == kCoordinatorName) return Role::kCoordinator;
  if (common_name == kWorkerName) return Role::kWorker;
  if (common_name == kClientName) return Role::kClient;
  return std::nullopt;
}

absl::StatusOr<std::optional<TlsMaterial>> LoadTls(const TlsFiles& files, TlsUse use, Role role) {
  if (!files.any()) return std::nullopt;
  // Half configurations, named by the flag that is missing.
  if (files.ca.empty()) {
    return absl::InvalidArgumentError(
        "--tls-ca is missing: TLS needs the CA certificate that signs the peers (give --tls-ca "
        "FILE, or no --tls-* flag at all for plaintext)");
  }
  if (!files.cert.empty() && files.key.empty()) {
    return absl::InvalidArgumentError("--tls-cert without --tls-key: give the certificate's key");
  }
  if (files.cert.empty() && !files.key.empty()) {
    return absl::InvalidArgumentError("--tls-key without --tls-cert: give the key's certificate");
  }
  if (use == TlsUse::kDaemon && files.cert.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("--tls-ca without --tls-cert and --tls-key: a ",
                                                   RoleName(role),
                                                   " needs a certificate of its own (mutual TLS)"));
  }

  TlsMaterial m;
  m.server_name = files.server_name;
  ASSIGN_OR_RETURN(m.ca_pem, ReadSmallFile("--tls-ca", files.ca));
  if (ParseCertificates(m.ca_pem).empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tls-ca=", files.ca, ": holds no PEM certificate"));
  }
  if (files.cert.empty()) return m;

  ASSIGN_OR_RETURN(m.cert_pem, ReadSmallFile("--tls-cert", files.cert));
  ASSIGN_OR_RETURN(m.key_pem, ReadSmallFile("--tls-key", files.key));

  std::vector<X509Ptr> chain = ParseCertificates(m.cert_pem);
  if (chain.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tls-cert=", files.cert, ": holds no PEM certificate"));
  }
  X509* leaf = chain.front().get();
  BioPtr key_bio = MemoryBio(m.key_pem);
  KeyPtr pkey(PEM_read_bio_PrivateKey(key_bio.get(), nullptr, nullptr, nullptr));
  if (pkey == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--tls-key=", files.key, ": holds no PEM private key (an unencrypted one is needed)"));
  }
  if (X509_check_private_key(leaf, pkey.get()) != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tls-key=", files.key, " is not the key of --tls-cert=", files.cert));
  }
  m.common_name = CommonName(leaf);
  m.not_after = TimeText(X509_get0_notAfter(leaf));
  if (X509_cmp_current_time(X509_get0_notAfter(leaf)) < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tls-cert=", files.cert, ": expired on ", m.not_after));
  }
  if (X509_cmp_current_time(X509_get0_notBefore(leaf)) > 0) {
    return absl::InvalidArgumentError(absl::StrCat("--tls-cert=", files.cert, ": not valid before ",
                                                   TimeText(X509_get0_notBefore(leaf))));
  }
  if (m.common_name != RoleName(role)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tls-cert=", files.cert, ": its subject Common Name is '", m.common_name,
                     "', but a ", RoleName(role), "'s certificate must say CN=", RoleName(role),
                     " (the Common Name carries the role that the peers check)"));
  }
  return m;
}

absl::StatusOr<std::string> ReadTokenFile(const std::string& path) {
  ASSIGN_OR_RETURN(std::string text, ReadSmallFile("token file", path));
  const std::string token(absl::StripAsciiWhitespace(text));
  if (token.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("token file ", path, " is empty"));
  }
  if (token.size() < kMinTokenLength) {
    return absl::InvalidArgumentError(absl::StrCat("the token in ", path, " has ", token.size(),
                                                   " characters; at least ", kMinTokenLength,
                                                   " are needed (e.g. openssl rand -hex 32)"));
  }
  for (char c : token) {
    if (c < 0x21 || c > 0x7e) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the token in ", path, " must be one line of printable ASCII without spaces"));
    }
  }
  return token;
}

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address,
                                           const ChannelSecurity& security) {
  if (!security.tls.has_value()) {
    if (!security.bearer_token.empty()) {
      // The flag checks rule this out; never send a token in the clear.
      spdlog::error("a bearer token is never sent without TLS; dialling {} without it", address);
    }
    return MakeInsecureChannel(address);
  }
  const TlsMaterial& tls = *security.tls;
  grpc::ChannelArguments args = DefaultChannelArguments();
  if (!tls.server_name.empty()) args.SetSslTargetNameOverride(tls.server_name);
  grpc::SslCredentialsOptions options;
  options.pem_root_certs = tls.ca_pem;
  options.pem_private_key = tls.key_pem;
  options.pem_cert_chain = tls.cert_pem;
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::SslCredentials(options);
  if (!security.bearer_token.empty()) {
    credentials = grpc::CompositeChannelCredentials(
        credentials, grpc::AccessTokenCredentials(security.bearer_token));
  }
  return grpc::CreateCustomChannel(address, credentials, args);
}

AccessPolicy CoordinatorAccessPolicy() {
  return {kCoordinatorName,
          {{"/tandem.v1.Coordinator/", {Role::kClient}},
           {"/tandem.v1.WorkerRegistry/", {Role::kWorker}},
           {"/tandem.v1.Rendezvous/", {Role::kWorker}},
           {"/tandem.v1.Checkpoints/", {Role::kWorker}},
           {"/grpc.health.v1.Health/", {}}}};
}

AccessPolicy WorkerAccessPolicy() {
  return {kWorkerName,
          {// The step relay: a worker forwards the coordinator's RunStep to other workers.
           {"/tandem.v1.StageWorker/RunStep", {Role::kCoordinator, Role::kWorker}},
           // Peer recovery: a worker of a job's next run reads the state another one kept.
           {"/tandem.v1.StageWorker/ReadState", {Role::kCoordinator, Role::kWorker}},
           {"/tandem.v1.StageWorker/", {Role::kCoordinator}},
           {"/grpc.health.v1.Health/", {}}}};
}

absl::Status Authorize(const AccessPolicy& policy, const std::string& token,
                       absl::string_view method_path, const Caller& caller) {
  if (!caller.has_certificate && !caller.authorization.has_value()) {
    return absl::UnauthenticatedError(absl::StrCat(
        "this ", policy.server,
        " requires a client certificate signed by its CA or a bearer token; the call carried "
        "neither"));
  }
  std::vector<Role> roles;
  std::string who;
  if (caller.authorization.has_value()) {
    absl::string_view value = *caller.authorization;
    if (!absl::StartsWithIgnoreCase(value, "Bearer ")) {
      return absl::UnauthenticatedError("the authorization header is not 'Bearer TOKEN'");
    }
    value.remove_prefix(7);
    if (token.empty()) {
      return absl::UnauthenticatedError(absl::StrCat(
          "this ", policy.server, " accepts no bearer tokens; authenticate with a certificate"));
    }
    if (!ConstantTimeEquals(absl::StripAsciiWhitespace(value), token)) {
      return absl::UnauthenticatedError("the bearer token is not valid");
    }
    roles.push_back(Role::kClient);
    who = "a bearer token (role tandem-client)";
  }
  if (caller.has_certificate) {
    const std::optional<Role> role = RoleFromCommonName(caller.common_name);
    if (role.has_value()) roles.push_back(*role);
    if (!who.empty()) absl::StrAppend(&who, " and ");
    absl::StrAppend(&who, "a certificate with CN=", caller.common_name,
                    role.has_value() ? "" : " (no Tandem role)");
  }
  for (const AccessRule& rule : policy.rules) {
    if (!absl::StartsWith(method_path, rule.path_prefix)) continue;
    if (rule.roles.empty()) return absl::OkStatus();
    for (Role r : roles) {
      if (std::find(rule.roles.begin(), rule.roles.end(), r) != rule.roles.end()) {
        return absl::OkStatus();
      }
    }
    return absl::PermissionDeniedError(absl::StrCat(method_path, " on a ", policy.server,
                                                    " is for ", RoleList(rule.roles),
                                                    " only; the caller presented ", who));
  }
  return absl::PermissionDeniedError(
      absl::StrCat("a ", policy.server, " serves no method ", method_path));
}

absl::Status AuthorizeMetricsReader(const std::vector<std::string>& tokens, const Caller& caller) {
  if (!caller.authorization.has_value()) {
    if (caller.has_certificate) return absl::OkStatus();
    return absl::UnauthenticatedError(
        "this port requires a client certificate signed by the coordinator's CA or a bearer token "
        "(Authorization: Bearer TOKEN); the request carried neither");
  }
  absl::string_view value = absl::StripAsciiWhitespace(*caller.authorization);
  std::string token;
  if (absl::StartsWithIgnoreCase(value, "Bearer ")) {
    token = std::string(absl::StripAsciiWhitespace(value.substr(7)));
  } else if (absl::StartsWithIgnoreCase(value, "Basic ")) {
    // base64(USER:PASSWORD), the password being the token.
    std::string decoded;
    if (!absl::Base64Unescape(absl::StripAsciiWhitespace(value.substr(6)), &decoded) ||
        decoded.find(':') == std::string::npos) {
      return absl::UnauthenticatedError(
          "the Basic credentials are not base64 of USER:TOKEN (the token is the password)");
    }
    token = decoded.substr(decoded.find(':') + 1);
  } else {
    return absl::UnauthenticatedError(
        "the Authorization header is neither 'Bearer TOKEN' nor 'Basic' with the token as the "
        "password");
  }
  if (tokens.empty()) {
    return absl::UnauthenticatedError(
        "this port accepts no tokens (the coordinator has no --metrics-token-file or "
        "--auth-token-file); authenticate with a client certificate signed by its CA");
  }
  bool valid = false;
  for (const std::string& t : tokens) valid |= ConstantTimeEquals(token, t);  // try them all
  if (!valid) return absl::UnauthenticatedError("the token is not valid");
  return absl::OkStatus();
}

void RefusalLog::Log(absl::string_view server, absl::string_view what, const absl::Status& status) {
  const int64_t now = std::chrono::duration_cast<std::chrono::milliseconds>(
                          std::chrono::steady_clock::now().time_since_epoch())
                          .count();
  int64_t last = last_ms_.load();
  if (now - last < 1000 || !last_ms_.compare_exchange_strong(last, now)) {
    suppressed_.fetch_add(1);
    return;
  }
  const int64_t more = suppressed_.exchange(0);
  spdlog::warn(
      "{}: refused {}: {}{}", std::string(server), std::string(what), status.ToString(),
      more > 0 ? absl::StrCat(" (and ", more, " more refusals since the last report)") : "");
}

std::shared_ptr<grpc::ServerCredentials> MakeServerCredentials(const ServerSecurity& security) {
  if (!security.tls.has_value()) return grpc::InsecureServerCredentials();
  const TlsMaterial& tls = *security.tls;
  // Ask for a certificate and verify one that is presented (a bad one fails the handshake),
  // but let a call without one arrive: it may carry a token, and Authorize answers
  // UNAUTHENTICATED rather than a handshake error the client cannot explain.
  grpc::SslServerCredentialsOptions options(GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY);
  options.pem_root_certs = tls.ca_pem;
  options.pem_key_cert_pairs.push_back({tls.key_pem, tls.cert_pem});
  std::shared_ptr<grpc::ServerCredentials> credentials = grpc::SslServerCredentials(options);
  credentials->SetAuthMetadataProcessor(
      std::make_shared<AccessProcessor>(security.policy, security.token));
  return credentials;
}

void LogSecurity(absl::string_view daemon, const ServerSecurity& security) {
  if (!security.tls.has_value()) {
    spdlog::warn(
        "{}: PLAINTEXT mode: the API port is neither encrypted nor authenticated, and anyone who "
        "can reach it can call every method. Use it only on a single trusted machine; give "
        "--tls-cert, --tls-key and --tls-ca for TLS with mutual authentication.",
        std::string(daemon));
    return;
  }
  std::vector<std::string> rules;
  for (const AccessRule& rule : security.policy.rules) {
    rules.push_back(
        absl::StrCat(rule.path_prefix, "* for ",
                     rule.roles.empty() ? "anyone authenticated" : RoleList(rule.roles)));
  }
  spdlog::info(
      "{}: TLS with mutual authentication: certificate CN={} (expires {}); peers' "
      "certificates verified against the CA; {}; {}",
      std::string(daemon), security.tls->common_name, security.tls->not_after,
      security.token.empty() ? "no bearer token accepted"
                             : "a bearer token from --auth-token-file makes a client",
      absl::StrJoin(rules, ", "));
}

}  // namespace tandem
