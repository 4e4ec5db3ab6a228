#pragma once
// CUDA versions of the ops in coshard::ops, with the same semantics, argument checks and error
// messages (see docs/ops.md). Buffers are std::span over *device* memory; every op is enqueued on
// a CUDA stream passed as `void*` (a cudaStream_t; nullptr is the legacy default stream), so this
// header includes no CUDA header and every build sees it. The functions exist only in builds with
// CUDA (COSHARD_HAVE_CUDA); calling them elsewhere is a link error.
//
// Asynchrony: ops are enqueued and return at once, except where a result or a device-side check
// must reach the host: cross_entropy_forward (returns the loss), the id checks of
// embedding_forward/backward and cross_entropy_backward, and the norm_partial/grad_norm overloads
// that return a double. Those synchronise `stream` before returning. Their CheckedIds overloads
// (ids validated on the host before they were uploaded; the loss left in device memory) and the
// norm_partial that writes device memory never do: they are what a training step uses. Scratch memory of those ops
// (a few bytes to a few KiB) is stream-ordered (cudaMallocAsync / cudaFreeAsync).
//
// Determinism: every reduction has a fixed order (no float atomics), so results are bitwise
// reproducible run to run on one GPU model. They are not bitwise equal to the CPU versions
// (reduction order, FMA contraction, the device's expf/tanhf), except the casts, which are.
//
// Errors: bad sizes, overlapping outputs and bad ids throw coshard::Error(Errc::invalid_argument)
// with the CPU op's message; a failing CUDA or cuBLAS call throws Errc::device (Errc::out_of_memory
// for allocation failures) naming the call, file and line.
#include <cstddef>
#include <cstdint>
#include <span>

#include "coshard/ops/attention.hpp"
#include "coshard/ops/grad_norm.hpp"
#include "coshard/ops/layernorm.hpp"
#include "coshard/ops/linear.hpp"
#include "coshard/ops/optim.hpp"
#include "coshard/runtime/dtype.hpp"

namespace coshard::ops::cuda {

/// A cuBLAS handle bound to one stream (and to the device current when it is created). Move-only;
/// destroys the handle. Linear layers run their GEMMs and their bias/db kernels on its stream.
/// FP32 GEMMs use CUBLAS_DEFAULT_MATH (no TF32).
class Blas {
 public:
  /// Creates the handle on the current device, bound to `stream` (a cudaStream_t).
  explicit Blas(void* stream);
  Blas(const Blas&) = delete;
  Blas& operator=(const Blas&) = delete;
  /// Takes over `other`'s handle; `other` is left without one.
  Blas(Blas&& other) noexcept;
  /// Destroys this handle and takes over `other`'s.
  Blas& operator=(Blas&& other) noexcept;
  ~Blas();

  /// Rebinds the handle to `stream`; later GEMMs run there. Throws on a moved-from handle.
  void set_stream(void* stream);
  /// The stream the handle is bound to (a cudaStream_t).
  void* stream() const noexcept { return stream_; }
  /// The cublasHandle_t, for calling cuBLAS directly.
  void* native() const noexcept { return handle_; }  // the cublasHandle_t

