// The AVX512-BF16 GEMM (gemm_bf16.hpp), blocked as GotoBLAS: B in blocks of kc x nc packed into
// panels of nr columns, A in blocks of mc x kc packed into panels of mr rows, and a micro-kernel
// that keeps an mr x nr tile of C in 24 zmm registers while it walks k two at a time. Built with
// -march=x86-64-v4 -mavx512bf16 (ops/CMakeLists.txt) and called only where the CPU has
// avx512_bf16; nothing here but table() has external linkage (no std:: templates).
#include <immintrin.h>

#include <cstring>

#include "gemm_bf16.hpp"

namespace coshard::ops::detail::isa_avx512_bf16 {
namespace {

// mr x nr = 12 x 32: 24 accumulators, two B vectors and a broadcast A pair fill 27 of the 32 zmm
// registers. kc = 512, mc = 192 measured fastest on Zen 4 (1024 x 768 x 3072: 152 GFLOP/s, against
// 145 with kc = 256 and 102 for OpenBLAS sgemm); B's block is one GPT-2 MLP width.
constexpr std::size_t kMr = 12, kNr = 32, kMc = 192, kKc = 512, kNc = 3072;

inline std::size_t lesser(std::size_t a, std::size_t b) { return a < b ? a : b; }

// kernels::f32_to_bf16, repeated here with internal linkage (an inline function from a header
// would be a weak symbol built for AVX-512): ties to even, NaN kept quiet.
inline std::uint16_t to_bf16(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x0040u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(u >> 16);
}
inline std::uint16_t bits(float v) { return to_bf16(v); }
inline std::uint16_t bits(std::uint16_t v) { return v; }

// The walk both row-wise packers share: panels of W rows, rows past the end zero, and
// fill(d, row) writing one row's (kc + 1) / 2 words W apart from d.
template <std::size_t W, class Fill>
void each_row(std::size_t rows, std::size_t kc, std::uint32_t* dst, Fill&& fill) {
  const std::size_t kp = (kc + 1) / 2;
  for (std::size_t p0 = 0; p0 < rows; p0 += W) {
    const std::size_t n = lesser(W, rows - p0);
    for (std::size_t r = 0; r < W; ++r) {
      if (r < n) {
        fill(dst + r, p0 + r);
      } else {
        for (std::size_t p = 0; p < kp; ++p) dst[r + p * W] = 0;
      }
    }
    dst += kp * W;
  }
}

// Packs rows [r0, r0 + rows) x k [k0, k0 + kc) of a matrix whose element (r, k) is
// src[r * rs + k * cs] into panels of W rows: dst[panel][k / 2][row] holds the pair (k, k + 1) as
// one word, low half first (vdpbf16ps's order). Rows past the end and an odd k's partner are 0.
template <class T, std::size_t W>
void pack(const T* src, std::size_t rs, std::size_t cs, std::size_t r0, std::size_t rows, std::size_t k0,
          std::size_t kc, std::uint32_t* dst) {
  each_row<W>(rows, kc, dst, [&](std::uint32_t* d, std::size_t r) {
    const T* s = src + (r0 + r) * rs + k0 * cs;
    for (std::size_t p = 0; p < kc / 2; ++p) {
      d[p * W] = bits(s[2 * p * cs]) | (static_cast<std::uint32_t>(bits(s[(2 * p + 1) * cs])) << 16);
    }
    if (kc & 1) d[(kc / 2) * W] = bits(s[(kc - 1) * cs]);
  });
}

inline __mmask16 first_lanes(std::size_t n) {
  return n >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << n) - 1u);
}

// n <= 32 consecutive values as 32 bf16, zero past n: f32 rounded to nearest even by the
// instruction (which, like vdpbf16ps, treats subnormals as zero), bf16 as they are.
inline __m512i bf16_run(const float* s, std::size_t n) {
  const __m512 lo = _mm512_maskz_loadu_ps(first_lanes(n), s);
  const __m512 hi = _mm512_maskz_loadu_ps(n > 16 ? first_lanes(n - 16) : 0, s + 16);
  return reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(hi, lo));
}
inline __m512i bf16_run(const std::uint16_t* s, std::size_t n) {
  const auto mask = n >= 32 ? static_cast<__mmask32>(0xffffffffu) : static_cast<__mmask32>((1u << n) - 1u);
  return _mm512_maskz_loadu_epi16(mask, s);
}

