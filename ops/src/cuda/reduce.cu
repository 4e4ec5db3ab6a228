// Reductions: layernorm and RMSNorm forward/backward (a block per row), column sums for parameter gradients
// (a fixed split of the rows, so the sums are reproducible), and gradient-norm partials.
#include "device_utils.cuh"
#include "launch.hpp"

namespace coshard::ops::cuda::detail {

namespace {

constexpr int kRowBlock = 256;
// Column sums: 32 columns per block (coalesced), kLanes row lanes, each summing every kLanes-th row.
constexpr int kLanes = 16;

__global__ void layernorm_forward_kernel(const float* __restrict__ x, const float* __restrict__ w,
                                         const float* __restrict__ b, float* __restrict__ y,
                                         float* __restrict__ mean, float* __restrict__ rstd, std::size_t C,
                                         float eps) {
  const std::size_t r = blockIdx.x;
  const float* xr = x + r * C;
  float* yr = y + r * C;
  const float inv_c = 1.0f / static_cast<float>(C);
  float s = 0.0f;
  for (std::size_t i = threadIdx.x; i < C; i += blockDim.x) s += xr[i];
  const float m = block_reduce(s, SumOp{}, 0.0f) * inv_c;
  // Two passes, as on the CPU: E[x^2] - E[x]^2 cancels for rows with a large mean.
  float v = 0.0f;
  for (std::size_t i = threadIdx.x; i < C; i += blockDim.x) {
    const float d = xr[i] - m;
    v += d * d;
  }
  const float var = block_reduce(v, SumOp{}, 0.0f) * inv_c;
  const float rs = 1.0f / sqrtf(var + eps);
  for (std::size_t i = threadIdx.x; i < C; i += blockDim.x) yr[i] = (xr[i] - m) * rs * w[i] + b[i];
  if (threadIdx.x == 0) {
    mean[r] = m;
    rstd[r] = rs;
  }
}

__global__ void layernorm_backward_dx_kernel(const float* __restrict__ dy, const float* __restrict__ x,
                                             const float* __restrict__ w, const float* __restrict__ mean,
                                             const float* __restrict__ rstd, float* __restrict__ dx, std::size_t C) {
  const std::size_t r = blockIdx.x;
  const float* xr = x + r * C;
  const float* g = dy + r * C;
  float* dxr = dx + r * C;
  const float m = mean[r];
  const float s = rstd[r];
  const float inv_c = 1.0f / static_cast<float>(C);
  float sum_dn = 0.0f;
  float sum_dn_n = 0.0f;
  for (std::size_t i = threadIdx.x; i < C; i += blockDim.x) {
    const float n = (xr[i] - m) * s;
    const float dn = g[i] * w[i];
    sum_dn += dn;
    sum_dn_n += dn * n;
  }
  const float mean_dn = block_reduce(sum_dn, SumOp{}, 0.0f) * inv_c;
  const float mean_dn_n = block_reduce(sum_dn_n, SumOp{}, 0.0f) * inv_c;
  for (std::size_t i = threadIdx.x; i < C; i += blockDim.x) {
    const float n = (xr[i] - m) * s;
    dxr[i] = s * (g[i] * w[i] - mean_dn - n * mean_dn_n);
  }
}

// Sums the lanes of a [kLanes][33] tile in lane order and adds the result to out[col].
__device__ void add_lanes(float (*tile)[33], float* out, std::size_t col, std::size_t cols) {
  __syncthreads();
  if (threadIdx.y == 0 && col < cols) {
    float acc = 0.0f;
    for (int l = 0; l < kLanes; ++l) acc += tile[l][threadIdx.x];
    out[col] += acc;
  }
  __syncthreads();
}

__global__ void layernorm_params_kernel(const float* __restrict__ dy, const float* __restrict__ x,
                                        const float* __restrict__ mean, const float* __restrict__ rstd,
                                        float* __restrict__ dw, float* __restrict__ db, std::size_t rows,
                                        std::size_t C) {
  __shared__ float tw[kLanes][33];
  __shared__ float tb[kLanes][33];
  const std::size_t col = static_cast<std::size_t>(blockIdx.x) * 32 + threadIdx.x;
  float sw = 0.0f;
  float sb = 0.0f;
  if (col < C) {
    for (std::size_t r = threadIdx.y; r < rows; r += kLanes) {
      const float g = dy[r * C + col];
      sw += g * (x[r * C + col] - mean[r]) * rstd[r];
      sb += g;
    }
  }
  tw[threadIdx.y][threadIdx.x] = sw;
  tb[threadIdx.y][threadIdx.x] = sb;
  if (dw != nullptr) add_lanes(tw, dw, col, C);
  if (db != nullptr) add_lanes(tb, db, col, C);
}

__global__ void rmsnorm_forward_kernel(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ y,
                                       float* __restrict__ rstd, std::size_t C, float eps) {
  const std::size_t r = blockIdx.x;
  const float* xr = x + r * C;
  float* yr = y + r * C;
  float s = 0.0f;
  for (std::size_t i = threadIdx.x; i < C; i += blockDim.x) s += xr[i] * xr[i];
  const float rs = 1.0f / sqrtf(block_reduce(s, SumOp{}, 0.0f) / static_cast<float>(C) + eps);
  for (std::size_t i = threadIdx.x; i < C; i += blockDim.x) yr[i] = w[i] * (xr[i] * rs);
  if (threadIdx.x == 0) rstd[r] = rs;
}

__global__ void rmsnorm_backward_dx_kernel(const float* __restrict__ dy, const float* __restrict__ x,
                                           const float* __restrict__ w, const float* __restrict__ rstd,
                                           float* __restrict__ dx, std::size_t C) {
  const std::size_t r = blockIdx.x;
  const float* xr = x + r * C;
  const float* g = dy + r * C;
  float* dxr = dx + r * C;
  const float s = rstd[r];
  float sum_dn_n = 0.0f;
  for (std::size_t i = threadIdx.x; i < C; i += blockDim.x) sum_dn_n += g[i] * w[i] * (xr[i] * s);
  const float mean_dn_n = block_reduce(sum_dn_n, SumOp{}, 0.0f) / static_cast<float>(C);
  for (std::size_t i = threadIdx.x; i < C; i += blockDim.x) dxr[i] = s * (g[i] * w[i] - (xr[i] * s) * mean_dn_n);
}

__global__ void rmsnorm_weight_kernel(const float* __restrict__ dy, const float* __restrict__ x,
                                      const float* __restrict__ rstd, float* __restrict__ dw, std::size_t rows,
                                      std::size_t C) {
  __shared__ float tile[kLanes][33];
  const std::size_t col = static_cast<std::size_t>(blockIdx.x) * 32 + threadIdx.x;
  float sw = 0.0f;
  if (col < C) {
    for (std::size_t r = threadIdx.y; r < rows; r += kLanes) sw += dy[r * C + col] * (x[r * C + col] * rstd[r]);
  }
  tile[threadIdx.y][threadIdx.x] = sw;
  add_lanes(tile, dw, col, C);
}

__global__ void column_sum_kernel(const float* __restrict__ dy, float* __restrict__ db, std::size_t rows,
                                  std::size_t cols) {
  __shared__ float tile[kLanes][33];
  const std::size_t col = static_cast<std::size_t>(blockIdx.x) * 32 + threadIdx.x;
  float s = 0.0f;
  if (col < cols) {
    for (std::size_t r = threadIdx.y; r < rows; r += kLanes) s += dy[r * cols + col];
  }
  tile[threadIdx.y][threadIdx.x] = s;
  add_lanes(tile, db, col, cols);
}

constexpr std::size_t kNormMaxBlocks = 256;

__global__ void norm_blocks_kernel(const float* __restrict__ p, std::size_t n, int type, double* __restrict__ out) {
  double acc = 0.0;
  float mx = 0.0f;
  for (std::size_t i = global_index(); i < n; i += grid_stride()) {
    const float v = p[i];
    if (type == 0) {
      acc += static_cast<double>(v) * static_cast<double>(v);
    } else if (type == 1) {
      acc += fabs(static_cast<double>(v));
    } else {
      mx = NanMaxOp{}(mx, fabsf(v));
    }
  }
  double r;
  if (type == 2) {
    r = block_reduce(static_cast<double>(mx), NanMaxOp{}, 0.0);
  } else {
    r = block_reduce(acc, SumOp{}, 0.0);
  }
  if (threadIdx.x == 0) out[blockIdx.x] = r;
}

__global__ void norm_finish_kernel(const double* __restrict__ partials, std::size_t count, int type,
                                   double* __restrict__ out) {
  double acc = 0.0;
  for (std::size_t i = threadIdx.x; i < count; i += blockDim.x) {
    acc = type == 2 ? NanMaxOp{}(acc, partials[i]) : acc + partials[i];
  }
  const double r = type == 2 ? block_reduce(acc, NanMaxOp{}, 0.0) : block_reduce(acc, SumOp{}, 0.0);
  if (threadIdx.x == 0) *out = r;
}

}  // namespace

cudaError_t launch_layernorm_forward(const float* x, const float* w, const float* b, float* y, float* mean,
                                     float* rstd, std::size_t rows, std::size_t C, float eps, cudaStream_t s) {
  if (rows == 0) return cudaSuccess;
  layernorm_forward_kernel<<<static_cast<unsigned int>(rows), kRowBlock, 0, s>>>(x, w, b, y, mean, rstd, C, eps);
  return cudaGetLastError();
}

cudaError_t launch_layernorm_backward_dx(const float* dy, const float* x, const float* w, const float* mean,
                                         const float* rstd, float* dx, std::size_t rows, std::size_t C,
                                         cudaStream_t s) {
  if (rows == 0) return cudaSuccess;
  layernorm_backward_dx_kernel<<<static_cast<unsigned int>(rows), kRowBlock, 0, s>>>(dy, x, w, mean, rstd, dx, C);
  return cudaGetLastError();
}

cudaError_t launch_layernorm_backward_params(const float* dy, const float* x, const float* mean, const float* rstd,
                                             float* dw, float* db, std::size_t rows, std::size_t C, cudaStream_t s) {
  if (rows == 0 || C == 0 || (dw == nullptr && db == nullptr)) return cudaSuccess;
  const auto blocks = static_cast<unsigned int>((C + 31) / 32);
  layernorm_params_kernel<<<blocks, dim3(32, kLanes), 0, s>>>(dy, x, mean, rstd, dw, db, rows, C);
  return cudaGetLastError();
}

cudaError_t launch_rmsnorm_forward(const float* x, const float* w, float* y, float* rstd, std::size_t rows,
                                   std::size_t C, float eps, cudaStream_t s) {
  if (rows == 0) return cudaSuccess;
  rmsnorm_forward_kernel<<<static_cast<unsigned int>(rows), kRowBlock, 0, s>>>(x, w, y, rstd, C, eps);
  return cudaGetLastError();
}

cudaError_t launch_rmsnorm_backward(const float* dy, const float* x, const float* w, const float* rstd, float* dx,
                                    float* dw, std::size_t rows, std::size_t C, cudaStream_t s) {
  if (rows == 0) return cudaSuccess;
  rmsnorm_backward_dx_kernel<<<static_cast<unsigned int>(rows), kRowBlock, 0, s>>>(dy, x, w, rstd, dx, C);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess || dw == nullptr || C == 0) return e;
  rmsnorm_weight_kernel<<<static_cast<unsigned int>((C + 31) / 32), dim3(32, kLanes), 0, s>>>(dy, x, rstd, dw, rows, C);
  return cudaGetLastError();
}

