#include "common/spec.h"

#include <algorithm>
#include <cstdint>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/limits.h"
#include "common/proto_yaml.h"
#include "common/status_macros.h"

namespace tandem {
namespace {

// Sets the model fields that a named preset defines and the spec leaves unset. An unknown
// preset is left for ValidateModel to reject.
void ApplyModelPreset(v1::ModelSpec* m) {
  struct Shape {
    const char* name;
    int n_layer, n_head, d_model, seq_len, vocab_size;
  };
  static constexpr Shape kPresets[] = {
      {"gpt2", 12, 12, 768, 1024, 50304},  // GPT-2 124M; vocab 50257 padded to 50304
      {"gpt2-tiny", 2, 2, 64, 32, 256},    // for tests and demos on bytes
  };
  for (const Shape& p : kPresets) {
    if (m->preset() != p.name) continue;
    if (!m->has_arch()) m->set_arch("gpt");
    if (!m->has_n_layer()) m->set_n_layer(p.n_layer);
    if (!m->has_n_head()) m->set_n_head(p.n_head);
    if (!m->has_d_model()) m->set_d_model(p.d_model);
    if (!m->has_seq_len()) m->set_seq_len(p.seq_len);
    if (!m->has_vocab_size()) m->set_vocab_size(p.vocab_size);
  }
}

}  // namespace

absl::StatusOr<v1::JobSpec> ParseJobSpecYaml(absl::string_view yaml, FieldLines* lines) {
  if (yaml.size() > kMaxSpecBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("job spec: ", yaml.size(), " bytes is over the limit of ", kMaxSpecBytes));
  }
  v1::JobSpec spec;
  RETURN_IF_ERROR(ParseYamlMessage(yaml, "job spec", &spec, lines));
  return spec;
}

v1::JobSpec WithDefaults(const v1::JobSpec& spec) {
  v1::JobSpec out = spec;
  ApplyModelPreset(out.mutable_model());
  FillDefaults(&out);
  return out;
}

absl::StatusOr<v1::JobSpec> LoadJobSpecYaml(absl::string_view yaml) {
  FieldLines lines;
  ASSIGN_OR_RETURN(const v1::JobSpec parsed, ParseJobSpecYaml(yaml, &lines));
  v1::JobSpec spec = WithDefaults(parsed);
  RETURN_IF_ERROR(ValidateJobSpec(spec, lines));
  return spec;
}

int64_t EffectiveBatch(const v1::JobSpec& spec) {
  return int64_t{spec.pipeline().micro_batch_size()} * spec.pipeline().micro_batches() *
         std::max(1, spec.pipeline().replicas());
}

int GangSize(const v1::JobSpec& spec) {
  return spec.pipeline().stages() * std::max(1, spec.pipeline().replicas());
}

bool ShardsOptimizerState(const v1::JobSpec& spec) {
  return spec.optimizer().shard_state() && spec.pipeline().replicas() > 1 &&
         absl::AsciiStrToLower(spec.optimizer().name()) == "adamw";
}

int64_t TokensPerStep(const v1::JobSpec& spec) {
  return EffectiveBatch(spec) * (spec.model().arch() == "gpt" ? spec.model().seq_len() : 1);
}

std::string DeviceKind(const std::string& device) { return device.substr(0, device.find(':')); }

int64_t TrainingWindow(const v1::ModelSpec& m) {
  return (m.arch() == "gpt" ? int64_t{m.seq_len()} : int64_t{m.context()}) + 1;
}

}  // namespace tandem