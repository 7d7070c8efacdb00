// The stage executor in-process: partition invariance (the project's main correctness test),
// schedule invariance and abort (the program checks: stage_program_test.cc).
#include "worker/executor.h"

#include <cblas.h>
#include <gloo/rendezvous/hash_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <future>
#include <iostream>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/grad_clip.h"
#include "common/pipeline_plan.h"
#include "common/schedule_check.h"
#include "common/spec.h"
#include "tests/worker/pipeline_test_util.h"
#include "tests/worker/transport_test_util.h"
#include "worker/cpu_stage_compute.h"
#include "worker/profiler.h"
#include "worker/transport/gloo_transport.h"

namespace tandem::worker {
namespace {

using testing::MakePrograms;
using testing::TinyJob;

constexpr int kSteps = 10;

Dataset DataOf(const v1::JobSpec& spec) {
  return *LoadDataset(spec, ".", TrainingWindow(spec.model()));
}

// Builds one executor per stage (Gloo over one HashStore when there are several), runs
// kSteps steps on all of them in parallel threads, and returns the last stage's losses.
// `wrap`, when set, decorates each rank's transport; `concurrent_chunks` lets the CPU compute
// run two chunks at once (CpuStageCompute::AllowConcurrentChunks: overlapped pairs run so).
using TransportWrapper = std::function<std::unique_ptr<Transport>(int, std::unique_ptr<Transport>)>;
std::vector<double> Train(const v1::JobSpec& spec, int stages, const std::string& schedule,
                          std::vector<v1::StepReport>* stage0_reports = nullptr, int steps = kSteps,
                          int chunks = 0, const TransportWrapper& wrap = {},
                          bool concurrent_chunks = false, const testing::ScheduleEdit& edit = {}) {
  const auto programs = MakePrograms(spec, stages, schedule, "job-1", chunks, edit);
  if (programs.empty()) return {};
  // The worker holding the last stage reports the loss (rank 0 in a V).
  const int loss_rank = programs[0].stage_ranks(programs[0].num_stages() - 1);
  const Dataset data = DataOf(spec);
  gloo::rendezvous::HashStore store;
  std::vector<std::unique_ptr<StageExecutor>> executors(stages);
  std::vector<std::thread> threads;
  for (int s = 0; s < stages; ++s) {
    threads.emplace_back([&, s] {
      std::unique_ptr<Transport> transport;
      if (stages > 1) {
        GlooTransportOptions o;
        o.rank = s;
        o.size = stages;
        o.hostname = "127.0.0.1";
        o.op_timeout = std::chrono::milliseconds(20000);
        auto t = GlooTransport::Connect(o, store);
        ASSERT_TRUE(t.ok()) << t.status();
        transport = *std::move(t);
        if (wrap) transport = wrap(s, std::move(transport));
      }
      absl::StatusOr<std::unique_ptr<StageExecutor>> ex;
      if (concurrent_chunks) {
        auto compute =
            CpuStageCompute::Create(programs[s], StageExecutor::MicroBatchSlots(programs[s]));
        ASSERT_TRUE(compute.ok()) << compute.status();
        (*compute)->AllowConcurrentChunks();
        ex = StageExecutor::Create(programs[s], data, std::move(transport), *std::move(compute));
      } else {
        ex = StageExecutor::Create(programs[s], data, std::move(transport));
      }
      ASSERT_TRUE(ex.ok()) << ex.status();
      executors[s] = *std::move(ex);
    });
  }
  for (auto& t : threads) t.join();
  threads.clear();
  for (const auto& e : executors) {
    if (e == nullptr) return {};
  }
  std::vector<double> losses;
  for (int step = 0; step < steps; ++step) {
    std::vector<absl::StatusOr<v1::StepReport>> reports(stages, absl::UnknownError("not run"));
    for (int s = 0; s < stages; ++s) {
      threads.emplace_back([&, s] { reports[s] = executors[s]->RunStep(step); });
    }
    for (auto& t : threads) t.join();
    threads.clear();
    double norm_sq = 0.0;
    for (int s = 0; s < stages; ++s) {
      EXPECT_TRUE(reports[s].ok()) << reports[s].status();
      if (!reports[s].ok()) return {};
      EXPECT_EQ(reports[s]->has_loss(), s == loss_rank);
      EXPECT_TRUE(reports[s]->grads_finite());
      norm_sq += reports[s]->grad_norm_sq();
    }
    // As the coordinator does: clip by the global norm over all stages.
    const float scale = ClipScale(std::sqrt(norm_sq), spec.optimizer().grad_clip());
    for (int s = 0; s < stages; ++s) {
      absl::Status applied = executors[s]->ApplyStep(step, spec.optimizer().lr(), scale);
      EXPECT_TRUE(applied.ok()) << applied;
    }
    losses.push_back(reports[loss_rank]->loss());
    if (stage0_reports != nullptr) stage0_reports->push_back(*reports[0]);
  }
  return losses;
}

void ExpectSameLosses(const std::vector<double>& a, const std::vector<double>& b, double rel,
                      int steps = kSteps) {
  ASSERT_EQ(a.size(), static_cast<size_t>(steps));
  ASSERT_EQ(b.size(), static_cast<size_t>(steps));
  for (int i = 0; i < steps; ++i) {
    EXPECT_NEAR(a[i], b[i], rel * std::abs(a[i])) << "step " << i;
  }
}

class ExecutorTest : public ::testing::Test {
 protected:
  void SetUp() override { openblas_set_num_threads(1); }
};

TEST_F(ExecutorTest, PartitionInvariance) {
  const v1::JobSpec spec = TinyJob();
  const std::vector<double> one = Train(spec, 1, "1f1b");
  const std::vector<double> two = Train(spec, 2, "1f1b");
  // Same arithmetic on both partitions; only float reassociation may differ.
  ExpectSameLosses(one, two, 1e-5);
  // Learning: from about ln 256 = 5.55 at init, well down after 10 steps.
  ASSERT_EQ(one.size(), static_cast<size_t>(kSteps));
  EXPECT_NEAR(one[0], std::log(256.0), 0.1);
  EXPECT_LT(one.back(), one.front() - 1.0);
}

TEST_F(ExecutorTest, ScheduleAndStageCountInvariance) {
  const v1::JobSpec spec = TinyJob();
  const std::vector<double> ref = Train(spec, 2, "1f1b");
  // GPipe runs the backwards in reverse order: gradients are summed in another order.
  ExpectSameLosses(ref, Train(spec, 2, "gpipe"), 1e-5);
  ExpectSameLosses(ref, Train(spec, 4, "1f1b"), 1e-5);
}

TEST_F(ExecutorTest, MicroBatchSplitInvariance) {
  v1::JobSpec spec = TinyJob();
  const std::vector<double> ref = Train(spec, 2, "1f1b");
  // The same global batch of 32 as 2 x 16: the same samples; GEMMs of another height round
  // differently, and AdamW amplifies tiny gradient differences a little.
  spec.mutable_pipeline()->set_micro_batch_size(16);
  spec.mutable_pipeline()->set_micro_batches(2);
  ExpectSameLosses(ref, Train(spec, 2, "1f1b"), 1e-4);
}

// The main correctness test for GPT: P in {1, 2, 4} and M in {1, 4, 8} over the same global
// batch of 8 sequences give the same 20 losses, with tied and untied embeddings. Same P and M
// with another schedule is bit-identical; another M changes GEMM heights (float
// reassociation), which AdamW amplifies slightly: relative tolerance 1e-5.
TEST_F(ExecutorTest, GptPartitionInvarianceAcrossStagesAndMicroBatches) {
  constexpr int kGptSteps = 20;
  for (bool tied : {true, false}) {
    v1::JobSpec spec = testing::TinyGptJob(tied);
    const std::vector<double> ref = Train(spec, 1, "1f1b", nullptr, kGptSteps);
    ASSERT_EQ(ref.size(), static_cast<size_t>(kGptSteps));
    EXPECT_NEAR(ref[0], std::log(256.0), 0.2);
    EXPECT_LT(ref.back(), ref.front() - 0.5) << "tied " << tied;
    for (int m : {1, 4, 8}) {
      spec.mutable_pipeline()->set_micro_batch_size(8 / m);
      spec.mutable_pipeline()->set_micro_batches(m);
      for (int p : {1, 2, 4}) {
        SCOPED_TRACE(absl::StrCat("tied ", tied, " P ", p, " M ", m));
        ExpectSameLosses(ref, Train(spec, p, m >= p ? "1f1b" : "gpipe", nullptr, kGptSteps), 1e-5,
                         kGptSteps);
      }
    }
  }
}

// Every schedule trains the same GPT to the same losses: interleaved and V-shaped placements
// (several stages per worker, local hand-offs, the tied embedding on one worker in a V) and the
// split backward (I then W) compute the same gradients; only the order in which micro-batches'
// gradients are summed differs.
TEST_F(ExecutorTest, GptEverySchedulePartitionInvariance) {
  constexpr int kGptSteps = 8;
  for (bool tied : {true, false}) {
    v1::JobSpec spec = testing::TinyGptJob(tied);
    spec.mutable_pipeline()->set_micro_batch_size(2);
    spec.mutable_pipeline()->set_micro_batches(4);
    const std::vector<double> ref = Train(spec, 1, "1f1b", nullptr, kGptSteps);
    ASSERT_EQ(ref.size(), static_cast<size_t>(kGptSteps));
    for (const char* schedule :
         {"gpipe", "1f1b", "interleaved_1f1b", "zb_h1", "zb_v", "looped_bfs", "interleaved_zb",
          "zb_h2", "v_half", "v_min", "dualpipe_v", "zb_auto"}) {
      SCOPED_TRACE(absl::StrCat("tied ", tied, " ", schedule));
      ExpectSameLosses(ref, Train(spec, 2, schedule, nullptr, kGptSteps), 1e-5, kGptSteps);
    }
    // One worker running the split backward of its single stage.
    ExpectSameLosses(ref, Train(spec, 1, "zb_h1", nullptr, kGptSteps), 1e-5, kGptSteps);
  }
}

// The main correctness test for llama, as for GPT: P in {1, 2, 4} x M in {1, 4, 8} over the
// same global batch of 8 sequences give the same 20 losses as one worker, tied and untied;
// relative tolerance 1e-5 (another M changes GEMM heights: float reassociation).
TEST_F(ExecutorTest, LlamaPartitionInvarianceAcrossStagesAndMicroBatches) {
  constexpr int kLlamaSteps = 20;
  for (bool tied : {false, true}) {
    v1::JobSpec spec = testing::TinyLlamaJob(tied);
    const std::vector<double> ref = Train(spec, 1, "1f1b", nullptr, kLlamaSteps);
    ASSERT_EQ(ref.size(), static_cast<size_t>(kLlamaSteps));
    EXPECT_NEAR(ref[0], std::log(256.0), 0.2);
    EXPECT_LT(ref.back(), ref.front() - 0.5) << "tied " << tied;
    for (int m : {1, 4, 8}) {
      spec.mutable_pipeline()->set_micro_batch_size(8 / m);
      spec.mutable_pipeline()->set_micro_batches(m);
      for (int p : {1, 2, 4}) {
        SCOPED_TRACE(absl::StrCat("tied ", tied, " P ", p, " M ", m));
        ExpectSameLosses(ref, Train(spec, p, m >= p ? "1f1b" : "gpipe", nullptr, kLlamaSteps), 1e-5,
                         kLlamaSteps);
      }
    }
  }
}

// Every schedule trains the same llama to the same 20 losses on two and four workers:
// interleaved and V placements (two stages per worker; in a V the tied embedding and head on
// one worker) and the split backward (RoPE, GQA and SwiGLU's I and W passes).
TEST_F(ExecutorTest, LlamaEverySchedulePartitionInvariance) {
  constexpr int kLlamaSteps = 20;
  for (bool tied : {false, true}) {
    v1::JobSpec spec = testing::TinyLlamaJob(tied);
    spec.mutable_pipeline()->set_micro_batch_size(1);
    spec.mutable_pipeline()->set_micro_batches(8);
    const std::vector<double> ref = Train(spec, 1, "1f1b", nullptr, kLlamaSteps);
    ASSERT_EQ(ref.size(), static_cast<size_t>(kLlamaSteps));
    for (int p : {2, 4}) {
      for (const char* schedule :
           {"gpipe", "1f1b", "interleaved_1f1b", "zb_h1", "zb_v", "looped_bfs", "interleaved_zb",
            "zb_h2", "v_half", "v_min", "dualpipe_v", "zb_auto"}) {
        SCOPED_TRACE(absl::StrCat("tied ", tied, " P ", p, " ", schedule));
        ExpectSameLosses(ref, Train(spec, p, schedule, nullptr, kLlamaSteps), 1e-5, kLlamaSteps);
      }
    }
    ExpectSameLosses(ref, Train(spec, 1, "zb_h1", nullptr, kLlamaSteps), 1e-5, kLlamaSteps);
  }
}

// A schedule torch 2.15 exported (ScheduleDualPipeV for 4 ranks and 8 micro-batches, in its
// compute_comms CSV format with overlapped pairs: tests/common/testdata) imports through
// pipeline.schedule_csv and trains the same llama to the same 20 losses as 1F1B, the pairs run
// one action after the other.
TEST_F(ExecutorTest, TorchDualPipeVCsvTrainsLike1F1B) {
  constexpr int kLlamaSteps = 20;
  std::ifstream in(std::string(TANDEM_SOURCE_DIR) +
                   "/tests/common/testdata/torch_2_15_0_dualpipe_v_P4_M8.csv");
  ASSERT_TRUE(in.good());
  std::stringstream csv;
  csv << in.rdbuf();
  ASSERT_NE(csv.str().find("OVERLAP_F_B"), std::string::npos);
  v1::JobSpec spec = testing::TinyLlamaJob(/*tied=*/true);
  spec.mutable_pipeline()->set_micro_batch_size(1);
  spec.mutable_pipeline()->set_micro_batches(8);
  const std::vector<double> ref = Train(spec, 4, "1f1b", nullptr, kLlamaSteps);
  ASSERT_EQ(ref.size(), static_cast<size_t>(kLlamaSteps));
  spec.mutable_pipeline()->set_schedule_csv(csv.str());
  const auto programs = MakePrograms(spec, 4, "1f1b");
  ASSERT_EQ(programs.size(), 4u);
  EXPECT_EQ(programs[0].num_stages(), 8);
  int pairs = 0;
  for (const v1::Action& a : programs[0].actions()) pairs += a.overlap_with_next() ? 1 : 0;
  EXPECT_GT(pairs, 0);
  ExpectSameLosses(ref, Train(spec, 4, "1f1b", nullptr, kLlamaSteps), 1e-5, kLlamaSteps);
}

// A transport that records the peers of every transfer, for TransferPeers.
class PeerRecorder final : public testing::ForwardingTransport {
 public:
  PeerRecorder(std::unique_ptr<Transport> inner, std::set<int>* sent, std::set<int>* received)
      : ForwardingTransport(std::move(inner)), sent_(sent), received_(received) {}
  absl::Status PostSend(int peer, uint64_t tag, const void* data, size_t bytes) override {
    sent_->insert(peer);
    return ForwardingTransport::PostSend(peer, tag, data, bytes);
  }
  absl::Status Recv(int peer, uint64_t tag, void* data, size_t bytes) override {
    received_->insert(peer);
    return ForwardingTransport::Recv(peer, tag, data, bytes);
  }
  absl::Status PostRecv(int peer, uint64_t tag, void* data, size_t bytes) override {
    received_->insert(peer);
    return ForwardingTransport::PostRecv(peer, tag, data, bytes);
  }
  absl::Status SendRecv(int peer, uint64_t tag, const void* send, void* recv,
                        size_t bytes) override {
    sent_->insert(peer);
    received_->insert(peer);
    return inner().SendRecv(peer, tag, send, recv, bytes);
  }

