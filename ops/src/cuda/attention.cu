// Causal attention with the full probability matrix att [B, NH, T, T], as the CPU version
// (attention.cpp), on qkv [B, T, (NH + 2 NKV) hs]: query head h reads key/value head h / group,
// group = NH / NKV (1: multi-head). A straightforward kernel set, not a fused/tiled one:
//   forward:  a block per query row (b, h, t): scores into the att row, masked softmax, out row.
//   backward: (1) a block per query row t of head h: dp_j = g_t . v_j, D_t = sum_j a_tj dp_j,
//                 ds_tj = a_tj (dp_j - D_t) scale, dq_t = sum_j ds_tj k_j;
//             (2) a block per key row j of key/value head kvh: over the group's query heads in
//                 order, ds_tj again for t >= j (D_t from (1)), dk_j = sum_h sum_t ds_tj q_t;
//             (3) a block per key row j of kvh: dv_j = sum_h sum_{t >= j} a_tj g_t.
// Every element of dqkv is written once and every sum has a fixed order: no atomics.
// D_t needs B*NH*T floats between (1) and (2); they are parked in dqkv's v block (element h % group
// of key/value head kvh's v slice, so group <= hs), which (3) overwrites afterwards, so the op
// needs no scratch memory.
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
  std::size_t T, NH, NKV, hs, group;
  std::size_t ld;   // (NH + 2 NKV) hs: a row of qkv
  std::size_t ldo;  // NH hs: a row of out
  float scale;
  __device__ std::size_t q(std::size_t h) const { return h * hs; }
  __device__ std::size_t k(std::size_t kvh) const { return (NH + kvh) * hs; }
  __device__ std::size_t v(std::size_t kvh) const { return (NH + NKV + kvh) * hs; }
};

__global__ void attention_forward_kernel(const float* __restrict__ qkv, float* __restrict__ out,
                                         float* __restrict__ att, Shape sh) {
  const std::size_t t = blockIdx.x;
  const std::size_t h = blockIdx.y;
  const std::size_t b = blockIdx.z;
  const std::size_t T = sh.T, hs = sh.hs, ld = sh.ld, kvh = h / sh.group;
  const float* base = qkv + b * T * ld;
  const float* q = base + t * ld + sh.q(h);
  float* a = att + ((b * sh.NH + h) * T + t) * T;

  float mx = -INFINITY;
  for (std::size_t j = threadIdx.x; j <= t; j += blockDim.x) {
    const float s = dot(q, base + j * ld + sh.k(kvh), hs) * sh.scale;
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
  float* o = out + (b * T + t) * sh.ldo + h * hs;
  for (std::size_t d = threadIdx.x; d < hs; d += blockDim.x) {
    float acc = 0.0f;
    for (std::size_t j = 0; j <= t; ++j) acc += a[j] * base[j * ld + sh.v(kvh) + d];
    o[d] = acc;
  }
}

__global__ void attention_backward_q_kernel(const float* __restrict__ dout, const float* __restrict__ qkv,
                                            const float* __restrict__ att, float* __restrict__ dqkv, Shape sh) {
  extern __shared__ float ds[];  // [t + 1]
  const std::size_t t = blockIdx.x;
  const std::size_t h = blockIdx.y;
  const std::size_t b = blockIdx.z;
  const std::size_t T = sh.T, hs = sh.hs, ld = sh.ld, kvh = h / sh.group;
  const float* base = qkv + b * T * ld;
  float* dbase = dqkv + b * T * ld;
  const float* a = att + ((b * sh.NH + h) * T + t) * T;
  const float* g = dout + (b * T + t) * sh.ldo + h * hs;

  float part = 0.0f;
  for (std::size_t j = threadIdx.x; j <= t; j += blockDim.x) {
    const float dp = dot(g, base + j * ld + sh.v(kvh), hs);
    ds[j] = dp;
    part += a[j] * dp;
  }
  const float D = block_reduce(part, SumOp{}, 0.0f);
  for (std::size_t j = threadIdx.x; j <= t; j += blockDim.x) ds[j] = a[j] * (ds[j] - D) * sh.scale;
  __syncthreads();
  float* dq = dbase + t * ld + sh.q(h);
  for (std::size_t d = threadIdx.x; d < hs; d += blockDim.x) {
    float acc = 0.0f;
    for (std::size_t j = 0; j <= t; ++j) acc += ds[j] * base[j * ld + sh.k(kvh) + d];
    dq[d] = acc;
  }
  if (threadIdx.x == 0) dbase[t * ld + sh.v(kvh) + h % sh.group] = D;  // parked for the k kernel
}

__global__ void attention_backward_k_kernel(const float* __restrict__ dout, const float* __restrict__ qkv,
                                            const float* __restrict__ att, float* __restrict__ dqkv, Shape sh) {
  extern __shared__ float ds[];  // [T - j]
  const std::size_t j = blockIdx.x;
  const std::size_t kvh = blockIdx.y;
  const std::size_t b = blockIdx.z;
  const std::size_t T = sh.T, hs = sh.hs, ld = sh.ld;
  const float* base = qkv + b * T * ld;
  float* dbase = dqkv + b * T * ld;
  const float* vj = base + j * ld + sh.v(kvh);
  float* dk = dbase + j * ld + sh.k(kvh);
  for (std::size_t h = kvh * sh.group; h < (kvh + 1) * sh.group; ++h) {
    for (std::size_t t = j + threadIdx.x; t < T; t += blockDim.x) {
      const float a = att[((b * sh.NH + h) * T + t) * T + j];
      const float dp = dot(dout + (b * T + t) * sh.ldo + h * hs, vj, hs);
      const float D = dbase[t * ld + sh.v(kvh) + h % sh.group];
      ds[t - j] = a * (dp - D) * sh.scale;
    }
    __syncthreads();
    // Element d of dk is this thread's alone: the group's heads add into it in order.
    for (std::size_t d = threadIdx.x; d < hs; d += blockDim.x) {
      float acc = 0.0f;
      for (std::size_t t = j; t < T; ++t) acc += ds[t - j] * base[t * ld + sh.q(h) + d];
      dk[d] = h == kvh * sh.group ? acc : dk[d] + acc;
    }
    __syncthreads();  // ds is rewritten for the next query head
  }
}

__global__ void attention_backward_v_kernel(const float* __restrict__ dout, const float* __restrict__ att,
                                            float* __restrict__ dqkv, Shape sh) {
  const std::size_t j = blockIdx.x;
  const std::size_t kvh = blockIdx.y;
  const std::size_t b = blockIdx.z;
  const std::size_t T = sh.T, hs = sh.hs;
  float* dv = dqkv + b * T * sh.ld + j * sh.ld + sh.v(kvh);
  for (std::size_t d = threadIdx.x; d < hs; d += blockDim.x) {
    float acc = 0.0f;
    for (std::size_t h = kvh * sh.group; h < (kvh + 1) * sh.group; ++h) {
      const float* acol = att + (b * sh.NH + h) * T * T + j;  // a_tj at acol[t * T]
      for (std::size_t t = j; t < T; ++t) acc += acol[t * T] * dout[(b * T + t) * sh.ldo + h * hs + d];
    }
    dv[d] = acc;
  }
}

Shape make_shape(std::size_t T, std::size_t NH, std::size_t NKV, std::size_t hs) {
  return {T, NH, NKV, hs, NH / NKV, (NH + 2 * NKV) * hs, NH * hs, 1.0f / sqrtf(static_cast<float>(hs))};
}

// Dynamic shared memory of T floats; past the default 48 KiB the kernel must opt in.
template <class Kernel>
cudaError_t allow_smem(Kernel kernel, std::size_t bytes) {
  if (bytes <= kDefaultSmem) return cudaSuccess;
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
}

}  // namespace

