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

namespace tandem::worker {
namespace {

// Little-endian decoders (token files are little-endian whatever the host).
inline int32_t LoadU16(const uint8_t* p) { return static_cast<int32_t>(p[0] | (p[1] << 8)); }
inline int32_t LoadI32(const uint8_t* p) {
  return static_cast<int32_t>(static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) |
                              (static_cast<uint32_t>(p[2]) << 16) |
                              (static_cast<uint32_t>(p[3]) << 24));
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

// A read-only mapping of a uint16 token file; `tokens_` points past any header.
class MappedTokenFile final : public TokenStream {
 public:
  MappedTokenFile(void* map, size_t map_bytes, const uint8_t* tokens, int64_t count)
      : map_(map), map_bytes_(map_bytes), tokens_(tokens), count_(count) {
    // One sequential pass for the maximum; sampling then reads short windows at random.
    if (map_ != nullptr) madvise(map_, map_bytes_, MADV_SEQUENTIAL);
    int32_t m = -1;
    for (int64_t i = 0; i < count_; ++i) m = std::max(m, LoadU16(tokens_ + 2 * i));
    max_ = m;
    if (map_ != nullptr) madvise(map_, map_bytes_, MADV_RANDOM);
  }
  ~MappedTokenFile() override {
    if (map_ != nullptr) munmap(map_, map_bytes_);
  }
  MappedTokenFile(const MappedTokenFile&) = delete;
  MappedTokenFile& operator=(const MappedTokenFile&) = delete;

  int64_t size() const override { return count_; }
  void Read(int64_t start, int64_t count, int32_t* out) const override {
    const uint8_t* p = tokens_ + 2 * start;
    for (int64_t i = 0; i < count; ++i) out[i] = LoadU16(p + 2 * i);
  }
  int32_t max_token() const override { return max_; }

 private:
  void* map_;  // null for an empty file
  size_t map_bytes_;
  const uint8_t* tokens_;
  int64_t count_;
  int32_t max_;
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

}  // namespace

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
  void* map = nullptr;
  if (file_bytes > 0) {
    map = mmap(nullptr, static_cast<size_t>(file_bytes), PROT_READ, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) {
      const int err = errno;
      close(fd);
      return OsError(err, path, absl::StrCat("cannot map ", file_bytes, " bytes"));
    }
  }
  close(fd);  // the mapping stays valid
  const auto* bytes = static_cast<const uint8_t*>(map);
  auto fail = [&](absl::Status s) {
    if (map != nullptr) munmap(map, static_cast<size_t>(file_bytes));
    return s;
  };

  if (file_bytes >= 4 && LoadI32(bytes) == kTokenFileMagic) {
    if (file_bytes < kTokenFileHeaderBytes) {
      return fail(
          absl::DataLossError(absl::StrCat(path, ": truncated llm.c token file header (",
                                           file_bytes, " of ", kTokenFileHeaderBytes, " bytes)")));
    }
    const int32_t version = LoadI32(bytes + 4);
    if (version != kTokenFileVersion) {
      return fail(absl::InvalidArgumentError(absl::StrCat(path, ": llm.c token file version ",
                                                          version, " is not supported; expected ",
                                                          kTokenFileVersion, " (uint16 tokens)")));
    }
    const int64_t count = LoadI32(bytes + 8);
    const int64_t payload = file_bytes - kTokenFileHeaderBytes;
    if (count < 0 || payload != 2 * count) {
      return fail(absl::DataLossError(absl::StrCat(
          path, ": llm.c header says ", count, " tokens (", kTokenFileHeaderBytes + 2 * count,
          " bytes) but the file has ", file_bytes, " bytes (truncated or corrupt)")));
    }
    return std::make_shared<const MappedTokenFile>(map, static_cast<size_t>(file_bytes),
                                                   bytes + kTokenFileHeaderBytes, count);
  }
  if (file_bytes % 2 != 0) {
    return fail(absl::DataLossError(
        absl::StrCat(path, ": ", file_bytes,
                     " bytes is odd; a headerless token file holds uint16 tokens (and it does "
                     "not start with the llm.c magic ",
                     kTokenFileMagic, ")")));
  }
  return std::make_shared<const MappedTokenFile>(map, static_cast<size_t>(file_bytes), bytes,
                                                 file_bytes / 2);
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
