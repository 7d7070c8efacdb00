// Token files (llm.c and headerless uint16; uint32 "tokens32"), shard patterns,
// train/validation splits from files, and the vocabulary check.
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
  // A "tokens32" file, laid out as the numpy writer in docs/architecture.md ("Token data")
  // writes it: header[0..3] = magic, version, count, width; then uint32 tokens. `count`
  // overrides the token count when >= 0.
  void WriteTokens32(const std::string& name, const std::vector<uint32_t>& tokens,
                     int32_t magic = kToken32FileMagic, int32_t version = kToken32FileVersion,
                     int32_t width = kToken32FileWidth, int64_t count = -1) {
    std::string b;
    PutLe(b, static_cast<uint32_t>(magic), 4);
    PutLe(b, static_cast<uint32_t>(version), 4);
    PutLe(b, static_cast<uint32_t>(count >= 0 ? count : static_cast<int64_t>(tokens.size())), 4);
    PutLe(b, static_cast<uint32_t>(width), 4);
    b.resize(kTokenFileHeaderBytes, '\0');
    for (uint32_t t : tokens) PutLe(b, t, 4);
    WriteRaw(name, b);
  }
  void WriteHeaderless(const std::string& name, const std::vector<int32_t>& tokens) {
    std::string b;
    for (int32_t t : tokens) PutLe(b, static_cast<uint32_t>(t), 2);
    WriteRaw(name, b);
  }
  std::string Path(const std::string& name) const { return (root_ / name).string(); }

  v1::JobSpec Spec(const std::string& path, float val_fraction = 0, int32_t vocab = 65536,
                   const std::string& format = "tokens") {
    v1::JobSpec spec;
    spec.mutable_model()->set_vocab_size(vocab);
    spec.mutable_data()->set_source("file");
    spec.mutable_data()->set_format(format);
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
  // The first token >= vocab_size is s1's 41st (50040, index 40 of that file, not of the
  // concatenation); its largest is named too.
  auto r = LoadDataset(Spec("shards/s*.bin", 0, 50040), root_.string(), 8);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("model.vocab_size 50040"), std::string::npos) << r.status();
  EXPECT_NE(r.status().message().find("token 50040 at index 40"), std::string::npos) << r.status();
  EXPECT_NE(r.status().message().find("largest is 50049"), std::string::npos) << r.status();
  EXPECT_NE(r.status().message().find(Path("shards/s1.bin")), std::string::npos) << r.status();
  // The same through data.val_path, and in a headerless file.
  WriteHeaderless("val.bin", {1, 2, 3, 60000, 4});
  v1::JobSpec spec = Spec("shards/s0.bin", 0, 50257);
  spec.mutable_data()->set_val_path("val.bin");
  r = LoadDataset(spec, root_.string(), 2);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("data.val_path file " + Path("val.bin")), std::string::npos)
      << r.status();
  EXPECT_NE(r.status().message().find("token 60000 at index 3"), std::string::npos) << r.status();
  // Byte files too: the first byte >= vocab_size.
  std::ofstream(root_ / "text.txt") << "hello tandem";
  spec = Spec("text.txt", 0, 105);
  spec.mutable_data()->set_format("bytes");
  r = LoadDataset(spec, root_.string(), 4);
  EXPECT_NE(r.status().message().find("token 108 at index 2"), std::string::npos) << r.status();
  EXPECT_NE(r.status().message().find("largest is 116"), std::string::npos) << r.status();
  EXPECT_NE(r.status().message().find("text.txt"), std::string::npos) << r.status();
}

TEST(FindTokenAtLeastTest, FirstIndexOrNone) {
  auto s = MakeByteTokenStream({5, 9, 3, 9, 200});
  EXPECT_EQ(FindTokenAtLeast(*s, 9), 1);
  EXPECT_EQ(FindTokenAtLeast(*s, 10), 4);
  EXPECT_EQ(FindTokenAtLeast(*s, 201), -1);
  EXPECT_EQ(FindTokenAtLeast(*MakeByteTokenStream({}), 0), -1);
  // Across chunks of the scan (65536 tokens) and through a slice.
  std::vector<uint8_t> big(200000, 1);
  big[150001] = 7;
  auto b = MakeByteTokenStream(big);
  EXPECT_EQ(FindTokenAtLeast(*b, 2), 150001);
  EXPECT_EQ(FindTokenAtLeast(*SliceTokenStream(b, 100000, 60000), 2), 50001);
}

// --- tokens32: uint32 token files ---

