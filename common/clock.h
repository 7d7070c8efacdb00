// Wall-clock helpers shared by every program (no dependencies).
#ifndef TANDEM_COMMON_CLOCK_H_
#define TANDEM_COMMON_CLOCK_H_

#include <chrono>
#include <cstdint>

namespace tandem {

// Microseconds since the Unix epoch. Action timings and clock offsets use this clock.
inline int64_t UnixMicros() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace tandem

#endif  // TANDEM_COMMON_CLOCK_H_
