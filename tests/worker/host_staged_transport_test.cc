// HostStagedTransport over a real GlooTransport pair on 127.0.0.1, with a fake device: its
// "device memory" is host memory that holds every byte XOR kDeviceKey, and only the fake copier
// translates. So a device pointer handed to Gloo directly, or a copy skipped, delivers scrambled
// bytes; and a spy between the staged transport and Gloo fails the test outright when Gloo is
// given a pointer into device memory.
#include "worker/transport/host_staged_transport.h"

#include <gloo/rendezvous/hash_store.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "tests/worker/transport_test_util.h"
#include "worker/transport/gloo_transport.h"

namespace tandem::worker {
namespace {

using std::chrono::milliseconds;

constexpr uint8_t kDeviceKey = 0xA5;

// The fake device's memory: regions that store each byte XOR kDeviceKey. Thread-safe (both
// ranks of a test share one).
class FakeDevice {
 public:
  // A zeroed region of `bytes` bytes (never null).
  void* Allocate(size_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    regions_.push_back(
        std::make_unique<std::vector<uint8_t>>(std::max<size_t>(bytes, 1), kDeviceKey));
    return regions_.back()->data();
  }
  // Whether [p, p + bytes) overlaps device memory.
  bool Overlaps(const void* p, size_t bytes) const {
    std::lock_guard<std::mutex> lock(mu_);
    const auto* b = static_cast<const uint8_t*>(p);
    for (const auto& r : regions_) {
      if (b < r->data() + r->size() && b + std::max<size_t>(bytes, 1) > r->data()) return true;
    }
    return false;
  }
  // Whether [p, p + bytes) lies inside one region.
  bool Contains(const void* p, size_t bytes) const {
    std::lock_guard<std::mutex> lock(mu_);
    const auto* b = static_cast<const uint8_t*>(p);
    for (const auto& r : regions_) {
      if (b >= r->data() && b + bytes <= r->data() + r->size()) return true;
    }
    return false;
  }

  // Device memory holding `values` (as the compute would have written them).
  template <typename T>
  void* Upload(const std::vector<T>& values) {
    const size_t bytes = values.size() * sizeof(T);
    void* device = Allocate(bytes);
    Encode(device, values.data(), bytes);
    return device;
  }
  template <typename T>
  std::vector<T> Download(const void* device, size_t count) const {
    std::vector<T> values(count);
    Encode(values.data(), device, count * sizeof(T));
    return values;
  }
  // dst[i] = src[i] ^ kDeviceKey: the translation both ways.
  static void Encode(void* dst, const void* src, size_t bytes) {
    const auto* s = static_cast<const uint8_t*>(src);
    auto* d = static_cast<uint8_t*>(dst);
    for (size_t i = 0; i < bytes; ++i) d[i] = s[i] ^ kDeviceKey;
  }

 private:
  mutable std::mutex mu_;
  std::vector<std::unique_ptr<std::vector<uint8_t>>> regions_;
};

class VectorHostBuffer final : public HostBuffer {
 public:
  explicit VectorHostBuffer(size_t bytes) : data_(std::max<size_t>(bytes, 1)), bytes_(bytes) {}
  void* data() override { return data_.data(); }
  size_t bytes() const override { return bytes_; }

 private:
  std::vector<uint8_t> data_;
  size_t bytes_;
};

// Counts of what a FakeCopier did, readable after the transport (which owns the copier) is gone.
struct CopierLog {
  std::atomic<int> to_host{0};
  std::atomic<int> to_device{0};
  std::atomic<int> allocations{0};
  std::atomic<bool> fail_to_host{false};
  std::atomic<bool> fail_to_device{false};
  std::atomic<bool> fail_allocation{false};
};

class FakeCopier final : public DeviceCopier {
 public:
  FakeCopier(FakeDevice& device, CopierLog& log) : device_(device), log_(log) {}

  absl::StatusOr<std::unique_ptr<HostBuffer>> AllocateHost(size_t bytes) override {
    if (log_.fail_allocation.load()) return absl::ResourceExhaustedError("fake: out of pinned");
    ++log_.allocations;
    return std::make_unique<VectorHostBuffer>(bytes);
  }
  absl::Status CopyToHost(void* dst, const void* src, size_t bytes) override {
    EXPECT_TRUE(device_.Contains(src, bytes)) << "CopyToHost from non-device memory";
    EXPECT_FALSE(device_.Overlaps(dst, bytes)) << "CopyToHost into device memory";
    if (log_.fail_to_host.load()) return absl::InternalError("fake: cudaMemcpyAsync failed");
    ++log_.to_host;
    FakeDevice::Encode(dst, src, bytes);
    return absl::OkStatus();
  }
  absl::Status CopyToDevice(void* dst, const void* src, size_t bytes) override {
    EXPECT_TRUE(device_.Contains(dst, bytes)) << "CopyToDevice into non-device memory";
    EXPECT_FALSE(device_.Overlaps(src, bytes)) << "CopyToDevice from device memory";
    if (log_.fail_to_device.load()) return absl::InternalError("fake: cudaMemcpyAsync failed");
    ++log_.to_device;
    FakeDevice::Encode(dst, src, bytes);
    return absl::OkStatus();
  }