cudaError_t launch_column_sum(const float* dy, float* db, std::size_t rows, std::size_t cols, cudaStream_t s) {
  if (rows == 0 || cols == 0) return cudaSuccess;
  const auto blocks = static_cast<unsigned int>((cols + 31) / 32);
  column_sum_kernel<<<blocks, dim3(32, kLanes), 0, s>>>(dy, db, rows, cols);
  return cudaGetLastError();
}

std::size_t norm_blocks(std::size_t n) {
  if (n == 0) return 0;
  const std::size_t g = (n + kBlock - 1) / kBlock;
  return g < kNormMaxBlocks ? g : kNormMaxBlocks;
}

cudaError_t launch_norm_blocks(const float* p, std::size_t n, int type, double* scratch, cudaStream_t s) {
  const std::size_t blocks = norm_blocks(n);
  if (blocks == 0) return cudaSuccess;
  norm_blocks_kernel<<<static_cast<unsigned int>(blocks), kBlock, 0, s>>>(p, n, type, scratch);
  return cudaGetLastError();
}

cudaError_t launch_norm_finish(const double* scratch, std::size_t count, int type, double* out, cudaStream_t s) {
  norm_finish_kernel<<<1, kBlock, 0, s>>>(scratch, count, type, out);
  return cudaGetLastError();
}

}  // namespace coshard::ops::cuda::detail
