#include "coshard/runtime/tensor.hpp"

namespace coshard {

std::int64_t numel(const Shape& shape) {
  bool empty = false;  // a zero dimension: no elements, however large the others
  for (auto d : shape) {
    if (d < 0) throw Error(Errc::invalid_argument, "negative dimension in shape " + to_string(shape));
    empty = empty || d == 0;
  }
  if (empty) return 0;
  std::int64_t n = 1;
  for (auto d : shape) {
    if (__builtin_mul_overflow(n, d, &n)) {
      throw Error(Errc::invalid_argument, "shape " + to_string(shape) + " has more than 2^63 elements");
    }
  }
  return n;
}

std::size_t bytes_of(std::int64_t numel, DType dtype) {
  std::size_t bytes = 0;
  if (numel < 0 || __builtin_mul_overflow(static_cast<std::size_t>(numel), size_of(dtype), &bytes)) {
    throw Error(Errc::invalid_argument, std::to_string(numel) + " elements of " + std::string(to_string(dtype)) +
                                            " do not fit in a 64-bit byte count");
  }
  return bytes;
}

std::string to_string(const Shape& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

Tensor Tensor::empty(Allocator& alloc, DType dtype, Shape shape) {
  Tensor t;
  t.numel_ = coshard::numel(shape);
  t.dtype_ = dtype;
  t.shape_ = std::move(shape);
  t.device_ = alloc.device();
  t.host_accessible_ = alloc.host_accessible();
  t.storage_ = std::make_shared<Buffer>(alloc.allocate(bytes_of(t.numel_, dtype)));
  return t;
}

void* Tensor::data() const noexcept {
  return storage_ ? static_cast<char*>(storage_->data()) + byte_offset_ : nullptr;
}

Tensor Tensor::view(std::int64_t offset, Shape shape) const {
  auto n = coshard::numel(shape);
  if (offset < 0 || n > numel_ || offset > numel_ - n) {  // never offset + n: it may overflow
    throw Error(Errc::invalid_argument, "view of " + to_string(shape) + " at offset " + std::to_string(offset) +
                                            " does not fit in a tensor of " + std::to_string(numel_) + " elements");
  }
  Tensor t = *this;
  t.byte_offset_ = byte_offset_ + static_cast<std::size_t>(offset) * size_of(dtype_);
  t.shape_ = std::move(shape);
  t.numel_ = n;
  return t;
}

void Tensor::throw_dtype(DType wanted) const {
  throw Error(Errc::invalid_argument, "tensor of dtype " + std::string(coshard::to_string(dtype_)) +
                                          " accessed as " + std::string(coshard::to_string(wanted)));
}

}  // namespace coshard
