// NcclCollectives: option checks, a group of one rank and rendezvous failures run everywhere (no
// GPU needed); the collectives need one GPU per rank and skip with a message otherwise.
#include "worker/transport/nccl_collectives.h"

#include <gloo/rendezvous/hash_store.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <future>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/shard_range.h"
#include "worker/backend/cuda/cuda_status.h"
#include "worker/backend/cuda/device.h"
#include "worker/backend/cuda/device_buffer.h"
#include "worker/grad_reducer.h"

namespace tandem::worker {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

NcclCollectivesOptions Options(int rank, int size, int device = 0) {
  NcclCollectivesOptions o;
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

// Same bits (NaN-safe, -0 != +0).
bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Index and values of the first difference in bits, for messages.
std::string FirstDifference(const std::vector<float>& got, const std::vector<float>& want) {
  if (got.size() != want.size()) return absl::StrCat("sizes ", got.size(), " vs ", want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::memcmp(&got[i], &want[i], sizeof(float)) != 0) {
      return absl::StrCat("element ", i, ": got ", got[i], ", want ", want[i]);
    }
  }
  return "none";
}

TEST(NcclCollectivesTest, BadOptionsAreInvalidArgument) {
  gloo::rendezvous::HashStore store;
  for (auto [rank, size] : {std::pair{-1, 2}, {2, 2}, {0, 0}, {1, 1}}) {
    auto c = NcclCollectives::Connect(Options(rank, size), store);
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << rank << "/" << size;
  }
  // Checked for a group of one rank too, although it needs no communicator.
  for (int size : {1, 2}) {
    NcclCollectivesOptions o = Options(0, size);
    o.device = -1;
    EXPECT_EQ(NcclCollectives::Connect(o, store).status().code(),
              absl::StatusCode::kInvalidArgument);
    o = Options(0, size);
    o.key_prefix.clear();
    EXPECT_EQ(NcclCollectives::Connect(o, store).status().code(),
              absl::StatusCode::kInvalidArgument);
    o = Options(0, size);
    o.connect_timeout = milliseconds(0);
    EXPECT_EQ(NcclCollectives::Connect(o, store).status().code(),
              absl::StatusCode::kInvalidArgument);
    o = Options(0, size);
    o.op_timeout = milliseconds(-1);
    EXPECT_EQ(NcclCollectives::Connect(o, store).status().code(),
              absl::StatusCode::kInvalidArgument);
  }
}

// One rank: no communicator and no device (so this runs everywhere; the buffer is host memory,
// which no operation touches); every operation is a no-op, and Abort() still counts.
TEST(NcclCollectivesTest, SingleRankNeedsNoDeviceAndLeavesTheDataAlone) {
  gloo::rendezvous::HashStore store;
  auto c = NcclCollectives::Connect(Options(0, 1, /*device=*/64), store);
  ASSERT_TRUE(c.ok()) << c.status();
  std::vector<float> data = {1.0f, -2.5f, 3.25f};
  const std::vector<float> before = data;
  EXPECT_TRUE((*c)->AllReduce(data.data(), data.size()).ok());
  EXPECT_TRUE((*c)->ReduceScatter(data.data(), data.size()).ok());
  EXPECT_TRUE((*c)->AllGather(data.data(), data.size()).ok());
  EXPECT_TRUE(SameBits(data, before));
  EXPECT_TRUE((*c)->AllReduce(nullptr, 0).ok());
  const absl::Status null = (*c)->AllGather(nullptr, 4);
  EXPECT_EQ(null.code(), absl::StatusCode::kInvalidArgument) << null;
  EXPECT_NE(null.message().find("all-gather of 4 floats"), std::string::npos) << null;
  (*c)->Abort();
  (*c)->Abort();  // idempotent
  EXPECT_TRUE((*c)->aborted());
  EXPECT_EQ((*c)->AllReduce(data.data(), data.size()).code(), absl::StatusCode::kAborted);
}

// A rank other than 0 waits for rank 0's id in the store; when rank 0 never comes it gives up at
// the connect timeout, naming the key (before any CUDA call: runs everywhere).
TEST(NcclCollectivesTest, MissingRankZeroTimesOut) {
  gloo::rendezvous::HashStore store;
  NcclCollectivesOptions o = Options(1, 2);
  o.connect_timeout = milliseconds(1500);
  o.key_prefix = "stage3";
  const Clock::time_point start = Clock::now();
  auto c = NcclCollectives::Connect(o, store);
  const auto took = Clock::now() - start;
  EXPECT_EQ(c.status().code(), absl::StatusCode::kDeadlineExceeded) << c.status();
  EXPECT_NE(c.status().message().find("stage3/unique_id"), std::string::npos) << c.status();
  EXPECT_NE(c.status().message().find("rank 1 of 2"), std::string::npos) << c.status();
  EXPECT_GE(took, milliseconds(1400));
  EXPECT_LT(took, std::chrono::seconds(10));
}

// Rank 0 without its device (here: one that does not exist, or none at all) publishes its error
// in place of the id; the other ranks fail at once with it (UNAVAILABLE) instead of at their
// timeout. Runs everywhere: they fail before touching their own device.
TEST(NcclCollectivesTest, RankZerosPublishedErrorFailsThePeersFast) {
  gloo::rendezvous::HashStore store;
  const Clock::time_point start = Clock::now();
  std::vector<std::future<absl::Status>> peers;
  for (int rank : {1, 2}) {
    peers.push_back(std::async(std::launch::async, [&store, rank] {
      return NcclCollectives::Connect(Options(rank, 3, rank), store).status();
    }));
  }
  const absl::Status root = NcclCollectives::Connect(Options(0, 3, /*device=*/64), store).status();
  EXPECT_EQ(root.code(), absl::StatusCode::kFailedPrecondition) << root;
  EXPECT_NE(root.message().find("rank 0 of 3"), std::string::npos) << root;
  for (auto& peer : peers) {
    const absl::Status p = peer.get();
    EXPECT_EQ(p.code(), absl::StatusCode::kUnavailable) << p;
    EXPECT_NE(p.message().find("rank 0 of the group could not create the NCCL id"),
              std::string::npos)
        << p;
  }
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(10));  // far below the 20 s timeout
  const std::vector<char> value = store.get("nccl_dp/unique_id");
  EXPECT_TRUE(absl::StartsWith(std::string(value.begin(), value.end()), "error:"));
}

