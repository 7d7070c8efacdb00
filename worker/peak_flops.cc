#include "worker/peak_flops.h"

#include <cblas.h>
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace tandem::worker {
namespace {

// An exclusive flock on a file, taken with a bounded wait and released on destruction.
class HostLock {
 public:
  // On failure, `why` says what went wrong and the lock is not held.
  HostLock(const std::string& path, absl::Duration wait) {
    if (path.empty()) {
      why_ = "no lock file";
      return;
    }
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (fd_ < 0) {
      why_ = absl::StrCat("cannot open ", path, ": ", std::strerror(errno));
      return;
    }
    const absl::Time deadline = absl::Now() + wait;
    // Poll with LOCK_NB: flock has no timeout of its own. Each measurement holds the lock well
    // under a second, so a 5 ms poll costs nothing; the count bounds it as well as the time.
    const int64_t max_polls = absl::ToInt64Milliseconds(wait) / 5 + 1;
    for (int64_t i = 0; i < max_polls; ++i) {
      if (::flock(fd_, LOCK_EX | LOCK_NB) == 0) {
        held_ = true;
        return;
      }
      if (errno != EWOULDBLOCK && errno != EINTR) {
        why_ = absl::StrCat("cannot lock ", path, ": ", std::strerror(errno));
        return;
      }
      if (absl::Now() >= deadline) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    why_ =
        absl::StrCat(path, " still held by another measurement after ", absl::FormatDuration(wait));
  }
  ~HostLock() {
    if (fd_ >= 0) ::close(fd_);  // closing the descriptor releases the flock
  }
  HostLock(const HostLock&) = delete;
  HostLock& operator=(const HostLock&) = delete;

  bool held() const { return held_; }
  const std::string& why_not() const { return why_; }

 private:
  int fd_ = -1;
  bool held_ = false;
  std::string why_;
};

}  // namespace

absl::StatusOr<PeakFlops> MeasurePeak(const PeakSample& sample, const PeakOptions& options) {
  if (options.samples < 1 || options.warmup < 0 || options.gap < absl::ZeroDuration() ||
      options.lock_wait < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "peak measurement: needs samples >= 1, warmup >= 0 and non-negative gap and lock wait; "
        "got samples ",
        options.samples, ", warmup ", options.warmup));
  }
  HostLock lock(options.lock_path, options.lock_wait);
  PeakFlops out;
  out.serialized = lock.held();
  for (int i = 0; i < options.warmup + options.samples; ++i) {
    if (i > 0) absl::SleepFor(options.gap);
    absl::StatusOr<double> f = sample();
    if (!f.ok()) return f.status();
    if (!std::isfinite(*f) || *f <= 0) {
      return absl::InternalError(absl::StrCat("peak measurement: a sample ran at ", *f,
                                              " FLOP/s (not a positive figure)"));
    }
    if (i < options.warmup) continue;
    out.flops = std::max(out.flops, *f);
    ++out.samples;
  }
  out.measured_at = absl::Now();
  out.method = absl::StrCat(
      options.what.empty() ? "GEMM" : options.what, ", best of ", out.samples, " samples ",
      absl::FormatDuration(options.gap), " apart, ",
      out.serialized ? absl::StrCat("one worker of this host at a time (", options.lock_path, ")")
                     : absl::StrCat("not serialised with other workers (", lock.why_not(), ")"));
  return out;
}

PeakSample CpuSgemmSample(int n) {
  if (n < 1 || n > 8192) {
    return []() -> absl::StatusOr<double> {
      return absl::InvalidArgumentError("SGEMM sample: n must be in [1, 8192]");
    };
  }
  // The operands are made once and shared by every sample: only the GEMM is timed, and a
  // measurement of 9 samples should not allocate and fill 9 x 3 matrices.
  struct Operands {
    std::vector<float> a, b, c;
  };
  auto m = std::make_shared<Operands>();
  m->a.assign(size_t(n) * n, 0.5f);
  m->b.assign(size_t(n) * n, 0.25f);
  m->c.assign(size_t(n) * n, 0.0f);
  return [n, m]() -> absl::StatusOr<double> {
    const auto t0 = std::chrono::steady_clock::now();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, m->a.data(), n,
                m->b.data(), n, 0.0f, m->c.data(), n);
    const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!(t > 0)) return absl::InternalError("SGEMM sample: the clock did not advance");
    return 2.0 * n * double(n) * n / t;
  };
}

}  // namespace tandem::worker
