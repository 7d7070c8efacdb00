#include "coordinator/file_lock.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace tandem::coordinator {

absl::StatusOr<std::unique_ptr<FileLock>> FileLock::Acquire(const std::string& path,
                                                            const std::string& what) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot open the lock file ", path, ": ", std::strerror(errno)));
  }
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    char buf[32] = {};
    const ssize_t n = ::pread(fd, buf, sizeof(buf) - 1, 0);
    ::close(fd);
    if (err == EWOULDBLOCK) {
      const std::string holder =
          n > 0 ? std::string(absl::StripAsciiWhitespace(std::string(buf, n))) : "";
      return absl::FailedPreconditionError(
          absl::StrCat(what, " is in use by another coordinator (", path, " is locked",
                       holder.empty() ? "" : absl::StrCat(" by process ", holder),
                       "): two coordinators must not share a data root"));
    }
    return absl::FailedPreconditionError(
        absl::StrCat("cannot lock ", path, ": ", std::strerror(err)));
  }
  // Who holds it, for the message above; the lock, not the text, is what counts.
  const std::string pid = absl::StrCat(::getpid(), "\n");
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, pid.data(), pid.size(), 0) < 0) {
    // Not fatal: the lock is held all the same.
  }
  return std::unique_ptr<FileLock>(new FileLock(fd));
}

FileLock::~FileLock() { ::close(fd_); }

}  // namespace tandem::coordinator
