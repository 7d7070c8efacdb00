// Global-norm gradient clipping: the one definition of the scale the coordinator sends every
// stage in ApplyStep (and the tests that drive executors without a coordinator use).
#ifndef TANDEM_COMMON_GRAD_CLIP_H_
#define TANDEM_COMMON_GRAD_CLIP_H_

#include <cmath>

namespace tandem {

// The factor that clips a global gradient norm to `clip`: min(1, clip / norm). 1 when clipping
// is off (clip <= 0) or the norm is not finite (such a step is skipped, not scaled).
inline float ClipScale(double norm, float clip) {
  if (!std::isfinite(norm) || clip <= 0 || norm <= clip) return 1.0f;
  return static_cast<float>(clip / norm);
}

}  // namespace tandem

#endif  // TANDEM_COMMON_GRAD_CLIP_H_
