// Peer recovery's worker side without gRPC: the kept copy of a stage's state, and the fetch
// that restores a stage from its own copy and the workers that kept theirs, skipping (and
// discarding what came from) a worker that fails mid-transfer.
#include "worker/peer_state.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

namespace tandem::worker {
namespace {

using ::testing::HasSubstr;

StateTensor View(const std::string& name, const std::vector<float>& v) {
  return StateTensor{.name = name,
                     .dtype = "F32",
                     .shape = {static_cast<int64_t>(v.size())},
                     .data = v.data(),
                     .bytes = v.size() * sizeof(float)};
}

std::string Bytes(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

v1::CheckpointRef StateAfter(int64_t step, std::vector<std::string> peers) {
  v1::CheckpointRef r;
  r.set_job_id("job-1");
  r.set_step(step);
  for (auto& p : peers) r.add_peers(p);
  return r;
}

TEST(KeptStateTest, CopiesTheTensorsAndSelectsByName) {
  std::vector<float> a = {1, 2, 3}, b = {4};
  auto kept = KeptState::Copy("job-1", 7, {View("a", a), View("b", b)});
  ASSERT_TRUE(kept.ok()) << kept.status();
  a[0] = 100;  // a copy: the executor's memory may go
  EXPECT_TRUE((*kept)->Holds("job-1", 7));
  EXPECT_FALSE((*kept)->Holds("job-1", 6));
  EXPECT_FALSE((*kept)->Holds("job-2", 7));
  EXPECT_EQ((*kept)->bytes(), 16);
  const std::vector<StateTensor> got = (*kept)->Select({"b", "missing", "a"});
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].name, "b");
  EXPECT_EQ(got[1].name, "a");
  EXPECT_EQ(static_cast<const float*>(got[1].data)[0], 1.0f);
  EXPECT_EQ(got[1].shape, std::vector<int64_t>{3});
}

TEST(KeptStateTest, RefusesASegmentOfAShardedState) {
  std::vector<float> a = {1, 2};
  StateTensor t = View("a.exp_avg", a);
  t.shard = ElementRange{0, 2};
  auto kept = KeptState::Copy("job-1", 1, {t});
  EXPECT_EQ(kept.status().code(), absl::StatusCode::kFailedPrecondition);
}

// Two peers hold two stages; the first listed dies after sending part of what it holds.
TEST(FetchPeerStateTest, TakesEachTensorFromTheFirstWorkerThatHoldsItAndSkipsAFailedOne) {
  const std::vector<float> a = {1, 2}, b = {3}, c = {4, 5, 6};
  auto own = *KeptState::Copy("job-1", 4, {View("a", a)});
  std::vector<std::string> asked;
  PeerStateReader read = [&](const std::string& address, const v1::CheckpointRef& state,
                             const std::vector<std::string>& names,
                             std::map<std::string, std::string>* out) -> absl::Status {
    EXPECT_EQ(state.step(), 4);
    asked.push_back(address + ":" + std::to_string(names.size()));
    if (address == "dying") {
      (*out)["b"] = "partial";
      return absl::UnavailableError("connection reset");
    }
    if (address == "stage-1") {
      for (const auto& n : names) {
        if (n == "b") (*out)["b"] = Bytes(b);
        if (n == "c") (*out)["c"] = Bytes(c);
      }
    }
    return absl::OkStatus();  // "empty" holds none of them
  };
  std::map<std::string, std::string> out;
  ASSERT_TRUE(FetchPeerState(StateAfter(4, {"dying", "empty", "stage-1", "never"}), {"a", "b", "c"},
                             own.get(), read, &out)
                  .ok());
  EXPECT_EQ(out["a"], Bytes(a)) << "from its own kept state, not asked of anyone";
  EXPECT_EQ(out["b"], Bytes(b)) << "what the dying worker sent is discarded";
  EXPECT_EQ(out["c"], Bytes(c));
  EXPECT_THAT(asked, ::testing::ElementsAre("dying:2", "empty:2", "stage-1:2"))
      << "only the missing names, and no one after everything arrived";
}

TEST(FetchPeerStateTest, NoOneHoldingATensorIsUnavailableNamingIt) {
  const std::vector<float> a = {1, 2};
  // Its own state is of another step: unused.
  auto own = *KeptState::Copy("job-1", 3, {View("a", a), View("b", a)});
  PeerStateReader read = [&](const std::string&, const v1::CheckpointRef&,
                             const std::vector<std::string>&,
                             std::map<std::string, std::string>* out) -> absl::Status {
    return absl::FailedPreconditionError("keeps no state of job job-1 after step 5");
  };
  std::map<std::string, std::string> out;
  const absl::Status s =
      FetchPeerState(StateAfter(4, {"w-1", "w-2"}), {"a", "b"}, own.get(), read, &out);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("2 of 2 tensors (a first)"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("none of the 2 workers"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("2 of them failed"));
  // Without a reader only its own state can serve.
  out.clear();
  EXPECT_EQ(FetchPeerState(StateAfter(4, {"w-1"}), {"a"}, nullptr, nullptr, &out).code(),
            absl::StatusCode::kUnavailable);
  EXPECT_TRUE(FetchPeerState(StateAfter(3, {"w-1"}), {"a"}, own.get(), nullptr, &out).ok());
}

}  // namespace
}  // namespace tandem::worker
