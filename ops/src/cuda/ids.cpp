// Host side of the CUDA ops that read ids (embedding, cross-entropy). The ids live in device memory,
// so they are validated on the device: the kernels record the first bad position in a flag, and the
// host reads the flag (and the id at that position) after the kernel and throws the CPU op's error.
#include <cuda_runtime_api.h>

#include <climits>
#include <cstdint>
#include <string>

#include "../check.hpp"
#include "coshard/ops/cuda_ops.hpp"
#include "cuda_check.hpp"
#include "launch.hpp"
#include "scratch.hpp"

namespace coshard::ops::cuda {

using detail::as_stream;

namespace {

constexpr unsigned int kNoBadId = UINT_MAX;

// Positions are reported as unsigned int.
void check_positions(const char* op, std::size_t n) {
  if (n >= kNoBadId) {
    ops::detail::fail(op, "the number of positions " + std::to_string(n) + " exceeds " +
                              std::to_string(kNoBadId - 1));
  }
}

// A device flag preset to "no bad id"; first_bad() synchronises the stream and returns the smallest
// bad position with its id, if any.
class IdFlag {
 public:
  explicit IdFlag(cudaStream_t s) : stream_(s), flag_(1, s) {
    COSHARD_OPS_CUDA_CHECK(cudaMemsetAsync(flag_.get(), 0xff, sizeof(unsigned int), s));
  }
  unsigned int* get() const noexcept { return flag_.get(); }

  struct Bad {
    std::size_t position;
    std::int32_t id;
  };
  // `extra` (optional, device) is copied back in the same synchronisation.
  bool first_bad(const std::int32_t* ids, Bad& out, void* extra_host = nullptr, const void* extra_dev = nullptr,
                 std::size_t extra_bytes = 0) {
    unsigned int pos = kNoBadId;
    COSHARD_OPS_CUDA_CHECK(cudaMemcpyAsync(&pos, flag_.get(), sizeof pos, cudaMemcpyDeviceToHost, stream_));
    if (extra_bytes != 0) {
      COSHARD_OPS_CUDA_CHECK(cudaMemcpyAsync(extra_host, extra_dev, extra_bytes, cudaMemcpyDeviceToHost, stream_));
    }
    COSHARD_OPS_CUDA_CHECK(cudaStreamSynchronize(stream_));
    if (pos == kNoBadId) return false;
    std::int32_t id = 0;
    COSHARD_OPS_CUDA_CHECK(cudaMemcpyAsync(&id, ids + pos, sizeof id, cudaMemcpyDeviceToHost, stream_));
    COSHARD_OPS_CUDA_CHECK(cudaStreamSynchronize(stream_));
    out = {pos, id};
    return true;
  }

