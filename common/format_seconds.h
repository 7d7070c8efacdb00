// Durations for people, in seconds: a step of a large model takes seconds and one of a small
// model milliseconds, and both must keep their digits in the same sentence.
#ifndef TANDEM_COMMON_FORMAT_SECONDS_H_
#define TANDEM_COMMON_FORMAT_SECONDS_H_

#include <string>

#include "absl/strings/str_format.h"

namespace tandem {

// "19.398", "0.374" (three decimals from 0.1 s up), "0.00573", "0.000412" (three significant
// digits below); the unit is the caller's.
inline std::string FormatSeconds(double seconds) {
  return seconds >= 0.1 || seconds <= 0 ? absl::StrFormat("%.3f", seconds)
                                        : absl::StrFormat("%.3g", seconds);
}

}  // namespace tandem

#endif  // TANDEM_COMMON_FORMAT_SECONDS_H_
