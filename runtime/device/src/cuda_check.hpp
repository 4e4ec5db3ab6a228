#pragma once
// Wraps CUDA runtime calls at the boundary: a failure becomes an Error naming the call and place.
#include <cuda_runtime_api.h>

#include <string>

#include "coshard/runtime/cuda.hpp"
#include "coshard/runtime/error.hpp"

namespace coshard::cuda::detail {
[[noreturn]] inline void fail(cudaError_t e, const char* call, const char* file, int line) {
  throw Error(e == cudaErrorMemoryAllocation ? Errc::out_of_memory : Errc::device,
              std::string(call) + " failed: " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ") at " + file +
                  ":" + std::to_string(line));
}
}  // namespace coshard::cuda::detail

#define COSHARD_CUDA_CHECK(call)                                                 \
  do {                                                                           \
    ::coshard::cuda::check_callable(#call);                                      \
    cudaError_t coshard_cuda_err_ = (call);                                      \
    if (coshard_cuda_err_ != cudaSuccess)                                        \
      ::coshard::cuda::detail::fail(coshard_cuda_err_, #call, __FILE__, __LINE__); \
  } while (0)
