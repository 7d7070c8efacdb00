// The checkpoint store: torn checkpoints, retention, checksums.
#include "coordinator/checkpoint_store.h"

#include <atomic>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem::coordinator {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;

// Writes a one-tensor stage file of checkpoint (job, step).
void WriteStage(CheckpointStore& store, const std::string& job, int64_t step, int stage) {
  float x = static_cast<float>(step * 10 + stage);
  auto w = store.BeginStage(job, step, stage, {{absl::StrCat("t", stage), "F32", {1}}});
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_TRUE((*w)->Append(&x, sizeof(x)).ok());
  ASSERT_TRUE((*w)->Commit().ok());
}

TEST(CheckpointStoreTest, ATornCheckpointIsNeverLoadedAndRetentionKeepsTheNewest) {
  char dir_template[] = "/tmp/tandem-ckpt-XXXXXX";
  const std::string dir = mkdtemp(dir_template);
  CheckpointStore store(dir);
  EXPECT_EQ(store.Latest("job-1").status().code(), absl::StatusCode::kNotFound);
  WriteStage(store, "job-1", 3, 0);
  WriteStage(store, "job-1", 3, 1);
  ASSERT_TRUE(store.Commit("job-1", 3, 2, /*keep=*/2).ok());
  // Step 7: stage 1 never arrives, so the checkpoint cannot commit and stays invisible.
  WriteStage(store, "job-1", 7, 0);
  EXPECT_EQ(store.Commit("job-1", 7, 2, 2).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(*store.Latest("job-1"), 3);
  EXPECT_EQ(store.Open("job-1", 7).status().code(), absl::StatusCode::kNotFound);
  auto reader = store.Open("job-1", 3);
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ((*reader)->num_stages(), 2);
  auto t1 = (*reader)->Data("t1");
  ASSERT_TRUE(t1.ok());
  EXPECT_EQ(*reinterpret_cast<const float*>(t1->data()), 31.0f);
  EXPECT_EQ((*reader)->Data("t9").status().code(), absl::StatusCode::kNotFound);
  // Two more complete checkpoints: keep=2 drops step 3 and the torn step 7.
  for (int64_t step : {11, 15}) {
    WriteStage(store, "job-1", step, 0);
    WriteStage(store, "job-1", step, 1);
    ASSERT_TRUE(store.Commit("job-1", step, 2, 2).ok());
  }
  EXPECT_EQ(*store.Latest("job-1"), 15);
  EXPECT_FALSE(std::filesystem::exists(dir + "/job-1/step-3"));
  EXPECT_FALSE(std::filesystem::exists(dir + "/job-1/step-7"));
  EXPECT_TRUE(store.Open("job-1", 11).ok());
  // Without a root, checkpoints are refused with a reason.
  CheckpointStore none("");
  EXPECT_EQ(none.Latest("job-1").status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(store.Open("../etc", 1).status().code(), absl::StatusCode::kInvalidArgument);
  std::filesystem::remove_all(dir);
}

// Discard removes what an incomplete checkpoint wrote (its space back at once, where Commit
// would drop it only at the next complete checkpoint) and never a complete one.
TEST(CheckpointStoreTest, DiscardRemovesAnIncompleteCheckpointAndKeepsACompleteOne) {
  char dir_template[] = "/tmp/tandem-ckpt-XXXXXX";
  const std::string dir = mkdtemp(dir_template);
  CheckpointStore store(dir);
  WriteStage(store, "job-1", 3, 0);
  WriteStage(store, "job-1", 3, 1);
  ASSERT_TRUE(store.Commit("job-1", 3, 2, /*keep=*/2).ok());
  WriteStage(store, "job-1", 7, 0);  // stage 1 never stored
  store.Discard("job-1", 7);
  EXPECT_FALSE(std::filesystem::exists(store.Dir("job-1", 7)));
  store.Discard("job-1", 3);
  store.Discard("job-1", 9);                // nothing there
  store.Discard("../etc", 1);               // not a job's
  CheckpointStore("").Discard("job-1", 3);  // disabled
  EXPECT_EQ(store.CompleteSteps("job-1"), (std::vector<int64_t>{3}));
  EXPECT_TRUE(store.Open("job-1", 3).ok());
  std::filesystem::remove_all(dir);
}

// The disk a checkpoint is written to, as the store sees it: `capacity` bytes less what the
// files under the store's root take.
struct FakeDisk {
  int64_t capacity = 0;
  std::atomic<int> asked{0};
  absl::StatusOr<int64_t> Free(const std::string& root) {
    ++asked;
    int64_t used = 0;
    for (const auto& e : std::filesystem::recursive_directory_iterator(root)) {
      if (e.is_regular_file()) used += static_cast<int64_t>(e.file_size());
    }
    return capacity - used;
  }
};

// A stage file is begun only when the disk has room for all of it beyond what is promised to
// the other files being written and the job store's share; what it writes, or drops, is given
// back. A refusal writes nothing and says what was needed, free and promised.
TEST(CheckpointStoreTest, AStageFileThatDoesNotFitIsRefusedBeforeAnyOfItIsWritten) {
  char dir_template[] = "/tmp/tandem-ckpt-XXXXXX";
  const std::string dir = mkdtemp(dir_template);
  FakeDisk disk{.capacity = int64_t{5} << 20};
  CheckpointStore store(dir,
                        {.min_free_bytes = int64_t{2} << 20,
                         .free_bytes = [&](const std::string& root) { return disk.Free(root); }});
  const std::vector<TensorInfo> two_mib = {{"w", "F32", {512, 1024}}};  // 2 MiB of data
  auto first = store.BeginStage("job-1", 5, 0, two_mib);
  ASSERT_TRUE(first.ok()) << first.status();
  // 5 MiB free, 2 MiB and its header promised to stage 0, 2 MiB kept: stage 1's 2 MiB and
  // header do not fit, though the disk has them free now.
  auto second = store.BeginStage("job-1", 5, 1, two_mib);
  ASSERT_EQ(second.status().code(), absl::StatusCode::kResourceExhausted) << second.status();
  EXPECT_THAT(second.status().message(), HasSubstr("stage-1.safetensors needs 2.0 MiB"));
  EXPECT_THAT(second.status().message(),
              HasSubstr(" and the disk has 5.0 MiB free, 2.0 MiB of it promised"));
  EXPECT_THAT(second.status().message(), HasSubstr("of it promised to stage files being written"));
  EXPECT_THAT(second.status().message(), HasSubstr("keeps 2.0 MiB free for the job store"));
  EXPECT_THAT(second.status().message(), HasSubstr("--checkpoint-min-free-mb"));
  EXPECT_FALSE(std::filesystem::exists(dir + "/job-1/step-5/stage-1.safetensors.tmp"));
  // Stage 0's written half is off the disk's free space and no longer promised (the promise
  // left is the other half and the header's bound).
  std::vector<float> half(256 * 1024, 1.0f);
  ASSERT_TRUE((*first)->Append(half.data(), half.size() * sizeof(float)).ok());
  EXPECT_LT(store.promised_bytes(), (int64_t{1} << 20) + 4096);
  EXPECT_GT(store.promised_bytes(), int64_t{1} << 20);
  ASSERT_TRUE((*first)->Append(half.data(), half.size() * sizeof(float)).ok());
  ASSERT_TRUE((*first)->Commit().ok());
  first->reset();
  EXPECT_EQ(store.promised_bytes(), 0);
  // With stage 0 on the disk (about 3 MiB free) stage 1 still does not fit beside the 2 MiB
  // kept; where the job store is given no share it does.
  EXPECT_EQ(store.BeginStage("job-1", 5, 1, two_mib).status().code(),
            absl::StatusCode::kResourceExhausted);
  CheckpointStore roomier(
      dir, {.min_free_bytes = 0, .free_bytes = [&](const std::string& r) { return disk.Free(r); }});
  auto again = roomier.BeginStage("job-1", 5, 1, two_mib);
  ASSERT_TRUE(again.ok()) << again.status();
  // Dropped unwritten: its promise and its temporary file go with it.
  again->reset();
  EXPECT_EQ(roomier.promised_bytes(), 0);
  EXPECT_FALSE(std::filesystem::exists(dir + "/job-1/step-5/stage-1.safetensors.tmp"));
  // A bad index is refused as such, whatever the disk.
  EXPECT_EQ(roomier.BeginStage("job-1", 5, 1, {{"w", "F32", {1 << 30, 1 << 30, 1 << 30}}})
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(roomier.promised_bytes(), 0);
  std::filesystem::remove_all(dir);
}

// The real disk's free space, asked where the checkpoints' directory does not exist yet.
TEST(CheckpointStoreTest, DiskFreeBytesAsksTheNearestDirectoryThatExists) {
  char dir_template[] = "/tmp/tandem-ckpt-XXXXXX";
  const std::string dir = mkdtemp(dir_template);
  absl::StatusOr<int64_t> here = DiskFreeBytes(dir);
  ASSERT_TRUE(here.ok()) << here.status();
  EXPECT_GT(*here, 0);
  absl::StatusOr<int64_t> below = DiskFreeBytes(dir + "/checkpoints/job-1/step-3");
  ASSERT_TRUE(below.ok()) << below.status();
  EXPECT_GT(*below, 0);
  std::filesystem::remove_all(dir);
}

// Every stage file's size and CRC-32 are in the manifest and verified on open: a corrupt
// file is DATA_LOSS naming it, and LatestReadable falls back to the newest intact checkpoint.
// A crash between the stage files and the manifest leaves the previous checkpoint the one
// loaded.
TEST(CheckpointStoreTest, ChecksumsCatchACorruptFileAndACrashBeforeTheManifestKeepsThePrevious) {
  char dir_template[] = "/tmp/tandem-ckpt-XXXXXX";
  const std::string dir = mkdtemp(dir_template);
  CheckpointStore store(dir);
  for (int64_t step : {3, 7}) {
    WriteStage(store, "job-1", step, 0);
    WriteStage(store, "job-1", step, 1);
    ASSERT_TRUE(store.Commit("job-1", step, 2, /*keep=*/3).ok());
  }
  // The crash: step 11's files are written, its manifest never is.
  WriteStage(store, "job-1", 11, 0);
  WriteStage(store, "job-1", 11, 1);
  EXPECT_EQ(*store.Latest("job-1"), 7);
  EXPECT_EQ(*store.LatestReadable("job-1"), 7);
  // Flip one byte of step 7's stage 1 (its tensor data, at the end of the file).
  const std::string victim = dir + "/job-1/step-7/stage-1.safetensors";
  {
    std::fstream f(victim, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(-1, std::ios::end);
    char c = 0;
    f.read(&c, 1);
    c = static_cast<char>(c ^ 0x5a);
    f.seekp(-1, std::ios::end);
    f.write(&c, 1);
  }
  auto opened = store.Open("job-1", 7);
  EXPECT_EQ(opened.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(opened.status().message(),
              HasSubstr("stage-1.safetensors does not match its manifest"));
  EXPECT_EQ(*store.LatestReadable("job-1"), 3);
  std::filesystem::resize_file(dir + "/job-1/step-3/stage-0.safetensors", 8);
  EXPECT_EQ(store.LatestReadable("job-1").status().code(), absl::StatusCode::kNotFound);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace tandem::coordinator
