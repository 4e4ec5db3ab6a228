#pragma once
// Argument checks shared by the kernels. Every message names the op, the argument, and the
// expected versus given size, so a shape bug in a model is found from the message alone.
#include <climits>
#include <cstddef>
#include <cstdint>
#include <algorithm>
#include <initializer_list>
#include <span>
#include <string>
#include <utility>
#include <vector>

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

// Shared by the CPU and CUDA versions of an op, so both give the same messages.

// Attention: C and NH positive, C divisible by NH.
inline void check_heads(const char* op, std::size_t C, std::size_t NH) {
  check_positive(op, "C", C);
  check_positive(op, "NH", NH);
  if (C % NH != 0) {
    fail(op, "C = " + std::to_string(C) + " is not divisible by the number of heads NH = " + std::to_string(NH));
  }
}

// RMSNorm's inputs, shared by the CPU and CUDA versions: x [rows, C], weight [C], rstd [rows].
template <class X, class W, class R>
void check_rmsnorm(const char* op, std::span<X> x, std::span<W> weight, std::span<R> rstd, std::size_t rows,
                   std::size_t C) {
  check_positive(op, "C", C);
  check_size(op, "x", x, rows * C, "[rows, C] = " + dims({rows, C}));
  check_size(op, "weight", weight, C, "[C] = " + dims({C}));
  check_size(op, "rstd", rstd, rows, "[rows] = " + dims({rows}));
}

// A normalisation's eps: added under a square root, so it must be positive (a config's
// rms_norm_eps of 0 divides an all-zero row by zero) and finite.
inline void check_eps(const char* op, float eps) {
  if (!(eps > 0.0f) || eps == __builtin_huge_valf()) fail(op, "eps must be positive and finite, got " + std::to_string(eps));
}

// An attention shape: every size positive, and the key/value heads dividing the query heads.
inline void check_attention_shape(const char* op, std::size_t T, std::size_t heads, std::size_t kv_heads,
                                  std::size_t head_size) {
  check_positive(op, "T", T);
  check_positive(op, "heads", heads);
  check_positive(op, "kv_heads", kv_heads);
  check_positive(op, "head_size", head_size);
  if (heads % kv_heads != 0) {
    fail(op, "kv_heads = " + std::to_string(kv_heads) + " does not divide heads = " + std::to_string(heads) +
                 ": each key/value head serves heads / kv_heads query heads");
  }
}

// RoPE rotates pairs (i, i + hs/2) of a head.
inline void check_rope_head(const char* op, std::size_t head_size) {
  check_positive(op, "head_size", head_size);
  if (head_size % 2 != 0) {
    fail(op, "head_size = " + std::to_string(head_size) + " is odd: rotary embeddings rotate pairs (i, i + hs/2)");
  }
}

// The fused projection [B, T, (NH + 2 NKV) hs] that RoPE rotates, and its table [P >= T, hs/2].
template <class X, class Shape>
void check_rope(const char* op, const char* name, std::span<X> x, std::span<const float> cos,
                std::span<const float> sin, const Shape& s) {
  check_attention_shape(op, s.T, s.heads, s.kv_heads, s.head_size);
  check_rope_head(op, s.head_size);
  check_size(op, name, x, s.B * s.T * s.qkv_width(),
             "[B, T, (NH + 2 NKV) hs] = " + dims({s.B, s.T, s.qkv_width()}));
  const std::size_t half = s.head_size / 2;
  for (const auto& [arg, t] : {std::pair{"cos", cos}, std::pair{"sin", sin}}) {
    if (t.size() % half != 0 || t.size() / half < s.T) {
      fail(op, std::string(arg) + " has " + std::to_string(t.size()) + " elements, expected [P, hs/2] with hs/2 = " +
                   std::to_string(half) + " and P >= T = " + std::to_string(s.T));
    }
  }
  if (cos.size() != sin.size()) fail(op, "cos and sin hold different numbers of positions");
}

// A column block [first, first + cols) of a [rows, ld] matrix, and its [rows, cols] copy.
inline void check_columns(const char* op, std::size_t narrow_size, std::size_t wide_size, std::size_t rows,
                          std::size_t cols, std::size_t ld, std::size_t first) {
  check_positive(op, "cols", cols);
  if (first > ld || cols > ld - first) {
    fail(op, "columns [" + std::to_string(first) + ", " + std::to_string(first + cols) + ") lie outside the " +
                 std::to_string(ld) + " columns of wide");
  }
  if (narrow_size != rows * cols) {
    fail(op, "narrow has " + std::to_string(narrow_size) + " elements, expected " + std::to_string(rows * cols) +
                 " ([rows, cols] = " + dims({rows, cols}) + ")");
  }
  if (wide_size != rows * ld) {
    fail(op, "wide has " + std::to_string(wide_size) + " elements, expected " + std::to_string(rows * ld) +
                 " ([rows, ld] = " + dims({rows, ld}) + ")");
  }
}

