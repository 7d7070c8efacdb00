// Peer recovery's decisions on the coordinator: when a failed run's survivors hold every
// stage, what they hold, and whom each worker of the next run asks first.
#include "coordinator/peer_recovery.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "common/spec.h"

namespace tandem::coordinator {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

v1::JobSpec Spec(int stages, int replicas, const std::string& extra = "") {
  auto spec =
      LoadJobSpecYaml(absl::StrCat("pipeline:\n  stages: ", stages, "\n  replicas: ", replicas,
                                   "\n  micro_batches: 4\n", extra));
  EXPECT_TRUE(spec.ok()) << spec.status();
  return *spec;
}

std::vector<WorkerRecord> Gang(int n) {
  std::vector<WorkerRecord> w(n);
  for (int i = 0; i < n; ++i) {
    w[i].id = absl::StrCat("w-", i);
    w[i].address = absl::StrCat("127.0.0.1:", 1000 + i);
  }
  return w;
}

TEST(PeerRecoveryTest, AppliesToReplicasWithWholeOptimizerStateOnly) {
  EXPECT_FALSE(PeerRecoveryApplies(Spec(2, 1)));
  EXPECT_TRUE(PeerRecoveryApplies(Spec(2, 2)));
  EXPECT_FALSE(PeerRecoveryApplies(Spec(2, 2, "optimizer:\n  shard_state: true\n")))
      << "each replica holds a segment of the moments";
}

TEST(PeerRecoveryTest, SurvivorsHoldEveryStageWhenEachPipelineRankHasOne) {
  const v1::JobSpec spec = Spec(2, 2);
  auto plan = PlanPipeline(spec, nullptr);
  ASSERT_TRUE(plan.ok()) << plan.status();
  // Gang ranks: replica 0 = {0, 1}, replica 1 = {2, 3}. Rank 3 (stage 1 of replica 1) died.
  std::string why;
  auto state = SurvivorsState(6, Gang(4), {false, false, false, true}, *plan, 2, &why);
  ASSERT_TRUE(state.has_value()) << why;
  EXPECT_EQ(state->step(), 6);
  ASSERT_EQ(state->holders_size(), 3);
  EXPECT_EQ(state->holders(0).worker_id(), "w-0");
  EXPECT_EQ(state->holders(2).address(), "127.0.0.1:1002");
  EXPECT_EQ(state->holders(1).layer_begin(0), plan->ranges[1].begin);
  EXPECT_EQ(state->holders(1).layer_end(0), plan->ranges[1].end);

  // Both replicas of stage 1 died: no one holds it.
  EXPECT_FALSE(SurvivorsState(6, Gang(4), {false, true, false, true}, *plan, 2, &why));
  EXPECT_THAT(why, HasSubstr("no replica of pipeline rank(s) 1 survived"));
  // Nothing trained or restored yet.
  EXPECT_FALSE(SurvivorsState(-1, Gang(4), {false, false, false, true}, *plan, 2, &why));
  EXPECT_THAT(why, HasSubstr("no state yet"));
  // A gang that is not R x P.
  EXPECT_FALSE(SurvivorsState(6, Gang(3), {false, false, false}, *plan, 2, &why));
}

TEST(PeerRecoveryTest, AWorkerAsksTheHoldersOfItsLayersFirst) {
  v1::PeerState state;
  auto add = [&](const std::string& address, int begin, int end) {
    v1::StateHolder* h = state.add_holders();
    h->set_address(address);
    h->add_layer_begin(begin);
    h->add_layer_end(end);
  };
  add("a", 0, 3);  // the first stage: also the tied embedding of the last
  add("b", 3, 6);
  add("c", 0, 3);
  EXPECT_THAT(PeerOrderFor(state, {{3, 6}}), ElementsAre("b", "a", "c"));
  EXPECT_THAT(PeerOrderFor(state, {{0, 2}}), ElementsAre("a", "c", "b"));
  // A re-planned stage across the old cut asks both.
  EXPECT_THAT(PeerOrderFor(state, {{2, 4}}), ElementsAre("a", "b", "c"));
}

// Holders outside the next gang (by worker id and address) are the ones told to drop.
TEST(PeerRecoveryTest, HoldersOutsideTheGangAreThoseNotInIt) {
  v1::PeerState state;
  for (int i = 0; i < 3; ++i) {
    v1::StateHolder* h = state.add_holders();
    h->set_worker_id(absl::StrCat("w-", i));
    h->set_address(absl::StrCat("127.0.0.1:", 1000 + i));
  }
  std::vector<WorkerRecord> gang(2);
  gang[0].id = "w-0";
  gang[0].address = "127.0.0.1:1000";
  gang[1].id = "w-2";
  gang[1].address = "127.0.0.1:1009";  // w-2 re-registered elsewhere: not the holder
  const std::vector<v1::StateHolder> out = HoldersOutside(state, gang);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].worker_id(), "w-1");
  EXPECT_EQ(out[1].worker_id(), "w-2");
  EXPECT_TRUE(HoldersOutside(v1::PeerState(), gang).empty());
}

}  // namespace
}  // namespace tandem::coordinator