// Ids over 65535 (up to Llama 3's 128,255, and the largest int32) read back exactly.
TEST_F(TokenFileTest, Tokens32RoundTrip) {
  std::vector<uint32_t> tokens;
  for (uint32_t i = 0; i < 3000; ++i) tokens.push_back((i * 7919u) % 128256u);
  tokens[1234] = 128255;
  tokens[2000] = 65536;
  tokens[2001] = 65535;
  WriteTokens32("a.bin", tokens);
  auto s = MapToken32File(Path("a.bin"));
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ((*s)->size(), 3000);
  std::vector<int32_t> expected(tokens.begin(), tokens.end());
  EXPECT_EQ(ReadAll(**s), expected);
  EXPECT_EQ((*s)->max_token(), 128255);
  std::vector<int32_t> mid(3);
  (*s)->Read(1999, 3, mid.data());
  EXPECT_EQ(mid, (std::vector<int32_t>{expected[1999], 65536, 65535}));

  // llm.c leaves header[3] 0: the same tokens. A count not a multiple of the scan's block
  // (256), and the largest id an int32 holds.
  std::vector<uint32_t> odd = {0, 2147483647u, 1, 200000};
  WriteTokens32("llmc.bin", odd, kToken32FileMagic, kToken32FileVersion, /*width=*/0);
  s = MapToken32File(Path("llmc.bin"));
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(ReadAll(**s), (std::vector<int32_t>{0, 2147483647, 1, 200000}));
  EXPECT_EQ((*s)->max_token(), 2147483647);

  // A header alone is an empty stream.
  WriteTokens32("empty.bin", {});
  s = MapToken32File(Path("empty.bin"));
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ((*s)->size(), 0);
  EXPECT_EQ((*s)->max_token(), -1);

  // Through LoadDataset with a Llama 3 vocabulary.
  auto d = LoadDataset(Spec("a.bin", 0, 128256, "tokens32"), root_.string(), 16);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(ReadAll(*d->train), expected);
}

