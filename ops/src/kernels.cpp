#include "coshard/ops/kernels.hpp"

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <utility>

#include "coshard/ops/attention.hpp"
#include "coshard/ops/cast.hpp"
#include "coshard/ops/columns.hpp"
#include "coshard/ops/cross_entropy.hpp"
#include "coshard/ops/embedding.hpp"
#include "coshard/ops/gelu.hpp"
#include "coshard/ops/layernorm.hpp"
#include "coshard/ops/residual.hpp"
#include "coshard/ops/rmsnorm.hpp"
#include "coshard/ops/rope.hpp"
#include "coshard/ops/swiglu.hpp"
#include "coshard/runtime/error.hpp"

#ifdef COSHARD_HAVE_CUDA
#include "coshard/ops/cuda_ops.hpp"
#include "coshard/runtime/copy.hpp"
#include "coshard/runtime/cuda.hpp"
// A CUDA op's call, compiled only where ops::cuda exists; a build without CUDA has no CUDA
// tensors (its Runtime refuses CUDA devices), so on_cuda() is never true there.
#define COSHARD_CUDA_OP(...) __VA_ARGS__
#else
#define COSHARD_CUDA_OP(...) throw Error(Errc::internal, "a CUDA op in a build without CUDA")
#endif

namespace coshard::ops {
namespace {

std::span<const float> in(const Tensor& t) {
  if (!t.defined()) return {};
  return {t.data_as<float>(), static_cast<std::size_t>(t.numel())};
}

std::span<float> out(const Tensor& t) {
  if (!t.defined()) return {};
  return {t.data_as<float>(), static_cast<std::size_t>(t.numel())};
}

std::span<const std::uint16_t> bits(const Tensor& t) {
  if (!t.defined()) return {};
  return {static_cast<const std::uint16_t*>(t.data()), static_cast<std::size_t>(t.numel())};
}

std::span<const std::int32_t> ids(const Tensor& t) {
  return {t.data_as<std::int32_t>(), static_cast<std::size_t>(t.numel())};
}

// A weight or table is f32 or bf16; anything else is refused when the op is called.
bool is_bf16(const char* op, const Tensor& w) {
  if (w.dtype() == DType::bf16) return true;
  if (w.dtype() == DType::f32) return false;
  throw Error(Errc::invalid_argument, std::string("ops::Kernels::") + op + ": weights are f32 or bf16, got " +
                                          std::string(to_string(w.dtype())));
}

}  // namespace

#ifdef COSHARD_HAVE_CUDA
namespace {
// The stream's handle, with its device made current first: cuBLAS binds a handle to that device.
void* native_on_its_device(Stream& stream) {
  coshard::cuda::use_device(stream.device());
  return stream.impl().native();
}
}  // namespace

struct Launcher::Cuda {
  explicit Cuda(Stream& stream) : blas(native_on_its_device(stream)) {}
  cuda::Blas blas;
  Allocator pinned{coshard::cuda::pinned_host_memory()};  // upload()'s staging: a copy from it never blocks the host
};
#else
struct Launcher::Cuda {};
#endif

Launcher::Launcher() = default;

Launcher::Launcher(Stream& stream) : stream_(&stream) {
  if (cuda()) COSHARD_CUDA_OP(cuda_ = std::make_unique<Cuda>(stream));
}

Launcher::Launcher(Launcher&&) noexcept = default;
Launcher& Launcher::operator=(Launcher&&) noexcept = default;
Launcher::~Launcher() = default;

bool Launcher::cuda() const noexcept { return stream_ && stream_->device().kind == DeviceKind::cuda; }

Kernels Launcher::begin(std::string span) {
  // The ops launch on the calling thread's current device: make it the stream's.
  if (cuda()) COSHARD_CUDA_OP(coshard::cuda::use_device(stream_->device()));
  return Kernels(*this, std::move(span));
}

std::size_t Launcher::attention_saved_numel(std::size_t B, std::size_t T, std::size_t NH) const noexcept {
  return cuda() ? B * NH * T * T : B * NH * T;
}

Kernels::Kernels(Kernels&& o) noexcept
    : launcher_(std::exchange(o.launcher_, nullptr)), span_(std::move(o.span_)), work_(std::move(o.work_)),
      used_(std::move(o.used_)), uncaught_(o.uncaught_) {}

Kernels::~Kernels() noexcept(false) {
  if (!launcher_) return;
  if (std::uncaught_exceptions() > uncaught_) {
    // Unwinding: the host work gathered is dropped, but the CUDA kernels already launched still
    // read and write their tensors, so those are marked used all the same. The error being
    // unwound is the one to report: a failure to mark them goes unsaid.
    work_.clear();
    try {
      submit();
    } catch (...) {
    }
    return;
  }
  submit();
}

void Kernels::submit() {
  Stream* s = launcher_->stream();
  if (!s) return;
  if (!work_.empty()) {
    s->enqueue([work = std::move(work_)] {
      for (const auto& w : work) w();
    }, span_);
    work_.clear();
  }
  if (!used_.empty()) {
    Event used(s->device());
    used.record(*s);
    for (const Tensor& t : used_) t.record_use(used);
    used_.clear();
  }
}

bool Kernels::on_cuda(const char* op, std::initializer_list<const Tensor*> tensors) {
  const bool cuda = launcher_->cuda();
  for (const Tensor* t : tensors) {
    if (!t->defined() || (t->device().kind == DeviceKind::cuda) == cuda) continue;
    const Stream* s = launcher_->stream();
    throw Error(Errc::invalid_argument,
                std::string("ops::Kernels::") + op + ": a tensor of " + t->device().to_string() + " on " +
                    (s ? "stream '" + s->name() + "' of " + s->device().to_string() : std::string("the host")) +
                    ": every tensor of an op lives where the op runs (copy it there first)");
  }
  return cuda;
}

void Kernels::host(std::function<void()> work) {
  if (!launcher_->stream()) return work();
  work_.push_back(std::move(work));
}

void Kernels::native_stream_used(std::initializer_list<const Tensor*> tensors) {
  for (const Tensor* t : tensors) {
    if (t->defined()) used_.push_back(*t);
  }
}

void* Kernels::native() const noexcept { return launcher_->stream()->impl().native(); }

#ifdef COSHARD_HAVE_CUDA
cuda::Blas& Kernels::blas() const noexcept { return launcher_->cuda_->blas; }
#endif

void Kernels::embedding_forward(const Tensor& tokens, const Tensor& wte, const Tensor& wpe, const Tensor& y,
                                std::size_t B, std::size_t T, std::size_t C, std::size_t V) {
  constexpr const char* op = "embedding_forward";
  const bool bf16 = is_bf16(op, wte);
  if (on_cuda(op, {&tokens, &wte, &wpe, &y})) {
    if (bf16) {
      COSHARD_CUDA_OP(cuda::embedding_forward(native(), cuda::CheckedIds{ids(tokens)}, bits(wte), bits(wpe), out(y), B, T, C,
                                              V));
    } else {
      COSHARD_CUDA_OP(cuda::embedding_forward(native(), cuda::CheckedIds{ids(tokens)}, in(wte), in(wpe), out(y), B, T, C, V));
    }
    return native_stream_used({&tokens, &wte, &wpe, &y});
  }
  host([=] {
    if (bf16) return ops::embedding_forward(ids(tokens), bits(wte), bits(wpe), out(y), B, T, C, V);
    ops::embedding_forward(ids(tokens), in(wte), in(wpe), out(y), B, T, C, V);
  });
}

void Kernels::embedding_backward(const Tensor& dout, const Tensor& tokens, const Tensor& dwte, const Tensor& dwpe,
                                 std::size_t B, std::size_t T, std::size_t C, std::size_t V) {
  if (on_cuda("embedding_backward", {&dout, &tokens, &dwte, &dwpe})) {
    COSHARD_CUDA_OP(cuda::embedding_backward(native(), in(dout), cuda::CheckedIds{ids(tokens)}, out(dwte), out(dwpe), B, T,
                                             C, V));
    return native_stream_used({&dout, &tokens, &dwte, &dwpe});
  }
  host([=] { ops::embedding_backward(in(dout), ids(tokens), out(dwte), out(dwpe), B, T, C, V); });
}

void Kernels::layernorm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& y,
                                const Tensor& mean, const Tensor& rstd, std::size_t rows, std::size_t C) {
  if (on_cuda("layernorm_forward", {&x, &weight, &bias, &y, &mean, &rstd})) {
    COSHARD_CUDA_OP(cuda::layernorm_forward(native(), in(x), in(weight), in(bias), out(y), out(mean), out(rstd), rows, C));
    return native_stream_used({&x, &weight, &bias, &y, &mean, &rstd});
  }
  host([=] { ops::layernorm_forward(in(x), in(weight), in(bias), out(y), out(mean), out(rstd), rows, C); });
}

