#pragma once
// The GEMM behind the linear ops' bf16 weights: C [M, N] = A [M, K] B [K, N] (+ C), each operand
// f32 or bf16 with any strides. Every element of A and B is rounded to bf16 (ties to even), and
// the products, exact in f32, are summed in f32: PyTorch's bf16 linear on the CPU, and what
// cuBLAS does with bf16 inputs and f32 compute.
//
// Two implementations: the AVX512-BF16 kernel (isa/gemm_bf16.cpp, one vdpbf16ps per 16 x 2
// products, twice the multiply-adds of an f32 FMA per instruction) and the portable one
// (gemm_bf16.cpp: round, widen to f32, OpenBLAS sgemm). They differ only in the order of the f32
// sums, and in subnormals, which the instructions count as zero.
#include <cstddef>
#include <cstdint>

namespace coshard::ops::detail {

// Element (r, c) of a matrix at data[r * rs + c * cs]: f32, or bf16 bits.
struct GemmOperand {
  const void* data;
  bool bf16;
  std::size_t rs, cs;
};

struct GemmBf16Args {
  std::size_t M, N, K;
  GemmOperand a, b;  // A (i, k), B (k, j)
  float* c;
  std::size_t ldc;
  bool accumulate;  // C += A B, else C = A B
};

// The AVX512-BF16 kernel packs blocks of A and B into scratch the caller provides, of these many
// 32-bit words (a bf16 pair each), so that the object built for AVX-512 holds no allocation and no
// std:: template (ops/CMakeLists.txt: it exports only table()).
struct GemmBf16Kernel {
  std::size_t mr, nr, mc, kc, nc;  // micro-tile, blocks of A (mc x kc) and B (kc x nc)
  void (*run)(const GemmBf16Args& args, std::uint32_t* a_pack, std::uint32_t* b_pack);
  std::size_t a_words() const { return mc * (kc / 2); }
  std::size_t b_words(std::size_t N) const { return (kc / 2) * (N < nc ? (N + nr - 1) / nr * nr : nc); }
};

namespace isa_avx512_bf16 {
const GemmBf16Kernel& table();
}

// The implementations this build has and this CPU runs, the portable one first; and the one the
// linear ops use: the AVX512-BF16 kernel where the CPU has it and the AVX-512 element-wise kernels
// are chosen (COSHARD_CPU_ISA), on blas_threads() threads.
struct GemmBf16 {
  const char* name;  // "avx512_bf16" or "sgemm"
  void (*run)(const GemmBf16Args& args);
};
struct GemmBf16List {
  GemmBf16 impls[2];
  std::size_t size;
};
GemmBf16List runnable_gemm_bf16();
const GemmBf16& gemm_bf16_for_now();

}  // namespace coshard::ops::detail
