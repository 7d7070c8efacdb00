// LinkProbe: two probes in one process over a real Gloo transport on 127.0.0.1, with an
// in-process rendezvous store standing in for the coordinator's.
#include "worker/link_probe.h"

#include <gloo/rendezvous/hash_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <future>
#include <string>
#include <thread>

#include "common/status_macros.h"
#include "tests/worker/cancellable_store.h"
#include "worker/transport/gloo_transport.h"

namespace tandem::worker {
namespace {

using std::chrono::milliseconds;
using testing::CancellableStore;

// Connects rank `rank` of a 2-rank Gloo transport under `prefix`, as the daemon does over the
// coordinator's rendezvous.
LinkConnector Connector(gloo::rendezvous::Store& store, const std::string& prefix, int rank) {
  return [&store, prefix,
          rank](const std::atomic<bool>& cancelled) -> absl::StatusOr<std::unique_ptr<Transport>> {
    gloo::rendezvous::PrefixStore prefixed(prefix, store);
    CancellableStore cancellable(prefixed, cancelled);
    GlooTransportOptions o;
    o.rank = rank;
    o.size = 2;
    o.hostname = "127.0.0.1";
    o.connect_timeout = milliseconds(10000);
    ASSIGN_OR_RETURN(auto t, GlooTransport::Connect(o, cancellable));
    return std::unique_ptr<Transport>(std::move(t));
  };
}

LinkProbeOptions Options(int rank, std::vector<int64_t> sizes, int repeats = 5,
                         milliseconds timeout = milliseconds(20000)) {
  LinkProbeOptions o;
  o.rank = rank;
  o.sizes = std::move(sizes);
  o.repeats = repeats;
  o.timeout = timeout;
  return o;
}

v1::ProbeLinkRequest Request() {
  v1::ProbeLinkRequest r;
  r.set_rendezvous_prefix("probe-1/");
  r.set_rank(1);
  r.add_sizes(4096);
  return r;
}

TEST(LinkProbeTest, BothEndsTimeEverySize) {
  gloo::rendezvous::HashStore store;
  // The largest is big enough (16 MiB: milliseconds on any loopback) that its transfer, not
  // the scheduler of a loaded machine, dominates its fastest round trip.
  const std::vector<int64_t> sizes = {4096, 1 << 16, 16 << 20};
  LinkProbe p0(Options(0, sizes)), p1(Options(1, sizes));
  auto f1 = std::async(std::launch::async, [&] { return p1.Run(Connector(store, "a/", 1)); });
  auto s0 = p0.Run(Connector(store, "a/", 0));
  auto s1 = f1.get();
  ASSERT_TRUE(s0.ok()) << s0.status();
  ASSERT_TRUE(s1.ok()) << s1.status();
  for (const auto* samples : {&s0->samples, &s1->samples}) {
    ASSERT_EQ(samples->size(), sizes.size());
    for (size_t i = 0; i < sizes.size(); ++i) {
      const v1::LinkSample& s = (*samples)[i];
      EXPECT_EQ(s.bytes(), sizes[i]);
      ASSERT_EQ(s.round_trip_seconds_size(), 5);
      for (double t : s.round_trip_seconds()) EXPECT_GT(t, 0.0);
      std::vector<double> trips(s.round_trip_seconds().begin(), s.round_trip_seconds().end());
      std::sort(trips.begin(), trips.end());
      EXPECT_DOUBLE_EQ(s.one_way_seconds(), trips[2] / 2);  // the median of 5, halved
      EXPECT_GT(s.one_way_seconds(), 0.0);
      EXPECT_LT(s.one_way_seconds(), 1.0);  // loopback
    }
    // 16 MiB takes longer than 4 KiB on any link. Compared by the fastest round trip: on a
    // loaded machine scheduling delays (milliseconds) can swamp a loopback median, but not
    // all five of the small size's trips and none of the large one's.
    auto fastest = [](const v1::LinkSample& s) {
      return *std::min_element(s.round_trip_seconds().begin(), s.round_trip_seconds().end());
    };
    EXPECT_GT(fastest((*samples)[2]), fastest((*samples)[0]));
    // And the timing is of the bytes: 16 MiB each way cannot cross faster than 100 GB/s (no
    // loopback of this decade moves memory that fast through the kernel's TCP stack).
    EXPECT_GT(fastest((*samples)[2]), 2.0 * (16 << 20) / 100e9);
  }
  EXPECT_EQ(s0->samples[0].rank(), 0);
  EXPECT_EQ(s1->samples[0].rank(), 1);
  EXPECT_TRUE(s0->allreduce_seconds.empty());  // not asked for
}

// The data-parallel ring timed after the messages: `repeats` runs on both ends, each at least
// as long as moving the bytes through a 100 GB/s copy twice.
TEST(LinkProbeTest, TimesTheAllReduceWhenAsked) {
  gloo::rendezvous::HashStore store;
  LinkProbeOptions o0 = Options(0, {4096}, 3), o1 = Options(1, {4096}, 3);
  o0.allreduce_bytes = o1.allreduce_bytes = int64_t{8} << 20;
  LinkProbe p0(o0), p1(o1);
  auto f1 = std::async(std::launch::async, [&] { return p1.Run(Connector(store, "ar/", 1)); });
  auto s0 = p0.Run(Connector(store, "ar/", 0));
  auto s1 = f1.get();
  ASSERT_TRUE(s0.ok()) << s0.status();
  ASSERT_TRUE(s1.ok()) << s1.status();
  for (const LinkProbeResult* r : {&*s0, &*s1}) {
    ASSERT_EQ(r->samples.size(), 1u);
    ASSERT_EQ(r->allreduce_seconds.size(), 3u);
    for (double t : r->allreduce_seconds) {
      EXPECT_GT(t, 2.0 * (8 << 20) / 100e9);
      EXPECT_LT(t, 30.0);
    }
  }
}

// A peer that never shows up: DEADLINE_EXCEEDED shortly after the timeout, naming the peer.
TEST(LinkProbeTest, MissingPeerTimesOut) {
  gloo::rendezvous::HashStore store;
  LinkProbe p0(Options(0, {4096}, 5, milliseconds(500)));
  const auto t0 = std::chrono::steady_clock::now();
  auto s = p0.Run(Connector(store, "alone/", 0));
  const auto waited = std::chrono::steady_clock::now() - t0;
  EXPECT_EQ(s.status().code(), absl::StatusCode::kDeadlineExceeded) << s.status();
  EXPECT_NE(s.status().message().find("peer rank 1"), std::string::npos) << s.status();
  EXPECT_GE(waited, milliseconds(500));
  EXPECT_LT(waited, milliseconds(2500));
  // The store is usable for the next probe (another prefix).
  LinkProbe a(Options(0, {100}, 1)), b(Options(1, {100}, 1));
  auto fb = std::async(std::launch::async, [&] { return b.Run(Connector(store, "next/", 1)); });
  EXPECT_TRUE(a.Run(Connector(store, "next/", 0)).ok());
  EXPECT_TRUE(fb.get().ok());
}

// A peer that connects and then stops answering: the timeout also bounds the transfers.
TEST(LinkProbeTest, SilentPeerTimesOut) {
  gloo::rendezvous::HashStore store;
  LinkProbe p0(Options(0, {4096}, 5, milliseconds(1000)));
  std::promise<void> release;
  std::thread silent([&] {
    auto t = Connector(store, "silent/", 1)(std::atomic<bool>(false));
    ASSERT_TRUE(t.ok()) << t.status();
    release.get_future().wait();  // connected, never answers
  });
  auto s = p0.Run(Connector(store, "silent/", 0));
  release.set_value();
  silent.join();
  EXPECT_EQ(s.status().code(), absl::StatusCode::kDeadlineExceeded) << s.status();
  EXPECT_NE(s.status().message().find("4096-byte"), std::string::npos) << s.status();
}

TEST(LinkProbeTest, CancelStopsAWaitingProbe) {
  gloo::rendezvous::HashStore store;
  LinkProbe p0(Options(0, {4096}, 5, milliseconds(30000)));
  auto f = std::async(std::launch::async, [&] { return p0.Run(Connector(store, "c/", 0)); });
  std::this_thread::sleep_for(milliseconds(200));
  const auto t0 = std::chrono::steady_clock::now();
  p0.Cancel();
  auto s = f.get();
  EXPECT_EQ(s.status().code(), absl::StatusCode::kAborted) << s.status();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, milliseconds(1000));
}

TEST(LinkProbeTest, OptionsApplyDefaultsAndNameBadFields) {
  auto o = LinkProbeOptionsFrom(Request());
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->rank, 1);
  EXPECT_EQ(o->sizes, std::vector<int64_t>{4096});
  EXPECT_EQ(o->repeats, kDefaultProbeRepeats);
  EXPECT_EQ(o->timeout, kDefaultProbeTimeout);
  v1::ProbeLinkRequest max = Request();
  max.set_sizes(0, kMaxProbeBytes);
  max.set_repeats(7);
  max.set_timeout_ms(1500);
  o = LinkProbeOptionsFrom(max);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->repeats, 7);
  EXPECT_EQ(o->timeout, milliseconds(1500));
  EXPECT_EQ(o->device, "cpu");  // the default data plane
  max.set_device("cuda");
  o = LinkProbeOptionsFrom(max);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->device, "cuda");
  EXPECT_EQ(o->transport, "nccl");  // the default between cuda workers
  max.set_transport("gloo");        // two workers on one GPU: host-staged
  o = LinkProbeOptionsFrom(max);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->transport, "gloo");

  auto refused = [](const v1::ProbeLinkRequest& r, const std::string& field) {
    absl::Status s = LinkProbeOptionsFrom(r).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << field;
    EXPECT_NE(s.message().find(field), std::string::npos) << s;
  };
  v1::ProbeLinkRequest r = Request();
  r.clear_rendezvous_prefix();
  refused(r, "rendezvous_prefix");
  r = Request();
  r.set_device("tpu");
  refused(r, "device is \"tpu\"");
  r = Request();
  r.set_device("cuda");
  r.set_transport("mpi");
  refused(r, "transport is \"mpi\"");
  r = Request();
  r.set_transport("gloo");  // a cpu probe is Gloo already
  refused(r, "applies to device \"cuda\" only");
  r = Request();
  r.set_allreduce_bytes(-4);
  refused(r, "allreduce_bytes is -4");
  r.set_allreduce_bytes(kMaxProbeBytes + 4);
  refused(r, "allreduce_bytes");
  r.set_allreduce_bytes(1 << 20);
  r.set_device("cuda");
  refused(r, "allreduce_bytes applies to device \"cpu\" only");
  r = Request();
  r.set_allreduce_bytes(1001);  // whole floats
  o = LinkProbeOptionsFrom(r);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->allreduce_bytes, 1000);
  r = Request();
  r.set_rank(2);
  refused(r, "rank");
  r.set_rank(-1);
  refused(r, "rank");
  r = Request();
  r.clear_sizes();
  refused(r, "sizes");
  for (int i = 0; i <= kMaxProbeSizes; ++i) r.add_sizes(64);
  refused(r, "sizes has 17");
  r = Request();
  r.add_sizes(0);
  refused(r, "sizes[1]");
  r.set_sizes(1, -4);
  refused(r, "sizes[1]");
  r.set_sizes(1, kMaxProbeBytes + 1);
  refused(r, "sizes[1]");
  r = Request();
  r.set_repeats(-1);
  refused(r, "repeats");
  r.set_repeats(kMaxProbeRepeats + 1);
  refused(r, "repeats");
  r = Request();
  r.set_timeout_ms(-5);
  refused(r, "timeout_ms");
  r.set_timeout_ms(kMaxProbeTimeout.count() + 1);
  refused(r, "timeout_ms");
}

}  // namespace
}  // namespace tandem::worker
