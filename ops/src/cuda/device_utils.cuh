#pragma once
// Helpers shared by the kernels: launch shapes and block reductions in a fixed order (warp
// shuffles, then one warp over the per-warp results), so every result is reproducible.
#include <cuda_runtime.h>

#include <cstddef>

namespace coshard::ops::cuda::detail {

inline constexpr int kBlock = 256;
inline constexpr std::size_t kMaxGrid = 4096;  // grid-stride loops cover the rest

inline unsigned int grid_for(std::size_t n, int block = kBlock) {
  std::size_t g = (n + static_cast<std::size_t>(block) - 1) / static_cast<std::size_t>(block);
  if (g > kMaxGrid) g = kMaxGrid;
  if (g == 0) g = 1;
  return static_cast<unsigned int>(g);
}

__device__ inline std::size_t global_index() {
  return static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ inline std::size_t grid_stride() { return static_cast<std::size_t>(gridDim.x) * blockDim.x; }

struct SumOp {
  template <class T>
  __device__ T operator()(T a, T b) const {
    return a + b;
  }
};
struct MaxOp {
  template <class T>
  __device__ T operator()(T a, T b) const {
    return a > b ? a : b;
  }
};
// max that propagates NaN (torch's inf-norm does).
struct NanMaxOp {
  template <class T>
  __device__ T operator()(T a, T b) const {
    if (a != a) return a;
    if (b != b) return b;
    return a > b ? a : b;
  }
};

template <class T, class Op>
__device__ T warp_reduce(T v, Op op) {
  for (int off = 16; off > 0; off >>= 1) v = op(v, __shfl_down_sync(0xffffffffu, v, off));
  return v;
}

// Reduces v over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the
// result. `identity` fills the lanes of missing warps. Contains __syncthreads: call from all threads.
template <class T, class Op>
__device__ T block_reduce(T v, Op op, T identity) {
  __shared__ T partial[32];
  __shared__ T result;
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int warp = static_cast<int>(threadIdx.x) >> 5;
  v = warp_reduce(v, op);
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  if (warp == 0) {
    const int warps = static_cast<int>(blockDim.x) >> 5;
    T w = lane < warps ? partial[lane] : identity;
    w = warp_reduce(w, op);
    if (lane == 0) result = w;
  }
  __syncthreads();
  return result;
}

}  // namespace coshard::ops::cuda::detail
