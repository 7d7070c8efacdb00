// Checkpoints kept by the coordinator under <data-root>/checkpoints/<job>/step-<N>/: one
// safetensors file per stage (stage-<s>.safetensors, tensors keyed by global names, so any
// partition can read them) and manifest.json, written last, with each file's size and CRC-32
// (verified on every Open: DATA_LOSS names a corrupt file). A checkpoint exists only once its
// manifest does: a torn one (a stage file or the manifest missing) is never read, and is
// removed when the next checkpoint of the job commits.
//
// A stage file is begun only when the disk has room for all of it: its bytes are promised to it
// until it is written (or dropped), so stage files begun together cannot each count the same
// free space, and the disk keeps `min_free_bytes` free beyond them for the job store's database
// (<data-root>/coordinator.db, on the same disk). A checkpoint that does not fit is refused
// before any of it is written, instead of filling the disk until a write fails.
//
// Thread-safe: stage files of one checkpoint may be written concurrently; commits and reads
// of different checkpoints do not interfere.
#ifndef TANDEM_COORDINATOR_CHECKPOINT_STORE_H_
#define TANDEM_COORDINATOR_CHECKPOINT_STORE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "common/safetensors.h"

namespace tandem::coordinator {

// The bytes an unprivileged writer may still put on the filesystem holding `path` (statvfs's
// f_bavail blocks); INTERNAL naming the path if it cannot be asked.
absl::StatusOr<int64_t> DiskFreeBytes(const std::string& path);

struct CheckpointStoreOptions {
  // Kept free beyond every stage file being written (the job store's database shares the disk).
  int64_t min_free_bytes = int64_t{64} << 20;
  // The free bytes of the filesystem holding the checkpoints (DiskFreeBytes; tests give another).
  std::function<absl::StatusOr<int64_t>(const std::string& root)> free_bytes = DiskFreeBytes;
};

// The disk space promised to the stage files being written; shared by the store and its writers.
class SpaceLedger {
 public:
  // Promises `bytes` if the disk has them free beyond what is already promised and
  // `min_free_bytes`; else RESOURCE_EXHAUSTED saying how much is free and promised.
  absl::Status Promise(const std::string& what, int64_t bytes, int64_t free,
                       int64_t min_free_bytes);
  // Returns promised bytes that are now written (they are off the free space) or never will be.
  void Release(int64_t bytes);
  int64_t promised() const;

 private:
  mutable absl::Mutex mu_;
  int64_t promised_ ABSL_GUARDED_BY(mu_) = 0;
};

// One stage file of a checkpoint being written (SafetensorsWriter's calls), holding the disk
// space promised to what it has still to write; dropping it uncommitted removes the file.
class StageFileWriter {
 public:
  StageFileWriter(std::unique_ptr<SafetensorsWriter> file, std::shared_ptr<SpaceLedger> ledger,
                  int64_t promised);
  ~StageFileWriter();
  StageFileWriter(const StageFileWriter&) = delete;
  StageFileWriter& operator=(const StageFileWriter&) = delete;

  // As SafetensorsWriter's.
  absl::Status Append(const void* data, size_t bytes);
  absl::Status Commit();
  int64_t data_bytes() const { return file_->data_bytes(); }
  int64_t written() const { return file_->written(); }

 private:
  std::unique_ptr<SafetensorsWriter> file_;
  std::shared_ptr<SpaceLedger> ledger_;
  int64_t promised_;  // still held: what the file has yet to write
};

// A complete checkpoint opened for reading: every stage file mapped, tensors found by name.
class CheckpointReader {
 public:
  // NOT_FOUND naming the tensor and the checkpoint.
  absl::StatusOr<absl::Span<const uint8_t>> Data(const std::string& name) const;
  const TensorInfo* Find(const std::string& name) const;
  // Every tensor of the checkpoint, stage by stage in data order.
  std::vector<const TensorInfo*> tensors() const;
  int num_stages() const { return static_cast<int>(files_.size()); }
  int64_t step() const { return step_; }

 private:
  friend class CheckpointStore;
  std::string where_;
  int64_t step_ = -1;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const SafetensorsFile*> by_name_;
};

class CheckpointStore {
 public:
  // `root` is <data-root>/checkpoints; empty disables checkpoints (every call then fails
  // with FAILED_PRECONDITION saying the coordinator runs without --data-root).
  explicit CheckpointStore(std::string root, CheckpointStoreOptions options = {});

  bool enabled() const { return !root_.empty(); }

  // Starts the file of `stage` of the checkpoint (job, step). RESOURCE_EXHAUSTED, before
  // anything is written, when the disk lacks the file's bytes beyond those promised to the
  // other files being written and `min_free_bytes`; INVALID_ARGUMENT for a bad index; INTERNAL
  // when the directory or file cannot be created.
  absl::StatusOr<std::unique_ptr<StageFileWriter>> BeginStage(const std::string& job_id,
                                                              int64_t step, int stage,
                                                              std::vector<TensorInfo> tensors);
  // Commits the checkpoint (every stage file must be in place): writes the manifest
  // atomically, then deletes the job's older checkpoints beyond `keep` and any torn ones.
  absl::Status Commit(const std::string& job_id, int64_t step, int num_stages, int keep);
  // Removes what a checkpoint that could not be completed left of (job, step), its stage files,
  // so that a full disk gets their space back at once (Commit drops such leftovers only when
  // a later checkpoint completes). A complete checkpoint (one with its manifest) is kept.
  void Discard(const std::string& job_id, int64_t step);
  // The latest complete checkpoint's step; NOT_FOUND if the job has none.
  absl::StatusOr<int64_t> Latest(const std::string& job_id) const;
  // The latest complete checkpoint whose files match their manifest's sizes and checksums
  // (each is opened and verified, newest first); NOT_FOUND naming what was skipped.
  absl::StatusOr<int64_t> LatestReadable(const std::string& job_id) const;
  absl::StatusOr<std::shared_ptr<const CheckpointReader>> Open(const std::string& job_id,
                                                               int64_t step) const;
  // The directory of checkpoint (job, step).
  std::string Dir(const std::string& job_id, int64_t step) const;
  // The steps of the job's complete checkpoints (those with a manifest), ascending; none when
  // disabled.
  std::vector<int64_t> CompleteSteps(const std::string& job_id) const;
  // The bytes promised to the stage files being written, not yet written.
  int64_t promised_bytes() const { return ledger_->promised(); }

 private:
  absl::Status CheckEnabled() const;

  const std::string root_;
  const CheckpointStoreOptions options_;
  const std::shared_ptr<SpaceLedger> ledger_ = std::make_shared<SpaceLedger>();
};

}  // namespace tandem::coordinator

#endif  // TANDEM_COORDINATOR_CHECKPOINT_STORE_H_
