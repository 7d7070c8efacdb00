// Dense host tensors for the CPU reference backend: a shape and a contiguous row-major buffer.
//
// Tensor (fp32) carries activations, gradients and parameters; IntTensor (int32) carries token
// ids and targets. Element counts are int64_t/size_t: B*T*V overflows int32 for real models.
// Not thread-safe; a tensor has one owner (a layer, a saved context or the executor).
#ifndef TANDEM_WORKER_MODEL_TENSOR_H_
#define TANDEM_WORKER_MODEL_TENSOR_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_join.h"

namespace tandem::worker {

template <typename T>
class BasicTensor {
 public:
  BasicTensor() = default;
  // Zero-filled tensor of `shape`.
  explicit BasicTensor(std::vector<int64_t> shape)
      : shape_(std::move(shape)), data_(static_cast<size_t>(CountOf(shape_)), T{}) {}
  BasicTensor(std::vector<int64_t> shape, std::vector<T> data)
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
  std::vector<T>& vec() { return data_; }
  const std::vector<T>& vec() const { return data_; }

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
  std::vector<T> data_;
};

using Tensor = BasicTensor<float>;
using IntTensor = BasicTensor<int32_t>;

}  // namespace tandem::worker

#endif  // TANDEM_WORKER_MODEL_TENSOR_H_
