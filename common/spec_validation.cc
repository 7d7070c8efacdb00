#include "common/spec_validation.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "common/limits.h"
#include "common/model_desc.h"
#include "common/partitioner.h"
#include "common/pipeline_plan.h"
#include "common/schedule.h"
#include "common/schedule_check.h"
#include "common/spec.h"

namespace tandem {
namespace {

// At most this many (stage, micro-batch) pairs in one step's program (stages x chunks x
// micro-batches): 64 stages of 4096 micro-batches, far beyond any real pipeline, and a program
// the coordinator builds, validates and simulates in well under a second.
constexpr int64_t kMaxScheduleSlots = int64_t{1} << 18;

// The validators below append each broken rule to `errors`; the helpers return whether the
// value passed, so that a rule that reads a field runs only when the field is right.
bool CheckRange(FieldErrors* errors, absl::string_view path, int64_t v, int64_t lo, int64_t hi) {
  if (v >= lo && v <= hi) return true;
  errors->Add(path, absl::StrCat("must be in [", lo, ", ", hi, "], got ", v));
  return false;
}

bool CheckOneOf(FieldErrors* errors, absl::string_view path, const std::string& v,
                const std::vector<absl::string_view>& allowed) {
  if (std::find(allowed.begin(), allowed.end(), v) != allowed.end()) return true;
  std::vector<std::string> quoted;
  for (absl::string_view a : allowed) quoted.push_back(absl::StrCat("\"", a, "\""));
  errors->Add(path, absl::StrCat("expected ", absl::StrJoin(quoted, " or "), ", got \"", v, "\""));
  return false;
}

// What a worker builds at most (common/limits.h): no weight matrix over kMaxTensorElements, no
// model over kMaxModelParameters. Checked here so that such a job is refused at submit, naming
// the fields, instead of failing on every worker at configure. Reads every dimension: run it
// only on a model whose dimensions are in range.
void CheckModelSize(const v1::ModelSpec& m, FieldErrors* errors) {
  const double d = m.d_model();
  const double h = m.d_hidden() == 0 ? 4.0 * d : m.d_hidden();
  const double v = m.vocab_size();
  struct Matrix {
    const char* what;
    double rows, cols;
  };
  std::vector<Matrix> matrices = {{"model.vocab_size x model.d_model (the token embedding)", v, d},
                                  {"model.d_hidden x model.d_model (a block's MLP)", h, d}};
  if (m.arch() == "gpt") {
    matrices.push_back({"model.seq_len x model.d_model (the position embedding)",
                        static_cast<double>(m.seq_len()), d});
    matrices.push_back({"3 model.d_model x model.d_model (a block's attention)", 3 * d, d});
  } else if (m.arch() == "llama") {
    matrices.push_back({"model.d_model x model.d_model (a block's q_proj)", d, d});
  } else {
    matrices.push_back({"model.d_model x model.context x model.d_embed (the input projection)", d,
                        static_cast<double>(m.context()) * m.d_embed()});
  }
  for (const Matrix& x : matrices) {
    if (x.rows * x.cols > kMaxTensorElements) {
      errors->Add("model", absl::StrCat("too large: ", x.what, " is ", x.rows * x.cols,
                                        " elements; a worker holds at most ", kMaxTensorElements,
                                        " per weight matrix"));
      return;  // one "too large" is enough; the parameter count would repeat it
    }
  }
  double total = 0;
  for (int64_t n : LayerParameterCounts(m)) total += static_cast<double>(n);
  if (total > kMaxModelParameters) {
    errors->Add("model", absl::StrCat("too large: ", total, " parameters (model.n_layer = ",
                                      m.n_layer(), ", model.d_model = ", m.d_model(),
                                      "); a worker builds at most 4294967296 (2^32)"));
  }
}

bool IsNameChar(char c) { return absl::ascii_isalnum(c) || c == '.' || c == '_' || c == '-'; }

// A path the spec names, relative to `root` (how the error names it): not empty, not
// absolute, no '..' component, no NUL; for data files (`pattern`), wildcards only in the last
// component. The side that opens the file resolves it again (realpath) against its root, which
// also refuses symlinks that lead outside. One error per path: the first rule it breaks.
void ValidateRelativePath(const std::string& field, const std::string& path, absl::string_view root,
                          bool pattern, FieldErrors* errors) {
  if (path.empty()) {
    errors->Add(field,
                absl::StrCat("required with data.source \"file\": a file relative to ", root));
    return;
  }
  if (path[0] == '/') {
    errors->Add(field, absl::StrCat("must be relative to ", root, ", got \"", path, "\""));
    return;
  }
  if (path.find('\0') != std::string::npos) {
    errors->Add(field, "must not contain NUL characters");
    return;
  }
  const std::vector<absl::string_view> parts = absl::StrSplit(path, absl::ByAnyChar("/\\"));
  for (size_t i = 0; i < parts.size(); ++i) {
    if (parts[i] == "..") {
      errors->Add(field, absl::StrCat("must stay inside ", root, "; '..' is not allowed, got \"",
                                      path, "\""));
      return;
    }
    if (pattern && i + 1 < parts.size() &&
        parts[i].find_first_of("*?") != absl::string_view::npos) {
      errors->Add(field, absl::StrCat("only the last path component may hold the wildcards '*' "
                                      "and '?', got \"",
                                      path, "\""));
      return;
    }
  }
}

void ValidateDataPath(const std::string& field, const std::string& path, FieldErrors* errors) {
  ValidateRelativePath(field, path, "the worker's --data-root", /*pattern=*/true, errors);
}

// A job id as the coordinator hands them out: "job-" and digits.
bool IsJobId(const std::string& id) {
  return id.size() > 4 && id.size() <= 24 && id.rfind("job-", 0) == 0 &&
         std::all_of(id.begin() + 4, id.end(), absl::ascii_isdigit);
}

}  // namespace

void ValidateTop(const v1::JobSpec& spec, FieldErrors* errors) {
  const std::string& name = spec.name();
  if (name.empty() || name.size() > 63 || !std::all_of(name.begin(), name.end(), IsNameChar)) {
    errors->Add("name", absl::StrCat("must be 1 to 63 characters of A-Z a-z 0-9 . _ -, got \"",
                                     name, "\""));
  }
  CheckRange(errors, "steps", spec.steps(), 1, 10'000'000);
  CheckRange(errors, "max_restarts", spec.max_restarts(), 0, 1000);
  const bool device_ok = CheckOneOf(errors, "device", spec.device(), {"cpu", "cuda"});
  CheckOneOf(errors, "precision", spec.precision(), {"", "fp32", "bf16"});
  if (spec.precision() == "bf16" && device_ok && spec.device() != "cuda") {
    errors->Add("precision",
                "bf16 needs device: cuda (the CPU backend computes in fp32; use fp32 or leave "
                "it empty)");
  }
}

// llama's own fields, once n_head is known to be in range: n_kv_head dividing n_head, an even
// head size for RoPE, rope_theta and rms_eps finite and positive. WithDefaults has resolved
// n_kv_head 0 to n_head. False when a dimension is unusable.
bool ValidateLlamaFields(const v1::ModelSpec& m, bool d_model_ok, FieldErrors* errors) {
  bool ok = true;
  const bool n_head_ok = m.n_head() >= 1 && m.n_head() <= 1024;
  if (CheckRange(errors, "model.n_kv_head", m.n_kv_head(), 1, 1024)) {
    if (n_head_ok && m.n_head() % m.n_kv_head() != 0) {
      errors->Add("model.n_kv_head", absl::StrCat("must divide model.n_head = ", m.n_head(),
                                                  " (each key/value head "
                                                  "serves the same number of query heads), got ",
                                                  m.n_kv_head()));
      ok = false;
    }
  } else {
    ok = false;
  }
  if (n_head_ok && d_model_ok && m.d_model() % m.n_head() == 0 &&
      (m.d_model() / m.n_head()) % 2 != 0) {
    errors->Add("model.n_head",
                absl::StrCat("gives an odd head size model.d_model / model.n_head = ",
                             m.d_model() / m.n_head(),
                             "; rotary positions rotate pairs of features, so it must be even"));
    ok = false;
  }
  if (!std::isfinite(m.rope_theta()) || m.rope_theta() <= 1.0) {
    errors->Add("model.rope_theta",
                absl::StrCat("must be a finite number > 1 (the RoPE base), got ", m.rope_theta()));
  }
  if (!std::isfinite(m.rms_eps()) || m.rms_eps() <= 0 || m.rms_eps() > 1) {
    errors->Add("model.rms_eps", absl::StrCat("must be in (0, 1], got ", m.rms_eps()));
  }
  return ok;
}

void ValidateModel(const v1::JobSpec& spec, FieldErrors* errors) {
  const v1::ModelSpec& m = spec.model();
  CheckOneOf(errors, "model.preset", m.preset(),
             {"", "gpt2", "gpt2-tiny", "smollm2-135m", "tinyllama-1.1b", "llama-tiny"});
  // The rules of one architecture apply once the architecture is known; the size check needs
  // every dimension in range.
  const bool arch_ok = CheckOneOf(errors, "model.arch", m.arch(), {"gpt", "llama", "mlp_lm"});
  bool dims_ok = arch_ok;
  if (arch_ok && spec.device() == "cuda" && m.arch() != "gpt" && m.arch() != "llama") {
    // The CUDA backend (worker/cuda_stage_compute.h) implements gpt and llama only.
    errors->Add("model.arch",
                absl::StrCat("device cuda runs gpt and llama models only, got \"", m.arch(), "\""));
  }
  dims_ok &= CheckRange(errors, "model.n_layer", m.n_layer(), 1, 1024);
  const bool d_model_ok = CheckRange(errors, "model.d_model", m.d_model(), 1, 65536);
  dims_ok &= d_model_ok;
  const bool vocab_ok = CheckRange(errors, "model.vocab_size", m.vocab_size(), 2, 1 << 20);
  dims_ok &= vocab_ok;
  if (arch_ok && IsDecoder(m)) {
    // n_head must be in range before it divides anything.
    if (CheckRange(errors, "model.n_head", m.n_head(), 1, 1024)) {
      if (d_model_ok && m.d_model() % m.n_head() != 0) {
        errors->Add("model.n_head", absl::StrCat("must divide model.d_model = ", m.d_model(),
                                                 ", got ", m.n_head()));
        dims_ok = false;
      }
    } else {
      dims_ok = false;
    }
    dims_ok &= CheckRange(errors, "model.seq_len", m.seq_len(), 1, 1 << 16);
    if (m.arch() == "llama") dims_ok &= ValidateLlamaFields(m, d_model_ok, errors);
  } else if (arch_ok) {
    dims_ok &= CheckRange(errors, "model.d_embed", m.d_embed(), 1, 65536);
    dims_ok &= CheckRange(errors, "model.context", m.context(), 1, 4096);
  }
  // Both architectures read d_hidden (the MLP's inner width).
  if (m.d_hidden() < 0) {
    errors->Add("model.d_hidden",
                absl::StrCat("must be >= 0 (0 means 4 x d_model), got ", m.d_hidden()));
    dims_ok = false;
  } else {
    dims_ok &= CheckRange(errors, "model.d_hidden", m.d_hidden(), 0, 4 * 65536);
  }
  if (dims_ok) CheckModelSize(m, errors);
  // Byte data yields tokens 0..255; token files are checked against vocab_size when loaded.
  const bool bytes = spec.data().source() == "synthetic" || spec.data().format() == "bytes";
  if (vocab_ok && bytes && m.vocab_size() < 256) {
    errors->Add("model.vocab_size",
                absl::StrCat("must be at least 256 for byte data (data.format \"bytes\" or "
                             "data.source \"synthetic\" yields one token per byte), got ",
                             m.vocab_size()));
  }
}

void ValidateData(const v1::JobSpec& spec, FieldErrors* errors) {
  const v1::DataSpec& d = spec.data();
  CheckOneOf(errors, "data.source", d.source(), {"synthetic", "file"});
  const bool format_ok =
      CheckOneOf(errors, "data.format", d.format(), {"bytes", "tokens", "tokens32"});
  if (!std::isfinite(d.val_fraction()) || d.val_fraction() < 0 || d.val_fraction() > 0.5) {
    errors->Add("data.val_fraction", absl::StrCat("must be in [0, 0.5], got ", d.val_fraction()));
  }
  if (d.source() == "file") {
    ValidateDataPath("data.path", d.path(), errors);
    if (!d.val_path().empty()) ValidateDataPath("data.val_path", d.val_path(), errors);
    return;
  }
  if (d.source() != "synthetic") return;  // the other rules depend on the source
  for (const auto& [field, value] :
       {std::pair<const char*, const std::string&>{"data.path", d.path()},
        {"data.val_path", d.val_path()}}) {
    if (!value.empty()) {
      errors->Add(field, absl::StrCat("is set but data.source is \"", d.source(),
                                      "\"; set data.source: file to read it"));
    }
  }
  if (format_ok && d.format() != "bytes") {
    errors->Add("data.format", "the synthetic source generates bytes; use format: bytes");
  }
  // The smallest corpus is one training window of the model: known once the model's context
  // is (seq_len for gpt, context for mlp_lm).
  const v1::ModelSpec& m = spec.model();
  const bool window_ok =
      !errors->Has("model.arch") && !errors->Has(IsDecoder(m) ? "model.seq_len" : "model.context");
  const int64_t min_bytes = window_ok ? TrainingWindow(m) : 1;
  if (d.synthetic_bytes() < min_bytes || d.synthetic_bytes() > (int64_t{1} << 30)) {
    errors->Add("data.synthetic_bytes",
                absl::StrCat("must be in [", min_bytes, ", ", int64_t{1} << 30,
                             "] (at least one training window of the model's context + 1 "
                             "tokens), got ",
                             d.synthetic_bytes()));
  }
}

void ValidateOptimizer(const v1::JobSpec& spec, FieldErrors* errors) {
  const v1::OptimizerSpec& o = spec.optimizer();
  if (CheckOneOf(errors, "optimizer.name", o.name(), {"adamw", "sgd"}) && spec.device() == "cuda" &&
      o.name() != "adamw") {
    // The CUDA backend (worker/cuda_stage_compute.h) implements adamw only.
    errors->Add("optimizer.name",
                absl::StrCat("device cuda supports adamw only, got \"", o.name(), "\""));
  }
  if (!std::isfinite(o.lr()) || o.lr() <= 0 || o.lr() > 10) {
    errors->Add("optimizer.lr", absl::StrCat("must be a finite number in (0, 10], got ", o.lr()));
  }
  if (!(o.beta1() >= 0 && o.beta1() < 1)) {
    errors->Add("optimizer.beta1", absl::StrCat("must be in [0, 1), got ", o.beta1()));
  }
  if (!(o.beta2() >= 0 && o.beta2() < 1)) {
    errors->Add("optimizer.beta2", absl::StrCat("must be in [0, 1), got ", o.beta2()));
  }
  if (!std::isfinite(o.eps()) || o.eps() <= 0) {
    errors->Add("optimizer.eps", absl::StrCat("must be a finite number > 0, got ", o.eps()));
  }
  if (!std::isfinite(o.weight_decay()) || o.weight_decay() < 0) {
    errors->Add("optimizer.weight_decay",
                absl::StrCat("must be a finite number >= 0, got ", o.weight_decay()));
  }
  if (o.warmup_steps() < 0) {
    errors->Add("optimizer.warmup_steps", absl::StrCat("must be >= 0, got ", o.warmup_steps()));
  }
  CheckOneOf(errors, "optimizer.lr_schedule", o.lr_schedule(), {"constant", "cosine"});
  if (!(o.min_lr_ratio() >= 0 && o.min_lr_ratio() <= 1)) {
    errors->Add("optimizer.min_lr_ratio",
                absl::StrCat("must be in [0, 1], got ", o.min_lr_ratio()));
  }
  if (!std::isfinite(o.grad_clip()) || o.grad_clip() < 0) {
    errors->Add(
        "optimizer.grad_clip",
        absl::StrCat("must be a finite number >= 0 (0 disables clipping), got ", o.grad_clip()));
  }
}

void ValidateEval(const v1::JobSpec& spec, FieldErrors* errors) {
  const v1::EvalSpec& e = spec.eval();
  if (e.every() < 0) {
    errors->Add("eval.every", absl::StrCat("must be >= 0 (0 never evaluates), got ", e.every()));
  }
  CheckRange(errors, "eval.micro_batches", e.micro_batches(), 1, 1 << 16);
  if (e.every() > 0 && spec.data().source() == "synthetic" && spec.data().val_fraction() == 0) {
    errors->Add("eval.every",
                "evaluation needs a validation split: set data.val_fraction > 0 or "
                "data.val_path");
  }
  if (e.every() > 0 && spec.data().source() == "file" && spec.data().val_path().empty() &&
      spec.data().val_fraction() == 0) {
    errors->Add("eval.every",
                "evaluation needs a validation split: set data.val_path or "
                "data.val_fraction > 0");
  }
}

void ValidateCheckpoint(const v1::JobSpec& spec, FieldErrors* errors) {
  const v1::CheckpointSpec& c = spec.checkpoint();
  if (c.every() < 0) {
    errors->Add("checkpoint.every",
                absl::StrCat("must be >= 0 (0 saves after the last step only), got ", c.every()));
  }
  CheckRange(errors, "checkpoint.keep", c.keep(), 1, 1000);
}

void ValidateElastic(const v1::JobSpec& spec, FieldErrors* errors) {
  const v1::ElasticSpec& e = spec.elastic();
  if (e.min_workers() == 0) {
    if (e.max_workers() != 0) {
      errors->Add("elastic.max_workers",
                  "needs elastic.min_workers >= 1 (0: the job is not elastic)");
    }
    return;
  }
  if (!CheckRange(errors, "elastic.min_workers", e.min_workers(), 0, kMaxGangWorkers)) return;
  if (e.max_workers() != 0 && !CheckRange(errors, "elastic.max_workers", e.max_workers(),
                                          e.min_workers(), kMaxGangWorkers)) {
    return;
  }
  const v1::PipelineSpec& p = spec.pipeline();
  if (p.stages() < 1 || p.replicas() < 1 || p.replicas() > kMaxReplicas) return;  // said there
  const int64_t gang = GangSize(spec);
  if (e.min_workers() > gang) {
    errors->Add("elastic.min_workers",
                absl::StrCat("must be at most the gang as written (", p.stages(), " stages x ",
                             p.replicas(), " replicas = ", gang, "), got ", e.min_workers()));
  }
  if (e.max_workers() != 0 && e.max_workers() < gang) {
    errors->Add("elastic.max_workers", absl::StrCat("must be at least the gang as written (", gang,
                                                    "), or 0 for it, got ", e.max_workers()));
  }
}

void ValidateInit(const v1::JobSpec& spec, FieldErrors* errors) {
  const v1::InitSpec& init = spec.init();
  if (!init.from_job().empty() && !init.hf_file().empty()) {
    errors->Add("init", "set from_job (resume) or hf_file (fine-tune), not both");
  }
  if (!init.from_job().empty() && !IsJobId(init.from_job())) {
    errors->Add("init.from_job",
                absl::StrCat("must be a job id such as \"job-3\", got \"", init.from_job(), "\""));
  }
  if (!init.hf_file().empty()) {
    if (spec.model().arch() == "mlp_lm") {
      errors->Add("init.hf_file",
                  "fine-tuning from a Hugging Face file needs model.arch gpt (GPT-2) or llama");
    }
    ValidateRelativePath("init.hf_file", init.hf_file(), "the coordinator's <data-root>/models",
                         /*pattern=*/false, errors);
  }
}

namespace {

// The pipeline's shape against the model's layers, and its schedule: built, and for a CSV
// checked, only from stages, chunks, micro-batches, a schedule and model.n_layer that are right
// (building it is the expensive part, bounded here). Returns the number of stages, or 0 where
// the schedule is unknown.
int ValidatePipelineShape(const v1::JobSpec& spec, FieldErrors* errors) {
  const v1::PipelineSpec& p = spec.pipeline();
  for (const char* read : {"pipeline.stages", "pipeline.chunks", "pipeline.micro_batches",
                           "pipeline.schedule", "model.n_layer"}) {
    if (errors->Has(read)) return 0;
  }
  const int64_t num_layers = int64_t{spec.model().n_layer()} + 2;
  if (p.stages() > num_layers) {
    errors->Add("pipeline.stages",
                absl::StrCat(p.stages(), " stages but the model has only ", num_layers,
                             " layers (embedding, ", spec.model().n_layer(),
                             " blocks, head); every stage needs at least one layer, so stages "
                             "must be <= model.n_layer + 2 = ",
                             num_layers));
    return 0;
  }
  // Bound the work of building, checking and simulating the step's program (and the
  // coordinator's memory for it) before generating it: a spec may not ask for millions of
  // actions. Chunks 0 counts as 2, the most any schedule picks by itself.
  const int64_t chunks = p.chunks() > 0 ? p.chunks() : 2;
  const bool eval_ok = !errors->Has("eval.every") && !errors->Has("eval.micro_batches");
  bool slots_ok = true;
  for (const auto& [field, m] :
       {std::pair<const char*, int64_t>{"pipeline.micro_batches", p.micro_batches()},
        {"eval.micro_batches",
         eval_ok && spec.eval().every() > 0 ? spec.eval().micro_batches() : 0}}) {
    if (const int64_t slots = p.stages() * chunks * m; slots > kMaxScheduleSlots) {
      errors->Add(field, absl::StrCat("pipeline.stages x chunks x ", m, " micro-batches = ", slots,
                                      " (stage, micro-batch) pairs per step, over the "
                                      "limit of ",
                                      kMaxScheduleSlots));
      slots_ok = false;
    }
  }
  if (!slots_ok) return 0;
  // The schedule's own constraints (1f1b: M >= P; interleaved: M a multiple of P; ...) and,
  // for a CSV, the whole program: complete and deadlock-free.
  absl::StatusOr<Schedule> schedule = ScheduleForSpec(spec);
  if (!schedule.ok()) {
    errors->Add(p.schedule_csv().empty() ? "pipeline.schedule" : "pipeline.schedule_csv",
                schedule.status().message());
    return 0;
  }
  const int num_stages = schedule->placement.num_stages();
  if (num_stages > num_layers) {
    errors->Add(
        "pipeline.stages",
        absl::StrCat(num_stages == p.stages()
                         ? absl::StrCat(num_stages)
                         : absl::StrCat(p.stages(), " workers x ", num_stages / p.stages(),
                                        " chunks = ", num_stages),
                     " stages but the model has only ", num_layers, " layers (embedding, ",
                     spec.model().n_layer(),
                     " blocks, head); every stage needs at least one layer, so stages x chunks "
                     "must be <= model.n_layer + 2 = ",
                     num_layers));
    return 0;
  }
  if (!p.schedule_csv().empty()) {
    if (absl::Status s = ValidateSchedule(LowerWithTransfers(*schedule)); !s.ok()) {
      errors->Add("pipeline.schedule_csv", s.message());
      return 0;
    }
  }
  return num_stages;
}

}  // namespace

void ValidatePipeline(const v1::JobSpec& spec, FieldErrors* errors) {
  const v1::PipelineSpec& p = spec.pipeline();
  const bool stages_ok = CheckRange(errors, "pipeline.stages", p.stages(), 1, 4096);
  CheckRange(errors, "pipeline.chunks", p.chunks(), 0, 64);
  const bool replicas_ok = CheckRange(errors, "pipeline.replicas", p.replicas(), 1, kMaxReplicas);
  if (const int64_t gang = int64_t{p.stages()} * p.replicas();
      stages_ok && replicas_ok && gang > kMaxGangWorkers) {
    errors->Add("pipeline.replicas",
                absl::StrCat(p.stages(), " stages x ", p.replicas(), " replicas = ", gang,
                             " workers, over the limit of ", kMaxGangWorkers, " per job"));
  } else if (replicas_ok && p.replicas() > 1 && spec.device() == "cuda" &&
             spec.optimizer().shard_state()) {
    // cuda workers reduce their gradients with NCCL (one GPU per worker), unsharded.
    errors->Add("optimizer.shard_state",
                "sharded optimizer state runs on cpu workers only in this release; with "
                "device: cuda and replicas > 1 each worker keeps the whole AdamW state "
                "(set shard_state: false)");
  }
  CheckRange(errors, "pipeline.micro_batch_size", p.micro_batch_size(), 1, 1 << 20);
  CheckRange(errors, "pipeline.micro_batches", p.micro_batches(), 1, 1 << 16);
  if (p.schedule_csv().empty()) {
    const std::vector<std::string> names = AllScheduleNames();
    CheckOneOf(errors, "pipeline.schedule", absl::AsciiStrToLower(p.schedule()),
               {names.begin(), names.end()});
  }
  const int num_stages = ValidatePipelineShape(spec, errors);
  const bool partition_ok = CheckOneOf(errors, "pipeline.partition", p.partition(),
                                       {"uniform", "parameters", "profile", "manual"});
  CheckRange(errors, "pipeline.memory_budget_mb", p.memory_budget_mb(), 0, int64_t{1} << 30);
  if (CheckOneOf(errors, "pipeline.plan", p.plan(), {"", "auto"}) && p.plan() == "auto") {
    if (!p.schedule_csv().empty()) {
      errors->Add("pipeline.plan",
                  "auto chooses the schedule, so it does not apply with pipeline.schedule_csv");
    } else if (p.partition() == "manual") {
      errors->Add("pipeline.plan",
                  "auto may change the stages per worker, so manual cut points do not carry "
                  "over: use partition: profile");
    }
  }
  if (CheckOneOf(errors, "pipeline.transport", p.transport(), {"auto", "nccl", "gloo"}) &&
      p.transport() == "nccl" && !errors->Has("device") && spec.device() != "cuda") {
    errors->Add("pipeline.transport",
                absl::StrCat("nccl needs device: cuda, got device: \"", spec.device(),
                             "\" (cpu workers use gloo; use auto or gloo)"));
  }
  if (CheckOneOf(errors, "pipeline.recompute", p.recompute(),
                 {"none", "full", "selective", "auto"}) &&
      p.recompute() == "selective") {
    if (!errors->Has("model.arch") && spec.model().arch() == "mlp_lm") {
      errors->Add("pipeline.recompute",
                  "selective recomputes the attention of gpt and llama blocks; mlp_lm has none, "
                  "so it would keep the same activations: use full or none");
    }
  }
  if (partition_ok && p.partition() == "manual") {
    if (num_stages > 0) {  // the cut points divide the schedule's stages
      absl::StatusOr<std::vector<LayerRange>> ranges =
          RangesFromCuts({p.cuts().begin(), p.cuts().end()},
                         static_cast<int>(int64_t{spec.model().n_layer()} + 2), num_stages);
      if (!ranges.ok()) errors->Add("pipeline.cuts", ranges.status().message());
    }
  } else if (partition_ok && p.cuts_size() > 0) {
    errors->Add("pipeline.cuts", "cut points apply to partition: manual only");
  }
}

FieldErrors JobSpecErrors(const v1::JobSpec& spec) {
  FieldErrors errors;
  for (auto check : {ValidateTop, ValidateModel, ValidateData, ValidateOptimizer, ValidateEval,
                     ValidateCheckpoint, ValidateInit, ValidatePipeline, ValidateElastic}) {
    check(spec, &errors);
  }
  return errors;
}

absl::Status ValidateJobSpec(const v1::JobSpec& spec) { return JobSpecErrors(spec).ToStatus(); }

absl::Status ValidateJobSpec(const v1::JobSpec& spec, const FieldLines& lines) {
  FieldErrors errors = JobSpecErrors(spec);
  errors.AttachLines(lines);
  return errors.ToStatus();
}

}  // namespace tandem
