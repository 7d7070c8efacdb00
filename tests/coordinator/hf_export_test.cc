// Export to and import from Hugging Face files: GPT-2 (GPT2LMHeadModel) and Llama
// (LlamaForCausalLM) layouts, F32/BF16/F16 tensors, sharded checkpoints, the config.json.
#include "coordinator/hf_export.h"

#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "coordinator/checkpoint_store.h"
#include "coordinator/hf_config.h"
#include "coordinator/hf_layout.h"
#include "coordinator/hf_weights.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace tandem::coordinator {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kRootName[] = "the coordinator's <data-root>/models";

class HfExportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir_template[] = "/tmp/tandem-hf-XXXXXX";
    dir_ = mkdtemp(dir_template);
    models_ = dir_ + "/models";
    std::filesystem::create_directories(models_);
    store_ = std::make_unique<CheckpointStore>(dir_ + "/checkpoints");
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // A one-stage checkpoint (job, step 9) of `tensors`, element i of the whole checkpoint
  // holding `first + i` (every element distinct), plus AdamW state for the first tensor.
  std::shared_ptr<const CheckpointReader> MakeCheckpoint(const std::string& job,
                                                         std::vector<TensorInfo> tensors,
                                                         float first = 0.5f) {
    tensors.push_back({tensors[0].name + ".adam_m", "F32", tensors[0].shape});
    auto w = store_->BeginStage(job, 9, 0, tensors);
    EXPECT_TRUE(w.ok()) << w.status();
    float x = first;
    for (const auto& t : tensors) {
      for (int64_t i = 0; i < t.ByteSize() / 4; ++i, x += 1) EXPECT_TRUE((*w)->Append(&x, 4).ok());
    }
    EXPECT_TRUE((*w)->Commit().ok());
    EXPECT_TRUE(store_->Commit(job, 9, 1, 1).ok());
    auto ckpt = store_->Open(job, 9);
    EXPECT_TRUE(ckpt.ok()) << ckpt.status();
    return *ckpt;
  }

  // The checkpoint of `model` as its layout lists it (Tandem shapes).
  std::shared_ptr<const CheckpointReader> CheckpointOf(const std::string& job,
                                                       const v1::ModelSpec& model) {
    auto layout = HfLayoutOf(model);
    EXPECT_TRUE(layout.ok()) << layout.status();
    std::vector<TensorInfo> tensors;
    for (const HfTensor& t : layout->tensors) tensors.push_back({t.name, "F32", t.shape});
    return MakeCheckpoint(job, tensors);
  }

  absl::StatusOr<std::unique_ptr<HfWeights>> Open(const std::string& relative) {
    return HfWeights::Open(models_, relative, kRootName);
  }

  // Imports `relative` into a new checkpoint "import-<n>" and opens it.
  absl::StatusOr<std::shared_ptr<const CheckpointReader>> Import(const std::string& relative,
                                                                 const v1::ModelSpec& model) {
    auto weights = Open(relative);
    if (!weights.ok()) return weights.status();
    const std::string job = "import-" + std::to_string(++imports_);
    absl::Status s = ImportHfWeights(**weights, model, *store_, job);
    if (!s.ok()) return s;
    return store_->Open(job, 0);
  }

  std::string dir_, models_;
  std::unique_ptr<CheckpointStore> store_;
  int imports_ = 0;
};

v1::ModelSpec Llama(bool tied) {
  v1::ModelSpec m;
  m.set_arch("llama");
  m.set_n_layer(2);
  m.set_n_head(4);
  m.set_n_kv_head(2);
  m.set_d_model(8);  // head size 2, KV dim 4
  m.set_d_hidden(12);
  m.set_seq_len(4);
  m.set_vocab_size(10);
  m.set_rope_theta(500000);
  m.set_rms_eps(1e-6);
  m.set_tie_embeddings(tied);
  return m;
}

v1::ModelSpec Gpt(int vocab) {
  v1::ModelSpec m;
  m.set_arch("gpt");
  m.set_n_layer(1);
  m.set_d_model(4);
  m.set_n_head(2);
  m.set_seq_len(3);
  m.set_vocab_size(vocab);
  m.set_tie_embeddings(true);
  return m;
}

