// Bad job specs, one table: every field of tandem.v1.JobSpec has at least one malformed
// value here, and each must be refused with the status code the coordinator returns, a
// message that starts with the field's path and says the rule that was broken.
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/partitioner.h"
#include "common/pipeline_plan.h"
#include "common/spec.h"
#include "gmock/gmock.h"
#include "google/protobuf/descriptor.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::StartsWith;

struct Malformed {
  const char* yaml;
  const char* field;  // the message starts with "<field>:"
  const char* rule;   // and says this
  absl::StatusCode code = absl::StatusCode::kInvalidArgument;
};

// Printed by gtest as the case's name in a failure.
std::ostream& operator<<(std::ostream& os, const Malformed& c) {
  return os << c.field << " <- " << c.yaml;
}

// Wrong types (one per kind of field), then each field's own rule.
const Malformed kCases[] = {
    // --- wrong types and shapes
    {"name: [a, b]\n", "name", "expected a string, got a list"},
    {"steps: ten\n", "steps", "expected an integer, got 'ten'"},
    {"steps: 2.5\n", "steps", "not a whole number"},
    {"steps: \"5\"\n", "steps", "write the number without quotes"},
    {"seed: -1\n", "seed", "expected an integer in [0, 18446744073709551615]"},
    {"seed: {a: 1}\n", "seed", "got a map"},
    {"device: [cpu]\n", "device", "expected a string"},
    {"model: [1]\n", "model", "expected a map with fields arch"},
    {"model:\n  tie_embeddings: yes\n", "model.tie_embeddings", "expected true or false"},
    {"model:\n  tie_embeddings: \"true\"\n", "model.tie_embeddings", "expected true or false"},
    {"model:\n  n_layer: 1e10\n", "model.n_layer", "expected an integer in [-2147483648"},
    {"data:\n  seed: x\n", "data.seed", "expected an integer"},
    {"data:\n  synthetic_bytes: 1.5\n", "data.synthetic_bytes", "not a whole number"},
    {"data:\n  val_fraction: half\n", "data.val_fraction", "expected a number, got 'half'"},
    {"optimizer:\n  lr: \"0.1\"\n", "optimizer.lr", "expected a number, got the string"},
    {"optimizer:\n  beta1: 1e40\n", "optimizer.beta1", "single-precision range"},
    {"pipeline:\n  cuts: 3\n", "pipeline.cuts", "expected a list"},
    {"pipeline:\n  cuts: [1, ~]\n", "pipeline.cuts[1]", "expected a value, got nothing"},
    {"pipeline:\n  cuts: [1, x]\n", "pipeline.cuts[1]", "expected an integer"},
    {"pipeline:\n  memory_budget_mb: lots\n", "pipeline.memory_budget_mb", "expected an integer"},
    {"pipeline:\n  stagse: 2\n", "pipeline.stagse", "unknown field (did you mean stages?)"},
    {"checkpoint:\n  every: often\n", "checkpoint.every", "expected an integer"},
    {"init:\n  hf_file: [a]\n", "init.hf_file", "expected a string"},
    {"eval: 3\n", "eval", "expected a map with fields every, micro_batches"},
    // --- top level
    {"name: \"a/b\"\n", "name", "1 to 63 characters of A-Z a-z 0-9 . _ -"},
    {"steps: -3\n", "steps", "must be in [1, 10000000], got -3"},
    {"device: tpu\n", "device", "expected \"cpu\" or \"cuda\", got \"tpu\""},
    {"precision: fp16\n", "precision", "got \"fp16\""},
    {"precision: [bf16]\n", "precision", "expected a string"},
    {"precision: bf16\n", "precision", "bf16 needs device: cuda"},
    {"device: cuda\nmodel:\n  arch: mlp_lm\n", "model.arch",
     "device cuda runs gpt and llama models only"},
    {"device: cuda\noptimizer:\n  name: sgd\n", "optimizer.name", "device cuda supports adamw"},
    {"max_restarts: -1\n", "max_restarts", "must be in [0, 1000], got -1"},
    {"max_restarts: many\n", "max_restarts", "expected an integer, got 'many'"},
    // --- model: negative or zero sizes, divisibility, size
    {"model:\n  n_layer: -1\n", "model.n_layer", "must be in [1, 1024], got -1"},
    {"model:\n  d_model: 0\n", "model.d_model", "must be in [1, 65536], got 0"},
    {"model:\n  d_model: -64\n", "model.d_model", "must be in [1, 65536], got -64"},
    {"model:\n  d_model: 100\n  n_head: 3\n", "model.n_head", "must divide model.d_model = 100"},
    {"model:\n  n_head: 0\n", "model.n_head", "must be in [1, 1024], got 0"},
    {"model:\n  seq_len: -8\n", "model.seq_len", "must be in [1, 65536], got -8"},
    {"model:\n  d_hidden: -1\n", "model.d_hidden", "must be >= 0 (0 means 4 x d_model)"},
    {"model:\n  arch: mlp_lm\n  d_hidden: 300000\n", "model.d_hidden", "must be in [0, 262144]"},
    {"model:\n  arch: mlp_lm\n  d_embed: -2\n", "model.d_embed", "must be in [1, 65536], got -2"},
    {"model:\n  arch: mlp_lm\n  context: 0\n", "model.context", "must be in [1, 4096], got 0"},
    {"model:\n  vocab_size: 0\n", "model.vocab_size", "must be in [2, 1048576], got 0"},
    {"model:\n  arch: transformer\n", "model.arch", "expected \"gpt\" or \"llama\" or \"mlp_lm\""},
    // --- llama: grouped-query heads, RoPE's even head size, its constants
    {"model:\n  arch: llama\n  n_head: 4\n  n_kv_head: 3\n", "model.n_kv_head",
     "must divide model.n_head = 4"},
    {"model:\n  arch: llama\n  n_kv_head: -2\n", "model.n_kv_head", "must be in [1, 1024], got -2"},
    {"model:\n  arch: llama\n  d_model: 36\n  n_head: 4\n", "model.n_head",
     "odd head size model.d_model / model.n_head = 9"},
    {"model:\n  arch: llama\n  rope_theta: 0\n", "model.rope_theta", "must be a finite number > 1"},
    {"model:\n  arch: llama\n  rms_eps: -1\n", "model.rms_eps", "must be in (0, 1], got -1"},
    {"model:\n  arch: llama\n  rms_eps: [1]\n", "model.rms_eps", "expected a number"},
    {"model:\n  preset: gpt4\n", "model.preset", "expected \"\" or \"gpt2\" or \"gpt2-tiny\""},
    {"model:\n  d_model: 65536\n  n_head: 1\n  vocab_size: 65536\n", "model",
     "too large: model.vocab_size x model.d_model"},
    {"model:\n  n_layer: 1024\n  d_model: 4096\n  n_head: 32\n", "model",
     "a worker builds at most 4294967296"},
    {"model:\n  arch: mlp_lm\n  d_model: 65536\n  d_hidden: 1\n  context: 4096\n  d_embed: "
     "64\n",
     "model", "model.d_model x model.context x model.d_embed"},
    // --- data
    {"data:\n  source: s3\n", "data.source", "expected \"synthetic\" or \"file\""},
    {"data:\n  source: file\n  path: \"\"\n", "data.path", "required with data.source \"file\""},
    {"data:\n  source: file\n  path: /data/train.bin\n", "data.path",
     "must be relative to the worker's --data-root"},
    {"data:\n  source: file\n  path: ../secret\n", "data.path", "'..' is not allowed"},
    {"data:\n  source: file\n  path: \"shards/..\\\\..\\\\x\"\n", "data.path",
     "'..' is not allowed"},
    {"data:\n  source: file\n  path: \"s*/train.bin\"\n", "data.path",
     "only the last path component may hold the wildcards"},
    {"data:\n  source: file\n  path: a.txt\n  val_path: /etc/shadow\n", "data.val_path",
     "must be relative to the worker's --data-root"},
    {"data:\n  source: file\n  path: a.txt\n  val_path: v/../../x\n", "data.val_path",
     "'..' is not allowed"},
    {"data:\n  val_path: v.txt\n", "data.val_path", "is set but data.source is \"synthetic\""},
    {"data:\n  source: file\n  path: a.txt\n  format: utf8\n", "data.format",
     "expected \"bytes\" or \"tokens\""},
    {"data:\n  synthetic_bytes: -1\n", "data.synthetic_bytes", "must be in [65, 1073741824]"},
    {"data:\n  val_fraction: -0.1\n", "data.val_fraction", "must be in [0, 0.5]"},
    {"data:\n  val_fraction: .nan\n", "data.val_fraction", "must be in [0, 0.5]"},
    // --- optimizer
    {"optimizer:\n  name: lion\n", "optimizer.name", "expected \"adamw\" or \"sgd\""},
    {"optimizer:\n  lr: -0.001\n", "optimizer.lr", "must be a finite number in (0, 10]"},
    {"optimizer:\n  beta1: -0.5\n", "optimizer.beta1", "must be in [0, 1)"},
    {"optimizer:\n  beta2: 1.5\n", "optimizer.beta2", "must be in [0, 1)"},
    {"optimizer:\n  eps: -1e-8\n", "optimizer.eps", "must be a finite number > 0"},
    {"optimizer:\n  weight_decay: .inf\n", "optimizer.weight_decay", "must be a finite number"},
    {"optimizer:\n  warmup_steps: -10\n", "optimizer.warmup_steps", "must be >= 0"},
    {"optimizer:\n  lr_schedule: step\n", "optimizer.lr_schedule",
     "expected \"constant\" or \"cosine\""},
    {"optimizer:\n  min_lr_ratio: -0.1\n", "optimizer.min_lr_ratio", "must be in [0, 1]"},
    {"optimizer:\n  grad_clip: .nan\n", "optimizer.grad_clip", "must be a finite number >= 0"},
    {"optimizer:\n  shard_state: sometimes\n", "optimizer.shard_state", "expected true or false"},
    // --- pipeline: M < 1, more stages than layers, schedules and their constraints
    {"pipeline:\n  stages: -2\n", "pipeline.stages", "must be in [1, 4096], got -2"},
    {"pipeline:\n  micro_batches: -1\n", "pipeline.micro_batches", "must be in [1, 65536]"},
    {"pipeline:\n  micro_batch_size: -32\n", "pipeline.micro_batch_size", "must be in [1, "},
    {"pipeline:\n  chunks: -1\n", "pipeline.chunks", "must be in [0, 64], got -1"},
    {"model:\n  n_layer: 2\npipeline:\n  stages: 5\n  micro_batches: 5\n", "pipeline.stages",
     "5 stages but the model has only 4 layers"},
    {"model:\n  n_layer: 2\npipeline:\n  stages: 2\n  micro_batches: 4\n  schedule: "
     "interleaved_1f1b\n  chunks: 3\n",
     "pipeline.stages", "2 workers x 3 chunks = 6 stages but the model has only 4 layers"},
    {"model:\n  n_layer: 100\npipeline:\n  stages: 64\n  micro_batches: 65536\n",
     "pipeline.micro_batches", "(stage, micro-batch) pairs per step, over the limit of 262144"},
    {"model:\n  n_layer: 10\npipeline:\n  stages: 8\neval:\n  every: 1\n  micro_batches: "
     "65536\n",
     "eval.micro_batches", "over the limit of 262144"},
    {"pipeline:\n  schedule: chimera\n", "pipeline.schedule", "got \"chimera\""},
    {"pipeline:\n  stages: 3\n  micro_batches: 2\n", "pipeline.schedule",
     "1f1b needs at least as many micro-batches as pipeline ranks"},
    {"pipeline:\n  stages: 3\n  micro_batches: 2\n  schedule: zb_h1\n", "pipeline.schedule",
     "zb_h1"},
    {"pipeline:\n  stages: 2\n  micro_batches: 5\n  schedule: interleaved_1f1b\n",
     "pipeline.schedule", "interleaved_1f1b"},
    {"pipeline:\n  stages: 2\n  micro_batches: 4\n  schedule: zb_v\n  chunks: 3\n",
     "pipeline.schedule", "zb_v"},
    {"pipeline:\n  stages: 2\n  micro_batches: 4\n  schedule: gpipe\n  chunks: 2\n",
     "pipeline.schedule", "gpipe"},
    {"pipeline:\n  schedule_csv: \"not,a,schedule\"\n", "pipeline.schedule_csv", ""},
    {"pipeline:\n  stages: 2\n  schedule_csv: \"0F0,0F1\\n1F0,1F1\\n\"\n", "pipeline.schedule_csv",
     ""},
    {"pipeline:\n  partition: random\n", "pipeline.partition", "got \"random\""},
    {"pipeline:\n  partition: manual\n  cuts: [0]\n", "pipeline.cuts", ""},
    {"pipeline:\n  partition: manual\n  cuts: [1, 2]\n", "pipeline.cuts", "1 cut"},
    {"pipeline:\n  partition: uniform\n  cuts: [3]\n", "pipeline.cuts",
     "apply to partition: manual only"},
    {"pipeline:\n  memory_budget_mb: -5\n", "pipeline.memory_budget_mb", "must be in [0, "},
    {"pipeline:\n  plan: fast\n", "pipeline.plan", "expected \"\" or \"auto\""},
    {"pipeline:\n  plan: auto\n  partition: manual\n  cuts: [3]\n", "pipeline.plan",
     "manual cut points do not carry over"},
    {"pipeline:\n  plan: auto\n  stages: 2\n  micro_batches: 1\n  schedule_csv: "
     "\"0F0,0B0\\n1F0,1B0\\n\"\n",
     "pipeline.plan", "does not apply with pipeline.schedule_csv"},
    {"pipeline:\n  transport: mpi\n", "pipeline.transport",
     "expected \"auto\" or \"nccl\" or \"gloo\", got \"mpi\""},
    {"pipeline:\n  transport: [nccl]\n", "pipeline.transport", "expected a string"},
    {"pipeline:\n  transport: nccl\n", "pipeline.transport",
     "nccl needs device: cuda, got device: \"cpu\""},
    {"pipeline:\n  replicas: 0\n", "pipeline.replicas", "must be in [1, 1024]"},
    {"pipeline:\n  replicas: 1025\n", "pipeline.replicas", "must be in [1, 1024]"},
    {"model:\n  n_layer: 8\npipeline:\n  stages: 8\n  micro_batches: 8\n  replicas: 1000\n",
     "pipeline.replicas", "8 stages x 1000 replicas = 8000 workers, over the limit of 4096"},
    {"device: cuda\noptimizer:\n  shard_state: true\npipeline:\n  replicas: 2\n",
     "optimizer.shard_state", "sharded optimizer state runs on cpu workers only"},
    {"pipeline:\n  recompute: some\n", "pipeline.recompute",
     "expected \"none\" or \"full\" or \"selective\" or \"auto\", got \"some\""},
    {"model:\n  arch: mlp_lm\npipeline:\n  recompute: selective\n", "pipeline.recompute",
     "mlp_lm has none"},
    // --- eval, checkpoint, init
    {"eval:\n  every: -1\n", "eval.every", "must be >= 0 (0 never evaluates)"},
    {"eval:\n  micro_batches: -4\n", "eval.micro_batches", "must be in [1, 65536]"},
    {"checkpoint:\n  every: -1\n", "checkpoint.every", "must be >= 0"},
    {"checkpoint:\n  keep: 0\n", "checkpoint.keep", "must be in [1, 1000], got 0"},
    {"checkpoint:\n  keep: -2\n", "checkpoint.keep", "must be in [1, 1000], got -2"},
    {"init:\n  from_job: ../../etc\n", "init.from_job", "must be a job id such as \"job-3\""},
    {"init:\n  from_job: job-1/x\n", "init.from_job", "must be a job id"},
    {"init:\n  from_job: job-1\n  hf_file: gpt2.safetensors\n", "init",
     "set from_job (resume) or hf_file (fine-tune), not both"},
    {"init:\n  hf_file: /root/gpt2.safetensors\n", "init.hf_file",
     "must be relative to the coordinator's <data-root>/models"},
    {"init:\n  hf_file: ../checkpoints/job-1/x.safetensors\n", "init.hf_file",
     "'..' is not allowed"},
    {"model:\n  arch: mlp_lm\ninit:\n  hf_file: gpt2.safetensors\n", "init.hf_file",
     "needs model.arch gpt"},
    // --- elastic
    {"elastic:\n  min_workers: -1\n", "elastic.min_workers", "must be in [0, 4096], got -1"},
    {"elastic:\n  max_workers: 4\n", "elastic.max_workers", "needs elastic.min_workers >= 1"},
    {"elastic:\n  min_workers: x\n", "elastic.min_workers", "expected an integer"},
    {"pipeline:\n  stages: 2\nelastic:\n  min_workers: 3\n", "elastic.min_workers",
     "must be at most the gang as written (2 stages x 1 replicas = 2), got 3"},
    {"pipeline:\n  stages: 2\nelastic:\n  min_workers: 2\n  max_workers: 1\n",
     "elastic.max_workers", "must be in [2, 4096], got 1"},
    {"pipeline:\n  stages: 4\nelastic:\n  min_workers: 1\n  max_workers: 3\n",
     "elastic.max_workers", "must be at least the gang as written (4), or 0 for it, got 3"},
};

