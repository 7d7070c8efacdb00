// The ring all-reduce over real Gloo transports in one process: sums against a reference in
// double, identical bits on every rank, sizes that do not divide by R (and smaller than R),
// pieces smaller than a segment, and Abort.
#include "worker/transport/ring_allreduce.h"

#include <gloo/rendezvous/hash_store.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <future>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "worker/grad_reducer.h"
#include "worker/transport/gloo_transport.h"

namespace tandem::worker {
namespace {

std::vector<std::unique_ptr<Transport>> ConnectRing(gloo::rendezvous::Store& store, int ranks) {
  std::vector<std::unique_ptr<Transport>> out(ranks);
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      GlooTransportOptions o;
      o.rank = r;
      o.size = ranks;
      o.hostname = "127.0.0.1";
      o.connect_timeout = std::chrono::milliseconds(10000);
      o.op_timeout = std::chrono::milliseconds(10000);
      auto t = GlooTransport::Connect(o, store);
      EXPECT_TRUE(t.ok()) << t.status();
      if (t.ok()) out[r] = *std::move(t);
    });
  }
  for (auto& t : threads) t.join();
  return out;
}

std::vector<float> Inputs(int rank, size_t count) {
  std::mt19937 gen(1000 + rank);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(count);
  for (float& x : v) x = dist(gen);
  return v;
}

TEST(RingAllReduceTest, SumsEveryElementAndEveryRankGetsTheSameBits) {
  for (int ranks : {2, 3, 4}) {
    for (size_t count : {size_t{1}, size_t{2}, size_t{5}, size_t{1000}, size_t{100003}}) {
      SCOPED_TRACE(absl::StrCat(ranks, " ranks, ", count, " floats"));
      gloo::rendezvous::HashStore store;
      std::vector<std::unique_ptr<Transport>> ring = ConnectRing(store, ranks);
      for (const auto& t : ring) ASSERT_NE(t, nullptr);
      std::vector<std::vector<float>> data(ranks);
      for (int r = 0; r < ranks; ++r) data[r] = Inputs(r, count);
      std::vector<double> expected(count, 0.0);
      for (int r = 0; r < ranks; ++r) {
        for (size_t i = 0; i < count; ++i) expected[i] += data[r][i];
      }
      std::vector<absl::Status> status(ranks);
      std::vector<std::thread> threads;
      for (int r = 0; r < ranks; ++r) {
        threads.emplace_back([&, r] {
          std::vector<float> scratch;
          // Pieces of 4 KiB: many per segment for the big sizes.
          status[r] = RingAllReduce(*ring[r], data[r].data(), count, scratch,
                                    {.id = 7, .piece_bytes = 4096});
        });
      }
      for (auto& t : threads) t.join();
      for (int r = 0; r < ranks; ++r) {
        ASSERT_TRUE(status[r].ok()) << status[r];
        EXPECT_EQ(std::memcmp(data[r].data(), data[0].data(), count * sizeof(float)), 0)
            << "rank " << r << " differs from rank 0";
      }
      for (size_t i = 0; i < count; ++i) {
        ASSERT_NEAR(data[0][i], expected[i], 1e-5) << "element " << i;
      }
    }
  }
}

TEST(RingAllReduceTest, OneRankAndNothingToDoAreNoOps) {
  gloo::rendezvous::HashStore store;
  std::vector<std::unique_ptr<Transport>> one = ConnectRing(store, 1);
  ASSERT_NE(one[0], nullptr);
  std::vector<float> v = {1, 2, 3};
  std::vector<float> scratch;
  ASSERT_TRUE(RingAllReduce(*one[0], v.data(), v.size(), scratch).ok());
  EXPECT_EQ(v, (std::vector<float>{1, 2, 3}));
}

TEST(RingAllReduceTest, AbortUnblocksAWaitingRank) {
  gloo::rendezvous::HashStore store;
  std::vector<std::unique_ptr<Transport>> ring = ConnectRing(store, 2);
  ASSERT_NE(ring[0], nullptr);
  ASSERT_NE(ring[1], nullptr);
  std::vector<float> v(1024, 1.0f);
  std::vector<float> scratch;
  // Rank 1 never joins: rank 0 waits in its first receive until aborted.
  auto running = std::async(std::launch::async,
                            [&] { return RingAllReduce(*ring[0], v.data(), v.size(), scratch); });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ring[0]->Abort();
  ASSERT_EQ(running.wait_for(std::chrono::seconds(5)), std::future_status::ready);
  const absl::Status s = running.get();
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted) << s;
  EXPECT_NE(s.message().find("reduce-scatter step 0"), std::string::npos) << s;
}

// The reducer: buckets of several tensors (small ones coalesced, large ones in place) summed
// in posting order; its timings per chunk; a failure reported once and then refused.
TEST(GradReducerTest, ReducesBucketsInOrderAndReportsSpansAndBytes) {
  gloo::rendezvous::HashStore store;
  std::vector<std::unique_ptr<Transport>> ring = ConnectRing(store, 2);
  ASSERT_NE(ring[0], nullptr);
  ASSERT_NE(ring[1], nullptr);
  std::vector<std::unique_ptr<GradReducer>> reducers;
  for (auto& t : ring) reducers.push_back(std::make_unique<GradReducer>(std::move(t)));
  // Per rank: a big tensor (in place), two small ones (coalesced) in chunk 0; one in chunk 1.
  const std::vector<size_t> sizes = {size_t{1} << 19, 7, 300, 1000};
  std::vector<std::vector<std::vector<float>>> data(2);
  for (int r = 0; r < 2; ++r) {
    for (size_t k = 0; k < sizes.size(); ++k) data[r].push_back(Inputs(10 * r + k, sizes[k]));
  }
  std::vector<std::vector<float>> expected;
  for (size_t k = 0; k < sizes.size(); ++k) {
    expected.emplace_back(sizes[k]);
    for (size_t i = 0; i < sizes[k]; ++i) expected[k][i] = data[0][k][i] + data[1][k][i];
  }
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      ASSERT_TRUE(reducers[r]->BeginStep().ok());
      reducers[r]->Post(
          {0,
           3,
           {absl::MakeSpan(data[r][0]), absl::MakeSpan(data[r][1]), absl::MakeSpan(data[r][2])}});
      reducers[r]->Post({1, 1, {absl::MakeSpan(data[r][3])}});
      EXPECT_TRUE(reducers[r]->Wait().ok());
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < 2; ++r) {
    for (size_t k = 0; k < sizes.size(); ++k) {
      ASSERT_EQ(data[r][k], expected[k]) << "rank " << r << " tensor " << k;
    }
    const GradReducer::ChunkSpan a = reducers[r]->span_of(0);
    const GradReducer::ChunkSpan b = reducers[r]->span_of(1);
    EXPECT_GT(a.start_us, 0);
    EXPECT_LE(a.start_us, a.end_us);
    EXPECT_LE(a.end_us, b.start_us) << "buckets run one at a time, in posting order";
    int64_t bytes = 0;
    for (size_t n : sizes) bytes += static_cast<int64_t>(n * 4);
    EXPECT_EQ(reducers[r]->step_bytes(), bytes);
  }
  // Abort: the next step is refused, naming the abort.
  reducers[0]->Abort();
  const absl::Status s = reducers[0]->BeginStep();
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted) << s;
}

}  // namespace
}  // namespace tandem::worker
