#include "common/spec.h"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr char kMinimal[] = R"(
name: tiny
steps: 10
model:
  n_layer: 2
pipeline:
  stages: 2
)";

// The message of a spec that must be rejected as INVALID_ARGUMENT.
std::string LoadError(const std::string& yaml) {
  absl::StatusOr<v1::JobSpec> spec = LoadJobSpecYaml(yaml);
  EXPECT_FALSE(spec.ok()) << "accepted:\n" << yaml;
  if (spec.ok()) return "";
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument) << spec.status();
  return std::string(spec.status().message());
}

TEST(ParseJobSpecYaml, MinimalSpecGetsEveryDefault) {
  absl::StatusOr<v1::JobSpec> spec = LoadJobSpecYaml(kMinimal);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->name(), "tiny");
  EXPECT_EQ(spec->steps(), 10);
  EXPECT_EQ(spec->model().n_layer(), 2);
  // Defaults are present, not just readable.
  EXPECT_TRUE(spec->has_seed());
  EXPECT_EQ(spec->seed(), 1234u);
  EXPECT_TRUE(spec->has_device());
  EXPECT_EQ(spec->device(), "cpu");
  EXPECT_TRUE(spec->model().has_d_model());
  EXPECT_EQ(spec->model().d_model(), 128);
  EXPECT_EQ(spec->model().arch(), "gpt");
  EXPECT_EQ(spec->model().vocab_size(), 256);
  EXPECT_TRUE(spec->has_data());
  EXPECT_EQ(spec->data().source(), "synthetic");
  EXPECT_EQ(spec->data().synthetic_bytes(), 1048576);
  EXPECT_TRUE(spec->has_optimizer());
  EXPECT_TRUE(spec->optimizer().has_lr());
  EXPECT_FLOAT_EQ(spec->optimizer().lr(), 0.003f);
  EXPECT_FLOAT_EQ(spec->optimizer().beta2(), 0.95f);
  EXPECT_EQ(spec->pipeline().micro_batch_size(), 32);
  EXPECT_EQ(spec->pipeline().micro_batches(), 4);
  EXPECT_EQ(spec->pipeline().schedule(), "1f1b");
  EXPECT_EQ(spec->pipeline().partition(), "profile");
  EXPECT_EQ(spec->pipeline().plan(), "");
  EXPECT_EQ(spec->pipeline().transport(), "auto");
  EXPECT_EQ(EffectiveBatch(*spec), 128);
}