class MalformedSpecTest : public ::testing::TestWithParam<Malformed> {};

TEST_P(MalformedSpecTest, RefusedNamingTheFieldAndTheRule) {
  const Malformed& c = GetParam();
  absl::StatusOr<v1::JobSpec> spec = LoadJobSpecYaml(c.yaml);
  ASSERT_FALSE(spec.ok()) << "accepted:\n" << c.yaml;
  EXPECT_EQ(spec.status().code(), c.code) << spec.status();
  EXPECT_THAT(std::string(spec.status().message()),
              AllOf(StartsWith(absl::StrCat(c.field, ": ")), HasSubstr(c.rule)));
}

INSTANTIATE_TEST_SUITE_P(Table, MalformedSpecTest, ::testing::ValuesIn(kCases));

// pipeline.recompute: selective is accepted for gpt and llama on both kinds of worker (the
// table refuses it for mlp_lm), beside none and full; full and auto on cuda too (its backend
// recomputes a stage at once).
TEST(RecomputeSpec, SelectiveIsAcceptedForGptAndLlamaOnBothBackends) {
  for (const char* yaml :
       {"pipeline:\n  recompute: selective\n",
        "model:\n  arch: llama\npipeline:\n  recompute: selective\n",
        "device: cuda\npipeline:\n  recompute: selective\n",
        "device: cuda\nmodel:\n  arch: llama\npipeline:\n  recompute: selective\n",
        "pipeline:\n  recompute: full\n", "pipeline:\n  recompute: none\n",
        "pipeline:\n  recompute: auto\n", "device: cuda\npipeline:\n  recompute: auto\n",
        "device: cuda\npipeline:\n  recompute: full\n"}) {
    absl::StatusOr<v1::JobSpec> spec = LoadJobSpecYaml(yaml);
    ASSERT_TRUE(spec.ok()) << yaml << spec.status();
  }
}

