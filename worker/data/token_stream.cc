#include "worker/data/token_stream.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>
#include <mutex>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace tandem::worker {
namespace {

// Little-endian decoders (token files are little-endian whatever the host).
// T is uint16_t or uint32_t; the compiler folds the loop into one load on a little-endian host.
template <typename T>
inline uint32_t LoadLe(const uint8_t* p) {
  uint32_t v = 0;
  for (size_t b = 0; b < sizeof(T); ++b) v |= static_cast<uint32_t>(p[b]) << (8 * b);
  return v;
}
inline int32_t LoadI32(const uint8_t* p) { return static_cast<int32_t>(LoadLe<uint32_t>(p)); }

// The largest of the `count` little-endian T at `p`; 0 for none. Fixed-length blocks, so that
// the compiler vectorises the inner loop at -O2 (one pass over 1 GB runs at about memory
// speed: see "Token data" in docs/architecture.md).
template <typename T>
uint32_t MaxToken(const uint8_t* p, int64_t count) {
  constexpr int64_t kBlock = 256;
  T block[kBlock];
  T m = 0;
  for (int64_t at = 0; at < count; at += kBlock) {
    const int64_t n = std::min(kBlock, count - at);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    std::memcpy(block, p + sizeof(T) * at, sizeof(T) * static_cast<size_t>(n));
#else
    for (int64_t i = 0; i < n; ++i) block[i] = static_cast<T>(LoadLe<T>(p + sizeof(T) * (at + i)));
#endif
    if (n == kBlock) {
      T bm = 0;
      for (int64_t i = 0; i < kBlock; ++i) bm = block[i] > bm ? block[i] : bm;
      m = std::max(m, bm);
    } else {
      for (int64_t i = 0; i < n; ++i) m = std::max(m, block[i]);
    }
  }
  return m;
}

class ByteTokenStream final : public TokenStream {
 public:
  explicit ByteTokenStream(std::vector<uint8_t> bytes) : bytes_(std::move(bytes)) {
    max_ = bytes_.empty() ? -1 : *std::max_element(bytes_.begin(), bytes_.end());
  }
  int64_t size() const override { return static_cast<int64_t>(bytes_.size()); }
  void Read(int64_t start, int64_t count, int32_t* out) const override {
    const uint8_t* p = bytes_.data() + start;
    for (int64_t i = 0; i < count; ++i) out[i] = p[i];
  }
  int32_t max_token() const override { return max_; }

 private:
  std::vector<uint8_t> bytes_;
  int32_t max_;
};

// A read-only mapping of a whole file; unmapped on destruction. Null for an empty file.
class FileMapping {
 public:
  FileMapping() = default;
  FileMapping(void* map, int64_t bytes) : map_(map), bytes_(bytes) {}
  FileMapping(FileMapping&& o) noexcept : map_(o.map_), bytes_(o.bytes_) { o.map_ = nullptr; }
  FileMapping& operator=(FileMapping&&) = delete;
  FileMapping(const FileMapping&) = delete;
  ~FileMapping() {
    if (map_ != nullptr) munmap(map_, static_cast<size_t>(bytes_));
  }
  const uint8_t* data() const { return static_cast<const uint8_t*>(map_); }
  int64_t size() const { return bytes_; }
  void Advise(int advice) const {
    if (map_ != nullptr) madvise(map_, static_cast<size_t>(bytes_), advice);
  }

 private:
  void* map_ = nullptr;
  int64_t bytes_ = 0;
};

// A mapped token file of little-endian T (uint16_t or uint32_t) tokens, starting
// `header_bytes` into the file. Every token must be <= INT32_MAX (MapToken32File checks).
template <typename T>
class MappedTokenFile final : public TokenStream {
 public:
  MappedTokenFile(FileMapping map, int64_t header_bytes, int64_t count)
      : map_(std::move(map)), tokens_(map_.data() + header_bytes), count_(count) {
    // One sequential pass for the maximum; sampling then reads short windows at random.
    map_.Advise(MADV_SEQUENTIAL);
    max_ = count_ == 0 ? -1 : static_cast<int64_t>(MaxToken<T>(tokens_, count_));
    map_.Advise(MADV_RANDOM);
  }

