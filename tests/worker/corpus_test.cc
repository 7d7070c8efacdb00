#include "worker/data/corpus.h"

#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

namespace tandem::worker {
namespace {

v1::JobSpec SyntheticSpec(int64_t bytes) {
  v1::JobSpec spec;
  spec.set_seed(7);
  spec.mutable_data()->set_source("synthetic");
  spec.mutable_data()->set_synthetic_bytes(bytes);
  return spec;
}

TEST(CorpusTest, SyntheticIsDeterministicAndSeeded) {
  const auto a = GenerateSyntheticCorpus(5, 4096);
  EXPECT_EQ(a, GenerateSyntheticCorpus(5, 4096));
  EXPECT_NE(a, GenerateSyntheticCorpus(6, 4096));
  // A prefix of a longer corpus is the shorter one.
  auto longer = GenerateSyntheticCorpus(5, 8192);
  longer.resize(4096);
  EXPECT_EQ(a, longer);
}

TEST(CorpusTest, SyntheticIsLearnable) {
  // Order-2 conditional entropy, estimated from counts, is far below ln(256) = 5.55 nats
  // (each context has 2-4 successors, so at most ln 4 = 1.39).
  const auto c = GenerateSyntheticCorpus(11, 1 << 18);
  std::map<std::array<uint8_t, 2>, std::map<uint8_t, int>> counts;
  for (size_t i = 2; i < c.size(); ++i) counts[{c[i - 2], c[i - 1]}][c[i]]++;
  double h = 0.0;
  for (const auto& [ctx, next] : counts) {
    int total = 0;
    for (const auto& [b, n] : next) total += n;
    for (const auto& [b, n] : next) h -= n * std::log(static_cast<double>(n) / total);
    EXPECT_LE(next.size(), 4u);
  }
  h /= static_cast<double>(c.size() - 2);
  EXPECT_LT(h, 1.4);
  EXPECT_GT(h, 0.3);
  for (uint8_t b : c) EXPECT_LT(b, 128);
}

TEST(CorpusTest, DataSeedFallsBackToJobSeed) {
  v1::JobSpec spec = SyntheticSpec(100);
  EXPECT_EQ(DataSeed(spec), 7u);
  spec.mutable_data()->set_seed(9);
  EXPECT_EQ(DataSeed(spec), 9u);
}

std::vector<int32_t> ReadAll(const TokenStream& s) {
  std::vector<int32_t> out(static_cast<size_t>(s.size()));
  s.Read(0, s.size(), out.data());
  return out;
}

TEST(SamplerTest, WindowsDependOnlyOnSeedAndIndex) {
  auto data = LoadDataset(SyntheticSpec(10000), ".", 9);
  ASSERT_TRUE(data.ok()) << data.status();
  const std::vector<int32_t> train = ReadAll(*data->train);
  WindowSampler s(data->train, 3, 9);
  std::vector<int32_t> all(16 * 9), halves(16 * 9);
  s.Sample(100, 16, all.data());
  // The same indices sampled in two halves (another micro-batch split) agree, and a second
  // sampler with the same seed agrees.
  s.Sample(100, 8, halves.data());
  WindowSampler(data->train, 3, 9).Sample(108, 8, halves.data() + 8 * 9);
  EXPECT_EQ(all, halves);
  std::vector<int32_t> other(16 * 9);
  WindowSampler(data->train, 4, 9).Sample(100, 16, other.data());
  EXPECT_NE(all, other);
  // Each row is the window at WindowStart.
  for (int i = 0; i < 16; ++i) {
    const int64_t start = s.WindowStart(100 + i);
    for (int k = 0; k < 9; ++k) EXPECT_EQ(all[i * 9 + k], train[start + k]);
  }
  // Windows stay inside the stream and reach its last start.
  int64_t last = 0;
  for (int64_t g = 0; g < 20000; ++g) {
    const int64_t start = s.WindowStart(g);
    EXPECT_GE(start, 0);
    EXPECT_LE(start + 9, data->train->size());
    last = std::max(last, start);
  }
  EXPECT_GT(last, data->train->size() - 9 - 50);
}

TEST(SamplerTest, OneWindowStreamAlwaysStartsAtZero) {
  auto stream = MakeByteTokenStream({1, 2, 3});
  WindowSampler s(stream, 1, 3);
  std::vector<int32_t> out(2 * 3);
  s.Sample(5, 2, out.data());
  EXPECT_EQ(out, (std::vector<int32_t>{1, 2, 3, 1, 2, 3}));
}

TEST(DatasetTest, SyntheticSplitHoldsOutTheTail) {
  v1::JobSpec spec = SyntheticSpec(10000);  // val_fraction defaults to 0.1
  auto data = LoadDataset(spec, ".", 9);
  ASSERT_TRUE(data.ok()) << data.status();
  ASSERT_TRUE(data->has_val());
  EXPECT_EQ(data->train->size(), 9000);
  EXPECT_EQ(data->val->size(), 1000);
  const auto corpus = GenerateSyntheticCorpus(DataSeed(spec), 10000);
  const std::vector<int32_t> train = ReadAll(*data->train), val = ReadAll(*data->val);
  for (size_t i = 0; i < train.size(); ++i) ASSERT_EQ(train[i], corpus[i]);
  for (size_t i = 0; i < val.size(); ++i) ASSERT_EQ(val[i], corpus[9000 + i]);
  EXPECT_LT(data->train->max_token(), 128);
  EXPECT_GE(data->val->max_token(), 'a');

  // Small corpora hold out at least one window; too small for two windows is refused.
  spec.mutable_data()->set_synthetic_bytes(20);
  data = LoadDataset(spec, ".", 9);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->val->size(), 9);
  EXPECT_EQ(data->train->size(), 11);
  spec.mutable_data()->set_synthetic_bytes(17);
  auto small = LoadDataset(spec, ".", 9);
  EXPECT_EQ(small.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(small.status().message().find("data.val_fraction"), std::string::npos)
      << small.status();
  EXPECT_NE(small.status().message().find("17 tokens"), std::string::npos) << small.status();

  // val_fraction 0: no validation split.
  spec.mutable_data()->set_val_fraction(0);
  data = LoadDataset(spec, ".", 9);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_FALSE(data->has_val());
  EXPECT_EQ(data->train->size(), 17);
  for (float bad : {-0.1f, 1.0f, 1.5f}) {
    spec.mutable_data()->set_val_fraction(bad);
    auto r = LoadDataset(spec, ".", 9);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(r.status().message().find("data.val_fraction"), std::string::npos) << r.status();
  }
}

TEST(DatasetTest, SyntheticRefusesValPathAndSmallVocab) {
  v1::JobSpec spec = SyntheticSpec(10000);
  spec.mutable_data()->set_val_path("val.bin");
  EXPECT_NE(LoadDataset(spec, ".", 9).status().message().find("data.val_path"), std::string::npos);
  spec = SyntheticSpec(10000);
  spec.mutable_model()->set_vocab_size(64);
  auto r = LoadDataset(spec, ".", 9);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("model.vocab_size 64"), std::string::npos) << r.status();
  EXPECT_NE(r.status().message().find("synthetic"), std::string::npos) << r.status();
}

class FileCorpusTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = std::filesystem::temp_directory_path() /
            ("tandem_corpus_test_" + std::to_string(::getpid()));
    std::filesystem::create_directories(root_ / "sub");
    std::ofstream(root_ / "sub" / "text.txt") << "hello, tandem world";
    std::ofstream(root_ / "tiny.txt") << "abc";
  }
  void TearDown() override { std::filesystem::remove_all(root_); }

  absl::StatusOr<Dataset> Load(const std::string& path, int64_t window, float val_fraction = 0) {
    v1::JobSpec spec;
    spec.mutable_data()->set_source("file");
    spec.mutable_data()->set_path(path);
    spec.mutable_data()->set_val_fraction(val_fraction);
    return LoadDataset(spec, root_.string(), window);
  }

  std::filesystem::path root_;
};

