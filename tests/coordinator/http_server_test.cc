// The HTTP adapter over a real socket on 127.0.0.1: requests reach the handler as they were
// sent, responses come back with their status, type and headers, bodies are bounded.
#include "coordinator/http_server.h"

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/http_client.h"

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

}  // namespace
}  // namespace tandem::coordinator
