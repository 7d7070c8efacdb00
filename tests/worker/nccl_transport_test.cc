// NcclTransport: option checks and rendezvous failures run everywhere (no GPU needed); transfers
// need one GPU per rank and skip with a message otherwise.
#include "worker/transport/nccl_transport.h"

#include <gloo/rendezvous/hash_store.h>
#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/backend/cuda/cuda_status.h"
#include "worker/backend/cuda/device.h"
#include "worker/backend/cuda/device_buffer.h"

namespace tandem::worker {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

NcclTransportOptions Options(int rank, int size, int device = 0) {
  NcclTransportOptions o;
  o.rank = rank;
  o.size = size;
  o.device = device;
  o.connect_timeout = milliseconds(20000);
  o.op_timeout = milliseconds(20000);
  return o;
}

// Skips unless `n` CUDA devices are visible.
#define SKIP_UNLESS_DEVICES(n)                                                            \
  do {                                                                                    \
    if (absl::Status s = cuda::CudaAvailable(); !s.ok()) {                                \
      GTEST_SKIP() << "no CUDA device: " << s;                                            \
    }                                                                                     \
    if (absl::StatusOr<int> c = cuda::CudaDeviceCount(); !c.ok() || *c < (n)) {           \
      GTEST_SKIP() << "needs " << (n) << " CUDA devices (NCCL wants one per rank), have " \
                   << (c.ok() ? *c : 0);                                                  \
    }                                                                                     \
  } while (false)

TEST(NcclTransportTest, BadOptionsAreInvalidArgument) {
  gloo::rendezvous::HashStore store;
  for (auto [rank, size] : {std::pair{-1, 2}, {2, 2}, {0, 0}}) {
    auto t = NcclTransport::Connect(Options(rank, size), store);
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument) << rank << "/" << size;
  }
  NcclTransportOptions o = Options(0, 1);
  o.device = -1;
  EXPECT_EQ(NcclTransport::Connect(o, store).status().code(), absl::StatusCode::kInvalidArgument);
  o = Options(0, 1);
  o.key_prefix.clear();
  EXPECT_EQ(NcclTransport::Connect(o, store).status().code(), absl::StatusCode::kInvalidArgument);
  o = Options(0, 1);
  o.connect_timeout = milliseconds(0);
  EXPECT_EQ(NcclTransport::Connect(o, store).status().code(), absl::StatusCode::kInvalidArgument);
}

// Peers must be other ranks of the job, each listed once.
TEST(NcclTransportTest, BadPeersAreInvalidArgument) {
  gloo::rendezvous::HashStore store;
  for (const std::vector<int>& peers : {std::vector<int>{2}, {0}, {-1}, {1, 1}}) {
    NcclTransportOptions o = Options(0, 2);
    o.peers = peers;
    const absl::Status s = NcclTransport::Connect(o, store).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_NE(s.message().find("peer rank"), std::string::npos) << s;
  }
}

// Without a device every rank fails at once with the runtime's error, and publishes it in place
// of each of its outgoing links' ids, so that a peer that has a device fails at once too
// instead of at its timeout (AnErrorPublishedByAPeerFailsFast shows that end on a GPU).
TEST(NcclTransportTest, NoDeviceFailsFastOnEveryRankAndPublishesTheError) {
  if (cuda::CudaAvailable().ok()) GTEST_SKIP() << "a CUDA device is present";
  gloo::rendezvous::HashStore store;
  const Clock::time_point start = Clock::now();
  auto peer = std::async(std::launch::async,
                         [&] { return NcclTransport::Connect(Options(1, 2), store).status(); });
  auto root = NcclTransport::Connect(Options(0, 2), store);
  EXPECT_EQ(root.status().code(), absl::StatusCode::kFailedPrecondition) << root.status();
  EXPECT_NE(root.status().message().find("cudaGetDeviceCount"), std::string::npos) << root.status();
  EXPECT_NE(root.status().message().find("rank 0 of 2"), std::string::npos) << root.status();
  const absl::Status p = peer.get();
  EXPECT_EQ(p.code(), absl::StatusCode::kFailedPrecondition) << p;
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(10));  // far below the 20 s timeout
  for (const char* key : {"nccl/0-1/unique_id", "nccl/1-0/unique_id"}) {
    const std::vector<char> value = store.get(key);
    EXPECT_TRUE(absl::StartsWith(std::string(value.begin(), value.end()), "error:")) << key;
  }

  gloo::rendezvous::HashStore single;
  auto one = NcclTransport::Connect(Options(0, 1), single);
  EXPECT_EQ(one.status().code(), absl::StatusCode::kFailedPrecondition) << one.status();
}

