#include "coordinator/hf_export.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/safetensors.h"
#include "common/status_macros.h"
#include "coordinator/hf_layout.h"

namespace tandem::coordinator {
namespace {

// The tensor's shape in the HF file, for a Tandem shape `ours`.
std::vector<int64_t> HfShape(const HfTensor& t, int64_t hf_vocab) {
  switch (t.layout) {
    case HfLayout::kTransposed:
      return {t.shape[1], t.shape[0]};
    case HfLayout::kVocabRows:
      return {std::min(hf_vocab, t.shape[0]), t.shape[1]};
    case HfLayout::kSame:
      break;
  }
  return t.shape;
}

// src (rows, cols) -> dst (cols, rows).
void Transpose(const float* src, int64_t rows, int64_t cols, float* dst) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) dst[c * rows + r] = src[r * cols + c];
  }
}

}  // namespace

absl::Status ExportHfSafetensors(const CheckpointReader& checkpoint, const v1::ModelSpec& model,
                                 const std::string& path) {
  absl::StatusOr<HfModelLayout> layout = HfLayoutOf(model);
  RETURN_IF_ERROR(WithPrefix(layout.status(), "export"));
  std::vector<TensorInfo> out;
  for (const HfTensor& t : layout->tensors) {
    const TensorInfo* have = checkpoint.Find(t.name);
    if (have == nullptr) {
      return absl::DataLossError(absl::StrCat("export: the checkpoint has no tensor ", t.name));
    }
    if (have->dtype != "F32" || have->shape != t.shape) {
      return absl::DataLossError(absl::StrCat("export: checkpoint tensor ", t.name, " is ",
                                              have->dtype, " ", ShapeString(have->shape),
                                              ", the spec needs F32 ", ShapeString(t.shape)));
    }
    out.push_back({t.name, "F32", HfShape(t, layout->hf_vocab)});
  }
  ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsWriter> writer,
                   (SafetensorsWriter::Create(path, out, {{"format", "pt"}})));
  std::vector<float> buffer;
  for (size_t i = 0; i < out.size(); ++i) {
    const HfTensor& t = layout->tensors[i];
    ASSIGN_OR_RETURN(absl::Span<const uint8_t> data, checkpoint.Data(t.name));
    const float* src = reinterpret_cast<const float*>(data.data());
    if (t.layout == HfLayout::kTransposed) {
      buffer.resize(data.size() / sizeof(float));
      Transpose(src, t.shape[0], t.shape[1], buffer.data());
      RETURN_IF_ERROR(writer->Append(buffer.data(), buffer.size() * sizeof(float)));
    } else {
      // A cut vocabulary keeps the leading rows.
      RETURN_IF_ERROR(writer->Append(src, static_cast<size_t>(out[i].ByteSize())));
    }
  }
  return writer->Commit();
}

absl::Status ImportHfWeights(const HfWeights& weights, const v1::ModelSpec& model,
                             CheckpointStore& store, const std::string& job_id) {
  absl::StatusOr<HfModelLayout> layout = HfLayoutOf(model);
  RETURN_IF_ERROR(WithPrefix(layout.status(), "init.hf_file"));
  // Every tensor is checked before anything is written.
  std::vector<std::string> sources;
  std::vector<TensorInfo> index;
  for (const HfTensor& t : layout->tensors) {
    // An untied lm_head missing from the file is the tied one: the token embedding.
    const bool from_embedding = t.name == "lm_head.weight" && weights.Find(t.name) == nullptr;
    const std::string& source = from_embedding ? layout->embedding : t.name;
    const TensorInfo* info = weights.Find(source);
    if (info == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("init.hf_file: ", weights.name(), " has no tensor ", source));
    }
    const std::vector<int64_t> need = HfShape(t, t.shape[0]);
    const bool fits =
        t.layout == HfLayout::kVocabRows
            ? info->shape.size() == 2 && info->shape[1] == need[1] && info->shape[0] <= need[0]
            : info->shape == need;
    if (!fits) {
      return absl::InvalidArgumentError(absl::StrCat(
          "init.hf_file: tensor ", source, " is ", ShapeString(info->shape), ", the spec needs ",
          t.layout == HfLayout::kVocabRows ? absl::StrCat("[at most ", need[0], ", ", need[1], "]")
                                           : ShapeString(need),
          t.layout == HfLayout::kTransposed ? " (Conv1D: in, out)" : ""));
    }
    if (info->dtype != "F32" && info->dtype != "BF16" && info->dtype != "F16") {
      return absl::InvalidArgumentError(absl::StrCat("init.hf_file: tensor ", source, " is ",
                                                     info->dtype, "; F32, BF16 and F16 import"));
    }
    sources.push_back(source);
    index.push_back({t.name, "F32", t.shape});
  }
  ASSIGN_OR_RETURN(std::unique_ptr<StageFileWriter> writer, store.BeginStage(job_id, 0, 0, index));
  std::vector<float> buffer;
  for (size_t i = 0; i < index.size(); ++i) {
    const HfTensor& t = layout->tensors[i];
    ASSIGN_OR_RETURN(std::vector<float> values, weights.ReadF32(sources[i]));
    if (t.layout == HfLayout::kTransposed) {
      // HF (in, out) -> ours (out, in).
      buffer.resize(values.size());
      Transpose(values.data(), t.shape[1], t.shape[0], buffer.data());
      values.swap(buffer);
    } else if (t.layout == HfLayout::kVocabRows) {
      values.resize(static_cast<size_t>(t.shape[0] * t.shape[1]), 0.0f);  // padding rows: 0
    }
    RETURN_IF_ERROR(writer->Append(values.data(), values.size() * sizeof(float)));
  }
  RETURN_IF_ERROR(writer->Commit());
  return store.Commit(job_id, 0, 1, 1);
}

}  // namespace tandem::coordinator