// Whatever is under the key must be an id or an error (runs everywhere).
TEST(NcclCollectivesTest, MalformedIdIsInternal) {
  gloo::rendezvous::HashStore store;
  const std::string junk = "id:too short";
  store.set("nccl_dp/unique_id", std::vector<char>(junk.begin(), junk.end()));
  const absl::Status s = NcclCollectives::Connect(Options(1, 2), store).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
  EXPECT_NE(s.message().find("malformed NCCL id under store key nccl_dp/unique_id"),
            std::string::npos)
      << s;
}

// A Connect() whose cancel flag is already set gives up at once (runs everywhere).
TEST(NcclCollectivesTest, CancelledConnectIsAborted) {
  gloo::rendezvous::HashStore store;
  std::atomic<bool> cancelled{true};
  for (int rank : {0, 1}) {
    NcclCollectivesOptions o = Options(rank, 2);
    o.cancelled = &cancelled;
    const Clock::time_point start = Clock::now();
    const absl::Status s = NcclCollectives::Connect(o, store).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kAborted) << s;
    EXPECT_LT(Clock::now() - start, std::chrono::seconds(5));
  }
}

// ---- With devices.

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

TEST(NcclCollectivesTest, SingleRankOnADeviceLeavesTheDataUnchanged) {
  SKIP_UNLESS_DEVICES(1);
  gloo::rendezvous::HashStore store;
  auto c = NcclCollectives::Connect(Options(0, 1, 0), store);
  ASSERT_TRUE(c.ok()) << c.status();
  std::mt19937 gen(7);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> host(100003);
  for (float& x : host) x = dist(gen);
  auto buffer = OnDevice(0, host);
  ASSERT_TRUE((*c)->AllReduce(buffer.data(), buffer.size()).ok());
  ASSERT_TRUE((*c)->ReduceScatter(buffer.data(), buffer.size()).ok());
  ASSERT_TRUE((*c)->AllGather(buffer.data(), buffer.size()).ok());
  EXPECT_TRUE(SameBits(ToHost(0, buffer), host));
}