// ---- With devices.

TEST(NcclTransportTest, SingleRankConnectsRejectsSelfAndAborts) {
  SKIP_UNLESS_DEVICES(1);
  gloo::rendezvous::HashStore store;
  auto t = NcclTransport::Connect(Options(0, 1), store);
  ASSERT_TRUE(t.ok()) << t.status();
  int x = 0;
  EXPECT_EQ((*t)->PostSend(0, 1, &x, sizeof x).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE((*t)->WaitSends().ok());
  (*t)->Abort();
  EXPECT_TRUE((*t)->aborted());
  EXPECT_EQ((*t)->WaitSends().code(), absl::StatusCode::kAborted);
  EXPECT_EQ((*t)->PostSend(1, 1, &x, sizeof x).code(), absl::StatusCode::kInvalidArgument);
}

// Rank 0 of 2 on a device whose peer never joins: it gives up at the connect timeout, naming
// the link it waited for, instead of hanging.
TEST(NcclTransportTest, MissingPeerTimesOutAndAborts) {
  SKIP_UNLESS_DEVICES(1);
  gloo::rendezvous::HashStore store;
  NcclTransportOptions o = Options(0, 2);
  o.connect_timeout = milliseconds(2000);
  const Clock::time_point start = Clock::now();
  auto t = NcclTransport::Connect(o, store);
  EXPECT_EQ(t.status().code(), absl::StatusCode::kDeadlineExceeded) << t.status();
  EXPECT_NE(t.status().message().find("nccl/1-0/unique_id"), std::string::npos) << t.status();
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(30));
}

// A peer without its device publishes its error; a rank that has one fails at once with it
// (one GPU is enough: the peer asks for a device that is not there).
TEST(NcclTransportTest, AnErrorPublishedByAPeerFailsFast) {
  SKIP_UNLESS_DEVICES(1);
  gloo::rendezvous::HashStore store;
  const Clock::time_point start = Clock::now();
  auto missing = std::async(std::launch::async, [&] {
    return NcclTransport::Connect(Options(1, 2, /*device=*/64), store).status();
  });
  auto root = NcclTransport::Connect(Options(0, 2, 0), store);
  const absl::Status m = missing.get();
  EXPECT_EQ(m.code(), absl::StatusCode::kFailedPrecondition) << m;
  EXPECT_NE(m.message().find("CUDA device 64 requested"), std::string::npos) << m;
  EXPECT_EQ(root.status().code(), absl::StatusCode::kUnavailable) << root.status();
  EXPECT_NE(root.status().message().find("peer rank 1 could not create the NCCL id"),
            std::string::npos)
      << root.status();
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(10));  // far below the 20 s timeout
}

std::pair<std::unique_ptr<NcclTransport>, std::unique_ptr<NcclTransport>> ConnectPair(
    gloo::rendezvous::Store& store) {
  auto f1 = std::async(std::launch::async,
                       [&] { return NcclTransport::Connect(Options(1, 2, 1), store); });
  auto t0 = NcclTransport::Connect(Options(0, 2, 0), store);
  auto t1 = f1.get();
  EXPECT_TRUE(t0.ok()) << t0.status();
  EXPECT_TRUE(t1.ok()) << t1.status();
  if (!t0.ok() || !t1.ok()) return {};
  return {*std::move(t0), *std::move(t1)};
}