void Kernels::layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& mean,
                                 const Tensor& rstd, const Tensor& dx, const Tensor& dweight, const Tensor& dbias,
                                 std::size_t rows, std::size_t C) {
  if (on_cuda("layernorm_backward", {&dy, &x, &weight, &mean, &rstd, &dx, &dweight, &dbias})) {
    COSHARD_CUDA_OP(cuda::layernorm_backward(native(), in(dy), in(x), in(weight), in(mean), in(rstd), out(dx), out(dweight),
                                             out(dbias), rows, C));
    return native_stream_used({&dy, &x, &weight, &mean, &rstd, &dx, &dweight, &dbias});
  }
  host([=] {
    ops::layernorm_backward(in(dy), in(x), in(weight), in(mean), in(rstd), out(dx), out(dweight), out(dbias), rows, C);
  });
}

void Kernels::linear_forward(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& y, std::size_t rows,
                             std::size_t in_f, std::size_t out_f, WeightLayout layout) {
  constexpr const char* op = "linear_forward";
  const bool bf16 = is_bf16(op, w);
  if (on_cuda(op, {&x, &w, &b, &y})) {
    if (bf16) {
      COSHARD_CUDA_OP(cuda::linear_forward(blas(), in(x), bits(w), in(b), out(y), rows, in_f, out_f, layout));
    } else {
      COSHARD_CUDA_OP(cuda::linear_forward(blas(), in(x), in(w), in(b), out(y), rows, in_f, out_f, layout));
    }
    return native_stream_used({&x, &w, &b, &y});
  }
  host([=] {
    if (bf16) return ops::linear_forward(in(x), bits(w), in(b), out(y), rows, in_f, out_f, layout);
    ops::linear_forward(in(x), in(w), in(b), out(y), rows, in_f, out_f, layout);
  });
}