// vpermt2w indices that interleave two runs a, b of 32 bf16 into pairs (a[j], b[j]): columns
// 0..15, then 16..31.
alignas(64) constexpr std::uint16_t kPairsLo[32] = {0, 32, 1, 33, 2,  34, 3,  35, 4,  36, 5,  37, 6,  38, 7,  39,
                                                    8, 40, 9, 41, 10, 42, 11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
alignas(64) constexpr std::uint16_t kPairsHi[32] = {16, 48, 17, 49, 18, 50, 19, 51, 20, 52, 21, 53, 22, 54, 23, 55,
                                                    24, 56, 25, 57, 26, 58, 27, 59, 28, 60, 29, 61, 30, 62, 31, 63};

// pack() where a panel's rows are consecutive in memory (rs = 1: B of a row-major weight, A of
// x^T): per k pair, two runs of W values interleaved and stored as W words at once.
template <class T, std::size_t W>
void pack_rows_together(const T* src, std::size_t cs, std::size_t r0, std::size_t rows, std::size_t k0,
                        std::size_t kc, std::uint32_t* dst) {
  static_assert(W == 32 || W <= 16);
  const __m512i lo_idx = _mm512_load_si512(kPairsLo), hi_idx = _mm512_load_si512(kPairsHi);
  const std::size_t kp = (kc + 1) / 2;
  for (std::size_t p0 = 0; p0 < rows; p0 += W) {
    const std::size_t n = lesser(W, rows - p0);
    const T* s = src + r0 + p0 + k0 * cs;
    for (std::size_t p = 0; p < kp; ++p) {
      const __m512i a = bf16_run(s + 2 * p * cs, n);
      const __m512i b = 2 * p + 1 < kc ? bf16_run(s + (2 * p + 1) * cs, n) : _mm512_setzero_si512();
      const __m512i pairs = _mm512_permutex2var_epi16(a, lo_idx, b);
      if constexpr (W == 32) {
        _mm512_storeu_si512(dst + p * W, pairs);
        _mm512_storeu_si512(dst + p * W + 16, _mm512_permutex2var_epi16(a, hi_idx, b));
      } else {
        _mm512_mask_storeu_epi32(dst + p * W, first_lanes(W), pairs);
      }
    }
    dst += kp * W;
  }
}

// pack() where a row's k run is consecutive (cs = 1: A of x or dy, B of an out_in weight): 32
// values make 16 pair words at once, scattered W words apart.
template <class T, std::size_t W>
void pack_k_together(const T* src, std::size_t rs, std::size_t r0, std::size_t rows, std::size_t k0, std::size_t kc,
                     std::uint32_t* dst) {
  const __m512i apart = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                           _mm512_set1_epi32(static_cast<int>(W)));
  const std::size_t kp = (kc + 1) / 2;
  each_row<W>(rows, kc, dst, [&](std::uint32_t* d, std::size_t r) {
    const T* s = src + (r0 + r) * rs + k0;
    for (std::size_t p = 0; p < kp; p += 16) {
      const __m512i words = bf16_run(s + 2 * p, lesser(32, kc - 2 * p));
      _mm512_mask_i32scatter_epi32(d + p * W, first_lanes(kp - p), apart, words, 4);
    }
  });
}

// Rows along r with strides (rs, cs) as above; the vector packers where a stride is 1.
template <std::size_t W, class T>
void pack_any(const T* src, std::size_t rs, std::size_t cs, std::size_t r0, std::size_t rows, std::size_t k0,
              std::size_t kc, std::uint32_t* dst) {
  if (rs == 1) {
    pack_rows_together<T, W>(src, cs, r0, rows, k0, kc, dst);
  } else if (cs == 1) {
    pack_k_together<T, W>(src, rs, r0, rows, k0, kc, dst);
  } else {
    pack<T, W>(src, rs, cs, r0, rows, k0, kc, dst);
  }
}