// Rank 0 of 2 on a device whose peer never joins: it gives up at the connect timeout instead of
// hanging.
TEST(NcclCollectivesTest, MissingPeerTimesOut) {
  SKIP_UNLESS_DEVICES(1);
  gloo::rendezvous::HashStore store;
  NcclCollectivesOptions o = Options(0, 2);
  o.connect_timeout = milliseconds(2000);
  const Clock::time_point start = Clock::now();
  auto c = NcclCollectives::Connect(o, store);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kDeadlineExceeded) << c.status();
  EXPECT_NE(c.status().message().find("not ready after 2000 ms"), std::string::npos) << c.status();
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(30));
}

// Cancelled while waiting for the communicator (its peer never joins): ABORTED promptly.
TEST(NcclCollectivesTest, CancelWhileWaitingForThePeers) {
  SKIP_UNLESS_DEVICES(1);
  gloo::rendezvous::HashStore store;
  std::atomic<bool> cancelled{false};
  NcclCollectivesOptions o = Options(0, 2);
  o.cancelled = &cancelled;
  std::thread canceller([&] {
    std::this_thread::sleep_for(milliseconds(500));
    cancelled.store(true);
  });
  const Clock::time_point start = Clock::now();
  auto c = NcclCollectives::Connect(o, store);
  canceller.join();
  EXPECT_EQ(c.status().code(), absl::StatusCode::kAborted) << c.status();
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(10));  // far below the 20 s timeout
}

// Connects ranks 0..size-1 (device = rank), each on a thread of its own; `adjust` may change a
// rank's options.
std::vector<std::unique_ptr<NcclCollectives>> ConnectGroup(
    int size, gloo::rendezvous::Store& store,
    const std::function<void(NcclCollectivesOptions&)>& adjust = nullptr) {
  std::vector<std::future<absl::StatusOr<std::unique_ptr<NcclCollectives>>>> futures;
  for (int r = 0; r < size; ++r) {
    NcclCollectivesOptions o = Options(r, size, r);
    if (adjust) adjust(o);
    futures.push_back(
        std::async(std::launch::async, [&store, o] { return NcclCollectives::Connect(o, store); }));
  }
  std::vector<std::unique_ptr<NcclCollectives>> group;
  for (auto& f : futures) {
    auto c = f.get();
    EXPECT_TRUE(c.ok()) << c.status();
    if (!c.ok()) return {};
    group.push_back(*std::move(c));
  }
  return group;
}

// What one rank saw in CollectivesMatchTheHostSums, per size.
struct RankResults {
  std::vector<std::vector<float>> exact_all_reduce;
  std::vector<std::vector<float>> exact_reduce_scatter;  // the owned segment
  std::vector<std::vector<float>> exact_all_gather;
  std::vector<std::vector<float>> random_all_reduce;
  std::vector<std::vector<float>> random_sharded;  // reduce-scatter, then all-gather
};

constexpr size_t kSizes[] = {1, 5, 100003};

// Exactly representable inputs whose sums are exact in any order (quarters in [-8, 8]): every
// summation order gives the host's bits.
std::vector<float> ExactInput(int rank, size_t count) {
  std::vector<float> v(count);
  for (size_t i = 0; i < count; ++i) {
    v[i] = static_cast<float>(static_cast<int>((i * 7 + static_cast<size_t>(rank) * 13 + 3) % 61) -
                              30) *
           0.25f;
  }
  return v;
}