// cuda workers reduce gradients with NCCL: data parallelism is accepted there, unsharded.
TEST(DataParallelSpec, CudaReplicasAreAcceptedWithoutShardedState) {
  for (const char* yaml : {"device: cuda\npipeline:\n  replicas: 2\n",
                           "device: cuda\noptimizer:\n  shard_state: false\npipeline:\n  "
                           "stages: 2\n  replicas: 4\n"}) {
    absl::StatusOr<v1::JobSpec> spec = LoadJobSpecYaml(yaml);
    ASSERT_TRUE(spec.ok()) << yaml << spec.status();
  }
}

// The paths of every scalar and repeated leaf field of `d`, e.g. "pipeline.cuts".
void LeafPaths(const google::protobuf::Descriptor* d, const std::string& prefix,
               std::vector<std::string>* out) {
  for (int i = 0; i < d->field_count(); ++i) {
    const google::protobuf::FieldDescriptor* f = d->field(i);
    const std::string path = prefix.empty() ? f->name() : absl::StrCat(prefix, ".", f->name());
    if (f->cpp_type() == google::protobuf::FieldDescriptor::CPPTYPE_MESSAGE) {
      LeafPaths(f->message_type(), path, out);
    } else {
      out->push_back(path);
    }
  }
}

// A field added to spec.proto without a malformed case here fails this test: every field
// has a rule (at least its type), and the table shows it.
TEST(MalformedSpecTable, CoversEveryFieldOfTheSpec) {
  std::set<std::string> covered;
  for (const Malformed& c : kCases) {
    std::string field = c.field;
    if (size_t bracket = field.find('['); bracket != std::string::npos) field.resize(bracket);
    covered.insert(field);
  }
  std::vector<std::string> leaves;
  LeafPaths(v1::JobSpec::descriptor(), "", &leaves);
  ASSERT_GT(leaves.size(), 40u);
  for (const std::string& leaf : leaves) {
    EXPECT_TRUE(covered.count(leaf)) << leaf << " has no malformed case in kCases";
  }
  EXPECT_GE(sizeof(kCases) / sizeof(kCases[0]), 30u);
}

