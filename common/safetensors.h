// Reading and writing safetensors files (https://github.com/huggingface/safetensors format):
// an 8-byte little-endian header length N, N bytes of JSON mapping each tensor name to
// {"dtype", "shape", "data_offsets": [begin, end]} (offsets into the data section) plus an
// optional "__metadata__" map of strings, then the data section.
//
// SafetensorsWriter streams the data in the declared tensor order, so a tensor never has to
// be held whole in memory; it writes to "<path>.tmp", and Commit() fsyncs and renames it into
// place, so a reader never sees a partial file under the final name.
#ifndef TANDEM_COMMON_SAFETENSORS_H_
#define TANDEM_COMMON_SAFETENSORS_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace tandem {

struct TensorInfo {
  std::string name;
  std::string dtype;  // "F32", "F16", "BF16", "I64", "I32", "U8", ...
  std::vector<int64_t> shape;

  // Bytes of the tensor's data; -1 for an unknown dtype, a negative dimension or a size past
  // int64.
  int64_t ByteSize() const;
};

// Bytes per element of a safetensors dtype name; 0 if unknown.
size_t DtypeSize(const std::string& dtype);

class SafetensorsWriter {
 public:
  // Starts "<path>.tmp" with the header for `tensors` (in this order). INVALID_ARGUMENT for
  // duplicate names, unknown dtypes or negative dimensions.
  static absl::StatusOr<std::unique_ptr<SafetensorsWriter>> Create(
      const std::string& path, std::vector<TensorInfo> tensors,
      const std::map<std::string, std::string>& metadata = {});
  ~SafetensorsWriter();  // removes the temp file unless committed

  // Appends the next bytes of the data section (tensors back to back, in order).
  // OUT_OF_RANGE past the declared total.
  absl::Status Append(const void* data, size_t bytes);
  // FAILED_PRECONDITION unless exactly the declared bytes were appended; then fsync, rename
  // to `path`, fsync the directory.
  absl::Status Commit();

  int64_t data_bytes() const { return total_; }
  int64_t written() const { return written_; }

 private:
  SafetensorsWriter() = default;
  std::string path_;
  std::string tmp_;
  int fd_ = -1;
  int64_t total_ = 0;
  int64_t written_ = 0;
  bool committed_ = false;
};

// A read-only, memory-mapped safetensors file.
class SafetensorsFile {
 public:
  // DATA_LOSS naming the file for a truncated or malformed file (header length, JSON, offsets
  // that overlap, leave holes or run past the end, sizes that disagree with dtype and shape).
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);
  ~SafetensorsFile();

  // Tensors in data order.
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const TensorInfo* Find(const std::string& name) const;
  // NOT_FOUND naming the tensor and the file.
  absl::StatusOr<absl::Span<const uint8_t>> Data(const std::string& name) const;
  const std::string& path() const { return path_; }

 private:
  SafetensorsFile() = default;
  std::string path_;
  const uint8_t* map_ = nullptr;
  size_t map_size_ = 0;
  size_t data_start_ = 0;
  std::vector<TensorInfo> tensors_;
  std::vector<std::pair<int64_t, int64_t>> offsets_;  // parallel to tensors_
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace tandem

#endif  // TANDEM_COMMON_SAFETENSORS_H_
