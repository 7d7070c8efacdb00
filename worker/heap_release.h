// Returning a worker's free heap to the system once it is idle. With --keep_heap (the
// default) the worker never trims its heap, so that a step reuses its large activation
// buffers instead of faulting them in afresh; without a release, an idle worker would hold
// its last job's (or layer profile's) peak resident for good, memory that other processes on
// the node, and a Kubernetes memory limit, count against it.
#ifndef TANDEM_WORKER_HEAP_RELEASE_H_
#define TANDEM_WORKER_HEAP_RELEASE_H_

#include <cstdint>

namespace tandem::worker {

struct HeapRelease {
  int64_t resident_before_bytes = 0;  // this process's resident memory, before and after
  int64_t resident_after_bytes = 0;   // (0 where /proc/self/statm cannot be read)
};

// The process's resident memory (/proc/self/statm); 0 where it cannot be read.
int64_t ResidentBytes();

// Gives the free memory of the malloc heap back to the operating system with glibc's
// malloc_trim(0); what is still allocated stays. Thread-safe; at most about 0.1 s per GiB
// returned on the 2-vCPU VM (the log's times around it, the stage's teardown included).
HeapRelease ReleaseFreeHeap();

}  // namespace tandem::worker

#endif  // TANDEM_WORKER_HEAP_RELEASE_H_
