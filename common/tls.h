// Transport security of Tandem's gRPC API ports, in one place: every channel and every API
// server is made here. TLS with mutual authentication (each side presents a certificate signed
// by the CA the other trusts), the role a certificate carries, bearer tokens for clients, and
// the per-method access rules the servers enforce. Plaintext (no TLS flags) stays available
// for a single trusted machine.
//
// Roles. A certificate's role is its subject Common Name, exactly one of tandem-coordinator,
// tandem-worker, tandem-client (scripts/dev-certs.sh issues them so). The names a peer is
// dialled by are checked against the certificate's subjectAltNames, as usual, so the Common
// Name is free to carry the role. A valid bearer token also makes its caller a client.
//
// The access rules (CoordinatorAccessPolicy, WorkerAccessPolicy) are checked on every call,
// before its handler runs, by an AuthMetadataProcessor on the server's credentials:
//   no certificate and no token           UNAUTHENTICATED
//   a token that is not the server's      UNAUTHENTICATED (even with a valid certificate)
//   a certificate signed by another CA    the TLS handshake fails (the call never arrives)
//   a valid identity without the role     PERMISSION_DENIED, naming the roles the method takes
//
// Thread-safe: everything here is a pure function or immutable after construction.
#ifndef TANDEM_COMMON_TLS_H_
#define TANDEM_COMMON_TLS_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace grpc {
class Channel;
class ServerCredentials;
}  // namespace grpc

namespace tandem {

enum class Role { kCoordinator, kWorker, kClient };

// "tandem-coordinator", "tandem-worker", "tandem-client": the Common Name that carries it.
absl::string_view RoleName(Role role);
std::optional<Role> RoleFromCommonName(absl::string_view common_name);

// The files a program's --tls-* flags name (empty: not given).
struct TlsFiles {
  std::string cert;         // this program's certificate chain, PEM
  std::string key;          // its private key, PEM
  std::string ca;           // the CA certificate(s) that sign the peers, PEM
  std::string server_name;  // dialling side only: the name the server's certificate must
                            // carry, instead of the host of the address dialled
  bool any() const { return !cert.empty() || !key.empty() || !ca.empty() || !server_name.empty(); }
};

// PEM text read from TlsFiles, and what the certificate says.
struct TlsMaterial {
  std::string ca_pem;
  std::string cert_pem;  // empty for a client without a certificate
  std::string key_pem;
  std::string server_name;
  std::string common_name;  // the certificate's subject CN; empty without a certificate
  std::string not_after;    // the certificate's expiry, as OpenSSL prints it
};

// kDaemon: a daemon (its API server and the channels it dials): cert, key and ca are all
// required, and the certificate must carry `role`. kClient: the CLI: ca is required; cert and
// key together or neither; a certificate must carry `role`.
enum class TlsUse { kDaemon, kClient };

// nullopt when no flag is given (plaintext). Otherwise every named file is read and parsed:
// INVALID_ARGUMENT names the missing flag of a half configuration ("--tls-cert without
// --tls-key"), the file that cannot be read (and why) or holds no PEM of the expected kind, a
// key that does not match its certificate, a certificate that has expired or is not valid yet,
// and a certificate whose Common Name is not `role`'s. (Whether the peers' CA signed this
// certificate is the peers' to check: a deployment may use one CA per role.)
absl::StatusOr<std::optional<TlsMaterial>> LoadTls(const TlsFiles& files, TlsUse use, Role role);

// Tokens shorter than this are refused: a bearer token must not be guessable.
inline constexpr size_t kMinTokenLength = 16;

// The token in `path`, without surrounding whitespace. INVALID_ARGUMENT names the file when it
// cannot be read, is empty, is shorter than kMinTokenLength or holds more than one line or
// characters that cannot go into an HTTP/2 header.
absl::StatusOr<std::string> ReadTokenFile(const std::string& path);

// How a channel authenticates itself. Plaintext when `tls` is unset; a bearer token is only
// ever sent over TLS (MakeChannel refuses to send it in the clear).
struct ChannelSecurity {
  std::optional<TlsMaterial> tls;
  std::string bearer_token;  // sent as `authorization: Bearer TOKEN` on every call
};

// A channel to HOST:PORT with the project's channel arguments (rpc.h's MakeInsecureChannel when
// the security is plaintext). A token is never sent without TLS: the callers' flag checks refuse
// that configuration, and should one slip through, the channel is dialled without the token (and an
// error logged), so that the server refuses the calls rather than the token leaking.
std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address,
                                           const ChannelSecurity& security);