// Device buffers on `device` (the current device is per thread).
cuda::DeviceBuffer<float> OnDevice(int device, const std::vector<float>& host) {
  EXPECT_EQ(cudaSetDevice(device), cudaSuccess);
  auto b = cuda::DeviceBuffer<float>::FromHost(host.data(), host.size());
  EXPECT_TRUE(b.ok()) << b.status();
  return b.ok() ? *std::move(b) : cuda::DeviceBuffer<float>();
}

std::vector<float> ToHost(int device, const cuda::DeviceBuffer<float>& b) {
  EXPECT_EQ(cudaSetDevice(device), cudaSuccess);
  std::vector<float> h(b.size());
  EXPECT_TRUE(b.CopyToHost(h.data(), h.size()).ok());
  return h;
}

TEST(NcclTransportTest, BatchedSendRecvBothWays) {
  SKIP_UNLESS_DEVICES(2);
  gloo::rendezvous::HashStore store;
  // References, not a structured binding: lambdas capture them (clang 14 cannot capture one).
  auto pair = ConnectPair(store);
  auto& a = pair.first;
  auto& b = pair.second;
  ASSERT_TRUE(a && b);
  const size_t n = 1 << 20;
  auto a_out = OnDevice(0, std::vector<float>(n, 1.5f)), a_in = OnDevice(0, std::vector<float>(n));
  auto b_out = OnDevice(1, std::vector<float>(n, -2.0f)), b_in = OnDevice(1, std::vector<float>(n));
  const uint64_t ab = MakeTransferTag(Payload::kActivation, 0, 3);
  const uint64_t ba = MakeTransferTag(Payload::kGradient, 1, 3);
  // Each rank posts its send and its receive in one batch (two links: neither waits).
  auto run = [](NcclTransport* t, int device, int peer, void* out, uint64_t out_tag, void* in,
                uint64_t in_tag, size_t bytes) {
    EXPECT_EQ(cudaSetDevice(device), cudaSuccess);
    NcclTransport::Op ops[2];
    ops[0] = {NcclTransport::Op::Kind::kSend, peer, out_tag, out, bytes};
    ops[1] = {NcclTransport::Op::Kind::kRecv, peer, in_tag, in, bytes};
    RETURN_IF_ERROR(t->PostBatch(ops));
    RETURN_IF_ERROR(t->WaitRecv(peer, in_tag));
    return t->WaitSends();
  };
  auto fb = std::async(std::launch::async, run, b.get(), 1, 0, b_out.data(), ba, b_in.data(), ab,
                       n * sizeof(float));
  EXPECT_TRUE(run(a.get(), 0, 1, a_out.data(), ab, a_in.data(), ba, n * sizeof(float)).ok());
  EXPECT_TRUE(fb.get().ok());
  EXPECT_EQ(ToHost(0, a_in), std::vector<float>(n, -2.0f));
  EXPECT_EQ(ToHost(1, b_in), std::vector<float>(n, 1.5f));
  EXPECT_EQ(a->bytes_sent(), static_cast<int64_t>(n * sizeof(float)));
  EXPECT_EQ(a->bytes_received(), static_cast<int64_t>(n * sizeof(float)));
}