// Whether every tensor of `a` (optimizer state aside) is in `b` with the same bytes.
void ExpectSameParameters(const CheckpointReader& a, const CheckpointReader& b) {
  for (const TensorInfo* t : a.tensors()) {
    if (t->name.find(".adam_") != std::string::npos) continue;
    const TensorInfo* u = b.Find(t->name);
    ASSERT_NE(u, nullptr) << t->name;
    EXPECT_EQ(u->shape, t->shape) << t->name;
    auto x = a.Data(t->name);
    auto y = b.Data(t->name);
    ASSERT_EQ(x->size(), y->size()) << t->name;
    EXPECT_EQ(std::memcmp(x->data(), y->data(), x->size()), 0) << t->name;
  }
}

// Writes a safetensors file of `tensors`, each element i of tensor k = first_k + k + i/8
// (exact in F32, BF16 and F16 for the small sizes used here) in the tensor's dtype.
void WriteHfFile(const std::string& path, const std::vector<TensorInfo>& tensors, int first_k = 0) {
  auto w = SafetensorsWriter::Create(path, tensors);
  ASSERT_TRUE(w.ok()) << w.status();
  for (size_t k = 0; k < tensors.size(); ++k) {
    const TensorInfo& t = tensors[k];
    const int64_t n = t.ByteSize() / static_cast<int64_t>(DtypeSize(t.dtype));
    std::vector<uint8_t> bytes(static_cast<size_t>(t.ByteSize()));
    for (int64_t i = 0; i < n; ++i) {
      const float v = static_cast<float>(first_k + static_cast<int>(k)) + static_cast<float>(i) / 8;
      uint32_t bits;
      std::memcpy(&bits, &v, 4);
      uint8_t* at = bytes.data() + i * static_cast<int64_t>(DtypeSize(t.dtype));
      if (t.dtype == "F32") {
        std::memcpy(at, &v, 4);
      } else if (t.dtype == "BF16") {
        ASSERT_EQ(bits & 0xffff, 0u) << v << " is not a bf16 value";
        const uint16_t b = static_cast<uint16_t>(bits >> 16);
        std::memcpy(at, &b, 2);
      } else {
        ASSERT_EQ(t.dtype, "F16");
        // A normal half with fp32's top mantissa bits (v < 2^15, 10 mantissa bits suffice).
        ASSERT_EQ(bits & 0x1fff, 0u) << v << " is not an f16 value";
        const uint32_t exponent = (bits >> 23) & 0xff;
        const uint16_t h =
            v == 0 ? 0
                   : static_cast<uint16_t>(((exponent - 127 + 15) << 10) | ((bits >> 13) & 0x3ff));
        std::memcpy(at, &h, 2);
      }
    }
    ASSERT_TRUE((*w)->Append(bytes.data(), bytes.size()).ok());
  }
  ASSERT_TRUE((*w)->Commit().ok());
}

// The model's tensors in HF shapes, each with `dtype`.
std::vector<TensorInfo> HfTensorsOf(const v1::ModelSpec& model, const std::string& dtype) {
  const absl::StatusOr<HfModelLayout> layout = HfLayoutOf(model);
  EXPECT_TRUE(layout.ok()) << layout.status();
  std::vector<TensorInfo> out;
  for (const HfTensor& t : layout->tensors) out.push_back({t.name, dtype, t.shape});
  return out;
}

