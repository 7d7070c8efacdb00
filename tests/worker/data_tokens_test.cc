// Token files (llm.c and headerless uint16), shard patterns, train/validation splits from
// files, and the vocabulary check.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "worker/data/corpus.h"

namespace tandem::worker {
namespace {

std::vector<int32_t> ReadAll(const TokenStream& s) {
  std::vector<int32_t> out(static_cast<size_t>(s.size()));
  s.Read(0, s.size(), out.data());
  return out;
}

void PutLe(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

// Tokens start at `first` and count up by `step` (mod 2^16).
std::vector<int32_t> Ramp(int64_t n, int32_t first, int32_t step = 1) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) t[i] = static_cast<int32_t>((first + step * i) & 0xffff);
  return t;
}

class TokenFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = std::filesystem::temp_directory_path() /
            ("tandem_data_tokens_test_" + std::to_string(::getpid()));
    std::filesystem::create_directories(root_);
  }
  void TearDown() override { std::filesystem::remove_all(root_); }

  void WriteRaw(const std::string& name, const std::string& bytes) {
    std::filesystem::create_directories((root_ / name).parent_path());
    std::ofstream(root_ / name, std::ios::binary) << bytes;
  }
  // An llm.c file; `count` overrides the header's token count when >= 0.
  void WriteLlmc(const std::string& name, const std::vector<int32_t>& tokens, int32_t version = 1,
                 int64_t count = -1) {
    std::string b;
    PutLe(b, kTokenFileMagic, 4);
    PutLe(b, static_cast<uint32_t>(version), 4);
    PutLe(b, static_cast<uint64_t>(count >= 0 ? count : static_cast<int64_t>(tokens.size())), 4);
    b.resize(kTokenFileHeaderBytes, '\0');
    for (int32_t t : tokens) PutLe(b, static_cast<uint32_t>(t), 2);
    WriteRaw(name, b);
  }
  void WriteHeaderless(const std::string& name, const std::vector<int32_t>& tokens) {
    std::string b;
    for (int32_t t : tokens) PutLe(b, static_cast<uint32_t>(t), 2);
    WriteRaw(name, b);
  }
  std::string Path(const std::string& name) const { return (root_ / name).string(); }

  v1::JobSpec Spec(const std::string& path, float val_fraction = 0, int32_t vocab = 65536) {
    v1::JobSpec spec;
    spec.mutable_model()->set_vocab_size(vocab);
    spec.mutable_data()->set_source("file");
    spec.mutable_data()->set_format("tokens");
    spec.mutable_data()->set_path(path);
    spec.mutable_data()->set_val_fraction(val_fraction);
    return spec;
  }

  std::filesystem::path root_;
};

TEST_F(TokenFileTest, ReadsLlmcAndHeaderlessFiles) {
  const std::vector<int32_t> tokens = Ramp(1000, 65000, 7);  // wraps; max near 65535
  WriteLlmc("a.bin", tokens);
  WriteHeaderless("b.bin", tokens);
  for (const char* name : {"a.bin", "b.bin"}) {
    auto s = MapTokenFile(Path(name));
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_EQ((*s)->size(), 1000) << name;
    EXPECT_EQ(ReadAll(**s), tokens) << name;
    EXPECT_EQ((*s)->max_token(), *std::max_element(tokens.begin(), tokens.end()));
    std::vector<int32_t> mid(5);
    (*s)->Read(500, 5, mid.data());
    EXPECT_EQ(mid, std::vector<int32_t>(tokens.begin() + 500, tokens.begin() + 505));
  }
  // An empty headerless file is an empty stream.
  WriteRaw("empty.bin", "");
  auto empty = MapTokenFile(Path("empty.bin"));
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_EQ((*empty)->size(), 0);
  EXPECT_EQ((*empty)->max_token(), -1);
}

TEST_F(TokenFileTest, BadMagicIsHeaderless) {
  std::string b;
  PutLe(b, kTokenFileMagic + 1, 4);  // tokens 0xd889, 0x0134
  PutLe(b, 42, 2);
  WriteRaw("x.bin", b);
  auto s = MapTokenFile(Path("x.bin"));
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(ReadAll(**s), (std::vector<int32_t>{0xd889, 0x0134, 42}));
}

