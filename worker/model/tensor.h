// Dense host tensors for the CPU reference backend: a shape and a contiguous row-major buffer.
//
// Tensor (fp32) carries activations, gradients and parameters; IntTensor (int32) carries token
// ids and targets. Element counts are int64_t/size_t: B*T*V overflows int32 for real models.
// Not thread-safe; a tensor has one owner (a layer, a saved context or the executor).
#ifndef TANDEM_WORKER_MODEL_TENSOR_H_
#define TANDEM_WORKER_MODEL_TENSOR_H_

#include <cstddef>
#include <cstdint>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_join.h"

namespace tandem::worker {

// Tensor storage starts on a 64-byte boundary: a cache line, and one AVX-512 vector. malloc's
// 16 bytes left each buffer's offset within a line to the heap's history, so the same layer's
// vector loads split lines in one stage and not in another: a whole 6-block GPT stage ran its
// forward 3.4% faster aligned (its backward and AdamW update unchanged), and a stage's identical
// blocks no longer differed from one another by up to 5% (docs/benchmarks.md).
inline constexpr size_t kTensorAlignment = 64;

template <typename T>
struct TensorAllocator {
  using value_type = T;
  TensorAllocator() = default;
  template <typename U>
  TensorAllocator(const TensorAllocator<U>&) noexcept {}  // NOLINT: rebinding is implicit
  T* allocate(size_t n) {
    return static_cast<T*>(::operator new (n * sizeof(T), std::align_val_t{kTensorAlignment}));
  }
  void deallocate(T* p, size_t) noexcept {
    ::operator delete (p, std::align_val_t{kTensorAlignment});
  }
  template <typename U>
  bool operator==(const TensorAllocator<U>&) const noexcept {
    return true;
  }
};

// A tensor's element buffer.
template <typename T>
using TensorStorage = std::vector<T, TensorAllocator<T>>;

template <typename T>
class BasicTensor {
 public:
  BasicTensor() = default;
  // Zero-filled tensor of `shape`.
  explicit BasicTensor(std::vector<int64_t> shape)
      : shape_(std::move(shape)), data_(static_cast<size_t>(CountOf(shape_)), T{}) {}
  BasicTensor(std::vector<int64_t> shape, TensorStorage<T> data)
      : shape_(std::move(shape)), data_(std::move(data)) {}

  // Total elements: the product of the dimensions (1 for a 0-d shape, 0 for an empty tensor).
  static int64_t CountOf(const std::vector<int64_t>& shape) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }

  const std::vector<int64_t>& shape() const { return shape_; }
  int64_t dim(size_t i) const { return shape_[i]; }
  size_t rank() const { return shape_.size(); }
  size_t size() const { return data_.size(); }
  size_t bytes() const { return data_.size() * sizeof(T); }
  bool empty() const { return data_.empty(); }

  T* data() { return data_.data(); }
  const T* data() const { return data_.data(); }
  T& operator[](size_t i) { return data_[i]; }
  const T& operator[](size_t i) const { return data_[i]; }
  TensorStorage<T>& vec() { return data_; }
  const TensorStorage<T>& vec() const { return data_; }
  // A copy of the elements, for code that keeps them apart from the tensor.
  std::vector<T> values() const { return std::vector<T>(data_.begin(), data_.end()); }

  // Reallocates to `shape` and zero-fills.
  void Reset(std::vector<int64_t> shape) {
    shape_ = std::move(shape);
    data_.assign(static_cast<size_t>(CountOf(shape_)), T{});
  }
  void Fill(T value) { data_.assign(data_.size(), value); }
  void Clear() {
    shape_.clear();
    data_.clear();
    data_.shrink_to_fit();
  }

  std::string ShapeString() const { return "(" + absl::StrJoin(shape_, ", ") + ")"; }

 private:
  std::vector<int64_t> shape_;
  TensorStorage<T> data_;
};

using Tensor = BasicTensor<float>;
using IntTensor = BasicTensor<int32_t>;

}  // namespace tandem::worker

#endif  // TANDEM_WORKER_MODEL_TENSOR_H_