cudaError_t launch_attention_forward(const float* qkv, float* out, float* att, std::size_t B, std::size_t T,
                                     std::size_t NH, std::size_t NKV, std::size_t hs, cudaStream_t s) {
  if (B == 0 || T == 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned int>(T), static_cast<unsigned int>(NH), static_cast<unsigned int>(B));
  attention_forward_kernel<<<grid, kAttBlock, 0, s>>>(qkv, out, att, make_shape(T, NH, NKV, hs));
  return cudaGetLastError();
}

cudaError_t launch_attention_backward(const float* dout, const float* qkv, const float* att, float* dqkv,
                                      std::size_t B, std::size_t T, std::size_t NH, std::size_t NKV, std::size_t hs,
                                      cudaStream_t s) {
  if (B == 0 || T == 0) return cudaSuccess;
  const dim3 per_query(static_cast<unsigned int>(T), static_cast<unsigned int>(NH), static_cast<unsigned int>(B));
  const dim3 per_key(static_cast<unsigned int>(T), static_cast<unsigned int>(NKV), static_cast<unsigned int>(B));
  const Shape sh = make_shape(T, NH, NKV, hs);
  const std::size_t smem = T * sizeof(float);
  cudaError_t e = allow_smem(attention_backward_q_kernel, smem);
  if (e == cudaSuccess) e = allow_smem(attention_backward_k_kernel, smem);
  if (e != cudaSuccess) return e;
  attention_backward_q_kernel<<<per_query, kAttBlock, smem, s>>>(dout, qkv, att, dqkv, sh);
  if ((e = cudaGetLastError()) != cudaSuccess) return e;
  attention_backward_k_kernel<<<per_key, kAttBlock, smem, s>>>(dout, qkv, att, dqkv, sh);
  if ((e = cudaGetLastError()) != cudaSuccess) return e;
  attention_backward_v_kernel<<<per_key, kAttBlock, 0, s>>>(dout, att, dqkv, sh);
  return cudaGetLastError();
}

}  // namespace coshard::ops::cuda::detail
