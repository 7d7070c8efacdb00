#include "coordinator/priority.h"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace tandem::coordinator {
namespace {
id_t Tid() { return static_cast<id_t>(syscall(SYS_gettid)); }
}  // namespace

int CallingThreadNice() { return getpriority(PRIO_PROCESS, Tid()); }

absl::Status LowerCallingThread(int nice) {
  if (nice < 0 || nice > 19) {
    return absl::InvalidArgumentError(absl::StrCat("nice ", nice, " is outside 0..19"));
  }
  if (CallingThreadNice() >= nice) return absl::OkStatus();
  if (setpriority(PRIO_PROCESS, Tid(), nice) != 0) {
    return absl::InternalError(
        absl::StrCat("setpriority(nice ", nice, "): ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

PriorityLauncher::PriorityLauncher() : thread_([this] { Loop(); }) {}

PriorityLauncher::~PriorityLauncher() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

void PriorityLauncher::Run(const std::function<void()>& f) {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](const std::function<void()>** t) { return *t == nullptr; }, &task_));
  task_ = &f;
  done_ = false;
  mu_.Await(absl::Condition(&done_));
  task_ = nullptr;
}

void PriorityLauncher::Loop() {
  absl::MutexLock lock(&mu_);
  for (;;) {
    mu_.Await(absl::Condition(
        +[](PriorityLauncher* l) ABSL_NO_THREAD_SAFETY_ANALYSIS {
          return l->stop_ || (l->task_ != nullptr && !l->done_);
        },
        this));
    if (stop_) return;
    const std::function<void()>* f = task_;
    mu_.Unlock();
    (*f)();
    mu_.Lock();
    done_ = true;
  }
}

}  // namespace tandem::coordinator
