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

// out[i] = dtype((in[0][i] * scale (+ or max) ... in[n-1][i] * scale) * post), accumulated in f32
// in the order of `in`: the fused reduction of the direct path, so that it reads each input once
// and writes `out` once. `out` may be one of the inputs (same element positions), not overlap
// them otherwise. `stream`: write f32 results with streaming stores (not in place).
void reduce_inputs(void* out, const void* const* in, std::size_t n, DType dtype, std::size_t count, float scale,
                   ReduceOp op, float post, bool stream) noexcept;

// dst[0, bytes) = src[0, bytes): memcpy, or with streaming (non-temporal) stores when `stream`.
void copy_large(void* dst, const void* src, std::size_t bytes, bool stream) noexcept;

// Operations whose buffer is at least this large write with streaming stores: their data does
// not stay in the caches anyway (32 MiB, the L3 of the machine this was measured on; measured:
// docs/transport.md). COSHARD_UCX_STREAM_MIN_BYTES overrides it; 0 turns streaming off. Read by a
// communicator's set-up, which a value that is no byte count fails (Errc::bad_config).
std::size_t stream_min_bytes();

}  // namespace coshard::transport::detail