 private:
  FakeDevice& device_;
  CopierLog& log_;
};

// Between the staged transport and Gloo: fails the test when a device pointer gets through.
class HostOnlySpy final : public testing::ForwardingTransport {
 public:
  HostOnlySpy(std::unique_ptr<Transport> inner, const FakeDevice& device)
      : ForwardingTransport(std::move(inner)), device_(device) {}
  absl::Status PostSend(int peer, uint64_t tag, const void* data, size_t bytes) override {
    EXPECT_NE(data, nullptr);
    EXPECT_FALSE(device_.Overlaps(data, bytes)) << "device pointer handed to the host transport";
    return ForwardingTransport::PostSend(peer, tag, data, bytes);
  }
  absl::Status Recv(int peer, uint64_t tag, void* data, size_t bytes) override {
    ADD_FAILURE() << "the staged transport posts its receives";
    return ForwardingTransport::Recv(peer, tag, data, bytes);
  }
  absl::Status PostRecv(int peer, uint64_t tag, void* data, size_t bytes) override {
    EXPECT_NE(data, nullptr);
    EXPECT_FALSE(device_.Overlaps(data, bytes)) << "device pointer handed to the host transport";
    return ForwardingTransport::PostRecv(peer, tag, data, bytes);
  }

 private:
  const FakeDevice& device_;
};

class HostStagedTransportTest : public ::testing::Test {
 protected:
  // Ranks 0 and 1, each a staged transport over Gloo with its own copier log.
  void Connect(milliseconds op_timeout = milliseconds(10000),
               HostStagedTransportOptions options = {}) {
    auto [g0, g1] = testing::ConnectGlooPair(store_, op_timeout);
    ASSERT_TRUE(g0 && g1);
    a_ = Staged(std::move(g0), log_[0], options);
    b_ = Staged(std::move(g1), log_[1], options);
  }

  std::unique_ptr<HostStagedTransport> Staged(std::unique_ptr<GlooTransport> gloo, CopierLog& log,
                                              const HostStagedTransportOptions& options) {
    return std::make_unique<HostStagedTransport>(
        std::make_unique<HostOnlySpy>(std::move(gloo), device_),
        std::make_unique<FakeCopier>(device_, log), options);
  }

  static std::vector<float> Iota(size_t n, float start) {
    std::vector<float> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = start + static_cast<float>(i);
    return v;
  }