// Embedding sizes (the ids are checked apart: on a device the host cannot read them). `optional`
// is the backward: the names are dout/dwte/dwpe and dwte may be empty. An empty wpe is a model
// without a position table.
inline void check_embedding_shapes(const char* op, std::size_t tokens_size, std::size_t wte_size, std::size_t wpe_size,
                                   std::size_t out_size, std::size_t B, std::size_t T, std::size_t C, std::size_t V,
                                   bool optional) {
  check_positive(op, "C", C);
  check_positive(op, "V", V);
  if (tokens_size != B * T) {
    fail(op, "tokens has " + std::to_string(tokens_size) + " elements, expected " + std::to_string(B * T) +
                 " ([B, T] = " + dims({B, T}) + ")");
  }
  const std::string dout_name = optional ? "dout" : "out";
  if (out_size != B * T * C) {
    fail(op, dout_name + " has " + std::to_string(out_size) + " elements, expected " + std::to_string(B * T * C) +
                 " ([B, T, C] = " + dims({B, T, C}) + ")");
  }
  const char* wte_name = optional ? "dwte" : "wte";
  const char* wpe_name = optional ? "dwpe" : "wpe";
  if (!(optional && wte_size == 0) && wte_size != V * C) {
    fail(op, std::string(wte_name) + " has " + std::to_string(wte_size) + " elements, expected " +
                 std::to_string(V * C) + " ([V, C] = " + dims({V, C}) + ")");
  }
  if (wpe_size != 0 && (wpe_size % C != 0 || wpe_size / C < T)) {  // empty: no position table
    fail(op, std::string(wpe_name) + " has " + std::to_string(wpe_size) + " elements, expected [P, C] with C = " +
                 std::to_string(C) + " and P >= T = " + std::to_string(T));
  }
}

[[noreturn]] inline void fail_token(const char* op, std::int32_t id, std::size_t n, std::size_t T, std::size_t V) {
  fail(op, "token id " + std::to_string(id) + " at position " + std::to_string(n) + " (b = " + std::to_string(n / T) +
               ", t = " + std::to_string(n % T) + ") is outside [0, V = " + std::to_string(V) + ")");
}

[[noreturn]] inline void fail_target(const char* op, std::int32_t id, std::size_t n, std::size_t V) {
  fail(op, "target " + std::to_string(id) + " at position " + std::to_string(n) + " is outside [0, V = " +
               std::to_string(V) + ")");
}

// Optimizer ranges must lie inside the buffer and not overlap: an element updated twice in one
// step would silently take two optimizer steps. No ranges means the whole buffer, decayed.
template <class Range>
std::vector<Range> checked_ranges(const char* op, std::span<const Range> ranges, std::size_t n) {
  if (ranges.empty()) return {Range{0, n, true}};
  std::vector<Range> sorted(ranges.begin(), ranges.end());
  std::sort(sorted.begin(), sorted.end(), [](const Range& a, const Range& b) { return a.offset < b.offset; });
  for (std::size_t i = 0; i < sorted.size(); ++i) {
    const auto& r = sorted[i];
    if (r.offset > n || r.size > n - r.offset) {
      fail(op, "range [" + std::to_string(r.offset) + ", " + std::to_string(r.offset + r.size) +
                   ") lies outside the buffer of " + std::to_string(n) + " elements");
    }
    if (i > 0 && sorted[i - 1].offset + sorted[i - 1].size > r.offset) {
      fail(op, "ranges starting at " + std::to_string(sorted[i - 1].offset) + " and " + std::to_string(r.offset) +
                   " overlap");
    }
  }
  return sorted;
}

inline void check_nonneg(const char* op, const char* name, double v) {
  if (!(v >= 0.0)) fail(op, std::string(name) + " must be >= 0, got " + std::to_string(v));
}

inline void check_beta(const char* op, const char* name, double v) {
  if (!(v >= 0.0 && v < 1.0)) fail(op, std::string(name) + " must be in [0, 1), got " + std::to_string(v));
}

}  // namespace coshard::ops::detail
