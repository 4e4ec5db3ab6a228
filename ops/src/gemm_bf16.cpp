// The portable bf16 GEMM and the choice between it and the AVX512-BF16 kernel (isa/gemm_bf16.hpp).

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "blas_internal.hpp"
#include "coshard/kernels/cast.hpp"
#include "coshard/ops/cpu.hpp"
#include "isa/gemm_bf16.hpp"
#include "parallel.hpp"

namespace coshard::ops::detail {

namespace {

// Operand (r, c) for r < rows, c < cols, rounded to bf16 and widened back: a row-major f32 copy.
std::vector<float> rounded(const GemmOperand& m, std::size_t rows, std::size_t cols) {
  std::vector<float> out(rows * cols);
  for (std::size_t r = 0; r < rows; ++r) {
    for (std::size_t c = 0; c < cols; ++c) {
      const std::size_t at = r * m.rs + c * m.cs;
      const std::uint16_t h = m.bf16 ? static_cast<const std::uint16_t*>(m.data)[at]
                                     : kernels::f32_to_bf16(static_cast<const float*>(m.data)[at]);
      out[r * cols + c] = kernels::bf16_to_f32(h);
    }
  }
  return out;
}

void zero_or_keep(const GemmBf16Args& g) {
  if (g.accumulate) return;
  for (std::size_t i = 0; i < g.M; ++i) std::memset(g.c + i * g.ldc, 0, g.N * sizeof(float));
}

void run_sgemm(const GemmBf16Args& g) {
  if (g.M == 0 || g.N == 0) return;
  if (g.K == 0) return zero_or_keep(g);
  const std::vector<float> a = rounded(g.a, g.M, g.K), b = rounded(g.b, g.K, g.N);
  sgemm(false, false, g.M, g.N, g.K, 1.0f, a.data(), g.K, b.data(), g.N, g.accumulate ? 1.0f : 0.0f, g.c, g.ldc);
}

#if defined(COSHARD_ISA_X86)
// Columns [n0, n0 + n) of the product: B and C start n0 columns in.
GemmBf16Args columns(const GemmBf16Args& g, std::size_t n0, std::size_t n) {
  GemmBf16Args part = g;
  part.N = n;
  const std::size_t elem = g.b.bf16 ? sizeof(std::uint16_t) : sizeof(float);
  part.b.data = static_cast<const char*>(g.b.data) + n0 * g.b.cs * elem;
  part.c = g.c + n0;
  return part;
}

// The kernel on threads_for() threads (parallel.hpp), each on its own slice of C's columns, a
// multiple of the micro-tile wide.
void run_avx512_bf16(const GemmBf16Args& g) {
  if (g.M == 0 || g.N == 0) return;
  if (g.K == 0) return zero_or_keep(g);
  const GemmBf16Kernel& k = isa_avx512_bf16::table();
  const std::size_t tiles = (g.N + k.nr - 1) / k.nr;
  const std::size_t threads =
      threads_for(static_cast<double>(g.M) * static_cast<double>(g.N) * static_cast<double>(g.K), tiles);
  std::vector<GemmBf16Args> parts;
  for (std::size_t t = 0, done = 0; t < threads; ++t) {
    const std::size_t n = std::min(g.N - done, (tiles * (t + 1) / threads - tiles * t / threads) * k.nr);
    parts.push_back(columns(g, done, n));
    done += n;
  }
  // Packing scratch, up to 3.2 MB a thread, left uninitialised: the packing writes every word the
  // kernel reads, and zeroing it would be one more pass over it per GEMM.
  std::vector<std::unique_ptr<std::uint32_t[]>> scratch;
  for (const auto& p : parts) scratch.push_back(std::make_unique_for_overwrite<std::uint32_t[]>(k.a_words() + k.b_words(p.N)));
  run_parts(parts.size(), [&](std::size_t t) { k.run(parts[t], scratch[t].get(), scratch[t].get() + k.a_words()); });
}

bool cpu_runs_avx512_bf16() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512f") &&
         __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
         __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512cd") && __builtin_cpu_supports("avx2") &&
         __builtin_cpu_supports("fma") && __builtin_cpu_supports("bmi") && __builtin_cpu_supports("bmi2");
}
#endif

}  // namespace

GemmBf16List runnable_gemm_bf16() {
  GemmBf16List list{{{"sgemm", run_sgemm}}, 1};
#if defined(COSHARD_ISA_X86)
  if (cpu_runs_avx512_bf16()) list.impls[list.size++] = {"avx512_bf16", run_avx512_bf16};
#endif
  return list;
}

const GemmBf16& gemm_bf16_for_now() {
  static const GemmBf16List all = runnable_gemm_bf16();
  return std::strcmp(cpu_isa(), "avx512") == 0 ? all.impls[all.size - 1] : all.impls[0];
}

}  // namespace coshard::ops::detail

namespace coshard::ops {

const char* cpu_bf16_gemm() { return detail::gemm_bf16_for_now().name; }

}  // namespace coshard::ops
