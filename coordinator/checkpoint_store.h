// Checkpoints kept by the coordinator under <data-root>/checkpoints/<job>/step-<N>/: one
// safetensors file per stage (stage-<s>.safetensors, tensors keyed by global names, so any
// partition can read them) and manifest.json, written last, with each file's size and CRC-32
// (verified on every Open: DATA_LOSS names a corrupt file). A checkpoint exists only once its
// manifest does: a torn one (a stage file or the manifest missing) is never read, and is
// removed when the next checkpoint of the job commits.
//
// Thread-safe: stage files of one checkpoint may be written concurrently; commits and reads
// of different checkpoints do not interfere.
#ifndef TANDEM_COORDINATOR_CHECKPOINT_STORE_H_
#define TANDEM_COORDINATOR_CHECKPOINT_STORE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "common/safetensors.h"

namespace tandem::coordinator {

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
  explicit CheckpointStore(std::string root);

  bool enabled() const { return !root_.empty(); }

  // Starts the file of `stage` of the checkpoint (job, step).
  absl::StatusOr<std::unique_ptr<SafetensorsWriter>> BeginStage(const std::string& job_id,
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

 private:
  absl::Status CheckEnabled() const;

  const std::string root_;
};

}  // namespace tandem::coordinator

#endif  // TANDEM_COORDINATOR_CHECKPOINT_STORE_H_
