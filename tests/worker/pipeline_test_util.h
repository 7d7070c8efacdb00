// Helpers for the worker tests: a tiny job and its stage programs, built the way the
// coordinator builds them (common/pipeline_plan.h).
#ifndef TANDEM_TESTS_WORKER_PIPELINE_TEST_UTIL_H_
#define TANDEM_TESTS_WORKER_PIPELINE_TEST_UTIL_H_

#include <functional>
#include <string>
#include <vector>

#include "common/pipeline_plan.h"
#include "gtest/gtest.h"
#include "tandem/v1/common.pb.h"

namespace tandem::worker::testing {

// n_layer 3, d_model 32, context 4, micro_batch_size 8 x 4 micro-batches, synthetic data.
inline v1::JobSpec TinyJob() {
  v1::JobSpec spec;
  spec.set_seed(1234);
  auto* m = spec.mutable_model();
  m->set_arch("mlp_lm");
  m->set_n_layer(3);
  m->set_d_model(32);
  m->set_d_embed(8);
  m->set_context(4);
  m->set_vocab_size(256);
  spec.mutable_data()->set_source("synthetic");
  spec.mutable_data()->set_synthetic_bytes(1 << 16);
  spec.mutable_optimizer()->set_name("adamw");
  spec.mutable_optimizer()->set_lr(0.01f);
  spec.mutable_optimizer()->set_weight_decay(0.1f);
  auto* p = spec.mutable_pipeline();
  p->set_micro_batch_size(8);
  p->set_micro_batches(4);
  return spec;
}

// A tiny GPT: 2 blocks, d_model 16, 2 heads, seq_len 8, bytes; 1 x 8 sequences per step.
inline v1::JobSpec TinyGptJob(bool tie_embeddings) {
  v1::JobSpec spec;
  spec.set_seed(99);
  auto* m = spec.mutable_model();
  m->set_arch("gpt");
  m->set_n_layer(2);
  m->set_n_head(2);
  m->set_d_model(16);
  m->set_seq_len(8);
  m->set_vocab_size(256);
  m->set_tie_embeddings(tie_embeddings);
  spec.mutable_data()->set_source("synthetic");
  spec.mutable_data()->set_synthetic_bytes(1 << 15);
  spec.mutable_optimizer()->set_name("adamw");
  spec.mutable_optimizer()->set_lr(0.01f);
  spec.mutable_optimizer()->set_weight_decay(0.1f);
  auto* p = spec.mutable_pipeline();
  p->set_micro_batch_size(8);
  p->set_micro_batches(1);
  return spec;
}

// A llama of 6 blocks (8 layers: four stages of two, or eight of one for the interleaved and
// V schedules on four workers) at width 16: 4 query heads of size 4 sharing 2 kv heads, SwiGLU
// width 32, seq_len 8, byte vocabulary.
inline v1::JobSpec TinyLlamaJob(bool tie_embeddings) {
  v1::JobSpec spec = TinyGptJob(tie_embeddings);
  auto* m = spec.mutable_model();
  m->set_arch("llama");
  m->set_n_layer(6);
  m->set_n_head(4);
  m->set_n_kv_head(2);
  m->set_d_hidden(32);
  m->set_rope_theta(10000);
  m->set_rms_eps(1e-5);
  return spec;
}

// Changes a plan's schedule before its programs are made (a test's own placement of actions).
using ScheduleEdit = std::function<void(Schedule*)>;

// One program per worker, from the plan the coordinator would make (PlanPipeline) for `spec`
// with `stages` workers and `schedule` (chunks: the schedule's default unless given), after
// `edit` when set. The plan's errors are test bugs, hence no Status here.
inline std::vector<v1::StageProgram> MakePrograms(v1::JobSpec spec, int stages,
                                                  const std::string& schedule,
                                                  const std::string& job_id = "job-1",
                                                  int chunks = 0, const ScheduleEdit& edit = {}) {
  spec.mutable_pipeline()->set_stages(stages);
  spec.mutable_pipeline()->set_schedule(schedule);
  spec.mutable_pipeline()->set_chunks(chunks);
  absl::StatusOr<PipelinePlan> plan = PlanPipeline(spec);
  if (!plan.ok()) {
    ADD_FAILURE() << "PlanPipeline: " << plan.status();
    return {};
  }
  if (edit) edit(&plan->schedule);
  std::vector<v1::StageProgram> out;
  for (int r = 0; r < stages; ++r) {
    out.push_back(StageProgramFor(*plan, spec, r, job_id, job_id + "/"));
  }
  return out;
}

}  // namespace tandem::worker::testing

#endif  // TANDEM_TESTS_WORKER_PIPELINE_TEST_UTIL_H_
