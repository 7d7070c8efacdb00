#include "coordinator/http_server.h"

#include <httplib.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

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

// The session id context of the HTTPS port: without one, OpenSSL fails the handshake of a
// client that resumes a session in which it presented a certificate.
constexpr char kSessionContext[] = "tandem-metrics";

std::string OpenSslError() {
  const unsigned long code = ERR_get_error();
  if (code == 0) return "no detail from OpenSSL";
  char text[256];
  ERR_error_string_n(code, text, sizeof(text));
  ERR_clear_error();
  return text;
}

// Sets up an HTTPS port's context from `tls`: its certificate chain and key, TLS 1.2 or later,
// and, with a CA, client certificates asked for and verified against it when presented (a bad
// one fails the handshake), but not required: a request may carry a token instead. An empty
// string on success, else what failed.
std::string ConfigureTls(SSL_CTX& ctx, const TlsMaterial& tls) {
  SSL_CTX_set_options(&ctx, SSL_OP_NO_COMPRESSION | SSL_OP_NO_RENEGOTIATION);
  if (SSL_CTX_set_min_proto_version(&ctx, TLS1_2_VERSION) != 1) {
    return "cannot require TLS 1.2: " + OpenSslError();
  }
  std::unique_ptr<BIO, decltype(&BIO_free)> chain(
      BIO_new_mem_buf(tls.cert_pem.data(), static_cast<int>(tls.cert_pem.size())), &BIO_free);
  X509* leaf = chain ? PEM_read_bio_X509(chain.get(), nullptr, nullptr, nullptr) : nullptr;
  if (leaf == nullptr || SSL_CTX_use_certificate(&ctx, leaf) != 1) {
    X509_free(leaf);
    return "the certificate is not usable: " + OpenSslError();
  }
  X509_free(leaf);  // the context holds its own reference
  while (X509* intermediate = PEM_read_bio_X509(chain.get(), nullptr, nullptr, nullptr)) {
    if (SSL_CTX_add0_chain_cert(&ctx, intermediate) != 1) {  // takes it on success
      X509_free(intermediate);
      return "the certificate chain is not usable: " + OpenSslError();
    }
  }
  ERR_clear_error();  // the end of the PEM text
  std::unique_ptr<BIO, decltype(&BIO_free)> key_bio(
      BIO_new_mem_buf(tls.key_pem.data(), static_cast<int>(tls.key_pem.size())), &BIO_free);
  EVP_PKEY* key =
      key_bio ? PEM_read_bio_PrivateKey(key_bio.get(), nullptr, nullptr, nullptr) : nullptr;
  const bool key_used = key != nullptr && SSL_CTX_use_PrivateKey(&ctx, key) == 1;
  EVP_PKEY_free(key);
  if (!key_used || SSL_CTX_check_private_key(&ctx) != 1) {
    return "the key is not usable with the certificate: " + OpenSslError();
  }
  if (tls.ca_pem.empty()) {
    SSL_CTX_set_verify(&ctx, SSL_VERIFY_NONE, nullptr);
    return "";
  }
  std::unique_ptr<BIO, decltype(&BIO_free)> ca_bio(
      BIO_new_mem_buf(tls.ca_pem.data(), static_cast<int>(tls.ca_pem.size())), &BIO_free);
  X509_STORE* store = SSL_CTX_get_cert_store(&ctx);
  int cas = 0;
  while (X509* ca = ca_bio ? PEM_read_bio_X509(ca_bio.get(), nullptr, nullptr, nullptr) : nullptr) {
    const bool added = X509_STORE_add_cert(store, ca) == 1 && SSL_CTX_add_client_CA(&ctx, ca) == 1;
    X509_free(ca);
    if (!added) return "the CA certificate is not usable: " + OpenSslError();
    ++cas;
  }
  ERR_clear_error();
  if (cas == 0) return "the CA text holds no PEM certificate";
  SSL_CTX_set_verify(&ctx, SSL_VERIFY_PEER, nullptr);
  SSL_CTX_set_session_id_context(&ctx, reinterpret_cast<const unsigned char*>(kSessionContext),
                                 sizeof(kSessionContext) - 1);
  return "";
}

// What an HTTPS request presented: a verified client certificate, its Authorization header.
Caller CallerOf(const httplib::Request& req) {
  Caller caller;
  if (req.ssl != nullptr) {
    caller.has_certificate = SSL_get0_peer_certificate(req.ssl) != nullptr &&
                             SSL_get_verify_result(req.ssl) == X509_V_OK;
  }
  if (req.has_header("Authorization")) {
    caller.authorization = req.get_header_value("Authorization");
  }
  return caller;
}

}  // namespace

struct HttpServer::Impl {
  std::unique_ptr<httplib::Server> server;  // an httplib::SSLServer for HTTPS
  std::thread thread;
  RefusalLog refusals;
};

HttpServer::HttpServer(std::unique_ptr<Impl> impl, int port)
    : impl_(std::move(impl)), port_(port) {}

HttpServer::~HttpServer() {
  impl_->server->stop();
  if (impl_->thread.joinable()) impl_->thread.join();
}

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(const std::string& listen,
                                                              Handler handler,
                                                              const HttpSecurity& security) {
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
  const bool https = security.tls.has_value();
  if (https) {
    const TlsMaterial& tls = *security.tls;
    if (tls.cert_pem.empty() || tls.key_pem.empty()) {
      return absl::InvalidArgumentError("HTTPS needs a certificate and its key");
    }
    if (tls.ca_pem.empty() && security.tokens.empty()) {
      return absl::InvalidArgumentError(
          "HTTPS without a CA (for client certificates) or a token would let no request in");
    }
    std::string error;
    auto ssl_server = std::make_unique<httplib::SSLServer>([&](SSL_CTX& ctx) {
      error = ConfigureTls(ctx, tls);
      return error.empty();
    });
    if (!ssl_server->is_valid()) {
      return absl::InvalidArgumentError(
          absl::StrCat("cannot serve HTTPS: ", error.empty() ? OpenSslError() : error));
    }
    impl->server = std::move(ssl_server);
  } else {
    impl->server = std::make_unique<httplib::Server>();
  }
  httplib::Server& server = *impl->server;
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
  Impl* raw = impl.get();
  server.set_pre_routing_handler(
      [raw, https, tokens = security.tokens, handler = std::move(handler)](
          const httplib::Request& req, httplib::Response& res) {
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
        if (https) {
          const absl::Status allowed = AuthorizeMetricsReader(tokens, CallerOf(req));
          if (!allowed.ok()) {
            raw->refusals.Log("metrics port",
                              absl::StrCat("a request for ", req.path, " from ", req.remote_addr),
                              allowed);
            res.status = 401;
            // A browser prompts for Basic credentials (the token as the password).
            res.set_header("WWW-Authenticate", "Basic realm=\"tandem\", charset=\"UTF-8\"");
            res.set_header("WWW-Authenticate", "Bearer realm=\"tandem\"");
            res.set_content(absl::StrCat(allowed.message(), "\n"), "text/plain; charset=utf-8");
            return httplib::Server::HandlerResponse::Handled;
          }
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
  impl->thread = std::thread([raw] { raw->server->listen_after_bind(); });
  // httplib's stop() does nothing until the server loop runs: wait for it, so that the
  // destructor always stops it.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!raw->server->is_running() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  auto server_ptr = std::unique_ptr<HttpServer>(new HttpServer(std::move(impl), bound));
  if (!raw->server->is_running()) {
    return absl::InternalError(absl::StrCat("the HTTP server on ", listen, " did not start"));
  }
  return server_ptr;
}

}  // namespace tandem::coordinator
