// A minimal HTTP/1.1 client for tests: one request per connection over a plain socket to
// 127.0.0.1, so that the tests of the coordinator's HTTP port do not go through the library
// that serves it.
#ifndef TANDEM_TESTS_HTTP_CLIENT_H_
#define TANDEM_TESTS_HTTP_CLIENT_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace tandem::testing {

struct HttpResult {
  int status = 0;
  std::map<std::string, std::string> headers;  // names lower-cased
  std::string body;
};

// The text of a request for `method path` that asks the server to close the connection, with
// `headers` ("Name: value" each) and `body`, if any.
inline std::string HttpRequestText(const std::string& method, const std::string& path,
                                   const std::vector<std::string>& headers = {},
                                   const std::string& body = "") {
  std::string request =
      absl::StrCat(method, " ", path, " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n");
  for (const std::string& h : headers) absl::StrAppend(&request, h, "\r\n");
  if (!body.empty()) absl::StrAppend(&request, "Content-Length: ", body.size(), "\r\n");
  absl::StrAppend(&request, "\r\n", body);
  return request;
}

// A whole response, as read until the server closed: DATA_LOSS when it is not HTTP.
inline absl::StatusOr<HttpResult> ParseHttpResponse(const std::string& response) {
  const size_t head_end = response.find("\r\n\r\n");
  if (head_end == std::string::npos) {
    return absl::DataLossError(absl::StrCat("not an HTTP response: '", response, "'"));
  }
  HttpResult out;
  std::vector<std::string> lines =
      absl::StrSplit(response.substr(0, head_end), "\r\n", absl::SkipEmpty());
  std::vector<std::string> status_line = absl::StrSplit(lines[0], ' ');
  if (status_line.size() < 2 || !absl::SimpleAtoi(status_line[1], &out.status)) {
    return absl::DataLossError(absl::StrCat("bad status line '", lines[0], "'"));
  }
  for (size_t i = 1; i < lines.size(); ++i) {
    const size_t colon = lines[i].find(':');
    if (colon == std::string::npos) continue;
    out.headers[absl::AsciiStrToLower(lines[i].substr(0, colon))] =
        std::string(absl::StripAsciiWhitespace(lines[i].substr(colon + 1)));
  }
  out.body = response.substr(head_end + 4);
  if (auto te = out.headers.find("transfer-encoding");
      te != out.headers.end() && te->second == "chunked") {
    // De-chunk.
    std::string body_out;
    size_t pos = 0;
    while (pos < out.body.size()) {
      const size_t eol = out.body.find("\r\n", pos);
      if (eol == std::string::npos) break;
      size_t size = 0;
      if (!absl::SimpleHexAtoi(out.body.substr(pos, eol - pos), &size) || size == 0) break;
      body_out += out.body.substr(eol + 2, size);
      pos = eol + 2 + size + 2;
    }
    out.body = body_out;
  }
  return out;
}

// Connects to 127.0.0.1:port with 10 s send and receive timeouts: the socket, or UNAVAILABLE.
inline absl::StatusOr<int> ConnectLoopback(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return absl::UnavailableError("socket() failed");
  timeval timeout{10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof(timeout));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return absl::UnavailableError(absl::StrCat("cannot connect to 127.0.0.1:", port));
  }
  return fd;
}

// Sends `method path` (with `body`, if any) to 127.0.0.1:port and reads the whole response
// (the request asks the server to close the connection). UNAVAILABLE when it cannot connect,
// DATA_LOSS for a response that is not HTTP.
inline absl::StatusOr<HttpResult> HttpRequest(int port, const std::string& method,
                                              const std::string& path,
                                              const std::string& body = "") {
  absl::StatusOr<int> connected = ConnectLoopback(port);
  if (!connected.ok()) return connected.status();
  const int fd = *connected;
  const std::string request = HttpRequestText(method, path, {}, body);
  for (size_t sent = 0; sent < request.size();) {
    const ssize_t n = send(fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) break;  // the server may answer (413) before reading everything
    sent += static_cast<size_t>(n);
  }
  std::string response;
  char buf[65536];
  while (true) {
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    response.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  return ParseHttpResponse(response);
}

inline absl::StatusOr<HttpResult> HttpGet(int port, const std::string& path) {
  return HttpRequest(port, "GET", path);
}

}  // namespace tandem::testing

#endif  // TANDEM_TESTS_HTTP_CLIENT_H_
