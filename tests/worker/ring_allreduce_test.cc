// The ring all-reduce over real Gloo transports in one process: sums against a reference in
// double, identical bits on every rank, sizes that do not divide by R (and smaller than R),
// pieces smaller than a segment, the reduce-scatter and all-gather halves of sharded optimizer
// state, and Abort.
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
#include "common/shard_range.h"
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

// The halves for sharded optimizer state: after the reduce-scatter each rank's owned segment
// (common/shard_range.h) holds the sum, exactly the bits the all-reduce gives; the all-gather
// then copies every owned segment everywhere (bit for bit).
TEST(RingAllReduceTest, ReduceScatterThenAllGatherIsTheAllReduce) {
  for (int ranks : {2, 3, 4}) {
    for (size_t count : {size_t{1}, size_t{5}, size_t{100003}}) {
      SCOPED_TRACE(absl::StrCat(ranks, " ranks, ", count, " floats"));
      gloo::rendezvous::HashStore store;
      std::vector<std::unique_ptr<Transport>> ring = ConnectRing(store, ranks);
      for (const auto& t : ring) ASSERT_NE(t, nullptr);
      std::vector<std::vector<float>> reduced(ranks), scattered(ranks);
      for (int r = 0; r < ranks; ++r) reduced[r] = scattered[r] = Inputs(r, count);
      std::vector<absl::Status> status(ranks, absl::UnknownError("not run"));
      std::vector<std::thread> threads;
      for (int r = 0; r < ranks; ++r) {
        threads.emplace_back([&, r] {
          std::vector<float> scratch;
          absl::Status s = RingAllReduce(*ring[r], reduced[r].data(), count, scratch,
                                         {.id = 1, .piece_bytes = 4096});
          if (s.ok()) {
            s = RingReduceScatter(*ring[r], scattered[r].data(), count, scratch,
                                  {.id = 2, .piece_bytes = 4096});
          }
          status[r] = s;
        });
      }
      for (auto& t : threads) t.join();
      threads.clear();
      for (int r = 0; r < ranks; ++r) {
        ASSERT_TRUE(status[r].ok()) << status[r];
        const ElementRange own = OwnedSegment(count, ranks, r);
        EXPECT_EQ(std::memcmp(scattered[r].data() + own.begin, reduced[0].data() + own.begin,
                              own.size() * sizeof(float)),
                  0)
            << "rank " << r << "'s segment [" << own.begin << ", " << own.end << ")";
        // What the optimizer would do to its segment: the rest is scribbled over, and the
        // all-gather must overwrite all of it.
        for (size_t i = 0; i < count; ++i) {
          if (i < own.begin || i >= own.end) scattered[r][i] = -1e30f;
        }
      }
      for (int r = 0; r < ranks; ++r) {
        threads.emplace_back([&, r] {
          status[r] =
              RingAllGather(*ring[r], scattered[r].data(), count, {.id = 3, .piece_bytes = 4096});
        });
      }
      for (auto& t : threads) t.join();
      for (int r = 0; r < ranks; ++r) {
        ASSERT_TRUE(status[r].ok()) << status[r];
        EXPECT_EQ(std::memcmp(scattered[r].data(), reduced[0].data(), count * sizeof(float)), 0)
            << "rank " << r;
      }
    }
  }
}

// The owned segments cut the tensor: disjoint, covering, one per rank, (k + 1) mod R.
TEST(ShardRangeTest, OwnedSegmentsPartitionTheTensor) {
  for (int ranks : {1, 2, 3, 7}) {
    for (size_t count : {size_t{0}, size_t{1}, size_t{6}, size_t{1001}}) {
      std::vector<int> owner(count, -1);
      for (int r = 0; r < ranks; ++r) {
        const ElementRange own = OwnedSegment(count, ranks, r);
        ASSERT_LE(own.begin, own.end);
        ASSERT_LE(own.end, count);
        EXPECT_EQ(own, SegmentOf(count, ranks, (r + 1) % ranks));
        for (size_t i = own.begin; i < own.end; ++i) {
          EXPECT_EQ(owner[i], -1) << "element " << i << " owned twice";
          owner[i] = r;
        }
      }
      for (size_t i = 0; i < count; ++i) EXPECT_GE(owner[i], 0) << "element " << i;
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
  threads.clear();
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
  // Sharded state: a reduce-scatter bucket leaves each rank the sum of its segment of every
  // tensor (big ones by the ring's halves, small ones all-reduced); an all-gather bucket then
  // makes every rank's tensors the owners' segments, exactly, and counts no reduced bytes.
  for (int r = 0; r < 2; ++r) {
    for (size_t k = 0; k < sizes.size(); ++k) data[r][k] = Inputs(20 * r + k, sizes[k]);
  }
  for (size_t k = 0; k < sizes.size(); ++k) {
    for (size_t i = 0; i < sizes[k]; ++i) expected[k][i] = data[0][k][i] + data[1][k][i];
  }
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      ASSERT_TRUE(reducers[r]->BeginStep().ok());
      std::vector<absl::Span<float>> all;
      for (auto& t : data[r]) all.push_back(absl::MakeSpan(t));
      reducers[r]->Post({.tensors = all, .op = GradBucket::Op::kReduceScatter});
      EXPECT_TRUE(reducers[r]->Wait().ok());
      for (size_t k = 0; k < sizes.size(); ++k) {
        const ElementRange own = OwnedSegment(sizes[k], 2, r);
        for (size_t i = own.begin; i < own.end; ++i) {
          ASSERT_EQ(data[r][k][i], expected[k][i]) << "rank " << r << " tensor " << k;
        }
        // An update of its own segment; the rest becomes garbage the gather must replace.
        for (size_t i = 0; i < sizes[k]; ++i) {
          data[r][k][i] = own.begin <= i && i < own.end ? 2.0f * data[r][k][i] : 1e30f;
        }
      }
      reducers[r]->Post({.tensors = all, .op = GradBucket::Op::kAllGather});
      EXPECT_TRUE(reducers[r]->Wait().ok());
    });
  }
  for (auto& t : threads) t.join();
  threads.clear();
  for (int r = 0; r < 2; ++r) {
    for (size_t k = 0; k < sizes.size(); ++k) {
      for (size_t i = 0; i < sizes[k]; ++i) {
        ASSERT_EQ(data[r][k][i], 2.0f * expected[k][i]) << "rank " << r << " tensor " << k;
      }
    }
  }
  // Abort: the next step is refused, naming the abort.
  reducers[0]->Abort();
  const absl::Status s = reducers[0]->BeginStep();
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted) << s;
}

}  // namespace
}  // namespace tandem::worker
