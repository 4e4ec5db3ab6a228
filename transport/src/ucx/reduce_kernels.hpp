#pragma once
// The arithmetic of host reductions. Partial results travel and accumulate in f32 whatever the
// input dtype, so bf16/f16 reductions round once, at the end (as NCCL's f32 accumulation would
// give, and unlike a ring that rounds at every hop).
#include <cstddef>

#include "coshard/runtime/dtype.hpp"
#include "coshard/transport/communicator.hpp"

namespace coshard::transport::detail {

// acc[i] = in[i] * scale, in f32.
void load_f32(float* acc, const void* in, DType dtype, std::size_t n, float scale) noexcept;
// acc[i] = acc[i] (+ or max) in[i] * scale.
void accumulate(float* acc, const void* in, DType dtype, std::size_t n, float scale, ReduceOp op) noexcept;
// acc[i] = acc[i] (+ or max) other[i], both f32.
void accumulate_f32(float* acc, const float* other, std::size_t n, ReduceOp op) noexcept;
// out[i] = dtype((partial[i] (+ or max) in[i] * scale) * post): the last step of a reduction, in
// one pass over memory.
void finish(void* out, const float* partial, const void* in, DType dtype, std::size_t n, float scale, ReduceOp op,
            float post) noexcept;
// out[i] = dtype(acc[i] * post).
void store(void* out, DType dtype, const float* acc, std::size_t n, float post) noexcept;

bool reducible(DType dtype) noexcept;

}  // namespace coshard::transport::detail
