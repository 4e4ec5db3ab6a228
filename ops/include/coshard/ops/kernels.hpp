#pragma once
// The ops of this library on tensors, enqueued on a stream wherever the tensors live: CUDA kernels
// (ops::cuda) on CUDA memory from a CUDA stream, the CPU ops as stream work on host memory from a
// CPU stream. This is how a unit launches its kernels (docs/fsdp.md): the same code runs on the
// CPU, the cpu-discrete and the CUDA devices, and never touches device memory from the host.
//
//   ops::Launcher launch(scope.compute());          // one per stream: owns the cuBLAS handle
//   ops::Kernels k = launch.begin("forward h.0");    // one piece of work on the timeline
//   k.layernorm_forward(x, w, b, y, mean, rstd, rows, C);
//   k.linear_forward(y, weight, bias, out, rows, C, 3 * C);
//   k.submit();                                      // or when k goes out of scope
//
// On a CPU stream the ops of one Kernels run as one work item, named by its span, in the order
// they were called; on CUDA each is launched when called, and submit() keeps the tensors' blocks
// from reuse until the kernels ran (Tensor::record_use). Launcher() with no stream runs each op at
// once on the calling thread, on host memory: a model in one process, without a runtime.
//
// Argument checks are the ops' own (docs/ops.md): on CUDA they throw when the op is called, on a
// CPU stream when the work runs (the stream's error then names the span). Every tensor of an op is
// memory of the launcher's device kind; a tensor from elsewhere (a CUDA tensor on a CPU stream, a
// host tensor on CUDA) throws Error(invalid_argument) naming the op. Ids (embedding tokens,
// cross-entropy targets) are taken as checked: validate them on the host before uploading them,
// as gpt2's set_batch does, so that CUDA never synchronises to check them.
#include <cstddef>
#include <exception>
#include <functional>
#include <initializer_list>
#include <memory>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "coshard/ops/attention.hpp"
#include "coshard/ops/linear.hpp"
#include "coshard/ops/rope.hpp"
#include "coshard/runtime/stream.hpp"
#include "coshard/runtime/tensor.hpp"

namespace coshard::ops {

class Kernels;
namespace cuda {
class Blas;
}

/// Where ops run: a stream, or the calling thread. Move-only; one per stream (on CUDA it holds the
/// cuBLAS handle bound to that stream). Must outlive the Kernels it begins.
class Launcher {
 public:
  /// Ops run at once on the calling thread, on host memory.
  Launcher();
  /// Ops enqueued on `stream` (not owned: it must outlive the launcher).
  explicit Launcher(Stream& stream);
  /// Takes over `other`'s stream and cuBLAS handle.
  Launcher(Launcher&& other) noexcept;
  /// Drops this launcher's handle and takes over `other`'s.
  Launcher& operator=(Launcher&& other) noexcept;
  ~Launcher();  ///< destroys the cuBLAS handle, if any

  /// The stream, or null for the calling thread.
  Stream* stream() const noexcept { return stream_; }
  /// True when the ops are CUDA kernels.
  bool cuda() const noexcept;
  /// A sequence of ops that is one piece of work named `span` (CPU streams; "" leaves it unnamed).
  Kernels begin(std::string span);
  /// Elements of attention's saved state for the backward: the CPU ops keep each query's
  /// log-sum-exp ([B, NH, T]), the CUDA ones the probabilities ([B, NH, T, T]).
  std::size_t attention_saved_numel(std::size_t B, std::size_t T, std::size_t NH) const noexcept;