 private:
  std::set<int>* sent_;
  std::set<int>* received_;
};

// DualPipeV's overlapped pairs (F of one chunk with the backward of the other) run at the same
// time where the compute allows two chunks at once, as the CUDA backend does with a stream per
// chunk: each pair's two actions start together, and the losses are bit for bit those of the
// same program run one action after the other.
TEST_F(ExecutorTest, OverlappedPairsRunAtOnceWhereTheComputeAllowsAndChangeNothing) {
  v1::JobSpec spec = testing::TinyGptJob(/*tied=*/true);
  spec.mutable_model()->set_n_layer(6);  // 8 layers: 2 workers x 2 chunks
  spec.mutable_pipeline()->set_micro_batch_size(2);
  spec.mutable_pipeline()->set_micro_batches(8);
  const auto programs = MakePrograms(spec, 2, "dualpipe_v");
  ASSERT_EQ(programs.size(), 2u);
  std::vector<int> pairs;  // rank 0's actions that start an overlapped pair
  for (int i = 0; i < programs[0].actions_size(); ++i) {
    if (programs[0].actions(i).overlap_with_next()) pairs.push_back(i);
  }
  ASSERT_FALSE(pairs.empty());
  std::vector<v1::StepReport> one_by_one, at_once;
  const std::vector<double> want = Train(spec, 2, "dualpipe_v", &one_by_one, 3);
  const int64_t racy_before = CpuStageCompute::ReadsOfARunningChunk();
  const std::vector<double> got = Train(spec, 2, "dualpipe_v", &at_once, 3, 0, {}, true);
  ExpectSameLosses(want, got, 0.0, 3);
  // The executor never asked for a chunk's saved bytes while the other thread ran that chunk
  // (a pair's handovers are accounted after both actions end).
  EXPECT_EQ(CpuStageCompute::ReadsOfARunningChunk(), racy_before);
  auto timing = [](const v1::StepReport& r, int index) {
    for (const v1::ActionTiming& t : r.timings()) {
      if (t.index() == index) return t;
    }
    ADD_FAILURE() << "no timing for action " << index;
    return v1::ActionTiming();
  };
  for (int i : pairs) {
    EXPECT_GE(timing(one_by_one[1], i + 1).start_us(), timing(one_by_one[1], i).end_us()) << i;
    EXPECT_EQ(timing(at_once[1], i + 1).start_us(), timing(at_once[1], i).start_us()) << i;
  }
}

// TransferPeers names exactly the ranks each worker's executor sends to and receives from, on
// every schedule and placement (the NCCL transport connects only those pairs), and is
// symmetric.
TEST_F(ExecutorTest, TransferPeersAreTheRanksTheExecutorTalksTo) {
  for (bool tied : {true, false}) {
    v1::JobSpec spec = testing::TinyGptJob(tied);
    spec.mutable_model()->set_n_layer(6);  // 8 layers: 8 stages of 4 workers x 2 chunks
    spec.mutable_pipeline()->set_micro_batch_size(2);
    spec.mutable_pipeline()->set_micro_batches(4);
    for (const char* schedule : {"gpipe", "1f1b", "interleaved_1f1b", "zb_h1", "zb_v", "looped_bfs",
                                 "interleaved_zb", "zb_h2", "v_half", "v_min", "zb_auto"}) {
      for (int stages : {2, 3, 4}) {
        if (std::string(schedule) == "interleaved_1f1b" && stages == 3) continue;  // M % P
        SCOPED_TRACE(absl::StrCat("tied ", tied, " ", schedule, " P ", stages));
        const auto programs = MakePrograms(spec, stages, schedule);
        ASSERT_EQ(programs.size(), static_cast<size_t>(stages));
        std::vector<std::set<int>> sent(stages), received(stages);
        const TransportWrapper wrap = [&](int rank, std::unique_ptr<Transport> t) {
          return std::make_unique<PeerRecorder>(std::move(t), &sent[rank], &received[rank]);
        };
        ASSERT_EQ(Train(spec, stages, schedule, nullptr, 1, 0, wrap).size(), 1u);
        for (int r = 0; r < stages; ++r) {
          const std::vector<int> peers = TransferPeers(programs[r]);
          std::set<int> used = sent[r];
          used.insert(received[r].begin(), received[r].end());
          EXPECT_EQ(std::set<int>(peers.begin(), peers.end()), used) << "rank " << r;
          EXPECT_TRUE(std::is_sorted(peers.begin(), peers.end()));
          for (int p : peers) {
            const std::vector<int> back = TransferPeers(programs[p]);
            EXPECT_NE(std::find(back.begin(), back.end(), r), back.end()) << r << " <-> " << p;
          }
        }
      }
    }
  }
  // One worker: no peers.
  EXPECT_TRUE(TransferPeers(MakePrograms(testing::TinyGptJob(true), 1, "1f1b")[0]).empty());
}

// The split backward frees what only I needed at I: the peak live bytes of ZB-H1 stay at most
// 1F1B's and GPipe's grow with M.
TEST_F(ExecutorTest, PeakActivationBytesFollowTheSchedule) {
  v1::JobSpec spec = testing::TinyGptJob(/*tied=*/false);
  spec.mutable_pipeline()->set_micro_batch_size(1);
  spec.mutable_pipeline()->set_micro_batches(8);
  auto peak = [&](const char* schedule) {
    std::vector<v1::StepReport> reports;
    Train(spec, 2, schedule, &reports, 1);
    return reports.empty() ? int64_t{0} : reports[0].peak_activation_bytes();
  };
  const int64_t gpipe = peak("gpipe"), ofob = peak("1f1b"), zbh1 = peak("zb_h1");
  EXPECT_GT(gpipe, 3 * ofob);  // 8 micro-batches live against 2
  EXPECT_LE(zbh1, ofob + ofob / 2);
  EXPECT_GT(ofob, 0);
}

// The recomputation tests' job: a tiny gpt (tied) or llama (untied) of 8 layers, 2 chunks on
// each of 4 workers at the most, 4 micro-batches of 2.
v1::JobSpec RecomputationJob(const std::string& arch) {
  v1::JobSpec spec =
      arch == "gpt" ? testing::TinyGptJob(/*tied=*/true) : testing::TinyLlamaJob(/*tied=*/false);
  spec.mutable_model()->set_n_layer(6);
  spec.mutable_pipeline()->set_micro_batch_size(2);
  spec.mutable_pipeline()->set_micro_batches(4);
  return spec;
}

// Activation recomputation (pipeline.recompute: full) changes no loss: every F keeps only its
// layers' inputs and the backward after each R re-runs each layer's forward with saving just
// before that layer's backward, so the backward (B, or I then W) sees the same activations. Every
// schedule, P in {1, 2, 4}, gpt and llama, 20 steps, within 1e-6 relative; on the CPU bit for bit
// (the same arithmetic).
TEST_F(ExecutorTest, FullRecomputationChangesNoLoss) {
  constexpr int kRecomputeSteps = 20;
  for (const char* arch : {"gpt", "llama"}) {
    v1::JobSpec spec = RecomputationJob(arch);
    for (const char* schedule : {"gpipe", "1f1b", "interleaved_1f1b", "zb_h1", "zb_v"}) {
      for (int p : {1, 2, 4}) {
        SCOPED_TRACE(absl::StrCat(arch, " ", schedule, " P ", p));
        v1::JobSpec full = spec;
        full.mutable_pipeline()->set_recompute("full");
        // The plan has an R before every backward.
        const auto programs = MakePrograms(full, p, schedule);
        ASSERT_EQ(programs.size(), static_cast<size_t>(p));
        int rs = 0;
        for (const v1::StageProgram& prog : programs) {
          for (const v1::Action& a : prog.actions()) rs += a.kind() == v1::ACTION_R ? 1 : 0;
        }
        EXPECT_EQ(rs, 4 * programs[0].num_stages());
        const std::vector<double> plain = Train(spec, p, schedule, nullptr, kRecomputeSteps);
        const std::vector<double> recomputed = Train(full, p, schedule, nullptr, kRecomputeSteps);
        ExpectSameLosses(plain, recomputed, 1e-6, kRecomputeSteps);
        EXPECT_EQ(plain, recomputed);  // bit for bit on the CPU
      }
    }
  }
}

// A plan recomputes only the micro-batches memory needs (DropRecomputation) and may run an R
// ahead of its backward, where it recomputes the whole stage at once (PlaceRecomputation), so a
// stage mixes micro-batches that keep their F's activations, recompute inside the backward and
// recompute early. None changes a loss: the full-recomputation plan of 1f1b, interleaved 1f1b,
// zb_h1 and zb_v, P in {2, 4}, gpt and llama, with the R's of odd micro-batches dropped and
// every micro-batch 0's R moved right after its F (and the sends after it), trains bit for bit
// as the plain job over 20 steps.
TEST_F(ExecutorTest, RecomputingSomeMicroBatchesEarlyOrInsideTheirBackwardsChangesNoLoss) {
  constexpr int kRecomputeSteps = 20;
  const testing::ScheduleEdit mix = [](Schedule* s) {
    for (std::vector<Action>& list : s->program) {
      std::vector<Action> out;
      for (const Action& a : list) {
        if (a.kind == v1::ACTION_R && a.micro_batch % 2 == 1) continue;  // dropped
        if (a.kind == v1::ACTION_R && a.micro_batch == 0) continue;      // placed below
        out.push_back(a);
        if (a.kind == v1::ACTION_F && a.micro_batch == 0) {
          // After the F (or the overlapped pair holding it) and the sends that follow it.
          Action r = a;
          r.kind = v1::ACTION_R;
          r.overlap_with_next = false;
          out.push_back(r);
        }
      }
      // Keep the R after any sends its F's position is followed by: move it past them.
      for (size_t i = 0; i + 1 < out.size(); ++i) {
        if (out[i].kind == v1::ACTION_R && out[i].micro_batch == 0 &&
            (out[i + 1].kind == v1::ACTION_SEND_F || out[i + 1].kind == v1::ACTION_SEND_B)) {
          std::swap(out[i], out[i + 1]);
        }
      }
      list = std::move(out);
    }
    const absl::Status valid = ValidateSchedule(*s);
    EXPECT_TRUE(valid.ok()) << valid;
  };
  int trained = 0;
  for (const char* arch : {"gpt", "llama"}) {
    const v1::JobSpec spec = RecomputationJob(arch);
    v1::JobSpec full = spec;
    full.mutable_pipeline()->set_recompute("full");
    for (const char* schedule : {"1f1b", "interleaved_1f1b", "zb_h1", "zb_v"}) {
      for (int p : {2, 4}) {
        SCOPED_TRACE(absl::StrCat(arch, " ", schedule, " P ", p));
        const auto programs = MakePrograms(full, p, schedule, "job-1", 0, mix);
        ASSERT_EQ(programs.size(), static_cast<size_t>(p));
        int rs = 0, early = 0;
        for (const v1::StageProgram& prog : programs) {
          std::vector<Action> actions;
          for (const v1::Action& a : prog.actions()) actions.push_back(FromProto(a));
          const std::vector<bool> inside = RecomputeAtBackward(actions);
          for (size_t i = 0; i < actions.size(); ++i) {
            if (actions[i].kind != v1::ACTION_R) continue;
            ++rs;
            early += inside[i] ? 0 : 1;
          }
        }
        // Micro-batches 0 and 2 of the 4 on every stage; 0's early except where its backward
        // follows its F directly (the last stage).
        EXPECT_EQ(rs, 2 * programs[0].num_stages());
        EXPECT_GE(early, programs[0].num_stages() - 1);
        EXPECT_LE(early, programs[0].num_stages());
        const std::vector<double> plain = Train(spec, p, schedule, nullptr, kRecomputeSteps);
        const std::vector<double> mixed =
            Train(full, p, schedule, nullptr, kRecomputeSteps, 0, {}, false, mix);
        ExpectSameLosses(plain, mixed, 1e-6, kRecomputeSteps);
        EXPECT_EQ(plain, mixed);  // bit for bit on the CPU
        ++trained;
      }
    }
  }
  EXPECT_EQ(trained, 2 * 4 * 2);
}

// The measured peak of stage 0's live activation bytes with and without full recomputation
// follows the simulator's memory model (common/schedule_check.h) and the hand count: without
// recomputation a micro-batch holds the stage's whole working set from F to its backward (as
// measured with one micro-batch in flight); with it, from F to its backward only its layers'
// inputs (the per-layer checkpoints: the tokens for the embedding, a (B, T, C) float tensor
// for each block), and inside the backward, which recomputes one layer at a time, one block's
// working set ((16 C + NH T) floats per token, worker/model/gpt.h) beside them.
TEST_F(ExecutorTest, FullRecomputationPeakBytesDropAsPredicted) {
  v1::JobSpec spec = testing::TinyGptJob(/*tied=*/false);
  spec.mutable_model()->set_n_layer(6);
  spec.mutable_pipeline()->set_micro_batch_size(2);
  auto peak = [&](const v1::JobSpec& s, const char* schedule) {
    std::vector<v1::StepReport> reports;
    Train(s, 2, schedule, &reports, 1);
    return reports.empty() ? int64_t{0} : reports[0].peak_activation_bytes();
  };
  spec.mutable_pipeline()->set_micro_batches(1);
  const int64_t working_set = peak(spec, "gpipe");
  ASSERT_GT(working_set, 0);
  const int m = 8;
  spec.mutable_pipeline()->set_micro_batches(m);
  v1::JobSpec full = spec;
  full.mutable_pipeline()->set_recompute("full");
  const v1::ModelSpec& model = spec.model();
  const int64_t tokens = spec.pipeline().micro_batch_size() * model.seq_len();
  const int64_t block_input = tokens * model.d_model() * static_cast<int64_t>(sizeof(float));
  const int64_t block_working_set = tokens *
                                    (16 * model.d_model() + model.n_head() * model.seq_len()) *
                                    static_cast<int64_t>(sizeof(float));
  for (const char* schedule : {"gpipe", "1f1b"}) {
    SCOPED_TRACE(schedule);
    spec.mutable_pipeline()->set_stages(2);
    spec.mutable_pipeline()->set_schedule(schedule);
    full.mutable_pipeline()->set_stages(2);
    full.mutable_pipeline()->set_schedule(schedule);
    absl::StatusOr<PipelinePlan> plain_plan = PlanPipeline(spec);
    absl::StatusOr<PipelinePlan> full_plan = PlanPipeline(full);
    ASSERT_TRUE(plain_plan.ok() && full_plan.ok());
    // Stage 0: the embedding (whose input is the (B, T) int32 tokens) and blocks.
    const int blocks = full_plan->ranges[0].end - full_plan->ranges[0].begin - 1;
    ASSERT_GE(blocks, 1);
    ActionCosts memory;
    memory.activation_bytes = static_cast<double>(working_set);
    memory.input_bytes =
        static_cast<double>(tokens * static_cast<int64_t>(sizeof(int32_t)) + blocks * block_input);
    memory.layer_bytes = static_cast<double>(block_working_set);
    absl::StatusOr<SimulationResult> plain_sim = SimulateSchedule(plain_plan->schedule, memory);
    absl::StatusOr<SimulationResult> full_sim = SimulateSchedule(full_plan->schedule, memory);
    ASSERT_TRUE(plain_sim.ok() && full_sim.ok());
    // The hand count: gpipe holds all M micro-batches' checkpoints, 1F1B P = 2 of them.
    const int live = std::string(schedule) == "gpipe" ? m : 2;
    EXPECT_DOUBLE_EQ(full_sim->peak_activation_bytes[0],
                     live * memory.input_bytes + memory.layer_bytes);
    const int64_t plain = peak(spec, schedule), recomputed = peak(full, schedule);
    EXPECT_NEAR(static_cast<double>(plain), plain_sim->peak_activation_bytes[0], 0.1 * plain);
    EXPECT_NEAR(static_cast<double>(recomputed), full_sim->peak_activation_bytes[0],
                0.05 * recomputed);
    EXPECT_LT(recomputed, plain);
    std::cout << schedule << ": stage 0 peak " << plain << " bytes, with full recomputation "
              << recomputed << " (predicted " << plain_sim->peak_activation_bytes[0] << " and "
              << full_sim->peak_activation_bytes[0] << ")\n";
  }
}

// Selective recomputation (pipeline.recompute: selective) changes no loss: it adds no action
// to the plan, and a block's backward (B, or I then W) recomputes its attention probabilities
// (gpt: and GELU output) from what it kept, with the forward's kernels. Every schedule that
// plans for the test's M = 4 (all but dualpipe_v on 4 workers), P in {1, 2, 4}, gpt and llama,
// 20 steps, within 1e-6 relative; on the CPU bit for bit.
TEST_F(ExecutorTest, SelectiveRecomputationChangesNoLoss) {
  constexpr int kRecomputeSteps = 20;
  int trained = 0;
  std::string skipped;
  for (const char* arch : {"gpt", "llama"}) {
    v1::JobSpec spec = RecomputationJob(arch);
    v1::JobSpec selective = spec;
    selective.mutable_pipeline()->set_recompute("selective");
    for (const std::string& schedule : AllScheduleNames()) {
      for (int p : {1, 2, 4}) {
        SCOPED_TRACE(absl::StrCat(arch, " ", schedule, " P ", p));
        v1::JobSpec probe = selective;
        probe.mutable_pipeline()->set_stages(p);
        probe.mutable_pipeline()->set_schedule(schedule);
        if (!PlanPipeline(probe).ok()) {  // the schedule does not plan for this P and M
          absl::StrAppend(&skipped, " ", arch, " ", schedule, " P ", p, ";");
          continue;
        }
        // No R action: selective changes how a block saves, not the schedule.
        const auto programs = MakePrograms(selective, p, schedule);
        ASSERT_EQ(programs.size(), static_cast<size_t>(p));
        for (const v1::StageProgram& prog : programs) {
          for (const v1::Action& a : prog.actions()) EXPECT_NE(a.kind(), v1::ACTION_R);
        }
        const std::vector<double> plain = Train(spec, p, schedule, nullptr, kRecomputeSteps);
        const std::vector<double> recomputed =
            Train(selective, p, schedule, nullptr, kRecomputeSteps);
        ExpectSameLosses(plain, recomputed, 1e-6, kRecomputeSteps);
        EXPECT_EQ(plain, recomputed);  // bit for bit on the CPU
        ++trained;
      }
    }
  }
  std::cout << "selective recomputation: " << trained
            << " (arch, schedule, P) runs; not planned:" << skipped << "\n";
  EXPECT_GE(trained, 2 * 2 * static_cast<int>(AllScheduleNames().size()));
}

// The measured peak of stage 0's live activation bytes drops with selective recomputation by
// exactly the hand count: each block of the stage keeps neither its attention probabilities
// (NH T floats per token) nor its GELU output (H = 4C floats per token; worker/model/gpt.h)
// for each micro-batch live at the peak (GPipe: all M; 1F1B on P = 2: 2).
TEST_F(ExecutorTest, SelectiveRecomputationPeakBytesDropByTheHandCount) {
  v1::JobSpec spec = testing::TinyGptJob(/*tied=*/false);
  spec.mutable_model()->set_n_layer(6);
  spec.mutable_pipeline()->set_micro_batch_size(2);
  const int m = 8;
  spec.mutable_pipeline()->set_micro_batches(m);
  v1::JobSpec selective = spec;
  selective.mutable_pipeline()->set_recompute("selective");
  auto peak = [&](const v1::JobSpec& s, const char* schedule) {
    std::vector<v1::StepReport> reports;
    Train(s, 2, schedule, &reports, 1);
    return reports.empty() ? int64_t{0} : reports[0].peak_activation_bytes();
  };
  const v1::ModelSpec& model = spec.model();
  const int64_t tokens = spec.pipeline().micro_batch_size() * model.seq_len();
  const int64_t dropped_per_block = tokens *
                                    (model.n_head() * model.seq_len() + 4 * model.d_model()) *
                                    static_cast<int64_t>(sizeof(float));
  for (const char* schedule : {"gpipe", "1f1b"}) {
    SCOPED_TRACE(schedule);
    v1::JobSpec planned = selective;
    planned.mutable_pipeline()->set_stages(2);
    planned.mutable_pipeline()->set_schedule(schedule);
    absl::StatusOr<PipelinePlan> plan = PlanPipeline(planned);
    ASSERT_TRUE(plan.ok()) << plan.status();
    // Stage 0: the embedding and blocks.
    const int blocks = plan->ranges[0].end - plan->ranges[0].begin - 1;
    ASSERT_GE(blocks, 1);
    const int live = std::string(schedule) == "gpipe" ? m : 2;
    const int64_t plain = peak(spec, schedule), recomputed = peak(selective, schedule);
    ASSERT_GT(recomputed, 0);
    EXPECT_LT(recomputed, plain);
    EXPECT_EQ(plain - recomputed, live * blocks * dropped_per_block);
    std::cout << schedule << ": stage 0 peak " << plain << " bytes, with selective recomputation "
              << recomputed << " (" << live << " micro-batches x " << blocks << " blocks x "
              << dropped_per_block << " bytes less)\n";
  }
}

// The layer profiler builds the job's layers (BuildModelLayers for the JobSpec), so a profile
// of a selective job measures its blocks' smaller saved bytes, what the planner's memory
// model then uses; its cache key tells it apart from the plain job's.
TEST_F(ExecutorTest, SelectiveRecomputationIsWhatTheProfilerMeasures) {
  for (const char* arch : {"gpt", "llama"}) {
    SCOPED_TRACE(arch);
    v1::JobSpec spec = std::string(arch) == "gpt" ? testing::TinyGptJob(/*tied=*/false)
                                                  : testing::TinyLlamaJob(/*tied=*/false);
    v1::JobSpec selective = spec;
    selective.mutable_pipeline()->set_recompute("selective");
    absl::StatusOr<std::vector<v1::LayerProfile>> plain = ProfileLayers(spec, {0, 1}, 1);
    absl::StatusOr<std::vector<v1::LayerProfile>> kept = ProfileLayers(selective, {0, 1}, 1);
    ASSERT_TRUE(plain.ok() && kept.ok());
    const v1::ModelSpec& model = spec.model();
    const int64_t tokens = spec.pipeline().micro_batch_size() * model.seq_len();
    // The block drops the probabilities, and for gpt the GELU output (d_hidden 0: 4C).
    const int64_t per_token =
        model.n_head() * model.seq_len() + (std::string(arch) == "gpt" ? 4 * model.d_model() : 0);
    EXPECT_EQ((*plain)[0].activation_bytes(), (*kept)[0].activation_bytes());  // the embedding
    EXPECT_EQ((*plain)[1].activation_bytes() - (*kept)[1].activation_bytes(),
              tokens * per_token * static_cast<int64_t>(sizeof(float)));
    EXPECT_NE(ProfileKey(spec, "cpu", 1, ""), ProfileKey(selective, "cpu", 1, ""));
  }
}

// With tying, the embedding's wte (first stage) and the head's copy (last stage) stay
// bit-identical through training.
TEST_F(ExecutorTest, TiedCopiesStayBitIdentical) {
  v1::JobSpec spec = testing::TinyGptJob(/*tied=*/true);
  spec.mutable_pipeline()->set_micro_batch_size(4);
  spec.mutable_pipeline()->set_micro_batches(2);
  const auto programs = MakePrograms(spec, 2, "1f1b");
  const Dataset data = DataOf(spec);
  gloo::rendezvous::HashStore store;
  std::vector<std::unique_ptr<StageExecutor>> ex(2);
  std::vector<std::thread> threads;
  for (int s = 0; s < 2; ++s) {
    threads.emplace_back([&, s] {
      GlooTransportOptions o;
      o.rank = s;
      o.size = 2;
      o.hostname = "127.0.0.1";
      auto t = GlooTransport::Connect(o, store);
      ASSERT_TRUE(t.ok()) << t.status();
      auto e = StageExecutor::Create(programs[s], data, *std::move(t));
      ASSERT_TRUE(e.ok()) << e.status();
      ex[s] = *std::move(e);
    });
  }
  for (auto& t : threads) t.join();
  threads.clear();
  ASSERT_TRUE(ex[0] && ex[1]);
  for (int step = 0; step < 3; ++step) {
    for (int s = 0; s < 2; ++s) {
      threads.emplace_back([&, s] {
        ASSERT_TRUE(ex[s]->RunStep(step).ok());
        ASSERT_TRUE(ex[s]->ApplyStep(step, 0.01f).ok());
      });
    }
    for (auto& t : threads) t.join();
    threads.clear();
  }
  const Parameter* wte0 = nullptr;
  const Parameter* wte1 = nullptr;
  for (const Parameter* p : ex[0]->Parameters()) {
    if (p->tied) wte0 = p;
  }
  for (const Parameter* p : ex[1]->Parameters()) {
    if (p->tied) wte1 = p;
  }
  ASSERT_NE(wte0, nullptr);
  ASSERT_NE(wte1, nullptr);
  EXPECT_EQ(wte0->name, wte1->name);
  ASSERT_EQ(wte0->value.size(), wte1->value.size());
  EXPECT_EQ(std::memcmp(wte0->value.vec().data(), wte1->value.vec().data(), wte0->value.bytes()),
            0);
  // The tied parameter is checkpointed once, by the first stage.
  int listed = 0;
  auto listed_tensors = ex[1]->CheckpointTensors();
  ASSERT_TRUE(listed_tensors.ok()) << listed_tensors.status();
  for (const auto& t : *listed_tensors) listed += t.name == wte1->name;
  EXPECT_EQ(listed, 0);
}

// Save -> restore is bitwise: a fresh executor restored from another's checkpoint tensors
// holds exactly the same parameters and optimizer state, and trains on identically.
TEST_F(ExecutorTest, CheckpointRoundTripIsBitwise) {
  const v1::JobSpec spec = testing::TinyGptJob(/*tied=*/true);
  const auto program = MakePrograms(spec, 1, "1f1b")[0];
  const Dataset data = DataOf(spec);
  auto a = StageExecutor::Create(program, data, nullptr);
  ASSERT_TRUE(a.ok()) << a.status();
  for (int step = 0; step < 3; ++step) {
    ASSERT_TRUE((*a)->RunStep(step).ok());
    ASSERT_TRUE((*a)->ApplyStep(step, 0.01f).ok());
  }
  std::map<std::string, std::string> saved;
  auto saved_tensors = (*a)->CheckpointTensors();
  ASSERT_TRUE(saved_tensors.ok()) << saved_tensors.status();
  for (const auto& t : *saved_tensors) {
    ASSERT_TRUE(
        saved.emplace(t.name, std::string(static_cast<const char*>(t.data), t.bytes)).second)
        << "duplicate " << t.name;
  }
  EXPECT_TRUE(saved.contains("transformer.wte.weight.adam_m"));
  auto b = StageExecutor::Create(program, data, nullptr);
  ASSERT_TRUE(b.ok());
  ASSERT_TRUE(
      (*b)->Restore([&](const std::string& name) -> absl::StatusOr<absl::Span<const uint8_t>> {
            auto it = saved.find(name);
            if (it == saved.end()) return absl::NotFoundError(name);
            return absl::Span<const uint8_t>(reinterpret_cast<const uint8_t*>(it->second.data()),
                                             it->second.size());
          })
          .ok());
  auto restored_tensors = (*b)->CheckpointTensors();
  ASSERT_TRUE(restored_tensors.ok()) << restored_tensors.status();
  for (const auto& t : *restored_tensors) {
    ASSERT_TRUE(saved.contains(t.name)) << t.name;
    EXPECT_EQ(saved[t.name], std::string(static_cast<const char*>(t.data), t.bytes)) << t.name;
  }
  auto ra = (*a)->RunStep(3);
  auto rb = (*b)->RunStep(3);
  ASSERT_TRUE(ra.ok() && rb.ok());
  EXPECT_EQ(ra->loss(), rb->loss());
  EXPECT_EQ(ra->grad_norm_sq(), rb->grad_norm_sq());
  // A tensor of the wrong size is refused, naming it.
  auto c = StageExecutor::Create(program, data, nullptr);
  absl::Status bad =
      (*c)->Restore([&](const std::string& name) -> absl::StatusOr<absl::Span<const uint8_t>> {
        return absl::Span<const uint8_t>(
            reinterpret_cast<const uint8_t*>(saved.begin()->second.data()), 3);
      });
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("transformer.wte.weight"), std::string::npos) << bad;
}

TEST_F(ExecutorTest, ReportsTimingsBytesAndMemory) {
  const v1::JobSpec spec = TinyJob();
  std::vector<v1::StepReport> reports;
  Train(spec, 2, "1f1b", &reports);
  ASSERT_FALSE(reports.empty());
  const auto programs = MakePrograms(spec, 2, "1f1b");
  const v1::StepReport& r = reports[0];
  EXPECT_EQ(r.timings_size(), programs[0].actions_size());
  for (int i = 0; i < r.timings_size(); ++i) {
    EXPECT_EQ(r.timings(i).index(), i);
    EXPECT_LE(r.timings(i).start_us(), r.timings(i).end_us());
  }
  const int64_t act_bytes = 8 * 32 * 4;  // (B, D) fp32
  EXPECT_EQ(r.bytes_sent(), 4 * act_bytes);
  EXPECT_EQ(r.bytes_received(), 4 * act_bytes);
  EXPECT_GT(r.peak_activation_bytes(), 0);
  // One stage on this rank: its peak is the rank's, and its static bytes are at least the
  // values and gradients of its parameters (plus the optimizer's moments).
  ASSERT_EQ(r.stage_memory_size(), 1);
  EXPECT_EQ(r.stage_memory(0).stage(), 0);
  EXPECT_EQ(r.stage_memory(0).peak_activation_bytes(), r.peak_activation_bytes());
  EXPECT_GT(r.stage_memory(0).static_bytes(), 0);
  // Its parts: on the CPU a value and a gradient per parameter element, the optimizer's state
  // and no workspace.
  const v1::StageMemory& mem = r.stage_memory(0);
  EXPECT_EQ(mem.static_bytes(), mem.parameter_bytes() + mem.gradient_bytes() +
                                    mem.optimizer_bytes() + mem.workspace_bytes());
  EXPECT_GT(mem.parameter_bytes(), 0);
  EXPECT_EQ(mem.gradient_bytes(), mem.parameter_bytes());
  EXPECT_EQ(mem.workspace_bytes(), 0);
  EXPECT_GT(r.exec_us(), 0);
  EXPECT_LE(r.start_us(), r.end_us());
  EXPECT_EQ(r.step(), 0);
  EXPECT_EQ(reports.back().step(), kSteps - 1);
}

// The CPU compute with a device clock: it reports each Forward / Backward as having taken
// `1 + the number of calls so far` microseconds on its "device", as a GPU backend reports its
// CUDA-event times. Everything else is the CPU's.
class DeviceClockCompute final : public StageCompute {
 public:
  explicit DeviceClockCompute(std::unique_ptr<StageCompute> cpu) : cpu_(std::move(cpu)) {}
  std::string device() const override { return cpu_->device(); }
  absl::StatusOr<StageBufferPtr> NewBuffer(const std::vector<int64_t>& shape) override {
    return cpu_->NewBuffer(shape);
  }
  absl::StatusOr<double> Forward(int chunk, int mb, StageBufferPtr input,
                                 const MicroBatchData& data, bool save,
                                 StageBufferPtr* output) override {
    device_us_ = ++calls_;
    return cpu_->Forward(chunk, mb, std::move(input), data, save, output);
  }
  absl::Status Backward(int chunk, int mb, v1::ActionKind kind, StageBufferPtr grad_output,
                        StageBufferPtr* grad_input) override {
    device_us_ = ++calls_;
    return cpu_->Backward(chunk, mb, kind, std::move(grad_output), grad_input);
  }
  int64_t last_device_us(int) const override { return device_us_; }
  size_t SavedBytes(int chunk, int mb) const override { return cpu_->SavedBytes(chunk, mb); }
  void DropSaved() override { cpu_->DropSaved(); }
  int64_t parameter_count() const override { return cpu_->parameter_count(); }
  StaticMemory static_memory(int chunk) const override { return cpu_->static_memory(chunk); }
  std::vector<TiedGradient> TiedGradients() override { return cpu_->TiedGradients(); }
  absl::Status SumLocalTiedGradients() override { return cpu_->SumLocalTiedGradients(); }
  absl::Status AddToTiedGradient(size_t index, StageBuffer& other) override {
    return cpu_->AddToTiedGradient(index, other);
  }
  absl::StatusOr<GradStats> GradientStats(bool count_tied) override {
    return cpu_->GradientStats(count_tied);
  }
  absl::Status Apply(float learning_rate, float grad_scale, bool skip) override {
    return cpu_->Apply(learning_rate, grad_scale, skip);
  }
  absl::StatusOr<std::vector<StateTensor>> CheckpointTensors(bool list_tied) override {
    return cpu_->CheckpointTensors(list_tied);
  }
  std::vector<std::string> RestoreNames(bool weights_only) override {
    return cpu_->RestoreNames(weights_only);
  }
  absl::Status Restore(const TensorLookup& lookup, bool weights_only,
                       absl::string_view where) override {
    return cpu_->Restore(lookup, weights_only, where);
  }

