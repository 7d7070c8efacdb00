#include "worker/transport/gloo_transport.h"

#include <gloo/rendezvous/hash_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <thread>
#include <vector>

#include "tests/worker/transport_test_util.h"

namespace tandem::worker {
namespace {

using std::chrono::milliseconds;

using testing::ConnectGlooPair;

TEST(GlooTransportTest, SendRecvBothWays) {
  gloo::rendezvous::HashStore store;
  auto [a, b] = ConnectGlooPair(store);
  ASSERT_TRUE(a && b);
  std::vector<float> x(1000), y(1000, 0.0f), g(10, 2.5f), h(10, 0.0f);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i);
  // Two messages with different tags, received in the other order.
  const uint64_t act = MakeTransferTag(Payload::kActivation, 0, 3);
  const uint64_t grad = MakeTransferTag(Payload::kGradient, 1, 3);
  ASSERT_TRUE(a->PostSend(1, act, x.data(), x.size() * sizeof(float)).ok());
  ASSERT_TRUE(a->PostSend(1, grad, g.data(), g.size() * sizeof(float)).ok());
  ASSERT_TRUE(b->Recv(0, grad, h.data(), h.size() * sizeof(float)).ok());
  ASSERT_TRUE(b->Recv(0, act, y.data(), y.size() * sizeof(float)).ok());
  ASSERT_TRUE(a->WaitSends().ok());
  EXPECT_EQ(x, y);
  EXPECT_EQ(g, h);
  // And back.
  ASSERT_TRUE(b->PostSend(0, act, y.data(), 400).ok());
  std::vector<float> z(100);
  ASSERT_TRUE(a->Recv(1, act, z.data(), 400).ok());
  ASSERT_TRUE(b->WaitSends().ok());
  EXPECT_EQ(z[99], 99.0f);
  EXPECT_EQ(a->bytes_sent(), 4040);
  EXPECT_EQ(a->bytes_received(), 400);
  EXPECT_EQ(b->bytes_received(), 4040);
}

// Receives posted ahead (the executor's prefetch) complete in any order, once each.
TEST(GlooTransportTest, PostedReceivesCompleteInAnyOrder) {
  gloo::rendezvous::HashStore store;
  auto [a, b] = ConnectGlooPair(store);
  ASSERT_TRUE(a && b);
  std::vector<float> x(256, 1.5f), y(256, 0.0f), g(8, -2.0f), h(8, 0.0f);
  const uint64_t act = MakeTransferTag(Payload::kActivation, 0, 1);
  const uint64_t grad = MakeTransferTag(Payload::kGradient, 2, 1);
  ASSERT_TRUE(b->PostRecv(0, act, y.data(), y.size() * sizeof(float)).ok());
  ASSERT_TRUE(b->PostRecv(0, grad, h.data(), h.size() * sizeof(float)).ok());
  EXPECT_TRUE(b->posted_recv(0, act));
  EXPECT_EQ(b->PostRecv(0, act, y.data(), 4).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(a->PostSend(1, grad, g.data(), g.size() * sizeof(float)).ok());
  ASSERT_TRUE(a->PostSend(1, act, x.data(), x.size() * sizeof(float)).ok());
  ASSERT_TRUE(b->WaitRecv(0, act).ok());
  ASSERT_TRUE(b->WaitRecv(0, grad).ok());
  ASSERT_TRUE(a->WaitSends().ok());
  EXPECT_EQ(x, y);
  EXPECT_EQ(g, h);
  EXPECT_FALSE(b->posted_recv(0, act));
  EXPECT_EQ(b->WaitRecv(0, act).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(b->bytes_received(), static_cast<int64_t>((256 + 8) * sizeof(float)));
  // Abort wakes a posted receive's waiter.
  ASSERT_TRUE(b->PostRecv(0, act, y.data(), 16).ok());
  auto pending = std::async(std::launch::async, [t = b.get(), act] { return t->WaitRecv(0, act); });
  std::this_thread::sleep_for(milliseconds(50));
  b->Abort();
  ASSERT_EQ(pending.wait_for(std::chrono::seconds(2)), std::future_status::ready);
  EXPECT_EQ(pending.get().code(), absl::StatusCode::kAborted);
}

TEST(GlooTransportTest, AbortUnblocksPendingRecv) {
  gloo::rendezvous::HashStore store;
  auto [a, b] = ConnectGlooPair(store);
  ASSERT_TRUE(a && b);
  std::vector<float> buf(16);
  auto start = std::chrono::steady_clock::now();
  auto pending = std::async(std::launch::async, [&, t = b.get()] {
    return t->Recv(0, MakeTransferTag(Payload::kActivation, 0, 0), buf.data(), 64);
  });
  std::this_thread::sleep_for(milliseconds(100));
  b->Abort();
  ASSERT_EQ(pending.wait_for(std::chrono::seconds(1)), std::future_status::ready);
  const absl::Status s = pending.get();
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted) << s;
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
  // Later calls fail fast too.
  EXPECT_EQ(b->Recv(0, 1, buf.data(), 64).code(), absl::StatusCode::kAborted);
  EXPECT_EQ(b->PostSend(0, 1, buf.data(), 64).code(), absl::StatusCode::kAborted);
  EXPECT_EQ(b->WaitSends().code(), absl::StatusCode::kAborted);
}

TEST(GlooTransportTest, RecvTimesOut) {
  gloo::rendezvous::HashStore store;
  auto [a, b] = ConnectGlooPair(store, milliseconds(200));
  ASSERT_TRUE(a && b);
  std::vector<float> buf(4);
  const absl::Status s = b->Recv(0, 1, buf.data(), 16);
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_NE(s.message().find("peer rank 0"), std::string::npos) << s;
}

TEST(GlooTransportTest, PeerFailureNamesThePeer) {
  gloo::rendezvous::HashStore store;
  auto [a, b] = ConnectGlooPair(store);
  ASSERT_TRUE(a && b);
  std::vector<float> buf(4);
  auto pending =
      std::async(std::launch::async, [&, t = b.get()] { return t->Recv(0, 1, buf.data(), 16); });
  std::this_thread::sleep_for(milliseconds(100));
  a.reset();  // rank 0 goes away: its sockets close
  ASSERT_EQ(pending.wait_for(std::chrono::seconds(5)), std::future_status::ready);
  const absl::Status s = pending.get();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_NE(s.message().find("peer rank 0"), std::string::npos) << s;
}

TEST(GlooTransportTest, RejectsBadPeersAndOptions) {
  gloo::rendezvous::HashStore store;
  auto [a, b] = ConnectGlooPair(store);
  ASSERT_TRUE(a && b);
  float x = 0;
  EXPECT_EQ(a->PostSend(0, 1, &x, 4).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(a->Recv(2, 1, &x, 4).code(), absl::StatusCode::kInvalidArgument);
  GlooTransportOptions o;
  o.rank = 2;
  o.size = 2;
  EXPECT_EQ(GlooTransport::Connect(o, store).status().code(), absl::StatusCode::kInvalidArgument);
  o.rank = 0;
  o.hostname = "";
  EXPECT_EQ(GlooTransport::Connect(o, store).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(GlooTransportTest, ConnectTimesOutWithoutPeer) {
  gloo::rendezvous::HashStore store;
  GlooTransportOptions o;
  o.rank = 0;
  o.size = 2;
  o.connect_timeout = milliseconds(300);
  auto t = GlooTransport::Connect(o, store);
  EXPECT_FALSE(t.ok());
  EXPECT_TRUE(t.status().code() == absl::StatusCode::kDeadlineExceeded ||
              t.status().code() == absl::StatusCode::kUnavailable)
      << t.status();
}

}  // namespace
}  // namespace tandem::worker
