#include "coordinator/checkpoint_store.h"

#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/format_bytes.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"

namespace tandem::coordinator {
namespace {

namespace fs = std::filesystem;
constexpr char kManifest[] = "manifest.json";

struct FileDigest {
  int64_t bytes = 0;
  uint32_t crc32 = 0;
};

// The size and CRC-32 (zlib's) of a file, read in 1 MiB blocks.
absl::StatusOr<FileDigest> DigestOf(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::DataLossError(absl::StrCat("cannot read ", path.string()));
  FileDigest d;
  uLong crc = crc32(0L, Z_NULL, 0);
  std::vector<char> block(1 << 20);
  while (in) {
    in.read(block.data(), static_cast<std::streamsize>(block.size()));
    const std::streamsize n = in.gcount();
    if (n <= 0) break;
    crc = crc32(crc, reinterpret_cast<const Bytef*>(block.data()), static_cast<uInt>(n));
    d.bytes += n;
  }
  if (in.bad()) return absl::DataLossError(absl::StrCat("error reading ", path.string()));
  d.crc32 = static_cast<uint32_t>(crc);
  return d;
}
constexpr char kFormat[] = "tandem-checkpoint-v1";

std::string StageFile(int stage) { return absl::StrCat("stage-", stage, ".safetensors"); }

// A job id becomes a directory name: only ids the job store issues are accepted.
bool SafeJobId(const std::string& id) {
  return !id.empty() && id.size() < 64 && id.find('/') == std::string::npos && id != "." &&
         id != ".." && id[0] != '.';
}

absl::Status WriteFileAtomically(const fs::path& path, const std::string& text) {
  const std::string tmp = path.string() + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return absl::InternalError(absl::StrCat("cannot create ", tmp));
  const bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()) &&
                  ::fsync(fd) == 0;
  ::close(fd);
  if (!ok || ::rename(tmp.c_str(), path.c_str()) != 0) {
    ::unlink(tmp.c_str());
    return absl::InternalError(absl::StrCat("cannot write ", path.string()));
  }
  int dfd = ::open(path.parent_path().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
  return absl::OkStatus();
}

// A bound on a stage file's safetensors header: the JSON of each tensor's entry (name, dtype,
// shape, offsets) and of the metadata, and the 8-byte length.
int64_t HeaderBound(const std::vector<TensorInfo>& tensors) {
  int64_t bytes = 1024;
  for (const TensorInfo& t : tensors) {
    bytes += 96 + static_cast<int64_t>(t.name.size() + t.dtype.size() + 21 * t.shape.size());
  }
  return bytes;
}

}  // namespace

absl::StatusOr<int64_t> DiskFreeBytes(const std::string& path) {
  // The checkpoints' directory may not exist yet: ask for the nearest ancestor that does.
  fs::path at = path.empty() ? fs::path(".") : fs::path(path);
  std::error_code ec;
  while (!fs::exists(at, ec) && at.has_parent_path() && at.parent_path() != at) {
    at = at.parent_path();
  }
  struct statvfs st {};
  if (::statvfs(at.c_str(), &st) != 0) {
    return absl::InternalError(
        absl::StrCat("cannot ask for the free space of ", at.string(), ": ", std::strerror(errno)));
  }
  return static_cast<int64_t>(st.f_bavail) * static_cast<int64_t>(st.f_frsize);
}

absl::Status SpaceLedger::Promise(const std::string& what, int64_t bytes, int64_t free,
                                  int64_t min_free_bytes) {
  absl::MutexLock lock(&mu_);
  if (free - promised_ - min_free_bytes < bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        what, " needs ", FormatBytes(bytes), " and the disk has ", FormatBytes(free), " free",
        promised_ > 0 ? absl::StrCat(", ", FormatBytes(promised_),
                                     " of it promised to stage files being written")
                      : std::string(),
        ", and keeps ", FormatBytes(min_free_bytes),
        " free for the job store (tandem-coordinator --checkpoint-min-free-mb)"));
  }
  promised_ += bytes;
  return absl::OkStatus();
}

void SpaceLedger::Release(int64_t bytes) {
  absl::MutexLock lock(&mu_);
  promised_ -= bytes;
}

int64_t SpaceLedger::promised() const {
  absl::MutexLock lock(&mu_);
  return promised_;
}

StageFileWriter::StageFileWriter(std::unique_ptr<SafetensorsWriter> file,
                                 std::shared_ptr<SpaceLedger> ledger, int64_t promised)
    : file_(std::move(file)), ledger_(std::move(ledger)), promised_(promised) {}

StageFileWriter::~StageFileWriter() { ledger_->Release(promised_); }

absl::Status StageFileWriter::Append(const void* data, size_t bytes) {
  const int64_t before = file_->written();
  const absl::Status s = file_->Append(data, bytes);
  // What reached the file is off the disk's free space now: no longer promised.
  const int64_t written = std::min(file_->written() - before, promised_);
  ledger_->Release(written);
  promised_ -= written;
  return s;
}