 private:
  std::unique_ptr<StageCompute> cpu_;
  int64_t calls_ = 0;
  int64_t device_us_ = 0;
};

// Each compute action's report carries its compute's device time, taken right after the call;
// transfers carry none; and the CPU compute itself reports none.
TEST_F(ExecutorTest, ComputeActionsReportTheirComputesDeviceTime) {
  const v1::JobSpec spec = TinyJob();
  const v1::StageProgram program = MakePrograms(spec, 1, "1f1b")[0];
  auto cpu = CpuStageCompute::Create(program, StageExecutor::MicroBatchSlots(program));
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  auto ex = StageExecutor::Create(program, DataOf(spec), nullptr,
                                  std::make_unique<DeviceClockCompute>(*std::move(cpu)));
  ASSERT_TRUE(ex.ok()) << ex.status();
  absl::StatusOr<v1::StepReport> r = (*ex)->RunStep(0);
  ASSERT_TRUE(r.ok()) << r.status();
  int64_t expected = 0;
  for (const v1::ActionTiming& t : r->timings()) {
    if (IsComputeAction(program.actions(t.index()).kind())) {
      EXPECT_EQ(t.device_us(), ++expected) << t.index();
    } else {
      EXPECT_EQ(t.device_us(), 0) << t.index();
    }
  }
  EXPECT_GT(expected, 0);

  auto plain = StageExecutor::Create(program, DataOf(spec), nullptr);
  ASSERT_TRUE(plain.ok()) << plain.status();
  r = (*plain)->RunStep(0);
  ASSERT_TRUE(r.ok()) << r.status();
  for (const v1::ActionTiming& t : r->timings()) EXPECT_EQ(t.device_us(), 0) << t.index();
}

TEST_F(ExecutorTest, AbortUnblocksRunningStep) {
  const v1::JobSpec spec = TinyJob();
  const auto programs = MakePrograms(spec, 2, "1f1b");
  gloo::rendezvous::HashStore store;
  auto connect = [&](int rank) {
    GlooTransportOptions o;
    o.rank = rank;
    o.size = 2;
    return GlooTransport::Connect(o, store);
  };
  auto f0 = std::async(std::launch::async, connect, 0);
  auto t1 = connect(1);
  auto t0 = f0.get();
  ASSERT_TRUE(t0.ok() && t1.ok());
  auto ex = StageExecutor::Create(programs[1], DataOf(spec), *std::move(t1));
  ASSERT_TRUE(ex.ok()) << ex.status();
  // Stage 0 never runs: stage 1 blocks in its first RECV_F.
  auto step = std::async(std::launch::async, [&] { return (*ex)->RunStep(0); });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ((*ex)->RunStep(0).status().code(), absl::StatusCode::kFailedPrecondition);
  (*ex)->Abort();
  ASSERT_EQ(step.wait_for(std::chrono::seconds(1)), std::future_status::ready);
  const auto r = step.get();
  EXPECT_EQ(r.status().code(), absl::StatusCode::kAborted) << r.status();
  EXPECT_NE(r.status().message().find("stage 1: RECV_F mb 0 from stage 0"), std::string::npos)
      << r.status();
  EXPECT_EQ((*ex)->RunStep(1).status().code(), absl::StatusCode::kAborted);
}

TEST_F(ExecutorTest, RejectsBadStepArguments) {
  const v1::JobSpec spec = TinyJob();
  auto ex = StageExecutor::Create(MakePrograms(spec, 1, "1f1b")[0], DataOf(spec), nullptr);
  ASSERT_TRUE(ex.ok());
  EXPECT_EQ((*ex)->RunStep(-1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*ex)->RunStep(0, static_cast<v1::StepMode>(7)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*ex)->RunStep(0, v1::STEP_MODE_EVAL).status().code(),
            absl::StatusCode::kFailedPrecondition);  // the program has no eval actions
  EXPECT_EQ((*ex)->ApplyStep(0, 0.1f).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE((*ex)->RunStep(0).ok());
  // The gradients of step 0 are pending: step 1 must wait for ApplyStep(0).
  EXPECT_EQ((*ex)->RunStep(1).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ((*ex)->ApplyStep(1, 0.1f).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ((*ex)->ApplyStep(0, NAN).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*ex)->ApplyStep(0, 0.1f, 0.0f).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*ex)->ApplyStep(0, 0.1f, 1.5f).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE((*ex)->ApplyStep(0, 0.1f).ok());
  EXPECT_TRUE((*ex)->RunStep(1).ok());
  // A multi-rank program needs a transport; a first stage needs its corpus.
  EXPECT_FALSE(StageExecutor::Create(MakePrograms(spec, 2, "1f1b")[0], DataOf(spec), nullptr).ok());
  EXPECT_FALSE(StageExecutor::Create(MakePrograms(spec, 1, "1f1b")[0], Dataset{}, nullptr).ok());
}

}  // namespace
}  // namespace tandem::worker
