#pragma once
// Building blocks for loops that compilers vectorise under strict IEEE semantics (coshard builds
// without -ffast-math, so a float reduction may not be reordered by the compiler and glibc's vector
// expf, declared only under __FAST_MATH__, is never used).
//
// - Reductions keep kLanes independent partial sums and combine them in a fixed tree. The compiler
//   maps the lanes onto vector registers of whatever width the target has, and because the order
//   of additions is written out, the result is bit-identical on SSE2, AVX2 and AVX-512 (and more
//   accurate than one running sum).
// - exp_approx (coshard/kernels/elementwise.hpp) is a polynomial without calls or branches, so a
//   loop of it vectorises.
//
// Everything here has internal linkage and uses builtins rather than std:: templates. The file is
// compiled into the per-ISA kernels (src/isa/kernels.cpp, with -march=x86-64-v4 among others): an
// inline function with external linkage would be emitted as a weak symbol in each of them wherever
// the compiler does not inline it (any -O0 build), and the linker would keep one copy for the
// whole library, possibly an AVX-512 one that a baseline caller then runs on a CPU without AVX-512.
// tests/ops/isa_objects.cmake checks the objects export nothing else.
#include <cstddef>
#include <cstdint>

#include "coshard/kernels/elementwise.hpp"

namespace coshard::ops::detail {
namespace {  // NOLINT(cert-dcl59-cpp,google-build-namespaces): per-TU copies on purpose (see above)

constexpr std::size_t kLanes = 16;

// The fast exp and sigmoid are the shared ones (coshard/kernels/elementwise.hpp), so that the CPU
// and CUDA softmax and GELU compute the same rule.
using coshard::kernels::exp_approx;
using coshard::kernels::sigmoid_approx;

/// Combines lane partial sums in a fixed tree (8 pairs, then 4, 2, 1).
template <class T>
inline T combine_lanes(T (&acc)[kLanes]) noexcept {
  for (std::size_t w = kLanes / 2; w > 0; w /= 2)
    for (std::size_t l = 0; l < w; ++l) acc[l] += acc[l + w];
  return acc[0];
}

/// sum_{i < n} f(i), in kLanes partial sums (element i goes to lane i % kLanes).
template <class T = float, class F>
inline T lane_sum(std::size_t n, F&& f) noexcept {
  T acc[kLanes] = {};
  std::size_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (std::size_t l = 0; l < kLanes; ++l) acc[l] += f(i + l);
  for (std::size_t l = 0; i + l < n; ++l) acc[l] += f(i + l);
  return combine_lanes(acc);
}

/// max_{i < n} x[i] for n >= 1 (NaN elements are skipped, as a comparison with NaN is false).
inline float lane_max(const float* x, std::size_t n) noexcept {
  float acc[kLanes];
  for (std::size_t l = 0; l < kLanes; ++l) acc[l] = x[0];
  std::size_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (std::size_t l = 0; l < kLanes; ++l) acc[l] = x[i + l] > acc[l] ? x[i + l] : acc[l];
  for (std::size_t l = 0; i + l < n; ++l) acc[l] = x[i + l] > acc[l] ? x[i + l] : acc[l];
  float m = acc[0];
  for (std::size_t l = 1; l < kLanes; ++l) m = acc[l] > m ? acc[l] : m;
  return m;
}

/// sum_i a[i] * b[i].
inline float dot(const float* __restrict a, const float* __restrict b, std::size_t n) noexcept {
  return lane_sum(n, [&](std::size_t i) { return a[i] * b[i]; });
}

/// The larger of a and b (a when either is NaN): std::max, without its weak template instance.
inline float max_of(float a, float b) noexcept { return b > a ? b : a; }

}  // namespace
}  // namespace coshard::ops::detail