TEST_F(HfExportTest, Gpt2ExportThenImportIsTheIdentityAndPadsTheVocabulary) {
  const v1::ModelSpec model = Gpt(5);
  auto ckpt = CheckpointOf("job-1", model);
  const std::string hf = models_ + "/hf.safetensors";
  ASSERT_TRUE(ExportHfSafetensors(*ckpt, model, hf).ok());
  auto file = SafetensorsFile::Open(hf);
  ASSERT_TRUE(file.ok());
  const std::string b = "transformer.h.0.";
  EXPECT_EQ((*file)->Find(b + "attn.c_attn.weight")->shape, (std::vector<int64_t>{4, 12}));
  EXPECT_EQ((*file)->Find("transformer.wte.weight.adam_m"), nullptr);  // no optimizer state
  EXPECT_EQ((*file)->Find("lm_head.weight"), nullptr);                 // tied
  EXPECT_EQ((*file)->tensors().size(), 2u + 12u + 2u);
  // Ours (out, in)[r][k] == HF (in, out)[k][r].
  auto ours = ckpt->Data(b + "mlp.c_fc.weight");
  auto theirs = (*file)->Data(b + "mlp.c_fc.weight");
  const float* o = reinterpret_cast<const float*>(ours->data());
  const float* t = reinterpret_cast<const float*>(theirs->data());
  EXPECT_EQ(o[2 * 4 + 3], t[3 * 16 + 2]);

  // Import back into a model with a padded vocabulary (5 -> 8 rows): identical tensors,
  // zero padding rows.
  auto back = Import("hf.safetensors", Gpt(8));
  ASSERT_TRUE(back.ok()) << back.status();
  for (const TensorInfo* t : ckpt->tensors()) {
    if (t->name.find(".adam_") != std::string::npos) continue;
    auto a = ckpt->Data(t->name);
    auto c = (*back)->Data(t->name);
    ASSERT_TRUE(c.ok()) << t->name;
    ASSERT_GE(c->size(), a->size()) << t->name;
    EXPECT_EQ(std::memcmp(a->data(), c->data(), a->size()), 0) << t->name;
  }
  auto wte = (*back)->Data("transformer.wte.weight");
  ASSERT_EQ(wte->size(), 8u * 4 * 4);
  EXPECT_EQ(reinterpret_cast<const float*>(wte->data())[7 * 4], 0.0f);
  // An untied model takes lm_head from wte (GPT-2 files have none).
  v1::ModelSpec untied = Gpt(5);
  untied.set_tie_embeddings(false);
  auto u = Import("hf.safetensors", untied);
  ASSERT_TRUE(u.ok()) << u.status();
  EXPECT_EQ(std::memcmp((*u)->Data("lm_head.weight")->data(),
                        (*u)->Data("transformer.wte.weight")->data(), 5 * 4 * 4),
            0);
  // A model that does not fit the file is refused naming the tensor.
  v1::ModelSpec wider = Gpt(5);
  wider.set_d_model(8);
  auto s = Import("hf.safetensors", wider);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.status().message(),
            "init.hf_file: tensor transformer.wte.weight is [5, 4], the spec needs [at most 5, "
            "8]");
  v1::ModelSpec wider_mlp = Gpt(5);
  wider_mlp.set_d_hidden(20);
  s = Import("hf.safetensors", wider_mlp);
  EXPECT_EQ(s.status().message(),
            "init.hf_file: tensor transformer.h.0.mlp.c_fc.weight is [4, 16], the spec needs "
            "[4, 20] (Conv1D: in, out)");
}

