// The median of a sample: the middle value, or the mean of the two middle values of an even
// count; 0 for an empty one.
#ifndef TANDEM_COMMON_MEDIAN_H_
#define TANDEM_COMMON_MEDIAN_H_

#include <algorithm>
#include <cstddef>
#include <vector>

namespace tandem {

inline double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace tandem

#endif  // TANDEM_COMMON_MEDIAN_H_
