#include "reduce_kernels.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "coshard/kernels/cast.hpp"
#include "env.hpp"

namespace coshard::transport::detail {
namespace {

template <class Load>
void combine(float* __restrict acc, std::size_t n, ReduceOp op, Load load) noexcept {
  if (op == ReduceOp::max) {
    for (std::size_t i = 0; i < n; ++i) acc[i] = std::max(acc[i], load(i));
  } else {
    for (std::size_t i = 0; i < n; ++i) acc[i] += load(i);
  }
}

#if defined(__SSE2__)
// Streaming stores from 64-byte aligned `d`: whole cache lines, never read first.
void stream_lines(std::byte* d, const std::byte* s, std::size_t lines) noexcept {
  for (std::size_t i = 0; i < lines * 64; i += 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 32));
    const __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 48), e);
  }
}
#endif

}  // namespace

std::size_t stream_min_bytes() {
  const auto n = env_bytes("COSHARD_UCX_STREAM_MIN_BYTES").value_or(std::size_t{32} << 20);
  return n == 0 ? ~std::size_t{0} : n;
}

void copy_large(void* dst, const void* src, std::size_t bytes, bool stream) noexcept {
#if defined(__SSE2__)
  if (stream && bytes >= 256) {
    auto* d = static_cast<std::byte*>(dst);
    const auto* s = static_cast<const std::byte*>(src);
    const std::size_t head = std::min(bytes, (64 - reinterpret_cast<std::uintptr_t>(d) % 64) % 64);
    std::memcpy(d, s, head);
    d += head;
    s += head;
    bytes -= head;
    const std::size_t lines = bytes / 64;
    stream_lines(d, s, lines);
    _mm_sfence();  // streaming stores are weakly ordered: visible before whatever follows
    std::memcpy(d + lines * 64, s + lines * 64, bytes - lines * 64);
    return;
  }
#endif
  std::memcpy(dst, src, bytes);
}

