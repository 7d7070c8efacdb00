#include "worker/data/corpus.h"

#include <array>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
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

absl::StatusOr<std::string> ResolveDataPath(const std::string& data_root, absl::string_view path) {
  if (path.empty()) {
    return absl::InvalidArgumentError("data.path is required when data.source is 'file'");
  }
  if (path.front() == '/') {
    return absl::InvalidArgumentError(absl::StrCat(
        "data.path '", path, "' must be relative to the worker's data root, not absolute"));
  }
  for (absl::string_view part : absl::StrSplit(path, '/')) {
    if (part == "..") {
      return absl::InvalidArgumentError(absl::StrCat(
          "data.path '", path, "' must stay inside the worker's data root ('..' is not allowed)"));
    }
  }
  return (std::filesystem::path(data_root.empty() ? "." : data_root) / std::string(path)).string();
}

absl::StatusOr<std::shared_ptr<const Corpus>> LoadCorpus(const v1::JobSpec& spec,
                                                         const std::string& data_root,
                                                         int64_t min_bytes) {
  const v1::DataSpec& data = spec.data();
  std::vector<uint8_t> bytes;
  if (data.source() == "synthetic") {
    if (data.synthetic_bytes() < min_bytes || data.synthetic_bytes() > kMaxCorpusBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("data.synthetic_bytes must be in [", min_bytes, ", ", kMaxCorpusBytes,
                       "] (at least context + 1), got ", data.synthetic_bytes()));
    }
    bytes = GenerateSyntheticCorpus(DataSeed(spec), data.synthetic_bytes());
  } else if (data.source() == "file") {
    absl::StatusOr<std::string> full = ResolveDataPath(data_root, data.path());
    if (!full.ok()) return full.status();
    std::error_code ec;
    const bool regular = std::filesystem::is_regular_file(*full, ec);
    if (!regular) {
      if (!std::filesystem::exists(*full, ec)) {
        return absl::NotFoundError(absl::StrCat("data.path '", data.path(), "': ", *full,
                                                " does not exist under the worker's data root"));
      }
      return absl::InvalidArgumentError(
          absl::StrCat("data.path '", data.path(), "': ", *full, " is not a regular file"));
    }
    const auto size = std::filesystem::file_size(*full, ec);
    if (ec || static_cast<int64_t>(size) > kMaxCorpusBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("data.path '", data.path(), "': cannot use ", *full,
                       ec ? absl::StrCat(": ", ec.message())
                          : absl::StrCat(" (larger than ", kMaxCorpusBytes, " bytes)")));
    }
    std::ifstream in(*full, std::ios::binary);
    if (!in) {
      return absl::PermissionDeniedError(absl::StrCat("data.path '", data.path(), "': cannot open ",
                                                      *full, ": ", std::strerror(errno)));
    }
    bytes.resize(size);
    in.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(size));
    if (in.gcount() != static_cast<std::streamsize>(size)) {
      return absl::DataLossError(
          absl::StrCat("data.path '", data.path(), "': short read from ", *full));
    }
    if (static_cast<int64_t>(bytes.size()) < min_bytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("data.path '", data.path(), "': ", bytes.size(),
                       " bytes is too short; need at least ", min_bytes, " (context + 1)"));
    }
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "data.source '", data.source(), "' is not supported; expected synthetic or file"));
  }
  return std::make_shared<const Corpus>(std::move(bytes));
}

WindowSampler::WindowSampler(std::shared_ptr<const Corpus> corpus, uint64_t data_seed,
                             int64_t context)
    : corpus_(std::move(corpus)),
      stream_seed_(MixSeed(data_seed, kSampleStream)),
      context_(context) {}

int64_t WindowSampler::WindowStart(int64_t index) const {
  const uint64_t range = corpus_->size() - static_cast<uint64_t>(context_);
  return static_cast<int64_t>(MixSeed(stream_seed_, static_cast<uint64_t>(index)) % range);
}

void WindowSampler::Sample(int64_t first, int64_t count, IntTensor* tokens,
                           IntTensor* targets) const {
  if (tokens != nullptr) tokens->Reset({count, context_});
  if (targets != nullptr) targets->Reset({count});
  const uint8_t* bytes = corpus_->bytes().data();
  for (int64_t i = 0; i < count; ++i) {
    const int64_t start = WindowStart(first + i);
    if (tokens != nullptr) {
      int32_t* row = tokens->data() + i * context_;
      for (int64_t k = 0; k < context_; ++k) row[k] = bytes[start + k];
    }
    if (targets != nullptr) (*targets)[i] = bytes[start + context_];
  }
}

}  // namespace tandem::worker