  int64_t size() const override { return count_; }
  void Read(int64_t start, int64_t count, int32_t* out) const override {
    const uint8_t* p = tokens_ + sizeof(T) * start;
    for (int64_t i = 0; i < count; ++i) {
      out[i] = static_cast<int32_t>(LoadLe<T>(p + sizeof(T) * i));
    }
  }
  int32_t max_token() const override { return static_cast<int32_t>(max_); }
  // max_token() before the narrowing: MapToken32File refuses a file where it exceeds INT32_MAX.
  int64_t wide_max() const { return max_; }
  // The index of the first token > `limit`; -1 for none.
  int64_t FindAbove(uint32_t limit) const {
    for (int64_t i = 0; i < count_; ++i) {
      if (LoadLe<T>(tokens_ + sizeof(T) * i) > limit) return i;
    }
    return -1;
  }
  uint32_t At(int64_t i) const { return LoadLe<T>(tokens_ + sizeof(T) * i); }

 private:
  FileMapping map_;
  const uint8_t* tokens_;
  int64_t count_;
  int64_t max_;  // -1 when empty
};

class ConcatTokenStream final : public TokenStream {
 public:
  explicit ConcatTokenStream(std::vector<std::shared_ptr<const TokenStream>> parts)
      : parts_(std::move(parts)) {
    offsets_.reserve(parts_.size() + 1);
    offsets_.push_back(0);
    for (const auto& p : parts_) {
      offsets_.push_back(offsets_.back() + p->size());
      max_ = std::max(max_, p->max_token());
    }
  }
  int64_t size() const override { return offsets_.back(); }
  void Read(int64_t start, int64_t count, int32_t* out) const override {
    // The part holding `start`: the last offset <= start (skipping empty parts).
    size_t i = static_cast<size_t>(std::upper_bound(offsets_.begin(), offsets_.end(), start) -
                                   offsets_.begin()) -
               1;
    while (count > 0) {
      const int64_t local = start - offsets_[i];
      const int64_t n = std::min(count, offsets_[i + 1] - start);
      if (n > 0) parts_[i]->Read(local, n, out);
      out += n;
      start += n;
      count -= n;
      ++i;
    }
  }
  int32_t max_token() const override { return max_; }

 private:
  std::vector<std::shared_ptr<const TokenStream>> parts_;
  std::vector<int64_t> offsets_;  // (parts + 1): part i holds [offsets_[i], offsets_[i + 1])
  int32_t max_ = -1;
};

class SlicedTokenStream final : public TokenStream {
 public:
  SlicedTokenStream(std::shared_ptr<const TokenStream> base, int64_t begin, int64_t count)
      : base_(std::move(base)), begin_(begin), count_(count) {}
  int64_t size() const override { return count_; }
  void Read(int64_t start, int64_t count, int32_t* out) const override {
    base_->Read(begin_ + start, count, out);
  }
  int32_t max_token() const override {
    std::call_once(max_once_, [this] {
      constexpr int64_t kChunk = 1 << 16;
      std::vector<int32_t> buf(static_cast<size_t>(std::min(kChunk, count_)));
      int32_t m = -1;
      for (int64_t at = 0; at < count_; at += kChunk) {
        const int64_t n = std::min(kChunk, count_ - at);
        base_->Read(begin_ + at, n, buf.data());
        m = std::max(m, *std::max_element(buf.begin(), buf.begin() + n));
      }
      max_ = m;
    });
    return max_;
  }

