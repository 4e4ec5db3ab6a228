// Element-wise kernels: GELU, SwiGLU, RoPE, residual add / accumulate, scale, casts, the bias fill
// of linear, AdamW and SGD. Grid-stride loops; one element per thread per iteration.
#include <cstdint>

#include "coshard/kernels/cast.hpp"
#include "coshard/kernels/elementwise.hpp"
#include "device_utils.cuh"
#include "launch.hpp"

namespace coshard::ops::cuda::detail {

namespace {

// GELU and its derivative are the shared rules (coshard/kernels/elementwise.hpp): the same values
// as the CPU kernels.
__global__ void gelu_forward_kernel(const float* __restrict__ x, float* __restrict__ y, std::size_t n) {
  for (std::size_t i = global_index(); i < n; i += grid_stride()) y[i] = kernels::gelu(x[i]);
}

__global__ void gelu_backward_kernel(const float* __restrict__ dy, const float* __restrict__ x,
                                     float* __restrict__ dx, std::size_t n) {
  for (std::size_t i = global_index(); i < n; i += grid_stride()) dx[i] = dy[i] * kernels::gelu_grad(x[i]);
}

__global__ void swiglu_forward_kernel(const float* __restrict__ gate, const float* __restrict__ up,
                                      float* __restrict__ y, std::size_t n) {
  for (std::size_t i = global_index(); i < n; i += grid_stride()) y[i] = kernels::silu(gate[i]) * up[i];
}

__global__ void swiglu_backward_kernel(const float* __restrict__ dy, const float* __restrict__ gate,
                                       const float* __restrict__ up, float* __restrict__ dgate,
                                       float* __restrict__ dup, std::size_t n) {
  for (std::size_t i = global_index(); i < n; i += grid_stride()) {
    dgate[i] = dy[i] * up[i] * kernels::silu_grad(gate[i]);
    dup[i] = dy[i] * kernels::silu(gate[i]);
  }
}

// One pair (i, i + hs/2) of one rotated head of one row per element: rows of ld floats, the first
// `heads` heads of each rotated by row (r % T) of the table. As the CPU loop, no contraction.
__global__ void rope_kernel(float* __restrict__ x, const float* __restrict__ cos, const float* __restrict__ sin,
                            std::size_t rows, std::size_t T, std::size_t ld, std::size_t heads, std::size_t hs,
                            float sign) {
  const std::size_t half = hs / 2, per_row = heads * half, n = rows * per_row;
  for (std::size_t e = global_index(); e < n; e += grid_stride()) {
    const std::size_t r = e / per_row, h = e % per_row / half, i = e % half;
    float* a = x + r * ld + h * hs + i;
    const float c = cos[(r % T) * half + i], sn = sign * sin[(r % T) * half + i];
    const float ai = a[0], bi = a[half];
    a[0] = __fsub_rn(__fmul_rn(ai, c), __fmul_rn(bi, sn));
    a[half] = __fadd_rn(__fmul_rn(bi, c), __fmul_rn(ai, sn));
  }
}

// No __restrict__: out may be a or b (element i reads a[i], b[i] before writing out[i]).
__global__ void add_kernel(const float* a, const float* b, float* out, std::size_t n) {
  for (std::size_t i = global_index(); i < n; i += grid_stride()) out[i] = a[i] + b[i];
}

__global__ void accumulate_kernel(float* __restrict__ acc, const float* __restrict__ x, std::size_t n) {
  for (std::size_t i = global_index(); i < n; i += grid_stride()) acc[i] += x[i];
}

__global__ void scale_kernel(float* __restrict__ p, float v, std::size_t n) {
  for (std::size_t i = global_index(); i < n; i += grid_stride()) p[i] *= v;
}

// The scalar casts are coshard::kernels', so the CPU and CUDA casts agree bit for bit.
__global__ void f32_to_bf16_kernel(const float* __restrict__ in, std::uint16_t* __restrict__ out, std::size_t n) {
  for (std::size_t i = global_index(); i < n; i += grid_stride()) out[i] = kernels::f32_to_bf16(in[i]);
}
__global__ void bf16_to_f32_kernel(const std::uint16_t* __restrict__ in, float* __restrict__ out, std::size_t n) {
  for (std::size_t i = global_index(); i < n; i += grid_stride()) out[i] = kernels::bf16_to_f32(in[i]);
}
__global__ void f32_to_f16_kernel(const float* __restrict__ in, std::uint16_t* __restrict__ out, std::size_t n) {
  for (std::size_t i = global_index(); i < n; i += grid_stride()) out[i] = kernels::f32_to_f16(in[i]);
}
__global__ void f16_to_f32_kernel(const std::uint16_t* __restrict__ in, float* __restrict__ out, std::size_t n) {
  for (std::size_t i = global_index(); i < n; i += grid_stride()) out[i] = kernels::f16_to_f32(in[i]);
}

__global__ void fill_rows_kernel(const float* __restrict__ b, float* __restrict__ y, std::size_t rows,
                                 std::size_t cols) {
  const std::size_t n = rows * cols;
  for (std::size_t i = global_index(); i < n; i += grid_stride()) y[i] = b[i % cols];
}

// The FSDP engine's casts of parameters and gradients. Dtype codes: 0 f32, 1 bf16, 2 f16
// (launch.hpp); the scalar casts are the shared ones, as the engine's CPU loops use.
__device__ float load_as_f32(const void* p, std::size_t i, int code) {
  if (code == 0) return static_cast<const float*>(p)[i];
  const std::uint16_t h = static_cast<const std::uint16_t*>(p)[i];
  return code == 1 ? kernels::bf16_to_f32(h) : kernels::f16_to_f32(h);
}
__device__ void store_from_f32(void* p, std::size_t i, int code, float v) {
  if (code == 0) {
    static_cast<float*>(p)[i] = v;
  } else {
    static_cast<std::uint16_t*>(p)[i] = code == 1 ? kernels::f32_to_bf16(v) : kernels::f32_to_f16(v);
  }
}
__device__ float rounded(float v, int code) {
  return code == 0 ? v : code == 1 ? kernels::round_to_bf16(v) : kernels::round_to_f16(v);
}

__global__ void cast_scaled_kernel(const float* __restrict__ in, void* __restrict__ out, int code, float scale,
                                   std::size_t n) {
  for (std::size_t i = global_index(); i < n; i += grid_stride()) store_from_f32(out, i, code, __fmul_rn(in[i], scale));
}
__global__ void widen_kernel(const void* __restrict__ in, int code, float* __restrict__ out, std::size_t n) {
  for (std::size_t i = global_index(); i < n; i += grid_stride()) out[i] = load_as_f32(in, i, code);
}
__global__ void accumulate_scaled_kernel(float* __restrict__ acc, const void* __restrict__ x, int x_code, float scale,
                                         int round_code, std::size_t n) {
  for (std::size_t i = global_index(); i < n; i += grid_stride()) {
    // Rounded multiply and add, never fused (nvcc contracts by default; the CPU loop never does).
    acc[i] = __fadd_rn(acc[i], rounded(__fmul_rn(load_as_f32(x, i, x_code), scale), round_code));
  }
}
__global__ void round_through_kernel(const float* __restrict__ in, float* __restrict__ out, int code, std::size_t n) {
  for (std::size_t i = global_index(); i < n; i += grid_stride()) out[i] = rounded(in[i], code);
}

// torch's single-tensor AdamW and SGD: the shared element rules, as the CPU ops apply them.
__global__ void adamw_kernel(float* __restrict__ p, const float* __restrict__ g, float* __restrict__ m,
                             float* __restrict__ v, std::size_t n, AdamWScalars k) {
  for (std::size_t i = global_index(); i < n; i += grid_stride()) {
    float pi = p[i], mi = m[i], vi = v[i];
    kernels::adamw_update(pi, g[i], mi, vi, k);
    p[i] = pi;
    m[i] = mi;
    v[i] = vi;
  }
}

__global__ void sgd_kernel(float* __restrict__ p, const float* __restrict__ g, float* __restrict__ buf,
                           std::size_t n, SGDScalars k) {
  for (std::size_t i = global_index(); i < n; i += grid_stride()) {
    kernels::sgd_update(p[i], g[i], buf == nullptr ? nullptr : buf + i, k);
  }
}

}  // namespace

#define COSHARD_LAUNCH_1D(kernel, n, s, ...)                   \
  do {                                                         \
    if ((n) == 0) return cudaSuccess;                          \
    kernel<<<grid_for(n), kBlock, 0, (s)>>>(__VA_ARGS__);      \
    return cudaGetLastError();                                 \
  } while (0)

cudaError_t launch_gelu_forward(const float* x, float* y, std::size_t n, cudaStream_t s) {
  COSHARD_LAUNCH_1D(gelu_forward_kernel, n, s, x, y, n);
}
cudaError_t launch_gelu_backward(const float* dy, const float* x, float* dx, std::size_t n, cudaStream_t s) {
  COSHARD_LAUNCH_1D(gelu_backward_kernel, n, s, dy, x, dx, n);
}
cudaError_t launch_swiglu_forward(const float* gate, const float* up, float* y, std::size_t n, cudaStream_t s) {
  COSHARD_LAUNCH_1D(swiglu_forward_kernel, n, s, gate, up, y, n);
}
cudaError_t launch_swiglu_backward(const float* dy, const float* gate, const float* up, float* dgate, float* dup,
                                   std::size_t n, cudaStream_t s) {
  COSHARD_LAUNCH_1D(swiglu_backward_kernel, n, s, dy, gate, up, dgate, dup, n);
}
cudaError_t launch_rope(float* x, const float* cos, const float* sin, std::size_t rows, std::size_t T, std::size_t ld,
                        std::size_t heads, std::size_t hs, float sign, cudaStream_t s) {
  COSHARD_LAUNCH_1D(rope_kernel, rows * heads * (hs / 2), s, x, cos, sin, rows, T, ld, heads, hs, sign);
}
cudaError_t launch_add(const float* a, const float* b, float* out, std::size_t n, cudaStream_t s) {
  COSHARD_LAUNCH_1D(add_kernel, n, s, a, b, out, n);
}
cudaError_t launch_accumulate(float* acc, const float* x, std::size_t n, cudaStream_t s) {
  COSHARD_LAUNCH_1D(accumulate_kernel, n, s, acc, x, n);
}
cudaError_t launch_scale(float* p, float v, std::size_t n, cudaStream_t s) {
  COSHARD_LAUNCH_1D(scale_kernel, n, s, p, v, n);
}
cudaError_t launch_f32_to_bf16(const float* in, std::uint16_t* out, std::size_t n, cudaStream_t s) {
  COSHARD_LAUNCH_1D(f32_to_bf16_kernel, n, s, in, out, n);
}
cudaError_t launch_bf16_to_f32(const std::uint16_t* in, float* out, std::size_t n, cudaStream_t s) {
  COSHARD_LAUNCH_1D(bf16_to_f32_kernel, n, s, in, out, n);
}
cudaError_t launch_f32_to_f16(const float* in, std::uint16_t* out, std::size_t n, cudaStream_t s) {
  COSHARD_LAUNCH_1D(f32_to_f16_kernel, n, s, in, out, n);
}
cudaError_t launch_f16_to_f32(const std::uint16_t* in, float* out, std::size_t n, cudaStream_t s) {
  COSHARD_LAUNCH_1D(f16_to_f32_kernel, n, s, in, out, n);
}
cudaError_t launch_fill_rows(const float* b, float* y, std::size_t rows, std::size_t cols, cudaStream_t s) {
  COSHARD_LAUNCH_1D(fill_rows_kernel, rows * cols, s, b, y, rows, cols);
}
cudaError_t launch_adamw(float* p, const float* g, float* m, float* v, std::size_t n, AdamWScalars k,
                         cudaStream_t s) {
  COSHARD_LAUNCH_1D(adamw_kernel, n, s, p, g, m, v, n, k);
}
cudaError_t launch_sgd(float* p, const float* g, float* buf, std::size_t n, SGDScalars k, cudaStream_t s) {
  COSHARD_LAUNCH_1D(sgd_kernel, n, s, p, g, buf, n, k);
}

cudaError_t launch_cast_scaled(const float* in, void* out, int code, float scale, std::size_t n, cudaStream_t s) {
  COSHARD_LAUNCH_1D(cast_scaled_kernel, n, s, in, out, code, scale, n);
}
cudaError_t launch_widen(const void* in, int code, float* out, std::size_t n, cudaStream_t s) {
  COSHARD_LAUNCH_1D(widen_kernel, n, s, in, code, out, n);
}
cudaError_t launch_accumulate_scaled(float* acc, const void* x, int x_code, float scale, int round_code, std::size_t n,
                                     cudaStream_t s) {
  COSHARD_LAUNCH_1D(accumulate_scaled_kernel, n, s, acc, x, x_code, scale, round_code, n);
}
cudaError_t launch_round_through(const float* in, float* out, int code, std::size_t n, cudaStream_t s) {
  COSHARD_LAUNCH_1D(round_through_kernel, n, s, in, out, code, n);
}

#undef COSHARD_LAUNCH_1D

}  // namespace coshard::ops::cuda::detail
