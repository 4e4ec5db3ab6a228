// Host side of the CUDA column copies: one cudaMemcpy2DAsync each, device to device.
#include <cuda_runtime_api.h>

#include "../check.hpp"
#include "coshard/ops/cuda_ops.hpp"
#include "cuda_check.hpp"

namespace coshard::ops::cuda {

void put_columns(void* stream, std::span<const float> narrow, std::span<float> wide, std::size_t rows, std::size_t cols,
                 std::size_t ld, std::size_t first) {
  constexpr const char* op = "put_columns";
  ops::detail::check_columns(op, narrow.size(), wide.size(), rows, cols, ld, first);
  ops::detail::check_disjoint(op, "wide", wide, "narrow", narrow);
  if (rows == 0) return;
  COSHARD_OPS_CUDA_CHECK(cudaMemcpy2DAsync(wide.data() + first, ld * sizeof(float), narrow.data(), cols * sizeof(float),
                                           cols * sizeof(float), rows, cudaMemcpyDeviceToDevice,
                                           detail::as_stream(stream)));
}

void get_columns(void* stream, std::span<const float> wide, std::span<float> narrow, std::size_t rows, std::size_t cols,
                 std::size_t ld, std::size_t first) {
  constexpr const char* op = "get_columns";
  ops::detail::check_columns(op, narrow.size(), wide.size(), rows, cols, ld, first);
  ops::detail::check_disjoint(op, "narrow", narrow, "wide", wide);
  if (rows == 0) return;
  COSHARD_OPS_CUDA_CHECK(cudaMemcpy2DAsync(narrow.data(), cols * sizeof(float), wide.data() + first, ld * sizeof(float),
                                           cols * sizeof(float), rows, cudaMemcpyDeviceToDevice,
                                           detail::as_stream(stream)));
}

}  // namespace coshard::ops::cuda