 private:
  cudaStream_t stream_;
  detail::StreamScratch<unsigned int> flag_;
};

template <class Table>
void check_embedding_forward(const char* op, std::span<const std::int32_t> tokens, std::span<const Table> wte,
                             std::span<const Table> wpe, std::span<float> out, std::size_t B, std::size_t T,
                             std::size_t C, std::size_t V) {
  ops::detail::check_embedding_shapes(op, tokens.size(), wte.size(), wpe.size(), out.size(), B, T, C, V, false);
  ops::detail::check_disjoint(op, "out", out, "wte", wte);
  ops::detail::check_disjoint(op, "out", out, "wpe", wpe);
  check_positions(op, B * T);
}

void check_embedding_backward(const char* op, std::span<const float> dout, std::span<const std::int32_t> tokens,
                              std::span<float> dwte, std::span<float> dwpe, std::size_t B, std::size_t T,
                              std::size_t C, std::size_t V) {
  ops::detail::check_embedding_shapes(op, tokens.size(), dwte.size(), dwpe.size(), dout.size(), B, T, C, V, true);
  ops::detail::check_disjoint(op, "dwte", dwte, "dout", dout);
  ops::detail::check_disjoint(op, "dwpe", dwpe, "dout", dout);
  ops::detail::check_disjoint(op, "dwte", dwte, "dwpe", dwpe);
  check_positions(op, B * T);
}

void launch_embedding_backward(std::span<const float> dout, std::span<const std::int32_t> tokens,
                               std::span<float> dwte, std::span<float> dwpe, std::size_t B, std::size_t T,
                               std::size_t C, std::size_t V, cudaStream_t s) {
  COSHARD_OPS_CUDA_CHECK(detail::launch_embedding_backward(dout.data(), tokens.data(),
                                                           dwte.empty() ? nullptr : dwte.data(),
                                                           dwpe.empty() ? nullptr : dwpe.data(), B, T, C, V, s));
}

void check_cross_entropy(const char* op, std::span<const float> logits, std::span<const std::int32_t> targets,
                         std::span<const float> lse, std::size_t N, std::size_t V) {
  ops::detail::check_positive(op, "N", N);
  ops::detail::check_positive(op, "V", V);
  ops::detail::check_size(op, "logits", logits, N * V, "[N, V] = " + ops::detail::dims({N, V}));
  ops::detail::check_size(op, "targets", targets, N, "[N] = " + ops::detail::dims({N}));
  ops::detail::check_size(op, "lse", lse, N, "[N] = " + ops::detail::dims({N}));
  check_positions(op, N);
}

void check_cross_entropy_forward(const char* op, std::span<const float> logits, std::span<const std::int32_t> targets,
                                 std::span<float> lse, std::size_t N, std::size_t V) {
  check_cross_entropy(op, logits, targets, lse, N, V);
  ops::detail::check_disjoint(op, "lse", lse, "logits", logits);
  if (N > static_cast<std::size_t>(INT_MAX)) {
    ops::detail::fail(op, "N = " + std::to_string(N) + " exceeds the CUDA grid limit " + std::to_string(INT_MAX));
  }
}

void check_cross_entropy_backward(const char* op, std::span<const float> logits, std::span<const std::int32_t> targets,
                                  std::span<const float> lse, std::span<float> dlogits, std::size_t N, std::size_t V) {
  check_cross_entropy(op, logits, targets, lse, N, V);
  ops::detail::check_size(op, "dlogits", dlogits, N * V, "[N, V] = " + ops::detail::dims({N, V}));
  ops::detail::check_disjoint(op, "dlogits", dlogits, "logits", logits);
  ops::detail::check_disjoint(op, "dlogits", dlogits, "lse", lse);
}

}  // namespace

// ---- embedding ----

void embedding_forward(void* stream, std::span<const std::int32_t> tokens, std::span<const float> wte,
                       std::span<const float> wpe, std::span<float> out, std::size_t B, std::size_t T, std::size_t C,
                       std::size_t V) {
  constexpr const char* op = "embedding_forward";
  check_embedding_forward(op, tokens, wte, wpe, out, B, T, C, V);
  if (B * T == 0) return;
  const cudaStream_t s = as_stream(stream);
  IdFlag flag(s);
  COSHARD_OPS_CUDA_CHECK(detail::launch_embedding_forward(tokens.data(), wte.data(), wpe.empty() ? nullptr : wpe.data(), out.data(), B, T, C,
                                                          V, flag.get(), s));
  IdFlag::Bad bad{};
  if (flag.first_bad(tokens.data(), bad)) ops::detail::fail_token(op, bad.id, bad.position, T, V);
}

namespace {

template <class Table>
void embedding_forward_checked(void* stream, CheckedIds tokens, std::span<const Table> wte, std::span<const Table> wpe,
                               std::span<float> out, std::size_t B, std::size_t T, std::size_t C, std::size_t V) {
  check_embedding_forward("embedding_forward", tokens.ids, wte, wpe, out, B, T, C, V);
  if (B * T == 0) return;
  const cudaStream_t s = as_stream(stream);
  IdFlag unread(s);  // the kernel reports bad ids; these were checked before they were uploaded
  COSHARD_OPS_CUDA_CHECK(detail::launch_embedding_forward(tokens.ids.data(), wte.data(), wpe.empty() ? nullptr : wpe.data(), out.data(), B, T,
                                                          C, V, unread.get(), s));
}

}  // namespace

void embedding_forward(void* stream, CheckedIds tokens, std::span<const float> wte, std::span<const float> wpe,
                       std::span<float> out, std::size_t B, std::size_t T, std::size_t C, std::size_t V) {
  embedding_forward_checked(stream, tokens, wte, wpe, out, B, T, C, V);
}

void embedding_forward(void* stream, CheckedIds tokens, std::span<const std::uint16_t> wte,
                       std::span<const std::uint16_t> wpe, std::span<float> out, std::size_t B, std::size_t T,
                       std::size_t C, std::size_t V) {
  embedding_forward_checked(stream, tokens, wte, wpe, out, B, T, C, V);
}

void embedding_backward(void* stream, std::span<const float> dout, std::span<const std::int32_t> tokens,
                        std::span<float> dwte, std::span<float> dwpe, std::size_t B, std::size_t T, std::size_t C,
                        std::size_t V) {
  constexpr const char* op = "embedding_backward";
  check_embedding_backward(op, dout, tokens, dwte, dwpe, B, T, C, V);
  if (B * T == 0) return;
  const cudaStream_t s = as_stream(stream);
  {
    // Checked before anything is accumulated, as on the CPU: nothing is half-updated on a bad id.
    IdFlag flag(s);
    COSHARD_OPS_CUDA_CHECK(detail::launch_check_ids(tokens.data(), B * T, V, flag.get(), s));
    IdFlag::Bad bad{};
    if (flag.first_bad(tokens.data(), bad)) ops::detail::fail_token(op, bad.id, bad.position, T, V);
  }
  launch_embedding_backward(dout, tokens, dwte, dwpe, B, T, C, V, s);
}

void embedding_backward(void* stream, std::span<const float> dout, CheckedIds tokens, std::span<float> dwte,
                        std::span<float> dwpe, std::size_t B, std::size_t T, std::size_t C, std::size_t V) {
  check_embedding_backward("embedding_backward", dout, tokens.ids, dwte, dwpe, B, T, C, V);
  if (B * T == 0) return;
  launch_embedding_backward(dout, tokens.ids, dwte, dwpe, B, T, C, V, as_stream(stream));
}

// ---- cross-entropy ----

float cross_entropy_forward(void* stream, std::span<const float> logits, std::span<const std::int32_t> targets,
                            std::span<float> lse, std::size_t N, std::size_t V) {
  constexpr const char* op = "cross_entropy_forward";
  check_cross_entropy_forward(op, logits, targets, lse, N, V);
  const cudaStream_t s = as_stream(stream);
  IdFlag flag(s);
  detail::StreamScratch<double> total(1, s);
  COSHARD_OPS_CUDA_CHECK(detail::launch_cross_entropy_forward(logits.data(), targets.data(), lse.data(), total.get(),
                                                              N, V, flag.get(), s));
  double host_total = 0.0;
  IdFlag::Bad bad{};
  if (flag.first_bad(targets.data(), bad, &host_total, total.get(), sizeof host_total)) {
    ops::detail::fail_target(op, bad.id, bad.position, V);
  }
  return static_cast<float>(host_total / static_cast<double>(N));
}

void cross_entropy_forward(void* stream, std::span<const float> logits, CheckedIds targets, std::span<float> lse,
                           std::span<float> loss, std::size_t N, std::size_t V) {
  constexpr const char* op = "cross_entropy_forward";
  check_cross_entropy_forward(op, logits, targets.ids, lse, N, V);
  ops::detail::check_size(op, "loss", loss, 1, "one float");
  const cudaStream_t s = as_stream(stream);
  IdFlag unread(s);
  detail::StreamScratch<double> total(1, s);
  COSHARD_OPS_CUDA_CHECK(detail::launch_cross_entropy_forward(logits.data(), targets.ids.data(), lse.data(),
                                                              total.get(), N, V, unread.get(), s));
  COSHARD_OPS_CUDA_CHECK(detail::launch_mean(total.get(), N, loss.data(), s));
}

void cross_entropy_backward(void* stream, std::span<const float> logits, std::span<const std::int32_t> targets,
                            std::span<const float> lse, std::span<float> dlogits, std::size_t N, std::size_t V,
                            float dloss) {
  constexpr const char* op = "cross_entropy_backward";
  check_cross_entropy_backward(op, logits, targets, lse, dlogits, N, V);
  const cudaStream_t s = as_stream(stream);
  IdFlag flag(s);
  const float scale = dloss / static_cast<float>(N);
  COSHARD_OPS_CUDA_CHECK(detail::launch_cross_entropy_backward(logits.data(), targets.data(), lse.data(),
                                                               dlogits.data(), N, V, scale, flag.get(), s));
  IdFlag::Bad bad{};
  if (flag.first_bad(targets.data(), bad)) ops::detail::fail_target(op, bad.id, bad.position, V);
}

void cross_entropy_backward(void* stream, std::span<const float> logits, CheckedIds targets, std::span<const float> lse,
                            std::span<float> dlogits, std::size_t N, std::size_t V, float dloss) {
  check_cross_entropy_backward("cross_entropy_backward", logits, targets.ids, lse, dlogits, N, V);
  const cudaStream_t s = as_stream(stream);
  IdFlag unread(s);
  COSHARD_OPS_CUDA_CHECK(detail::launch_cross_entropy_backward(logits.data(), targets.ids.data(), lse.data(),
                                                               dlogits.data(), N, V, dloss / static_cast<float>(N),
                                                               unread.get(), s));
}

}  // namespace coshard::ops::cuda
