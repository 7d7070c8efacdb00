// A minimal HTTPS client for tests, on OpenSSL directly rather than on the library that serves
// the port: one request per connection to 127.0.0.1 (tests/http_client.h's text and parsing),
// the server's certificate verified against a CA and the address 127.0.0.1, optionally with a
// client certificate. Link OpenSSL::SSL.
#ifndef TANDEM_TESTS_HTTPS_CLIENT_H_
#define TANDEM_TESTS_HTTPS_CLIENT_H_

#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>

#include <csignal>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "tests/http_client.h"

namespace tandem::testing {

struct HttpsOptions {
  std::string ca_pem;    // the server's certificate must chain to it
  std::string cert_pem;  // a client certificate (chain) and its key; empty: none
  std::string key_pem;
  std::vector<std::string> headers;  // "Name: value", e.g. "Authorization: Bearer TOKEN"
};

inline std::string OpenSslErrorText() {
  const unsigned long code = ERR_get_error();
  ERR_clear_error();
  if (code == 0) return "no detail from OpenSSL";
  char text[256];
  ERR_error_string_n(code, text, sizeof(text));
  return text;
}

// GET `path` from https://127.0.0.1:port. UNAVAILABLE when it cannot connect, when the TLS
// handshake fails or the server ends the connection with a TLS alert before answering (a
// client certificate it does not trust, with TLS 1.3), each with OpenSSL's reason;
// INVALID_ARGUMENT for PEM that does not load; DATA_LOSS for an answer that is not HTTP.
inline absl::StatusOr<HttpResult> HttpsGet(int port, const std::string& path,
                                           const HttpsOptions& options) {
  // Under TLS 1.3 the client's handshake ends before the server has checked our certificate;
  // a server that refuses it then closes, and our write must fail with EPIPE (an error the
  // test reads), not end the test process with SIGPIPE.
  std::signal(SIGPIPE, SIG_IGN);
  struct Deleter {
    void operator()(SSL_CTX* c) const { SSL_CTX_free(c); }
    void operator()(SSL* s) const { SSL_free(s); }
    void operator()(BIO* b) const { BIO_free(b); }
    void operator()(X509* x) const { X509_free(x); }
    void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
  };
  auto pem_bio = [](const std::string& pem) {
    return std::unique_ptr<BIO, Deleter>(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  };
  std::unique_ptr<SSL_CTX, Deleter> ctx(SSL_CTX_new(TLS_client_method()));
  if (ctx == nullptr) return absl::InternalError("SSL_CTX_new: " + OpenSslErrorText());
  {
    auto bio = pem_bio(options.ca_pem);
    int cas = 0;
    while (X509* ca = PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr)) {
      X509_STORE_add_cert(SSL_CTX_get_cert_store(ctx.get()), ca);
      X509_free(ca);
      ++cas;
    }
    ERR_clear_error();
    if (cas == 0) return absl::InvalidArgumentError("the CA PEM holds no certificate");
  }
  SSL_CTX_set_verify(ctx.get(), SSL_VERIFY_PEER, nullptr);
  if (!options.cert_pem.empty()) {
    auto cert_bio = pem_bio(options.cert_pem);
    std::unique_ptr<X509, Deleter> cert(
        PEM_read_bio_X509(cert_bio.get(), nullptr, nullptr, nullptr));
    auto key_bio = pem_bio(options.key_pem);
    std::unique_ptr<EVP_PKEY, Deleter> key(
        PEM_read_bio_PrivateKey(key_bio.get(), nullptr, nullptr, nullptr));
    if (cert == nullptr || key == nullptr || SSL_CTX_use_certificate(ctx.get(), cert.get()) != 1 ||
        SSL_CTX_use_PrivateKey(ctx.get(), key.get()) != 1) {
      return absl::InvalidArgumentError("client certificate: " + OpenSslErrorText());
    }
  }

  absl::StatusOr<int> connected = ConnectLoopback(port);
  if (!connected.ok()) return connected.status();
  const int fd = *connected;
  std::unique_ptr<SSL, Deleter> ssl(SSL_new(ctx.get()));
  SSL_set_fd(ssl.get(), fd);
  X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl.get()), "127.0.0.1");
  if (SSL_connect(ssl.get()) != 1) {
    const std::string why = OpenSslErrorText();
    close(fd);
    return absl::UnavailableError("TLS handshake with 127.0.0.1:" + std::to_string(port) +
                                  " failed: " + why);
  }
  const std::string request = HttpRequestText("GET", path, options.headers);
  if (SSL_write(ssl.get(), request.data(), static_cast<int>(request.size())) <= 0) {
    const std::string why = OpenSslErrorText();
    close(fd);
    return absl::UnavailableError("TLS write failed: " + why);
  }
  std::string response;
  char buf[65536];
  int last_error = SSL_ERROR_NONE;
  std::string why;
  while (true) {
    const int n = SSL_read(ssl.get(), buf, sizeof(buf));
    if (n <= 0) {
      last_error = SSL_get_error(ssl.get(), n);
      if (last_error == SSL_ERROR_SSL) why = OpenSslErrorText();
      break;
    }
    response.append(buf, static_cast<size_t>(n));
  }
  SSL_shutdown(ssl.get());
  close(fd);
  if (response.empty() && last_error == SSL_ERROR_SSL) {
    return absl::UnavailableError("the server ended the TLS connection: " + why);
  }
  return ParseHttpResponse(response);
}

}  // namespace tandem::testing

#endif  // TANDEM_TESTS_HTTPS_CLIENT_H_