TEST_F(TokenFileTest, CorruptFilesNameTheFile) {
  WriteLlmc("v2.bin", Ramp(10, 0), /*version=*/2);
  WriteLlmc("trunc.bin", Ramp(10, 0), 1, /*count=*/11);
  WriteLlmc("long.bin", Ramp(10, 0), 1, /*count=*/9);
  WriteRaw("short_header.bin", std::string("\x88\xd8\x34\x01\x01\x00\x00\x00", 8));
  WriteRaw("odd.bin", "abc");
  struct Case {
    const char* name;
    absl::StatusCode code;
    const char* detail;
  };
  for (const Case& c : {Case{"v2.bin", absl::StatusCode::kInvalidArgument, "version 2"},
                        Case{"trunc.bin", absl::StatusCode::kDataLoss, "11 tokens"},
                        Case{"long.bin", absl::StatusCode::kDataLoss, "9 tokens"},
                        Case{"short_header.bin", absl::StatusCode::kDataLoss, "header"},
                        Case{"odd.bin", absl::StatusCode::kDataLoss, "odd"}}) {
    auto s = MapTokenFile(Path(c.name));
    EXPECT_EQ(s.status().code(), c.code) << c.name << ": " << s.status();
    EXPECT_NE(s.status().message().find(Path(c.name)), std::string::npos) << s.status();
    EXPECT_NE(s.status().message().find(c.detail), std::string::npos) << s.status();
    // Through LoadDataset the error also names the spec field.
    auto d = LoadDataset(Spec(c.name), root_.string(), 4);
    EXPECT_EQ(d.status().code(), c.code) << d.status();
    EXPECT_NE(d.status().message().find("data.path"), std::string::npos) << d.status();
  }
  EXPECT_EQ(MapTokenFile(Path("missing.bin")).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(TokenFileTest, ShardsConcatenateInNameOrder) {
  // Written out of order, with a non-matching file, a hidden file and a directory that match
  // nothing or are skipped.
  WriteLlmc("shards/train_002.bin", Ramp(30, 2000));
  WriteHeaderless("shards/train_000.bin", Ramp(50, 0));
  WriteLlmc("shards/train_001.bin", Ramp(20, 1000));
  WriteLlmc("shards/.train_003.bin", Ramp(20, 3000));
  WriteLlmc("shards/val_000.bin", Ramp(40, 9000));
  std::filesystem::create_directories(root_ / "shards" / "train_dir.bin");
  auto files = ResolveDataFiles(root_.string(), "shards/train_*.bin", "data.path");
  ASSERT_TRUE(files.ok()) << files.status();
  EXPECT_EQ(*files,
            (std::vector<std::string>{Path("shards/train_000.bin"), Path("shards/train_001.bin"),
                                      Path("shards/train_002.bin")}));
  auto d = LoadDataset(Spec("shards/train_*.bin"), root_.string(), 8);
  ASSERT_TRUE(d.ok()) << d.status();
  std::vector<int32_t> expected = Ramp(50, 0);
  for (int32_t t : Ramp(20, 1000)) expected.push_back(t);
  for (int32_t t : Ramp(30, 2000)) expected.push_back(t);
  EXPECT_EQ(d->train->size(), 100);
  EXPECT_EQ(ReadAll(*d->train), expected);
  EXPECT_EQ(d->train->max_token(), 2029);
  // A window spanning both boundaries (shard 0 into 2), and each start near them.
  std::vector<int32_t> w(30);
  d->train->Read(45, 30, w.data());
  EXPECT_EQ(w, std::vector<int32_t>(expected.begin() + 45, expected.begin() + 75));
  for (int64_t start = 40; start < 80; ++start) {
    std::vector<int32_t> v(8);
    d->train->Read(start, 8, v.data());
    ASSERT_EQ(v, std::vector<int32_t>(expected.begin() + start, expected.begin() + start + 8))
        << start;
  }
  // The sampler reads the same windows from the concatenation.
  WindowSampler s(d->train, 5, 8);
  std::vector<int32_t> out(64 * 8);
  s.Sample(0, 64, out.data());
  for (int i = 0; i < 64; ++i) {
    const int64_t start = s.WindowStart(i);
    ASSERT_LE(start + 8, 100);
    ASSERT_EQ(std::vector<int32_t>(out.begin() + i * 8, out.begin() + (i + 1) * 8),
              std::vector<int32_t>(expected.begin() + start, expected.begin() + start + 8));
  }
  // '?' matches one character.
  files = ResolveDataFiles(root_.string(), "shards/train_00?.bin", "data.path");
  ASSERT_TRUE(files.ok()) << files.status();
  EXPECT_EQ(files->size(), 3u);
}

TEST_F(TokenFileTest, PatternErrors) {
  WriteLlmc("shards/a.bin", Ramp(30, 0));
  auto none = LoadDataset(Spec("shards/*.txt"), root_.string(), 8);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kNotFound) << none.status();
  EXPECT_NE(none.status().message().find("*.txt"), std::string::npos) << none.status();
  EXPECT_NE(none.status().message().find(Path("shards")), std::string::npos) << none.status();
  auto nodir = LoadDataset(Spec("nodir/*.bin"), root_.string(), 8);
  EXPECT_EQ(nodir.status().code(), absl::StatusCode::kNotFound) << nodir.status();
  for (const std::string bad :
       {"../shards/*.bin", "shards/../../*.bin", "/tmp/*.bin", "sh*/a.bin"}) {
    auto r = LoadDataset(Spec(bad), root_.string(), 8);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(r.status().message().find("data.path"), std::string::npos) << r.status();
  }
  v1::JobSpec spec = Spec("shards/a.bin");
  spec.mutable_data()->set_val_path("../v.bin");
  auto r = LoadDataset(spec, root_.string(), 8);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("data.val_path"), std::string::npos) << r.status();
  spec.mutable_data()->set_format("words");
  EXPECT_NE(LoadDataset(spec, root_.string(), 8).status().message().find("data.format"),
            std::string::npos);
}

