#include "reduce_kernels.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "coshard/ops/cast.hpp"

namespace coshard::transport::detail {
namespace {

template <class Load>
void combine(float* __restrict acc, std::size_t n, ReduceOp op, Load load) noexcept {
  if (op == ReduceOp::max) {
    for (std::size_t i = 0; i < n; ++i) acc[i] = std::max(acc[i], load(i));
  } else {
    for (std::size_t i = 0; i < n; ++i) acc[i] += load(i);
  }
}

}  // namespace

bool reducible(DType dtype) noexcept { return dtype == DType::f32 || dtype == DType::bf16 || dtype == DType::f16; }

void load_f32(float* __restrict acc, const void* in, DType dtype, std::size_t n, float scale) noexcept {
  switch (dtype) {
    case DType::f32: {
      const auto* __restrict p = static_cast<const float*>(in);
      for (std::size_t i = 0; i < n; ++i) acc[i] = p[i] * scale;
      break;
    }
    case DType::bf16: {
      const auto* __restrict p = static_cast<const std::uint16_t*>(in);
      for (std::size_t i = 0; i < n; ++i) acc[i] = ops::bf16_to_f32(p[i]) * scale;
      break;
    }
    case DType::f16: {
      const auto* __restrict p = static_cast<const std::uint16_t*>(in);
      for (std::size_t i = 0; i < n; ++i) acc[i] = ops::f16_to_f32(p[i]) * scale;
      break;
    }
    default: break;
  }
}

void accumulate(float* acc, const void* in, DType dtype, std::size_t n, float scale, ReduceOp op) noexcept {
  switch (dtype) {
    case DType::f32: {
      const auto* __restrict p = static_cast<const float*>(in);
      if (scale == 1.0f) {
        combine(acc, n, op, [p](std::size_t i) { return p[i]; });
      } else {
        combine(acc, n, op, [p, scale](std::size_t i) { return p[i] * scale; });
      }
      break;
    }
    case DType::bf16: {
      const auto* __restrict p = static_cast<const std::uint16_t*>(in);
      combine(acc, n, op, [p, scale](std::size_t i) { return ops::bf16_to_f32(p[i]) * scale; });
      break;
    }
    case DType::f16: {
      const auto* __restrict p = static_cast<const std::uint16_t*>(in);
      combine(acc, n, op, [p, scale](std::size_t i) { return ops::f16_to_f32(p[i]) * scale; });
      break;
    }
    default: break;
  }
}

void accumulate_f32(float* acc, const float* other, std::size_t n, ReduceOp op) noexcept {
  const float* __restrict p = other;
  combine(acc, n, op, [p](std::size_t i) { return p[i]; });
}

void finish(void* out, const float* partial, const void* in, DType dtype, std::size_t n, float scale, ReduceOp op,
            float post) noexcept {
  if (dtype == DType::f32 && op == ReduceOp::sum) {
    auto* __restrict o = static_cast<float*>(out);
    const auto* __restrict a = partial;
    const auto* __restrict b = static_cast<const float*>(in);
    if (scale == 1.0f && post == 1.0f) {
      for (std::size_t i = 0; i < n; ++i) o[i] = a[i] + b[i];
    } else {
      for (std::size_t i = 0; i < n; ++i) o[i] = (a[i] + b[i] * scale) * post;
    }
    return;
  }
  // Other dtypes and max: in blocks through a small f32 buffer that stays in cache.
  constexpr std::size_t kBlock = 1024;
  float tmp[kBlock];
  const std::size_t esize = size_of(dtype);
  for (std::size_t at = 0; at < n; at += kBlock) {
    const std::size_t m = std::min(kBlock, n - at);
    std::copy(partial + at, partial + at + m, tmp);
    accumulate(tmp, static_cast<const std::byte*>(in) + at * esize, dtype, m, scale, op);
    store(static_cast<std::byte*>(out) + at * esize, dtype, tmp, m, post);
  }
}

void store(void* out, DType dtype, const float* acc, std::size_t n, float post) noexcept {
  switch (dtype) {
    case DType::f32: {
      auto* __restrict p = static_cast<float*>(out);
      if (post == 1.0f) {
        if (p != acc) std::copy(acc, acc + n, p);
      } else {
        for (std::size_t i = 0; i < n; ++i) p[i] = acc[i] * post;
      }
      break;
    }
    case DType::bf16: {
      auto* __restrict p = static_cast<std::uint16_t*>(out);
      for (std::size_t i = 0; i < n; ++i) p[i] = ops::f32_to_bf16(acc[i] * post);
      break;
    }
    case DType::f16: {
      auto* __restrict p = static_cast<std::uint16_t*>(out);
      for (std::size_t i = 0; i < n; ++i) p[i] = ops::f32_to_f16(acc[i] * post);
      break;
    }
    default: break;
  }
}

}  // namespace coshard::transport::detail
