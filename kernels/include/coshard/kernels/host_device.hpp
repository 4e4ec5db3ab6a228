#pragma once
// The kernels layer (coshard::kernels): header-only element-wise math shared by the CPU and CUDA
// paths of ops, transport and fsdp, so that each scalar rule is written once and both paths agree
// bit for bit. It depends on nothing else of coshard, so every layer may include it.
//
// COSHARD_HD marks a function callable from host and device code; plain C++ compilers see nothing.
#include <bit>
#include <cstdint>

#if defined(__CUDACC__)
#define COSHARD_HD __host__ __device__
#else
#define COSHARD_HD
#endif

namespace coshard::kernels {

/// The bit pattern of `x`. std::bit_cast is not callable from device code; the intrinsics compile
/// to a register move.
COSHARD_HD inline std::uint32_t float_to_bits(float x) noexcept {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  return std::bit_cast<std::uint32_t>(x);
#endif
}

/// The float whose bit pattern is `u`; the inverse of float_to_bits.
COSHARD_HD inline float bits_to_float(std::uint32_t u) noexcept {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  return std::bit_cast<float>(u);
#endif
}

}  // namespace coshard::kernels
