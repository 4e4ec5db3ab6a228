#include "coshard/ops/linear.hpp"

#include <cblas.h>

#include <algorithm>

#include "blas_internal.hpp"
#include "check.hpp"

namespace coshard::ops {

namespace {

struct Dims {
  int rows, in, out;
};

Dims check_dims(const char* op, std::size_t rows, std::size_t in, std::size_t out) {
  detail::check_positive(op, "in", in);
  detail::check_positive(op, "out", out);
  return {detail::blas_dim(op, "rows", rows), detail::blas_dim(op, "in", in), detail::blas_dim(op, "out", out)};
}

std::string w_shape(WeightLayout layout, std::size_t in, std::size_t out) {
  return layout == WeightLayout::in_out ? "[in, out] = " + detail::dims({in, out})
                                        : "[out, in] = " + detail::dims({out, in});
}

}  // namespace

void linear_forward(std::span<const float> x, std::span<const float> w, std::span<const float> b, std::span<float> y,
                    std::size_t rows, std::size_t in, std::size_t out, WeightLayout layout) {
  constexpr const char* op = "linear_forward";
  const Dims d = check_dims(op, rows, in, out);
  detail::check_size(op, "x", x, rows * in, "[rows, in] = " + detail::dims({rows, in}));
  detail::check_size(op, "w", w, in * out, w_shape(layout, in, out));
  detail::check_optional_size(op, "b", b, out, "[out] = " + detail::dims({out}));
  detail::check_size(op, "y", y, rows * out, "[rows, out] = " + detail::dims({rows, out}));
  detail::check_disjoint(op, "y", y, "x", x);
  detail::check_disjoint(op, "y", y, "w", w);
  if (rows == 0) return;
  detail::apply_default_blas_threads();

  // The bias goes in as GEMM's C with beta = 1: one write pass over y instead of a second
  // read-modify-write pass after the GEMM.
  float beta = 0.0f;
  if (!b.empty()) {
    for (std::size_t r = 0; r < rows; ++r) std::copy(b.begin(), b.end(), y.begin() + static_cast<std::ptrdiff_t>(r * out));
    beta = 1.0f;
  }
  if (layout == WeightLayout::in_out) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, d.rows, d.out, d.in, 1.0f, x.data(), d.in, w.data(), d.out,
                beta, y.data(), d.out);
  } else {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, d.rows, d.out, d.in, 1.0f, x.data(), d.in, w.data(), d.in,
                beta, y.data(), d.out);
  }
}

void linear_backward(std::span<const float> dy, std::span<const float> x, std::span<const float> w,
                     std::span<float> dx, std::span<float> dw, std::span<float> db, std::size_t rows, std::size_t in,
                     std::size_t out, WeightLayout layout) {
  constexpr const char* op = "linear_backward";
  const Dims d = check_dims(op, rows, in, out);
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
  if (rows == 0) return;
  detail::apply_default_blas_threads();

  const bool in_out = layout == WeightLayout::in_out;
  if (!dx.empty()) {
    // dx[rows, in] = dy[rows, out] W^T (in_out) or dy W (out_in).
    if (in_out) {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, d.rows, d.in, d.out, 1.0f, dy.data(), d.out, w.data(),
                  d.out, 0.0f, dx.data(), d.in);
    } else {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, d.rows, d.in, d.out, 1.0f, dy.data(), d.out, w.data(),
                  d.in, 0.0f, dx.data(), d.in);
    }
  }
  if (!dw.empty()) {
    // beta = 1 accumulates: dW[in, out] += x^T dy, or dW[out, in] += dy^T x.
    if (in_out) {
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, d.in, d.out, d.rows, 1.0f, x.data(), d.in, dy.data(),
                  d.out, 1.0f, dw.data(), d.out);
    } else {
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, d.out, d.in, d.rows, 1.0f, dy.data(), d.out, x.data(),
                  d.in, 1.0f, dw.data(), d.in);
    }
  }
  if (!db.empty()) {
    float* __restrict acc = db.data();
    for (std::size_t r = 0; r < rows; ++r) {
      const float* __restrict g = dy.data() + r * out;
      for (std::size_t j = 0; j < out; ++j) acc[j] += g[j];
    }
  }
}

}  // namespace coshard::ops