void Kernels::linear_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& dx, const Tensor& dw,
                              const Tensor& db, std::size_t rows, std::size_t in_f, std::size_t out_f,
                              WeightLayout layout) {
  constexpr const char* op = "linear_backward";
  const bool bf16 = is_bf16(op, w);
  if (on_cuda(op, {&dy, &x, &w, &dx, &dw, &db})) {
    if (bf16) {
      COSHARD_CUDA_OP(cuda::linear_backward(blas(), in(dy), in(x), bits(w), out(dx), out(dw), out(db), rows, in_f, out_f,
                                            layout));
    } else {
      COSHARD_CUDA_OP(cuda::linear_backward(blas(), in(dy), in(x), in(w), out(dx), out(dw), out(db), rows, in_f, out_f,
                                            layout));
    }
    return native_stream_used({&dy, &x, &w, &dx, &dw, &db});
  }
  host([=] {
    if (bf16) return ops::linear_backward(in(dy), in(x), bits(w), out(dx), out(dw), out(db), rows, in_f, out_f, layout);
    ops::linear_backward(in(dy), in(x), in(w), out(dx), out(dw), out(db), rows, in_f, out_f, layout);
  });
}

void Kernels::attention_forward(const Tensor& qkv, const Tensor& y, const Tensor& saved, std::size_t B, std::size_t T,
                                std::size_t C, std::size_t NH) {
  if (on_cuda("attention_forward", {&qkv, &y, &saved})) {
    COSHARD_CUDA_OP(cuda::attention_forward(native(), in(qkv), out(y), out(saved), B, T, C, NH));
    return native_stream_used({&qkv, &y, &saved});
  }
  host([=] { ops::attention_forward(in(qkv), out(y), out(saved), B, T, C, NH); });
}