template <std::size_t W>
void pack_operand(const GemmOperand& m, std::size_t rs, std::size_t cs, std::size_t r0, std::size_t rows,
                  std::size_t k0, std::size_t kc, std::uint32_t* dst) {
  if (m.bf16) {
    pack_any<W>(static_cast<const std::uint16_t*>(m.data), rs, cs, r0, rows, k0, kc, dst);
  } else {
    pack_any<W>(static_cast<const float*>(m.data), rs, cs, r0, rows, k0, kc, dst);
  }
}

// C tile [rows <= mr, cols <= nr] (+)= A panel (kp pairs x mr) B panel (kp pairs x nr).
void micro_kernel(std::size_t kp, const std::uint32_t* a, const std::uint32_t* b, float* c, std::size_t ldc, bool add,
                  std::size_t rows, std::size_t cols) {
  __m512 c0[kMr], c1[kMr];
#pragma GCC unroll 12
  for (std::size_t r = 0; r < kMr; ++r) {
    c0[r] = _mm512_setzero_ps();
    c1[r] = _mm512_setzero_ps();
  }
  for (std::size_t p = 0; p < kp; ++p) {
    const auto b0 = reinterpret_cast<__m512bh>(_mm512_loadu_si512(b));
    const auto b1 = reinterpret_cast<__m512bh>(_mm512_loadu_si512(b + 16));
    b += kNr;
#pragma GCC unroll 12
    for (std::size_t r = 0; r < kMr; ++r) {
      const auto av = reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(a[r])));
      c0[r] = _mm512_dpbf16_ps(c0[r], av, b0);
      c1[r] = _mm512_dpbf16_ps(c1[r], av, b1);
    }
    a += kMr;
  }
  const __mmask16 m0 = first_lanes(cols), m1 = cols > 16 ? first_lanes(cols - 16) : 0;
  for (std::size_t r = 0; r < rows; ++r) {
    float* cr = c + r * ldc;
    __m512 v0 = c0[r], v1 = c1[r];
    if (add) {
      v0 = _mm512_add_ps(v0, _mm512_maskz_loadu_ps(m0, cr));
      v1 = _mm512_add_ps(v1, _mm512_maskz_loadu_ps(m1, cr + 16));
    }
    _mm512_mask_storeu_ps(cr, m0, v0);
    _mm512_mask_storeu_ps(cr + 16, m1, v1);
  }
}

void run(const GemmBf16Args& g, std::uint32_t* a_pack, std::uint32_t* b_pack) {
  for (std::size_t jc = 0; jc < g.N; jc += kNc) {
    const std::size_t nc = lesser(kNc, g.N - jc);
    for (std::size_t pc = 0; pc < g.K; pc += kKc) {
      const std::size_t kc = lesser(kKc, g.K - pc), kp = (kc + 1) / 2;
      const bool add = g.accumulate || pc > 0;
      pack_operand<kNr>(g.b, g.b.cs, g.b.rs, jc, nc, pc, kc, b_pack);  // B's panels run along j
      for (std::size_t ic = 0; ic < g.M; ic += kMc) {
        const std::size_t mc = lesser(kMc, g.M - ic);
        pack_operand<kMr>(g.a, g.a.rs, g.a.cs, ic, mc, pc, kc, a_pack);
        for (std::size_t jr = 0; jr < nc; jr += kNr) {
          for (std::size_t ir = 0; ir < mc; ir += kMr) {
            micro_kernel(kp, a_pack + ir * kp, b_pack + jr * kp, g.c + (ic + ir) * g.ldc + jc + jr, g.ldc, add,
                         lesser(kMr, mc - ir), lesser(kNr, nc - jr));
          }
        }
      }
    }
  }
}

}  // namespace

const GemmBf16Kernel& table() {
  static constexpr GemmBf16Kernel k{kMr, kNr, kMc, kKc, kNc, run};
  return k;
}

}  // namespace coshard::ops::detail::isa_avx512_bf16