 private:
  friend class Kernels;
  struct Cuda;  // the cuBLAS handle (CUDA builds)
  Stream* stream_ = nullptr;
  std::unique_ptr<Cuda> cuda_;
};

/// A sequence of ops begun by Launcher::begin. Move-only; submitted by submit() or when destroyed,
/// where a failure to enqueue throws (the destructor is noexcept(false)). Destroyed by an exception,
/// it drops the host work gathered on a CPU stream, and on CUDA still marks the tensors of the
/// kernels already launched as used.
/// Tensors are f32 unless said otherwise; optional ones may be undefined (Tensor()).
class Kernels {
 public:
  /// Takes over `other`'s gathered ops; `other` submits nothing.
  Kernels(Kernels&& other) noexcept;
  Kernels& operator=(Kernels&&) = delete;
  ~Kernels() noexcept(false);  ///< submit(); see the class
  /// Enqueues what was gathered (CPU stream) or marks the tensors used (CUDA); later ops go into a
  /// new piece of work with the same span.
  void submit();

  /// wte, wpe: f32, or bf16 (widened exactly). tokens: i32, checked.
  void embedding_forward(const Tensor& tokens, const Tensor& wte, const Tensor& wpe, const Tensor& out, std::size_t B,
                         std::size_t T, std::size_t C, std::size_t V);
  /// dwte, dwpe accumulated; either may be undefined.
  void embedding_backward(const Tensor& dout, const Tensor& tokens, const Tensor& dwte, const Tensor& dwpe,
                          std::size_t B, std::size_t T, std::size_t C, std::size_t V);
  /// y, mean and rstd written (ops/layernorm.hpp).
  void layernorm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& y,
                         const Tensor& mean, const Tensor& rstd, std::size_t rows, std::size_t C);
  /// dx written; dweight, dbias accumulated.
  void layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& mean,
                          const Tensor& rstd, const Tensor& dx, const Tensor& dweight, const Tensor& dbias,
                          std::size_t rows, std::size_t C);
  /// w: f32, or bf16 (ops/linear.hpp's bf16 GEMM: x rounded to bf16, f32 sums). b may be undefined.
  void linear_forward(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& y, std::size_t rows,
                      std::size_t in, std::size_t out, WeightLayout layout = WeightLayout::in_out);
  /// dx written; dw, db accumulated; any may be undefined.
  void linear_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& dx, const Tensor& dw,
                       const Tensor& db, std::size_t rows, std::size_t in, std::size_t out,
                       WeightLayout layout = WeightLayout::in_out);
  /// Launcher::attention_saved_numel of this sequence's launcher.
  std::size_t attention_saved_numel(std::size_t B, std::size_t T, std::size_t NH) const noexcept {
    return launcher_->attention_saved_numel(B, T, NH);
  }
  /// saved: attention_saved_numel elements.
  void attention_forward(const Tensor& qkv, const Tensor& out, const Tensor& saved, std::size_t B, std::size_t T,
                         std::size_t C, std::size_t NH);
  /// dqkv written; qkv, out and saved as the forward left them.
  void attention_backward(const Tensor& dout, const Tensor& qkv, const Tensor& out, const Tensor& saved,
                          const Tensor& dqkv, std::size_t B, std::size_t T, std::size_t C, std::size_t NH);
  /// Grouped-query or multi-head attention (ops/attention.hpp): saved holds
  /// attention_saved_numel(B, T, NH) elements.
  void attention_forward(const Tensor& qkv, const Tensor& out, const Tensor& saved, const AttentionShape& shape);
  /// dqkv written; qkv, out and saved as the forward left them.
  void attention_backward(const Tensor& dout, const Tensor& qkv, const Tensor& out, const Tensor& saved,
                          const Tensor& dqkv, const AttentionShape& shape);
  /// y and rstd written (ops/rmsnorm.hpp).
  void rmsnorm_forward(const Tensor& x, const Tensor& weight, const Tensor& y, const Tensor& rstd, std::size_t rows,
                       std::size_t C, float eps);
  /// dx written; dweight accumulated (it may be undefined).
  void rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& rstd, const Tensor& dx,
                        const Tensor& dweight, std::size_t rows, std::size_t C);
  /// y = silu(gate) * up (ops/swiglu.hpp).
  void swiglu_forward(const Tensor& gate, const Tensor& up, const Tensor& y);
  /// dgate and dup written.
  void swiglu_backward(const Tensor& dy, const Tensor& gate, const Tensor& up, const Tensor& dgate, const Tensor& dup);
  /// qkv's query and key heads rotated in place (ops/rope.hpp); cos and sin a table of the device's.
  void rope_forward(const Tensor& qkv, const Tensor& cos, const Tensor& sin, const AttentionShape& shape);
  /// dqkv's query and key heads rotated back in place.
  void rope_backward(const Tensor& dqkv, const Tensor& cos, const Tensor& sin, const AttentionShape& shape);
  /// wide[r, first .. first + cols) = narrow[r, :] (ops/columns.hpp).
  void put_columns(const Tensor& narrow, const Tensor& wide, std::size_t rows, std::size_t cols, std::size_t ld,
                   std::size_t first);
  /// narrow[r, :] = wide[r, first .. first + cols).
  void get_columns(const Tensor& wide, const Tensor& narrow, std::size_t rows, std::size_t cols, std::size_t ld,
                   std::size_t first);
  /// y = gelu(x) (tanh approximation).
  void gelu_forward(const Tensor& x, const Tensor& y);
  /// dx = dy * gelu'(x), written.
  void gelu_backward(const Tensor& dy, const Tensor& x, const Tensor& dx);
  /// out = a + b (out may be a or b).
  void residual_forward(const Tensor& a, const Tensor& b, const Tensor& out);
  /// acc += x.
  void accumulate(const Tensor& acc, const Tensor& x);
  /// dst = src, same element count.
  void copy(const Tensor& dst, const Tensor& src);
  /// dst's bytes = 0.
  void zero(const Tensor& dst);
  /// dst (i32) = values, copied from the host in stream order.
  void upload(const Tensor& dst, std::vector<std::int32_t> values);
  /// dst (f32) = values, copied from the host in stream order (a RoPE table, say).
  void upload(const Tensor& dst, std::vector<float> values);
  /// host (host memory, e.g. pinned on CUDA) = src, copied in stream order: what a host callback
  /// or a Readback published after submit() may read.
  void to_host(const Tensor& host, const Tensor& src);
  /// dst (f32) = src (bf16), elementwise.
  void widen_bf16(const Tensor& dst, const Tensor& src);
  /// The mean cross-entropy into loss (one f32 element); targets i32, checked.
  void cross_entropy_forward(const Tensor& logits, const Tensor& targets, const Tensor& lse, const Tensor& loss,
                             std::size_t N, std::size_t V);
  /// dlogits written, for a loss scaled by dloss; targets i32, checked.
  void cross_entropy_backward(const Tensor& logits, const Tensor& targets, const Tensor& lse, const Tensor& dlogits,
                              std::size_t N, std::size_t V, float dloss);

 private:
  friend class Launcher;
  Kernels(Launcher& launcher, std::string span) : launcher_(&launcher), span_(std::move(span)) {}
  // Checks where `tensors` live; true when the op is a CUDA kernel, false when it is host work.
  bool on_cuda(const char* op, std::initializer_list<const Tensor*> tensors);
  // Host work: now (no stream) or gathered for submit().
  void host(std::function<void()> work);
  void native_stream_used(std::initializer_list<const Tensor*> tensors);
  void upload_bytes(const Tensor& dst, DType dtype, std::vector<std::byte> bytes);
  void* native() const noexcept;
  cuda::Blas& blas() const noexcept;  // the launcher's cuBLAS handle (defined in CUDA builds)

  Launcher* launcher_;
  std::string span_;
  std::vector<std::function<void()>> work_;  // CPU stream: gathered host work
  std::vector<Tensor> used_;                 // CUDA: tensors the launched kernels read or write
  int uncaught_ = std::uncaught_exceptions();
};

}  // namespace coshard::ops
