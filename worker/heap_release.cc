#include "worker/heap_release.h"

#include <malloc.h>
#include <unistd.h>

#include <fstream>

namespace tandem::worker {

int64_t ResidentBytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t size_pages = 0, resident_pages = 0;
  if (!(statm >> size_pages >> resident_pages)) return 0;
  const long page = sysconf(_SC_PAGESIZE);
  return page > 0 ? resident_pages * page : 0;
}

HeapRelease ReleaseFreeHeap() {
  HeapRelease out;
  out.resident_before_bytes = ResidentBytes();
  malloc_trim(0);
  out.resident_after_bytes = ResidentBytes();
  return out;
}

}  // namespace tandem::worker
