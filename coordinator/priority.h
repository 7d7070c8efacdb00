// The coordinator's CPU priorities (--rpc-nice). Its job orchestration (the scheduler, and the
// job runners that drive every step) keeps the process's starting priority; everything else
// (gRPC's threads, which serve the status, watch and registration RPCs and carry every
// channel's I/O, and the HTTP server) runs at a higher nice value. On a machine the coordinator
// shares with workers, monitoring load (many clients polling status and watching jobs) then takes
// its CPU from the pipeline's idle time rather than from the training step. Nice only weights the
// kernel's scheduler: every RPC is still served.
//
// Linux gives each thread its own nice value, inherited by the threads it starts, and an
// unprivileged thread can only raise its own. So main starts a PriorityLauncher first, lowers
// itself (LowerCallingThread) before gRPC or anything else starts threads, and starts the
// scheduler through the launcher.
// Thread-safety: Run may be called from any thread; the launcher runs one function at a time.
#ifndef TANDEM_COORDINATOR_PRIORITY_H_
#define TANDEM_COORDINATOR_PRIORITY_H_

#include <functional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace tandem::coordinator {

// The calling thread's nice value.
int CallingThreadNice();

// Sets the calling thread's nice value to `nice` (0..19) unless it is already at least that;
// the threads it starts afterwards inherit it. INVALID_ARGUMENT outside 0..19; the system's
// error otherwise.
absl::Status LowerCallingThread(int nice);

// A thread that keeps the priority of the thread that constructed it, and runs functions for
// others, so that the threads those functions start keep it too.
class PriorityLauncher {
 public:
  PriorityLauncher();
  ~PriorityLauncher();
  PriorityLauncher(const PriorityLauncher&) = delete;
  PriorityLauncher& operator=(const PriorityLauncher&) = delete;

  // Runs `f` on the launcher's thread and returns when it has returned.
  void Run(const std::function<void()>& f);

 private:
  void Loop();

  absl::Mutex mu_;
  const std::function<void()>* task_ ABSL_GUARDED_BY(mu_) = nullptr;
  bool done_ ABSL_GUARDED_BY(mu_) = false;  // the task ran
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace tandem::coordinator

#endif  // TANDEM_COORDINATOR_PRIORITY_H_
