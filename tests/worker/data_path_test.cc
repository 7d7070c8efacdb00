// Paths from a job spec stay inside their root on the file system: '..', absolute paths and
// symlinks that lead out are refused by the side that opens the file (the worker for
// data.path / data.val_path, the coordinator for init.hf_file), naming the field and the root.
#include "worker/data/data_path.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "common/confined_path.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tandem/v1/spec.pb.h"
#include "worker/data/corpus.h"

namespace tandem::worker {
namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::HasSubstr;

class ConfinedPathTest : public ::testing::Test {
 protected:
  void SetUp() override {
    base_ = fs::temp_directory_path() /
            ("tandem-confine-" + std::to_string(::getpid()) + "-" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(base_);
    root_ = base_ / "root";
    outside_ = base_ / "outside";
    fs::create_directories(root_ / "shards");
    fs::create_directories(outside_);
    Write(root_ / "train.txt", "inside the root, long enough to be a corpus of bytes");
    Write(outside_ / "secret.txt", "outside the root: must never be read by a job");
    Write(root_ / "shards" / "a_000.txt", "shard zero of the training data, inside");
    // Symlinks: one out of the root, one within it, one dangling, a directory out.
    fs::create_symlink(outside_ / "secret.txt", root_ / "escape.txt");
    fs::create_symlink(root_ / "train.txt", root_ / "alias.txt");
    fs::create_symlink(root_ / "nothing-here", root_ / "dangling.txt");
    fs::create_directory_symlink(outside_, root_ / "outdir");
    fs::create_symlink("../../outside/secret.txt", root_ / "shards" / "a_001.txt");
  }
  void TearDown() override { fs::remove_all(base_); }
  static void Write(const fs::path& p, const std::string& text) { std::ofstream(p) << text; }
  std::string Real(const fs::path& p) { return *RealPath(p.string()); }

  fs::path base_, root_, outside_;
};

constexpr char kModels[] = "the coordinator's <data-root>/models";

TEST_F(ConfinedPathTest, InsideTheRootResolvesToTheRealPath) {
  auto p = ResolveConfined(root_.string(), "train.txt", "init.hf_file", kModels);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(*p, Real(root_ / "train.txt"));
  // A symlink that stays inside is fine, and resolves to its target.
  p = ResolveConfined(root_.string(), "alias.txt", "init.hf_file", kModels);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(*p, Real(root_ / "train.txt"));
  // "./" and doubled slashes are harmless.
  p = ResolveConfined(root_.string(), ".//train.txt", "init.hf_file", kModels);
  ASSERT_TRUE(p.ok()) << p.status();
}

TEST_F(ConfinedPathTest, SymlinkOutOfTheRootIsPermissionDenied) {
  for (const char* escape : {"escape.txt", "outdir/secret.txt", "shards/a_001.txt"}) {
    auto p = ResolveConfined(root_.string(), escape, "init.hf_file", kModels);
    ASSERT_FALSE(p.ok()) << escape;
    EXPECT_EQ(p.status().code(), absl::StatusCode::kPermissionDenied) << p.status();
    EXPECT_THAT(std::string(p.status().message()),
                AllOf(HasSubstr("init.hf_file"), HasSubstr(kModels), HasSubstr("outside"),
                      HasSubstr(Real(root_))));
  }
}

TEST_F(ConfinedPathTest, LexicalEscapesAreInvalidArgument) {
  for (const std::string& bad : std::vector<std::string>{
           "../outside/secret.txt", "shards/../../outside/secret.txt", "/etc/passwd",
           (outside_ / "secret.txt").string(), std::string("a\0b", 3), std::string("")}) {
    auto p = ResolveConfined(root_.string(), bad, "init.hf_file", kModels);
    ASSERT_FALSE(p.ok()) << bad;
    EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument) << p.status();
    EXPECT_THAT(std::string(p.status().message()), HasSubstr("init.hf_file: "));
  }
}

TEST_F(ConfinedPathTest, MissingAndDanglingAreNotFound) {
  for (const char* missing : {"no-such-file", "dangling.txt", "nodir/x"}) {
    auto p = ResolveConfined(root_.string(), missing, "init.hf_file", kModels);
    EXPECT_EQ(p.status().code(), absl::StatusCode::kNotFound) << missing << p.status();
  }
  auto p = ResolveConfined((base_ / "no-root").string(), "x", "init.hf_file", kModels);
  EXPECT_EQ(p.status().code(), absl::StatusCode::kFailedPrecondition) << p.status();
}

TEST_F(ConfinedPathTest, IsWithinComparesWholeComponents) {
  EXPECT_TRUE(IsWithin("/data/root", "/data/root"));
  EXPECT_TRUE(IsWithin("/data/root/a", "/data/root"));
  EXPECT_FALSE(IsWithin("/data/rootkit/a", "/data/root"));
  EXPECT_FALSE(IsWithin("/data", "/data/root"));
  EXPECT_TRUE(IsWithin("/anything", "/"));
}

// The worker's side: data.path and data.val_path through ResolveDataFiles and LoadDataset.
TEST_F(ConfinedPathTest, DataFilesRefuseSymlinksOutOfTheDataRoot) {
  auto ok = ResolveDataFiles(root_.string(), "alias.txt", "data.path");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(*ok, std::vector<std::string>{Real(root_ / "train.txt")});
  for (const char* escape : {"escape.txt", "outdir/secret.txt", "outdir/*.txt"}) {
    auto files = ResolveDataFiles(root_.string(), escape, "data.val_path");
    ASSERT_FALSE(files.ok()) << escape;
    EXPECT_EQ(files.status().code(), absl::StatusCode::kPermissionDenied) << files.status();
    EXPECT_THAT(std::string(files.status().message()),
                AllOf(HasSubstr("data.val_path"), HasSubstr("outside the worker's data root"),
                      HasSubstr(Real(root_))));
  }
  // A pattern one of whose matches leads out is refused whole, not trained on in part.
  auto shards = ResolveDataFiles(root_.string(), "shards/a_*.txt", "data.path");
  ASSERT_FALSE(shards.ok());
  EXPECT_EQ(shards.status().code(), absl::StatusCode::kPermissionDenied) << shards.status();
  EXPECT_THAT(std::string(shards.status().message()), HasSubstr("secret.txt"));
  // Dangling: not found.
  auto dangling = ResolveDataFiles(root_.string(), "dangling.txt", "data.path");
  EXPECT_EQ(dangling.status().code(), absl::StatusCode::kNotFound) << dangling.status();
}

TEST_F(ConfinedPathTest, LoadDatasetNeverReadsOutsideTheRoot) {
  v1::JobSpec spec;
  spec.mutable_data()->set_source("file");
  spec.mutable_data()->set_format("bytes");
  spec.mutable_data()->set_val_fraction(0.1f);
  spec.mutable_model()->set_vocab_size(256);
  spec.mutable_data()->set_path("escape.txt");
  auto d = LoadDataset(spec, root_.string(), 4);
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), absl::StatusCode::kPermissionDenied) << d.status();
  EXPECT_THAT(std::string(d.status().message()), HasSubstr("data.path"));
  spec.mutable_data()->set_path("train.txt");
  spec.mutable_data()->set_val_path("outdir/secret.txt");
  d = LoadDataset(spec, root_.string(), 4);
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), absl::StatusCode::kPermissionDenied) << d.status();
  EXPECT_THAT(std::string(d.status().message()), HasSubstr("data.val_path"));
  // A data root given through a symlink is resolved first; files inside it are fine.
  fs::create_directory_symlink(root_, base_ / "root-link");
  spec.clear_data();
  spec.mutable_data()->set_source("file");
  spec.mutable_data()->set_format("bytes");
  spec.mutable_data()->set_val_fraction(0.1f);
  spec.mutable_data()->set_path("train.txt");
  d = LoadDataset(spec, (base_ / "root-link").string(), 4);
  EXPECT_TRUE(d.ok()) << d.status();
}

}  // namespace
}  // namespace tandem::worker
