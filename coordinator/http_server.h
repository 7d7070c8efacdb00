// An HTTP/1.1 server that hands every request to one function of HttpRequest ->
// HttpResponse (coordinator/web_handlers.h): plain HTTP, or HTTPS whose every request must
// authenticate. The only file that includes cpp-httplib: its header (and OpenSSL's, which
// Debian's build pulls in) stays out of the rest of the tree.
//
// Read-only by design: a request with a body is refused (413, and the connection closed);
// the handler decides what every method gets. Connections are served on a pool of 16
// threads (a kept-alive connection holds its thread, for at most 2 s idle), so the handler
// must be thread-safe.
#ifndef TANDEM_COORDINATOR_HTTP_SERVER_H_
#define TANDEM_COORDINATOR_HTTP_SERVER_H_

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/tls.h"
#include "coordinator/web_handlers.h"

namespace tandem::coordinator {

// How the port is secured. Unset `tls`: plain HTTP, and anyone who reaches the port may read.
// Set: HTTPS (TLS 1.2 or later) with `tls`'s certificate and key, and a request reaches the
// handler only when AuthorizeMetricsReader (common/tls.h) accepts it: a client certificate
// that `tls->ca_pem` verifies (one it does not verify fails the handshake) or one of `tokens`;
// anything else is answered 401 with the reason, and a plain HTTP request gets no answer.
struct HttpSecurity {
  std::optional<TlsMaterial> tls;
  std::vector<std::string> tokens;  // the accepted bearer tokens; never logged
};

class HttpServer {
 public:
  using Handler = std::function<HttpResponse(const HttpRequest&)>;

  // Binds `listen` ("HOST:PORT", "[V6]:PORT"; port 0 picks a free one) and serves in the
  // background. INVALID_ARGUMENT for a malformed address, for TLS material OpenSSL does not
  // take, and for HTTPS that nobody could authenticate to (no CA and no token); UNAVAILABLE
  // when it cannot bind.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(const std::string& listen,
                                                           Handler handler,
                                                           const HttpSecurity& security = {});
  // Stops serving and joins the server's threads.
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  int port() const { return port_; }

 private:
  struct Impl;
  explicit HttpServer(std::unique_ptr<Impl> impl, int port);

  std::unique_ptr<Impl> impl_;
  int port_ = 0;
};

}  // namespace tandem::coordinator

#endif  // TANDEM_COORDINATOR_HTTP_SERVER_H_
