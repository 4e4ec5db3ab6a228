// cuBLAS handle and the linear layer on CUDA.
//
// Row-major to column-major: cuBLAS is column-major, and a row-major [r, c] buffer read as
// column-major is its transpose [c, r] with leading dimension c. So the row-major product
// Y[m, n] = A[m, k] B[k, n] is issued as the column-major Y^T[n, m] = B^T[n, k] A^T[k, m]:
// operands swapped, each one's row-major "transpose?" flag kept, and m/n swapped.
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>
#include <utility>

#include "../check.hpp"
#include "coshard/ops/cuda_ops.hpp"
#include "cuda_check.hpp"
#include "launch.hpp"
#include "scratch.hpp"

namespace coshard::ops::cuda {

namespace {

cublasHandle_t native(Blas& blas) { return static_cast<cublasHandle_t>(blas.native()); }
cudaStream_t stream_of(Blas& blas) { return static_cast<cudaStream_t>(blas.stream()); }

struct Dims {
  int rows, in, out;
};

Dims check_dims(const char* op, std::size_t rows, std::size_t in, std::size_t out) {
  ops::detail::check_positive(op, "in", in);
  ops::detail::check_positive(op, "out", out);
  return {ops::detail::blas_dim(op, "rows", rows), ops::detail::blas_dim(op, "in", in),
          ops::detail::blas_dim(op, "out", out)};
}

std::string w_shape(WeightLayout layout, std::size_t in, std::size_t out) {
  return layout == WeightLayout::in_out ? "[in, out] = " + ops::detail::dims({in, out})
                                        : "[out, in] = " + ops::detail::dims({out, in});
}

}  // namespace

Blas::Blas(void* stream) : stream_(stream) {
  cublasHandle_t h = nullptr;
  COSHARD_CUBLAS_CHECK(cublasCreate(&h));
  handle_ = h;
  try {
    COSHARD_CUBLAS_CHECK(cublasSetStream(h, static_cast<cudaStream_t>(stream)));
    COSHARD_CUBLAS_CHECK(cublasSetMathMode(h, CUBLAS_DEFAULT_MATH));  // fp32 GEMMs in fp32, no TF32
  } catch (...) {
    cublasDestroy(h);
    handle_ = nullptr;
    throw;
  }
}

Blas::Blas(Blas&& other) noexcept
    : handle_(std::exchange(other.handle_, nullptr)), stream_(std::exchange(other.stream_, nullptr)) {}

Blas& Blas::operator=(Blas&& other) noexcept {
  if (this != &other) {
    if (handle_ != nullptr) cublasDestroy(static_cast<cublasHandle_t>(handle_));
    handle_ = std::exchange(other.handle_, nullptr);
    stream_ = std::exchange(other.stream_, nullptr);
  }
  return *this;
}

Blas::~Blas() {
  if (handle_ != nullptr) cublasDestroy(static_cast<cublasHandle_t>(handle_));  // nothing to do on failure
}

void Blas::set_stream(void* stream) {
  if (handle_ == nullptr) throw Error(Errc::invalid_argument, "Blas::set_stream: the handle was moved from");
  COSHARD_CUBLAS_CHECK(cublasSetStream(static_cast<cublasHandle_t>(handle_), static_cast<cudaStream_t>(stream)));
  stream_ = stream;
}

namespace {

// One column-major GEMM C = op(A) op(B) + beta C: f32 operands through cublasSgemm (no TF32), bf16
// ones through cublasGemmEx with f32 sums (each bf16 x bf16 product is exact in f32, as in the CPU
// bf16 GEMM).
void gemm(Blas& blas, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const void* A, int lda,
          const void* B, int ldb, float beta, float* C, int ldc, bool bf16) {
  const float one = 1.0f;
  if (!bf16) {
    COSHARD_CUBLAS_CHECK(cublasSgemm(native(blas), ta, tb, m, n, k, &one, static_cast<const float*>(A), lda,
                                     static_cast<const float*>(B), ldb, &beta, C, ldc));
    return;
  }
  COSHARD_CUBLAS_CHECK(cublasGemmEx(native(blas), ta, tb, m, n, k, &one, A, CUDA_R_16BF, lda, B, CUDA_R_16BF, ldb,
                                    &beta, C, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

template <class W>
Dims check_forward(Blas& blas, std::span<const float> x, std::span<const W> w, std::span<const float> b,
                   std::span<float> y, std::size_t rows, std::size_t in, std::size_t out, WeightLayout layout) {
  constexpr const char* op = "linear_forward";
  const Dims d = check_dims(op, rows, in, out);
  ops::detail::check_size(op, "x", x, rows * in, "[rows, in] = " + ops::detail::dims({rows, in}));
  ops::detail::check_size(op, "w", w, in * out, w_shape(layout, in, out));
  ops::detail::check_optional_size(op, "b", b, out, "[out] = " + ops::detail::dims({out}));
  ops::detail::check_size(op, "y", y, rows * out, "[rows, out] = " + ops::detail::dims({rows, out}));
  ops::detail::check_disjoint(op, "y", y, "x", x);
  ops::detail::check_disjoint(op, "y", y, "w", w);
  if (blas.native() == nullptr) ops::detail::fail(op, "the Blas handle was moved from");
  return d;
}

// y = x W + b with x and W as the GEMM reads them (both f32, or both bf16).
void forward_gemm(Blas& blas, const void* x, const void* w, std::span<const float> b, std::span<float> y, Dims d,
                  WeightLayout layout, bool bf16) {
  // The bias goes in as GEMM's C with beta = 1, as on the CPU.
  float beta = 0.0f;
  if (!b.empty()) {
    COSHARD_OPS_CUDA_CHECK(detail::launch_fill_rows(b.data(), y.data(), static_cast<std::size_t>(d.rows),
                                                    static_cast<std::size_t>(d.out), stream_of(blas)));
    beta = 1.0f;
  }
  if (layout == WeightLayout::in_out) {
    // y[rows, out] = x[rows, in] W[in, out]  ->  y^T = W^T x^T (both as stored).
    gemm(blas, CUBLAS_OP_N, CUBLAS_OP_N, d.out, d.rows, d.in, w, d.out, x, d.in, beta, y.data(), d.out, bf16);
  } else {
    // y = x W^T with W[out, in]  ->  y^T = W x^T; W as stored is W^T[in, out] column-major.
    gemm(blas, CUBLAS_OP_T, CUBLAS_OP_N, d.out, d.rows, d.in, w, d.in, x, d.in, beta, y.data(), d.out, bf16);
  }
}

template <class W>
Dims check_backward(Blas& blas, std::span<const float> dy, std::span<const float> x, std::span<const W> w,
                    std::span<float> dx, std::span<float> dw, std::span<float> db, std::size_t rows, std::size_t in,
                    std::size_t out, WeightLayout layout) {
  constexpr const char* op = "linear_backward";
  const Dims d = check_dims(op, rows, in, out);
  ops::detail::check_size(op, "dy", dy, rows * out, "[rows, out] = " + ops::detail::dims({rows, out}));
  ops::detail::check_size(op, "x", x, rows * in, "[rows, in] = " + ops::detail::dims({rows, in}));
  ops::detail::check_size(op, "w", w, in * out, w_shape(layout, in, out));
  ops::detail::check_optional_size(op, "dx", dx, rows * in, "[rows, in] = " + ops::detail::dims({rows, in}));
  ops::detail::check_optional_size(op, "dw", dw, in * out, w_shape(layout, in, out));
  ops::detail::check_optional_size(op, "db", db, out, "[out] = " + ops::detail::dims({out}));
  ops::detail::check_disjoint(op, "dx", dx, "dy", dy);
  ops::detail::check_disjoint(op, "dx", dx, "w", w);
  ops::detail::check_disjoint(op, "dw", dw, "dy", dy);
  ops::detail::check_disjoint(op, "dw", dw, "x", x);
  ops::detail::check_disjoint(op, "db", db, "dy", dy);
  if (blas.native() == nullptr) ops::detail::fail(op, "the Blas handle was moved from");
  return d;
}

// dx = dy W^T (written) and dW += x^T dy, with dy, x and W as the GEMMs read them (f32, or bf16).
void backward_gemms(Blas& blas, const void* dy, const void* x, const void* w, std::span<float> dx, std::span<float> dw,
                    Dims d, WeightLayout layout, bool bf16) {
  const bool in_out = layout == WeightLayout::in_out;
  if (!dx.empty()) {
    if (in_out) {
      // dx[rows, in] = dy W^T  ->  dx^T[in, rows] = W[in, out] dy^T; W as stored is W^T: transpose it.
      gemm(blas, CUBLAS_OP_T, CUBLAS_OP_N, d.in, d.rows, d.out, w, d.out, dy, d.out, 0.0f, dx.data(), d.in, bf16);
    } else {
      // dx = dy W with W[out, in]  ->  dx^T = W^T dy^T; W as stored is W^T[in, out].
      gemm(blas, CUBLAS_OP_N, CUBLAS_OP_N, d.in, d.rows, d.out, w, d.in, dy, d.out, 0.0f, dx.data(), d.in, bf16);
    }
  }
  if (!dw.empty()) {
    // beta = 1 accumulates.
    if (in_out) {
      // dW[in, out] += x^T dy  ->  dW^T[out, in] += dy^T[out, rows] x[rows, in].
      gemm(blas, CUBLAS_OP_N, CUBLAS_OP_T, d.out, d.in, d.rows, dy, d.out, x, d.in, 1.0f, dw.data(), d.out, bf16);
    } else {
      // dW[out, in] += dy^T x  ->  dW^T[in, out] += x^T[in, rows] dy[rows, out].
      gemm(blas, CUBLAS_OP_N, CUBLAS_OP_T, d.in, d.out, d.rows, x, d.in, dy, d.out, 1.0f, dw.data(), d.in, bf16);
    }
  }
}

// `v` rounded to bf16 into stream-ordered scratch, freed on the stream after the GEMMs that read it.
class Bf16Copy {
 public:
  Bf16Copy(std::span<const float> v, cudaStream_t s) : bits_(v.size(), s) {
    COSHARD_OPS_CUDA_CHECK(detail::launch_f32_to_bf16(v.data(), bits_.get(), v.size(), s));
  }
  const void* get() const noexcept { return bits_.get(); }

 private:
  detail::StreamScratch<std::uint16_t> bits_;
};

}  // namespace

void linear_forward(Blas& blas, std::span<const float> x, std::span<const float> w, std::span<const float> b,
                    std::span<float> y, std::size_t rows, std::size_t in, std::size_t out, WeightLayout layout) {
  const Dims d = check_forward(blas, x, w, b, y, rows, in, out, layout);
  if (rows == 0) return;
  forward_gemm(blas, x.data(), w.data(), b, y, d, layout, false);
}

void linear_forward(Blas& blas, std::span<const float> x, std::span<const std::uint16_t> w, std::span<const float> b,
                    std::span<float> y, std::size_t rows, std::size_t in, std::size_t out, WeightLayout layout) {
  const Dims d = check_forward(blas, x, w, b, y, rows, in, out, layout);
  if (rows == 0) return;
  const Bf16Copy xb(x, stream_of(blas));
  forward_gemm(blas, xb.get(), w.data(), b, y, d, layout, true);
}

void linear_backward(Blas& blas, std::span<const float> dy, std::span<const float> x, std::span<const float> w,
                     std::span<float> dx, std::span<float> dw, std::span<float> db, std::size_t rows, std::size_t in,
                     std::size_t out, WeightLayout layout) {
  const Dims d = check_backward(blas, dy, x, w, dx, dw, db, rows, in, out, layout);
  if (rows == 0) return;
  backward_gemms(blas, dy.data(), x.data(), w.data(), dx, dw, d, layout, false);
  if (!db.empty()) {
    COSHARD_OPS_CUDA_CHECK(detail::launch_column_sum(dy.data(), db.data(), rows, out, stream_of(blas)));
  }
}

void linear_backward(Blas& blas, std::span<const float> dy, std::span<const float> x, std::span<const std::uint16_t> w,
                     std::span<float> dx, std::span<float> dw, std::span<float> db, std::size_t rows, std::size_t in,
                     std::size_t out, WeightLayout layout) {
  const Dims d = check_backward(blas, dy, x, w, dx, dw, db, rows, in, out, layout);
  if (rows == 0) return;
  const cudaStream_t s = stream_of(blas);
  const Bf16Copy dyb(dy, s);
  if (dw.empty()) {
    backward_gemms(blas, dyb.get(), nullptr, w.data(), dx, dw, d, layout, true);
  } else {
    const Bf16Copy xb(x, s);
    backward_gemms(blas, dyb.get(), xb.get(), w.data(), dx, dw, d, layout, true);
  }
  // db sums dy unrounded, as on the CPU.
  if (!db.empty()) COSHARD_OPS_CUDA_CHECK(detail::launch_column_sum(dy.data(), db.data(), rows, out, s));
}

}  // namespace coshard::ops::cuda
