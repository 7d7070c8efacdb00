#include "worker/data/corpus.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <filesystem>
#include <limits>
#include <system_error>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/model/random.h"

namespace tandem::worker {
namespace {

constexpr char kAlphabet[] = "abcdefghijklmnopqrstuvwxyz .,;!?";
constexpr int kAlphabetSize = 32;
static_assert(sizeof(kAlphabet) - 1 == kAlphabetSize);

// Independent streams derived from the data seed.
constexpr uint64_t kChainStream = 1;
constexpr uint64_t kTextStream = 2;
constexpr uint64_t kSampleStream = 3;

}  // namespace

uint64_t DataSeed(const v1::JobSpec& spec) {
  return spec.data().seed() != 0 ? spec.data().seed() : spec.seed();
}

std::vector<uint8_t> GenerateSyntheticCorpus(uint64_t seed, int64_t length) {
  // Transition table: for each previous character, 2-4 successors and cumulative weights. An
  // order-1 chain is learnable in a few dozen steps by a small model (an order-2 table of
  // random successors is a 1024-way conjunction that a small MLP needs thousands of steps for).
  struct Row {
    int n = 0;
    std::array<int, 4> next{};
    std::array<double, 4> cumulative{};
  };
  std::vector<Row> table(kAlphabetSize);
  Rng chain(MixSeed(seed, kChainStream));
  for (Row& row : table) {
    row.n = 2 + static_cast<int>(chain.Below(3));
    double total = 0.0;
    for (int i = 0; i < row.n; ++i) {
      int c;
      bool fresh;
      do {  // distinct successors
        c = static_cast<int>(chain.Below(kAlphabetSize));
        fresh = true;
        for (int j = 0; j < i; ++j) fresh = fresh && row.next[j] != c;
      } while (!fresh);
      row.next[i] = c;
      total += 0.1 + chain.Uniform();
      row.cumulative[i] = total;
    }
    for (int i = 0; i < row.n; ++i) row.cumulative[i] /= total;
  }
  std::vector<uint8_t> out(static_cast<size_t>(std::max<int64_t>(length, 0)));
  Rng text(MixSeed(seed, kTextStream));
  int b = static_cast<int>(text.Below(kAlphabetSize));
  for (uint8_t& byte : out) {
    const Row& row = table[b];
    const double u = text.Uniform();
    int i = 0;
    while (i < row.n - 1 && u >= row.cumulative[i]) ++i;
    const int c = row.next[i];
    byte = static_cast<uint8_t>(kAlphabet[c]);
    b = c;
  }
  return out;
}

namespace {

// Prefixes a file error with the spec field and path it came from, keeping its code.
absl::Status InField(const absl::Status& s, absl::string_view field, absl::string_view path) {
  return WithPrefix(s, absl::StrCat(field, " '", path, "'"));
}

// Every token of `stream` (one file, or the synthetic corpus: `where`) must be < vocab_size.
// max_token() was computed when the stream was made (one vectorised pass); only a stream that
// fails is read again, to name the first culprit.
absl::Status CheckVocab(const v1::JobSpec& spec, const TokenStream& stream,
                        absl::string_view where) {
  const int32_t vocab = spec.model().vocab_size();
  if (stream.max_token() < vocab) return absl::OkStatus();
  const int64_t at = FindTokenAtLeast(stream, vocab);
  int32_t id = stream.max_token();
  if (at >= 0) stream.Read(at, 1, &id);
  return absl::InvalidArgumentError(
      absl::StrCat("model.vocab_size ", vocab, " is too small for the data: ", where,
                   " holds token ", id, " at index ", at,
                   " (token ids must be < vocab_size; its largest is ", stream.max_token(), ")"));
}

// The files `path` (spec field `field`) names, read as `format` and concatenated. Each
// file's tokens must be < model.vocab_size; `memory_budget` is what in-memory (bytes) files
// may still use, and is reduced by what they take.
absl::StatusOr<std::shared_ptr<const TokenStream>> LoadFiles(
    const v1::JobSpec& spec, const std::string& data_root, absl::string_view path,
    absl::string_view field, int64_t* memory_budget, std::vector<std::string>* files) {
  ASSIGN_OR_RETURN(*files, ResolveDataFiles(data_root, path, field));
  const std::string& format = spec.data().format();
  const bool bytes = format == "bytes";
  std::vector<std::shared_ptr<const TokenStream>> parts;
  int64_t total = 0;
  for (const std::string& file : *files) {
    absl::StatusOr<std::shared_ptr<const TokenStream>> part =
        bytes                  ? ReadByteFile(file, *memory_budget)
        : format == "tokens32" ? MapToken32File(file)
                               : MapTokenFile(file);
    if (!part.ok()) {
      if (bytes && part.status().code() == absl::StatusCode::kInvalidArgument) {
        return InField(absl::InvalidArgumentError(absl::StrCat(
                           part.status().message(), " (", kMaxCorpusBytes,
                           " bytes in all; use data.format 'tokens' for larger data)")),
                       field, path);
      }
      return InField(part.status(), field, path);
    }
    if (bytes) *memory_budget -= (*part)->size();
    if ((*part)->size() > std::numeric_limits<int64_t>::max() - total) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, " '", path, "': more tokens than an int64 can count"));
    }
    total += (*part)->size();
    RETURN_IF_ERROR(CheckVocab(spec, **part, absl::StrCat(field, " file ", file)));
    parts.push_back(*std::move(part));
  }
  return ConcatTokenStreams(std::move(parts));
}

