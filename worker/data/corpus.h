// Training data: a byte corpus (synthetic or from a file under the worker's data root) and the
// deterministic sampling of training windows from it.
//
// Sampling depends only on (data seed, global sample index), so the first stage (which reads
// the tokens) and the last stage (which reads the targets) agree, whatever the partition and
// however the global batch splits into micro-batches.
// Thread-safety: Corpus and WindowSampler are immutable after construction and safe to share.
#ifndef TANDEM_WORKER_DATA_CORPUS_H_
#define TANDEM_WORKER_DATA_CORPUS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "tandem/v1/spec.pb.h"
#include "worker/model/tensor.h"

namespace tandem::worker {

// Refused above this size (synthetic or file), to keep a spec from exhausting memory.
inline constexpr int64_t kMaxCorpusBytes = int64_t{4} << 30;

class Corpus {
 public:
  explicit Corpus(std::vector<uint8_t> bytes) : bytes_(std::move(bytes)) {}
  const std::vector<uint8_t>& bytes() const { return bytes_; }
  size_t size() const { return bytes_.size(); }

 private:
  std::vector<uint8_t> bytes_;
};

// data.seed, or the job seed when data.seed is 0.
uint64_t DataSeed(const v1::JobSpec& spec);

// `length` bytes from a sparse order-1 Markov chain over 32 printable characters: each
// character has 2-4 successors with random probabilities, all drawn from `seed`. Its entropy
// rate (about 1 nat) is far below ln 256, so a falling loss shows the model learning.
std::vector<uint8_t> GenerateSyntheticCorpus(uint64_t seed, int64_t length);

// Joins `path` (from a job spec) under `data_root`. INVALID_ARGUMENT naming data.path when it
// is empty, absolute or has a '..' component.
absl::StatusOr<std::string> ResolveDataPath(const std::string& data_root, absl::string_view path);

// The corpus a job trains on (spec.data), checked to hold at least `min_bytes` bytes:
// INVALID_ARGUMENT for a bad source/path/size, NOT_FOUND for a missing file.
absl::StatusOr<std::shared_ptr<const Corpus>> LoadCorpus(const v1::JobSpec& spec,
                                                         const std::string& data_root,
                                                         int64_t min_bytes);

// Training windows: sample g starts at MixSeed(stream(seed), g) % (corpus size - context);
// its tokens are the `context` bytes from there and its target the byte after them.
class WindowSampler {
 public:
  // corpus->size() must be > context (LoadCorpus checks it).
  WindowSampler(std::shared_ptr<const Corpus> corpus, uint64_t data_seed, int64_t context);

  // Samples [first, first + count): tokens (count, context) and/or targets (count,); either
  // may be null.
  void Sample(int64_t first, int64_t count, IntTensor* tokens, IntTensor* targets) const;
  int64_t WindowStart(int64_t index) const;

 private:
  std::shared_ptr<const Corpus> corpus_;
  uint64_t stream_seed_;
  int64_t context_;
};

}  // namespace tandem::worker

#endif  // TANDEM_WORKER_DATA_CORPUS_H_
