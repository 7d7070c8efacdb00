#include "coordinator/http_server.h"

#include <httplib.h>

#include <chrono>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

namespace tandem::coordinator {
namespace {

constexpr size_t kMaxRequestBodyBytes = 4096;  // should a body be read after all
// httplib serves a connection on one thread for as long as it is kept alive, and a browser
// opens up to six: enough threads for a few dashboards and a scraper, and idle connections
// let go soon.
constexpr size_t kServerThreads = 16;
constexpr time_t kKeepAliveSeconds = 2;

}  // namespace

struct HttpServer::Impl {
  httplib::Server server;
  std::thread thread;
};

HttpServer::HttpServer(std::unique_ptr<Impl> impl, int port)
    : impl_(std::move(impl)), port_(port) {}

HttpServer::~HttpServer() {
  impl_->server.stop();
  if (impl_->thread.joinable()) impl_->thread.join();
}

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(const std::string& listen,
                                                              Handler handler) {
  const size_t colon = listen.rfind(':');
  int port = -1;
  if (colon == std::string::npos || colon == 0 ||
      !absl::SimpleAtoi(listen.substr(colon + 1), &port) || port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", listen, "' is not HOST:PORT (e.g. 127.0.0.1:9090)"));
  }
  std::string host = listen.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }

  auto impl = std::make_unique<Impl>();
  httplib::Server& server = impl->server;
  server.new_task_queue = [] { return new httplib::ThreadPool(kServerThreads); };
  server.set_payload_max_length(kMaxRequestBodyBytes);
  server.set_keep_alive_timeout(kKeepAliveSeconds);
  server.set_default_headers({{"X-Content-Type-Options", "nosniff"}});
  // SO_REUSEADDR only: httplib's default adds SO_REUSEPORT, with which a second process
  // could bind the same port and share its connections instead of failing.
  server.set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  // Every request, whatever its method, goes to the handler: no routing table here.
  server.set_pre_routing_handler(
      [handler = std::move(handler)](const httplib::Request& req, httplib::Response& res) {
        // No route takes a body. This hook runs before httplib reads one: refuse it and
        // close, rather than leave it unread on a kept-alive connection.
        uint64_t length = 0;
        if (req.has_header("Transfer-Encoding") ||
            (req.has_header("Content-Length") &&
             (!absl::SimpleAtoi(req.get_header_value("Content-Length"), &length) || length > 0))) {
          res.status = 413;
          res.set_header("Connection", "close");
          res.set_content("request bodies are not accepted\n", "text/plain; charset=utf-8");
          return httplib::Server::HandlerResponse::Handled;
        }
        HttpRequest request;
        request.method = req.method;
        request.path = req.path;
        for (const auto& [key, value] : req.params) request.query.emplace(key, value);
        HttpResponse response;
        try {
          response = handler(request);
        } catch (const std::exception& e) {
          spdlog::error("http: {} {}: {}", req.method, req.path, e.what());
          response = HttpResponse{500, "text/plain; charset=utf-8", "internal error\n", {}};
        }
        res.status = response.status;
        for (const auto& [key, value] : response.headers) res.set_header(key, value);
        res.set_content(response.body, response.content_type);
        return httplib::Server::HandlerResponse::Handled;
      });

  int bound = port;
  if (port == 0) {
    bound = server.bind_to_any_port(host);
  } else if (!server.bind_to_port(host, port)) {
    bound = -1;
  }
  if (bound <= 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", listen));
  }
  Impl* raw = impl.get();
  impl->thread = std::thread([raw] { raw->server.listen_after_bind(); });
  // httplib's stop() does nothing until the server loop runs: wait for it, so that the
  // destructor always stops it.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!raw->server.is_running() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  auto server_ptr = std::unique_ptr<HttpServer>(new HttpServer(std::move(impl), bound));
  if (!raw->server.is_running()) {
    return absl::InternalError(absl::StrCat("the HTTP server on ", listen, " did not start"));
  }
  return server_ptr;
}

}  // namespace tandem::coordinator
