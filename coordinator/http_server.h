// A plain HTTP/1.1 server that hands every request to one function of HttpRequest ->
// HttpResponse (coordinator/web_handlers.h). The only file that includes cpp-httplib: its
// header (and OpenSSL's, which Debian's build pulls in) stays out of the rest of the tree.
//
// Read-only by design: a request with a body is refused (413, and the connection closed);
// the handler decides what every method gets. Connections are served on a pool of 16
// threads (a kept-alive connection holds its thread, for at most 2 s idle), so the handler
// must be thread-safe.
#ifndef TANDEM_COORDINATOR_HTTP_SERVER_H_
#define TANDEM_COORDINATOR_HTTP_SERVER_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "coordinator/web_handlers.h"

namespace tandem::coordinator {

class HttpServer {
 public:
  using Handler = std::function<HttpResponse(const HttpRequest&)>;

  // Binds `listen` ("HOST:PORT", "[V6]:PORT"; port 0 picks a free one) and serves in the
  // background. INVALID_ARGUMENT for a malformed address, UNAVAILABLE when it cannot bind.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(const std::string& listen,
                                                           Handler handler);
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