// 1F1B's crossing transfers, posted one by one: each rank sends to the other before it posts
// its receive. On one communicator and stream the two sends would each wait for the other's
// receive; on two links they both go.
TEST(NcclTransportTest, CrossingSendsPostedBeforeTheReceivesComplete) {
  SKIP_UNLESS_DEVICES(2);
  gloo::rendezvous::HashStore store;
  // References, not a structured binding: lambdas capture them (clang 14 cannot capture one).
  auto pair = ConnectPair(store);
  auto& a = pair.first;
  auto& b = pair.second;
  ASSERT_TRUE(a && b);
  const size_t n = 1 << 22;  // 16 MiB: well above NCCL's eager sizes
  auto a_out = OnDevice(0, std::vector<float>(n, 3.0f)), a_in = OnDevice(0, std::vector<float>(n));
  auto b_out = OnDevice(1, std::vector<float>(n, 4.0f)), b_in = OnDevice(1, std::vector<float>(n));
  const uint64_t ab = MakeTransferTag(Payload::kActivation, 0, 0);
  const uint64_t ba = MakeTransferTag(Payload::kGradient, 1, 0);
  auto run = [](NcclTransport* t, int device, int peer, void* out, uint64_t out_tag, void* in,
                uint64_t in_tag, size_t bytes) {
    EXPECT_EQ(cudaSetDevice(device), cudaSuccess);
    RETURN_IF_ERROR(t->PostSend(peer, out_tag, out, bytes));
    RETURN_IF_ERROR(t->PostRecv(peer, in_tag, in, bytes));
    RETURN_IF_ERROR(t->WaitRecv(peer, in_tag));
    return t->WaitSends();
  };
  auto fb = std::async(std::launch::async, run, b.get(), 1, 0, b_out.data(), ba, b_in.data(), ab,
                       n * sizeof(float));
  const absl::Status sa = run(a.get(), 0, 1, a_out.data(), ab, a_in.data(), ba, n * sizeof(float));
  EXPECT_TRUE(sa.ok()) << sa;
  const absl::Status sb = fb.get();
  EXPECT_TRUE(sb.ok()) << sb;
  EXPECT_EQ(ToHost(0, a_in), std::vector<float>(n, 4.0f));
  EXPECT_EQ(ToHost(1, b_in), std::vector<float>(n, 3.0f));
}

// A transfer is launched when it is posted: a receive posted before the receiver goes off to
// compute (here: waits, calling nothing of the transport) fills meanwhile, so that the sender's
// WaitSends returns while the receiver is still away. Were posting deferred to the receiver's
// next wait, the sender would wait for the receiver's return.
TEST(NcclTransportTest, APostedReceiveFillsWhileTheReceiverComputes) {
  SKIP_UNLESS_DEVICES(2);
  gloo::rendezvous::HashStore store;
  // References, not a structured binding: lambdas capture them (clang 14 cannot capture one).
  auto pair = ConnectPair(store);
  auto& a = pair.first;
  auto& b = pair.second;
  ASSERT_TRUE(a && b);
  const size_t n = 1 << 20;
  auto out = OnDevice(0, std::vector<float>(n, 5.0f));
  auto in = OnDevice(1, std::vector<float>(n));
  const uint64_t tag = MakeTransferTag(Payload::kActivation, 0, 1);
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  ASSERT_TRUE(b->PostRecv(0, tag, in.data(), n * sizeof(float)).ok());
  std::promise<absl::Status> sent;
  std::thread sender([&] {
    EXPECT_EQ(cudaSetDevice(0), cudaSuccess);
    absl::Status s = a->PostSend(1, tag, out.data(), n * sizeof(float));
    if (s.ok()) s = a->WaitSends();
    sent.set_value(s);
  });
  std::future<absl::Status> done = sent.get_future();
  const bool in_time = done.wait_for(std::chrono::seconds(10)) == std::future_status::ready;
  EXPECT_TRUE(in_time) << "the send did not complete while the receiver was away";
  EXPECT_TRUE(b->WaitRecv(0, tag).ok());
  sender.join();
  if (in_time) {
    EXPECT_TRUE(done.get().ok());
  }
  EXPECT_EQ(ToHost(1, in), std::vector<float>(n, 5.0f));
}