std::vector<float> RandomInput(int rank, size_t count) {
  std::mt19937 gen(1000 + rank);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(count);
  for (float& x : v) x = dist(gen);
  return v;
}

// One rank's part: for each size, the three collectives on exact inputs (the reduce-scatter's
// non-owned elements scribbled over before the all-gather), then random inputs.
RankResults RunRank(NcclCollectives& c) {
  RankResults out;
  const int device = c.device();
  EXPECT_EQ(cudaSetDevice(device), cudaSuccess);
  EXPECT_TRUE(c.AllReduce(nullptr, 0).ok());
  for (size_t count : kSizes) {
    const std::string what = absl::StrCat("rank ", c.rank(), " count ", count);
    const ElementRange own = OwnedSegment(count, c.size(), c.rank());
    auto buffer = OnDevice(device, ExactInput(c.rank(), count));
    absl::Status s = c.AllReduce(buffer.data(), count);
    EXPECT_TRUE(s.ok()) << what << ": " << s;
    out.exact_all_reduce.push_back(ToHost(device, buffer));

    EXPECT_TRUE(buffer.CopyFromHost(ExactInput(c.rank(), count).data(), count).ok());
    s = c.ReduceScatter(buffer.data(), count);
    EXPECT_TRUE(s.ok()) << what << ": " << s;
    std::vector<float> scattered = ToHost(device, buffer);
    out.exact_reduce_scatter.emplace_back(scattered.begin() + own.begin,
                                          scattered.begin() + own.end);
    for (size_t i = 0; i < count; ++i) {
      if (i < own.begin || i >= own.end) scattered[i] = std::nanf("");
    }
    EXPECT_TRUE(buffer.CopyFromHost(scattered.data(), count).ok());
    s = c.AllGather(buffer.data(), count);
    EXPECT_TRUE(s.ok()) << what << ": " << s;
    out.exact_all_gather.push_back(ToHost(device, buffer));

    EXPECT_TRUE(buffer.CopyFromHost(RandomInput(c.rank(), count).data(), count).ok());
    s = c.AllReduce(buffer.data(), count);
    EXPECT_TRUE(s.ok()) << what << ": " << s;
    out.random_all_reduce.push_back(ToHost(device, buffer));
    EXPECT_TRUE(buffer.CopyFromHost(RandomInput(c.rank(), count).data(), count).ok());
    s = c.ReduceScatter(buffer.data(), count);
    EXPECT_TRUE(s.ok()) << what << ": " << s;
    s = c.AllGather(buffer.data(), count);
    EXPECT_TRUE(s.ok()) << what << ": " << s;
    out.random_sharded.push_back(ToHost(device, buffer));
  }
  return out;
}

