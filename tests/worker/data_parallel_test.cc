// Data parallelism in-process: R pipeline replicas of P stages each (P x R executors, each
// replica's pipeline over its own Gloo transport, each rank's data-parallel group over another),
// driven as the coordinator drives them. The project's main test, partition invariance,
// extended: the same losses whatever (P, R), schedule and tying, with M adjusted to keep the
// global batch.
#include <cblas.h>
#include <gloo/rendezvous/hash_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/grad_clip.h"
#include "common/spec.h"
#include "tests/worker/pipeline_test_util.h"
#include "worker/cpu_stage_compute.h"
#include "worker/executor.h"
#include "worker/grad_reducer.h"
#include "worker/transport/gloo_transport.h"

namespace tandem::worker {
namespace {

// The gang of a job: programs for every gang rank (replica-major), as the coordinator makes
// them.
std::vector<v1::StageProgram> GangPrograms(v1::JobSpec spec, int stages, int replicas,
                                           const std::string& schedule) {
  spec.mutable_pipeline()->set_stages(stages);
  spec.mutable_pipeline()->set_replicas(replicas);
  spec.mutable_pipeline()->set_schedule(schedule);
  absl::StatusOr<PipelinePlan> plan = PlanPipeline(spec);
  if (!plan.ok()) {
    ADD_FAILURE() << "PlanPipeline: " << plan.status();
    return {};
  }
  std::vector<v1::StageProgram> out;
  for (int g = 0; g < stages * replicas; ++g) {
    out.push_back(StageProgramFor(*plan, spec, g, "job-dp", "job-dp/attempt-0/"));
  }
  return out;
}

std::unique_ptr<Transport> Connect(gloo::rendezvous::Store& store, const std::string& prefix,
                                   int rank, int size) {
  gloo::rendezvous::PrefixStore scoped(prefix, store);
  GlooTransportOptions o;
  o.rank = rank;
  o.size = size;
  o.hostname = "127.0.0.1";
  o.op_timeout = std::chrono::milliseconds(30000);
  auto t = GlooTransport::Connect(o, scoped);
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? *std::move(t) : nullptr;
}

struct GangRun {
  std::vector<double> losses;
  std::vector<std::vector<v1::StepReport>> reports;  // per step, by gang rank
  // Every gang rank's parameters after the last step (flattened, layer order).
  std::vector<std::vector<float>> parameters;
  // Every gang rank's optimizer state bytes (its compute's static memory).
  std::vector<int64_t> optimizer_bytes;
  // The checkpoint taken after the last step when asked: name -> bytes, every stage's
  // replica-0 tensors (what the coordinator writes).
  std::map<std::string, std::vector<uint8_t>> checkpoint;
};

struct GangOptions {
  int steps = 20;
  int first_step = 0;
  // Loaded into every gang rank before the first step (a checkpoint of any layout).
  const std::map<std::string, std::vector<uint8_t>>* restore = nullptr;
  bool take_checkpoint = false;
};

// Builds the gang's executors, runs the steps and combines the reports as the coordinator
// does (coordinator/step_summary.h): the loss summed over the replicas' last stages, the norm
// from replica 0 (every rank's with sharded optimizer state), the update the same on every
// worker.
GangRun TrainGang(const v1::JobSpec& spec, int stages, int replicas, const std::string& schedule,
                  const GangOptions& options) {
  GangRun run;
  const std::vector<v1::StageProgram> programs = GangPrograms(spec, stages, replicas, schedule);
  if (programs.empty()) return run;
  const int gang = stages * replicas;
  const bool sharded = ShardsOptimizerState(programs[0].spec());
  const Dataset data = *LoadDataset(spec, ".", TrainingWindow(spec.model()));
  gloo::rendezvous::HashStore store;
  std::vector<std::unique_ptr<StageExecutor>> executors(gang);
  std::vector<std::thread> threads;
  for (int g = 0; g < gang; ++g) {
    threads.emplace_back([&, g] {
      const v1::StageProgram& p = programs[g];
      std::unique_ptr<Transport> pipeline;
      if (stages > 1) {
        pipeline = Connect(store, p.rendezvous_prefix(), p.rank(), p.num_ranks());
        if (pipeline == nullptr) return;
      }
      std::unique_ptr<GradReducer> reducer;
      if (replicas > 1) {
        std::unique_ptr<Transport> group =
            Connect(store, p.dp_rendezvous_prefix(), p.replica(), p.num_replicas());
        if (group == nullptr) return;
        reducer = std::make_unique<GradReducer>(std::move(group));
      }
      auto compute = CpuStageCompute::Create(p, StageExecutor::MicroBatchSlots(p));
      ASSERT_TRUE(compute.ok()) << compute.status();
      auto ex = StageExecutor::Create(p, data, std::move(pipeline), *std::move(compute),
                                      std::move(reducer));
      ASSERT_TRUE(ex.ok()) << ex.status();
      if (options.restore != nullptr) {
        absl::Status restored = (*ex)->Restore(
            [&](const std::string& name) -> absl::StatusOr<absl::Span<const uint8_t>> {
              auto it = options.restore->find(name);
              if (it == options.restore->end()) return absl::NotFoundError(name);
              return absl::MakeConstSpan(it->second);
            });
        ASSERT_TRUE(restored.ok()) << restored;
      }
      executors[g] = *std::move(ex);
    });
  }
  for (auto& t : threads) t.join();
  threads.clear();
  for (const auto& e : executors) {
    if (e == nullptr) return run;
  }
  for (int step = options.first_step; step < options.first_step + options.steps; ++step) {
    std::vector<absl::StatusOr<v1::StepReport>> reports(gang, absl::UnknownError("not run"));
    for (int g = 0; g < gang; ++g) {
      threads.emplace_back([&, g] { reports[g] = executors[g]->RunStep(step); });
    }
    for (auto& t : threads) t.join();
    threads.clear();
    double loss = 0.0, norm_sq = 0.0;
    std::vector<v1::StepReport> step_reports;
    for (int g = 0; g < gang; ++g) {
      EXPECT_TRUE(reports[g].ok()) << "gang rank " << g << ": " << reports[g].status();
      if (!reports[g].ok()) return run;
      EXPECT_TRUE(reports[g]->grads_finite());
      if (reports[g]->has_loss()) loss += reports[g]->loss();
      if (g < stages || sharded) norm_sq += reports[g]->grad_norm_sq();
      // After the reduction every replica holds the same gradients: the same norm, bit for bit
      // (sharded, each reports the norm of its own segments).
      if (g >= stages && !sharded) {
        EXPECT_EQ(reports[g]->grad_norm_sq(), reports[g % stages]->grad_norm_sq())
            << "step " << step << " gang rank " << g;
      }
      step_reports.push_back(*reports[g]);
    }
    const float scale = ClipScale(std::sqrt(norm_sq), spec.optimizer().grad_clip());
    // ApplyStep all-gathers the parameters when the state is sharded: the group's ranks
    // together.
    for (int g = 0; g < gang; ++g) {
      threads.emplace_back([&, g] {
        absl::Status applied = executors[g]->ApplyStep(step, spec.optimizer().lr(), scale);
        EXPECT_TRUE(applied.ok()) << applied;
      });
    }
    for (auto& t : threads) t.join();
    threads.clear();
    run.losses.push_back(loss);
    run.reports.push_back(std::move(step_reports));
  }
  if (options.take_checkpoint) {
    // Every rank takes part (a sharded state is gathered); replica 0's tensors are written.
    std::vector<absl::StatusOr<std::vector<StateTensor>>> tensors(gang,
                                                                  absl::UnknownError("not run"));
    for (int g = 0; g < gang; ++g) {
      threads.emplace_back([&, g] { tensors[g] = executors[g]->CheckpointTensors(); });
    }
    for (auto& t : threads) t.join();
    threads.clear();
    for (int g = 0; g < gang; ++g) {
      EXPECT_TRUE(tensors[g].ok()) << "gang rank " << g << ": " << tensors[g].status();
      if (!tensors[g].ok()) return run;
      if (g >= stages) continue;
      for (const StateTensor& t : *tensors[g]) {
        EXPECT_FALSE(t.shard.has_value()) << t.name;
        const uint8_t* bytes = static_cast<const uint8_t*>(t.data);
        run.checkpoint[t.name].assign(bytes, bytes + t.bytes);
      }
    }
  }
  for (int g = 0; g < gang; ++g) {
    std::vector<float> flat;
    for (Parameter* p : executors[g]->Parameters()) {
      flat.insert(flat.end(), p->value.vec().begin(), p->value.vec().end());
    }
    run.parameters.push_back(std::move(flat));
    int64_t optimizer = 0;
    if (!run.reports.empty()) {
      for (const v1::StageMemory& m : run.reports.back()[g].stage_memory()) {
        optimizer += m.optimizer_bytes();
      }
    }
    run.optimizer_bytes.push_back(optimizer);
  }
  return run;
}

GangRun TrainGang(const v1::JobSpec& spec, int stages, int replicas, const std::string& schedule,
                  int steps) {
  return TrainGang(spec, stages, replicas, schedule, GangOptions{.steps = steps});
}

void ExpectSameLosses(const std::vector<double>& a, const std::vector<double>& b, double rel) {
  ASSERT_EQ(a.size(), b.size());
  ASSERT_FALSE(a.empty());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_NEAR(a[i], b[i], rel * std::abs(a[i])) << "step " << i;
  }
}

class DataParallelTest : public ::testing::Test {
 protected:
  void SetUp() override { openblas_set_num_threads(1); }
};

// The grid: (P, R) in {(1,1), (2,1), (1,2), (2,2), (1,4)} over one global batch of 8
// sequences (micro-batches of 2; M = 8 / (2 R)), for 1f1b and zb_h1, tied and untied: the same
// 20 losses within 1e-5 relative (the replicas' sums reassociate the micro-batches' gradients,
// nothing else changes), and every replica's parameters stay bit-identical to replica 0's.
TEST_F(DataParallelTest, LossesDoNotDependOnStagesOrReplicas) {
  constexpr int kSteps = 20;
  for (bool tied : {true, false}) {
    v1::JobSpec spec = testing::TinyGptJob(tied);
    spec.mutable_pipeline()->set_micro_batch_size(2);
    spec.mutable_pipeline()->set_micro_batches(4);
    const GangRun ref = TrainGang(spec, 1, 1, "1f1b", kSteps);
    ASSERT_EQ(ref.losses.size(), static_cast<size_t>(kSteps));
    EXPECT_NEAR(ref.losses[0], std::log(256.0), 0.2);
    EXPECT_LT(ref.losses.back(), ref.losses.front() - 0.5);
    for (const char* schedule : {"1f1b", "zb_h1"}) {
      for (auto [p, r] : {std::pair{1, 1}, {2, 1}, {1, 2}, {2, 2}, {1, 4}}) {
        SCOPED_TRACE(absl::StrCat("tied ", tied, " ", schedule, " P ", p, " R ", r));
        spec.mutable_pipeline()->set_micro_batches(8 / (2 * r));
        const GangRun run = TrainGang(spec, p, r, schedule, kSteps);
        ExpectSameLosses(ref.losses, run.losses, 1e-5);
        for (size_t g = static_cast<size_t>(p); g < run.parameters.size(); ++g) {
          EXPECT_TRUE(run.parameters[g] == run.parameters[g % static_cast<size_t>(p)])
              << "gang rank " << g << " drifted from replica 0";
        }
      }
    }
  }
}

// Several stages per worker (interleaved and V placements) reduce every chunk once.
TEST_F(DataParallelTest, VirtualStagesReduceEveryChunk) {
  constexpr int kSteps = 6;
  v1::JobSpec spec = testing::TinyGptJob(true);
  spec.mutable_pipeline()->set_micro_batch_size(2);
  spec.mutable_pipeline()->set_micro_batches(4);
  const GangRun ref = TrainGang(spec, 1, 1, "1f1b", kSteps);
  spec.mutable_pipeline()->set_micro_batches(2);
  for (const char* schedule : {"interleaved_1f1b", "zb_v", "gpipe"}) {
    SCOPED_TRACE(schedule);
    ExpectSameLosses(ref.losses, TrainGang(spec, 2, 2, schedule, kSteps).losses, 1e-5);
  }
}

// The reduction starts during the last backward (layer by layer) and is reported as the
// REDUCE_GRAD action's interval, with the bytes reduced: all of the worker's gradients.
TEST_F(DataParallelTest, ReductionStartsInsideTheLastBackwardAndIsReported) {
  v1::JobSpec spec = testing::TinyGptJob(false);
  spec.mutable_model()->set_n_layer(4);
  spec.mutable_pipeline()->set_micro_batch_size(2);
  spec.mutable_pipeline()->set_micro_batches(2);
  const std::vector<v1::StageProgram> programs = GangPrograms(spec, 1, 2, "1f1b");
  ASSERT_EQ(programs.size(), 2u);
  int reduce_index = -1, last_b = -1;
  for (int i = 0; i < programs[0].actions_size(); ++i) {
    if (programs[0].actions(i).kind() == v1::ACTION_REDUCE_GRAD) reduce_index = i;
    if (programs[0].actions(i).kind() == v1::ACTION_B) last_b = i;
  }
  ASSERT_GE(reduce_index, 0);
  ASSERT_EQ(reduce_index, last_b + 1) << "REDUCE_GRAD follows the stage's last B";
  const GangRun run = TrainGang(spec, 1, 2, "1f1b", 3);
  ASSERT_EQ(run.reports.size(), 3u);
  const int64_t params = static_cast<int64_t>(run.parameters[0].size());
  for (const std::vector<v1::StepReport>& step : run.reports) {
    for (const v1::StepReport& rep : step) {
      EXPECT_EQ(rep.reduced_bytes(), params * 4);
      const v1::ActionTiming* reduce = nullptr;
      const v1::ActionTiming* backward = nullptr;
      for (const v1::ActionTiming& t : rep.timings()) {
        if (t.index() == reduce_index) reduce = &t;
        if (t.index() == last_b) backward = &t;
      }
      ASSERT_NE(reduce, nullptr);
      ASSERT_NE(backward, nullptr);
      // The first bucket (the head's) was handed over while the blocks' backward still ran.
      EXPECT_GT(reduce->start_us(), backward->start_us());
      EXPECT_LT(reduce->start_us(), backward->end_us());
      // It ends once its last bucket (the embedding's, handed over as the backward's last
      // layer finishes) is summed: that can be before the compute thread stamps the backward's
      // end (seen: 22 us before, the peer's ring having caught up), so no order between the
      // two ends is promised.
      EXPECT_GE(reduce->end_us(), reduce->start_us());
    }
  }
}

// Sharded optimizer state (ZeRO stage 1) is the same arithmetic on fewer moments: the grid's
// losses within 1e-5 of the unsharded single worker, every replica bit-identical, and each
// worker's AdamW state at R = 2 half the unsharded (at most 0.55x, the figure); with
// R = 1 it is accepted and changes nothing.
TEST_F(DataParallelTest, ShardedOptimizerStateKeepsTheLosses) {
  constexpr int kSteps = 20;
  for (bool tied : {true, false}) {
    v1::JobSpec spec = testing::TinyGptJob(tied);
    spec.mutable_pipeline()->set_micro_batch_size(2);
    spec.mutable_pipeline()->set_micro_batches(4);
    const GangRun ref = TrainGang(spec, 1, 1, "1f1b", kSteps);
    spec.mutable_pipeline()->set_micro_batches(2);
    const GangRun whole = TrainGang(spec, 1, 2, "1f1b", 1);
    spec.mutable_optimizer()->set_shard_state(true);
    for (const char* schedule : {"1f1b", "zb_h1"}) {
      for (auto [p, r] : {std::pair{1, 1}, {1, 2}, {2, 2}, {1, 4}}) {
        SCOPED_TRACE(absl::StrCat("tied ", tied, " ", schedule, " P ", p, " R ", r, " sharded"));
        spec.mutable_pipeline()->set_micro_batches(8 / (2 * r));
        const GangRun run = TrainGang(spec, p, r, schedule, kSteps);
        ExpectSameLosses(ref.losses, run.losses, 1e-5);
        for (size_t g = static_cast<size_t>(p); g < run.parameters.size(); ++g) {
          EXPECT_TRUE(run.parameters[g] == run.parameters[g % static_cast<size_t>(p)])
              << "gang rank " << g << " drifted from replica 0";
        }
        if (p == 1 && r == 1) {
          EXPECT_EQ(run.optimizer_bytes, ref.optimizer_bytes) << "R = 1: nothing to shard";
        }
        if (p == 1 && r == 2) {
          ASSERT_EQ(run.optimizer_bytes.size(), 2u);
          for (int64_t bytes : run.optimizer_bytes) {
            EXPECT_LE(static_cast<double>(bytes), 0.55 * whole.optimizer_bytes[0]);
            EXPECT_GE(static_cast<double>(bytes), 0.45 * whole.optimizer_bytes[0]);
          }
        }
      }
    }
  }
}

// Checkpoints are whole and keyed by global names, whatever layout wrote them: a sharded 2 x 2
// gang's checkpoint resumes on one unsharded worker, on 2 x 1 and on a sharded 1 x 4, and an
// unsharded single worker's on a sharded 2 x 2, each continuing with the uninterrupted losses.
TEST_F(DataParallelTest, CheckpointsLoadIntoAnyShardedLayout) {
  constexpr int kFirst = 4, kThen = 4;
  v1::JobSpec spec = testing::TinyGptJob(true);
  spec.mutable_pipeline()->set_micro_batch_size(2);
  auto with = [&](int replicas, bool shard) {
    v1::JobSpec s = spec;
    s.mutable_pipeline()->set_micro_batches(8 / (2 * replicas));
    s.mutable_optimizer()->set_shard_state(shard);
    return s;
  };
  const GangRun ref = TrainGang(with(1, false), 1, 1, "1f1b", kFirst + kThen);
  const std::vector<double> tail(ref.losses.begin() + kFirst, ref.losses.end());

  const GangRun sharded =
      TrainGang(with(2, true), 2, 2, "1f1b", GangOptions{.steps = kFirst, .take_checkpoint = true});
  ASSERT_FALSE(sharded.checkpoint.empty());
  ExpectSameLosses(std::vector<double>(ref.losses.begin(), ref.losses.begin() + kFirst),
                   sharded.losses, 1e-5);
  struct Layout {
    int stages, replicas;
    bool shard;
  };
  for (const Layout& l : {Layout{1, 1, false}, Layout{2, 1, false}, Layout{1, 4, true}}) {
    SCOPED_TRACE(absl::StrCat("resumed on P ", l.stages, " R ", l.replicas, " shard ", l.shard));
    const GangRun resumed = TrainGang(
        with(l.replicas, l.shard), l.stages, l.replicas, "1f1b",
        GangOptions{.steps = kThen, .first_step = kFirst, .restore = &sharded.checkpoint});
    ExpectSameLosses(tail, resumed.losses, 1e-5);
  }
  const GangRun single = TrainGang(with(1, false), 1, 1, "1f1b",
                                   GangOptions{.steps = kFirst, .take_checkpoint = true});
  const GangRun resumed =
      TrainGang(with(2, true), 2, 2, "1f1b",
                GangOptions{.steps = kThen, .first_step = kFirst, .restore = &single.checkpoint});
  ExpectSameLosses(tail, resumed.losses, 1e-5);
  // The same tensors whatever wrote them: a sharded gang's checkpoint is the unsharded one's.
  ASSERT_EQ(single.checkpoint.size(), sharded.checkpoint.size());
  for (const auto& [name, bytes] : single.checkpoint) {
    auto it = sharded.checkpoint.find(name);
    ASSERT_NE(it, sharded.checkpoint.end()) << name;
    EXPECT_EQ(bytes.size(), it->second.size()) << name;
  }
}

// A program of replicas without a reducer, or with one of another group, is refused.
TEST_F(DataParallelTest, ExecutorRefusesAMissingOrMismatchedGroup) {
  v1::JobSpec spec = testing::TinyGptJob(false);
  const std::vector<v1::StageProgram> programs = GangPrograms(spec, 1, 2, "1f1b");
  ASSERT_EQ(programs.size(), 2u);
  const Dataset data = *LoadDataset(spec, ".", TrainingWindow(spec.model()));
  auto compute = CpuStageCompute::Create(programs[1], StageExecutor::MicroBatchSlots(programs[1]));
  ASSERT_TRUE(compute.ok());
  auto ex = StageExecutor::Create(programs[1], data, nullptr, *std::move(compute), nullptr);
  ASSERT_FALSE(ex.ok());
  EXPECT_NE(ex.status().message().find("gradient reducer is required with 2 replicas"),
            std::string::npos)
      << ex.status();
}

}  // namespace
}  // namespace tandem::worker