// The same table through the path the coordinator takes for a SubmitJobRequest.spec (no
// YAML): WithDefaults + ValidateJobSpec give the same verdict.
TEST(MalformedSpecTable, ValidateAgreesWithLoadForParsedSpecs) {
  for (const Malformed& c : kCases) {
    absl::StatusOr<v1::JobSpec> parsed = ParseJobSpecYaml(c.yaml);
    if (!parsed.ok()) continue;  // a type error: there is no message to validate
    absl::Status s = ValidateJobSpec(WithDefaults(*parsed));
    EXPECT_EQ(s.code(), c.code) << c;
    EXPECT_THAT(std::string(s.message()), StartsWith(absl::StrCat(c.field, ": "))) << c;
  }
}

// Found by tests/fuzz/spec_fuzz: a stray ',' made yaml-cpp 0.7's LoadAll loop forever,
// allocating an empty document per pass until the coordinator ran out of memory
// (jbeder/yaml-cpp#1040). Now: INVALID_ARGUMENT at once, naming the place.
TEST(MalformedSpecText, StrayCommaDoesNotHangTheParser) {
  for (const char* yaml : {",", ", b\n", "# c\n, b\n", "name: a\n, steps: 3\n", "# x\n  , y\n"}) {
    absl::StatusOr<v1::JobSpec> spec = ParseJobSpecYaml(yaml);
    ASSERT_FALSE(spec.ok()) << yaml;
    EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument) << yaml;
    EXPECT_THAT(std::string(spec.status().message()), StartsWith("job spec: invalid YAML")) << yaml;
  }
  // Documents are still counted.
  absl::StatusOr<v1::JobSpec> spec = ParseJobSpecYaml("name: a\n---\nname: b\n---\n{}\n");
  EXPECT_THAT(std::string(spec.status().message()), HasSubstr("expected one YAML document, got 3"));
}

