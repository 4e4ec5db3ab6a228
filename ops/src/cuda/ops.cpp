// Host side of the CUDA ops that need no ids: argument checks (shared with the CPU versions, so
// the messages are the same), scalar set-up in double, kernel launches through launch.hpp.
#include <cuda_runtime_api.h>

#include <climits>
#include <cmath>
#include <string>
#include <vector>

#include "../check.hpp"
#include "coshard/ops/cuda_ops.hpp"
#include "cuda_check.hpp"
#include "launch.hpp"
#include "scratch.hpp"

namespace coshard::ops::cuda {

using detail::as_stream;
using detail::check_grid;

// ---- layernorm ----

void layernorm_forward(void* stream, std::span<const float> x, std::span<const float> weight,
                       std::span<const float> bias, std::span<float> y, std::span<float> mean, std::span<float> rstd,
                       std::size_t rows, std::size_t C, float eps) {
  constexpr const char* op = "layernorm_forward";
  ops::detail::check_positive(op, "C", C);
  const std::string rc = "[rows, C] = " + ops::detail::dims({rows, C});
  ops::detail::check_size(op, "x", x, rows * C, rc);
  ops::detail::check_size(op, "weight", weight, C, "[C] = " + ops::detail::dims({C}));
  ops::detail::check_size(op, "bias", bias, C, "[C] = " + ops::detail::dims({C}));
  ops::detail::check_size(op, "y", y, rows * C, rc);
  ops::detail::check_size(op, "mean", mean, rows, "[rows] = " + ops::detail::dims({rows}));
  ops::detail::check_size(op, "rstd", rstd, rows, "[rows] = " + ops::detail::dims({rows}));
  ops::detail::check_disjoint(op, "y", y, "x", x);
  check_grid(op, "rows", rows, INT_MAX);
  COSHARD_OPS_CUDA_CHECK(detail::launch_layernorm_forward(x.data(), weight.data(), bias.data(), y.data(), mean.data(),
                                                          rstd.data(), rows, C, eps, as_stream(stream)));
}

void layernorm_backward(void* stream, std::span<const float> dy, std::span<const float> x,
                        std::span<const float> weight, std::span<const float> mean, std::span<const float> rstd,
                        std::span<float> dx, std::span<float> dweight, std::span<float> dbias, std::size_t rows,
                        std::size_t C) {
  constexpr const char* op = "layernorm_backward";
  ops::detail::check_positive(op, "C", C);
  const std::string rc = "[rows, C] = " + ops::detail::dims({rows, C});
  ops::detail::check_size(op, "dy", dy, rows * C, rc);
  ops::detail::check_size(op, "x", x, rows * C, rc);
  ops::detail::check_size(op, "weight", weight, C, "[C] = " + ops::detail::dims({C}));
  ops::detail::check_size(op, "mean", mean, rows, "[rows] = " + ops::detail::dims({rows}));
  ops::detail::check_size(op, "rstd", rstd, rows, "[rows] = " + ops::detail::dims({rows}));
  ops::detail::check_size(op, "dx", dx, rows * C, rc);
  ops::detail::check_optional_size(op, "dweight", dweight, C, "[C] = " + ops::detail::dims({C}));
  ops::detail::check_optional_size(op, "dbias", dbias, C, "[C] = " + ops::detail::dims({C}));
  ops::detail::check_disjoint(op, "dx", dx, "dy", dy);
  ops::detail::check_disjoint(op, "dx", dx, "x", x);
  ops::detail::check_disjoint(op, "dweight", dweight, "dy", dy);
  ops::detail::check_disjoint(op, "dbias", dbias, "dy", dy);
  check_grid(op, "rows", rows, INT_MAX);
  const cudaStream_t s = as_stream(stream);
  COSHARD_OPS_CUDA_CHECK(detail::launch_layernorm_backward_dx(dy.data(), x.data(), weight.data(), mean.data(),
                                                              rstd.data(), dx.data(), rows, C, s));
  COSHARD_OPS_CUDA_CHECK(detail::launch_layernorm_backward_params(
      dy.data(), x.data(), mean.data(), rstd.data(), dweight.empty() ? nullptr : dweight.data(),
      dbias.empty() ? nullptr : dbias.data(), rows, C, s));
}

// ---- GELU ----

void gelu_forward(void* stream, std::span<const float> x, std::span<float> y) {
  constexpr const char* op = "gelu_forward";
  ops::detail::check_size(op, "y", y, x.size(), "size of x");
  ops::detail::check_disjoint(op, "y", y, "x", x);
  COSHARD_OPS_CUDA_CHECK(detail::launch_gelu_forward(x.data(), y.data(), x.size(), as_stream(stream)));
}

void gelu_backward(void* stream, std::span<const float> dy, std::span<const float> x, std::span<float> dx) {
  constexpr const char* op = "gelu_backward";
  ops::detail::check_size(op, "dy", dy, x.size(), "size of x");
  ops::detail::check_size(op, "dx", dx, x.size(), "size of x");
  ops::detail::check_disjoint(op, "dx", dx, "x", x);
  ops::detail::check_disjoint(op, "dx", dx, "dy", dy);
  COSHARD_OPS_CUDA_CHECK(detail::launch_gelu_backward(dy.data(), x.data(), dx.data(), x.size(), as_stream(stream)));
}

// ---- residual ----

void residual_forward(void* stream, std::span<const float> a, std::span<const float> b, std::span<float> out) {
  constexpr const char* op = "residual_forward";
  ops::detail::check_size(op, "b", b, a.size(), "size of a");
  ops::detail::check_size(op, "out", out, a.size(), "size of a");
  if (out.data() != a.data()) ops::detail::check_disjoint(op, "out", out, "a", a);
  if (out.data() != b.data()) ops::detail::check_disjoint(op, "out", out, "b", b);
  COSHARD_OPS_CUDA_CHECK(detail::launch_add(a.data(), b.data(), out.data(), a.size(), as_stream(stream)));
}

void accumulate(void* stream, std::span<float> acc, std::span<const float> x) {
  constexpr const char* op = "accumulate";
  ops::detail::check_size(op, "x", x, acc.size(), "size of acc");
  ops::detail::check_disjoint(op, "acc", acc, "x", x);
  COSHARD_OPS_CUDA_CHECK(detail::launch_accumulate(acc.data(), x.data(), acc.size(), as_stream(stream)));
}

// ---- attention ----

namespace {

void check_attention(const char* op, std::span<const float> qkv, std::span<const float> att,
                     const AttentionShape& s) {
  ops::detail::check_attention_shape(op, s.T, s.heads, s.kv_heads, s.head_size);
  ops::detail::check_size(op, "qkv", qkv, s.B * s.T * s.qkv_width(),
                          "[B, T, (NH + 2 NKV) hs] = " + ops::detail::dims({s.B, s.T, s.qkv_width()}));
  ops::detail::check_size(op, "att", att, s.B * s.heads * s.T * s.T,
                          "[B, NH, T, T] = " + ops::detail::dims({s.B, s.heads, s.T, s.T}));
  if (s.heads / s.kv_heads > s.head_size) {  // where the backward parks its row sums (attention.cu)
    ops::detail::fail(op, "heads / kv_heads = " + std::to_string(s.heads / s.kv_heads) +
                              " query heads per key/value head exceed head_size = " + std::to_string(s.head_size) +
                              ", which the CUDA kernels need");
  }
  check_grid(op, "T", s.T, INT_MAX);
  check_grid(op, "NH", s.heads, 65535);
  check_grid(op, "B", s.B, 65535);
}

}  // namespace

void attention_forward(void* stream, std::span<const float> qkv, std::span<float> out, std::span<float> att,
                       const AttentionShape& s) {
  constexpr const char* op = "attention_forward";
  check_attention(op, qkv, att, s);
  ops::detail::check_size(op, "out", out, s.B * s.T * s.out_width(),
                          "[B, T, NH hs] = " + ops::detail::dims({s.B, s.T, s.out_width()}));
  ops::detail::check_disjoint(op, "out", out, "qkv", qkv);
  ops::detail::check_disjoint(op, "att", att, "qkv", qkv);
  ops::detail::check_disjoint(op, "att", att, "out", out);
  COSHARD_OPS_CUDA_CHECK(detail::launch_attention_forward(qkv.data(), out.data(), att.data(), s.B, s.T, s.heads,
                                                          s.kv_heads, s.head_size, as_stream(stream)));
}

void attention_backward(void* stream, std::span<const float> dout, std::span<const float> qkv,
                        std::span<const float> att, std::span<float> dqkv, const AttentionShape& s) {
  constexpr const char* op = "attention_backward";
  check_attention(op, qkv, att, s);
  ops::detail::check_size(op, "dout", dout, s.B * s.T * s.out_width(),
                          "[B, T, NH hs] = " + ops::detail::dims({s.B, s.T, s.out_width()}));
  ops::detail::check_size(op, "dqkv", dqkv, s.B * s.T * s.qkv_width(),
                          "[B, T, (NH + 2 NKV) hs] = " + ops::detail::dims({s.B, s.T, s.qkv_width()}));
  ops::detail::check_disjoint(op, "dqkv", dqkv, "dout", dout);
  ops::detail::check_disjoint(op, "dqkv", dqkv, "qkv", qkv);
  ops::detail::check_disjoint(op, "dqkv", dqkv, "att", att);
  COSHARD_OPS_CUDA_CHECK(detail::launch_attention_backward(dout.data(), qkv.data(), att.data(), dqkv.data(), s.B, s.T,
                                                           s.heads, s.kv_heads, s.head_size, as_stream(stream)));
}

void attention_forward(void* stream, std::span<const float> qkv, std::span<float> out, std::span<float> att,
                       std::size_t B, std::size_t T, std::size_t C, std::size_t NH) {
  constexpr const char* op = "attention_forward";
  ops::detail::check_heads(op, C, NH);
  ops::detail::check_size(op, "qkv", qkv, B * T * 3 * C, "[B, T, 3C] = " + ops::detail::dims({B, T, 3 * C}));
  ops::detail::check_size(op, "out", out, B * T * C, "[B, T, C] = " + ops::detail::dims({B, T, C}));
  attention_forward(stream, qkv, out, att, AttentionShape{B, T, NH, NH, C / NH});
}

void attention_backward(void* stream, std::span<const float> dout, std::span<const float> qkv,
                        std::span<const float> att, std::span<float> dqkv, std::size_t B, std::size_t T,
                        std::size_t C, std::size_t NH) {
  constexpr const char* op = "attention_backward";
  ops::detail::check_heads(op, C, NH);
  ops::detail::check_size(op, "dout", dout, B * T * C, "[B, T, C] = " + ops::detail::dims({B, T, C}));
  ops::detail::check_size(op, "qkv", qkv, B * T * 3 * C, "[B, T, 3C] = " + ops::detail::dims({B, T, 3 * C}));
  ops::detail::check_size(op, "dqkv", dqkv, B * T * 3 * C, "[B, T, 3C] = " + ops::detail::dims({B, T, 3 * C}));
  attention_backward(stream, dout, qkv, att, dqkv, AttentionShape{B, T, NH, NH, C / NH});
}

// ---- casts ----

namespace {
template <class In, class Out>
void check_cast(std::span<In> in, std::span<Out> out, const char* what) {
  if (in.size() != out.size()) {
    throw Error(Errc::invalid_argument, std::string(what) + ": input has " + std::to_string(in.size()) +
                                            " elements but output has " + std::to_string(out.size()));
  }
}
}  // namespace

void cast_f32_to_bf16(void* stream, std::span<const float> in, std::span<std::uint16_t> out) {
  check_cast(in, out, "cast_f32_to_bf16");
  COSHARD_OPS_CUDA_CHECK(detail::launch_f32_to_bf16(in.data(), out.data(), in.size(), as_stream(stream)));
}
void cast_bf16_to_f32(void* stream, std::span<const std::uint16_t> in, std::span<float> out) {
  check_cast(in, out, "cast_bf16_to_f32");
  COSHARD_OPS_CUDA_CHECK(detail::launch_bf16_to_f32(in.data(), out.data(), in.size(), as_stream(stream)));
}
void cast_f32_to_f16(void* stream, std::span<const float> in, std::span<std::uint16_t> out) {
  check_cast(in, out, "cast_f32_to_f16");
  COSHARD_OPS_CUDA_CHECK(detail::launch_f32_to_f16(in.data(), out.data(), in.size(), as_stream(stream)));
}
void cast_f16_to_f32(void* stream, std::span<const std::uint16_t> in, std::span<float> out) {
  check_cast(in, out, "cast_f16_to_f32");
  COSHARD_OPS_CUDA_CHECK(detail::launch_f16_to_f32(in.data(), out.data(), in.size(), as_stream(stream)));
}

// ---- the FSDP engine's casts ----

namespace {
int dtype_code(DType dtype, const char* op) {
  switch (dtype) {
    case DType::f32: return 0;
    case DType::bf16: return 1;
    case DType::f16: return 2;
    default: break;
  }
  throw Error(Errc::invalid_argument, std::string(op) + ": f32, bf16 or f16, not " + std::string(to_string(dtype)));
}
}  // namespace

void cast_scaled(void* stream, std::span<const float> in, void* out, DType dtype, float scale) {
  COSHARD_OPS_CUDA_CHECK(detail::launch_cast_scaled(in.data(), out, dtype_code(dtype, "cast_scaled"), scale, in.size(),
                                                    as_stream(stream)));
}

void widen(void* stream, const void* in, DType dtype, std::span<float> out) {
  COSHARD_OPS_CUDA_CHECK(detail::launch_widen(in, dtype_code(dtype, "widen"), out.data(), out.size(), as_stream(stream)));
}

void accumulate_scaled(void* stream, std::span<float> acc, const void* x, DType x_dtype, float scale, DType round) {
  COSHARD_OPS_CUDA_CHECK(detail::launch_accumulate_scaled(acc.data(), x, dtype_code(x_dtype, "accumulate_scaled"), scale,
                                                          dtype_code(round, "accumulate_scaled"), acc.size(),
                                                          as_stream(stream)));
}

void round_through(void* stream, std::span<const float> in, std::span<float> out, DType dtype) {
  check_cast(in, out, "round_through");
  COSHARD_OPS_CUDA_CHECK(detail::launch_round_through(in.data(), out.data(), dtype_code(dtype, "round_through"),
                                                      in.size(), as_stream(stream)));
}

// ---- gradient norm ----

namespace {
int norm_code(NormType type) { return type == NormType::l2 ? 0 : type == NormType::l1 ? 1 : 2; }
}  // namespace

void norm_partial(void* stream, std::span<const std::span<const float>> buffers, NormType type,
                  std::span<double> partial) {
  constexpr const char* op = "norm_partial";
  ops::detail::check_size(op, "partial", partial, 1, "one double in device memory");
  const cudaStream_t s = as_stream(stream);
  std::size_t count = 0;
  for (auto buf : buffers) count += detail::norm_blocks(buf.size());
  // Per-block partials of every buffer, then one block reduces them in a fixed order.
  detail::StreamScratch<double> scratch(count, s);
  std::size_t offset = 0;
  for (auto buf : buffers) {
    COSHARD_OPS_CUDA_CHECK(
        detail::launch_norm_blocks(buf.data(), buf.size(), norm_code(type), scratch.get() + offset, s));
    offset += detail::norm_blocks(buf.size());
  }
  COSHARD_OPS_CUDA_CHECK(detail::launch_norm_finish(scratch.get(), count, norm_code(type), partial.data(), s));
}

double norm_partial(void* stream, std::span<const std::span<const float>> buffers, NormType type) {
  const cudaStream_t s = as_stream(stream);
  detail::StreamScratch<double> result(1, s);
  norm_partial(stream, buffers, type, std::span<double>(result.get(), 1));
  double host = 0.0;
  COSHARD_OPS_CUDA_CHECK(cudaMemcpyAsync(&host, result.get(), sizeof(double), cudaMemcpyDeviceToHost, s));
  COSHARD_OPS_CUDA_CHECK(cudaStreamSynchronize(s));
  return host;
}

double grad_norm(void* stream, std::span<const std::span<const float>> buffers, NormType type) {
  return ops::norm_finish(norm_partial(stream, buffers, type), type);
}

void scale_inplace(void* stream, std::span<float> buffer, float s) {
  COSHARD_OPS_CUDA_CHECK(detail::launch_scale(buffer.data(), s, buffer.size(), as_stream(stream)));
}

// ---- optimizers ----

void adamw_update(void* stream, std::span<float> param, std::span<const float> grad, std::span<float> exp_avg,
                  std::span<float> exp_avg_sq, std::int64_t step, double lr, double beta1, double beta2, double eps,
                  double weight_decay) {
  constexpr const char* op = "adamw_update";
  const std::size_t n = param.size();
  ops::detail::check_size(op, "grad", grad, n, "size of param");
  ops::detail::check_size(op, "exp_avg", exp_avg, n, "size of param");
  ops::detail::check_size(op, "exp_avg_sq", exp_avg_sq, n, "size of param");
  if (step < 1) ops::detail::fail(op, "step must be >= 1 (1 for the first update), got " + std::to_string(step));
  ops::detail::check_nonneg(op, "lr", lr);
  ops::detail::check_beta(op, "beta1", beta1);
  ops::detail::check_beta(op, "beta2", beta2);
  ops::detail::check_nonneg(op, "eps", eps);
  ops::detail::check_nonneg(op, "weight_decay", weight_decay);
  ops::detail::check_disjoint(op, "param", param, "grad", grad);
  ops::detail::check_disjoint(op, "param", param, "exp_avg", exp_avg);
  ops::detail::check_disjoint(op, "param", param, "exp_avg_sq", exp_avg_sq);
  ops::detail::check_disjoint(op, "exp_avg", exp_avg, "exp_avg_sq", exp_avg_sq);
  ops::detail::check_disjoint(op, "exp_avg", exp_avg, "grad", grad);
  ops::detail::check_disjoint(op, "exp_avg_sq", exp_avg_sq, "grad", grad);

  // The same scalars as the CPU version (double, then float).
  const auto s = static_cast<double>(step);
  const double bc1 = 1.0 - std::pow(beta1, s);
  const double bc2 = 1.0 - std::pow(beta2, s);
  const detail::AdamWScalars k{static_cast<float>(1.0 - lr * weight_decay),
                               static_cast<float>(1.0 - beta1),
                               static_cast<float>(beta2),
                               static_cast<float>(1.0 - beta2),
                               static_cast<float>(lr / bc1),
                               static_cast<float>(std::sqrt(bc2)),
                               static_cast<float>(eps)};
  COSHARD_OPS_CUDA_CHECK(detail::launch_adamw(param.data(), grad.data(), exp_avg.data(), exp_avg_sq.data(), n, k,
                                              as_stream(stream)));
}

void adamw_step(void* stream, std::span<float> param, std::span<const float> grad, std::span<float> exp_avg,
                std::span<float> exp_avg_sq, std::int64_t& step, const AdamWOptions& opt,
                std::span<const ParamRange> ranges) {
  constexpr const char* op = "adamw_step";
  const std::size_t n = param.size();
  ops::detail::check_size(op, "grad", grad, n, "size of param");
  ops::detail::check_size(op, "exp_avg", exp_avg, n, "size of param");
  ops::detail::check_size(op, "exp_avg_sq", exp_avg_sq, n, "size of param");
  const auto rs = ops::detail::checked_ranges(op, ranges, n);
  const std::int64_t next = step + 1;
  for (const auto& r : rs) {
    adamw_update(stream, param.subspan(r.offset, r.size), grad.subspan(r.offset, r.size),
                 exp_avg.subspan(r.offset, r.size), exp_avg_sq.subspan(r.offset, r.size), next, opt.lr, opt.beta1,
                 opt.beta2, opt.eps, r.weight_decay ? opt.weight_decay : 0.0);
  }
  step = next;
}

void sgd_update(void* stream, std::span<float> param, std::span<const float> grad, std::span<float> momentum_buffer,
                bool first_step, double lr, double momentum, double dampening, double weight_decay, bool nesterov) {
  constexpr const char* op = "sgd_update";
  const std::size_t n = param.size();
  ops::detail::check_size(op, "grad", grad, n, "size of param");
  ops::detail::check_nonneg(op, "lr", lr);
  ops::detail::check_nonneg(op, "momentum", momentum);
  ops::detail::check_nonneg(op, "weight_decay", weight_decay);
  if (nesterov && (momentum <= 0.0 || dampening != 0.0)) {
    ops::detail::fail(op, "nesterov needs momentum > 0 and dampening == 0 (got momentum " + std::to_string(momentum) +
                              ", dampening " + std::to_string(dampening) + ")");
  }
  if (momentum != 0.0) ops::detail::check_size(op, "momentum_buffer", momentum_buffer, n, "size of param");
  ops::detail::check_disjoint(op, "param", param, "grad", grad);
  ops::detail::check_disjoint(op, "param", param, "momentum_buffer", momentum_buffer);
  ops::detail::check_disjoint(op, "momentum_buffer", momentum_buffer, "grad", grad);

  const detail::SGDScalars k{static_cast<float>(weight_decay), static_cast<float>(momentum),
                             static_cast<float>(1.0 - dampening), static_cast<float>(-lr), first_step, nesterov};
  float* buf = momentum == 0.0 ? nullptr : momentum_buffer.data();
  COSHARD_OPS_CUDA_CHECK(detail::launch_sgd(param.data(), grad.data(), buf, n, k, as_stream(stream)));
}

void sgd_step(void* stream, std::span<float> param, std::span<const float> grad, std::span<float> momentum_buffer,
              bool& has_buffer, const SGDOptions& opt, std::span<const ParamRange> ranges) {
  constexpr const char* op = "sgd_step";
  const std::size_t n = param.size();
  ops::detail::check_size(op, "grad", grad, n, "size of param");
  if (opt.momentum != 0.0) ops::detail::check_size(op, "momentum_buffer", momentum_buffer, n, "size of param");
  const auto rs = ops::detail::checked_ranges(op, ranges, n);
  for (const auto& r : rs) {
    auto buf = opt.momentum != 0.0 ? momentum_buffer.subspan(r.offset, r.size) : std::span<float>();
    sgd_update(stream, param.subspan(r.offset, r.size), grad.subspan(r.offset, r.size), buf, !has_buffer, opt.lr,
               opt.momentum, opt.dampening, r.weight_decay ? opt.weight_decay : 0.0, opt.nesterov);
  }
  if (opt.momentum != 0.0) has_buffer = true;
}

}  // namespace coshard::ops::cuda