 private:
  std::shared_ptr<const TokenStream> base_;
  int64_t begin_;
  int64_t count_;
  mutable std::once_flag max_once_;
  mutable int32_t max_ = -1;
};

absl::Status OsError(int err, const std::string& path, absl::string_view what) {
  return absl::ErrnoToStatus(err, absl::StrCat(path, ": ", what));
}

// Maps the regular file at `path` read-only (an empty file maps to nothing).
absl::StatusOr<FileMapping> MapFile(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return OsError(errno, path, "cannot open");
  struct stat st;
  if (fstat(fd, &st) != 0) {
    const int err = errno;
    close(fd);
    return OsError(err, path, "cannot stat");
  }
  if (!S_ISREG(st.st_mode)) {
    close(fd);
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a regular file"));
  }
  // off_t is 64-bit here, so the size fits int64_t and size_t.
  static_assert(sizeof(st.st_size) == sizeof(int64_t));
  const int64_t file_bytes = st.st_size;
  if (file_bytes == 0) {
    close(fd);
    return FileMapping();
  }
  void* map = mmap(nullptr, static_cast<size_t>(file_bytes), PROT_READ, MAP_SHARED, fd, 0);
  const int err = errno;
  close(fd);  // the mapping stays valid
  if (map == MAP_FAILED) {
    return OsError(err, path, absl::StrCat("cannot map ", file_bytes, " bytes"));
  }
  return FileMapping(map, file_bytes);
}

// One kind of llm.c token file header.
struct TokenFileLayout {
  int32_t magic;
  int32_t version;
  int32_t token_bytes;
  bool width_field;  // header[3] holds the token width (0 read as token_bytes)
  const char* kind;  // names the layout in errors
};
constexpr TokenFileLayout kUint16Layout{kTokenFileMagic, kTokenFileVersion, 2, false,
                                        "llm.c uint16 token file"};
constexpr TokenFileLayout kUint32Layout{kToken32FileMagic, kToken32FileVersion, kToken32FileWidth,
                                        true, "uint32 token file"};

// Checks the header of `file`, whose header[0] is layout.magic, and returns its token count.
absl::StatusOr<int64_t> ParseHeader(const std::string& path, const FileMapping& file,
                                    const TokenFileLayout& layout) {
  const int64_t file_bytes = file.size();
  if (file_bytes < kTokenFileHeaderBytes) {
    return absl::DataLossError(absl::StrCat(path, ": truncated ", layout.kind, " header (",
                                            file_bytes, " of ", kTokenFileHeaderBytes, " bytes)"));
  }
  const uint8_t* header = file.data();
  const int32_t version = LoadI32(header + 4);
  if (version != layout.version) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", layout.kind, " version ", version,
                                                   " is not supported; expected ", layout.version,
                                                   " (uint", 8 * layout.token_bytes, " tokens)"));
  }
  if (layout.width_field) {
    const int32_t width = LoadI32(header + 12);
    if (width != 0 && width != layout.token_bytes) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": ", layout.kind, " header[3] says tokens of ", width,
                       " bytes; expected ", layout.token_bytes, " (or 0)"));
    }
  }
  const int64_t count = LoadI32(header + 8);
  const int64_t payload = file_bytes - kTokenFileHeaderBytes;
  if (count < 0 || payload != layout.token_bytes * count) {
    return absl::DataLossError(
        absl::StrCat(path, ": ", layout.kind, " header says ", count, " tokens (",
                     kTokenFileHeaderBytes + layout.token_bytes * count,
                     " bytes) but the file has ", file_bytes, " bytes (truncated or corrupt)"));
  }
  return count;
}

}  // namespace

int64_t FindTokenAtLeast(const TokenStream& stream, int64_t limit) {
  constexpr int64_t kChunk = 1 << 16;
  std::vector<int32_t> buf(static_cast<size_t>(std::min(kChunk, stream.size())));
  for (int64_t at = 0; at < stream.size(); at += kChunk) {
    const int64_t n = std::min(kChunk, stream.size() - at);
    stream.Read(at, n, buf.data());
    for (int64_t i = 0; i < n; ++i) {
      if (buf[i] >= limit) return at + i;
    }
  }
  return -1;
}

std::shared_ptr<const TokenStream> MakeByteTokenStream(std::vector<uint8_t> bytes) {
  return std::make_shared<const ByteTokenStream>(std::move(bytes));
}