TEST_F(TokenFileTest, Tokens32HeaderErrorsNameTheFileAndTheFault) {
  const std::vector<uint32_t> ten = {1, 2, 3, 4, 5, 6, 7, 8, 9, 70000};
  WriteRaw("tiny.bin", "ab");
  std::string header_only;  // the magic and 12 more bytes: a header cut short
  PutLe(header_only, kToken32FileMagic, 4);
  PutLe(header_only, kToken32FileVersion, 4);
  PutLe(header_only, 10, 4);
  PutLe(header_only, 4, 4);
  WriteRaw("short_header.bin", header_only);
  WriteTokens32("magic.bin", ten, /*magic=*/12345);
  WriteTokens32("u16_magic.bin", ten, kTokenFileMagic, kTokenFileVersion);
  WriteTokens32("v1.bin", ten, kToken32FileMagic, /*version=*/1);
  WriteTokens32("width2.bin", ten, kToken32FileMagic, kToken32FileVersion, /*width=*/2);
  WriteTokens32("trunc.bin", ten, kToken32FileMagic, kToken32FileVersion, 4, /*count=*/11);
  WriteTokens32("long.bin", ten, kToken32FileMagic, kToken32FileVersion, 4, /*count=*/9);
  WriteTokens32("negative.bin", ten, kToken32FileMagic, kToken32FileVersion, 4,
                /*count=*/0xffffffff);
  std::string ragged;  // a header for 2 tokens and 2.5 tokens' worth of bytes
  PutLe(ragged, kToken32FileMagic, 4);
  PutLe(ragged, kToken32FileVersion, 4);
  PutLe(ragged, 2, 4);
  ragged.resize(kTokenFileHeaderBytes + 10, '\0');
  WriteRaw("ragged.bin", ragged);
  WriteTokens32("huge_id.bin", {1, 2, 0x80000000u, 0xffffffffu});
  struct Case {
    const char* name;
    absl::StatusCode code;
    const char* detail;
  };
  for (const Case& c : {
           Case{"tiny.bin", absl::StatusCode::kDataLoss,
                "truncated uint32 token file header (2 of"},
           Case{"short_header.bin", absl::StatusCode::kDataLoss,
                "truncated uint32 token file header (16 of 1024 bytes)"},
           Case{"magic.bin", absl::StatusCode::kInvalidArgument, "magic 12345, expected 20240801"},
           Case{"u16_magic.bin", absl::StatusCode::kInvalidArgument, "data.format \"tokens\""},
           Case{"v1.bin", absl::StatusCode::kInvalidArgument, "version 1 is not supported"},
           Case{"width2.bin", absl::StatusCode::kInvalidArgument, "tokens of 2 bytes"},
           Case{"trunc.bin", absl::StatusCode::kDataLoss, "11 tokens (1068 bytes)"},
           Case{"long.bin", absl::StatusCode::kDataLoss, "9 tokens"},
           Case{"negative.bin", absl::StatusCode::kDataLoss, "-1 tokens"},
           Case{"ragged.bin", absl::StatusCode::kDataLoss, "the file has 1034 bytes"},
           Case{"huge_id.bin", absl::StatusCode::kInvalidArgument,
                "token 2147483648 at index 2 is above 2147483647"},
       }) {
    auto s = MapToken32File(Path(c.name));
    EXPECT_EQ(s.status().code(), c.code) << c.name << ": " << s.status();
    EXPECT_NE(s.status().message().find(Path(c.name)), std::string::npos) << s.status();
    EXPECT_NE(s.status().message().find(c.detail), std::string::npos) << s.status();
    // Through LoadDataset the error also names the spec field.
    auto d = LoadDataset(Spec(c.name, 0, 128256, "tokens32"), root_.string(), 4);
    EXPECT_EQ(d.status().code(), c.code) << d.status();
    EXPECT_NE(d.status().message().find("data.path '" + std::string(c.name) + "'"),
              std::string::npos)
        << d.status();
  }
  // A tokens32 file read as "tokens" is refused, not read as uint16 garbage.
  WriteTokens32("ok.bin", ten);
  auto as16 = MapTokenFile(Path("ok.bin"));
  EXPECT_EQ(as16.status().code(), absl::StatusCode::kInvalidArgument) << as16.status();
  EXPECT_NE(as16.status().message().find("data.format \"tokens32\""), std::string::npos)
      << as16.status();
  EXPECT_NE(as16.status().message().find(Path("ok.bin")), std::string::npos) << as16.status();
  // And neither is a headerless file, which tokens32 does not read.
  WriteHeaderless("headerless.bin", Ramp(600, 0));
  EXPECT_EQ(MapToken32File(Path("headerless.bin")).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MapToken32File(Path("missing.bin")).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(TokenFileTest, Tokens32OutOfVocabularyNamesFileIndexIdAndVocab) {
  std::vector<uint32_t> tokens(5000, 17);
  tokens[4321] = 128256;  // one past Llama 3's vocabulary
  tokens[4999] = 150000;
  WriteTokens32("shards/t0.bin", std::vector<uint32_t>(100, 128255));
  WriteTokens32("shards/t1.bin", tokens);
  auto r = LoadDataset(Spec("shards/t*.bin", 0, 128256, "tokens32"), root_.string(), 8);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  for (const std::string& part :
       {std::string("model.vocab_size 128256"), "data.path file " + Path("shards/t1.bin"),
        std::string("token 128256 at index 4321"), std::string("largest is 150000")}) {
    EXPECT_NE(r.status().message().find(part), std::string::npos) << part << ": " << r.status();
  }
  // With a vocabulary that holds them all, the shards load.
  auto d = LoadDataset(Spec("shards/t*.bin", 0, 150001, "tokens32"), root_.string(), 8);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->train->size(), 5100);
}

TEST_F(TokenFileTest, Tokens32ShardsAndSplits) {
  auto ramp32 = [](int64_t n, uint32_t first) {
    std::vector<uint32_t> t;
    for (int64_t i = 0; i < n; ++i) t.push_back(first + static_cast<uint32_t>(i));
    return t;
  };
  WriteTokens32("shards/train_001.bin", ramp32(30, 100000));
  WriteTokens32("shards/train_000.bin", ramp32(50, 70000));
  WriteTokens32("shards/train_002.bin", ramp32(20, 0));
  WriteTokens32("shards/val_000.bin", ramp32(40, 120000));
  v1::JobSpec spec = Spec("shards/train_*.bin", 0, 128256, "tokens32");
  auto d = LoadDataset(spec, root_.string(), 8);
  ASSERT_TRUE(d.ok()) << d.status();
  std::vector<int32_t> expected;
  for (uint32_t t : ramp32(50, 70000)) expected.push_back(static_cast<int32_t>(t));
  for (uint32_t t : ramp32(30, 100000)) expected.push_back(static_cast<int32_t>(t));
  for (uint32_t t : ramp32(20, 0)) expected.push_back(static_cast<int32_t>(t));
  EXPECT_EQ(ReadAll(*d->train), expected);
  EXPECT_EQ(d->train->max_token(), 100029);
  // A window across both boundaries.
  std::vector<int32_t> w(40);
  d->train->Read(45, 40, w.data());
  EXPECT_EQ(w, std::vector<int32_t>(expected.begin() + 45, expected.begin() + 85));
  // A validation file.
  spec.mutable_data()->set_val_path("shards/val_000.bin");
  d = LoadDataset(spec, root_.string(), 8);
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_TRUE(d->has_val());
  EXPECT_EQ(d->val->size(), 40);
  EXPECT_EQ(d->val->max_token(), 120039);
  // A held-out fraction: the tail of the last shard.
  spec.mutable_data()->clear_val_path();
  spec.mutable_data()->set_val_fraction(0.1f);
  d = LoadDataset(spec, root_.string(), 8);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->train->size(), 90);
  EXPECT_EQ(ReadAll(*d->val), std::vector<int32_t>(expected.begin() + 90, expected.end()));
  // A "tokens" shard among tokens32 shards is refused by name.
  WriteLlmc("shards/train_003.bin", Ramp(10, 0));
  spec.mutable_data()->set_val_fraction(0);
  auto mixed = LoadDataset(spec, root_.string(), 8);
  EXPECT_EQ(mixed.status().code(), absl::StatusCode::kInvalidArgument) << mixed.status();
  EXPECT_NE(mixed.status().message().find(Path("shards/train_003.bin")), std::string::npos)
      << mixed.status();
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