// YAML allows no control characters but tab, LF and CR: refused before the parser, naming
// where they are.
TEST(MalformedSpecText, ControlCharactersAreRefused) {
  absl::StatusOr<v1::JobSpec> spec = ParseJobSpecYaml(std::string("# a\0\nname: b\n", 13));
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(spec.status().message(),
            "job spec: invalid YAML: control character 0x00 is not allowed (line 1, column 4)");
  spec = ParseJobSpecYaml("name: a\nsteps: 3\x1b[2J\n");
  EXPECT_THAT(std::string(spec.status().message()),
              AllOf(HasSubstr("line 2, column 9"), HasSubstr("0x1b")));
  EXPECT_FALSE(ParseJobSpecYaml("name: a\x7f\n").ok());
  // Tabs, CR LF line ends and UTF-8 stay fine.
  spec = ParseJobSpecYaml("name: \"caf\xc3\xa9\"\r\nsteps: 3\t# tab before a comment\r\n");
  EXPECT_TRUE(spec.ok()) << spec.status();
}

// Issue 26: every mistake of a spec in one answer. Three sections with a mistake each, a
// section with two independent ones, and a field left to its default that is wrong with the
// rest: all are reported, in spec order, each with the line of its field (none for the default).
constexpr char kThreeSectionsWrong[] = R"(name: multi
steps: 0
model:
  n_layer: 2
  d_model: 100
  n_head: 3
