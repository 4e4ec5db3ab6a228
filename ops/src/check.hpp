#pragma once
// Argument checks shared by the kernels. Every message names the op, the argument, and the
// expected versus given size, so a shape bug in a model is found from the message alone.
#include <climits>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>

#include "coshard/runtime/error.hpp"

namespace coshard::ops::detail {

[[noreturn]] inline void fail(const char* op, const std::string& what) {
  throw Error(Errc::invalid_argument, std::string(op) + ": " + what);
}

// `shape` describes the expectation in the op's own terms, e.g. "[rows, in] = [10, 7]".
template <class T>
void check_size(const char* op, const char* arg, std::span<T> s, std::size_t expected, const std::string& shape) {
  if (s.size() != expected) {
    fail(op, std::string(arg) + " has " + std::to_string(s.size()) + " elements, expected " +
                 std::to_string(expected) + " (" + shape + ")");
  }
}

// Optional outputs and inputs (an empty span means "not wanted" / "absent").
template <class T>
void check_optional_size(const char* op, const char* arg, std::span<T> s, std::size_t expected,
                         const std::string& shape) {
  if (!s.empty()) check_size(op, arg, s, expected, shape);
}

inline void check_positive(const char* op, const char* dim, std::size_t v) {
  if (v == 0) fail(op, std::string(dim) + " must be positive, got 0");
}

// BLAS takes int dimensions (OpenBLAS built without 64-bit integers).
inline int blas_dim(const char* op, const char* dim, std::size_t v) {
  if (v > static_cast<std::size_t>(INT_MAX)) {
    fail(op, std::string(dim) + " = " + std::to_string(v) + " exceeds the BLAS limit " + std::to_string(INT_MAX));
  }
  return static_cast<int>(v);
}

// The kernels use __restrict: an output that overlaps an input would be undefined behaviour, so it
// is refused instead of silently computing garbage.
template <class A, class B>
void check_disjoint(const char* op, const char* a_name, std::span<A> a, const char* b_name, std::span<B> b) {
  if (a.empty() || b.empty()) return;
  auto a0 = reinterpret_cast<std::uintptr_t>(a.data());
  auto a1 = a0 + a.size_bytes();
  auto b0 = reinterpret_cast<std::uintptr_t>(b.data());
  auto b1 = b0 + b.size_bytes();
  if (a0 < b1 && b0 < a1) fail(op, std::string(a_name) + " and " + std::string(b_name) + " must not overlap");
}

inline std::string dims(std::initializer_list<std::size_t> v) {
  std::string s = "[";
  bool first = true;
  for (auto x : v) {
    if (!first) s += ", ";
    s += std::to_string(x);
    first = false;
  }
  return s + "]";
}

}  // namespace coshard::ops::detail
