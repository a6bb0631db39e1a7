// Tensor: a typed, strided view into a Buffer (or into memory owned elsewhere, e.g. a flat
// parameter buffer). Views share storage; nothing here copies unless asked to.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tensor/allocator.h"
#include "tensor/dtype.h"

namespace mt {

using Shape = std::vector<int64_t>;

int64_t shape_numel(const Shape& shape);
std::string shape_str(const Shape& shape);  // "[2, 3, 4]"
std::vector<int64_t> contiguous_strides(const Shape& shape);

class Tensor {
 public:
  Tensor() = default;
  // A new zero-filled contiguous tensor owning its accounted storage.
  static Tensor empty(const Shape& shape, DType dtype, MemCategory category);
  // A contiguous view of memory owned by someone else (who must outlive the view).
  static Tensor view_of(void* data, const Shape& shape, DType dtype);

  void* data() const { return data_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  const std::vector<int64_t>& strides() const { return strides_; }
  int64_t dim(int i) const { return shape_[i < 0 ? shape_.size() + i : i]; }
  int ndim() const { return static_cast<int>(shape_.size()); }
  int64_t numel() const { return shape_numel(shape_); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }
  bool defined() const { return data_ != nullptr; }
  bool is_contiguous() const;

  Tensor reshape(const Shape& shape) const;  // REQUIRES: contiguous, same numel
  Tensor slice(int dim, int64_t start, int64_t stop) const;  // [start, stop) along dim
  Tensor transpose(int a, int b) const;
  Tensor contiguous() const;  // a copy if not contiguous, else *this

  std::vector<float> to_f32_vector() const;  // copy of all elements, converted to f32

 private:
  std::shared_ptr<Buffer> storage_;
  void* data_ = nullptr;
  DType dtype_ = DType::kF32;
  Shape shape_;
  std::vector<int64_t> strides_;  // in elements
};

}  // namespace mt
