#include "common/safetensors.h"

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <numeric>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

using ::testing::HasSubstr;

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char t[] = "/tmp/tandem-st-XXXXXX";
    dir_ = mkdtemp(t);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string dir_;
};

TEST_F(SafetensorsTest, RoundTripIsBitwiseAndStreamed) {
  const std::string path = dir_ + "/a.safetensors";
  std::vector<float> w(6);
  std::iota(w.begin(), w.end(), -2.5f);
  w[3] = -0.0f;
  std::vector<int64_t> step = {42};
  auto writer = SafetensorsWriter::Create(
      path, {{"w", "F32", {2, 3}}, {"step", "I64", {1}}, {"empty", "F32", {0}}},
      {{"format", "pt"}});
  ASSERT_TRUE(writer.ok()) << writer.status();
  // Streamed in pieces that cross tensor boundaries.
  const auto* wb = reinterpret_cast<const uint8_t*>(w.data());
  ASSERT_TRUE((*writer)->Append(wb, 10).ok());
  ASSERT_TRUE((*writer)->Append(wb + 10, 14).ok());
  EXPECT_FALSE(std::filesystem::exists(path));  // only the temp file exists until Commit
  EXPECT_EQ((*writer)->Commit().code(), absl::StatusCode::kFailedPrecondition);  // 8 missing
  ASSERT_TRUE((*writer)->Append(step.data(), 8).ok());
  EXPECT_EQ((*writer)->Append(step.data(), 1).code(), absl::StatusCode::kOutOfRange);
  ASSERT_TRUE((*writer)->Commit().ok());
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));

  auto file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  ASSERT_EQ((*file)->tensors().size(), 3u);
  EXPECT_EQ((*file)->metadata().at("format"), "pt");
  const TensorInfo* info = (*file)->Find("w");
  ASSERT_NE(info, nullptr);
  EXPECT_EQ(info->shape, (std::vector<int64_t>{2, 3}));
  auto data = (*file)->Data("w");
  ASSERT_TRUE(data.ok());
  ASSERT_EQ(data->size(), 24u);
  EXPECT_EQ(std::memcmp(data->data(), w.data(), 24), 0);
  auto s = (*file)->Data("step");
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(*reinterpret_cast<const int64_t*>(s->data()), 42);
  EXPECT_EQ((*file)->Data("nope").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(SafetensorsTest, UncommittedWriterLeavesNothing) {
  const std::string path = dir_ + "/b.safetensors";
  {
    auto writer = SafetensorsWriter::Create(path, {{"x", "F32", {4}}});
    ASSERT_TRUE(writer.ok());
    float x[2] = {1, 2};
    ASSERT_TRUE((*writer)->Append(x, sizeof(x)).ok());
  }
  EXPECT_FALSE(std::filesystem::exists(path));
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  EXPECT_EQ(SafetensorsFile::Open(path).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(SafetensorsTest, BadDeclarationsAreRefused) {
  EXPECT_EQ(SafetensorsWriter::Create(dir_ + "/c", {{"x", "F32", {1}}, {"x", "F32", {1}}})
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SafetensorsWriter::Create(dir_ + "/c", {{"x", "Q7", {1}}}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SafetensorsWriter::Create(dir_ + "/c", {{"x", "F32", {-1}}}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

void WriteRaw(const std::string& path, const std::string& header, size_t data_bytes) {
  std::ofstream out(path, std::ios::binary);
  uint64_t n = header.size();
  out.write(reinterpret_cast<const char*>(&n), 8);
  out << header << std::string(data_bytes, '\0');
}

TEST_F(SafetensorsTest, CorruptFilesAreDataLossNamingTheProblem) {
  const std::string p = dir_ + "/bad.safetensors";
  WriteRaw(p, R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 4);
  auto r = SafetensorsFile::Open(p);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("data_offsets"));

  WriteRaw(p,
           R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
           R"("y":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
           12);
  r = SafetensorsFile::Open(p);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("hole"));

  WriteRaw(p, R"({"x":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8);
  EXPECT_THAT(std::string(SafetensorsFile::Open(p).status().message()), HasSubstr("disagree"));

  WriteRaw(p, "{not json", 0);
  EXPECT_EQ(SafetensorsFile::Open(p).status().code(), absl::StatusCode::kDataLoss);

  {
    std::ofstream out(p, std::ios::binary);
    out << "abc";
  }
  EXPECT_EQ(SafetensorsFile::Open(p).status().code(), absl::StatusCode::kDataLoss);
  {
    std::ofstream out(p, std::ios::binary);
    uint64_t n = 1000;
    out.write(reinterpret_cast<const char*>(&n), 8);
  }
  EXPECT_THAT(std::string(SafetensorsFile::Open(p).status().message()), HasSubstr("does not fit"));
}

// The Python safetensors package reads what we write (skipped where it is not installed).
TEST_F(SafetensorsTest, PythonSafetensorsReadsOurFiles) {
  if (std::system("python3 -c 'import safetensors, numpy' >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "python3 with safetensors and numpy is not installed";
  }
  const std::string path = dir_ + "/py.safetensors";
  std::vector<float> w = {1.5f, -2.0f, 3.25f, 0.0f};
  auto writer = SafetensorsWriter::Create(path, {{"layer.weight", "F32", {2, 2}}});
  ASSERT_TRUE(writer.ok());
  ASSERT_TRUE((*writer)->Append(w.data(), 16).ok());
  ASSERT_TRUE((*writer)->Commit().ok());
  const std::string cmd =
      "python3 -c \"from safetensors.numpy import load_file; t = load_file('" + path +
      "')['layer.weight']; assert t.shape == (2, 2) and t.dtype.name == 'float32' and "
      "t[1, 0] == 3.25, t\"";
  EXPECT_EQ(std::system(cmd.c_str()), 0);
}

}  // namespace
}  // namespace tandem