TEST_F(HfExportTest, LlamaExportThenImportIsTheIdentity) {
  for (bool tied : {false, true}) {
    SCOPED_TRACE(tied ? "tied" : "untied");
    const v1::ModelSpec model = Llama(tied);
    const std::string job = tied ? "job-tied" : "job-untied";
    auto ckpt = CheckpointOf(job, model);
    const std::string hf = models_ + "/" + job + ".safetensors";
    ASSERT_TRUE(ExportHfSafetensors(*ckpt, model, hf).ok());
    auto file = SafetensorsFile::Open(hf);
    ASSERT_TRUE(file.ok()) << file.status();
    EXPECT_EQ((*file)->metadata().at("format"), "pt");
    // LlamaForCausalLM's names, (out, in) weights as in Tandem, no optimizer state, lm_head
    // only when untied.
    const std::vector<std::pair<std::string, std::vector<int64_t>>> expected = {
        {"model.embed_tokens.weight", {10, 8}},
        {"model.layers.0.input_layernorm.weight", {8}},
        {"model.layers.0.self_attn.q_proj.weight", {8, 8}},
        {"model.layers.0.self_attn.k_proj.weight", {4, 8}},
        {"model.layers.1.self_attn.v_proj.weight", {4, 8}},
        {"model.layers.1.self_attn.o_proj.weight", {8, 8}},
        {"model.layers.1.post_attention_layernorm.weight", {8}},
        {"model.layers.1.mlp.gate_proj.weight", {12, 8}},
        {"model.layers.1.mlp.up_proj.weight", {12, 8}},
        {"model.layers.1.mlp.down_proj.weight", {8, 12}},
        {"model.norm.weight", {8}},
    };
    for (const auto& [name, shape] : expected) {
      const TensorInfo* t = (*file)->Find(name);
      ASSERT_NE(t, nullptr) << name;
      EXPECT_EQ(t->shape, shape) << name;
      EXPECT_EQ(t->dtype, "F32") << name;
      // The bytes are the checkpoint's, untouched.
      EXPECT_EQ(std::memcmp((*file)->Data(name)->data(), ckpt->Data(name)->data(),
                            ckpt->Data(name)->size()),
                0)
          << name;
    }
    EXPECT_EQ((*file)->Find("lm_head.weight") != nullptr, !tied);
    EXPECT_EQ((*file)->tensors().size(), 1u + 2 * 9u + 1u + (tied ? 0u : 1u));
    for (const TensorInfo& t : (*file)->tensors()) EXPECT_THAT(t.name, Not(HasSubstr("adam")));

    auto back = Import(job + ".safetensors", model);
    ASSERT_TRUE(back.ok()) << back.status();
    ExpectSameParameters(*ckpt, **back);
    EXPECT_EQ((*back)->tensors().size(), (*file)->tensors().size());
  }
  // A tied file imported into an untied model: lm_head is the embedding.
  auto untied = Import("job-tied.safetensors", Llama(false));
  ASSERT_TRUE(untied.ok()) << untied.status();
  auto lm = (*untied)->Data("lm_head.weight");
  auto emb = (*untied)->Data("model.embed_tokens.weight");
  ASSERT_EQ(lm->size(), emb->size());
  EXPECT_EQ(std::memcmp(lm->data(), emb->data(), lm->size()), 0);
}

TEST_F(HfExportTest, ExportRefusesWhatHasNoHfCounterpartOrDoesNotFit) {
  v1::ModelSpec mlp;
  mlp.set_arch("mlp_lm");
  auto ckpt = MakeCheckpoint("job-mlp", {{"w", "F32", {2}}});
  absl::Status s = ExportHfSafetensors(*ckpt, mlp, models_ + "/x.safetensors");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("mlp_lm"));
  EXPECT_EQ(HfConfigJson(mlp).status().code(), absl::StatusCode::kInvalidArgument);
  // A checkpoint of another llama shape.
  v1::ModelSpec other = Llama(false);
  other.set_n_kv_head(4);
  auto wrong = CheckpointOf("job-other", other);
  s = ExportHfSafetensors(*wrong, Llama(false), models_ + "/y.safetensors");
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(s.message(),
            "export: checkpoint tensor model.layers.0.self_attn.k_proj.weight is F32 [8, 8], the "
            "spec needs F32 [4, 8]");
  EXPECT_FALSE(std::filesystem::exists(models_ + "/y.safetensors"));
}

TEST_F(HfExportTest, HalfPrecisionWidensExactly) {
  // Every F16 value against the compiler's own conversion, where it has _Float16.
#ifdef __FLT16_MAX__
  for (uint32_t bits = 0; bits <= 0xffff; ++bits) {
    const uint16_t h = static_cast<uint16_t>(bits);
    _Float16 f;
    std::memcpy(&f, &h, 2);
    const float want = static_cast<float>(f);
    const float got = F16ToFloat(h);
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << bits;
    } else {
      EXPECT_EQ(std::memcmp(&want, &got, 4), 0) << bits;  // -0 included
    }
  }
