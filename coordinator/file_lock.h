// An exclusive advisory lock (flock(2)) on a file, held while the FileLock lives and released
// by the kernel when its process dies, however it dies (SIGKILL included): no stale lock to
// clean up after a crash. The coordinator takes one on <data-root>/coordinator.lock so that
// two coordinators never share a data root.
#ifndef TANDEM_COORDINATOR_FILE_LOCK_H_
#define TANDEM_COORDINATOR_FILE_LOCK_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace tandem::coordinator {

class FileLock {
 public:
  // Takes the lock on `path` (created if missing) without waiting, and writes this process's
  // id into the file. FAILED_PRECONDITION naming `what`, the file and the holder's process id
  // when another open file (in this process or another) holds it.
  static absl::StatusOr<std::unique_ptr<FileLock>> Acquire(const std::string& path,
                                                           const std::string& what);
  ~FileLock();
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;

 private:
  explicit FileLock(int fd) : fd_(fd) {}
  const int fd_;
};

}  // namespace tandem::coordinator

#endif  // TANDEM_COORDINATOR_FILE_LOCK_H_