absl::Status StageFileWriter::Commit() { return file_->Commit(); }

absl::StatusOr<absl::Span<const uint8_t>> CheckpointReader::Data(const std::string& name) const {
  auto it = by_name_.find(name);
  if (it == by_name_.end()) {
    return absl::NotFoundError(absl::StrCat("checkpoint ", where_, " has no tensor '", name, "'"));
  }
  return it->second->Data(name);
}

const TensorInfo* CheckpointReader::Find(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : it->second->Find(name);
}

std::vector<const TensorInfo*> CheckpointReader::tensors() const {
  std::vector<const TensorInfo*> out;
  for (const auto& f : files_) {
    for (const TensorInfo& t : f->tensors()) out.push_back(&t);
  }
  return out;
}

CheckpointStore::CheckpointStore(std::string root, CheckpointStoreOptions options)
    : root_(std::move(root)), options_(std::move(options)) {}

absl::Status CheckpointStore::CheckEnabled() const {
  if (enabled()) return absl::OkStatus();
  return absl::FailedPreconditionError(
      "checkpoints need a job store: start tandem-coordinator with --data-root DIR");
}

std::string CheckpointStore::Dir(const std::string& job_id, int64_t step) const {
  return (fs::path(root_) / job_id / absl::StrCat("step-", step)).string();
}

absl::StatusOr<std::unique_ptr<StageFileWriter>> CheckpointStore::BeginStage(
    const std::string& job_id, int64_t step, int stage, std::vector<TensorInfo> tensors) {
  RETURN_IF_ERROR(CheckEnabled());
  if (!SafeJobId(job_id)) return absl::InvalidArgumentError(absl::StrCat("bad job id ", job_id));
  const std::string dir = Dir(job_id, step);
  const std::string path = (fs::path(dir) / StageFile(stage)).string();
  int64_t bytes = HeaderBound(tensors);
  for (const TensorInfo& t : tensors) {
    const int64_t n = t.ByteSize();
    if (n < 0 || n > std::numeric_limits<int64_t>::max() / 2 - bytes) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": tensor '", t.name, "' has an unknown dtype or a bad shape"));
    }
    bytes += n;
  }
  ASSIGN_OR_RETURN(const int64_t free, options_.free_bytes(root_));
  RETURN_IF_ERROR(ledger_->Promise(path, bytes, free, options_.min_free_bytes));
  // From here on the promise is the writer's, or given back with the error.
  auto give_back = [&](absl::Status s) {
    ledger_->Release(bytes);
    return s;
  };
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) {
    return give_back(absl::InternalError(absl::StrCat("cannot create ", dir, ": ", ec.message())));
  }
  absl::StatusOr<std::unique_ptr<SafetensorsWriter>> file =
      SafetensorsWriter::Create(path, std::move(tensors),
                                {{"format", kFormat},
                                 {"job", job_id},
                                 {"step", absl::StrCat(step)},
                                 {"stage", absl::StrCat(stage)}});
  if (!file.ok()) return give_back(file.status());
  return std::make_unique<StageFileWriter>(*std::move(file), ledger_, bytes);
}

absl::Status CheckpointStore::Commit(const std::string& job_id, int64_t step, int num_stages,
                                     int keep) {
  RETURN_IF_ERROR(CheckEnabled());
  const fs::path dir = Dir(job_id, step);
  nlohmann::json manifest = {
      {"format", kFormat}, {"job", job_id}, {"step", step}, {"num_stages", num_stages}};
  for (int s = 0; s < num_stages; ++s) {
    if (!fs::exists(dir / StageFile(s))) {
      return absl::FailedPreconditionError(
          absl::StrCat("checkpoint ", dir.string(), ": ", StageFile(s), " is missing"));
    }
    // Each file's size and CRC-32, verified whenever the checkpoint is opened.
    ASSIGN_OR_RETURN(FileDigest digest, DigestOf(dir / StageFile(s)));
    manifest["files"].push_back(
        {{"name", StageFile(s)}, {"bytes", digest.bytes}, {"crc32", digest.crc32}});
  }
  RETURN_IF_ERROR(WriteFileAtomically(dir / kManifest, manifest.dump(2)));
  // Retention: keep the newest `keep` complete checkpoints; drop torn ones older than this.
  std::vector<int64_t> complete = CompleteSteps(job_id);
  std::error_code ec;
  for (size_t i = 0; i + std::max(keep, 1) < complete.size(); ++i) {
    fs::remove_all(Dir(job_id, complete[i]), ec);
  }
  for (const auto& entry : fs::directory_iterator(fs::path(root_) / job_id, ec)) {
    int64_t n = 0;
    const std::string name = entry.path().filename().string();
    if (name.rfind("step-", 0) == 0 && absl::SimpleAtoi(name.substr(5), &n) && n < step &&
        !fs::exists(entry.path() / kManifest)) {
      fs::remove_all(entry.path(), ec);
    }
  }
  return absl::OkStatus();
}

