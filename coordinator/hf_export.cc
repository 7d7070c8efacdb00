#include "coordinator/hf_export.h"

#include <cstring>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/safetensors.h"
#include "common/status_macros.h"

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
  ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsWriter> writer,
                   (SafetensorsWriter::Create(path, out, {{"format", "pt"}})));
  std::vector<float> buffer;
  for (size_t i = 0; i < in.size(); ++i) {
    ASSIGN_OR_RETURN(absl::Span<const uint8_t> data, checkpoint.Data(in[i]->name));
    const float* src = reinterpret_cast<const float*>(data.data());
    if (IsConv1D(in[i]->name) && in[i]->shape.size() == 2) {
      const int64_t rows = in[i]->shape[0], cols = in[i]->shape[1];  // ours: (out, in)
      buffer.resize(static_cast<size_t>(rows * cols));
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t c = 0; c < cols; ++c) buffer[c * rows + r] = src[r * cols + c];
      }
      RETURN_IF_ERROR(writer->Append(buffer.data(), buffer.size() * sizeof(float)));
    } else {
      const int64_t bytes = out[i].ByteSize();  // a cut vocabulary keeps the leading rows
      RETURN_IF_ERROR(writer->Append(src, static_cast<size_t>(bytes)));
    }
  }
  return writer->Commit();
}

absl::Status ImportGpt2Safetensors(const std::string& hf_path, const v1::ModelSpec& model,
                                   CheckpointStore& store, const std::string& job_id) {
  if (model.arch() != "gpt") {
    return absl::InvalidArgumentError("init.hf_file: the job's model.arch must be gpt");
  }
  auto file = SafetensorsFile::Open(hf_path);
  RETURN_IF_ERROR(WithPrefix(file.status(), "init.hf_file"));
  const int64_t c = model.d_model(), v = model.vocab_size(), t = model.seq_len();
  const int64_t h = model.d_hidden() > 0 ? model.d_hidden() : 4 * c;
  // The tensors the model needs, in Tandem's shapes.
  struct Want {
    std::string name;
    std::vector<int64_t> shape;
  };
  std::vector<Want> want = {{"transformer.wte.weight", {v, c}}, {"transformer.wpe.weight", {t, c}}};
  for (int i = 0; i < model.n_layer(); ++i) {
    const std::string b = absl::StrCat("transformer.h.", i, ".");
    for (const Want& w : std::vector<Want>{{b + "ln_1.weight", {c}},
                                           {b + "ln_1.bias", {c}},
                                           {b + "attn.c_attn.weight", {3 * c, c}},
                                           {b + "attn.c_attn.bias", {3 * c}},
                                           {b + "attn.c_proj.weight", {c, c}},
                                           {b + "attn.c_proj.bias", {c}},
                                           {b + "ln_2.weight", {c}},
                                           {b + "ln_2.bias", {c}},
                                           {b + "mlp.c_fc.weight", {h, c}},
                                           {b + "mlp.c_fc.bias", {h}},
                                           {b + "mlp.c_proj.weight", {c, h}},
                                           {b + "mlp.c_proj.bias", {c}}}) {
      want.push_back(w);
    }
  }
  want.push_back({"transformer.ln_f.weight", {c}});
  want.push_back({"transformer.ln_f.bias", {c}});
  if (!model.tie_embeddings()) want.push_back({"lm_head.weight", {v, c}});

  std::vector<TensorInfo> index;
  for (const Want& w : want) index.push_back({w.name, "F32", w.shape});
  ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsWriter> writer,
                   store.BeginStage(job_id, 0, 0, index));
  std::vector<float> buffer;
  for (const Want& w : want) {
    // An untied lm_head missing from the file is the tied one: wte.
    const std::string source = w.name == "lm_head.weight" && (*file)->Find(w.name) == nullptr
                                   ? "transformer.wte.weight"
                                   : w.name;
    const TensorInfo* info = (*file)->Find(source);
    if (info == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("init.hf_file: ", hf_path, " has no tensor ", source));
    }
    if (info->dtype != "F32") {
      return absl::InvalidArgumentError(absl::StrCat("init.hf_file: tensor ", source, " is ",
                                                     info->dtype, "; only F32 files import"));
    }
    const float* src = reinterpret_cast<const float*>((*file)->Data(source)->data());
    auto mismatch = [&] {
      std::string have, need;
      for (int64_t d : info->shape) absl::StrAppend(&have, have.empty() ? "" : "x", d);
      for (int64_t d : w.shape) absl::StrAppend(&need, need.empty() ? "" : "x", d);
      return absl::InvalidArgumentError(absl::StrCat("init.hf_file: tensor ", source, " is ", have,
                                                     ", the model needs ", need,
                                                     IsConv1D(w.name) ? " (transposed)" : ""));
    };
    buffer.assign(static_cast<size_t>(TensorInfo{w.name, "F32", w.shape}.ByteSize() / 4), 0.0f);
    if (IsConv1D(w.name)) {
      // HF (in, out) -> ours (out, in).
      if (info->shape != std::vector<int64_t>{w.shape[1], w.shape[0]}) return mismatch();
      const int64_t rows = w.shape[0], cols = w.shape[1];
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t k = 0; k < cols; ++k) buffer[r * cols + k] = src[k * rows + r];
      }
    } else if (IsVocabMatrix(w.name)) {
      // Rows beyond the file's vocabulary (padding) stay zero.
      if (info->shape.size() != 2 || info->shape[1] != c || info->shape[0] > v) return mismatch();
      std::memcpy(buffer.data(), src, static_cast<size_t>(info->shape[0] * c) * sizeof(float));
    } else {
      if (info->shape != w.shape) return mismatch();
      std::memcpy(buffer.data(), src, buffer.size() * sizeof(float));
    }
    RETURN_IF_ERROR(writer->Append(buffer.data(), buffer.size() * sizeof(float)));
  }
  RETURN_IF_ERROR(writer->Commit());
  return store.Commit(job_id, 0, 1, 1);
}

}  // namespace tandem::coordinator
