// Tensor storage: zero-filled, its elements on a 64-byte boundary however it was made.
#include "worker/model/tensor.h"

#include <cstdint>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace tandem::worker {
namespace {

bool OnCacheLine(const void* p) { return reinterpret_cast<uintptr_t>(p) % kTensorAlignment == 0; }

TEST(TensorTest, EveryBufferStartsOnACacheLineWhateverAllocationsCameBefore) {
  // Odd sizes in between, so that a 16-byte-aligned allocator would hand out every offset.
  std::vector<Tensor> kept;
  std::vector<IntTensor> ids;
  for (int64_t n : {1, 3, 5, 17, 1000, 4097, 196608, 1 << 20}) {
    kept.emplace_back(std::vector<int64_t>{n});
    ids.emplace_back(std::vector<int64_t>{n + 1});
    EXPECT_TRUE(OnCacheLine(kept.back().data())) << n << " floats";
    EXPECT_TRUE(OnCacheLine(ids.back().data())) << n + 1 << " ints";
    EXPECT_EQ(kept.back()[static_cast<size_t>(n) - 1], 0.0f) << "zero-filled";
  }
  Tensor copy = kept[5];
  EXPECT_TRUE(OnCacheLine(copy.data()));
  EXPECT_EQ(copy.vec(), kept[5].vec());
  copy.Reset({7, 9});
  EXPECT_TRUE(OnCacheLine(copy.data()));
  EXPECT_EQ(copy.size(), 63u);
  const Tensor moved = std::move(copy);
  EXPECT_TRUE(OnCacheLine(moved.data()));
  const Tensor given({2, 2}, {1.0f, 2.0f, 3.0f, 4.0f});
  EXPECT_TRUE(OnCacheLine(given.data()));
  EXPECT_EQ(given.values(), (std::vector<float>{1.0f, 2.0f, 3.0f, 4.0f}));
}

}  // namespace
}  // namespace tandem::worker
