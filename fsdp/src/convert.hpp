#pragma once
// Host loops converting between f32 and the engine's parameter and reduction dtypes, on the
// scalar casts of coshard::kernels (round to nearest even). They run inside stream work only.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "coshard/kernels/cast.hpp"
#include "coshard/runtime/dtype.hpp"
#include "coshard/runtime/error.hpp"

namespace coshard::fsdp::detail {

// dst (dtype) <- src (f32).
inline void cast_from_f32(const float* src, void* dst, DType dtype, std::size_t n) {
  auto* h = static_cast<std::uint16_t*>(dst);
  switch (dtype) {
    case DType::f32: std::memcpy(dst, src, n * sizeof(float)); break;
    case DType::bf16: for (std::size_t i = 0; i < n; ++i) h[i] = kernels::f32_to_bf16(src[i]); break;
    case DType::f16: for (std::size_t i = 0; i < n; ++i) h[i] = kernels::f32_to_f16(src[i]); break;
    default: throw Error(Errc::invalid_argument, "unsupported dtype for parameters: " + std::string(to_string(dtype)));
  }
}

// dst (f32) <- src (dtype).
inline void cast_to_f32(const void* src, DType dtype, float* dst, std::size_t n) {
  const auto* h = static_cast<const std::uint16_t*>(src);
  switch (dtype) {
    case DType::f32: std::memcpy(dst, src, n * sizeof(float)); break;
    case DType::bf16: for (std::size_t i = 0; i < n; ++i) dst[i] = kernels::bf16_to_f32(h[i]); break;
    case DType::f16: for (std::size_t i = 0; i < n; ++i) dst[i] = kernels::f16_to_f32(h[i]); break;
    default: throw Error(Errc::invalid_argument, "unsupported dtype: " + std::string(to_string(dtype)));
  }
}

// x as the nearest value of `dtype` (mixed precision without a collective: NO_SHARD).
inline float round_through(DType dtype, float x) {
  switch (dtype) {
    case DType::bf16: return kernels::round_to_bf16(x);
    case DType::f16: return kernels::round_to_f16(x);
    default: return x;
  }
}

}  // namespace coshard::fsdp::detail
