#pragma once
// Kernel launchers (defined in the .cu files of this folder). They take raw device pointers and
// sizes already checked by the host wrappers, enqueue on `s`, launch nothing for empty inputs, and
// return cudaGetLastError() of the launch, which the wrappers check with COSHARD_OPS_CUDA_CHECK.
// Only CUDA runtime types here, so both nvcc and the host compiler read this header.
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "coshard/kernels/elementwise.hpp"

namespace coshard::ops::cuda::detail {

// elementwise.cu
cudaError_t launch_gelu_forward(const float* x, float* y, std::size_t n, cudaStream_t s);
cudaError_t launch_gelu_backward(const float* dy, const float* x, float* dx, std::size_t n, cudaStream_t s);
cudaError_t launch_swiglu_forward(const float* gate, const float* up, float* y, std::size_t n, cudaStream_t s);
cudaError_t launch_swiglu_backward(const float* dy, const float* gate, const float* up, float* dgate, float* dup,
                                   std::size_t n, cudaStream_t s);
// Rotates the first `heads` heads of each of `rows` rows (ld apart) in place by row (r % T) of the
// [P, hs/2] table; sign -1 rotates back.
cudaError_t launch_rope(float* x, const float* cos, const float* sin, std::size_t rows, std::size_t T, std::size_t ld,
                        std::size_t heads, std::size_t hs, float sign, cudaStream_t s);
cudaError_t launch_add(const float* a, const float* b, float* out, std::size_t n, cudaStream_t s);  // out may alias
cudaError_t launch_accumulate(float* acc, const float* x, std::size_t n, cudaStream_t s);
cudaError_t launch_scale(float* p, float v, std::size_t n, cudaStream_t s);
cudaError_t launch_f32_to_bf16(const float* in, std::uint16_t* out, std::size_t n, cudaStream_t s);
cudaError_t launch_bf16_to_f32(const std::uint16_t* in, float* out, std::size_t n, cudaStream_t s);
cudaError_t launch_f32_to_f16(const float* in, std::uint16_t* out, std::size_t n, cudaStream_t s);
cudaError_t launch_f16_to_f32(const std::uint16_t* in, float* out, std::size_t n, cudaStream_t s);
// The FSDP engine's casts; `code` names a dtype: 0 f32, 1 bf16, 2 f16.
cudaError_t launch_cast_scaled(const float* in, void* out, int code, float scale, std::size_t n, cudaStream_t s);
cudaError_t launch_widen(const void* in, int code, float* out, std::size_t n, cudaStream_t s);
cudaError_t launch_accumulate_scaled(float* acc, const void* x, int x_code, float scale, int round_code, std::size_t n,
                                     cudaStream_t s);
cudaError_t launch_round_through(const float* in, float* out, int code, std::size_t n, cudaStream_t s);
// y[r, :] = b for every row (the bias as GEMM's C).
cudaError_t launch_fill_rows(const float* b, float* y, std::size_t rows, std::size_t cols, cudaStream_t s);

using AdamWScalars = kernels::AdamWScalars;
cudaError_t launch_adamw(float* p, const float* g, float* m, float* v, std::size_t n, AdamWScalars k, cudaStream_t s);
using SGDScalars = kernels::SGDScalars;
// buf == nullptr: no momentum.
cudaError_t launch_sgd(float* p, const float* g, float* buf, std::size_t n, SGDScalars k, cudaStream_t s);

// reduce.cu
cudaError_t launch_layernorm_forward(const float* x, const float* w, const float* b, float* y, float* mean,
                                     float* rstd, std::size_t rows, std::size_t C, float eps, cudaStream_t s);
cudaError_t launch_layernorm_backward_dx(const float* dy, const float* x, const float* w, const float* mean,
                                         const float* rstd, float* dx, std::size_t rows, std::size_t C,
                                         cudaStream_t s);
// dw[c] += sum_r dy[r,c] (x[r,c] - mean[r]) rstd[r] and db[c] += sum_r dy[r,c]; either may be null.
cudaError_t launch_layernorm_backward_params(const float* dy, const float* x, const float* mean, const float* rstd,
                                             float* dw, float* db, std::size_t rows, std::size_t C, cudaStream_t s);
cudaError_t launch_rmsnorm_forward(const float* x, const float* w, float* y, float* rstd, std::size_t rows,
                                   std::size_t C, float eps, cudaStream_t s);
// dx written; dw[c] += sum_r dy[r,c] x[r,c] rstd[r] unless dw is null.
cudaError_t launch_rmsnorm_backward(const float* dy, const float* x, const float* w, const float* rstd, float* dx,
                                    float* dw, std::size_t rows, std::size_t C, cudaStream_t s);
// db[c] += sum_r dy[r, c].
cudaError_t launch_column_sum(const float* dy, float* db, std::size_t rows, std::size_t cols, cudaStream_t s);

// Grad norm: type 0 l2 (sum of squares), 1 l1 (sum of |x|), 2 inf (max |x|, NaN propagating).
// Each buffer writes norm_blocks(n) block partials to scratch + offset; the finish kernel reduces
// `count` partials into *out.
std::size_t norm_blocks(std::size_t n);
cudaError_t launch_norm_blocks(const float* p, std::size_t n, int type, double* scratch, cudaStream_t s);
cudaError_t launch_norm_finish(const double* scratch, std::size_t count, int type, double* out, cudaStream_t s);

// attention.cu: qkv [B, T, (NH + 2 NKV) hs], out [B, T, NH hs], att [B, NH, T, T]; NH / NKV <= hs.
cudaError_t launch_attention_forward(const float* qkv, float* out, float* att, std::size_t B, std::size_t T,
                                     std::size_t NH, std::size_t NKV, std::size_t hs, cudaStream_t s);
cudaError_t launch_attention_backward(const float* dout, const float* qkv, const float* att, float* dqkv,
                                      std::size_t B, std::size_t T, std::size_t NH, std::size_t NKV, std::size_t hs,
                                      cudaStream_t s);

// embedding_xent.cu. `bad` is a device unsigned int preset to UINT_MAX; kernels atomicMin the
// position of a bad id into it.
cudaError_t launch_check_ids(const std::int32_t* ids, std::size_t n, std::size_t V, unsigned int* bad,
                             cudaStream_t s);
cudaError_t launch_embedding_forward(const std::int32_t* tokens, const float* wte, const float* wpe, float* out,
                                     std::size_t B, std::size_t T, std::size_t C, std::size_t V, unsigned int* bad,
                                     cudaStream_t s);
// The same on bf16 tables (widened exactly).
cudaError_t launch_embedding_forward(const std::int32_t* tokens, const std::uint16_t* wte, const std::uint16_t* wpe,
                                     float* out, std::size_t B, std::size_t T, std::size_t C, std::size_t V,
                                     unsigned int* bad, cudaStream_t s);
// dwte / dwpe may be null. Ids outside [0, V) are skipped (the callers check them first).
cudaError_t launch_embedding_backward(const float* dout, const std::int32_t* tokens, float* dwte, float* dwpe,
                                      std::size_t B, std::size_t T, std::size_t C, std::size_t V, cudaStream_t s);
// lse[n] for each row; bad targets recorded in *bad. total = sum_n (lse[n] - logits[n, t_n]) in
// double over the valid rows.
cudaError_t launch_cross_entropy_forward(const float* logits, const std::int32_t* targets, float* lse,
                                         double* total, std::size_t N, std::size_t V, unsigned int* bad,
                                         cudaStream_t s);
// *out = float(*total / n): a mean for the device, without a trip to the host.
cudaError_t launch_mean(const double* total, std::size_t n, float* out, cudaStream_t s);
cudaError_t launch_cross_entropy_backward(const float* logits, const std::int32_t* targets, const float* lse,
                                          float* dlogits, std::size_t N, std::size_t V, float scale,
                                          unsigned int* bad, cudaStream_t s);

}  // namespace coshard::ops::cuda::detail
