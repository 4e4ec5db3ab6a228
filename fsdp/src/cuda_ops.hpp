#pragma once
// The CUDA ops the engine's own device work calls (device_work.cpp, shard_optimizer.cpp), as
// fsdp::detail::cuda_ops: coshard::ops::cuda in CUDA builds. A build without CUDA has no CUDA
// tensors (its Runtime refuses CUDA devices), so the branches that call these are never taken
// there, and there is no ops::cuda to link against: stubs stand in, failing loudly if reached.
#include <cstdint>
#include <span>

#include "coshard/ops/cuda_ops.hpp"
#include "coshard/runtime/dtype.hpp"
#include "coshard/runtime/error.hpp"

namespace coshard::fsdp::detail {

#ifdef COSHARD_HAVE_CUDA
namespace cuda_ops = ::coshard::ops::cuda;
#else
namespace cuda_ops {
[[noreturn]] inline void absent() { throw Error(Errc::internal, "CUDA work in a build without CUDA"); }
inline void cast_scaled(void*, std::span<const float>, void*, DType, float) { absent(); }
inline void widen(void*, const void*, DType, std::span<float>) { absent(); }
inline void accumulate_scaled(void*, std::span<float>, const void*, DType, float, DType) { absent(); }
inline void round_through(void*, std::span<const float>, std::span<float>, DType) { absent(); }
inline void scale_inplace(void*, std::span<float>, float) { absent(); }
inline void norm_partial(void*, std::span<const std::span<const float>>, ops::NormType, std::span<double>) { absent(); }
inline void adamw_update(void*, std::span<float>, std::span<const float>, std::span<float>, std::span<float>,
                         std::int64_t, double, double, double, double, double) {
  absent();
}
inline void sgd_update(void*, std::span<float>, std::span<const float>, std::span<float>, bool, double, double, double,
                       double, bool) {
  absent();
}
}  // namespace cuda_ops
#endif

}  // namespace coshard::fsdp::detail