TEST(DataPatternTest, Matches) {
  EXPECT_TRUE(MatchesDataPattern("*.bin", "a.bin"));
  EXPECT_TRUE(MatchesDataPattern("*", "abc"));
  EXPECT_TRUE(MatchesDataPattern("a*b*c", "aXbYbZc"));
  EXPECT_TRUE(MatchesDataPattern("a?c", "abc"));
  EXPECT_TRUE(MatchesDataPattern("[x]", "[x]"));  // brackets are literal
  EXPECT_FALSE(MatchesDataPattern("[x]", "x"));
  EXPECT_FALSE(MatchesDataPattern("a?c", "ac"));
  EXPECT_FALSE(MatchesDataPattern("*.bin", "a.bin.tmp"));
  EXPECT_FALSE(MatchesDataPattern("*.bin", ".a.bin"));
  EXPECT_TRUE(MatchesDataPattern(".*.bin", ".a.bin"));
}

TEST_F(TokenFileTest, FractionSplitIsDisjointTail) {
  WriteLlmc("a.bin", Ramp(60, 0));
  WriteLlmc("b.bin", Ramp(40, 100));
  auto d = LoadDataset(Spec("?.bin", 0.25f), root_.string(), 8);
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_TRUE(d->has_val());
  EXPECT_EQ(d->train->size(), 75);
  EXPECT_EQ(d->val->size(), 25);
  const std::vector<int32_t> train = ReadAll(*d->train), val = ReadAll(*d->val);
  // train = a + b[0, 15), val = b[15, 40): disjoint, and together the whole stream.
  EXPECT_EQ(train.back(), 114);
  EXPECT_EQ(val.front(), 115);
  EXPECT_EQ(val.back(), 139);
  EXPECT_EQ(d->train->max_token(), 114);
  EXPECT_EQ(d->val->max_token(), 139);
  // Windows of each split stay inside it.
  WindowSampler tr(d->train, 1, 8), va(d->val, 1, 8);
  std::vector<int32_t> w(8);
  for (int64_t g = 0; g < 500; ++g) {
    tr.Sample(g, 1, w.data());
    for (int32_t t : w) ASSERT_LE(t, 114);
    va.Sample(g, 1, w.data());
    for (int32_t t : w) ASSERT_GE(t, 115);
  }
  // Too little data for both splits names val_fraction and the sizes.
  auto small = LoadDataset(Spec("b.bin", 0.5f), root_.string(), 30);
  EXPECT_EQ(small.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(small.status().message().find("data.val_fraction"), std::string::npos)
      << small.status();
  EXPECT_NE(small.status().message().find("40 tokens"), std::string::npos) << small.status();
}

TEST_F(TokenFileTest, ValPathSplit) {
  WriteLlmc("train.bin", Ramp(60, 0));
  WriteHeaderless("val.bin", Ramp(20, 500));
  v1::JobSpec spec = Spec("train.bin", 0.5f);  // val_fraction is ignored with val_path
  spec.mutable_data()->set_val_path("val.bin");
  auto d = LoadDataset(spec, root_.string(), 8);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(ReadAll(*d->train), Ramp(60, 0));
  ASSERT_TRUE(d->has_val());
  EXPECT_EQ(ReadAll(*d->val), Ramp(20, 500));
  // A short validation file names data.val_path and its size.
  auto short_val = LoadDataset(spec, root_.string(), 21);
  EXPECT_EQ(short_val.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(short_val.status().message().find("data.val_path"), std::string::npos)
      << short_val.status();
  EXPECT_NE(short_val.status().message().find("20 tokens"), std::string::npos);
  // Validation files may not be training files.
  spec.mutable_data()->set_path("*.bin");
  auto overlap = LoadDataset(spec, root_.string(), 8);
  EXPECT_EQ(overlap.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(overlap.status().message().find("also a training file"), std::string::npos)
      << overlap.status();
  // A missing validation file.
  spec.mutable_data()->set_path("train.bin");
  spec.mutable_data()->set_val_path("nope.bin");
  EXPECT_EQ(LoadDataset(spec, root_.string(), 8).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(TokenFileTest, TokensMustFitTheVocabulary) {
  WriteLlmc("shards/s0.bin", Ramp(50, 0));
  WriteLlmc("shards/s1.bin", Ramp(50, 50000));  // max 50049
  auto d = LoadDataset(Spec("shards/s*.bin", 0, 50257), root_.string(), 8);
  ASSERT_TRUE(d.ok()) << d.status();
  auto r = LoadDataset(Spec("shards/s*.bin", 0, 50040), root_.string(), 8);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("model.vocab_size 50040"), std::string::npos) << r.status();
  EXPECT_NE(r.status().message().find("50049"), std::string::npos) << r.status();
  EXPECT_NE(r.status().message().find(Path("shards/s1.bin")), std::string::npos) << r.status();
  // Byte files too: a byte >= vocab_size.
  std::ofstream(root_ / "text.txt") << "hello tandem";
  v1::JobSpec spec = Spec("text.txt", 0, 100);
  spec.mutable_data()->set_format("bytes");
  r = LoadDataset(spec, root_.string(), 4);
  EXPECT_NE(r.status().message().find("token 116"), std::string::npos) << r.status();
  EXPECT_NE(r.status().message().find("text.txt"), std::string::npos) << r.status();
}

TEST_F(TokenFileTest, ByteShardsConcatenate) {
  std::ofstream(root_ / "p1.txt") << "hello ";
  std::ofstream(root_ / "p2.txt") << "world";
  v1::JobSpec spec = Spec("p*.txt");
  spec.mutable_data()->set_format("bytes");
  auto d = LoadDataset(spec, root_.string(), 4);
  ASSERT_TRUE(d.ok()) << d.status();
  std::string s;
  for (int32_t t : ReadAll(*d->train)) s.push_back(static_cast<char>(t));
  EXPECT_EQ(s, "hello world");
}

}  // namespace
}  // namespace tandem::worker