#endif
  EXPECT_EQ(F16ToFloat(0x3c00), 1.0f);
  EXPECT_EQ(F16ToFloat(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(F16ToFloat(0x03ff), std::ldexp(1023.0f, -24));
  EXPECT_EQ(F16ToFloat(0x7bff), 65504.0f);
  EXPECT_EQ(F16ToFloat(0xfc00), -INFINITY);
  EXPECT_TRUE(std::isnan(F16ToFloat(0x7e00)));
  EXPECT_TRUE(std::signbit(F16ToFloat(0x8000)));
  EXPECT_EQ(F16ToFloat(0xc000), -2.0f);
  // BF16 is fp32's top half.
  EXPECT_EQ(Bf16ToFloat(0x3f80), 1.0f);
  EXPECT_EQ(Bf16ToFloat(0x4049), 3.140625f);
  EXPECT_EQ(Bf16ToFloat(0xff80), -INFINITY);
  EXPECT_EQ(Bf16ToFloat(0x0001), std::ldexp(1.0f, -133));  // subnormal
  for (uint32_t bits = 0; bits <= 0xffff; ++bits) {
    const float got = Bf16ToFloat(static_cast<uint16_t>(bits));
    uint32_t back;
    std::memcpy(&back, &got, 4);
    EXPECT_EQ(back, bits << 16);
  }
}

TEST_F(HfExportTest, LlamaImportsBf16AndF16FilesExactly) {
  for (const std::string dtype : {"BF16", "F16"}) {
    SCOPED_TRACE(dtype);
    const v1::ModelSpec model = Llama(false);
    const std::vector<TensorInfo> tensors = HfTensorsOf(model, dtype);
    const std::string name = "llama-" + dtype + ".safetensors";
    WriteHfFile(models_ + "/" + name, tensors);
    auto back = Import(name, model);
    ASSERT_TRUE(back.ok()) << back.status();
    for (size_t k = 0; k < tensors.size(); ++k) {
      const TensorInfo* t = (*back)->Find(tensors[k].name);
      ASSERT_NE(t, nullptr) << tensors[k].name;
      EXPECT_EQ(t->dtype, "F32");
      EXPECT_EQ(t->shape, tensors[k].shape);
      auto data = (*back)->Data(tensors[k].name);
      const float* v = reinterpret_cast<const float*>(data->data());
      for (size_t i = 0; i < data->size() / 4; ++i) {
        ASSERT_EQ(v[i], static_cast<float>(k) + static_cast<float>(i) / 8)
            << tensors[k].name << "[" << i << "]";
      }
    }
  }
  // Other dtypes are refused naming the tensor.
  std::vector<TensorInfo> tensors = HfTensorsOf(Llama(false), "F32");
  tensors[3].dtype = "I32";
  WriteHfFile(models_ + "/ints.safetensors", {});
  {
    auto w = SafetensorsWriter::Create(models_ + "/ints.safetensors", tensors);
    ASSERT_TRUE(w.ok());
    std::vector<uint8_t> zeros(static_cast<size_t>((*w)->data_bytes()));
    ASSERT_TRUE((*w)->Append(zeros.data(), zeros.size()).ok());
    ASSERT_TRUE((*w)->Commit().ok());
  }
  auto s = Import("ints.safetensors", Llama(false));
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.status().message(),
            "init.hf_file: tensor " + tensors[3].name + " is I32; F32, BF16 and F16 import");
}

