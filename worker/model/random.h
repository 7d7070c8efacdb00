// Deterministic, portable random numbers for parameter initialisation and data sampling.
//
// Everything that must agree across workers (weights per global layer index, the synthetic
// corpus, the training windows) is derived from these functions only, never from
// std::normal_distribution or other library distributions whose output differs between
// standard libraries.
#ifndef TANDEM_WORKER_MODEL_RANDOM_H_
#define TANDEM_WORKER_MODEL_RANDOM_H_

#include <cmath>
#include <cstdint>
#include <random>

namespace tandem::worker {

// SplitMix64 finaliser: a bijective, well-mixing hash of 64 bits.
inline uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Hash of an ordered pair (seed, index).
inline uint64_t MixSeed(uint64_t seed, uint64_t index) {
  return SplitMix64(SplitMix64(seed) ^ (index * 0xd1b54a32d192ed03ULL + 0x2545f4914f6cdd1dULL));
}

// A seeded stream of uniform and normal draws. Not thread-safe.
class Rng {
 public:
  explicit Rng(uint64_t seed) : engine_(seed) {}

  uint64_t NextU64() { return engine_(); }
  // Uniform in [0, 1) with 53 random bits.
  double Uniform() { return static_cast<double>(engine_() >> 11) * 0x1.0p-53; }
  // Uniform integer in [0, n), n > 0 (multiply-shift; the bias is below 2^-32 for small n).
  uint64_t Below(uint64_t n) {
    return static_cast<uint64_t>((static_cast<unsigned __int128>(engine_()) * n) >> 64);
  }
  // Standard normal by Box-Muller (one draw per call; the sine branch is discarded so the
  // stream position depends only on the number of calls).
  double Normal() {
    const double u1 = 1.0 - Uniform();  // (0, 1]
    const double u2 = Uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
  }

 private:
  std::mt19937_64 engine_;
};

}  // namespace tandem::worker

#endif  // TANDEM_WORKER_MODEL_RANDOM_H_
