// Export to and import from Hugging Face GPT-2 safetensors.
#include "coordinator/hf_export.h"

#include <cstring>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "coordinator/checkpoint_store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem::coordinator {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;

TEST(HfExportTest, ExportThenImportIsTheIdentityAndPadsTheVocabulary) {
  char dir_template[] = "/tmp/tandem-hf-XXXXXX";
  const std::string dir = mkdtemp(dir_template);
  CheckpointStore store(dir + "/checkpoints");
  v1::ModelSpec model;
  model.set_arch("gpt");
  model.set_n_layer(1);
  model.set_d_model(4);
  model.set_n_head(2);
  model.set_seq_len(3);
  model.set_vocab_size(5);
  model.set_tie_embeddings(true);
  // A checkpoint with every gpt parameter (Tandem layouts) plus some optimizer state.
  std::vector<TensorInfo> index = {{"transformer.wte.weight", "F32", {5, 4}},
                                   {"transformer.wpe.weight", "F32", {3, 4}}};
  const std::string b = "transformer.h.0.";
  for (const auto& [n, shape] :
       std::vector<std::pair<std::string, std::vector<int64_t>>>{{"ln_1.weight", {4}},
                                                                 {"ln_1.bias", {4}},
                                                                 {"attn.c_attn.weight", {12, 4}},
                                                                 {"attn.c_attn.bias", {12}},
                                                                 {"attn.c_proj.weight", {4, 4}},
                                                                 {"attn.c_proj.bias", {4}},
                                                                 {"ln_2.weight", {4}},
                                                                 {"ln_2.bias", {4}},
                                                                 {"mlp.c_fc.weight", {16, 4}},
                                                                 {"mlp.c_fc.bias", {16}},
                                                                 {"mlp.c_proj.weight", {4, 16}},
                                                                 {"mlp.c_proj.bias", {4}}}) {
    index.push_back({b + n, "F32", shape});
  }
  index.push_back({"transformer.ln_f.weight", "F32", {4}});
  index.push_back({"transformer.ln_f.bias", "F32", {4}});
  index.push_back({"transformer.wte.weight.adam_m", "F32", {5, 4}});
  {
    auto w = store.BeginStage("job-1", 9, 0, index);
    ASSERT_TRUE(w.ok());
    float x = 0;
    for (const auto& t : index) {
      for (int64_t i = 0; i < t.ByteSize() / 4; ++i, x += 1) ASSERT_TRUE((*w)->Append(&x, 4).ok());
    }
    ASSERT_TRUE((*w)->Commit().ok());
    ASSERT_TRUE(store.Commit("job-1", 9, 1, 1).ok());
  }
  auto ckpt = store.Open("job-1", 9);
  ASSERT_TRUE(ckpt.ok());
  const std::string hf = dir + "/hf.safetensors";
  ASSERT_TRUE(ExportGpt2Safetensors(**ckpt, model, hf).ok());
  auto file = SafetensorsFile::Open(hf);
  ASSERT_TRUE(file.ok());
  EXPECT_EQ((*file)->Find(b + "attn.c_attn.weight")->shape, (std::vector<int64_t>{4, 12}));
  EXPECT_EQ((*file)->Find("transformer.wte.weight.adam_m"), nullptr);  // no optimizer state
  // Ours (out, in)[r][k] == HF (in, out)[k][r].
  auto ours = (*ckpt)->Data(b + "mlp.c_fc.weight");
  auto theirs = (*file)->Data(b + "mlp.c_fc.weight");
  const float* o = reinterpret_cast<const float*>(ours->data());
  const float* t = reinterpret_cast<const float*>(theirs->data());
  EXPECT_EQ(o[2 * 4 + 3], t[3 * 16 + 2]);

  // Import back into a model with a padded vocabulary (5 -> 8 rows): identical tensors,
  // zero padding rows.
  v1::ModelSpec padded = model;
  padded.set_vocab_size(8);
  ASSERT_TRUE(ImportGpt2Safetensors(hf, padded, store, "import-job-2").ok());
  auto back = store.Open("import-job-2", 0);
  ASSERT_TRUE(back.ok()) << back.status();
  for (const auto& t : index) {
    if (t.name.find(".adam_") != std::string::npos) continue;
    auto a = (*ckpt)->Data(t.name);
    auto c = (*back)->Data(t.name);
    ASSERT_TRUE(c.ok()) << t.name;
    ASSERT_GE(c->size(), a->size()) << t.name;
    EXPECT_EQ(std::memcmp(a->data(), c->data(), a->size()), 0) << t.name;
  }
  auto wte = (*back)->Data("transformer.wte.weight");
  ASSERT_EQ(wte->size(), 8u * 4 * 4);
  EXPECT_EQ(reinterpret_cast<const float*>(wte->data())[7 * 4], 0.0f);
  // A model that does not fit the file is refused naming the tensor.
  v1::ModelSpec wider = model;
  wider.set_d_model(8);
  absl::Status s = ImportGpt2Safetensors(hf, wider, store, "import-job-3");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("init.hf_file: tensor transformer.wte.weight"));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace tandem::coordinator
