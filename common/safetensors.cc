#include "common/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"

namespace tandem {
namespace {

constexpr uint64_t kMaxHeaderBytes = 100 << 20;

absl::Status Errno(absl::string_view what, const std::string& path) {
  return absl::InternalError(absl::StrCat(what, " ", path, ": ", std::strerror(errno)));
}

absl::Status WriteAll(int fd, const void* data, size_t bytes, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    ssize_t n = ::write(fd, p, bytes);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Errno("cannot write", path);
    }
    p += n;
    bytes -= static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

}  // namespace

size_t DtypeSize(const std::string& dtype) {
  static const std::map<std::string, size_t> kSizes = {
      {"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"I64", 8}, {"I32", 4}, {"I16", 2},
      {"I8", 1},  {"U64", 8}, {"U32", 4}, {"U16", 2},  {"U8", 1},  {"BOOL", 1}};
  auto it = kSizes.find(dtype);
  return it == kSizes.end() ? 0 : it->second;
}

int64_t TensorInfo::ByteSize() const {
  const size_t elem = DtypeSize(dtype);
  if (elem == 0) return -1;
  int64_t n = static_cast<int64_t>(elem);
  for (int64_t d : shape) {
    // A shape read from a file or the network may be any size: overflow is a bad shape too.
    if (d < 0 || (d > 0 && n > std::numeric_limits<int64_t>::max() / d)) return -1;
    n *= d;
  }
  return n;
}

absl::StatusOr<std::unique_ptr<SafetensorsWriter>> SafetensorsWriter::Create(
    const std::string& path, std::vector<TensorInfo> tensors,
    const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::set<std::string> seen;
  int64_t offset = 0;
  for (const TensorInfo& t : tensors) {
    if (t.name.empty() || t.name == "__metadata__" || !seen.insert(t.name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("safetensors ", path, ": bad or duplicate tensor name '", t.name, "'"));
    }
    const int64_t bytes = t.ByteSize();
    if (bytes < 0) {
      return absl::InvalidArgumentError(absl::StrCat("safetensors ", path, ": tensor ", t.name,
                                                     ": bad dtype '", t.dtype, "' or shape"));
    }
    header[t.name] = {
        {"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string json = header.dump();
  // Pad with spaces so the data section starts 8-byte aligned.
  json.append((8 - json.size() % 8) % 8, ' ');

  std::unique_ptr<SafetensorsWriter> w(new SafetensorsWriter());
  w->path_ = path;
  w->tmp_ = path + ".tmp";
  w->total_ = offset;
  w->fd_ = ::open(w->tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (w->fd_ < 0) return Errno("cannot create", w->tmp_);
  uint8_t len[8];
  const uint64_t n = json.size();
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(n >> (8 * i));
  RETURN_IF_ERROR(WriteAll(w->fd_, len, 8, w->tmp_));
  RETURN_IF_ERROR(WriteAll(w->fd_, json.data(), json.size(), w->tmp_));
  return w;
}

SafetensorsWriter::~SafetensorsWriter() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_ && !tmp_.empty()) ::unlink(tmp_.c_str());
}

absl::Status SafetensorsWriter::Append(const void* data, size_t bytes) {
  if (committed_ || fd_ < 0) return absl::FailedPreconditionError("safetensors: writer is closed");
  if (written_ + static_cast<int64_t>(bytes) > total_) {
    return absl::OutOfRangeError(absl::StrCat("safetensors ", path_, ": ", written_ + bytes,
                                              " bytes appended, but the header declares ", total_));
  }
  RETURN_IF_ERROR(WriteAll(fd_, data, bytes, tmp_));
  written_ += static_cast<int64_t>(bytes);
  return absl::OkStatus();
}

absl::Status SafetensorsWriter::Commit() {
  if (committed_ || fd_ < 0) return absl::FailedPreconditionError("safetensors: writer is closed");
  if (written_ != total_) {
    return absl::FailedPreconditionError(
        absl::StrCat("safetensors ", path_, ": ", written_, " of ", total_, " data bytes written"));
  }
  if (::fsync(fd_) != 0) return Errno("cannot fsync", tmp_);
  if (::close(fd_) != 0) {
    fd_ = -1;
    return Errno("cannot close", tmp_);
  }
  fd_ = -1;
  if (::rename(tmp_.c_str(), path_.c_str()) != 0) return Errno("cannot rename to", path_);
  committed_ = true;
  const std::string dir = std::filesystem::path(path_).parent_path().string();
  int dfd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->path_ = path;
  auto corrupt = [&](absl::string_view why) {
    return absl::DataLossError(absl::StrCat("safetensors ", path, ": ", why));
  };
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return absl::NotFoundError(absl::StrCat("no file ", path));
    return Errno("cannot open", path);
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    return Errno("cannot stat", path);
  }
  f->map_size_ = static_cast<size_t>(st.st_size);
  if (f->map_size_ < 8) {
    ::close(fd);
    return corrupt("shorter than its 8-byte header length");
  }
  void* m = ::mmap(nullptr, f->map_size_, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (m == MAP_FAILED) return Errno("cannot map", path);
  f->map_ = static_cast<const uint8_t*>(m);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(f->map_[i]) << (8 * i);
  if (n > kMaxHeaderBytes || n > f->map_size_ - 8) {
    return corrupt(absl::StrCat("header length ", n, " does not fit the file"));
  }
  f->data_start_ = 8 + n;
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(f->map_ + 8, f->map_ + 8 + n);
  } catch (const nlohmann::json::exception& e) {
    return corrupt(absl::StrCat("header is not JSON: ", e.what()));
  }
  if (!header.is_object()) return corrupt("header is not a JSON object");
  const int64_t data_size = static_cast<int64_t>(f->map_size_ - f->data_start_);
  std::vector<std::pair<std::pair<int64_t, int64_t>, TensorInfo>> entries;
  try {
    for (auto& [name, v] : header.items()) {
      if (name == "__metadata__") {
        for (auto& [k, val] : v.items()) f->metadata_[k] = val.get<std::string>();
        continue;
      }
      TensorInfo t;
      t.name = name;
      t.dtype = v.at("dtype").get<std::string>();
      t.shape = v.at("shape").get<std::vector<int64_t>>();
      auto off = v.at("data_offsets").get<std::vector<int64_t>>();
      if (off.size() != 2 || off[0] < 0 || off[1] < off[0] || off[1] > data_size) {
        return corrupt(absl::StrCat("tensor ", name, ": data_offsets outside the data section"));
      }
      if (t.ByteSize() != off[1] - off[0]) {
        return corrupt(absl::StrCat("tensor ", name, ": ", off[1] - off[0],
                                    " bytes disagree with dtype ", t.dtype, " and its shape"));
      }
      entries.push_back({{off[0], off[1]}, std::move(t)});
    }
  } catch (const nlohmann::json::exception& e) {
    return corrupt(absl::StrCat("bad header entry: ", e.what()));
  }
  std::sort(entries.begin(), entries.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  int64_t expect = 0;
  for (auto& [off, t] : entries) {
    if (off.first != expect) {
      return corrupt(absl::StrCat("tensor ", t.name, " starts at ", off.first, ", expected ",
                                  expect, " (overlap or hole)"));
    }
    expect = off.second;
    f->index_[t.name] = f->tensors_.size();
    f->offsets_.push_back(off);
    f->tensors_.push_back(std::move(t));
  }
  if (expect != data_size) {
    return corrupt(absl::StrCat("data section is ", data_size, " bytes, tensors cover ", expect));
  }
  return f;
}

SafetensorsFile::~SafetensorsFile() {
  if (map_ != nullptr) ::munmap(const_cast<uint8_t*>(map_), map_size_);
}

const TensorInfo* SafetensorsFile::Find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

absl::StatusOr<absl::Span<const uint8_t>> SafetensorsFile::Data(const std::string& name) const {
  auto it = index_.find(name);
  if (it == index_.end()) {
    return absl::NotFoundError(absl::StrCat("no tensor '", name, "' in ", path_));
  }
  const auto& off = offsets_[it->second];
  return absl::Span<const uint8_t>(map_ + data_start_ + off.first,
                                   static_cast<size_t>(off.second - off.first));
}

}  // namespace tandem