TEST_F(HfExportTest, LlamaImportNamesEachTensorThatDoesNotFit) {
  const v1::ModelSpec model = Llama(false);
  const std::vector<TensorInfo> good = HfTensorsOf(model, "BF16");
  auto refused = [&](std::vector<TensorInfo> tensors, const v1::ModelSpec& spec) {
    WriteHfFile(models_ + "/bad.safetensors", tensors);
    auto s = Import("bad.safetensors", spec);
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
    return std::string(s.status().message());
  };
  for (size_t k = 0; k < good.size(); ++k) {
    std::vector<TensorInfo> tensors = good;
    tensors[k].shape[0] += 1;
    std::vector<int64_t> need = good[k].shape;
    EXPECT_EQ(refused(tensors, model),
              absl::StrCat("init.hf_file: tensor ", good[k].name, " is ",
                           ShapeString(tensors[k].shape), ", the spec needs ", ShapeString(need)));
    tensors.erase(tensors.begin() + static_cast<std::ptrdiff_t>(k));
    if (good[k].name == "lm_head.weight") continue;  // taken from the embedding instead
    EXPECT_EQ(refused(tensors, model),
              "init.hf_file: bad.safetensors has no tensor " + good[k].name);
  }
  // The example: SmolLM2's k_proj ([192, 576]) in a model with 4 KV heads of 64.
  v1::ModelSpec smol;
  smol.set_arch("llama");
  smol.set_n_layer(4);
  smol.set_n_head(9);
  smol.set_n_kv_head(3);
  smol.set_d_model(576);
  smol.set_d_hidden(64);
  smol.set_seq_len(8);
  smol.set_vocab_size(16);
  smol.set_tie_embeddings(true);
  std::vector<TensorInfo> tensors = HfTensorsOf(smol, "F32");
  for (TensorInfo& t : tensors) {
    if (t.name == "model.layers.3.self_attn.k_proj.weight") t.shape = {256, 576};
  }
  EXPECT_EQ(refused(tensors, smol),
            "init.hf_file: tensor model.layers.3.self_attn.k_proj.weight is [256, 576], the spec "
            "needs [192, 576]");
  // Nothing is left of a refused import.
  EXPECT_FALSE(store_->Latest("import-1").ok());
}

TEST_F(HfExportTest, ShardedCheckpointsImportFromTheirIndex) {
  const v1::ModelSpec model = Llama(true);
  const std::vector<TensorInfo> tensors = HfTensorsOf(model, "BF16");
  // Two shards in a subdirectory, with an extra tensor (rotary_emb.inv_freq, as older
  // transformers saved) the model ignores.
  const std::string sub = models_ + "/smol";
  std::filesystem::create_directories(sub);
  std::vector<TensorInfo> first(tensors.begin(), tensors.begin() + 5);
  std::vector<TensorInfo> second(tensors.begin() + 5, tensors.end());
  second.push_back({"model.layers.0.self_attn.rotary_emb.inv_freq", "F32", {1}});
  WriteHfFile(sub + "/model-00001-of-00002.safetensors", first);
  WriteHfFile(sub + "/model-00002-of-00002.safetensors", second, /*first_k=*/5);
  nlohmann::json index;
  index["metadata"]["total_size"] = 1234;
  for (const TensorInfo& t : first)
    index["weight_map"][t.name] = "model-00001-of-00002.safetensors";
  for (const TensorInfo& t : second) {
    index["weight_map"][t.name] = "model-00002-of-00002.safetensors";
  }
  auto write_index = [&](const std::string& name, const nlohmann::json& j) {
    std::ofstream(sub + "/" + name) << j.dump(2);
  };
  write_index("model.safetensors.index.json", index);

  // The same tensors as one file imports to the same checkpoint.
  std::vector<TensorInfo> whole = first;
  whole.insert(whole.end(), second.begin(), second.end());
  WriteHfFile(models_ + "/whole.safetensors", whole);
  auto a = Import("smol/model.safetensors.index.json", model);
  ASSERT_TRUE(a.ok()) << a.status();
  auto b = Import("whole.safetensors", model);
  ASSERT_TRUE(b.ok()) << b.status();
  ExpectSameParameters(**b, **a);
  EXPECT_EQ((*a)->tensors().size(), tensors.size());
  EXPECT_EQ((*a)->Find("model.layers.0.self_attn.rotary_emb.inv_freq"), nullptr);

  auto open_error = [&](const nlohmann::json& j) {
    write_index("bad.index.json", j);
    return Open("smol/bad.index.json").status();
  };
  // A shard that is missing, outside the directory, or lacks a tensor mapped to it.
  nlohmann::json missing = index;
  missing["weight_map"]["model.norm.weight"] = "model-00003-of-00003.safetensors";
  absl::Status s = open_error(missing);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr("init.hf_file"));
  for (const std::string escape : {"../whole.safetensors", "/etc/passwd", ".."}) {
    nlohmann::json out = index;
    out["weight_map"]["model.norm.weight"] = escape;
    s = open_error(out);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << escape;
    EXPECT_THAT(s.message(), HasSubstr("not a file name in the index's directory")) << escape;
  }
  nlohmann::json wrong = index;
  wrong["weight_map"]["model.norm.weight"] = "model-00001-of-00002.safetensors";
  s = open_error(wrong);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(s.message(),
            "init.hf_file: the shard index smol/bad.index.json maps model.norm.weight to "
            "model-00001-of-00002.safetensors, which has no such tensor");
  // A shard that is a symlink leading out of the models root.
  std::filesystem::create_symlink(dir_ + "/checkpoints", sub + "/escape.safetensors");
  nlohmann::json link = index;
  link["weight_map"]["model.norm.weight"] = "escape.safetensors";
  s = open_error(link);
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(s.message(), HasSubstr("outside"));
  // Not an index at all.
  std::ofstream(sub + "/junk.json") << "{\"weight_map\": [1, 2]";
  EXPECT_EQ(Open("smol/junk.json").status().code(), absl::StatusCode::kInvalidArgument);
  s = open_error(nlohmann::json{{"metadata", {}}});
  EXPECT_THAT(s.message(), HasSubstr("has no \"weight_map\""));
  // A tensor missing from every shard is named as from one file.
  nlohmann::json partial = index;
  partial["weight_map"].erase("model.norm.weight");
  write_index("partial.index.json", partial);
  auto p = Import("smol/partial.index.json", model);
  EXPECT_EQ(p.status().message(),
            "init.hf_file: smol/partial.index.json has no tensor model.norm.weight");
}