absl::Status CheckLength(const TokenStream& stream, int64_t window, absl::string_view what) {
  if (stream.size() < window) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", stream.size(),
                                                   " tokens is too short; need at least ", window,
                                                   " (one training window)"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Dataset> LoadDataset(const v1::JobSpec& spec, const std::string& data_root,
                                    int64_t window) {
  const v1::DataSpec& data = spec.data();
  if (window < 1) {
    return absl::InvalidArgumentError(absl::StrCat("window must be positive, got ", window));
  }
  const float fraction = data.val_fraction();
  if (!(fraction >= 0.0f && fraction < 1.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("data.val_fraction must be in [0, 1), got ", fraction));
  }
  Dataset out;
  std::shared_ptr<const TokenStream> stream;
  int64_t memory_budget = kMaxCorpusBytes;
  std::string train_what;  // names the training data in errors
  if (data.source() == "synthetic") {
    if (!data.val_path().empty()) {
      return absl::InvalidArgumentError(
          "data.val_path applies to data.source 'file' only; the synthetic source holds out "
          "data.val_fraction");
    }
    if (data.synthetic_bytes() < window || data.synthetic_bytes() > kMaxCorpusBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("data.synthetic_bytes must be in [", window, ", ", kMaxCorpusBytes,
                       "] (at least one training window), got ", data.synthetic_bytes()));
    }
    stream = MakeByteTokenStream(GenerateSyntheticCorpus(DataSeed(spec), data.synthetic_bytes()));
    RETURN_IF_ERROR(CheckVocab(spec, *stream, "the synthetic corpus"));
    train_what = absl::StrCat("data.synthetic_bytes ", data.synthetic_bytes());
  } else if (data.source() == "file") {
    if (data.format() != "bytes" && data.format() != "tokens" && data.format() != "tokens32") {
      return absl::InvalidArgumentError(
          absl::StrCat("data.format '", data.format(),
                       "' is not supported; expected bytes, tokens or tokens32"));
    }
    std::vector<std::string> train_files;
    ASSIGN_OR_RETURN(
        stream, LoadFiles(spec, data_root, data.path(), "data.path", &memory_budget, &train_files));
    train_what = absl::StrCat("data.path '", data.path(), "'");
    if (!data.val_path().empty()) {
      std::vector<std::string> val_files;
      ASSIGN_OR_RETURN(
          std::shared_ptr<const TokenStream> val,
          LoadFiles(spec, data_root, data.val_path(), "data.val_path", &memory_budget, &val_files));
      // Validation must never be trained on.
      for (const std::string& v : val_files) {
        for (const std::string& t : train_files) {
          std::error_code ec;
          if (std::filesystem::equivalent(v, t, ec)) {
            return absl::InvalidArgumentError(
                absl::StrCat("data.val_path '", data.val_path(), "': ", v,
                             " is also a training file of data.path '", data.path(), "'"));
          }
        }
      }
      RETURN_IF_ERROR(CheckLength(*stream, window, train_what));
      RETURN_IF_ERROR(
          CheckLength(*val, window, absl::StrCat("data.val_path '", data.val_path(), "'")));
      out.train = std::move(stream);
      out.val = std::move(val);
      return out;
    }
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "data.source '", data.source(), "' is not supported; expected synthetic or file"));
  }

  RETURN_IF_ERROR(CheckLength(*stream, window, train_what));
  const int64_t n = stream->size();
  if (fraction == 0.0f) {
    out.train = std::move(stream);
    return out;
  }
  const int64_t held_out = std::max(
      window,
      static_cast<int64_t>(std::floor(static_cast<double>(fraction) * static_cast<double>(n))));
  if (n - held_out < window) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data.val_fraction ", fraction, " of ", train_what, " (", n, " tokens) holds out ",
        held_out, " tokens and leaves ", n - held_out, " for training; each split needs at least ",
        window, " tokens (one window), so the data needs at least ", 2 * window,
        " tokens (or set data.val_fraction 0 or data.val_path)"));
  }
  out.train = SliceTokenStream(stream, 0, n - held_out);
  out.val = SliceTokenStream(std::move(stream), n - held_out, held_out);
  return out;
}

WindowSampler::WindowSampler(std::shared_ptr<const TokenStream> stream, uint64_t data_seed,
                             int64_t window)
    : stream_(std::move(stream)),
      stream_seed_(MixSeed(data_seed, kSampleStream)),
      window_(window) {}

int64_t WindowSampler::WindowStart(int64_t index) const {
  const uint64_t starts = static_cast<uint64_t>(stream_->size() - window_ + 1);
  return static_cast<int64_t>(MixSeed(stream_seed_, static_cast<uint64_t>(index)) % starts);
}

void WindowSampler::Sample(int64_t first, int64_t count, int32_t* out) const {
  for (int64_t i = 0; i < count; ++i) {
    stream_->Read(WindowStart(first + i), window_, out + i * window_);
  }
}

}  // namespace tandem::worker