  gloo::rendezvous::HashStore store_;
  FakeDevice device_;
  CopierLog log_[2];
  std::unique_ptr<HostStagedTransport> a_, b_;
};

// Several tags from rank 0 to rank 1, received in posting order; the data arrives on the
// receiver's device unscrambled, and the sender's device buffers may be reused at once.
TEST_F(HostStagedTransportTest, SendsSeveralTagsInOrder) {
  ASSERT_NO_FATAL_FAILURE(Connect());
  constexpr int kMessages = 5;
  std::vector<void*> sent, received;
  size_t total = 0;
  for (int mb = 0; mb < kMessages; ++mb) {
    const std::vector<float> x = Iota(100 + 37 * mb, 1000.0f * mb);
    sent.push_back(device_.Upload(x));
    received.push_back(device_.Allocate(x.size() * sizeof(float)));
    total += x.size() * sizeof(float);
  }
  for (int mb = 0; mb < kMessages; ++mb) {
    const size_t bytes = (100 + 37 * mb) * sizeof(float);
    ASSERT_TRUE(
        a_->PostSend(1, MakeTransferTag(Payload::kActivation, 0, mb), sent[mb], bytes).ok());
    // The data was staged when PostSend returned: scribbling over the device buffer now does not
    // change what is sent.
    std::memset(sent[mb], 0, bytes);
  }
  for (int mb = 0; mb < kMessages; ++mb) {
    const size_t count = 100 + 37 * mb;
    const absl::Status s = b_->Recv(0, MakeTransferTag(Payload::kActivation, 0, mb), received[mb],
                                    count * sizeof(float));
    ASSERT_TRUE(s.ok()) << s;
    EXPECT_EQ(device_.Download<float>(received[mb], count), Iota(count, 1000.0f * mb)) << mb;
  }
  ASSERT_TRUE(a_->WaitSends().ok());
  EXPECT_EQ(log_[0].to_host.load(), kMessages);
  EXPECT_EQ(log_[0].to_device.load(), 0);
  EXPECT_EQ(log_[1].to_device.load(), kMessages);
  EXPECT_EQ(log_[1].to_host.load(), 0);
  // The counters are the payload bytes, as the inner transport counts them.
  EXPECT_EQ(a_->bytes_sent(), static_cast<int64_t>(total));
  EXPECT_EQ(b_->bytes_received(), static_cast<int64_t>(total));
  EXPECT_EQ(a_->bytes_received(), 0);
  EXPECT_EQ(b_->bytes_sent(), 0);
  EXPECT_EQ(a_->rank(), 0);
  EXPECT_EQ(b_->size(), 2);
}

// Receives posted ahead complete in any order; their data reaches the device at WaitRecv.
TEST_F(HostStagedTransportTest, PostedReceivesCopyAtWait) {
  ASSERT_NO_FATAL_FAILURE(Connect());
  const std::vector<float> x = Iota(256, 1.5f), g = Iota(8, -20.0f);
  void* y = device_.Allocate(x.size() * sizeof(float));
  void* h = device_.Allocate(g.size() * sizeof(float));
  const uint64_t act = MakeTransferTag(Payload::kActivation, 0, 1);
  const uint64_t grad = MakeTransferTag(Payload::kGradient, 2, 1);
  ASSERT_TRUE(b_->PostRecv(0, act, y, x.size() * sizeof(float)).ok());
  ASSERT_TRUE(b_->PostRecv(0, grad, h, g.size() * sizeof(float)).ok());
  EXPECT_TRUE(b_->posted_recv(0, act));
  EXPECT_EQ(b_->PostRecv(0, act, y, 4).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(a_->PostSend(1, grad, device_.Upload(g), g.size() * sizeof(float)).ok());
  ASSERT_TRUE(a_->PostSend(1, act, device_.Upload(x), x.size() * sizeof(float)).ok());
  ASSERT_TRUE(b_->WaitRecv(0, act).ok());
  EXPECT_EQ(log_[1].to_device.load(), 1);
  ASSERT_TRUE(b_->WaitRecv(0, grad).ok());
  ASSERT_TRUE(a_->WaitSends().ok());
  EXPECT_EQ(device_.Download<float>(y, x.size()), x);
  EXPECT_EQ(device_.Download<float>(h, g.size()), g);
  EXPECT_FALSE(b_->posted_recv(0, act));
  EXPECT_EQ(b_->WaitRecv(0, act).code(), absl::StatusCode::kFailedPrecondition);
}

// Both ranks exchange with SendRecv at the same time (the tied-gradient exchange).
TEST_F(HostStagedTransportTest, SendRecvBothDirectionsAtOnce) {
  ASSERT_NO_FATAL_FAILURE(Connect());
  constexpr size_t kCount = 50000;
  const std::vector<float> x0 = Iota(kCount, 0.0f), x1 = Iota(kCount, -7.0f);
  void* send0 = device_.Upload(x0);
  void* send1 = device_.Upload(x1);
  void* recv0 = device_.Allocate(kCount * sizeof(float));
  void* recv1 = device_.Allocate(kCount * sizeof(float));
  const uint64_t tag = MakeTransferTag(Payload::kTiedGradient, 0, 0);
  for (int round = 0; round < 3; ++round) {
    auto f1 = std::async(std::launch::async, [&] {
      return b_->SendRecv(0, tag, send1, recv1, kCount * sizeof(float));
    });
    const absl::Status s0 = a_->SendRecv(1, tag, send0, recv0, kCount * sizeof(float));
    const absl::Status s1 = f1.get();
    ASSERT_TRUE(s0.ok()) << s0;
    ASSERT_TRUE(s1.ok()) << s1;
    ASSERT_TRUE(a_->WaitSends().ok());
    ASSERT_TRUE(b_->WaitSends().ok());
    EXPECT_EQ(device_.Download<float>(recv0, kCount), x1);
    EXPECT_EQ(device_.Download<float>(recv1, kCount), x0);
  }
  EXPECT_EQ(a_->bytes_sent(), static_cast<int64_t>(3 * kCount * sizeof(float)));
  EXPECT_EQ(a_->bytes_received(), static_cast<int64_t>(3 * kCount * sizeof(float)));
  EXPECT_EQ(b_->bytes_received(), a_->bytes_sent());
  // The staging buffers came back to the pool: later rounds allocated none.
  EXPECT_EQ(a_->staging_allocations(), 2);
  EXPECT_EQ(log_[0].allocations.load(), 2);
}

// A steady stream of same-sized messages reuses its staging buffers.
TEST_F(HostStagedTransportTest, StagingBuffersArePooled) {
  ASSERT_NO_FATAL_FAILURE(Connect());
  const std::vector<float> x = Iota(1000, 3.0f);
  void* src = device_.Upload(x);
  void* dst = device_.Allocate(x.size() * sizeof(float));
  for (int mb = 0; mb < 20; ++mb) {
    const uint64_t tag = MakeTransferTag(Payload::kActivation, 0, mb);
    ASSERT_TRUE(a_->PostSend(1, tag, src, x.size() * sizeof(float)).ok());
    ASSERT_TRUE(b_->Recv(0, tag, dst, x.size() * sizeof(float)).ok());
    ASSERT_TRUE(a_->WaitSends().ok());
    EXPECT_EQ(device_.Download<float>(dst, x.size()), x);
  }
  EXPECT_EQ(log_[0].allocations.load(), 1);
  EXPECT_EQ(log_[1].allocations.load(), 1);
}

// A pool limited to one buffer's size keeps one; the rest are freed and allocated again.
TEST_F(HostStagedTransportTest, PoolKeepsAtMostMaxPooledBytes) {
  HostStagedTransportOptions options;
  options.max_pooled_bytes = 4000;
  ASSERT_NO_FATAL_FAILURE(Connect(milliseconds(10000), options));
  const std::vector<float> x = Iota(1000, 3.0f);
  void* src = device_.Upload(x);
  for (int round = 0; round < 3; ++round) {
    // Two sends in flight at once need two buffers; only one goes back to the pool.
    ASSERT_TRUE(a_->PostSend(1, 2 * round, src, 4000).ok());
    ASSERT_TRUE(a_->PostSend(1, 2 * round + 1, src, 4000).ok());
    for (int i = 0; i < 2; ++i) {
      void* dst = device_.Allocate(4000);
      ASSERT_TRUE(b_->Recv(0, 2 * round + i, dst, 4000).ok());
      EXPECT_EQ(device_.Download<float>(dst, 1000), x);
    }
    ASSERT_TRUE(a_->WaitSends().ok());
  }
  EXPECT_EQ(a_->staging_allocations(), 4);  // 2, then 1 more in each later round
}

TEST_F(HostStagedTransportTest, ZeroByteMessages) {
  ASSERT_NO_FATAL_FAILURE(Connect());
  const uint64_t tag = MakeTransferTag(Payload::kLinkProbe, 0, 0);
  ASSERT_TRUE(a_->PostSend(1, tag, nullptr, 0).ok());
  const absl::Status s = b_->Recv(0, tag, nullptr, 0);
  ASSERT_TRUE(s.ok()) << s;
  ASSERT_TRUE(a_->WaitSends().ok());
  // And one with data after it still lines up.
  const std::vector<float> x = Iota(4, 9.0f);
  void* dst = device_.Allocate(16);
  ASSERT_TRUE(a_->PostSend(1, tag + 1, device_.Upload(x), 16).ok());
  ASSERT_TRUE(b_->Recv(0, tag + 1, dst, 16).ok());
  ASSERT_TRUE(a_->WaitSends().ok());
  EXPECT_EQ(device_.Download<float>(dst, 4), x);
  EXPECT_EQ(log_[0].to_host.load(), 1);  // nothing to copy for the empty message
  EXPECT_EQ(log_[1].to_device.load(), 1);
  EXPECT_EQ(b_->bytes_received(), 16);
}

TEST_F(HostStagedTransportTest, AbortUnblocksPendingRecv) {
  ASSERT_NO_FATAL_FAILURE(Connect());
  void* dst = device_.Allocate(64);
  const uint64_t tag = MakeTransferTag(Payload::kActivation, 0, 0);
  const auto start = std::chrono::steady_clock::now();
  auto pending = std::async(std::launch::async, [&] { return b_->Recv(0, tag, dst, 64); });
  std::this_thread::sleep_for(milliseconds(100));
  b_->Abort();
  ASSERT_EQ(pending.wait_for(std::chrono::seconds(2)), std::future_status::ready);
  const absl::Status s = pending.get();
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted) << s;
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(3));
  EXPECT_TRUE(b_->aborted());
  EXPECT_EQ(log_[1].to_device.load(), 0);  // nothing arrived, nothing copied
  // Later calls fail fast, without touching the device.
  EXPECT_EQ(b_->PostSend(0, tag, device_.Upload(std::vector<float>(16)), 64).code(),
            absl::StatusCode::kAborted);
  EXPECT_EQ(b_->Recv(0, tag + 1, dst, 64).code(), absl::StatusCode::kAborted);
  EXPECT_EQ(b_->WaitSends().code(), absl::StatusCode::kAborted);
  EXPECT_EQ(log_[1].to_host.load(), 0);
}

// A posted receive's waiter wakes on Abort() from another thread.
TEST_F(HostStagedTransportTest, AbortWakesPostedReceive) {
  ASSERT_NO_FATAL_FAILURE(Connect());
  void* dst = device_.Allocate(16);
  const uint64_t tag = MakeTransferTag(Payload::kGradient, 1, 0);
  ASSERT_TRUE(b_->PostRecv(0, tag, dst, 16).ok());
  auto pending = std::async(std::launch::async, [&] { return b_->WaitRecv(0, tag); });
  std::this_thread::sleep_for(milliseconds(50));
  b_->Abort();
  ASSERT_EQ(pending.wait_for(std::chrono::seconds(2)), std::future_status::ready);
  EXPECT_EQ(pending.get().code(), absl::StatusCode::kAborted);
}

TEST_F(HostStagedTransportTest, RecvTimeoutPassesThrough) {
  ASSERT_NO_FATAL_FAILURE(Connect(milliseconds(200)));
  const absl::Status s = b_->Recv(0, 1, device_.Allocate(16), 16);
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_NE(s.message().find("peer rank 0"), std::string::npos) << s;
}

TEST_F(HostStagedTransportTest, CopyToHostErrorNamesTheCopy) {
  ASSERT_NO_FATAL_FAILURE(Connect());
  log_[0].fail_to_host = true;
  const uint64_t tag = MakeTransferTag(Payload::kActivation, 0, 2);
  const absl::Status s = a_->PostSend(1, tag, device_.Upload(Iota(10, 0.0f)), 40);
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
  EXPECT_NE(s.message().find("send to peer rank 1"), std::string::npos) << s;
  EXPECT_NE(s.message().find("copying 40 bytes from the device to host staging"), std::string::npos)
      << s;
  EXPECT_NE(s.message().find("fake: cudaMemcpyAsync failed"), std::string::npos) << s;
  EXPECT_EQ(a_->bytes_sent(), 0);  // nothing was posted
}

TEST_F(HostStagedTransportTest, CopyToDeviceErrorNamesTheCopy) {
  ASSERT_NO_FATAL_FAILURE(Connect());
  log_[1].fail_to_device = true;
  const uint64_t tag = MakeTransferTag(Payload::kGradient, 1, 4);
  ASSERT_TRUE(a_->PostSend(1, tag, device_.Upload(Iota(10, 0.0f)), 40).ok());
  const absl::Status s = b_->Recv(0, tag, device_.Allocate(40), 40);
  ASSERT_TRUE(a_->WaitSends().ok());
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
  EXPECT_NE(s.message().find("rank 1: receive from peer rank 0"), std::string::npos) << s;
  EXPECT_NE(s.message().find("copying 40 bytes from host staging to the device"), std::string::npos)
      << s;
  EXPECT_NE(s.message().find("fake: cudaMemcpyAsync failed"), std::string::npos) << s;
}

TEST_F(HostStagedTransportTest, StagingAllocationErrorKeepsItsCode) {
  ASSERT_NO_FATAL_FAILURE(Connect());
  log_[0].fail_allocation = true;
  const absl::Status s = a_->PostSend(1, 5, device_.Upload(Iota(4, 0.0f)), 16);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_NE(s.message().find("allocating 16 bytes of host staging"), std::string::npos) << s;
  EXPECT_EQ(log_[0].to_host.load(), 0);
}

TEST_F(HostStagedTransportTest, BadPeersPassThrough) {
  ASSERT_NO_FATAL_FAILURE(Connect());
  void* buf = device_.Upload(Iota(1, 0.0f));
  EXPECT_EQ(a_->PostSend(0, 1, buf, 4).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(a_->Recv(2, 1, buf, 4).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(a_->posted_recv(2, 1));
  EXPECT_FALSE(a_->aborted());
}

}  // namespace
}  // namespace tandem::worker