std::string AsString(const TokenStream& s) {
  std::string out;
  for (int32_t t : ReadAll(s)) out.push_back(static_cast<char>(t));
  return out;
}

TEST_F(FileCorpusTest, ReadsRelativePath) {
  auto c = Load("sub/text.txt", 5);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(AsString(*c->train), "hello, tandem world");
  EXPECT_FALSE(c->has_val());
  EXPECT_EQ(c->train->max_token(), 'w');
  // The default split holds out at least one window from the end.
  c = Load("sub/text.txt", 5, 0.1f);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(AsString(*c->train), "hello, tandem ");
  EXPECT_EQ(AsString(*c->val), "world");
}

TEST_F(FileCorpusTest, PathConfinement) {
  for (const std::string path : {"/etc/passwd", "../x", "sub/../../x", "sub/..", "s*/text.txt"}) {
    auto c = Load(path, 1);
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << path;
    EXPECT_NE(c.status().message().find("data.path"), std::string::npos) << c.status();
  }
  EXPECT_EQ(Load("", 1).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(FileCorpusTest, MissingAndShortFiles) {
  auto missing = Load("nope.txt", 1);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("nope.txt"), std::string::npos);
  auto shortf = Load("tiny.txt", 9);
  EXPECT_EQ(shortf.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(shortf.status().message().find("too short"), std::string::npos);
  EXPECT_NE(shortf.status().message().find("data.path"), std::string::npos);
  EXPECT_EQ(Load("sub", 1).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(CorpusTest, RejectsBadSourceAndSize) {
  v1::JobSpec spec = SyntheticSpec(4);
  EXPECT_EQ(LoadDataset(spec, ".", 9).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(LoadDataset(spec, ".", 9).status().message().find("data.synthetic_bytes"),
            std::string::npos);
  spec.mutable_data()->set_source("s3");
  EXPECT_NE(LoadDataset(spec, ".", 9).status().message().find("data.source"), std::string::npos);
}

}  // namespace
}  // namespace tandem::worker
