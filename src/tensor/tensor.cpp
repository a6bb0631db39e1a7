#include "tensor/tensor.h"

#include <utility>

#include "base/error.h"

namespace mt {

int64_t shape_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string shape_str(const Shape& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

std::vector<int64_t> contiguous_strides(const Shape& shape) {
  std::vector<int64_t> strides(shape.size());
  int64_t s = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = s;
    s *= shape[i];
  }
  return strides;
}

Tensor Tensor::empty(const Shape& shape, DType dtype, MemCategory category) {
  for (int64_t d : shape)
    MT_CHECK(d >= 0, ErrorKind::kInvalidArgument, "negative dimension in shape " + shape_str(shape));
  Tensor t;
  t.storage_ = std::make_shared<Buffer>(static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype),
                                        category);
  t.data_ = t.storage_->data();
  t.dtype_ = dtype;
  t.shape_ = shape;
  t.strides_ = contiguous_strides(shape);
  return t;
}

Tensor Tensor::view_of(void* data, const Shape& shape, DType dtype) {
  Tensor t;
  t.data_ = data;
  t.dtype_ = dtype;
  t.shape_ = shape;
  t.strides_ = contiguous_strides(shape);
  return t;
}

bool Tensor::is_contiguous() const { return strides_ == contiguous_strides(shape_); }

Tensor Tensor::reshape(const Shape& shape) const {
  MT_CHECK(is_contiguous(), ErrorKind::kInvalidArgument, "reshape of a non-contiguous tensor");
  MT_CHECK(shape_numel(shape) == numel(), ErrorKind::kInvalidArgument,
           "reshape " + shape_str(shape_) + " -> " + shape_str(shape) + " changes the element count");
  Tensor t = *this;
  t.shape_ = shape;
  t.strides_ = contiguous_strides(shape);
  return t;
}

Tensor Tensor::slice(int dim, int64_t start, int64_t stop) const {
  MT_CHECK(dim >= 0 && dim < ndim() && 0 <= start && start <= stop && stop <= shape_[dim],
           ErrorKind::kInvalidArgument, "slice out of range on " + shape_str(shape_));
  Tensor t = *this;
  t.data_ = static_cast<char*>(data_) + start * strides_[dim] * static_cast<int64_t>(dtype_size(dtype_));
  t.shape_[dim] = stop - start;
  return t;
}

Tensor Tensor::transpose(int a, int b) const {
  Tensor t = *this;
  std::swap(t.shape_[a], t.shape_[b]);
  std::swap(t.strides_[a], t.strides_[b]);
  return t;
}

namespace {
// Calls f(element_offset) for every element in row-major order of the logical shape.
template <typename F>
void for_each_offset(const Shape& shape, const std::vector<int64_t>& strides, F f) {
  int64_t n = shape_numel(shape);
  std::vector<int64_t> idx(shape.size(), 0);
  for (int64_t i = 0; i < n; ++i) {
    int64_t off = 0;
    for (size_t d = 0; d < shape.size(); ++d) off += idx[d] * strides[d];
    f(i, off);
    for (size_t d = shape.size(); d-- > 0;) {
      if (++idx[d] < shape[d]) break;
      idx[d] = 0;
    }
  }
}
}  // namespace

Tensor Tensor::contiguous() const {
  if (is_contiguous()) return *this;
  Tensor out = Tensor::empty(shape_, dtype_, MemCategory::kWorkspace);
  size_t es = dtype_size(dtype_);
  const char* src = static_cast<const char*>(data_);
  char* dst = static_cast<char*>(out.data_);
  for_each_offset(shape_, strides_, [&](int64_t i, int64_t off) {
    std::memcpy(dst + i * es, src + off * static_cast<int64_t>(es), es);
  });
  return out;
}

std::vector<float> Tensor::to_f32_vector() const {
  Tensor c = contiguous();
  std::vector<float> out(static_cast<size_t>(numel()));
  convert(out.data(), DType::kF32, c.data(), dtype_, out.size());
  return out;
}

}  // namespace mt
