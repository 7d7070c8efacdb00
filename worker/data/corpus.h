// Training data: the dataset a job trains and validates on (synthetic, or files under the
// worker's data root as bytes, uint16 or uint32 tokens, one file or shards) and the deterministic
// sampling of windows from it.
//
// Sampling depends only on (data seed, global sample index), so the first stage (which reads
// the inputs) and the last stage (which reads the targets) agree, whatever the partition and
// however the global batch splits into micro-batches.
// Thread-safety: Dataset streams and WindowSampler are immutable after construction and safe
// to share across threads.
#ifndef TANDEM_WORKER_DATA_CORPUS_H_
#define TANDEM_WORKER_DATA_CORPUS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "tandem/v1/spec.pb.h"
#include "worker/data/data_path.h"
#include "worker/data/token_stream.h"
#include "worker/model/tensor.h"

namespace tandem::worker {

// In-memory corpora (synthetic, format "bytes") are refused above this many bytes in total,
// to keep a spec from exhausting memory. Token files are memory-mapped and not limited.
inline constexpr int64_t kMaxCorpusBytes = int64_t{4} << 30;

// data.seed, or the job seed when data.seed is 0.
uint64_t DataSeed(const v1::JobSpec& spec);

// `length` bytes from a sparse order-1 Markov chain over 32 printable characters: each
// character has 2-4 successors with random probabilities, all drawn from `seed`. Its entropy
// rate (about 1 nat) is far below ln 256, so a falling loss shows the model learning.
std::vector<uint8_t> GenerateSyntheticCorpus(uint64_t seed, int64_t length);

// A job's data, split into a training and a validation stream that never overlap.
struct Dataset {
  std::shared_ptr<const TokenStream> train;  // never null after LoadDataset
  // Null when the spec holds nothing out (val_fraction 0 and no val_path): a validation
  // request must then be refused.
  std::shared_ptr<const TokenStream> val;

  bool has_val() const { return val != nullptr; }
};

// Loads spec.data. `window` = tokens per sample (context + 1 for mlp_lm, seq_len + 1 for
// gpt). Sources:
//   synthetic: GenerateSyntheticCorpus(DataSeed(spec), data.synthetic_bytes) (data.format is
//     not consulted; data.val_path is refused).
//   file: data.path (a file or a shard pattern, see data_path.h) read as data.format:
//     "bytes" (in memory, kMaxCorpusBytes in total), "tokens" (memory-mapped uint16 files,
//     see MapTokenFile) or "tokens32" (memory-mapped uint32 files, see MapToken32File); shards
//     concatenate in name order.
// Split: with data.val_path, val is those files (as data.format; they may not be training
// files too). Otherwise val is the last max(window, floor(val_fraction * n)) tokens of the n
// training tokens and train the rest (views, no copy); val_fraction 0 leaves val null.
// Errors (INVALID_ARGUMENT unless said otherwise): a bad source, format or val_fraction
// (outside [0, 1)); a split shorter than `window` (naming data.path, data.val_path,
// data.val_fraction or data.synthetic_bytes, with the sizes); a token >= model.vocab_size
// (naming the file, the first such token's index in it, its id and vocab_size: checked once
// per file at load, from the maximum its stream computed); path errors of ResolveDataFiles
// (NOT_FOUND for no file); file errors of ReadByteFile / MapTokenFile / MapToken32File
// (DATA_LOSS for a truncated or corrupt token file, INVALID_ARGUMENT for a wrong magic or
// version).
absl::StatusOr<Dataset> LoadDataset(const v1::JobSpec& spec, const std::string& data_root,
                                    int64_t window);

// Windows of `window` consecutive tokens: sample g starts at
// MixSeed(stream(data_seed), g) % (stream size - window + 1), the same on every worker.
class WindowSampler {
 public:
  // Requires stream->size() >= window >= 1 (LoadDataset checks it for both splits).
  WindowSampler(std::shared_ptr<const TokenStream> stream, uint64_t data_seed, int64_t window);

  // Fills out (count, window) with the windows of samples first .. first + count - 1.
  void Sample(int64_t first, int64_t count, int32_t* out) const;
  // Where sample `index` starts in the stream.
  int64_t WindowStart(int64_t index) const;
  int64_t window() const { return window_; }
  const TokenStream& stream() const { return *stream_; }

 private:
  std::shared_ptr<const TokenStream> stream_;
  uint64_t stream_seed_;
  int64_t window_;
};

}  // namespace tandem::worker

#endif  // TANDEM_WORKER_DATA_CORPUS_H_
