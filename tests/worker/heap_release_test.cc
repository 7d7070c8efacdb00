// ReleaseFreeHeap under the worker's --keep_heap malloc settings (no mmap, no trim): a freed
// buffer stays resident until the release, and goes with it.
#include "worker/heap_release.h"

#include <malloc.h>

#include <cstdlib>
#include <cstring>
#include <limits>

#include "gtest/gtest.h"

#if defined(__SANITIZE_ADDRESS__)
#define TANDEM_TEST_OWN_MALLOC 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TANDEM_TEST_OWN_MALLOC 1
#endif
#endif

namespace tandem::worker {
namespace {

TEST(ReleaseFreeHeap, ReturnsAFreedBufferThatTheKeptHeapHeld) {
#ifdef TANDEM_TEST_OWN_MALLOC
  GTEST_SKIP() << "the sanitizer's allocator replaces glibc's heap";
#else
  ASSERT_GT(ResidentBytes(), 0) << "/proc/self/statm unreadable";
  // The worker's settings (worker/main.cc, --keep_heap); this test binary holds nothing else.
  mallopt(M_ARENA_MAX, 1);
  mallopt(M_MMAP_MAX, 0);
  mallopt(M_TRIM_THRESHOLD, std::numeric_limits<int>::max());
  constexpr size_t kBytes = size_t{256} << 20;
  const int64_t base = ResidentBytes();
  char* buffer = static_cast<char*>(std::malloc(kBytes));
  ASSERT_NE(buffer, nullptr);
  std::memset(buffer, 1, kBytes);  // resident
  const int64_t touched = ResidentBytes();
  EXPECT_GE(touched - base, static_cast<int64_t>(kBytes * 9 / 10));
  std::free(buffer);
  const int64_t kept = ResidentBytes();
  EXPECT_GE(kept - base, static_cast<int64_t>(kBytes * 9 / 10)) << "the heap was trimmed anyway";

  const HeapRelease r = ReleaseFreeHeap();
  EXPECT_EQ(r.resident_before_bytes / (1 << 20), kept / (1 << 20));
  EXPECT_LE(r.resident_after_bytes, r.resident_before_bytes - static_cast<int64_t>(kBytes * 9 / 10))
      << "before " << r.resident_before_bytes << ", after " << r.resident_after_bytes;
#endif
}

}  // namespace
}  // namespace tandem::worker
