// Causal multi-head attention with the full probability matrix att [B, NH, T, T], as the CPU
// version (attention.cpp). A straightforward kernel set, not a fused/tiled one:
//   forward:  a block per query row (b, h, t): scores into the att row, masked softmax, out row.
//   backward: (1) a block per query row t: dp_j = g_t . v_j, D_t = sum_j a_tj dp_j,
//                 ds_tj = a_tj (dp_j - D_t) scale, dq_t = sum_j ds_tj k_j;
//             (2) a block per key row j: ds_tj again for t >= j (D_t from (1)), dk_j = sum_t ds_tj q_t;
//             (3) a block per key row j: dv_j = sum_{t >= j} a_tj g_t.
// Every element of dqkv is written once and every sum has a fixed order: no atomics.
// D_t needs B*NH*T floats between (1) and (2); they are parked in dqkv's v block (element 0 of
// each head's v slice), which (3) overwrites afterwards, so the op needs no scratch memory.
#include "coshard/kernels/elementwise.hpp"
#include "device_utils.cuh"
#include "launch.hpp"

namespace coshard::ops::cuda::detail {

namespace {

constexpr int kAttBlock = 128;
constexpr std::size_t kDefaultSmem = 48 * 1024;

__device__ float dot(const float* __restrict__ a, const float* __restrict__ b, std::size_t n) {
  float s = 0.0f;
  for (std::size_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

struct Shape {
  std::size_t T, C, NH, hs;
  float scale;
};

__global__ void attention_forward_kernel(const float* __restrict__ qkv, float* __restrict__ out,
                                         float* __restrict__ att, Shape sh) {
  const std::size_t t = blockIdx.x;
  const std::size_t h = blockIdx.y;
  const std::size_t b = blockIdx.z;
  const std::size_t T = sh.T, C = sh.C, hs = sh.hs, C3 = 3 * sh.C;
  const float* base = qkv + b * T * C3;
  const float* q = base + t * C3 + h * hs;
  float* a = att + ((b * sh.NH + h) * T + t) * T;

  float mx = -INFINITY;
  for (std::size_t j = threadIdx.x; j <= t; j += blockDim.x) {
    const float s = dot(q, base + j * C3 + C + h * hs, hs) * sh.scale;
    a[j] = s;
    mx = fmaxf(mx, s);
  }
  mx = block_reduce(mx, MaxOp{}, -INFINITY);
  float sum = 0.0f;
  for (std::size_t j = threadIdx.x; j <= t; j += blockDim.x) {
    const float e = kernels::exp_approx(a[j] - mx);
    a[j] = e;
    sum += e;
  }
  const float inv = 1.0f / block_reduce(sum, SumOp{}, 0.0f);
  for (std::size_t j = threadIdx.x; j < T; j += blockDim.x) a[j] = j <= t ? a[j] * inv : 0.0f;
  __syncthreads();  // the att row, written by all threads, is read by all below
  float* o = out + (b * T + t) * C + h * hs;
  for (std::size_t d = threadIdx.x; d < hs; d += blockDim.x) {
    float acc = 0.0f;
    for (std::size_t j = 0; j <= t; ++j) acc += a[j] * base[j * C3 + 2 * C + h * hs + d];
    o[d] = acc;
  }
}

__global__ void attention_backward_q_kernel(const float* __restrict__ dout, const float* __restrict__ qkv,
                                            const float* __restrict__ att, float* __restrict__ dqkv, Shape sh) {
  extern __shared__ float ds[];  // [t + 1]
  const std::size_t t = blockIdx.x;
  const std::size_t h = blockIdx.y;
  const std::size_t b = blockIdx.z;
  const std::size_t T = sh.T, C = sh.C, hs = sh.hs, C3 = 3 * sh.C;
  const float* base = qkv + b * T * C3;
  float* dbase = dqkv + b * T * C3;
  const float* a = att + ((b * sh.NH + h) * T + t) * T;
  const float* g = dout + (b * T + t) * C + h * hs;

  float part = 0.0f;
  for (std::size_t j = threadIdx.x; j <= t; j += blockDim.x) {
    const float dp = dot(g, base + j * C3 + 2 * C + h * hs, hs);
    ds[j] = dp;
    part += a[j] * dp;
  }
  const float D = block_reduce(part, SumOp{}, 0.0f);
  for (std::size_t j = threadIdx.x; j <= t; j += blockDim.x) ds[j] = a[j] * (ds[j] - D) * sh.scale;
  __syncthreads();
  float* dq = dbase + t * C3 + h * hs;
  for (std::size_t d = threadIdx.x; d < hs; d += blockDim.x) {
    float acc = 0.0f;
    for (std::size_t j = 0; j <= t; ++j) acc += ds[j] * base[j * C3 + C + h * hs + d];
    dq[d] = acc;
  }
  if (threadIdx.x == 0) dbase[t * C3 + 2 * C + h * hs] = D;  // parked for the k kernel
}

__global__ void attention_backward_k_kernel(const float* __restrict__ dout, const float* __restrict__ qkv,
                                            const float* __restrict__ att, float* __restrict__ dqkv, Shape sh) {
  extern __shared__ float ds[];  // [T - j]
  const std::size_t j = blockIdx.x;
  const std::size_t h = blockIdx.y;
  const std::size_t b = blockIdx.z;
  const std::size_t T = sh.T, C = sh.C, hs = sh.hs, C3 = 3 * sh.C;
  const float* base = qkv + b * T * C3;
  float* dbase = dqkv + b * T * C3;
  const float* vj = base + j * C3 + 2 * C + h * hs;
  for (std::size_t t = j + threadIdx.x; t < T; t += blockDim.x) {
    const float a = att[((b * sh.NH + h) * T + t) * T + j];
    const float dp = dot(dout + (b * T + t) * C + h * hs, vj, hs);
    const float D = dbase[t * C3 + 2 * C + h * hs];
    ds[t - j] = a * (dp - D) * sh.scale;
  }
  __syncthreads();
  float* dk = dbase + j * C3 + C + h * hs;
  for (std::size_t d = threadIdx.x; d < hs; d += blockDim.x) {
    float acc = 0.0f;
    for (std::size_t t = j; t < T; ++t) acc += ds[t - j] * base[t * C3 + h * hs + d];
    dk[d] = acc;
  }
}

__global__ void attention_backward_v_kernel(const float* __restrict__ dout, const float* __restrict__ att,
                                            float* __restrict__ dqkv, Shape sh) {
  const std::size_t j = blockIdx.x;
  const std::size_t h = blockIdx.y;
  const std::size_t b = blockIdx.z;
  const std::size_t T = sh.T, C = sh.C, hs = sh.hs, C3 = 3 * sh.C;
  float* dv = dqkv + b * T * C3 + j * C3 + 2 * C + h * hs;
  const float* acol = att + (b * sh.NH + h) * T * T + j;  // a_tj at acol[t * T]
  for (std::size_t d = threadIdx.x; d < hs; d += blockDim.x) {
    float acc = 0.0f;
    for (std::size_t t = j; t < T; ++t) acc += acol[t * T] * dout[(b * T + t) * C + h * hs + d];
    dv[d] = acc;
  }
}

Shape make_shape(std::size_t T, std::size_t C, std::size_t NH) {
  const std::size_t hs = C / NH;
  return {T, C, NH, hs, 1.0f / sqrtf(static_cast<float>(hs))};
}

// Dynamic shared memory of T floats; past the default 48 KiB the kernel must opt in.
template <class Kernel>
cudaError_t allow_smem(Kernel kernel, std::size_t bytes) {
  if (bytes <= kDefaultSmem) return cudaSuccess;
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
}

}  // namespace

cudaError_t launch_attention_forward(const float* qkv, float* out, float* att, std::size_t B, std::size_t T,
                                     std::size_t C, std::size_t NH, cudaStream_t s) {
  if (B == 0 || T == 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned int>(T), static_cast<unsigned int>(NH), static_cast<unsigned int>(B));
  attention_forward_kernel<<<grid, kAttBlock, 0, s>>>(qkv, out, att, make_shape(T, C, NH));
  return cudaGetLastError();
}

cudaError_t launch_attention_backward(const float* dout, const float* qkv, const float* att, float* dqkv,
                                      std::size_t B, std::size_t T, std::size_t C, std::size_t NH, cudaStream_t s) {
  if (B == 0 || T == 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned int>(T), static_cast<unsigned int>(NH), static_cast<unsigned int>(B));
  const Shape sh = make_shape(T, C, NH);
  const std::size_t smem = T * sizeof(float);
  cudaError_t e = allow_smem(attention_backward_q_kernel, smem);
  if (e == cudaSuccess) e = allow_smem(attention_backward_k_kernel, smem);
  if (e != cudaSuccess) return e;
  attention_backward_q_kernel<<<grid, kAttBlock, smem, s>>>(dout, qkv, att, dqkv, sh);
  if ((e = cudaGetLastError()) != cudaSuccess) return e;
  attention_backward_k_kernel<<<grid, kAttBlock, smem, s>>>(dout, qkv, att, dqkv, sh);
  if ((e = cudaGetLastError()) != cudaSuccess) return e;
  attention_backward_v_kernel<<<grid, kAttBlock, 0, s>>>(dout, att, dqkv, sh);
  return cudaGetLastError();
}

}  // namespace coshard::ops::cuda::detail