void CheckpointStore::Discard(const std::string& job_id, int64_t step) {
  if (!enabled() || !SafeJobId(job_id)) return;
  const fs::path dir = Dir(job_id, step);
  std::error_code ec;
  if (!fs::is_directory(dir, ec) || fs::exists(dir / kManifest, ec)) return;
  fs::remove_all(dir, ec);
  if (ec)
    spdlog::warn("cannot remove the incomplete checkpoint {}: {}", dir.string(), ec.message());
}

std::vector<int64_t> CheckpointStore::CompleteSteps(const std::string& job_id) const {
  std::vector<int64_t> steps;
  std::error_code ec;
  if (!enabled() || !SafeJobId(job_id)) return steps;
  for (const auto& entry : fs::directory_iterator(fs::path(root_) / job_id, ec)) {
    int64_t n = 0;
    const std::string name = entry.path().filename().string();
    if (name.rfind("step-", 0) == 0 && absl::SimpleAtoi(name.substr(5), &n) &&
        fs::exists(entry.path() / kManifest)) {
      steps.push_back(n);
    }
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

absl::StatusOr<int64_t> CheckpointStore::Latest(const std::string& job_id) const {
  RETURN_IF_ERROR(CheckEnabled());
  std::vector<int64_t> steps = CompleteSteps(job_id);
  if (steps.empty()) {
    return absl::NotFoundError(absl::StrCat("job ", job_id, " has no complete checkpoint"));
  }
  return steps.back();
}

absl::StatusOr<int64_t> CheckpointStore::LatestReadable(const std::string& job_id) const {
  RETURN_IF_ERROR(CheckEnabled());
  std::vector<int64_t> steps = CompleteSteps(job_id);
  std::string skipped;
  for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
    absl::StatusOr<std::shared_ptr<const CheckpointReader>> r = Open(job_id, *it);
    if (r.ok()) return *it;
    absl::StrAppend(&skipped, skipped.empty() ? "" : "; ", r.status().message());
  }
  return absl::NotFoundError(absl::StrCat("job ", job_id, " has no readable checkpoint",
                                          skipped.empty() ? "" : ": ", skipped));
}

absl::StatusOr<std::shared_ptr<const CheckpointReader>> CheckpointStore::Open(
    const std::string& job_id, int64_t step) const {
  RETURN_IF_ERROR(CheckEnabled());
  if (!SafeJobId(job_id)) return absl::InvalidArgumentError(absl::StrCat("bad job id ", job_id));
  const fs::path dir = Dir(job_id, step);
  std::ifstream in(dir / kManifest);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat("no complete checkpoint of job ", job_id, " after step ", step));
  }
  std::stringstream text;
  text << in.rdbuf();
  auto reader = std::make_shared<CheckpointReader>();
  reader->where_ = absl::StrCat(job_id, " step ", step);
  reader->step_ = step;
  try {
    nlohmann::json manifest = nlohmann::json::parse(text.str());
    if (manifest.at("format") != kFormat || manifest.at("step").get<int64_t>() != step) {
      return absl::DataLossError(absl::StrCat("checkpoint ", dir.string(), ": bad manifest"));
    }
    for (const auto& f : manifest.at("files")) {
      // {"name", "bytes", "crc32"}; a bare name is a checkpoint from before checksums.
      const std::string file =
          f.is_string() ? f.get<std::string>() : f.at("name").get<std::string>();
      if (file.find('/') != std::string::npos) {
        return absl::DataLossError(absl::StrCat("checkpoint ", dir.string(), ": bad file name"));
      }
      if (f.is_object()) {
        ASSIGN_OR_RETURN(FileDigest digest, DigestOf(dir / file));
        if (digest.bytes != f.at("bytes").get<int64_t>() ||
            digest.crc32 != f.at("crc32").get<uint32_t>()) {
          return absl::DataLossError(absl::StrCat(
              "checkpoint ", dir.string(), ": ", file, " does not match its manifest (",
              digest.bytes, " bytes, crc32 ", digest.crc32, "; the manifest says ",
              f.at("bytes").get<int64_t>(), " bytes, crc32 ", f.at("crc32").get<uint32_t>(),
              "): the file is corrupt"));
        }
      }
      ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> st,
                       SafetensorsFile::Open((dir / file).string()));
      for (const TensorInfo& t : st->tensors()) reader->by_name_[t.name] = st.get();
      reader->files_.push_back(std::move(st));
    }
  } catch (const nlohmann::json::exception& e) {
    return absl::DataLossError(
        absl::StrCat("checkpoint ", dir.string(), ": unreadable manifest: ", e.what()));
  }
  return std::shared_ptr<const CheckpointReader>(std::move(reader));
}

}  // namespace tandem::coordinator