data:
  source: file
optimizer:
  lr: -1
  beta2: 1.5
pipeline:
  stages: 2
  transport: mpi
)";

TEST(EveryError, AllMistakesInSpecOrderWithTheirLines) {
  absl::StatusOr<v1::JobSpec> spec = LoadJobSpecYaml(kThreeSectionsWrong);
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(spec.status().message(),
            "steps: must be in [1, 10000000], got 0 (line 2)\n"
            "model.n_head: must divide model.d_model = 100, got 3 (line 6)\n"
            "data.path: required with data.source \"file\": a file relative to the worker's "
            "--data-root\n"
            "optimizer.lr: must be a finite number in (0, 10], got -1 (line 10)\n"
            "optimizer.beta2: must be in [0, 1), got 1.5 (line 11)\n"
            "pipeline.transport: expected \"auto\" or \"nccl\" or \"gloo\", got \"mpi\" "
            "(line 14)");
}

// The same spec as a proto (SubmitJobRequest.spec, a worker's copy): the same errors, no lines.
TEST(EveryError, JobSpecErrorsWithoutYamlHaveNoLines) {
  absl::StatusOr<v1::JobSpec> parsed = ParseJobSpecYaml(kThreeSectionsWrong);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  const FieldErrors errors = JobSpecErrors(WithDefaults(*parsed));
  std::vector<std::string> paths;
  for (const FieldError& e : errors.errors()) {
    paths.push_back(e.path);
    EXPECT_EQ(e.line, 0) << e.path;
  }
  EXPECT_THAT(paths, ::testing::ElementsAre("steps", "model.n_head", "data.path", "optimizer.lr",
                                            "optimizer.beta2", "pipeline.transport"));
  EXPECT_EQ(ValidateJobSpec(WithDefaults(*parsed)).message(),
            absl::StrCat("steps: must be in [1, 10000000], got 0\n",
                         "model.n_head: must divide model.d_model = 100, got 3\n",
                         "data.path: required with data.source \"file\": a file relative to "
                         "the worker's --data-root\n",
                         "optimizer.lr: must be a finite number in (0, 10], got -1\n",
                         "optimizer.beta2: must be in [0, 1), got 1.5\n",
                         "pipeline.transport: expected \"auto\" or \"nccl\" or \"gloo\", got "
                         "\"mpi\""));
}

