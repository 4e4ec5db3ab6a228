#pragma once
// The engine's own element-wise work, enqueued on a stream wherever its tensors live: CUDA kernels
// (ops::cuda) on CUDA memory, host loops as stream work on host memory (the CPU devices, whose
// streams run them as work items). One entry per kind of work, so that the engine's code is the
// same on every device. The tensors of one call are all device memory or all host memory; a mix
// (offloaded state on a CUDA runtime, which Engine::create refuses) is an error.
#include <string>

#include "coshard/runtime/dtype.hpp"
#include "coshard/runtime/stream.hpp"
#include "coshard/runtime/telemetry.hpp"
#include "coshard/runtime/tensor.hpp"

namespace coshard::fsdp::detail {

// What a host loop moved, for offload's h2d and d2h counters (bytes and seconds of the loop alone);
// null counters count nothing.
struct Traffic {
  Counter* bytes = nullptr;
  Counter* seconds = nullptr;
};

// dst[i] = dst.dtype()(src[i] * scale), src f32, dst f32, bf16 or f16 of src's size. Counts dst's bytes.
void cast_scaled(Stream& stream, const Tensor& dst, const Tensor& src, float scale, std::string span,
                 Traffic traffic = {});
// dst[i] = f32(src[i]), dst f32 of src's size.
void widen(Stream& stream, const Tensor& dst, const Tensor& src, std::string span);
// dst[i] = src[i] rounded to the nearest value of `dtype` (both f32).
void round_through(Stream& stream, const Tensor& dst, const Tensor& src, DType dtype, std::string span);
// acc[i] += round_through(round, f32(x[i]) * scale), acc f32; round = f32: unrounded. Counts x's bytes.
void accumulate_scaled(Stream& stream, const Tensor& acc, const Tensor& x, float scale, DType round, std::string span,
                       Traffic traffic = {});
// t[i] *= c, t f32.
void scale(Stream& stream, const Tensor& t, float c, std::string span);

// Whether `t` is CUDA memory, whose work must be kernels on a CUDA stream.
inline bool on_cuda(const Tensor& t) noexcept { return t.device().kind == DeviceKind::cuda; }

}  // namespace coshard::fsdp::detail
