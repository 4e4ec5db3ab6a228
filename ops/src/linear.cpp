#include "coshard/ops/linear.hpp"

#include <algorithm>
#include <cstdint>

#include "blas_internal.hpp"
#include "check.hpp"
#include "isa/gemm_bf16.hpp"

namespace coshard::ops {

namespace {

// Positive widths, and every dimension within what BLAS takes (an int).
void check_dims(const char* op, std::size_t rows, std::size_t in, std::size_t out) {
  detail::check_positive(op, "in", in);
  detail::check_positive(op, "out", out);
  detail::blas_dim(op, "rows", rows);
  detail::blas_dim(op, "in", in);
  detail::blas_dim(op, "out", out);
}

std::string w_shape(WeightLayout layout, std::size_t in, std::size_t out) {
  return layout == WeightLayout::in_out ? "[in, out] = " + detail::dims({in, out})
                                        : "[out, in] = " + detail::dims({out, in});
}

// The checks of both weight dtypes.
template <class W>
void check_forward(std::span<const float> x, std::span<const W> w, std::span<const float> b, std::span<float> y,
                   std::size_t rows, std::size_t in, std::size_t out, WeightLayout layout) {
  constexpr const char* op = "linear_forward";
  check_dims(op, rows, in, out);
  detail::check_size(op, "x", x, rows * in, "[rows, in] = " + detail::dims({rows, in}));
  detail::check_size(op, "w", w, in * out, w_shape(layout, in, out));
  detail::check_optional_size(op, "b", b, out, "[out] = " + detail::dims({out}));
  detail::check_size(op, "y", y, rows * out, "[rows, out] = " + detail::dims({rows, out}));
  detail::check_disjoint(op, "y", y, "x", x);
  detail::check_disjoint(op, "y", y, "w", w);
}

// The bias goes in as GEMM's C with beta = 1: one write pass over y instead of a second
// read-modify-write pass after the GEMM. Returns beta.
float bias_into(std::span<const float> b, std::span<float> y, std::size_t rows, std::size_t out) {
  if (b.empty()) return 0.0f;
  for (std::size_t r = 0; r < rows; ++r) std::copy(b.begin(), b.end(), y.begin() + static_cast<std::ptrdiff_t>(r * out));
  return 1.0f;
}

template <class W>
void check_backward(std::span<const float> dy, std::span<const float> x, std::span<const W> w, std::span<float> dx,
                    std::span<float> dw, std::span<float> db, std::size_t rows, std::size_t in, std::size_t out,
                    WeightLayout layout) {
  constexpr const char* op = "linear_backward";
  check_dims(op, rows, in, out);
  detail::check_size(op, "dy", dy, rows * out, "[rows, out] = " + detail::dims({rows, out}));
  detail::check_size(op, "x", x, rows * in, "[rows, in] = " + detail::dims({rows, in}));
  detail::check_size(op, "w", w, in * out, w_shape(layout, in, out));
  detail::check_optional_size(op, "dx", dx, rows * in, "[rows, in] = " + detail::dims({rows, in}));
  detail::check_optional_size(op, "dw", dw, in * out, w_shape(layout, in, out));
  detail::check_optional_size(op, "db", db, out, "[out] = " + detail::dims({out}));
  detail::check_disjoint(op, "dx", dx, "dy", dy);
  detail::check_disjoint(op, "dx", dx, "w", w);
  detail::check_disjoint(op, "dw", dw, "dy", dy);
  detail::check_disjoint(op, "dw", dw, "x", x);
  detail::check_disjoint(op, "db", db, "dy", dy);
}

// db += the column sums of dy, in f32 whatever the weights' dtype.
void bias_grad(std::span<const float> dy, std::span<float> db, std::size_t rows, std::size_t out) {
  float* __restrict acc = db.data();
  for (std::size_t r = 0; r < rows; ++r) {
    const float* __restrict g = dy.data() + r * out;
    for (std::size_t j = 0; j < out; ++j) acc[j] += g[j];
  }
}

}  // namespace

void linear_forward(std::span<const float> x, std::span<const float> w, std::span<const float> b, std::span<float> y,
                    std::size_t rows, std::size_t in, std::size_t out, WeightLayout layout) {
  check_forward(x, w, b, y, rows, in, out, layout);
  if (rows == 0) return;
  const float beta = bias_into(b, y, rows, out);
  const bool in_out = layout == WeightLayout::in_out;
  detail::sgemm(false, !in_out, rows, out, in, 1.0f, x.data(), in, w.data(), in_out ? out : in, beta, y.data(), out);
}

void linear_backward(std::span<const float> dy, std::span<const float> x, std::span<const float> w,
                     std::span<float> dx, std::span<float> dw, std::span<float> db, std::size_t rows, std::size_t in,
                     std::size_t out, WeightLayout layout) {
  check_backward(dy, x, w, dx, dw, db, rows, in, out, layout);
  if (rows == 0) return;
  const bool in_out = layout == WeightLayout::in_out;
  if (!dx.empty()) {
    // dx[rows, in] = dy[rows, out] W^T (in_out) or dy W (out_in).
    detail::sgemm(false, in_out, rows, in, out, 1.0f, dy.data(), out, w.data(), in_out ? out : in, 0.0f, dx.data(), in);
  }
  if (!dw.empty()) {
    // beta = 1 accumulates: dW[in, out] += x^T dy, or dW[out, in] += dy^T x.
    if (in_out) {
      detail::sgemm(true, false, in, out, rows, 1.0f, x.data(), in, dy.data(), out, 1.0f, dw.data(), out);
    } else {
      detail::sgemm(true, false, out, in, rows, 1.0f, dy.data(), out, x.data(), in, 1.0f, dw.data(), in);
    }
  }
  if (!db.empty()) bias_grad(dy, db, rows, out);
}

// bf16 weights: the same three products through the bf16 GEMM (isa/gemm_bf16.hpp), whose operands
// are described by their strides instead of BLAS's transpose flags.
void linear_forward(std::span<const float> x, std::span<const std::uint16_t> w, std::span<const float> b,
                    std::span<float> y, std::size_t rows, std::size_t in, std::size_t out, WeightLayout layout) {
  check_forward(x, w, b, y, rows, in, out, layout);
  if (rows == 0) return;
  const bool in_out = layout == WeightLayout::in_out;
  const float beta = bias_into(b, y, rows, out);
  // y[rows, out] = x[rows, in] W: W (k = i, j = o) at w[i * out + o] (in_out) or w[o * in + i].
  detail::gemm_bf16_for_now().run({rows, out, in, {x.data(), false, in, 1},
                                   {w.data(), true, in_out ? out : 1, in_out ? 1 : in}, y.data(), out, beta != 0.0f});
}

void linear_backward(std::span<const float> dy, std::span<const float> x, std::span<const std::uint16_t> w,
                     std::span<float> dx, std::span<float> dw, std::span<float> db, std::size_t rows, std::size_t in,
                     std::size_t out, WeightLayout layout) {
  check_backward(dy, x, w, dx, dw, db, rows, in, out, layout);
  if (rows == 0) return;
  const bool in_out = layout == WeightLayout::in_out;
  const detail::GemmBf16& gemm = detail::gemm_bf16_for_now();
  if (!dx.empty()) {
    // dx[rows, in] = dy[rows, out] W^T: W^T (k = o, j = i) at w[i * out + o] (in_out) or w[o * in + i].
    gemm.run({rows, in, out, {dy.data(), false, out, 1}, {w.data(), true, in_out ? 1 : in, in_out ? out : 1}, dx.data(),
              in, false});
  }
  if (!dw.empty()) {
    // dW[in, out] += x^T dy (in_out), or dW[out, in] += dy^T x.
    const detail::GemmOperand xt{x.data(), false, 1, in}, dyt{dy.data(), false, 1, out};
    const detail::GemmOperand xr{x.data(), false, in, 1}, dyr{dy.data(), false, out, 1};
    if (in_out) {
      gemm.run({in, out, rows, xt, dyr, dw.data(), out, true});
    } else {
      gemm.run({out, in, rows, dyt, xr, dw.data(), in, true});
    }
  }
  if (!db.empty()) bias_grad(dy, db, rows, out);
}

}  // namespace coshard::ops