// Type errors of several fields are found in one pass too (validation waits for a spec that
// parses: its rules read the fields' values).
TEST(EveryError, TypeErrorsOfEveryFieldInOnePass) {
  absl::StatusOr<v1::JobSpec> spec =
      LoadJobSpecYaml("steps: ten\nmodel:\n  n_layr: 2\noptimizer:\n  lr: fast\n");
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().message(),
            "steps: expected an integer, got 'ten' (line 1, column 8)\n"
            "model.n_layr: unknown field (did you mean n_layer?); expected one of: arch, n_layer, "
            "d_model, d_hidden, d_embed, context, vocab_size, n_head, seq_len, tie_embeddings, "
            "n_kv_head, rope_theta, rms_eps, preset (line 3, column 3)\n"
            "optimizer.lr: expected a number, got 'fast' (line 5, column 7)");
}

// One mistake is reported once: rules that read a wrong field do not run on it.
TEST(EveryError, ARuleOnAWrongFieldDoesNotRepeatIt) {
  struct Case {
    const char* yaml;
    std::vector<std::string> paths;
  };
  for (const Case& c : std::vector<Case>{
           // n_head out of range: no division by it (nor by zero), no size check.
           {"model:\n  n_head: 0\n", {"model.n_head"}},
           // An unknown device: no bf16 or nccl rule about it.
           {"device: tpu\nprecision: bf16\npipeline:\n  transport: nccl\n", {"device"}},
           // n_layer out of range: no stage count against it, no schedule built.
           {"model:\n  n_layer: 0\npipeline:\n  stages: 3\n", {"model.n_layer"}},
           // Wrong stages: the schedule is not built; independent pipeline fields still report.
           {"pipeline:\n  stages: 0\n  partition: random\n  plan: fast\n",
            {"pipeline.stages", "pipeline.partition", "pipeline.plan"}},
           // An unknown source: no rules of the synthetic source.
           {"data:\n  source: s3\n  format: tokens\n", {"data.source"}},
           // Both resume and fine-tune, and each wrong on its own.
           {"init:\n  from_job: x\n  hf_file: /abs.safetensors\n",
            {"init", "init.from_job", "init.hf_file"}},
       }) {
    absl::StatusOr<v1::JobSpec> parsed = ParseJobSpecYaml(c.yaml);
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    const FieldErrors errors = JobSpecErrors(WithDefaults(*parsed));
    std::vector<std::string> paths;
    for (const FieldError& e : errors.errors()) {
      paths.push_back(e.path);
    }
    EXPECT_EQ(paths, c.paths) << c.yaml << ValidateJobSpec(WithDefaults(*parsed));
  }
}

