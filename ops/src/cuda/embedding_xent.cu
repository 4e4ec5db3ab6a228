// Kernels that read ids (token and target): embedding forward/backward and softmax cross-entropy.
// The host cannot see the ids, so a kernel that meets an id outside [0, V) records the smallest
// such position in a device flag (atomicMin) and leaves memory it would index with it alone; the
// host wrapper reads the flag after the kernel and throws.
#include <cstdint>

#include "coshard/kernels/cast.hpp"
#include "coshard/kernels/elementwise.hpp"
#include "device_utils.cuh"
#include "launch.hpp"

namespace coshard::ops::cuda::detail {

namespace {

__device__ bool bad_id(std::int32_t id, std::size_t V) {
  return id < 0 || static_cast<std::size_t>(id) >= V;
}

__device__ void report(unsigned int* bad, std::size_t pos) {
  atomicMin(bad, static_cast<unsigned int>(pos));
}

__global__ void check_ids_kernel(const std::int32_t* __restrict__ ids, std::size_t n, std::size_t V,
                                 unsigned int* bad) {
  for (std::size_t i = global_index(); i < n; i += grid_stride()) {
    if (bad_id(ids[i], V)) report(bad, i);
  }
}

__device__ inline float table_value(float v) { return v; }
__device__ inline float table_value(std::uint16_t bits) { return kernels::bf16_to_f32(bits); }  // exact

// Tables of f32, or of bf16 (mixed precision's all-gathered bits, widened exactly, as on the CPU).
template <class Table>
__global__ void embedding_forward_kernel(const std::int32_t* __restrict__ tokens, const Table* __restrict__ wte,
                                         const Table* __restrict__ wpe, float* __restrict__ out, std::size_t T,
                                         std::size_t C, std::size_t V, std::size_t total, unsigned int* bad) {
  for (std::size_t i = global_index(); i < total; i += grid_stride()) {
    const std::size_t n = i / C;
    const std::size_t c = i - n * C;
    const std::int32_t id = tokens[n];
    if (bad_id(id, V)) {
      if (c == 0) report(bad, n);
      out[i] = 0.0f;
      continue;
    }
    const float e = table_value(wte[static_cast<std::size_t>(id) * C + c]);
    out[i] = wpe == nullptr ? e : e + table_value(wpe[(n % T) * C + c]);  // no position table: Llama
  }
}

template <class Table>
cudaError_t launch_embedding(const std::int32_t* tokens, const Table* wte, const Table* wpe, float* out,
                             std::size_t B, std::size_t T, std::size_t C, std::size_t V, unsigned int* bad,
                             cudaStream_t s) {
  const std::size_t total = B * T * C;
  if (total == 0) return cudaSuccess;
  embedding_forward_kernel<<<grid_for(total), kBlock, 0, s>>>(tokens, wte, wpe, out, T, C, V, total, bad);
  return cudaGetLastError();
}

// One thread per column walks the positions in order, as the CPU loop does: repeated tokens add up
// in position order, without atomics, and each dwte element is touched by one thread only.
__global__ void embedding_backward_wte_kernel(const float* __restrict__ dout, const std::int32_t* __restrict__ tokens,
                                              float* __restrict__ dwte, std::size_t N, std::size_t C,
                                              std::size_t V) {
  const std::size_t c = global_index();
  if (c >= C) return;
  for (std::size_t n = 0; n < N; ++n) {
    const std::int32_t id = tokens[n];
    if (bad_id(id, V)) continue;  // never written out of bounds, even on ids nobody checked
    dwte[static_cast<std::size_t>(id) * C + c] += dout[n * C + c];
  }
}

__global__ void embedding_backward_wpe_kernel(const float* __restrict__ dout, float* __restrict__ dwpe,
                                              std::size_t B, std::size_t T, std::size_t C) {
  const std::size_t total = T * C;
  for (std::size_t i = global_index(); i < total; i += grid_stride()) {
    float acc = dwpe[i];
    for (std::size_t b = 0; b < B; ++b) acc += dout[b * total + i];
    dwpe[i] = acc;
  }
}

constexpr int kRowBlock = 256;

__global__ void cross_entropy_rows_kernel(const float* __restrict__ logits, const std::int32_t* __restrict__ targets,
                                          float* __restrict__ lse, std::size_t V, unsigned int* bad) {
  const std::size_t n = blockIdx.x;
  const float* z = logits + n * V;
  float mx = -INFINITY;
  for (std::size_t v = threadIdx.x; v < V; v += blockDim.x) mx = fmaxf(mx, z[v]);
  mx = block_reduce(mx, MaxOp{}, -INFINITY);
  float sum = 0.0f;
  for (std::size_t v = threadIdx.x; v < V; v += blockDim.x) sum += kernels::exp_approx(z[v] - mx);
  sum = block_reduce(sum, SumOp{}, 0.0f);
  if (threadIdx.x == 0) {
    lse[n] = mx + logf(sum);
    if (bad_id(targets[n], V)) report(bad, n);
  }
}

// One block: the mean's numerator in double, in a fixed order.
__global__ void cross_entropy_total_kernel(const float* __restrict__ logits, const std::int32_t* __restrict__ targets,
                                           const float* __restrict__ lse, double* __restrict__ total, std::size_t N,
                                           std::size_t V) {
  double acc = 0.0;
  for (std::size_t n = threadIdx.x; n < N; n += blockDim.x) {
    const std::int32_t t = targets[n];
    if (bad_id(t, V)) continue;
    acc += static_cast<double>(lse[n]) - static_cast<double>(logits[n * V + static_cast<std::size_t>(t)]);
  }
  acc = block_reduce(acc, SumOp{}, 0.0);
  if (threadIdx.x == 0) *total = acc;
}

__global__ void cross_entropy_backward_kernel(const float* __restrict__ logits,
                                              const std::int32_t* __restrict__ targets,
                                              const float* __restrict__ lse, float* __restrict__ dlogits,
                                              std::size_t N, std::size_t V, float scale, unsigned int* bad) {
  const std::size_t total = N * V;
  for (std::size_t i = global_index(); i < total; i += grid_stride()) {
    const std::size_t n = i / V;
    const std::size_t v = i - n * V;
    const std::int32_t t = targets[n];
    if (v == 0 && bad_id(t, V)) report(bad, n);
    float d = kernels::exp_approx(logits[i] - lse[n]) * scale;
    if (static_cast<std::size_t>(t) == v) d -= scale;
    dlogits[i] = d;
  }
}

__global__ void mean_kernel(const double* __restrict__ total, double n, float* __restrict__ out) {
  *out = static_cast<float>(*total / n);
}

}  // namespace

cudaError_t launch_mean(const double* total, std::size_t n, float* out, cudaStream_t s) {
  mean_kernel<<<1, 1, 0, s>>>(total, static_cast<double>(n), out);
  return cudaGetLastError();
}

cudaError_t launch_check_ids(const std::int32_t* ids, std::size_t n, std::size_t V, unsigned int* bad,
                             cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  check_ids_kernel<<<grid_for(n), kBlock, 0, s>>>(ids, n, V, bad);
  return cudaGetLastError();
}

cudaError_t launch_embedding_forward(const std::int32_t* tokens, const float* wte, const float* wpe, float* out,
                                     std::size_t B, std::size_t T, std::size_t C, std::size_t V, unsigned int* bad,
                                     cudaStream_t s) {
  return launch_embedding(tokens, wte, wpe, out, B, T, C, V, bad, s);
}

cudaError_t launch_embedding_forward(const std::int32_t* tokens, const std::uint16_t* wte, const std::uint16_t* wpe,
                                     float* out, std::size_t B, std::size_t T, std::size_t C, std::size_t V,
                                     unsigned int* bad, cudaStream_t s) {
  return launch_embedding(tokens, wte, wpe, out, B, T, C, V, bad, s);
}

cudaError_t launch_embedding_backward(const float* dout, const std::int32_t* tokens, float* dwte, float* dwpe,
                                      std::size_t B, std::size_t T, std::size_t C, std::size_t V, cudaStream_t s) {
  if (B * T * C == 0) return cudaSuccess;
  if (dwte != nullptr) {
    const auto blocks = static_cast<unsigned int>((C + kBlock - 1) / kBlock);
    embedding_backward_wte_kernel<<<blocks, kBlock, 0, s>>>(dout, tokens, dwte, B * T, C, V);
    if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  }
  if (dwpe != nullptr) {
    embedding_backward_wpe_kernel<<<grid_for(T * C), kBlock, 0, s>>>(dout, dwpe, B, T, C);
  }
  return cudaGetLastError();
}

cudaError_t launch_cross_entropy_forward(const float* logits, const std::int32_t* targets, float* lse,
                                         double* total, std::size_t N, std::size_t V, unsigned int* bad,
                                         cudaStream_t s) {
  cross_entropy_rows_kernel<<<static_cast<unsigned int>(N), kRowBlock, 0, s>>>(logits, targets, lse, V, bad);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  cross_entropy_total_kernel<<<1, kRowBlock, 0, s>>>(logits, targets, lse, total, N, V);
  return cudaGetLastError();
}

cudaError_t launch_cross_entropy_backward(const float* logits, const std::int32_t* targets, const float* lse,
                                          float* dlogits, std::size_t N, std::size_t V, float scale,
                                          unsigned int* bad, cudaStream_t s) {
  const std::size_t total = N * V;
  cross_entropy_backward_kernel<<<grid_for(total), kBlock, 0, s>>>(logits, targets, lse, dlogits, N, V, scale, bad);
  return cudaGetLastError();
}

}  // namespace coshard::ops::cuda::detail