namespace {

#if defined(__SSE2__)
// f32: one pass, 16 elements (four vectors) at a time through registers, output written with
// streaming stores (large outputs) or plain ones. Elements [from, to) of the inputs, a multiple
// of 16; `out + from` is 16-byte aligned. std::max(a, b) is (a < b ? b : a), which is MAXPS(b, a), NaNs included.
template <bool kMax, bool kScaled, bool kPosted, bool kStream>
void reduce_f32_sse(float* out, const void* const* in, std::size_t n, std::size_t from, std::size_t to, float scale,
                    float post) noexcept {
  const __m128 vs = _mm_set1_ps(scale), vp = _mm_set1_ps(post);
  auto load = [&](const float* p) {
    const __m128 x = _mm_loadu_ps(p);
    return kScaled ? _mm_mul_ps(x, vs) : x;
  };
  auto combine = [](__m128 acc, __m128 x) { return kMax ? _mm_max_ps(x, acc) : _mm_add_ps(acc, x); };
  auto put = [&](float* p, __m128 x) {
    if constexpr (kPosted) x = _mm_mul_ps(x, vp);
    if constexpr (kStream) {
      _mm_stream_ps(p, x);
    } else {
      _mm_store_ps(p, x);
    }
  };
  const float* first = static_cast<const float*>(in[0]);
  for (std::size_t i = from; i < to; i += 16) {
    __m128 a0 = load(first + i), a1 = load(first + i + 4), a2 = load(first + i + 8), a3 = load(first + i + 12);
    for (std::size_t q = 1; q < n; ++q) {
      const float* p = static_cast<const float*>(in[q]) + i;
      a0 = combine(a0, load(p));
      a1 = combine(a1, load(p + 4));
      a2 = combine(a2, load(p + 8));
      a3 = combine(a3, load(p + 12));
    }
    put(out + i, a0);
    put(out + i + 4, a1);
    put(out + i + 8, a2);
    put(out + i + 12, a3);
  }
  if constexpr (kStream) _mm_sfence();
}

template <bool kMax, bool kScaled, bool kPosted>
void reduce_f32_body(bool stream, float* out, const void* const* in, std::size_t n, std::size_t from, std::size_t to,
                     float scale, float post) noexcept {
  stream ? reduce_f32_sse<kMax, kScaled, kPosted, true>(out, in, n, from, to, scale, post)
         : reduce_f32_sse<kMax, kScaled, kPosted, false>(out, in, n, from, to, scale, post);
}

template <bool kMax>
void reduce_f32_body(bool stream, float* out, const void* const* in, std::size_t n, std::size_t from, std::size_t to,
                     float scale, float post) noexcept {
  const bool scaled = scale != 1.0f, posted = post != 1.0f;
  if (scaled && posted) {
    reduce_f32_body<kMax, true, true>(stream, out, in, n, from, to, scale, post);
  } else if (scaled) {
    reduce_f32_body<kMax, true, false>(stream, out, in, n, from, to, scale, post);
  } else if (posted) {
    reduce_f32_body<kMax, false, true>(stream, out, in, n, from, to, scale, post);
  } else {
    reduce_f32_body<kMax, false, false>(stream, out, in, n, from, to, scale, post);
  }
}

// Elements [from, to) one at a time.
void reduce_f32_scalar(float* out, const void* const* in, std::size_t n, std::size_t from, std::size_t to, float scale,
                       ReduceOp op, float post) noexcept {
  for (std::size_t i = from; i < to; ++i) {
    float a = static_cast<const float*>(in[0])[i] * scale;
    for (std::size_t q = 1; q < n; ++q) {
      const float x = static_cast<const float*>(in[q])[i] * scale;
      a = op == ReduceOp::max ? std::max(a, x) : a + x;
    }
    out[i] = a * post;
  }
}

// True when it did the work: f32 with `out` 4-byte aligned.
bool reduce_f32(float* out, const void* const* in, std::size_t n, std::size_t count, float scale, ReduceOp op,
                float post, bool stream) noexcept {
  if (reinterpret_cast<std::uintptr_t>(out) % alignof(float) != 0) return false;
  const std::size_t head =
      std::min(count, ((16 - reinterpret_cast<std::uintptr_t>(out) % 16) % 16) / sizeof(float));
  const std::size_t body_end = head + (count - head) / 16 * 16;
  reduce_f32_scalar(out, in, n, 0, head, scale, op, post);
  // Never streaming in place: those lines were just read as an input, so are in the cache anyway.
  for (std::size_t q = 0; q < n; ++q) stream = stream && in[q] != out;
  if (op == ReduceOp::max) {
    reduce_f32_body<true>(stream, out, in, n, head, body_end, scale, post);
  } else {
    reduce_f32_body<false>(stream, out, in, n, head, body_end, scale, post);
  }
  reduce_f32_scalar(out, in, n, body_end, count, scale, op, post);
  return true;
}
#endif

}  // namespace

void reduce_inputs(void* out, const void* const* in, std::size_t n, DType dtype, std::size_t count, float scale,
                   ReduceOp op, float post, [[maybe_unused]] bool stream) noexcept {
  if (n == 0 || count == 0) return;
#if defined(__SSE2__)
  if (dtype == DType::f32 && reduce_f32(static_cast<float*>(out), in, n, count, scale, op, post, stream)) return;
#endif
  const std::size_t esize = size_of(dtype);
  auto at = [esize](const void* p, std::size_t i) { return static_cast<const std::byte*>(p) + i * esize; };
  // Tiles of a few KiB: the f32 partial stays in L1 while every input streams through once.
  constexpr std::size_t kTile = 2048;
  alignas(64) float acc[kTile];
  for (std::size_t b = 0; b < count; b += kTile) {
    const std::size_t m = std::min(kTile, count - b);
    load_f32(acc, at(in[0], b), dtype, m, scale);
    for (std::size_t q = 1; q < n; ++q) accumulate(acc, at(in[q], b), dtype, m, scale, op);
    store(static_cast<std::byte*>(out) + b * esize, dtype, acc, m, post);
  }
}