TEST(ParseJobSpecYaml, ParseLeavesUnwrittenFieldsUnset) {
  absl::StatusOr<v1::JobSpec> spec = ParseJobSpecYaml("steps: 3\nmodel:\n  context: ~\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_TRUE(spec->has_steps());
  EXPECT_FALSE(spec->has_name());
  EXPECT_FALSE(spec->has_pipeline());
  EXPECT_TRUE(spec->has_model());
  EXPECT_FALSE(spec->model().has_context());
}

TEST(ParseJobSpecYaml, NullValueLeavesDefault) {
  absl::StatusOr<v1::JobSpec> spec = LoadJobSpecYaml("name: a\nsteps:\noptimizer: ~\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->steps(), 50);
  EXPECT_EQ(spec->optimizer().name(), "adamw");
}

TEST(ParseJobSpecYaml, AcceptsNumericSpellings) {
  absl::StatusOr<v1::JobSpec> spec = LoadJobSpecYaml(R"(
name: n
data:
  synthetic_bytes: 1e6
optimizer:
  lr: 1
  eps: 1.0e-6
pipeline:
  micro_batches: +8
  micro_batch_size: 16.0
seed: 18446744073709551615
)");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->data().synthetic_bytes(), 1000000);
  EXPECT_FLOAT_EQ(spec->optimizer().lr(), 1.0f);
  EXPECT_FLOAT_EQ(spec->optimizer().eps(), 1e-6f);
  EXPECT_EQ(spec->pipeline().micro_batches(), 8);
  EXPECT_EQ(spec->pipeline().micro_batch_size(), 16);
  EXPECT_EQ(spec->seed(), 18446744073709551615u);
}

TEST(ParseJobSpecYaml, UnknownTopLevelField) {
  EXPECT_THAT(LoadError("name: a\nstpes: 3\n"),
              AllOf(StartsWith("stpes: unknown field"), HasSubstr("did you mean steps?"),
                    HasSubstr("expected one of: name, model, data, optimizer, pipeline, steps, "
                              "seed, device"),
                    HasSubstr("line 2")));
}

// int64 and uint64 are strings in canonical proto JSON: `validate -o json` output (and what
// `submit --schedule` sends) must parse back.
TEST(ParseJobSpecYaml, QuotedSixtyFourBitIntegersAreTheirJsonForm) {
  absl::StatusOr<v1::JobSpec> spec = LoadJobSpecYaml("{\"seed\": \"5\", \"steps\": 3}");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->seed(), 5u);
}

TEST(ParseJobSpecYaml, UnknownNestedField) {
  EXPECT_THAT(LoadError("pipeline:\n  microbatches: 4\n"),
              AllOf(StartsWith("pipeline.microbatches: unknown field"),
                    HasSubstr("did you mean micro_batches?"),
                    HasSubstr("expected one of: stages, micro_batch_size, micro_batches, "
                              "schedule, partition")));
}

TEST(ParseJobSpecYaml, UnknownFieldWithoutCloseMatchHasNoHint) {
  EXPECT_THAT(LoadError("model:\n  xyzzy_plugh: 1\n"),
              AllOf(StartsWith("model.xyzzy_plugh: unknown field; expected one of: arch,"),
                    ::testing::Not(HasSubstr("did you mean"))));
}

TEST(ParseJobSpecYaml, TopLevelMustBeAMap) {
  EXPECT_THAT(LoadError("- a\n- b\n"),
              AllOf(StartsWith("job spec: expected a map with fields name, model"),
                    HasSubstr("got a list")));
  EXPECT_THAT(LoadError("just a string\n"), StartsWith("job spec: expected a map"));
  EXPECT_THAT(LoadError(""), StartsWith("job spec: the document is empty"));
  EXPECT_THAT(LoadError("# only a comment\n"), StartsWith("job spec: the document is empty"));
}

// The walker's errors (tests/common/proto_yaml_test.cc covers them all) name the job spec and
// its field paths.
TEST(ParseJobSpecYaml, WalkerErrorsNameTheJobSpec) {
  EXPECT_THAT(LoadError("name: a\nmodel:\n  n_layer: [1, 2\n"),
              AllOf(StartsWith("job spec: invalid YAML: "), HasSubstr("(line ")));
  EXPECT_THAT(LoadError("name: a\n---\nname: b\n"),
              StartsWith("job spec: expected one YAML document, got 2"));
  EXPECT_THAT(LoadError("? [a, b]\n: 1\n"), StartsWith("job spec: keys must be field names"));
  EXPECT_THAT(LoadError("model: 4\n"),
              StartsWith("model: expected a map with fields arch, n_layer"));
  EXPECT_THAT(LoadError("pipeline:\n  micro_batches: four\n"),
              StartsWith("pipeline.micro_batches: expected an integer, got 'four'"));
  EXPECT_THAT(LoadError("steps: 3000000000\n"),
              StartsWith("steps: expected an integer in [-2147483648, 2147483647], got "
                         "'3000000000'"));
  EXPECT_THAT(LoadError("pipeline:\n  stages: 2\n  stages: 3\n"),
              StartsWith("pipeline.stages: duplicate key"));
}

TEST(WithDefaults, KeepsExplicitValues) {
  v1::JobSpec spec;
  spec.mutable_pipeline()->set_stages(3);
  spec.mutable_optimizer()->set_lr(0.5f);
  v1::JobSpec full = WithDefaults(spec);
  EXPECT_EQ(full.pipeline().stages(), 3);
  EXPECT_FLOAT_EQ(full.optimizer().lr(), 0.5f);
  EXPECT_TRUE(full.pipeline().has_micro_batches());
  EXPECT_TRUE(full.model().has_n_layer());
  EXPECT_TRUE(full.data().has_seed());
  EXPECT_EQ(full.data().seed(), 0u);
  // Idempotent.
  EXPECT_EQ(WithDefaults(full).SerializeAsString(), full.SerializeAsString());
}

// The llama presets carry the published shapes (the models' config.json) and resolve
// llama's zero fields; what the spec sets wins over the preset.
TEST(WithDefaults, LlamaPresetsAndArchDefaults) {
  v1::JobSpec smol;
  smol.mutable_model()->set_preset("smollm2-135m");
  const v1::ModelSpec m = WithDefaults(smol).model();
  EXPECT_EQ(m.arch(), "llama");
  EXPECT_EQ(m.n_layer(), 30);
  EXPECT_EQ(m.n_head(), 9);
  EXPECT_EQ(m.n_kv_head(), 3);
  EXPECT_EQ(m.d_model(), 576);
  EXPECT_EQ(m.d_hidden(), 1536);
  EXPECT_EQ(m.vocab_size(), 49152);
  EXPECT_DOUBLE_EQ(m.rope_theta(), 100000);
  EXPECT_TRUE(m.tie_embeddings());
  EXPECT_TRUE(ValidateJobSpec(WithDefaults(smol)).ok()) << ValidateJobSpec(WithDefaults(smol));

  v1::JobSpec tiny_llama;
  tiny_llama.mutable_model()->set_preset("tinyllama-1.1b");
  tiny_llama.mutable_model()->set_n_layer(4);  // the spec's own value wins
  const v1::ModelSpec t = WithDefaults(tiny_llama).model();
  EXPECT_EQ(t.n_layer(), 4);
  EXPECT_EQ(t.n_head(), 32);
  EXPECT_EQ(t.n_kv_head(), 4);
  EXPECT_EQ(t.d_model(), 2048);
  EXPECT_EQ(t.d_hidden(), 5632);
  EXPECT_EQ(t.vocab_size(), 32000);
  EXPECT_FALSE(t.tie_embeddings());

  // A bare llama: untied, n_kv_head = n_head, d_hidden = SwiGLU's rounded 8/3 d_model.
  v1::JobSpec bare;
  bare.mutable_model()->set_arch("llama");
  bare.mutable_model()->set_d_model(96);
  bare.mutable_model()->set_n_head(6);
  const v1::ModelSpec b = WithDefaults(bare).model();
  EXPECT_FALSE(b.tie_embeddings());
  EXPECT_EQ(b.n_kv_head(), 6);
  EXPECT_EQ(b.d_hidden(), 256);
  EXPECT_EQ(LlamaDefaultHidden(576), 1536);
  EXPECT_EQ(LlamaDefaultHidden(64), 192);
  // gpt keeps its own meaning of 0 and its tied default.
  EXPECT_EQ(WithDefaults(v1::JobSpec()).model().d_hidden(), 0);
  EXPECT_TRUE(WithDefaults(v1::JobSpec()).model().tie_embeddings());
  // Idempotent.
  EXPECT_EQ(WithDefaults(WithDefaults(bare)).SerializeAsString(),
            WithDefaults(bare).SerializeAsString());
}

struct BadCase {
  const char* yaml;
  const char* prefix;  // the message must begin with this (the field path and the rule)
  const char* also;    // and contain this
};

class ValidateJobSpecTest : public ::testing::TestWithParam<BadCase> {};

TEST_P(ValidateJobSpecTest, RejectsNamingThePath) {
  const BadCase& c = GetParam();
  EXPECT_THAT(LoadError(c.yaml), AllOf(StartsWith(c.prefix), HasSubstr(c.also)));
}

INSTANTIATE_TEST_SUITE_P(
    BadSpecs, ValidateJobSpecTest,
    ::testing::Values(
        BadCase{"name: \"\"\n", "name: must be 1 to 63 characters", "got \"\""},
        BadCase{"name: my job\n", "name: must be 1 to 63 characters", "\"my job\""},
        BadCase{"name: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\n",
                "name: must be 1 to 63", "A-Z"},
        BadCase{"steps: 0\n", "steps: must be in [1, 10000000]", "got 0"},
        BadCase{"steps: 10000001\n", "steps: must be in [1, 10000000]", "got 10000001"},
        BadCase{"device: gpu\n", "device: expected \"cpu\" or \"cuda\"", "got \"gpu\""},
        BadCase{"model:\n  arch: gpt2\n", "model.arch: expected \"gpt\" or \"llama\" or \"mlp_lm\"",
                "got \"gpt2\""},
        BadCase{"model:\n  preset: gpt3\n", "model.preset: expected", "got \"gpt3\""},
        BadCase{"model:\n  arch: gpt\n  d_model: 30\n  n_head: 4\n",
                "model.n_head: must divide model.d_model = 30", "got 4"},
        BadCase{"model:\n  arch: gpt\n  seq_len: 0\n", "model.seq_len: must be in [1, 65536]",
                "got 0"},
        BadCase{"optimizer:\n  lr_schedule: linear\n", "optimizer.lr_schedule: expected",
                "\"linear\""},
        BadCase{"optimizer:\n  grad_clip: -1\n", "optimizer.grad_clip: must be a finite number",
                "got -1"},
        BadCase{"optimizer:\n  min_lr_ratio: 2\n", "optimizer.min_lr_ratio: must be in [0, 1]",
                "got 2"},
        BadCase{"data:\n  val_fraction: 0.9\n", "data.val_fraction: must be in [0, 0.5]", "0.9"},
        BadCase{"data:\n  format: tokens\n", "data.format: the synthetic source generates bytes",
                "format: bytes"},
        BadCase{"data:\n  val_fraction: 0\neval:\n  every: 10\n",
                "eval.every: evaluation needs a validation split", "val_fraction"},
        BadCase{"eval:\n  micro_batches: 0\n", "eval.micro_batches: must be in [1, 65536]",
                "got 0"},
        BadCase{"model:\n  n_layer: 0\n", "model.n_layer: must be in [1, 1024]", "got 0"},
        BadCase{"model:\n  d_model: 65537\n", "model.d_model: must be in [1, 65536]", "65537"},
        BadCase{"model:\n  arch: mlp_lm\n  d_hidden: -1\n", "model.d_hidden: must be >= 0",
                "4 x d_model"},
        BadCase{"model:\n  arch: mlp_lm\n  d_embed: 0\n", "model.d_embed: must be in [1, 65536]",
                "got 0"},
        BadCase{"model:\n  arch: mlp_lm\n  context: 4097\n", "model.context: must be in [1, 4096]",
                "4097"},
        BadCase{"model:\n  vocab_size: 1\n", "model.vocab_size: must be in [2, 1048576]", "got 1"},
        BadCase{"model:\n  vocab_size: 100\n", "model.vocab_size: must be at least 256",
                "one token per byte"},
        BadCase{"data:\n  source: hdfs\n", "data.source: expected \"synthetic\" or \"file\"",
                "\"hdfs\""},
        BadCase{"data:\n  source: file\n", "data.path: required with data.source \"file\"",
                "--data-root"},
        BadCase{"data:\n  source: file\n  path: /etc/passwd\n",
                "data.path: must be relative to the worker's --data-root", "/etc/passwd"},
        BadCase{"data:\n  source: file\n  path: a/../../b.txt\n",
                "data.path: must stay inside the worker's --data-root", "'..'"},
        BadCase{"data:\n  path: corpus.txt\n", "data.path: is set but data.source is",
                "source: file"},
        BadCase{"data:\n  synthetic_bytes: 8\n", "data.synthetic_bytes: must be in [65, ",
                "context + 1"},
        BadCase{"data:\n  synthetic_bytes: 2000000000\n", "data.synthetic_bytes: must be in",
                "1073741824"},
        BadCase{"optimizer:\n  name: adam\n", "optimizer.name: expected \"adamw\" or \"sgd\"",
                "\"adam\""},
        BadCase{"optimizer:\n  lr: 0\n", "optimizer.lr: must be a finite number in (0, 10]",
                "got 0"},
        BadCase{"optimizer:\n  lr: 11\n", "optimizer.lr: must be", "got 11"},
        BadCase{"optimizer:\n  lr: .nan\n", "optimizer.lr: must be a finite", "nan"},
        BadCase{"optimizer:\n  lr: .inf\n", "optimizer.lr: must be a finite", "inf"},
        BadCase{"optimizer:\n  beta1: 1\n", "optimizer.beta1: must be in [0, 1)", "got 1"},
        BadCase{"optimizer:\n  beta2: -0.1\n", "optimizer.beta2: must be in [0, 1)", "-0.1"},
        BadCase{"optimizer:\n  eps: 0\n", "optimizer.eps: must be a finite number > 0", "0"},
        BadCase{"optimizer:\n  weight_decay: -1\n", "optimizer.weight_decay: must be", ">= 0"},
        BadCase{"optimizer:\n  warmup_steps: -1\n", "optimizer.warmup_steps: must be >= 0", "-1"},
        BadCase{"pipeline:\n  stages: 0\n", "pipeline.stages: must be in [1, 4096]", "got 0"},
        BadCase{"model:\n  n_layer: 4\npipeline:\n  stages: 7\n  micro_batches: 8\n",
                "pipeline.stages: 7 stages but the model has only 6 layers",
                "every stage needs at least one layer"},
        BadCase{"pipeline:\n  micro_batch_size: 0\n", "pipeline.micro_batch_size: must be in [1,",
                "got 0"},
        BadCase{"pipeline:\n  micro_batches: 0\n", "pipeline.micro_batches: must be in [1,",
                "got 0"},
        BadCase{"pipeline:\n  schedule: zb\n",
                "pipeline.schedule: expected \"gpipe\" or \"1f1b\" or \"interleaved_1f1b\"",
                "\"zb\""},
        BadCase{"pipeline:\n  stages: 4\n  micro_batches: 2\n",
                "pipeline.schedule: 1f1b needs at least as many micro-batches as pipeline ranks",
                "use schedule: gpipe"},
        BadCase{"pipeline:\n  stages: 2\n  micro_batches: 3\n  schedule: interleaved_1f1b\n",
                "pipeline.schedule: ", "3"},
        BadCase{"pipeline:\n  stages: 2\n  chunks: 3\n", "pipeline.schedule: ", "3"},
        BadCase{"model:\n  n_layer: 1\npipeline:\n  stages: 2\n  schedule: zb_v\n",
                "pipeline.stages: 2 workers x 2 chunks = 4 stages but the model has only 3",
                "stages x chunks"},
        BadCase{"pipeline:\n  stages: 2\n  schedule_csv: \"0F0,0B0\\n1F0\\n\"\n",
                "pipeline.schedule_csv: invalid schedule", "rank 1"},
        BadCase{"pipeline:\n  partition: balanced\n",
                "pipeline.partition: expected \"uniform\" or \"parameters\"", "\"balanced\""},
        BadCase{"pipeline:\n  partition: manual\n  cuts: [4, 2]\n", "pipeline.cuts: ", "cut"},
        BadCase{"model:\n  n_layer: 4\npipeline:\n  partition: manual\n  cuts: [9]\n",
                "pipeline.cuts: ", "9"},
        BadCase{"pipeline:\n  partition: manual\n", "pipeline.cuts: ", "2 stages need 1 cut"},
        BadCase{"pipeline:\n  cuts: [2]\n", "pipeline.cuts: cut points apply to partition: manual",
                "manual"},
        BadCase{"pipeline:\n  memory_budget_mb: -1\n", "pipeline.memory_budget_mb: must be", "-1"},
        BadCase{"pipeline:\n  transport: NCCL\n", "pipeline.transport: expected \"auto\"",
                "got \"NCCL\""},
        BadCase{"pipeline:\n  transport: nccl\n", "pipeline.transport: nccl needs device: cuda",
                "\"cpu\""}));

// auto, nccl and gloo on cuda; auto and gloo on cpu (cpu jobs run over Gloo either way).
TEST(ValidateJobSpec, TransportValues) {
  for (const char* yaml : {"device: cuda\npipeline:\n  transport: auto\n",
                           "device: cuda\npipeline:\n  transport: nccl\n",
                           "device: cuda\npipeline:\n  transport: gloo\n",
                           "pipeline:\n  transport: gloo\n", "pipeline:\n  transport: auto\n"}) {
    absl::StatusOr<v1::JobSpec> spec = LoadJobSpecYaml(yaml);
    EXPECT_TRUE(spec.ok()) << yaml << ": " << spec.status();
  }
}

TEST(ValidateJobSpec, ManualCutsAreAccepted) {
  absl::StatusOr<v1::JobSpec> spec =
      LoadJobSpecYaml("model:\n  n_layer: 4\npipeline:\n  partition: manual\n  cuts: [5]\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->pipeline().cuts(0), 5);
}

TEST(ValidateJobSpec, GPipeAllowsFewerMicroBatchesThanStages) {
  absl::StatusOr<v1::JobSpec> spec =
      LoadJobSpecYaml("pipeline:\n  stages: 4\n  micro_batches: 2\n  schedule: gpipe\n");
  EXPECT_TRUE(spec.ok()) << spec.status();
}

TEST(ValidateJobSpec, StagesUpToLayerCount) {
  absl::StatusOr<v1::JobSpec> spec =
      LoadJobSpecYaml("model:\n  n_layer: 4\npipeline:\n  stages: 6\n  micro_batches: 6\n");
  EXPECT_TRUE(spec.ok()) << spec.status();
}

TEST(ValidateJobSpec, FileSourceWithRelativePath) {
  absl::StatusOr<v1::JobSpec> spec =
      LoadJobSpecYaml("data:\n  source: file\n  path: books/corpus.txt\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->data().path(), "books/corpus.txt");
}

// Every shipped example must load, so the docs never show a spec the service refuses.
TEST(Examples, EveryExampleLoadsAndValidates) {
  const std::filesystem::path dir = std::filesystem::path(TANDEM_SOURCE_DIR) / "examples";
  int count = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() != ".yaml") continue;
    ++count;
    std::ifstream in(entry.path());
    std::stringstream text;
    text << in.rdbuf();
    absl::StatusOr<v1::JobSpec> spec = LoadJobSpecYaml(text.str());
    EXPECT_TRUE(spec.ok()) << entry.path() << ": " << spec.status();
  }
  EXPECT_GE(count, 4) << "expected the examples in " << dir;
}

}  // namespace
}  // namespace tandem