// A peer outside the options' peers has no link: posting to it is INVALID_ARGUMENT naming the
// peers there are.
TEST(NcclTransportTest, OnlyTheListedPeersHaveLinks) {
  SKIP_UNLESS_DEVICES(2);
  gloo::rendezvous::HashStore store;
  auto f1 = std::async(std::launch::async, [&] {
    NcclTransportOptions o = Options(1, 3, 1);
    o.peers = {0};
    return NcclTransport::Connect(o, store);
  });
  NcclTransportOptions o = Options(0, 3, 0);
  o.peers = {1};
  auto t0 = NcclTransport::Connect(o, store);  // rank 2 never joins: not a peer of either
  auto t1 = f1.get();
  ASSERT_TRUE(t0.ok()) << t0.status();
  ASSERT_TRUE(t1.ok()) << t1.status();
  EXPECT_EQ((*t0)->peers(), std::vector<int>{1});
  int x = 0;
  const absl::Status s = (*t0)->PostSend(2, 1, &x, sizeof x);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("not one of this rank's NCCL peers"), std::string::npos) << s;
}

// The sender's order differs from the receiver's: the header check names both tags.
TEST(NcclTransportTest, TagOrderMismatchIsInternal) {
  SKIP_UNLESS_DEVICES(2);
  gloo::rendezvous::HashStore store;
  // References, not a structured binding: lambdas capture them (clang 14 cannot capture one).
  auto pair = ConnectPair(store);
  auto& a = pair.first;
  auto& b = pair.second;
  ASSERT_TRUE(a && b);
  auto x = OnDevice(0, {1.0f}), y = OnDevice(0, {2.0f});
  auto rx = OnDevice(1, {0.0f}), ry = OnDevice(1, {0.0f});
  const uint64_t tx = MakeTransferTag(Payload::kActivation, 0, 0);
  const uint64_t ty = MakeTransferTag(Payload::kActivation, 0, 1);
  auto sender = std::async(std::launch::async, [&] {
    EXPECT_EQ(cudaSetDevice(0), cudaSuccess);
    EXPECT_TRUE(a->PostSend(1, ty, y.data(), sizeof(float)).ok());  // y first
    EXPECT_TRUE(a->PostSend(1, tx, x.data(), sizeof(float)).ok());
    return a->WaitSends();
  });
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  ASSERT_TRUE(b->PostRecv(0, tx, rx.data(), sizeof(float)).ok());  // x expected first
  ASSERT_TRUE(b->PostRecv(0, ty, ry.data(), sizeof(float)).ok());
  const absl::Status s = b->WaitRecv(0, tx);
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
  EXPECT_NE(s.message().find(absl::StrCat("expected tag 0x", absl::Hex(tx))), std::string::npos)
      << s;
  EXPECT_NE(s.message().find(absl::StrCat("sent tag 0x", absl::Hex(ty))), std::string::npos) << s;
  EXPECT_TRUE(sender.get().ok());
}

TEST(NcclTransportTest, AbortUnblocksPendingRecv) {
  SKIP_UNLESS_DEVICES(2);
  gloo::rendezvous::HashStore store;
  // References, not a structured binding: lambdas capture them (clang 14 cannot capture one).
  auto pair = ConnectPair(store);
  auto& a = pair.first;
  auto& b = pair.second;
  ASSERT_TRUE(a && b);
  auto buf = OnDevice(1, std::vector<float>(16));
  ASSERT_TRUE(b->PostRecv(0, 7, buf.data(), 16 * sizeof(float)).ok());  // rank 0 never sends
  std::thread aborter([&] {
    std::this_thread::sleep_for(milliseconds(200));
    b->Abort();
  });
  const Clock::time_point start = Clock::now();
  const absl::Status s = b->WaitRecv(0, 7);
  aborter.join();
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted) << s;
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(10));
  EXPECT_EQ(b->PostSend(0, 8, buf.data(), 4).code(), absl::StatusCode::kAborted);
  a->Abort();
}

}  // namespace
}  // namespace tandem::worker