void load_f32(float* __restrict acc, const void* in, DType dtype, std::size_t n, float scale) noexcept {
  switch (dtype) {
    case DType::f32: {
      const auto* __restrict p = static_cast<const float*>(in);
      for (std::size_t i = 0; i < n; ++i) acc[i] = p[i] * scale;
      break;
    }
    case DType::bf16: {
      const auto* __restrict p = static_cast<const std::uint16_t*>(in);
      for (std::size_t i = 0; i < n; ++i) acc[i] = kernels::bf16_to_f32(p[i]) * scale;
      break;
    }
    case DType::f16: {
      const auto* __restrict p = static_cast<const std::uint16_t*>(in);
      for (std::size_t i = 0; i < n; ++i) acc[i] = kernels::f16_to_f32(p[i]) * scale;
      break;
    }
    default: break;
  }
}

void accumulate(float* acc, const void* in, DType dtype, std::size_t n, float scale, ReduceOp op) noexcept {
  switch (dtype) {
    case DType::f32: {
      const auto* __restrict p = static_cast<const float*>(in);
      if (scale == 1.0f) {
        combine(acc, n, op, [p](std::size_t i) { return p[i]; });
      } else {
        combine(acc, n, op, [p, scale](std::size_t i) { return p[i] * scale; });
      }
      break;
    }
    case DType::bf16: {
      const auto* __restrict p = static_cast<const std::uint16_t*>(in);
      combine(acc, n, op, [p, scale](std::size_t i) { return kernels::bf16_to_f32(p[i]) * scale; });
      break;
    }
    case DType::f16: {
      const auto* __restrict p = static_cast<const std::uint16_t*>(in);
      combine(acc, n, op, [p, scale](std::size_t i) { return kernels::f16_to_f32(p[i]) * scale; });
      break;
    }
    default: break;
  }
}

void accumulate_f32(float* acc, const float* other, std::size_t n, ReduceOp op) noexcept {
  const float* __restrict p = other;
  combine(acc, n, op, [p](std::size_t i) { return p[i]; });
}

void finish(void* out, const float* partial, const void* in, DType dtype, std::size_t n, float scale, ReduceOp op,
            float post) noexcept {
  if (dtype == DType::f32 && op == ReduceOp::sum) {
    auto* __restrict o = static_cast<float*>(out);
    const auto* __restrict a = partial;
    const auto* __restrict b = static_cast<const float*>(in);
    if (scale == 1.0f && post == 1.0f) {
      for (std::size_t i = 0; i < n; ++i) o[i] = a[i] + b[i];
    } else {
      for (std::size_t i = 0; i < n; ++i) o[i] = (a[i] + b[i] * scale) * post;
    }
    return;
  }
  // Other dtypes and max: in blocks through a small f32 buffer that stays in cache.
  constexpr std::size_t kBlock = 1024;
  float tmp[kBlock];
  const std::size_t esize = size_of(dtype);
  for (std::size_t at = 0; at < n; at += kBlock) {
    const std::size_t m = std::min(kBlock, n - at);
    std::copy(partial + at, partial + at + m, tmp);
    accumulate(tmp, static_cast<const std::byte*>(in) + at * esize, dtype, m, scale, op);
    store(static_cast<std::byte*>(out) + at * esize, dtype, tmp, m, post);
  }
}

void store(void* out, DType dtype, const float* acc, std::size_t n, float post) noexcept {
  switch (dtype) {
    case DType::f32: {
      auto* __restrict p = static_cast<float*>(out);
      if (post == 1.0f) {
        if (p != acc) std::copy(acc, acc + n, p);
      } else {
        for (std::size_t i = 0; i < n; ++i) p[i] = acc[i] * post;
      }
      break;
    }
    case DType::bf16: {
      auto* __restrict p = static_cast<std::uint16_t*>(out);
      for (std::size_t i = 0; i < n; ++i) p[i] = kernels::f32_to_bf16(acc[i] * post);
      break;
    }
    case DType::f16: {
      auto* __restrict p = static_cast<std::uint16_t*>(out);
      for (std::size_t i = 0; i < n; ++i) p[i] = kernels::f32_to_f16(acc[i] * post);
      break;
    }
    default: break;
  }
}

}  // namespace coshard::transport::detail
