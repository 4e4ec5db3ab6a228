#pragma once
// A Tensor is a dtype, a shape and a view into a shared owning Buffer on one device.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "coshard/runtime/allocator.hpp"
#include "coshard/runtime/dtype.hpp"
#include "coshard/runtime/error.hpp"

namespace coshard {

/// Dimension sizes, outermost first. Empty is a scalar (one element).
using Shape = std::vector<std::int64_t>;

/// Product of the dimensions; throws Error(invalid_argument) on a negative one.
std::int64_t numel(const Shape& shape);
/// Bytes of `numel` elements of `dtype`; throws Error(invalid_argument) when that overflows.
std::size_t bytes_of(std::int64_t numel, DType dtype);
/// "[2, 3]" style, for messages.
std::string to_string(const Shape& shape);

/// The DType of C++ element type `T` (float, std::int32_t, std::int64_t); other types do not link.
template <class T>
constexpr DType dtype_of();
template <> constexpr DType dtype_of<float>() { return DType::f32; }
template <> constexpr DType dtype_of<std::int32_t>() { return DType::i32; }
template <> constexpr DType dtype_of<std::int64_t>() { return DType::i64; }

/// A typed, shaped view into a shared Buffer on one device; copies share storage.
class Tensor {
 public:
  Tensor() = default;  ///< undefined: no storage, zero elements
  /// A new tensor with its own storage from `alloc`, on alloc's device. The contents are not initialised.
  static Tensor empty(Allocator& alloc, DType dtype, Shape shape);

  DType dtype() const noexcept { return dtype_; }         ///< element type
  const Shape& shape() const noexcept { return shape_; }  ///< dimension sizes
  std::int64_t numel() const noexcept { return numel_; }  ///< element count of this view
  /// Bytes this view spans: numel() times the element size.
  std::size_t nbytes() const noexcept { return static_cast<std::size_t>(numel_) * size_of(dtype_); }
  Device device() const noexcept { return device_; }  ///< where the storage lives
  /// Whether the host may dereference data() (Allocator::host_accessible of the allocator it came
  /// from): false for CUDA memory and the cpu-discrete device's, true for host memory of any kind.
  bool host_accessible() const noexcept { return host_accessible_; }
  /// False for a default-constructed tensor, which has no storage.
  bool defined() const noexcept { return static_cast<bool>(storage_); }

  /// First element of this view (device memory on CUDA); nullptr when undefined.
  void* data() const noexcept;
  /// data() typed as `T*`; throws Error(invalid_argument) when `T` does not match dtype().
  template <class T>
  T* data_as() const {
    if (dtype_of<T>() != dtype_) throw_dtype(dtype_of<T>());
    return static_cast<T*>(data());
  }

  /// A view of `shape` starting `offset` elements into this tensor; shares the storage.
  Tensor view(std::int64_t offset, Shape shape) const;
  /// The same elements with another shape (element counts must match).
  Tensor reshape(Shape shape) const { return view(0, std::move(shape)); }

  /// Reuse of the storage waits for this event once the last view is gone.
  void record_use(const Event& event) const { storage_->record_use(event); }

 private:
  [[noreturn]] void throw_dtype(DType wanted) const;
  std::shared_ptr<Buffer> storage_;
  std::size_t byte_offset_ = 0;
  DType dtype_ = DType::f32;
  Shape shape_;
  std::int64_t numel_ = 0;
  Device device_;
  bool host_accessible_ = true;
};

}  // namespace coshard