void Kernels::attention_backward(const Tensor& dout, const Tensor& qkv, const Tensor& y, const Tensor& saved,
                                 const Tensor& dqkv, std::size_t B, std::size_t T, std::size_t C, std::size_t NH) {
  if (on_cuda("attention_backward", {&dout, &qkv, &y, &saved, &dqkv})) {
    COSHARD_CUDA_OP(cuda::attention_backward(native(), in(dout), in(qkv), in(saved), out(dqkv), B, T, C, NH));
    return native_stream_used({&dout, &qkv, &saved, &dqkv});
  }
  host([=] { ops::attention_backward(in(dout), in(qkv), in(y), in(saved), out(dqkv), B, T, C, NH); });
}

void Kernels::attention_forward(const Tensor& qkv, const Tensor& y, const Tensor& saved, const AttentionShape& s) {
  if (on_cuda("attention_forward", {&qkv, &y, &saved})) {
    COSHARD_CUDA_OP(cuda::attention_forward(native(), in(qkv), out(y), out(saved), s));
    return native_stream_used({&qkv, &y, &saved});
  }
  host([=] { ops::attention_forward(in(qkv), out(y), out(saved), s); });
}

void Kernels::attention_backward(const Tensor& dout, const Tensor& qkv, const Tensor& y, const Tensor& saved,
                                 const Tensor& dqkv, const AttentionShape& s) {
  if (on_cuda("attention_backward", {&dout, &qkv, &y, &saved, &dqkv})) {
    COSHARD_CUDA_OP(cuda::attention_backward(native(), in(dout), in(qkv), in(saved), out(dqkv), s));
    return native_stream_used({&dout, &qkv, &saved, &dqkv});
  }
  host([=] { ops::attention_backward(in(dout), in(qkv), in(y), in(saved), out(dqkv), s); });
}

void Kernels::rmsnorm_forward(const Tensor& x, const Tensor& weight, const Tensor& y, const Tensor& rstd,
                              std::size_t rows, std::size_t C, float eps) {
  if (on_cuda("rmsnorm_forward", {&x, &weight, &y, &rstd})) {
    COSHARD_CUDA_OP(cuda::rmsnorm_forward(native(), in(x), in(weight), out(y), out(rstd), rows, C, eps));
    return native_stream_used({&x, &weight, &y, &rstd});
  }
  host([=] { ops::rmsnorm_forward(in(x), in(weight), out(y), out(rstd), rows, C, eps); });
}

void Kernels::rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& rstd,
                               const Tensor& dx, const Tensor& dweight, std::size_t rows, std::size_t C) {
  if (on_cuda("rmsnorm_backward", {&dy, &x, &weight, &rstd, &dx, &dweight})) {
    COSHARD_CUDA_OP(cuda::rmsnorm_backward(native(), in(dy), in(x), in(weight), in(rstd), out(dx), out(dweight), rows, C));
    return native_stream_used({&dy, &x, &weight, &rstd, &dx, &dweight});
  }
  host([=] { ops::rmsnorm_backward(in(dy), in(x), in(weight), in(rstd), out(dx), out(dweight), rows, C); });
}

void Kernels::swiglu_forward(const Tensor& gate, const Tensor& up, const Tensor& y) {
  if (on_cuda("swiglu_forward", {&gate, &up, &y})) {
    COSHARD_CUDA_OP(cuda::swiglu_forward(native(), in(gate), in(up), out(y)));
    return native_stream_used({&gate, &up, &y});
  }
  host([=] { ops::swiglu_forward(in(gate), in(up), out(y)); });
}

void Kernels::swiglu_backward(const Tensor& dy, const Tensor& gate, const Tensor& up, const Tensor& dgate,
                              const Tensor& dup) {
  if (on_cuda("swiglu_backward", {&dy, &gate, &up, &dgate, &dup})) {
    COSHARD_CUDA_OP(cuda::swiglu_backward(native(), in(dy), in(gate), in(up), out(dgate), out(dup)));
    return native_stream_used({&dy, &gate, &up, &dgate, &dup});
  }
  host([=] { ops::swiglu_backward(in(dy), in(gate), in(up), out(dgate), out(dup)); });
}

void Kernels::rope_forward(const Tensor& qkv, const Tensor& cos, const Tensor& sin, const AttentionShape& s) {
  if (on_cuda("rope_forward", {&qkv, &cos, &sin})) {
    COSHARD_CUDA_OP(cuda::rope_forward(native(), out(qkv), in(cos), in(sin), s));
    return native_stream_used({&qkv, &cos, &sin});
  }
  host([=] { ops::rope_forward(out(qkv), in(cos), in(sin), s); });
}

