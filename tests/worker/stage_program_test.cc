// The stage-program checks and queries (worker/stage_program.h), without running a program.
#include "worker/stage_program.h"

#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "common/model_desc.h"
#include "tests/worker/pipeline_test_util.h"

namespace tandem::worker {
namespace {

using testing::MakePrograms;
using testing::TinyGptJob;
using testing::TinyJob;

// One mutation of a good program per case, and the words its error must contain.
TEST(ValidateStageProgramTest, RejectsBadPrograms) {
  const v1::JobSpec spec = TinyJob();
  const auto good = MakePrograms(spec, 2, "1f1b");
  ASSERT_TRUE(ValidateStageProgram(good[0]).ok());
  ASSERT_TRUE(ValidateStageProgram(good[1]).ok());
  struct Case {
    const char* name;
    std::function<void(v1::StageProgram&)> mutate;
    const char* expect;
  };
  const std::vector<Case> cases = {
      {"rank", [](auto& p) { p.set_rank(5); }, "rank 5"},
      {"job", [](auto& p) { p.clear_job_id(); }, "job_id"},
      {"layers", [](auto& p) { p.mutable_chunks(0)->set_layer_end(99); }, "layers"},
      {"embedding elsewhere", [](auto& p) { p.mutable_chunks(0)->set_layer_begin(1); },
       "embedding"},
      {"action stage", [](auto& p) { p.mutable_actions(0)->set_stage(1); },
       "stage 1 is not held by this worker"},
      {"no chunks", [](auto& p) { p.clear_chunks(); }, "holds no stage"},
      {"placement size", [](auto& p) { p.add_stage_ranks(0); }, "stage_ranks has 3 entries"},
      {"placement", [](auto& p) { p.set_stage_ranks(0, 1); }, "places it on rank 1"},
      {"W without I", [](auto& p) { p.mutable_actions(2)->set_kind(v1::ACTION_W); }, "depends on"},
      {"micro-batch", [](auto& p) { p.mutable_actions(0)->set_micro_batch(4); }, "micro-batch"},
      {"missing", [](auto& p) { p.mutable_actions()->RemoveLast(); }, "missing"},
      {"repeated", [](auto& p) { *p.add_actions() = p.actions(0); }, "repeated"},
      {"order", [](auto& p) { p.mutable_actions()->SwapElements(0, 1); }, "depends on"},
      {"unsupported kind",
       [](auto& p) { p.mutable_actions(0)->set_kind(v1::ACTION_KIND_UNSPECIFIED); },
       "not supported"},
      {"model", [](auto& p) { p.mutable_spec()->mutable_model()->set_d_model(-1); },
       "model.d_model"},
      {"vocab", [](auto& p) { p.mutable_spec()->mutable_model()->set_vocab_size(100); },
       "vocab_size"},
      {"micro_batch_size",
       [](auto& p) { p.mutable_spec()->mutable_pipeline()->set_micro_batch_size(0); },
       "micro_batch_size"},
  };
  for (const Case& c : cases) {
    v1::StageProgram p = good[0];
    c.mutate(p);
    const absl::Status s = ValidateStageProgram(p);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.name;
    EXPECT_NE(s.message().find(c.expect), std::string::npos) << c.name << ": " << s;
  }
  // A transfer that the last stage does not have.
  v1::StageProgram last = good[1];
  v1::Action* a = last.add_actions();
  a->set_stage(1);
  a->set_kind(v1::ACTION_SEND_F);
  EXPECT_NE(ValidateStageProgram(last).message().find("no such transfer"), std::string::npos);
}

// Recomputation (R): once, after the micro-batch's F and before its backward.
TEST(ValidateStageProgramTest, RecomputeComesBetweenForwardAndBackward) {
  v1::JobSpec spec = TinyJob();
  spec.mutable_pipeline()->set_recompute("full");
  const auto good = MakePrograms(spec, 2, "1f1b");
  ASSERT_EQ(good.size(), 2u);
  ASSERT_TRUE(ValidateStageProgram(good[0]).ok());
  ASSERT_TRUE(ValidateStageProgram(good[1]).ok());
  auto with_r_at = [](v1::StageProgram p, int index, int mb) {
    v1::Action r;
    r.set_stage(p.chunks(0).stage());
    r.set_kind(v1::ACTION_R);
    r.set_micro_batch(mb);
    auto* list = p.mutable_actions();
    list->Add(std::move(r));
    for (int i = list->size() - 1; i > index; --i) list->SwapElements(i, i - 1);
    return p;
  };
  const v1::StageProgram plain = MakePrograms(TinyJob(), 2, "1f1b")[1];
  // Stage 1's list: 1RECV_F0 1F0 1B0 1SEND_B0 ...
  EXPECT_TRUE(ValidateStageProgram(with_r_at(plain, 2, 0)).ok());
  EXPECT_NE(ValidateStageProgram(with_r_at(plain, 0, 0)).message().find("depends on"),
            std::string::npos);
  EXPECT_NE(ValidateStageProgram(with_r_at(plain, 3, 0)).message().find("after the micro-batch"),
            std::string::npos);
  EXPECT_NE(ValidateStageProgram(with_r_at(good[1], 3, 0)).message().find("repeated"),
            std::string::npos);
}

TEST(StageProgramQueriesTest, MicroBatchesOfFallsBackToTheSpec) {
  v1::StageProgram p = MakePrograms(TinyJob(), 2, "1f1b")[0];
  EXPECT_EQ(MicroBatchesOf(p), 4);
  p.set_micro_batches(0);
  p.mutable_spec()->mutable_pipeline()->set_micro_batches(6);
  EXPECT_EQ(MicroBatchesOf(p), 6);
}

// Only the workers holding the embedding or the head read the data.
TEST(StageProgramQueriesTest, OnlyTheEndsNeedTheCorpus) {
  const auto programs = MakePrograms(TinyJob(), 3, "gpipe");
  ASSERT_EQ(programs.size(), 3u);
  EXPECT_TRUE(StageNeedsCorpus(programs[0]));
  EXPECT_FALSE(StageNeedsCorpus(programs[1]));
  EXPECT_TRUE(StageNeedsCorpus(programs[2]));
  // In a V, rank 0 holds both ends.
  const auto v = MakePrograms(TinyJob(), 2, "zb_v");
  ASSERT_EQ(v.size(), 2u);
  EXPECT_TRUE(StageNeedsCorpus(v[0]));
  EXPECT_FALSE(StageNeedsCorpus(v[1]));
}

TEST(StageProgramQueriesTest, TransferPeersAreThePipelineNeighbours) {
  const auto three = MakePrograms(TinyJob(), 3, "gpipe");
  EXPECT_EQ(TransferPeers(three[0]), std::vector<int>({1}));
  EXPECT_EQ(TransferPeers(three[1]), std::vector<int>({0, 2}));
  EXPECT_EQ(TransferPeers(three[2]), std::vector<int>({1}));
  // Tied embeddings link the first and the last stage's ranks too.
  const auto tied = MakePrograms(TinyGptJob(true), 3, "gpipe");
  EXPECT_EQ(TransferPeers(tied[0]), std::vector<int>({1, 2}));
  EXPECT_EQ(TransferPeers(tied[2]), std::vector<int>({0, 1}));
  const auto untied = MakePrograms(TinyGptJob(false), 3, "gpipe");
  EXPECT_EQ(TransferPeers(untied[0]), std::vector<int>({1}));
}

// Per action, the index of the first receive after it.
TEST(StageProgramQueriesTest, NextReceivesPointsAtTheFollowingReceive) {
  v1::StageProgram p;
  for (v1::ActionKind k : {v1::ACTION_RECV_F, v1::ACTION_F, v1::ACTION_SEND_F, v1::ACTION_RECV_B,
                           v1::ACTION_B, v1::ACTION_RECV_F, v1::ACTION_F}) {
    p.add_actions()->set_kind(k);
  }
  EXPECT_EQ(NextReceives(p.actions()), std::vector<int>({3, 3, 3, 5, 5, -1, -1}));
  EXPECT_TRUE(NextReceives(v1::StageProgram().actions()).empty());
  // Every rank of a real program: each entry is a later receive, and none is skipped.
  for (const v1::StageProgram& prog : MakePrograms(TinyJob(), 3, "1f1b")) {
    const std::vector<int> next = NextReceives(prog.actions());
    ASSERT_EQ(next.size(), static_cast<size_t>(prog.actions_size()));
    for (int i = 0; i < prog.actions_size(); ++i) {
      int expected = -1;
      for (int j = i + 1; j < prog.actions_size() && expected < 0; ++j) {
        const v1::ActionKind k = prog.actions(j).kind();
        if (k == v1::ACTION_RECV_F || k == v1::ACTION_RECV_B) expected = j;
      }
      EXPECT_EQ(next[i], expected) << "rank " << prog.rank() << " action " << i;
    }
  }
}

}  // namespace
}  // namespace tandem::worker
