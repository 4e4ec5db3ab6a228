#include "device_work.hpp"

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <memory>
#include <span>

#include "convert.hpp"
#include "coshard/runtime/copy.hpp"
#include "coshard/ops/grad_norm.hpp"
#include "cuda_ops.hpp"

namespace coshard::fsdp::detail {
namespace {

bool kernels(Stream& stream, const char* what, std::span<const Tensor* const> tensors) {
  std::size_t defined = 0, device = 0, cuda = 0;
  for (const Tensor* t : tensors) {
    if (!t->defined()) continue;  // an absent optimizer buffer
    ++defined;
    device += t->host_accessible() ? 0 : 1;
    cuda += on_cuda(*t) ? 1 : 0;
  }
  if (device != 0 && device != defined) {
    throw Error(Errc::internal, std::string(what) + " on stream '" + stream.name() +
                                    "' mixes device and host memory: stage the host tensor through copy_tensor");
  }
  if (cuda != 0 && stream.device().kind != DeviceKind::cuda) {
    throw Error(Errc::internal, std::string(what) + " on CUDA memory but stream '" + stream.name() + "' on " +
                                    stream.device().to_string());
  }
  return cuda != 0;
}

void check_sizes(const char* what, const Tensor& a, const Tensor& b) {
  if (a.numel() != b.numel()) {
    throw Error(Errc::internal, std::string(what) + ": " + std::to_string(a.numel()) + " elements against " +
                                    std::to_string(b.numel()));
  }
}

std::span<float> f32_span(const Tensor& t) { return {t.data_as<float>(), static_cast<std::size_t>(t.numel())}; }

// Adds a host loop's bytes and time to `traffic` when it leaves scope (also when the loop throws).
struct Account {
  Traffic traffic;
  std::size_t bytes;
  std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
  ~Account() {
    if (traffic.bytes) traffic.bytes->add(static_cast<double>(bytes));
    if (traffic.seconds) {
      traffic.seconds->add(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
  }
};

}  // namespace

bool runs_as_kernels(Stream& stream, const char* what, std::initializer_list<const Tensor*> tensors) {
  return kernels(stream, what, std::span<const Tensor* const>(tensors.begin(), tensors.size()));
}

void cast_scaled(Stream& stream, const Tensor& dst, const Tensor& src, float scale, std::string span,
                 Traffic traffic) {
  check_sizes("cast_scaled", dst, src);
  if (runs_as_kernels(stream, "cast_scaled", {&dst, &src})) {
    cuda_ops::cast_scaled(stream.impl().native(), f32_span(src), dst.data(), dst.dtype(), scale);
    record_use(stream, {dst, src});  // their blocks are reused only after the kernel
    return;
  }
  stream.enqueue([dst, src, scale, traffic] {
    Account account{traffic, dst.nbytes()};
    // In cache-sized blocks: no full-size f32 temporary (fresh pages cost more than the cast).
    constexpr std::size_t kBlock = 4096;
    float tmp[kBlock];
    const float* s = src.data_as<float>();
    const auto n = static_cast<std::size_t>(src.numel());
    const std::size_t esize = size_of(dst.dtype());
    for (std::size_t at = 0; at < n; at += kBlock) {
      const std::size_t m = std::min(kBlock, n - at);
      const float* from = s + at;
      if (scale != 1.0f) {
        for (std::size_t i = 0; i < m; ++i) tmp[i] = s[at + i] * scale;
        from = tmp;
      }
      cast_from_f32(from, static_cast<std::byte*>(dst.data()) + at * esize, dst.dtype(), m);
    }
  }, std::move(span));
}

void widen(Stream& stream, const Tensor& dst, const Tensor& src, std::string span) {
  check_sizes("widen", dst, src);
  if (runs_as_kernels(stream, "widen", {&dst, &src})) {
    cuda_ops::widen(stream.impl().native(), src.data(), src.dtype(), f32_span(dst));
    record_use(stream, {dst, src});
    return;
  }
  stream.enqueue([dst, src] {
    cast_to_f32(src.data(), src.dtype(), dst.data_as<float>(), static_cast<std::size_t>(dst.numel()));
  }, std::move(span));
}

void round_through(Stream& stream, const Tensor& dst, const Tensor& src, DType dtype, std::string span) {
  check_sizes("round_through", dst, src);
  if (runs_as_kernels(stream, "round_through", {&dst, &src})) {
    cuda_ops::round_through(stream.impl().native(), f32_span(src), f32_span(dst), dtype);
    record_use(stream, {dst, src});
    return;
  }
  stream.enqueue([dst, src, dtype] {
    const float* s = src.data_as<float>();
    float* d = dst.data_as<float>();
    for (std::int64_t i = 0; i < src.numel(); ++i) d[i] = detail::round_through(dtype, s[i]);
  }, std::move(span));
}

void accumulate_scaled(Stream& stream, const Tensor& acc, const Tensor& x, float scale, DType round, std::string span,
                       Traffic traffic) {
  check_sizes("accumulate_scaled", acc, x);
  if (runs_as_kernels(stream, "accumulate_scaled", {&acc, &x})) {
    cuda_ops::accumulate_scaled(stream.impl().native(), f32_span(acc), x.data(), x.dtype(), scale, round);
    record_use(stream, {acc, x});
    return;
  }
  stream.enqueue([acc, x, scale, round, traffic] {
    Account account{traffic, x.nbytes()};
    const auto n = static_cast<std::size_t>(acc.numel());
    float* __restrict s = acc.data_as<float>();
    if (x.dtype() == DType::f32 && round == DType::f32) {
      const float* __restrict o = x.data_as<float>();
      for (std::size_t i = 0; i < n; ++i) s[i] += o[i] * scale;
      return;
    }
    constexpr std::size_t kBlock = 4096;
    float tmp[kBlock];
    const std::size_t esize = size_of(x.dtype());
    for (std::size_t at = 0; at < n; at += kBlock) {
      const std::size_t m = std::min(kBlock, n - at);
      cast_to_f32(static_cast<const std::byte*>(x.data()) + at * esize, x.dtype(), tmp, m);
      for (std::size_t i = 0; i < m; ++i) s[at + i] += detail::round_through(round, tmp[i] * scale);
    }
  }, std::move(span));
}

void copy_counted(Stream& stream, const Tensor& dst, const Tensor& src, std::string span, Traffic traffic) {
  if (stream.device().kind == DeviceKind::cuda) {
    // A DMA. Host callbacks around it to time it would queue it behind other streams' host work
    // (the optimizer's, on offload), which CUDA may run one at a time: bytes only.
    copy_tensor(stream, dst, src, std::move(span));
    if (traffic.bytes) traffic.bytes->add(static_cast<double>(dst.nbytes()));
    return;
  }
  check_sizes("copy_counted", dst, src);
  if (dst.dtype() != src.dtype()) throw Error(Errc::internal, "copy_counted: the dtypes differ");
  stream.enqueue([dst, src, traffic] {
    Account account{traffic, dst.nbytes()};
    std::memmove(dst.data(), src.data(), dst.nbytes());
  }, std::move(span));
}

void norm_partial(Stream& stream, std::vector<NormPiece> pieces, ops::NormType type, const Tensor& out,
                  std::shared_ptr<double> partial, std::string span) {
  std::vector<const Tensor*> tensors{&out};
  for (const auto& piece : pieces) tensors.push_back(&piece.grad);
  if (kernels(stream, "norm_partial", tensors)) {
    throw Error(Errc::internal, "norm_partial: CUDA gradients take the norm kernels, not a host loop");
  }
  stream.enqueue([pieces = std::move(pieces), type, out, partial] {
    std::vector<std::span<const float>> spans;
    for (const auto& piece : pieces) spans.emplace_back(piece.grad.data_as<float>() + piece.offset, piece.size);
    *partial = ops::norm_partial(spans, type);
    out.data_as<float>()[0] = static_cast<float>(*partial);
  }, std::move(span));
}

void scale(Stream& stream, const Tensor& t, float c, std::string span) {
  if (runs_as_kernels(stream, "scale", {&t})) {
    cuda_ops::scale_inplace(stream.impl().native(), f32_span(t), c);
    record_use(stream, {t});
    return;
  }
  stream.enqueue([t, c] { ops::scale_inplace(f32_span(t), c); }, std::move(span));
}

}  // namespace coshard::fsdp::detail
