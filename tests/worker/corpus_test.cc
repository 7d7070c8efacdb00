#include "worker/data/corpus.h"

#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>

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

TEST(SamplerTest, WindowsDependOnlyOnSeedAndIndex) {
  auto corpus = LoadCorpus(SyntheticSpec(10000), ".", 9);
  ASSERT_TRUE(corpus.ok()) << corpus.status();
  WindowSampler s(*corpus, 3, 8);
  IntTensor tokens, targets, tokens2, targets2;
  s.Sample(100, 16, &tokens, &targets);
  // The same indices sampled in two halves (another micro-batch split) agree.
  s.Sample(100, 8, &tokens2, nullptr);
  s.Sample(108, 8, nullptr, &targets2);
  for (int i = 0; i < 8 * 8; ++i) EXPECT_EQ(tokens[i], tokens2[i]);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(targets[8 + i], targets2[i]);
  // Tokens are the window, the target the next byte.
  const auto& bytes = (*corpus)->bytes();
  const int64_t start = s.WindowStart(100);
  for (int k = 0; k < 8; ++k) EXPECT_EQ(tokens[k], bytes[start + k]);
  EXPECT_EQ(targets[0], bytes[start + 8]);
  EXPECT_EQ(tokens.shape(), (std::vector<int64_t>{16, 8}));
  // Windows stay inside the corpus.
  for (int64_t g = 0; g < 5000; ++g) {
    EXPECT_LE(s.WindowStart(g) + 8, 10000 - 1);
  }
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

  absl::StatusOr<std::shared_ptr<const Corpus>> Load(const std::string& path, int64_t min) {
    v1::JobSpec spec;
    spec.mutable_data()->set_source("file");
    spec.mutable_data()->set_path(path);
    return LoadCorpus(spec, root_.string(), min);
  }

  std::filesystem::path root_;
};

TEST_F(FileCorpusTest, ReadsRelativePath) {
  auto c = Load("sub/text.txt", 5);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(std::string((*c)->bytes().begin(), (*c)->bytes().end()), "hello, tandem world");
}

TEST_F(FileCorpusTest, PathConfinement) {
  for (const std::string path : {"/etc/passwd", "../x", "sub/../../x", "sub/.."}) {
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
  EXPECT_EQ(Load("sub", 1).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(CorpusTest, RejectsBadSourceAndSize) {
  v1::JobSpec spec = SyntheticSpec(4);
  EXPECT_EQ(LoadCorpus(spec, ".", 9).status().code(), absl::StatusCode::kInvalidArgument);
  spec.mutable_data()->set_source("s3");
  EXPECT_NE(LoadCorpus(spec, ".", 9).status().message().find("data.source"), std::string::npos);
}

}  // namespace
}  // namespace tandem::worker
