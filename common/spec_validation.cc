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
#include "common/status_macros.h"

namespace tandem {
namespace {

// At most this many (stage, micro-batch) pairs in one step's program (stages x chunks x
// micro-batches): 64 stages of 4096 micro-batches, far beyond any real pipeline, and a program
// the coordinator builds, validates and simulates in well under a second.
constexpr int64_t kMaxScheduleSlots = int64_t{1} << 18;

absl::Status Invalid(absl::string_view path, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", what));
}

absl::Status CheckRange(absl::string_view path, int64_t v, int64_t lo, int64_t hi) {
  if (v >= lo && v <= hi) return absl::OkStatus();
  return Invalid(path, absl::StrCat("must be in [", lo, ", ", hi, "], got ", v));
}

absl::Status CheckOneOf(absl::string_view path, const std::string& v,
                        const std::vector<absl::string_view>& allowed) {
  if (std::find(allowed.begin(), allowed.end(), v) != allowed.end()) return absl::OkStatus();
  std::vector<std::string> quoted;
  for (absl::string_view a : allowed) quoted.push_back(absl::StrCat("\"", a, "\""));
  return Invalid(path,
                 absl::StrCat("expected ", absl::StrJoin(quoted, " or "), ", got \"", v, "\""));
}

// What a worker builds at most (common/limits.h): no weight matrix over kMaxTensorElements, no
// model over kMaxModelParameters. Checked here so that such a job is refused at submit, naming
// the fields, instead of failing on every worker at configure.
absl::Status CheckModelSize(const v1::ModelSpec& m) {
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
  } else {
    matrices.push_back({"model.d_model x model.context x model.d_embed (the input projection)", d,
                        static_cast<double>(m.context()) * m.d_embed()});
  }
  for (const Matrix& x : matrices) {
    if (x.rows * x.cols > kMaxTensorElements) {
      return Invalid("model", absl::StrCat("too large: ", x.what, " is ", x.rows * x.cols,
                                           " elements; a worker holds at most ", kMaxTensorElements,
                                           " per weight matrix"));
    }
  }
  double total = 0;
  for (int64_t n : LayerParameterCounts(m)) total += static_cast<double>(n);
  if (total > kMaxModelParameters) {
    return Invalid("model", absl::StrCat("too large: ", total, " parameters (model.n_layer = ",
                                         m.n_layer(), ", model.d_model = ", m.d_model(),
                                         "); a worker builds at most 4294967296 (2^32)"));
  }
  return absl::OkStatus();
}

bool IsNameChar(char c) { return absl::ascii_isalnum(c) || c == '.' || c == '_' || c == '-'; }

// A path the spec names, relative to `root` (how the error names it): not empty, not
// absolute, no '..' component, no NUL; for data files (`pattern`), wildcards only in the last
// component. The side that opens the file resolves it again (realpath) against its root, which
// also refuses symlinks that lead outside.
absl::Status ValidateRelativePath(const std::string& field, const std::string& path,
                                  absl::string_view root, bool pattern) {
  if (path.empty()) {
    return Invalid(field,
                   absl::StrCat("required with data.source \"file\": a file relative to ", root));
  }
  if (path[0] == '/') {
    return Invalid(field, absl::StrCat("must be relative to ", root, ", got \"", path, "\""));
  }
  if (path.find('\0') != std::string::npos) {
    return Invalid(field, "must not contain NUL characters");
  }
  const std::vector<absl::string_view> parts = absl::StrSplit(path, absl::ByAnyChar("/\\"));
  for (size_t i = 0; i < parts.size(); ++i) {
    if (parts[i] == "..") {
      return Invalid(field, absl::StrCat("must stay inside ", root, "; '..' is not allowed, got \"",
                                         path, "\""));
    }
    if (pattern && i + 1 < parts.size() &&
        parts[i].find_first_of("*?") != absl::string_view::npos) {
      return Invalid(field, absl::StrCat("only the last path component may hold the wildcards '*' "
                                         "and '?', got \"",
                                         path, "\""));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateDataPath(const std::string& field, const std::string& path) {
  return ValidateRelativePath(field, path, "the worker's --data-root", /*pattern=*/true);
}

// A job id as the coordinator hands them out: "job-" and digits.
bool IsJobId(const std::string& id) {
  return id.size() > 4 && id.size() <= 24 && id.rfind("job-", 0) == 0 &&
         std::all_of(id.begin() + 4, id.end(), absl::ascii_isdigit);
}

}  // namespace

absl::Status ValidateTop(const v1::JobSpec& spec) {
  const std::string& name = spec.name();
  if (name.empty() || name.size() > 63 || !std::all_of(name.begin(), name.end(), IsNameChar)) {
    return Invalid("name", absl::StrCat("must be 1 to 63 characters of A-Z a-z 0-9 . _ -, got \"",
                                        name, "\""));
  }
  RETURN_IF_ERROR(CheckRange("steps", spec.steps(), 1, 10'000'000));
  RETURN_IF_ERROR(CheckRange("max_restarts", spec.max_restarts(), 0, 1000));
  RETURN_IF_ERROR(CheckOneOf("device", spec.device(), {"cpu", "cuda"}));
  RETURN_IF_ERROR(CheckOneOf("precision", spec.precision(), {"", "fp32", "bf16"}));
  if (spec.precision() == "bf16" && spec.device() != "cuda") {
    return Invalid("precision",
                   "bf16 needs device: cuda (the CPU backend computes in fp32; use fp32 or leave "
                   "it empty)");
  }
  if (spec.device() == "cuda") {
    // The CUDA backend (worker/cuda_stage_compute.h) implements these only.
    if (spec.model().arch() != "gpt") {
      return Invalid("model.arch", absl::StrCat("device cuda runs gpt models only, got \"",
                                                spec.model().arch(), "\""));
    }
    if (absl::AsciiStrToLower(spec.optimizer().name()) != "adamw") {
      return Invalid("optimizer.name", absl::StrCat("device cuda supports adamw only, got \"",
                                                    spec.optimizer().name(), "\""));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateModel(const v1::JobSpec& spec) {
  const v1::ModelSpec& m = spec.model();
  RETURN_IF_ERROR(CheckOneOf("model.preset", m.preset(), {"", "gpt2", "gpt2-tiny"}));
  RETURN_IF_ERROR(CheckOneOf("model.arch", m.arch(), {"gpt", "mlp_lm"}));
  RETURN_IF_ERROR(CheckRange("model.n_layer", m.n_layer(), 1, 1024));
  RETURN_IF_ERROR(CheckRange("model.d_model", m.d_model(), 1, 65536));
  RETURN_IF_ERROR(CheckRange("model.vocab_size", m.vocab_size(), 2, 1 << 20));
  if (m.arch() == "gpt") {
    RETURN_IF_ERROR(CheckRange("model.n_head", m.n_head(), 1, 1024));
    if (m.d_model() % m.n_head() != 0) {
      return Invalid("model.n_head", absl::StrCat("must divide model.d_model = ", m.d_model(),
                                                  ", got ", m.n_head()));
    }
    RETURN_IF_ERROR(CheckRange("model.seq_len", m.seq_len(), 1, 1 << 16));
  } else {
    RETURN_IF_ERROR(CheckRange("model.d_embed", m.d_embed(), 1, 65536));
    RETURN_IF_ERROR(CheckRange("model.context", m.context(), 1, 4096));
  }
  // Both architectures read d_hidden (the MLP's inner width).
  if (m.d_hidden() < 0) {
    return Invalid("model.d_hidden",
                   absl::StrCat("must be >= 0 (0 means 4 x d_model), got ", m.d_hidden()));
  }
  RETURN_IF_ERROR(CheckRange("model.d_hidden", m.d_hidden(), 0, 4 * 65536));
  RETURN_IF_ERROR(CheckModelSize(m));
  // Byte data yields tokens 0..255; token files are checked against vocab_size when loaded.
  const bool bytes = spec.data().source() == "synthetic" || spec.data().format() == "bytes";
  if (bytes && m.vocab_size() < 256) {
    return Invalid("model.vocab_size",
                   absl::StrCat("must be at least 256 for byte data (data.format \"bytes\" or "
                                "data.source \"synthetic\" yields one token per byte), got ",
                                m.vocab_size()));
  }
  return absl::OkStatus();
}

absl::Status ValidateData(const v1::JobSpec& spec) {
  const v1::DataSpec& d = spec.data();
  RETURN_IF_ERROR(CheckOneOf("data.source", d.source(), {"synthetic", "file"}));
  RETURN_IF_ERROR(CheckOneOf("data.format", d.format(), {"bytes", "tokens"}));
  if (!std::isfinite(d.val_fraction()) || d.val_fraction() < 0 || d.val_fraction() > 0.5) {
    return Invalid("data.val_fraction",
                   absl::StrCat("must be in [0, 0.5], got ", d.val_fraction()));
  }
  if (d.source() == "file") {
    RETURN_IF_ERROR(ValidateDataPath("data.path", d.path()));
    if (!d.val_path().empty()) return ValidateDataPath("data.val_path", d.val_path());
    return absl::OkStatus();
  }
  for (const auto& [field, value] :
       {std::pair<const char*, const std::string&>{"data.path", d.path()},
        {"data.val_path", d.val_path()}}) {
    if (!value.empty()) {
      return Invalid(field, absl::StrCat("is set but data.source is \"", d.source(),
                                         "\"; set data.source: file to read it"));
    }
  }
  if (d.format() != "bytes") {
    return Invalid("data.format", "the synthetic source generates bytes; use format: bytes");
  }
  const int64_t min_bytes = TrainingWindow(spec.model());
  if (d.synthetic_bytes() < min_bytes || d.synthetic_bytes() > (int64_t{1} << 30)) {
    return Invalid("data.synthetic_bytes",
                   absl::StrCat("must be in [", min_bytes, ", ", int64_t{1} << 30,
                                "] (at least one training window of the model's context + 1 "
                                "tokens), got ",
                                d.synthetic_bytes()));
  }
  return absl::OkStatus();
}

absl::Status ValidateOptimizer(const v1::JobSpec& spec) {
  const v1::OptimizerSpec& o = spec.optimizer();
  RETURN_IF_ERROR(CheckOneOf("optimizer.name", o.name(), {"adamw", "sgd"}));
  if (!std::isfinite(o.lr()) || o.lr() <= 0 || o.lr() > 10) {
    return Invalid("optimizer.lr",
                   absl::StrCat("must be a finite number in (0, 10], got ", o.lr()));
  }
  if (!(o.beta1() >= 0 && o.beta1() < 1)) {
    return Invalid("optimizer.beta1", absl::StrCat("must be in [0, 1), got ", o.beta1()));
  }
  if (!(o.beta2() >= 0 && o.beta2() < 1)) {
    return Invalid("optimizer.beta2", absl::StrCat("must be in [0, 1), got ", o.beta2()));
  }
  if (!std::isfinite(o.eps()) || o.eps() <= 0) {
    return Invalid("optimizer.eps", absl::StrCat("must be a finite number > 0, got ", o.eps()));
  }
  if (!std::isfinite(o.weight_decay()) || o.weight_decay() < 0) {
    return Invalid("optimizer.weight_decay",
                   absl::StrCat("must be a finite number >= 0, got ", o.weight_decay()));
  }
  if (o.warmup_steps() < 0) {
    return Invalid("optimizer.warmup_steps", absl::StrCat("must be >= 0, got ", o.warmup_steps()));
  }
  RETURN_IF_ERROR(CheckOneOf("optimizer.lr_schedule", o.lr_schedule(), {"constant", "cosine"}));
  if (!(o.min_lr_ratio() >= 0 && o.min_lr_ratio() <= 1)) {
    return Invalid("optimizer.min_lr_ratio",
                   absl::StrCat("must be in [0, 1], got ", o.min_lr_ratio()));
  }
  if (!std::isfinite(o.grad_clip()) || o.grad_clip() < 0) {
    return Invalid(
        "optimizer.grad_clip",
        absl::StrCat("must be a finite number >= 0 (0 disables clipping), got ", o.grad_clip()));
  }
  return absl::OkStatus();
}

absl::Status ValidateEval(const v1::JobSpec& spec) {
  const v1::EvalSpec& e = spec.eval();
  if (e.every() < 0) {
    return Invalid("eval.every", absl::StrCat("must be >= 0 (0 never evaluates), got ", e.every()));
  }
  RETURN_IF_ERROR(CheckRange("eval.micro_batches", e.micro_batches(), 1, 1 << 16));
  if (e.every() > 0 && spec.data().source() == "synthetic" && spec.data().val_fraction() == 0) {
    return Invalid("eval.every",
                   "evaluation needs a validation split: set data.val_fraction > 0 or "
                   "data.val_path");
  }
  if (e.every() > 0 && spec.data().source() == "file" && spec.data().val_path().empty() &&
      spec.data().val_fraction() == 0) {
    return Invalid("eval.every",
                   "evaluation needs a validation split: set data.val_path or "
                   "data.val_fraction > 0");
  }
  return absl::OkStatus();
}

absl::Status ValidateCheckpoint(const v1::JobSpec& spec) {
  const v1::CheckpointSpec& c = spec.checkpoint();
  if (c.every() < 0) {
    return Invalid(
        "checkpoint.every",
        absl::StrCat("must be >= 0 (0 saves after the last step only), got ", c.every()));
  }
  return CheckRange("checkpoint.keep", c.keep(), 1, 1000);
}

absl::Status ValidateInit(const v1::JobSpec& spec) {
  const v1::InitSpec& init = spec.init();
  if (!init.from_job().empty() && !init.hf_file().empty()) {
    return Invalid("init", "set from_job (resume) or hf_file (fine-tune), not both");
  }
  if (!init.from_job().empty() && !IsJobId(init.from_job())) {
    return Invalid("init.from_job", absl::StrCat("must be a job id such as \"job-3\", got \"",
                                                 init.from_job(), "\""));
  }
  if (!init.hf_file().empty()) {
    if (spec.model().arch() != "gpt") {
      return Invalid("init.hf_file", "fine-tuning from a GPT-2 file needs model.arch gpt");
    }
    return ValidateRelativePath("init.hf_file", init.hf_file(),
                                "the coordinator's <data-root>/models", /*pattern=*/false);
  }
  return absl::OkStatus();
}

absl::Status ValidatePipeline(const v1::JobSpec& spec) {
  const v1::PipelineSpec& p = spec.pipeline();
  RETURN_IF_ERROR(CheckRange("pipeline.stages", p.stages(), 1, 4096));
  RETURN_IF_ERROR(CheckRange("pipeline.chunks", p.chunks(), 0, 64));
  RETURN_IF_ERROR(CheckRange("pipeline.replicas", p.replicas(), 1, kMaxReplicas));
  if (const int64_t gang = int64_t{p.stages()} * p.replicas(); gang > kMaxGangWorkers) {
    return Invalid("pipeline.replicas",
                   absl::StrCat(p.stages(), " stages x ", p.replicas(), " replicas = ", gang,
                                " workers, over the limit of ", kMaxGangWorkers, " per job"));
  }
  if (p.replicas() > 1 && spec.device() == "cuda") {
    return Invalid("pipeline.replicas",
                   "data parallelism (replicas > 1) runs on cpu workers only in this release; "
                   "the NCCL gradient reduction is not wired into cuda workers yet");
  }
  RETURN_IF_ERROR(CheckRange("pipeline.micro_batch_size", p.micro_batch_size(), 1, 1 << 20));
  RETURN_IF_ERROR(CheckRange("pipeline.micro_batches", p.micro_batches(), 1, 1 << 16));
  if (p.schedule_csv().empty()) {
    const std::vector<std::string> names = ScheduleNames();
    RETURN_IF_ERROR(CheckOneOf("pipeline.schedule", absl::AsciiStrToLower(p.schedule()),
                               {names.begin(), names.end()}));
  }
  const int64_t num_layers = int64_t{spec.model().n_layer()} + 2;
  if (p.stages() > num_layers) {
    return Invalid("pipeline.stages",
                   absl::StrCat(p.stages(), " stages but the model has only ", num_layers,
                                " layers (embedding, ", spec.model().n_layer(),
                                " blocks, head); every stage needs at least one layer, so stages "
                                "must be <= model.n_layer + 2 = ",
                                num_layers));
  }
  // Bound the work of building, checking and simulating the step's program (and the
  // coordinator's memory for it) before generating it: a spec may not ask for millions of
  // actions. Chunks 0 counts as 2, the most any schedule picks by itself.
  const int64_t chunks = p.chunks() > 0 ? p.chunks() : 2;
  for (const auto& [field, m] :
       {std::pair<const char*, int64_t>{"pipeline.micro_batches", p.micro_batches()},
        {"eval.micro_batches", spec.eval().every() > 0 ? spec.eval().micro_batches() : 0}}) {
    if (const int64_t slots = p.stages() * chunks * m; slots > kMaxScheduleSlots) {
      return Invalid(field,
                     absl::StrCat("pipeline.stages x chunks x ", m, " micro-batches = ", slots,
                                  " (stage, micro-batch) pairs per step, over the "
                                  "limit of ",
                                  kMaxScheduleSlots));
    }
  }
  // The schedule's own constraints (1f1b: M >= P; interleaved: M a multiple of P; ...) and,
  // for a CSV, the whole program: complete and deadlock-free.
  absl::StatusOr<Schedule> schedule = ScheduleForSpec(spec);
  if (!schedule.ok()) {
    return Invalid(p.schedule_csv().empty() ? "pipeline.schedule" : "pipeline.schedule_csv",
                   schedule.status().message());
  }
  const int num_stages = schedule->placement.num_stages();
  if (num_stages > num_layers) {
    return Invalid(
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
  }
  if (!p.schedule_csv().empty()) {
    if (absl::Status s = ValidateSchedule(LowerWithTransfers(*schedule)); !s.ok()) {
      return Invalid("pipeline.schedule_csv", s.message());
    }
  }
  RETURN_IF_ERROR(CheckOneOf("pipeline.partition", p.partition(),
                             {"uniform", "parameters", "profile", "manual"}));
  RETURN_IF_ERROR(
      CheckRange("pipeline.memory_budget_mb", p.memory_budget_mb(), 0, int64_t{1} << 30));
  RETURN_IF_ERROR(CheckOneOf("pipeline.plan", p.plan(), {"", "auto"}));
  if (p.plan() == "auto" && !p.schedule_csv().empty()) {
    return Invalid("pipeline.plan",
                   "auto chooses the schedule, so it does not apply with pipeline.schedule_csv");
  }
  if (p.plan() == "auto" && p.partition() == "manual") {
    return Invalid("pipeline.plan",
                   "auto may change the stages per worker, so manual cut points do not carry "
                   "over: use partition: profile");
  }
  RETURN_IF_ERROR(CheckOneOf("pipeline.transport", p.transport(), {"auto", "nccl", "gloo"}));
  if (p.transport() == "nccl" && spec.device() != "cuda") {
    return Invalid("pipeline.transport",
                   absl::StrCat("nccl needs device: cuda, got device: \"", spec.device(),
                                "\" (cpu workers use gloo; use auto or gloo)"));
  }
  if (p.partition() == "manual") {
    absl::StatusOr<std::vector<LayerRange>> ranges = RangesFromCuts(
        {p.cuts().begin(), p.cuts().end()}, static_cast<int>(num_layers), num_stages);
    if (!ranges.ok()) return Invalid("pipeline.cuts", ranges.status().message());
  } else if (p.cuts_size() > 0) {
    return Invalid("pipeline.cuts", "cut points apply to partition: manual only");
  }
  return absl::OkStatus();
}

absl::Status ValidateJobSpec(const v1::JobSpec& spec) {
  for (auto check : {ValidateTop, ValidateModel, ValidateData, ValidateOptimizer, ValidateEval,
                     ValidateCheckpoint, ValidateInit, ValidatePipeline}) {
    RETURN_IF_ERROR(check(spec));
  }
  return absl::OkStatus();
}

}  // namespace tandem