// With every rule now running on specs that are wrong elsewhere, no combination of two
// mistakes of the table may crash a validator (a division by a wrong n_head, a schedule built
// from a wrong shape): each pair is merged into one spec (the second's fields win) and
// validated. A pair may make a valid spec (bf16 with the other case's device: cuda).
TEST(EveryError, AnyTwoMistakesOfTheTableAreBothSafe) {
  std::vector<v1::JobSpec> parsed;
  for (const Malformed& c : kCases) {
    absl::StatusOr<v1::JobSpec> spec = ParseJobSpecYaml(c.yaml);
    if (spec.ok()) parsed.push_back(*std::move(spec));
  }
  ASSERT_GT(parsed.size(), 60u);
  for (size_t i = 0; i < parsed.size(); ++i) {
    for (size_t j = 0; j < parsed.size(); ++j) {
      v1::JobSpec both = parsed[i];
      both.MergeFrom(parsed[j]);
      const absl::Status s = ValidateJobSpec(WithDefaults(both));
      if (i == j || !s.ok()) {
        ASSERT_EQ(s.code(), absl::StatusCode::kInvalidArgument)
            << both.ShortDebugString() << ": " << s;
        ASSERT_FALSE(s.message().empty());
      }
    }
  }
}

// A model that cannot fit: a worker's memory budget too small for any cut is refused at
// plan time (what the coordinator's runner and `tandem plan` call) with RESOURCE_EXHAUSTED
// naming the budget and the smallest one that fits; the status carries that figure too.
TEST(ModelThatDoesNotFit, PlanNamesTheBudgetAndTheSmallestThatFits) {
  absl::StatusOr<v1::JobSpec> spec = LoadJobSpecYaml(R"(
model:
  n_layer: 8
  d_model: 512
  n_head: 8
pipeline:
  stages: 2
  partition: parameters
  memory_budget_mb: 1
)");
  ASSERT_TRUE(spec.ok()) << spec.status();  // valid as a spec: only planning knows the bytes
  absl::StatusOr<PipelinePlan> plan = PlanPipeline(*spec);
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kResourceExhausted) << plan.status();
  EXPECT_THAT(std::string(plan.status().message()),
              AllOf(HasSubstr("memory budget of 1048576 bytes"),
                    HasSubstr("the smallest budget that fits is")));
  EXPECT_GT(SmallestBudgetBytes(plan.status()), int64_t{1} << 20);
}

TEST(ModelThatDoesNotFit, AnyPartitionMethodRespectsTheBudget) {
  for (const char* method : {"uniform", "profile"}) {
    absl::StatusOr<v1::JobSpec> spec = LoadJobSpecYaml(absl::StrCat(R"(
model:
  n_layer: 8
  d_model: 512
  n_head: 8
pipeline:
  stages: 2
  memory_budget_mb: 1
  partition: )",
                                                                    method, "\n"));
    ASSERT_TRUE(spec.ok()) << spec.status();
    absl::StatusOr<PipelinePlan> plan = PlanPipeline(*spec);
    ASSERT_FALSE(plan.ok()) << method;
    EXPECT_EQ(plan.status().code(), absl::StatusCode::kResourceExhausted) << plan.status();
    EXPECT_THAT(std::string(plan.status().message()), HasSubstr("memory budget")) << method;
  }
}

}  // namespace
}  // namespace tandem
