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
    const char* arch;
    int n_layer, n_head, n_kv_head, d_model, d_hidden, seq_len, vocab_size;
    bool tie_embeddings;
    double rope_theta;
  };
  // The llama shapes are those of the models' published config.json files.
  static constexpr Shape kPresets[] = {
      // GPT-2 124M; vocab 50257 padded to 50304
      {"gpt2", "gpt", 12, 12, 0, 768, 0, 1024, 50304, true, 0},
      {"gpt2-tiny", "gpt", 2, 2, 0, 64, 0, 32, 256, true, 0},  // for tests and demos on bytes
      {"smollm2-135m", "llama", 30, 9, 3, 576, 1536, 2048, 49152, true, 100000},
      {"tinyllama-1.1b", "llama", 22, 32, 4, 2048, 5632, 2048, 32000, false, 10000},
      {"llama-tiny", "llama", 2, 4, 2, 64, 192, 32, 256, false, 10000},  // tests on bytes
  };
  for (const Shape& p : kPresets) {
    if (m->preset() != p.name) continue;
    if (!m->has_arch()) m->set_arch(p.arch);
    if (!m->has_n_layer()) m->set_n_layer(p.n_layer);
    if (!m->has_n_head()) m->set_n_head(p.n_head);
    if (!m->has_d_model()) m->set_d_model(p.d_model);
    if (!m->has_seq_len()) m->set_seq_len(p.seq_len);
    if (!m->has_vocab_size()) m->set_vocab_size(p.vocab_size);
    if (!m->has_tie_embeddings()) m->set_tie_embeddings(p.tie_embeddings);
    if (p.n_kv_head > 0 && !m->has_n_kv_head()) m->set_n_kv_head(p.n_kv_head);
    if (p.d_hidden > 0 && !m->has_d_hidden()) m->set_d_hidden(p.d_hidden);
    if (p.rope_theta > 0 && !m->has_rope_theta()) m->set_rope_theta(p.rope_theta);
  }
}

// Resolves what llama's zero and unset fields mean, so the stored spec says what runs:
// n_kv_head 0 -> n_head, d_hidden 0 -> SwiGLU's width, tie_embeddings unset -> false.
void ApplyArchDefaults(v1::ModelSpec* m) {
  if (m->arch() != "llama") return;
  if (!m->has_tie_embeddings()) m->set_tie_embeddings(false);
  if (m->n_kv_head() == 0) m->set_n_kv_head(m->n_head());
  if (m->d_hidden() == 0) m->set_d_hidden(LlamaDefaultHidden(m->d_model()));
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
  ApplyArchDefaults(out.mutable_model());
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

bool IsDecoder(const v1::ModelSpec& model) {
  return model.arch() == "gpt" || model.arch() == "llama";
}

int32_t LlamaDefaultHidden(int32_t d_model) {
  const int64_t h = (int64_t{8} * std::max(d_model, 0) + 2) / 3;  // ceil(8 C / 3)
  return static_cast<int32_t>(std::min<int64_t>((h + 63) / 64 * 64, INT32_MAX));
}

int64_t TokensPerStep(const v1::JobSpec& spec) {
  return EffectiveBatch(spec) * (IsDecoder(spec.model()) ? spec.model().seq_len() : 1);
}

std::string DeviceKind(const std::string& device) { return device.substr(0, device.find(':')); }

int64_t TrainingWindow(const v1::ModelSpec& m) {
  return (IsDecoder(m) ? int64_t{m.seq_len()} : int64_t{m.context()}) + 1;
}

}  // namespace tandem