absl::StatusOr<std::shared_ptr<const TokenStream>> ReadByteFile(const std::string& path,
                                                                int64_t max_bytes) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) return OsError(errno, path, "cannot open");
  const std::streamoff size = in.tellg();
  if (size < 0) return OsError(errno, path, "cannot size");
  if (size > max_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": ", size, " bytes exceeds the in-memory limit of ", max_bytes, " bytes"));
  }
  std::vector<uint8_t> bytes(static_cast<size_t>(size));
  in.seekg(0);
  in.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(size));
  if (in.gcount() != static_cast<std::streamsize>(size)) {
    return absl::DataLossError(
        absl::StrCat(path, ": short read (", in.gcount(), " of ", size, " bytes)"));
  }
  return MakeByteTokenStream(std::move(bytes));
}

absl::StatusOr<std::shared_ptr<const TokenStream>> MapTokenFile(const std::string& path) {
  ASSIGN_OR_RETURN(FileMapping file, MapFile(path));
  const int32_t magic = file.size() >= 4 ? LoadI32(file.data()) : 0;
  if (magic == kTokenFileMagic) {
    ASSIGN_OR_RETURN(const int64_t count, ParseHeader(path, file, kUint16Layout));
    return std::make_shared<const MappedTokenFile<uint16_t>>(std::move(file), kTokenFileHeaderBytes,
                                                             count);
  }
  if (magic == kToken32FileMagic) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": starts with the uint32 token file magic ", kToken32FileMagic,
                     "; read it with data.format \"tokens32\""));
  }
  if (file.size() % 2 != 0) {
    return absl::DataLossError(
        absl::StrCat(path, ": ", file.size(),
                     " bytes is odd; a headerless token file holds uint16 tokens (and it does "
                     "not start with the llm.c magic ",
                     kTokenFileMagic, ")"));
  }
  const int64_t count = file.size() / 2;
  return std::make_shared<const MappedTokenFile<uint16_t>>(std::move(file), 0, count);
}

absl::StatusOr<std::shared_ptr<const TokenStream>> MapToken32File(const std::string& path) {
  ASSIGN_OR_RETURN(FileMapping file, MapFile(path));
  if (file.size() < 4) {
    return absl::DataLossError(absl::StrCat(path, ": truncated uint32 token file header (",
                                            file.size(), " of ", kTokenFileHeaderBytes, " bytes)"));
  }
  const int32_t magic = LoadI32(file.data());
  if (magic != kToken32FileMagic) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": not a uint32 token file: magic ", magic, ", expected ", kToken32FileMagic,
        magic == kTokenFileMagic ? " (this is an llm.c uint16 token file: data.format \"tokens\")"
                                 : ""));
  }
  ASSIGN_OR_RETURN(const int64_t count, ParseHeader(path, file, kUint32Layout));
  auto stream = std::make_shared<const MappedTokenFile<uint32_t>>(std::move(file),
                                                                  kTokenFileHeaderBytes, count);
  // Read() yields int32 ids; no vocabulary (model.vocab_size is an int32) holds a larger one.
  constexpr uint32_t kMaxId = std::numeric_limits<int32_t>::max();
  if (stream->wide_max() > kMaxId) {
    const int64_t at = stream->FindAbove(kMaxId);
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": token ", stream->At(at), " at index ", at, " is above ", kMaxId,
                     ", larger than any model.vocab_size (a corrupt file?)"));
  }
  return stream;
}

std::shared_ptr<const TokenStream> ConcatTokenStreams(
    std::vector<std::shared_ptr<const TokenStream>> parts) {
  if (parts.size() == 1) return std::move(parts.front());
  return std::make_shared<const ConcatTokenStream>(std::move(parts));
}

std::shared_ptr<const TokenStream> SliceTokenStream(std::shared_ptr<const TokenStream> base,
                                                    int64_t begin, int64_t count) {
  if (begin == 0 && count == base->size()) return base;
  return std::make_shared<const SlicedTokenStream>(std::move(base), begin, count);
}

}  // namespace tandem::worker
