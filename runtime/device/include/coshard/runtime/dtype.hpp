#pragma once
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace coshard {

/// Element type of a tensor or buffer.
enum class DType : std::uint8_t { f32, bf16, f16, i32, i64 };

/// Bytes per element of `t`.
constexpr std::size_t size_of(DType t) noexcept {
  switch (t) {
    case DType::f32: return 4;
    case DType::bf16: return 2;
    case DType::f16: return 2;
    case DType::i32: return 4;
    case DType::i64: return 8;
  }
  return 0;
}

/// The short name of `t` ("f32", "bf16", ...), as used in messages; "?" for an invalid value.
constexpr std::string_view to_string(DType t) noexcept {
  switch (t) {
    case DType::f32: return "f32";
    case DType::bf16: return "bf16";
    case DType::f16: return "f16";
    case DType::i32: return "i32";
    case DType::i64: return "i64";
  }
  return "?";
}

}  // namespace coshard
