// Helpers for the worker tests: a tiny job and its stage programs, built the way the
// coordinator builds them (schedule generator + LowerWithTransfers + UniformPartition).
#ifndef TANDEM_TESTS_WORKER_PIPELINE_TEST_UTIL_H_
#define TANDEM_TESTS_WORKER_PIPELINE_TEST_UTIL_H_

#include <string>
#include <vector>

#include "common/model_desc.h"
#include "common/schedule.h"
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

// One program per stage. The schedule's errors are test bugs, hence no Status here.
inline std::vector<v1::StageProgram> MakePrograms(const v1::JobSpec& spec, int stages,
                                                  const std::string& schedule,
                                                  const std::string& job_id = "job-1") {
  const int m = spec.pipeline().micro_batches();
  Program compute = *GenerateSchedule(schedule, stages, m);
  Program lowered = LowerWithTransfers(compute, stages);
  std::vector<LayerRange> ranges = *UniformPartition(spec.model(), stages);
  std::vector<v1::StageProgram> out;
  for (int s = 0; s < stages; ++s) {
    v1::StageProgram p;
    p.set_job_id(job_id);
    p.set_rank(s);
    p.set_num_ranks(stages);
    p.set_stage(s);
    p.set_num_stages(stages);
    p.set_layer_begin(ranges[s].begin);
    p.set_layer_end(ranges[s].end);
    for (const Action& a : lowered[s]) *p.add_actions() = ToProto(a);
    *p.mutable_spec() = spec;
    p.set_rendezvous_prefix(job_id + "/");
    p.set_micro_batches(m);
    out.push_back(p);
  }
  return out;
}

}  // namespace tandem::worker::testing

#endif  // TANDEM_TESTS_WORKER_PIPELINE_TEST_UTIL_H_
