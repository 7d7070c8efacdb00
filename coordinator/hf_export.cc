#include "coordinator/hf_export.h"

#include <cstring>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/safetensors.h"

namespace tandem::coordinator {
namespace {

bool IsConv1D(const std::string& name) {
  for (const char* suffix :
       {".attn.c_attn.weight", ".attn.c_proj.weight", ".mlp.c_fc.weight", ".mlp.c_proj.weight"}) {
    if (absl::EndsWith(name, suffix)) return true;
  }
  return false;
}

bool IsVocabMatrix(const std::string& name) {
  return name == "transformer.wte.weight" || name == "lm_head.weight";
}

}  // namespace

absl::Status ExportGpt2Safetensors(const CheckpointReader& checkpoint, const v1::ModelSpec& model,
                                   const std::string& path) {
  if (model.arch() != "gpt") {
    return absl::InvalidArgumentError(absl::StrCat(
        "export writes GPT-2 checkpoints; this job's model.arch is '", model.arch(), "'"));
  }
  const int64_t vocab_out =
      model.vocab_size() == kGpt2PaddedVocab ? kGpt2Vocab : model.vocab_size();
  std::vector<TensorInfo> out;
  std::vector<const TensorInfo*> in;
  for (const TensorInfo* t : checkpoint.tensors()) {
    if (absl::StrContains(t->name, ".adam_")) continue;  // optimizer state
    if (t->dtype != "F32") {
      return absl::DataLossError(absl::StrCat("checkpoint tensor ", t->name, " is ", t->dtype));
    }
    TensorInfo o = *t;
    if (IsConv1D(t->name) && t->shape.size() == 2) {
      o.shape = {t->shape[1], t->shape[0]};
    } else if (IsVocabMatrix(t->name) && t->shape.size() == 2) {
      o.shape = {std::min<int64_t>(vocab_out, t->shape[0]), t->shape[1]};
    }
    out.push_back(std::move(o));
    in.push_back(t);
  }
  auto writer = SafetensorsWriter::Create(path, out, {{"format", "pt"}});
  if (!writer.ok()) return writer.status();
  std::vector<float> buffer;
  for (size_t i = 0; i < in.size(); ++i) {
    auto data = checkpoint.Data(in[i]->name);
    if (!data.ok()) return data.status();
    const float* src = reinterpret_cast<const float*>(data->data());
    if (IsConv1D(in[i]->name) && in[i]->shape.size() == 2) {
      const int64_t rows = in[i]->shape[0], cols = in[i]->shape[1];  // ours: (out, in)
      buffer.resize(static_cast<size_t>(rows * cols));
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t c = 0; c < cols; ++c) buffer[c * rows + r] = src[r * cols + c];
      }
      if (auto s = (*writer)->Append(buffer.data(), buffer.size() * sizeof(float)); !s.ok()) {
        return s;
      }
    } else {
      const int64_t bytes = out[i].ByteSize();  // a cut vocabulary keeps the leading rows
      if (auto s = (*writer)->Append(src, static_cast<size_t>(bytes)); !s.ok()) return s;
    }
  }
  return (*writer)->Commit();
}

}  // namespace tandem::coordinator
