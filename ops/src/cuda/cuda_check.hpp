#pragma once
// CUDA runtime and cuBLAS calls at the ops boundary: a failure becomes a coshard::Error naming the
// call, file and line (Errc::out_of_memory for allocation failures, else Errc::device).
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <string>

#include "../check.hpp"
#include "coshard/runtime/cuda.hpp"
#include "coshard/runtime/error.hpp"

namespace coshard::ops::cuda::detail {

inline cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }

// Kernels launch a block per row (or per (t, h, b)): a grid's x dimension holds 2^31 - 1 blocks,
// y and z 65535.
inline void check_grid(const char* op, const char* dim, std::size_t v, std::size_t limit) {
  if (v > limit) {
    ops::detail::fail(op, std::string(dim) + " = " + std::to_string(v) + " exceeds the CUDA grid limit " +
                              std::to_string(limit));
  }
}

[[noreturn]] inline void fail_cuda(cudaError_t e, const char* call, const char* file, int line) {
  throw Error(e == cudaErrorMemoryAllocation ? Errc::out_of_memory : Errc::device,
              std::string(call) + " failed: " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ") at " + file +
                  ":" + std::to_string(line));
}

[[noreturn]] inline void fail_cublas(cublasStatus_t st, const char* call, const char* file, int line) {
  throw Error(st == CUBLAS_STATUS_ALLOC_FAILED ? Errc::out_of_memory : Errc::device,
              std::string(call) + " failed: " + cublasGetStatusName(st) + " (" + cublasGetStatusString(st) +
                  ") at " + file + ":" + std::to_string(line));
}

}  // namespace coshard::ops::cuda::detail

#define COSHARD_OPS_CUDA_CHECK(call)                                                     \
  do {                                                                                   \
    ::coshard::cuda::check_callable(#call);                                              \
    cudaError_t coshard_ops_err_ = (call);                                               \
    if (coshard_ops_err_ != cudaSuccess)                                                 \
      ::coshard::ops::cuda::detail::fail_cuda(coshard_ops_err_, #call, __FILE__, __LINE__); \
  } while (0)

#define COSHARD_CUBLAS_CHECK(call)                                                         \
  do {                                                                                     \
    ::coshard::cuda::check_callable(#call);                                                \
    cublasStatus_t coshard_ops_st_ = (call);                                               \
    if (coshard_ops_st_ != CUBLAS_STATUS_SUCCESS)                                          \
      ::coshard::ops::cuda::detail::fail_cublas(coshard_ops_st_, #call, __FILE__, __LINE__); \
  } while (0)
