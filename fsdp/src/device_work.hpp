#pragma once
// The engine's own element-wise work, enqueued on a stream wherever its tensors live: CUDA kernels
// (ops::cuda) on CUDA memory, host loops as stream work on host memory (the CPU devices, whose
// streams run them as work items). One entry per kind of work, so that the engine's code is the
// same on every device. The tensors of one call are all device memory or all host memory
// (Tensor::host_accessible); a mix is an error, on the cpu-discrete device as on CUDA: offloaded
// host state meets device memory only through copy_tensor.
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "coshard/ops/grad_norm.hpp"
#include "coshard/runtime/dtype.hpp"
#include "coshard/runtime/stream.hpp"
#include "coshard/runtime/telemetry.hpp"
#include "coshard/runtime/tensor.hpp"

namespace coshard::fsdp::detail {

// True when the work on `tensors` runs as CUDA kernels: every tensor is CUDA memory, on a CUDA
// stream. Else it is a host loop, run as stream work: on host memory, or on the cpu-discrete
// device's memory by its stream workers. One piece of work never mixes device memory (which only
// kernels reach on a GPU) with host memory (which kernels need not reach: pinning may have
// failed); such data is staged through copy_tensor first, on cpu-discrete as on CUDA, so that the
// CPU tests run the GPU's path. A mix throws Error(internal), naming `what`. Undefined tensors
// (an absent optimizer buffer) do not count.
bool runs_as_kernels(Stream& stream, const char* what, std::initializer_list<const Tensor*> tensors);

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
// copy_tensor (the move between host and device memory), its bytes added to `traffic`, and on
// the CPU devices its time too (a work item; on CUDA a DMA, not timed).
void copy_counted(Stream& stream, const Tensor& dst, const Tensor& src, std::string span, Traffic traffic);
// Part of a gradient shard that a norm counts (padding excluded).
struct NormPiece {
  Tensor grad;
  std::size_t offset = 0, size = 0;
};
// *partial = ops::norm_partial over the pieces, and out[0] (f32) = *partial: a host loop as stream
// work. The pieces and `out` are all host memory or all a CPU device's; CUDA memory is an error
// (its norm is kernels: GradientReducer::clip).
void norm_partial(Stream& stream, std::vector<NormPiece> pieces, ops::NormType type, const Tensor& out,
                  std::shared_ptr<double> partial, std::string span);
// t[i] *= c, t f32.
void scale(Stream& stream, const Tensor& t, float c, std::string span);

// Whether `t` is CUDA memory, whose work must be kernels on a CUDA stream.
inline bool on_cuda(const Tensor& t) noexcept { return t.device().kind == DeviceKind::cuda; }

}  // namespace coshard::fsdp::detail