void CheckCollectives(int size) {
  gloo::rendezvous::HashStore store;
  auto group = ConnectGroup(size, store);
  ASSERT_EQ(group.size(), static_cast<size_t>(size));
  // Each rank on a thread of its own (the operations are collective), which also destroys its
  // communicator: finalizing waits for the whole group.
  std::vector<std::future<RankResults>> futures;
  for (auto& c : group) {
    futures.push_back(std::async(std::launch::async, [c = std::move(c)]() mutable {
      RankResults r = RunRank(*c);
      c.reset();
      return r;
    }));
  }
  std::vector<RankResults> results;
  for (auto& f : futures) results.push_back(f.get());

  for (size_t n = 0; n < std::size(kSizes); ++n) {
    const size_t count = kSizes[n];
    std::vector<float> exact_sum(count, 0.0f), random_sum(count, 0.0f);
    for (int r = 0; r < size; ++r) {
      const std::vector<float> e = ExactInput(r, count), x = RandomInput(r, count);
      for (size_t i = 0; i < count; ++i) {
        exact_sum[i] += e[i];
        random_sum[i] += x[i];
      }
    }
    for (int r = 0; r < size; ++r) {
      const RankResults& got = results[r];
      const std::string what = absl::StrCat("R ", size, " rank ", r, " count ", count);
      EXPECT_TRUE(SameBits(got.exact_all_reduce[n], exact_sum))
          << what << " all-reduce: " << FirstDifference(got.exact_all_reduce[n], exact_sum);
      // The owned segment: the sum, the same bits as the all-reduce's.
      const ElementRange own = OwnedSegment(count, size, r);
      const std::vector<float> owned_sum(exact_sum.begin() + own.begin,
                                         exact_sum.begin() + own.end);
      const std::vector<float> owned_all_reduce(got.exact_all_reduce[n].begin() + own.begin,
                                                got.exact_all_reduce[n].begin() + own.end);
      EXPECT_TRUE(SameBits(got.exact_reduce_scatter[n], owned_sum))
          << what << " reduce-scatter [" << own.begin << ", " << own.end
          << "): " << FirstDifference(got.exact_reduce_scatter[n], owned_sum);
      EXPECT_TRUE(SameBits(got.exact_reduce_scatter[n], owned_all_reduce)) << what;
      // The all-gather restored every scribbled element.
      EXPECT_TRUE(SameBits(got.exact_all_gather[n], exact_sum))
          << what << " all-gather: " << FirstDifference(got.exact_all_gather[n], exact_sum);

      // Random inputs: every rank the same bits (each sum computed once, then copied), within
      // rounding of the host's sum; for two ranks exactly it (a + b == b + a).
      EXPECT_TRUE(SameBits(got.random_all_reduce[n], results[0].random_all_reduce[n]))
          << what << " random all-reduce differs from rank 0's";
      EXPECT_TRUE(SameBits(got.random_sharded[n], results[0].random_sharded[n]))
          << what << " random reduce-scatter + all-gather differs from rank 0's";
      for (size_t i = 0; i < count; ++i) {
        ASSERT_NEAR(got.random_all_reduce[n][i], random_sum[i], 1e-5f) << what << " element " << i;
        ASSERT_NEAR(got.random_sharded[n][i], random_sum[i], 1e-5f) << what << " element " << i;
      }
      if (size == 2) {
        EXPECT_TRUE(SameBits(got.random_all_reduce[n], random_sum)) << what;
        EXPECT_TRUE(SameBits(got.random_sharded[n], random_sum)) << what;
      }
    }
  }
}

TEST(NcclCollectivesTest, TwoRanksMatchTheHostSums) {
  SKIP_UNLESS_DEVICES(2);
  CheckCollectives(2);
}