TEST_F(HfExportTest, ConfigJsonDescribesTheModelForTransformers) {
  v1::ModelSpec m = Llama(false);
  auto text = HfConfigJson(m);
  ASSERT_TRUE(text.ok()) << text.status();
  const nlohmann::json c = nlohmann::json::parse(*text);
  EXPECT_EQ(c["architectures"], nlohmann::json::array({"LlamaForCausalLM"}));
  EXPECT_EQ(c["model_type"], "llama");
  EXPECT_EQ(c["hidden_size"], 8);
  EXPECT_EQ(c["intermediate_size"], 12);
  EXPECT_EQ(c["num_hidden_layers"], 2);
  EXPECT_EQ(c["num_attention_heads"], 4);
  EXPECT_EQ(c["num_key_value_heads"], 2);
  EXPECT_EQ(c["head_dim"], 2);
  EXPECT_EQ(c["vocab_size"], 10);
  EXPECT_EQ(c["max_position_embeddings"], 4);
  EXPECT_EQ(c["rope_theta"].get<double>(), 500000.0);
  EXPECT_EQ(c["rms_norm_eps"].get<double>(), 1e-6);
  EXPECT_EQ(c["tie_word_embeddings"], false);
  EXPECT_EQ(c["hidden_act"], "silu");
  EXPECT_EQ(c["attention_bias"], false);
  EXPECT_EQ(c["mlp_bias"], false);
  EXPECT_EQ(c["torch_dtype"], "float32");

  v1::ModelSpec g = Gpt(kGpt2PaddedVocab);
  const nlohmann::json gc = nlohmann::json::parse(*HfConfigJson(g));
  EXPECT_EQ(gc["architectures"], nlohmann::json::array({"GPT2LMHeadModel"}));
  EXPECT_EQ(gc["vocab_size"], kGpt2Vocab);  // the padding is not exported
  EXPECT_EQ(gc["n_embd"], 4);
  EXPECT_EQ(gc["n_inner"], 16);
  EXPECT_EQ(gc["n_positions"], 3);
  EXPECT_EQ(gc["activation_function"], "gelu_new");

  EXPECT_EQ(HfConfigPath("out/model.safetensors"), "out/config.json");
  EXPECT_EQ(HfConfigPath("/a/b/x.safetensors"), "/a/b/config.json");
  EXPECT_EQ(HfConfigPath("model.safetensors"), "config.json");
}

}  // namespace
}  // namespace tandem::coordinator
