#pragma once
// The instruction set of coshard's element-wise CPU kernels (GELU, layernorm, cross-entropy,
// attention's softmax, AdamW). They are built for the x86-64 baseline, AVX2 (x86-64-v3) and
// AVX-512 (x86-64-v4), and each process runs the widest its CPU supports; every choice gives the
// same bits. The environment variable COSHARD_CPU_ISA=baseline|avx2|avx512 asks for a narrower one
// (to compare speed, or to rule the choice out); one the CPU cannot run is an error naming the
// ones it can. f32 GEMMs are OpenBLAS's, which chooses its own kernels.
//
// GEMMs with bf16 weights (linear.hpp) run coshard's AVX512-BF16 kernel where the CPU has
// avx512_bf16 and the AVX-512 kernels are in use, on as many threads as OpenBLAS (blas.hpp);
// elsewhere they round, widen and call OpenBLAS's sgemm. Both give the same sums of the same exact
// products, in a different order.
namespace coshard::ops {

/// "baseline", "avx2" or "avx512": the kernels this process runs (chosen on first use).
/// Throws Errc::invalid_argument when COSHARD_CPU_ISA names one this CPU cannot run.
const char* cpu_isa();

/// "avx512_bf16" or "sgemm": what a GEMM with bf16 weights runs.
const char* cpu_bf16_gemm();

}  // namespace coshard::ops