// The data-parallel path of a CUDA worker: GradReducer over NewNcclGroupCollectives, buckets
// of device memory posted as the executor posts them, summed on the reducer's own thread.
TEST(NcclCollectivesTest, AGradReducerSumsDeviceBucketsThroughTheGroup) {
  SKIP_UNLESS_DEVICES(2);
  gloo::rendezvous::HashStore store;
  auto group = ConnectGroup(2, store);
  ASSERT_EQ(group.size(), 2u);
  std::vector<std::future<std::vector<std::vector<float>>>> futures;
  for (auto& c : group) {
    futures.push_back(std::async(std::launch::async, [c = std::move(c)]() mutable {
      const int device = c->device();
      const int rank = c->rank();
      EXPECT_EQ(cudaSetDevice(device), cudaSuccess);
      std::vector<cuda::DeviceBuffer<float>> buffers;
      for (size_t count : kSizes) buffers.push_back(OnDevice(device, ExactInput(rank, count)));
      GradReducer reducer(NewNcclGroupCollectives(std::move(c)));
      EXPECT_EQ(reducer.replica(), rank);
      EXPECT_EQ(reducer.replicas(), 2);
      EXPECT_TRUE(reducer.BeginStep().ok());
      for (size_t i = 0; i < buffers.size(); ++i) {
        reducer.Post(GradBucket{.chunk = 0,
                                .layer = static_cast<int>(i),
                                .tensors = {absl::Span<float>(buffers[i].data(), kSizes[i])}});
      }
      absl::Status s = reducer.Wait();
      EXPECT_TRUE(s.ok()) << s;
      EXPECT_EQ(reducer.step_bytes(),
                static_cast<int64_t>((kSizes[0] + kSizes[1] + kSizes[2]) * sizeof(float)));
      std::vector<std::vector<float>> out;
      for (const auto& b : buffers) out.push_back(ToHost(device, b));
      return out;
    }));
  }
  for (int r = 0; r < 2; ++r) {
    const std::vector<std::vector<float>> got = futures[r].get();
    ASSERT_EQ(got.size(), std::size(kSizes));
    for (size_t n = 0; n < std::size(kSizes); ++n) {
      std::vector<float> sum = ExactInput(0, kSizes[n]);
      const std::vector<float> other = ExactInput(1, kSizes[n]);
      for (size_t i = 0; i < sum.size(); ++i) sum[i] += other[i];
      EXPECT_TRUE(SameBits(got[n], sum))
          << "rank " << r << " count " << kSizes[n] << ": " << FirstDifference(got[n], sum);
    }
  }
}

TEST(NcclCollectivesTest, ThreeRanksMatchTheHostSums) {
  SKIP_UNLESS_DEVICES(3);
  CheckCollectives(3);
}

// Rank 1 never joins the all-reduce: Abort() from another thread ends rank 0's wait with
// ABORTED, and every later operation too.
TEST(NcclCollectivesTest, AbortEndsARunningOperation) {
  SKIP_UNLESS_DEVICES(2);
  gloo::rendezvous::HashStore store;
  auto group = ConnectGroup(2, store);
  ASSERT_EQ(group.size(), 2u);
  NcclCollectives& c = *group[0];
  auto buffer = OnDevice(0, std::vector<float>(1 << 20, 1.0f));
  std::thread aborter([&] {
    std::this_thread::sleep_for(milliseconds(300));
    c.Abort();
  });
  const Clock::time_point start = Clock::now();
  const absl::Status s = c.AllReduce(buffer.data(), buffer.size());
  aborter.join();
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted) << s;
  EXPECT_NE(s.message().find("all-reduce of 1048576 floats"), std::string::npos) << s;
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(10));
  EXPECT_EQ(c.AllGather(buffer.data(), buffer.size()).code(), absl::StatusCode::kAborted);
  group[1]->Abort();
}

// Rank 1 never joins: rank 0 gives up at its op timeout, and the communicator stays failed.
TEST(NcclCollectivesTest, OpTimeoutIsDeadlineExceeded) {
  SKIP_UNLESS_DEVICES(2);
  gloo::rendezvous::HashStore store;
  auto group =
      ConnectGroup(2, store, [](NcclCollectivesOptions& o) { o.op_timeout = milliseconds(1000); });
  ASSERT_EQ(group.size(), 2u);
  NcclCollectives& c = *group[0];
  auto buffer = OnDevice(0, std::vector<float>(1000, 1.0f));
  const Clock::time_point start = Clock::now();
  const absl::Status s = c.ReduceScatter(buffer.data(), buffer.size());
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_NE(s.message().find("reduce-scatter of 1000 floats"), std::string::npos) << s;
  EXPECT_GE(Clock::now() - start, milliseconds(900));
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(10));
  const absl::Status later = c.AllReduce(buffer.data(), buffer.size());
  EXPECT_EQ(later.code(), absl::StatusCode::kDeadlineExceeded) << later;
  EXPECT_NE(later.message().find("failed earlier"), std::string::npos) << later;
  group[1]->Abort();
}

}  // namespace
}  // namespace tandem::worker