void Kernels::rope_backward(const Tensor& dqkv, const Tensor& cos, const Tensor& sin, const AttentionShape& s) {
  if (on_cuda("rope_backward", {&dqkv, &cos, &sin})) {
    COSHARD_CUDA_OP(cuda::rope_backward(native(), out(dqkv), in(cos), in(sin), s));
    return native_stream_used({&dqkv, &cos, &sin});
  }
  host([=] { ops::rope_backward(out(dqkv), in(cos), in(sin), s); });
}

void Kernels::put_columns(const Tensor& narrow, const Tensor& wide, std::size_t rows, std::size_t cols, std::size_t ld,
                          std::size_t first) {
  if (on_cuda("put_columns", {&narrow, &wide})) {
    COSHARD_CUDA_OP(cuda::put_columns(native(), in(narrow), out(wide), rows, cols, ld, first));
    return native_stream_used({&narrow, &wide});
  }
  host([=] { ops::put_columns(in(narrow), out(wide), rows, cols, ld, first); });
}

void Kernels::get_columns(const Tensor& wide, const Tensor& narrow, std::size_t rows, std::size_t cols, std::size_t ld,
                          std::size_t first) {
  if (on_cuda("get_columns", {&wide, &narrow})) {
    COSHARD_CUDA_OP(cuda::get_columns(native(), in(wide), out(narrow), rows, cols, ld, first));
    return native_stream_used({&wide, &narrow});
  }
  host([=] { ops::get_columns(in(wide), out(narrow), rows, cols, ld, first); });
}

void Kernels::gelu_forward(const Tensor& x, const Tensor& y) {
  if (on_cuda("gelu_forward", {&x, &y})) {
    COSHARD_CUDA_OP(cuda::gelu_forward(native(), in(x), out(y)));
    return native_stream_used({&x, &y});
  }
  host([=] { ops::gelu_forward(in(x), out(y)); });
}

void Kernels::gelu_backward(const Tensor& dy, const Tensor& x, const Tensor& dx) {
  if (on_cuda("gelu_backward", {&dy, &x, &dx})) {
    COSHARD_CUDA_OP(cuda::gelu_backward(native(), in(dy), in(x), out(dx)));
    return native_stream_used({&dy, &x, &dx});
  }
  host([=] { ops::gelu_backward(in(dy), in(x), out(dx)); });
}

void Kernels::residual_forward(const Tensor& a, const Tensor& b, const Tensor& y) {
  if (on_cuda("residual_forward", {&a, &b, &y})) {
    COSHARD_CUDA_OP(cuda::residual_forward(native(), in(a), in(b), out(y)));
    return native_stream_used({&a, &b, &y});
  }
  host([=] { ops::residual_forward(in(a), in(b), out(y)); });
}

void Kernels::accumulate(const Tensor& acc, const Tensor& x) {
  if (on_cuda("accumulate", {&acc, &x})) {
    COSHARD_CUDA_OP(cuda::accumulate(native(), out(acc), in(x)));
    return native_stream_used({&acc, &x});
  }
  host([=] { ops::accumulate(out(acc), in(x)); });
}

void Kernels::copy(const Tensor& dst, const Tensor& src) {
  if (dst.numel() != src.numel() || dst.dtype() != src.dtype()) {
    throw Error(Errc::invalid_argument, "ops::Kernels::copy: " + std::to_string(src.numel()) + " elements of " +
                                            std::string(to_string(src.dtype())) + " into " +
                                            std::to_string(dst.numel()) + " of " + std::string(to_string(dst.dtype())));
  }
  if (on_cuda("copy", {&dst, &src})) {
    COSHARD_CUDA_OP(copy_tensor(*launcher_->stream(), dst, src));
    return native_stream_used({&dst, &src});
  }
  host([=] { std::memcpy(dst.data(), src.data(), src.nbytes()); });
}

void Kernels::zero(const Tensor& dst) {
  if (on_cuda("zero", {&dst})) {
    COSHARD_CUDA_OP(fill_zero(*launcher_->stream(), dst));
    return native_stream_used({&dst});
  }
  host([=] { std::memset(dst.data(), 0, dst.nbytes()); });
}

