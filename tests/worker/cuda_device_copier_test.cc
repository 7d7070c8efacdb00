// The CUDA DeviceCopier, and the host-staged transport on a real device: two ranks on ONE
// device, the case NCCL refuses (issue 27). Tests that need a device skip without one; the
// no-device test runs only without one. Includes only CUDA-free headers, as main.cc would.
#include "worker/backend/cuda/cuda_device_copier.h"

#include <gloo/rendezvous/hash_store.h>
#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/status_macros.h"
#include "worker/backend/cuda/device.h"
#include "worker/transport/gloo_transport.h"
#include "worker/transport/host_staged_transport.h"

namespace tandem::worker {
namespace {

#define SKIP_WITHOUT_DEVICE()                              \
  do {                                                     \
    if (absl::Status s = cuda::CudaAvailable(); !s.ok()) { \
      GTEST_SKIP() << "no CUDA device: " << s;             \
    }                                                      \
  } while (false)

TEST(CudaDeviceCopierTest, NoDeviceIsFailedPrecondition) {
  if (cuda::CudaAvailable().ok()) GTEST_SKIP() << "a CUDA device is present";
  auto copier = cuda::NewCudaDeviceCopier(0);
  EXPECT_EQ(copier.status().code(), absl::StatusCode::kFailedPrecondition) << copier.status();
}

// The GPU's uuid as nvidia-smi -L prints it: how the coordinator tells two workers on one GPU.
TEST(DeviceUuidTest, FormatsAsNvidiaDoes) {
  const unsigned char bytes[16] = {0x8c, 0x7f, 0x2b, 0x1e, 0x0f, 0x3a, 0x4c, 0x1d,
                                   0x9e, 0x2b, 0x5a, 0x6b, 0x7c, 0x8d, 0x9e, 0x0f};
  EXPECT_EQ(cuda::FormatDeviceUuid(bytes), "GPU-8c7f2b1e-0f3a-4c1d-9e2b-5a6b7c8d9e0f");
}

TEST(DeviceUuidTest, OfADeviceOrFailedPrecondition) {
  if (!cuda::CudaAvailable().ok()) {
    EXPECT_EQ(cuda::DeviceUuid(0).status().code(), absl::StatusCode::kFailedPrecondition);
    return;
  }
  absl::StatusOr<std::string> uuid = cuda::DeviceUuid(0);
  ASSERT_TRUE(uuid.ok()) << uuid.status();
  EXPECT_EQ(uuid->size(), 40u) << *uuid;
  EXPECT_EQ(uuid->rfind("GPU-", 0), 0u) << *uuid;
  EXPECT_EQ(*cuda::DeviceUuid(0), *uuid);  // stable
}

TEST(CudaDeviceCopierTest, BadOrdinalFails) {
  SKIP_WITHOUT_DEVICE();
  EXPECT_FALSE(cuda::NewCudaDeviceCopier(1 << 20).ok());
}

TEST(CudaDeviceCopierTest, RoundTripThroughPinnedStaging) {
  SKIP_WITHOUT_DEVICE();
  auto copier = cuda::NewCudaDeviceCopier(0);
  ASSERT_TRUE(copier.ok()) << copier.status();
  constexpr size_t kCount = 1 << 16;
  auto device = cuda::DeviceMemory::Allocate(kCount * sizeof(float));
  ASSERT_TRUE(device.ok()) << device.status();
  auto in = (*copier)->AllocateHost(kCount * sizeof(float));
  auto out = (*copier)->AllocateHost(kCount * sizeof(float));
  ASSERT_TRUE(in.ok() && out.ok());
  EXPECT_EQ((*in)->bytes(), kCount * sizeof(float));
  auto* x = static_cast<float*>((*in)->data());
  for (size_t i = 0; i < kCount; ++i) x[i] = static_cast<float>(i) * 0.5f;
  ASSERT_TRUE((*copier)->CopyToDevice(device->data(), x, kCount * sizeof(float)).ok());
  ASSERT_TRUE((*copier)->CopyToHost((*out)->data(), device->data(), kCount * sizeof(float)).ok());
  const auto* y = static_cast<const float*>((*out)->data());
  EXPECT_EQ(std::vector<float>(y, y + kCount), std::vector<float>(x, x + kCount));
  // A zero-byte staging buffer still has an address.
  auto empty = (*copier)->AllocateHost(0);
  ASSERT_TRUE(empty.ok());
  EXPECT_NE((*empty)->data(), nullptr);
}

// Two ranks on device 0, over Gloo through host staging: rank 0 sends, rank 1 receives.
TEST(CudaDeviceCopierTest, TwoRanksShareOneDevice) {
  SKIP_WITHOUT_DEVICE();
  gloo::rendezvous::HashStore store;
  auto connect = [&](int rank) -> absl::StatusOr<std::unique_ptr<Transport>> {
    GlooTransportOptions o;
    o.rank = rank;
    o.size = 2;
    o.connect_timeout = std::chrono::milliseconds(10000);
    o.op_timeout = std::chrono::milliseconds(10000);
    ASSIGN_OR_RETURN(std::unique_ptr<GlooTransport> gloo, GlooTransport::Connect(o, store));
    ASSIGN_OR_RETURN(std::unique_ptr<DeviceCopier> copier, cuda::NewCudaDeviceCopier(0));
    return std::make_unique<HostStagedTransport>(std::move(gloo), std::move(copier));
  };
  auto f1 = std::async(std::launch::async, connect, 1);
  auto a = connect(0);
  auto b = f1.get();
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();

  constexpr size_t kCount = 100000;
  constexpr size_t kBytes = kCount * sizeof(float);
  auto copier = cuda::NewCudaDeviceCopier(0);
  ASSERT_TRUE(copier.ok()) << copier.status();
  auto host = (*copier)->AllocateHost(kBytes);
  ASSERT_TRUE(host.ok());
  auto* h = static_cast<float*>((*host)->data());
  for (size_t i = 0; i < kCount; ++i) h[i] = static_cast<float>(i) - 3.0f;
  auto src = cuda::DeviceMemory::Allocate(kBytes);
  auto dst = cuda::DeviceMemory::Allocate(kBytes);
  ASSERT_TRUE(src.ok() && dst.ok());
  ASSERT_TRUE(dst->Zero().ok());
  ASSERT_TRUE((*copier)->CopyToDevice(src->data(), h, kBytes).ok());

  const uint64_t tag = MakeTransferTag(Payload::kActivation, 0, 0);
  ASSERT_TRUE((*a)->PostSend(1, tag, src->data(), kBytes).ok());
  auto received =
      std::async(std::launch::async, [&] { return (*b)->Recv(0, tag, dst->data(), kBytes); });
  ASSERT_TRUE((*a)->WaitSends().ok());
  const absl::Status s = received.get();
  ASSERT_TRUE(s.ok()) << s;
  std::vector<float> expected(h, h + kCount);
  ASSERT_TRUE((*copier)->CopyToHost(h, dst->data(), kBytes).ok());
  EXPECT_EQ(std::vector<float>(h, h + kCount), expected);
  EXPECT_EQ((*b)->bytes_received(), static_cast<int64_t>(kBytes));
}

}  // namespace
}  // namespace tandem::worker