 private:
  void* handle_ = nullptr;
  void* stream_ = nullptr;
};

// ---- linear (cuBLAS SGEMM; row-major buffers mapped onto column-major GEMMs) ----
/// ops::linear_forward on `blas`'s stream: y written.
void linear_forward(Blas& blas, std::span<const float> x, std::span<const float> w, std::span<const float> b,
                    std::span<float> y, std::size_t rows, std::size_t in, std::size_t out,
                    WeightLayout layout = WeightLayout::in_out);
/// ops::linear_backward on `blas`'s stream: dx written; dw and db accumulated (any may be empty).
void linear_backward(Blas& blas, std::span<const float> dy, std::span<const float> x, std::span<const float> w,
                     std::span<float> dx, std::span<float> dw, std::span<float> db, std::size_t rows, std::size_t in,
                     std::size_t out, WeightLayout layout = WeightLayout::in_out);
/// bf16 weights (the bits mixed precision all-gathers), as ops::linear_forward's bf16 overload:
/// x is rounded to bf16 on the device (stream-ordered scratch), and cublasGemmEx multiplies bf16
/// operands with f32 sums (CUBLAS_COMPUTE_32F: the products are exact, as on the CPU; tensor cores
/// where the GPU has them). y f32.
void linear_forward(Blas& blas, std::span<const float> x, std::span<const std::uint16_t> w, std::span<const float> b,
                    std::span<float> y, std::size_t rows, std::size_t in, std::size_t out,
                    WeightLayout layout = WeightLayout::in_out);
/// bf16 weights: dy and x rounded to bf16 for the GEMMs, as on the CPU; dx written, dw and db
/// (which sums dy unrounded) accumulated, all f32.
void linear_backward(Blas& blas, std::span<const float> dy, std::span<const float> x, std::span<const std::uint16_t> w,
                     std::span<float> dx, std::span<float> dw, std::span<float> db, std::size_t rows, std::size_t in,
                     std::size_t out, WeightLayout layout = WeightLayout::in_out);

/// Ids (tokens or targets, in device memory) that the caller validated against the vocabulary on
/// the host before it uploaded them, as a training step does with its batch. The overloads that
/// take them check nothing on the device and never synchronise the stream; a bad id among them is
/// the caller's bug (the kernels skip it, without writing out of bounds; the results are unspecified).
struct CheckedIds {
  std::span<const std::int32_t> ids;  ///< in device memory, each in [0, V)
};

// ---- embedding (ids are validated on the device; a bad id throws after a stream sync) ----
/// ops::embedding_forward on `stream`. Checks the ids after its kernel: out is unspecified when it
/// throws.
void embedding_forward(void* stream, std::span<const std::int32_t> tokens, std::span<const float> wte,
                       std::span<const float> wpe, std::span<float> out, std::size_t B, std::size_t T, std::size_t C,
                       std::size_t V);
/// ops::embedding_backward on `stream`. Checks the ids before accumulating, so dwte and dwpe are
/// untouched when it throws.
void embedding_backward(void* stream, std::span<const float> dout, std::span<const std::int32_t> tokens,
                        std::span<float> dwte, std::span<float> dwpe, std::size_t B, std::size_t T, std::size_t C,
                        std::size_t V);

/// embedding_forward on checked ids: enqueued, no synchronisation.
void embedding_forward(void* stream, CheckedIds tokens, std::span<const float> wte, std::span<const float> wpe,
                       std::span<float> out, std::size_t B, std::size_t T, std::size_t C, std::size_t V);
/// The same on bf16 tables (mixed precision's all-gathered bits), widened exactly as
/// ops::embedding_forward's bf16 overload does: bitwise equal to it.
void embedding_forward(void* stream, CheckedIds tokens, std::span<const std::uint16_t> wte,
                       std::span<const std::uint16_t> wpe, std::span<float> out, std::size_t B, std::size_t T,
                       std::size_t C, std::size_t V);
/// embedding_backward on checked ids: enqueued, no synchronisation.
void embedding_backward(void* stream, std::span<const float> dout, CheckedIds tokens, std::span<float> dwte,
                        std::span<float> dwpe, std::size_t B, std::size_t T, std::size_t C, std::size_t V);

// ---- layernorm ----
/// ops::layernorm_forward on `stream`: y, mean and rstd written.
void layernorm_forward(void* stream, std::span<const float> x, std::span<const float> weight,
                       std::span<const float> bias, std::span<float> y, std::span<float> mean, std::span<float> rstd,
                       std::size_t rows, std::size_t C, float eps = layernorm_eps);
/// ops::layernorm_backward on `stream`: dx written; dweight and dbias accumulated (either may be empty).
void layernorm_backward(void* stream, std::span<const float> dy, std::span<const float> x,
                        std::span<const float> weight, std::span<const float> mean, std::span<const float> rstd,
                        std::span<float> dx, std::span<float> dweight, std::span<float> dbias, std::size_t rows,
                        std::size_t C);

// ---- RMSNorm ----
/// ops::rmsnorm_forward on `stream`: y and rstd written.
void rmsnorm_forward(void* stream, std::span<const float> x, std::span<const float> weight, std::span<float> y,
                     std::span<float> rstd, std::size_t rows, std::size_t C, float eps);
/// ops::rmsnorm_backward on `stream`: dx written; dweight accumulated (it may be empty).
void rmsnorm_backward(void* stream, std::span<const float> dy, std::span<const float> x, std::span<const float> weight,
                      std::span<const float> rstd, std::span<float> dx, std::span<float> dweight, std::size_t rows,
                      std::size_t C);

// ---- SwiGLU ----
/// ops::swiglu_forward on `stream`: y = silu(gate) * up.
void swiglu_forward(void* stream, std::span<const float> gate, std::span<const float> up, std::span<float> y);
/// ops::swiglu_backward on `stream`: dgate and dup written.
void swiglu_backward(void* stream, std::span<const float> dy, std::span<const float> gate, std::span<const float> up,
                     std::span<float> dgate, std::span<float> dup);

// ---- rotary position embeddings (the table is ops::rope_table's, copied to the device) ----
/// ops::rope_forward on `stream`: qkv's query and key heads rotated in place.
void rope_forward(void* stream, std::span<float> qkv, std::span<const float> cos, std::span<const float> sin,
                  const AttentionShape& shape);
/// ops::rope_backward on `stream`: dqkv's query and key heads rotated back in place.
void rope_backward(void* stream, std::span<float> dqkv, std::span<const float> cos, std::span<const float> sin,
                   const AttentionShape& shape);

// ---- column blocks (cudaMemcpy2DAsync, device to device) ----
/// ops::put_columns on `stream`.
void put_columns(void* stream, std::span<const float> narrow, std::span<float> wide, std::size_t rows, std::size_t cols,
                 std::size_t ld, std::size_t first);
/// ops::get_columns on `stream`.
void get_columns(void* stream, std::span<const float> wide, std::span<float> narrow, std::size_t rows, std::size_t cols,
                 std::size_t ld, std::size_t first);

// ---- GELU (tanh approximation) ----
/// ops::gelu_forward on `stream`.
void gelu_forward(void* stream, std::span<const float> x, std::span<float> y);
/// ops::gelu_backward on `stream`: dx = dy * gelu'(x), written.
void gelu_backward(void* stream, std::span<const float> dy, std::span<const float> x, std::span<float> dx);

// ---- residual ----
/// out = a + b on `stream`; out may be a or b.
void residual_forward(void* stream, std::span<const float> a, std::span<const float> b, std::span<float> out);
/// acc += x on `stream`; joins gradients on the residual stream.
void accumulate(void* stream, std::span<float> acc, std::span<const float> x);

// ---- causal attention (att [B, NH, T, T] kept; the CPU keeps a log-sum-exp per query) ----
/// ops::attention_forward on `stream`, grouped-query or multi-head: out and the probabilities att
/// [B, NH, T, T] written. NH / NKV may not exceed hs (where the backward parks its row sums).
void attention_forward(void* stream, std::span<const float> qkv, std::span<float> out, std::span<float> att,
                       const AttentionShape& shape);
/// ops::attention_backward on `stream`: dqkv written.
void attention_backward(void* stream, std::span<const float> dout, std::span<const float> qkv,
                        std::span<const float> att, std::span<float> dqkv, const AttentionShape& shape);
/// ops::attention_forward on `stream`: out and the probabilities att written.
void attention_forward(void* stream, std::span<const float> qkv, std::span<float> out, std::span<float> att,
                       std::size_t B, std::size_t T, std::size_t C, std::size_t NH);
/// ops::attention_backward on `stream`: dqkv written.
void attention_backward(void* stream, std::span<const float> dout, std::span<const float> qkv,
                        std::span<const float> att, std::span<float> dqkv, std::size_t B, std::size_t T,
                        std::size_t C, std::size_t NH);

// ---- softmax cross-entropy ----
/// ops::cross_entropy_forward on `stream`. Returns the mean loss (summed in double on the device);
/// synchronises the stream. A bad target throws, naming the first bad position, as on the CPU.
float cross_entropy_forward(void* stream, std::span<const float> logits, std::span<const std::int32_t> targets,
                            std::span<float> lse, std::size_t N, std::size_t V);
/// ops::cross_entropy_backward on `stream`. Writes dlogits, then synchronises to check the targets
/// (dlogits is unspecified when it throws).
void cross_entropy_backward(void* stream, std::span<const float> logits, std::span<const std::int32_t> targets,
                            std::span<const float> lse, std::span<float> dlogits, std::size_t N, std::size_t V,
                            float dloss = 1.0f);

/// cross_entropy_forward on checked targets: the mean loss goes to `loss` (device memory, one
/// float), for the host to copy back in stream order; no synchronisation.
void cross_entropy_forward(void* stream, std::span<const float> logits, CheckedIds targets, std::span<float> lse,
                           std::span<float> loss, std::size_t N, std::size_t V);
/// cross_entropy_backward on checked targets: enqueued, no synchronisation.
void cross_entropy_backward(void* stream, std::span<const float> logits, CheckedIds targets, std::span<const float> lse,
                            std::span<float> dlogits, std::size_t N, std::size_t V, float dloss = 1.0f);

// ---- casts (bitwise equal to coshard::ops' scalar casts) ----
/// fp32 to bf16 on `stream`, as ops::cast_f32_to_bf16.
void cast_f32_to_bf16(void* stream, std::span<const float> in, std::span<std::uint16_t> out);
/// bf16 to fp32 on `stream`, as ops::cast_bf16_to_f32.
void cast_bf16_to_f32(void* stream, std::span<const std::uint16_t> in, std::span<float> out);
/// fp32 to fp16 on `stream`, as ops::cast_f32_to_f16.
void cast_f32_to_f16(void* stream, std::span<const float> in, std::span<std::uint16_t> out);
/// fp16 to fp32 on `stream`, as ops::cast_f16_to_f32.
void cast_f16_to_f32(void* stream, std::span<const std::uint16_t> in, std::span<float> out);

// ---- the FSDP engine's casts of parameters and gradients (dtype: f32, bf16 or f16) ----
/// out[i] = dtype(in[i] * scale): `out` holds in.size() elements of `dtype` in device memory.
void cast_scaled(void* stream, std::span<const float> in, void* out, DType dtype, float scale);
/// out[i] = f32(in[i]): `in` holds out.size() elements of `dtype` in device memory.
void widen(void* stream, const void* in, DType dtype, std::span<float> out);
/// acc[i] += round_through(round, f32(x[i]) * scale): `x` holds acc.size() elements of `x_dtype`;
/// round = f32 adds unrounded.
void accumulate_scaled(void* stream, std::span<float> acc, const void* x, DType x_dtype, float scale, DType round);
/// out[i] = in[i] rounded to the nearest value of `dtype` (kept in f32).
void round_through(void* stream, std::span<const float> in, std::span<float> out, DType dtype);

// ---- gradient norm ----
/// Enqueues the partial (sum of squares, sum of |x|, or max |x|; in double, NaN propagating) of all
/// buffers into partial[0] (device memory, one double), without a host sync: the input of a
/// cross-rank reduction (sum, sum, max). norm_finish / clip_coefficient are coshard::ops' host ones.
void norm_partial(void* stream, std::span<const std::span<const float>> buffers, NormType type,
                  std::span<double> partial);
/// The same, returned to the host (synchronises the stream).
double norm_partial(void* stream, std::span<const std::span<const float>> buffers, NormType type);
/// ops::grad_norm of buffers all on this rank, returned to the host (synchronises the stream).
double grad_norm(void* stream, std::span<const std::span<const float>> buffers, NormType type);
/// buffer *= s on `stream` (applies a clip coefficient).
void scale_inplace(void* stream, std::span<float> buffer, float s);

// ---- optimizers (scalars in double on the host, applied in float, as the CPU versions) ----
/// ops::adamw_update of one range on `stream`, with the buffers in device memory.
void adamw_update(void* stream, std::span<float> param, std::span<const float> grad, std::span<float> exp_avg,
                  std::span<float> exp_avg_sq, std::int64_t step, double lr, double beta1, double beta2, double eps,
                  double weight_decay);
/// Device-resident AdamW state: exp_avg / exp_avg_sq in device memory (zeroed by the caller), the
/// step count on the host. Increments `step` once, then updates each range (all of param, with
/// decay, if ranges is empty).
void adamw_step(void* stream, std::span<float> param, std::span<const float> grad, std::span<float> exp_avg,
                std::span<float> exp_avg_sq, std::int64_t& step, const AdamWOptions& opt,
                std::span<const ParamRange> ranges = {});

/// ops::sgd_update of one range on `stream`, with the buffers in device memory.
void sgd_update(void* stream, std::span<float> param, std::span<const float> grad, std::span<float> momentum_buffer,
                bool first_step, double lr, double momentum, double dampening, double weight_decay, bool nesterov);
/// momentum_buffer in device memory (may be empty when momentum == 0); has_buffer is the host flag
/// of SGDState: false before the first step, set by this call when momentum != 0.
void sgd_step(void* stream, std::span<float> param, std::span<const float> grad, std::span<float> momentum_buffer,
              bool& has_buffer, const SGDOptions& opt, std::span<const ParamRange> ranges = {});

}  // namespace coshard::ops::cuda