void Kernels::upload(const Tensor& dst, std::vector<std::int32_t> values) {
  std::vector<std::byte> bytes(values.size() * sizeof(std::int32_t));
  std::memcpy(bytes.data(), values.data(), bytes.size());
  upload_bytes(dst, DType::i32, std::move(bytes));
}

void Kernels::upload(const Tensor& dst, std::vector<float> values) {
  std::vector<std::byte> bytes(values.size() * sizeof(float));
  std::memcpy(bytes.data(), values.data(), bytes.size());
  upload_bytes(dst, DType::f32, std::move(bytes));
}

void Kernels::upload_bytes(const Tensor& dst, DType dtype, std::vector<std::byte> bytes) {
  if (dst.dtype() != dtype || bytes.size() != dst.nbytes()) {
    throw Error(Errc::invalid_argument, "ops::Kernels::upload: " + std::to_string(bytes.size() / size_of(dtype)) +
                                            " values of " + std::string(to_string(dtype)) + " into " +
                                            std::to_string(dst.numel()) + " elements of " +
                                            std::string(to_string(dst.dtype())));
  }
  if (on_cuda("upload", {&dst})) {
    // Through pinned memory: from pageable memory CUDA may stage the copy synchronously.
    Tensor staging;
    COSHARD_CUDA_OP(staging = Tensor::empty(launcher_->cuda_->pinned, dtype, dst.shape()));
    std::memcpy(staging.data(), bytes.data(), staging.nbytes());
    COSHARD_CUDA_OP(copy_tensor(*launcher_->stream(), dst, staging));
    return native_stream_used({&dst, &staging});
  }
  host([dst, bytes = std::move(bytes)] { std::memcpy(dst.data(), bytes.data(), dst.nbytes()); });
}

void Kernels::to_host(const Tensor& host_dst, const Tensor& src) {
  if (host_dst.device().kind == DeviceKind::cuda) {
    throw Error(Errc::invalid_argument, "ops::Kernels::to_host: the destination is CUDA memory, not host memory");
  }
  if (host_dst.nbytes() != src.nbytes()) {
    throw Error(Errc::invalid_argument, "ops::Kernels::to_host: " + std::to_string(src.nbytes()) + " bytes into " +
                                            std::to_string(host_dst.nbytes()));
  }
  if (on_cuda("to_host", {&src})) {
    COSHARD_CUDA_OP(copy_tensor(*launcher_->stream(), host_dst, src));
    return native_stream_used({&host_dst, &src});
  }
  host([=] { std::memcpy(host_dst.data(), src.data(), src.nbytes()); });
}

void Kernels::widen_bf16(const Tensor& dst, const Tensor& src) {
  if (on_cuda("widen_bf16", {&dst, &src})) {
    COSHARD_CUDA_OP(cuda::cast_bf16_to_f32(native(), bits(src), out(dst)));
    return native_stream_used({&dst, &src});
  }
  host([=] { ops::cast_bf16_to_f32(bits(src), out(dst)); });
}

void Kernels::cross_entropy_forward(const Tensor& logits, const Tensor& targets, const Tensor& lse, const Tensor& loss,
                                    std::size_t N, std::size_t V) {
  if (on_cuda("cross_entropy_forward", {&logits, &targets, &lse, &loss})) {
    COSHARD_CUDA_OP(cuda::cross_entropy_forward(native(), in(logits), cuda::CheckedIds{ids(targets)}, out(lse), out(loss), N,
                                                V));
    return native_stream_used({&logits, &targets, &lse, &loss});
  }
  host([=] { out(loss)[0] = ops::cross_entropy_forward(in(logits), ids(targets), out(lse), N, V); });
}

void Kernels::cross_entropy_backward(const Tensor& logits, const Tensor& targets, const Tensor& lse,
                                     const Tensor& dlogits, std::size_t N, std::size_t V, float dloss) {
  if (on_cuda("cross_entropy_backward", {&logits, &targets, &lse, &dlogits})) {
    COSHARD_CUDA_OP(cuda::cross_entropy_backward(native(), in(logits), cuda::CheckedIds{ids(targets)}, in(lse), out(dlogits),
                                                 N, V, dloss));
    return native_stream_used({&logits, &targets, &lse, &dlogits});
  }
  host([=] { ops::cross_entropy_backward(in(logits), ids(targets), in(lse), out(dlogits), N, V, dloss); });
}

}  // namespace coshard::ops