// Who may call what: rules by method path prefix ("/tandem.v1.Coordinator/"), first match
// wins; a path no rule matches is refused (PERMISSION_DENIED).
struct AccessRule {
  std::string path_prefix;
  std::vector<Role> roles;  // any of them; empty: any authenticated caller (health)
};
struct AccessPolicy {
  std::string server;  // for messages: "tandem-coordinator"
  std::vector<AccessRule> rules;
};

// The coordinator's API port: tandem.v1.Coordinator for clients (certificate or token);
// WorkerRegistry, Rendezvous and Checkpoints for workers; grpc.health.v1 for anyone
// authenticated.
AccessPolicy CoordinatorAccessPolicy();
// A worker's API port: tandem.v1.StageWorker for the coordinator only, except RunStep, which
// the other workers may call too (the step relay forwards it); grpc.health.v1 for anyone
// authenticated.
AccessPolicy WorkerAccessPolicy();

// What the server knows of a caller, from the TLS handshake and the request's metadata.
struct Caller {
  bool has_certificate = false;  // a client certificate the CA verified
  std::string common_name;
  std::optional<std::string> authorization;  // the `authorization` header, as sent
};

// The decision for one call (see the table at the top). `token` is the accepted bearer token
// (empty: none accepted). OK, UNAUTHENTICATED or PERMISSION_DENIED, with a message that says
// what the caller lacks.
absl::Status Authorize(const AccessPolicy& policy, const std::string& token,
                       absl::string_view method_path, const Caller& caller);

// The decision for one request to the coordinator's metrics and dashboard port under TLS
// (coordinator/http_server.h). The port only reads, so it asks for no role: a client
// certificate the CA verified opens it whatever its Common Name, and so does an `Authorization`
// header of `Bearer TOKEN`, or `Basic` with TOKEN as the password (any user name: the form a
// browser prompts for), for any of `tokens`. OK, or UNAUTHENTICATED saying what the request
// lacked; a token not among `tokens` is refused even next to a valid certificate, as Authorize
// refuses it. The message never repeats what the request sent.
absl::Status AuthorizeMetricsReader(const std::vector<std::string>& tokens, const Caller& caller);

// Logs refusals as warnings ("SERVER: refused WHAT: STATUS"), at most one a second with a count
// of those left out since, so that a flood of refused calls cannot flood the log. Thread-safe.
class RefusalLog {
 public:
  void Log(absl::string_view server, absl::string_view what, const absl::Status& status);

 private:
  std::atomic<int64_t> last_ms_{-1000000};
  std::atomic<int64_t> suppressed_{0};
};

// An API server's security: plaintext (anyone may call anything) when `tls` is unset.
struct ServerSecurity {
  std::optional<TlsMaterial> tls;
  AccessPolicy policy;
  std::string token;  // the accepted bearer token; empty: clients need a certificate
};

// Credentials for ServerBuilder::AddListeningPort: TLS that asks for a client certificate and
// verifies one that is presented against the CA (a call without one may still carry a token),
// with `Authorize` run on every call; or insecure credentials.
std::shared_ptr<grpc::ServerCredentials> MakeServerCredentials(const ServerSecurity& security);

// One log line that says how the API port at `port` is secured; for plaintext a warning that
// it is for a single trusted machine. `daemon` is "tandem-coordinator" or "tandem-worker".
void LogSecurity(absl::string_view daemon, const ServerSecurity& security);

}  // namespace tandem

#endif  // TANDEM_COMMON_TLS_H_
