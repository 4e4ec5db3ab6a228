// ops micro-benchmarks: linear forward and backward at GPT-2 small shapes (rows = B*T = 1024),
// each beside bare GEMM calls of the same shapes measured in the same iterations: OpenBLAS calls
// split over the same threads as the op's (ops/src/blas_internal.hpp).
//   LinearForward   vs one sgemm   y = x W           (ours also adds the bias)
//   LinearBackward  vs two sgemms  dx = dy W^T, dW += x^T dy   (ours also sums db)
// The two are timed alternately inside each iteration (the order flips every iteration), so a
// noisy neighbour or a frequency change hits both alike. Counters:
//   GFLOPs      ours (2*rows*in*out per GEMM)      raw_GFLOPs   the bare sgemm calls
//   overhead    ours time / raw time (goal < 1.05) blas_threads the threads both use
//   LinearBf16Forward, LinearBf16Backward: the same ops on bf16 weights (mixed precision) against
//   the same f32 sgemms, so overhead < 1 is what bf16 gains; bf16_kernel is 1 when the
//   AVX512-BF16 kernel ran, 0 for the round-widen-sgemm path (cpu.hpp).
// Threads: 1 unless OPENBLAS_NUM_THREADS says otherwise (coshard's default, see blas.hpp).
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "coshard/ops/blas.hpp"
#include "coshard/ops/cast.hpp"
#include "coshard/ops/cpu.hpp"
#include "coshard/ops/linear.hpp"
#include "blas_internal.hpp"

using namespace coshard;

namespace {

using Clock = std::chrono::steady_clock;

std::vector<float> filled(std::size_t n, float seed) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = seed * static_cast<float>((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
  return v;
}

double seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

// Runs ours and raw alternately; reports ours as the benchmark time and both as counters.
template <class Ours, class Raw>
void compare(benchmark::State& state, double flops, Ours&& ours, Raw&& raw) {
  ours();  // warm-up; also applies the default thread count before the raw calls
  raw();
  double t_ours = 0.0;
  double t_raw = 0.0;
  bool ours_first = true;
  for (auto _ : state) {
    const auto t0 = Clock::now();
    if (ours_first) ours(); else raw();
    const auto t1 = Clock::now();
    if (ours_first) raw(); else ours();
    const auto t2 = Clock::now();
    const double first = seconds(t0, t1), second = seconds(t1, t2);
    const double o = ours_first ? first : second;
    t_ours += o;
    t_raw += ours_first ? second : first;
    state.SetIterationTime(o);
    ours_first = !ours_first;
  }
  const auto n = static_cast<double>(state.iterations());
  state.counters["GFLOPs"] = flops * n / t_ours * 1e-9;
  state.counters["raw_GFLOPs"] = flops * n / t_raw * 1e-9;
  state.counters["overhead"] = t_ours / t_raw;
  state.counters["blas_threads"] = ops::blas_threads();
}

std::vector<std::uint16_t> bf16_of(const std::vector<float>& v) {
  std::vector<std::uint16_t> out(v.size());
  ops::cast_f32_to_bf16(v, out);
  return out;
}

// The weights as the op takes them: f32, or bf16 bits (the raw sgemm keeps the f32 ones).
template <class W>
std::vector<W> weights_as(const std::vector<float>& w) {
  if constexpr (std::is_same_v<W, float>) {
    return w;
  } else {
    return bf16_of(w);
  }
}

template <class W>
void linear_forward_bench(benchmark::State& state) {
  const auto rows = static_cast<std::size_t>(state.range(0));
  const auto in = static_cast<std::size_t>(state.range(1));
  const auto out = static_cast<std::size_t>(state.range(2));
  auto x = filled(rows * in, 1.0f), w = filled(in * out, 0.1f), b = filled(out, 1.0f);
  const auto wo = weights_as<W>(w);
  std::vector<float> y(rows * out), y_raw(rows * out);
  compare(
      state, 2.0 * static_cast<double>(rows * in * out),
      [&] {
        ops::linear_forward(x, std::span<const W>(wo), b, y, rows, in, out);
        benchmark::ClobberMemory();
      },
      [&] {
        ops::detail::sgemm(false, false, rows, out, in, 1.0f, x.data(), in, w.data(), out, 0.0f, y_raw.data(), out);
        benchmark::ClobberMemory();
      });
}

template <class W>
void linear_backward_bench(benchmark::State& state) {
  const auto rows = static_cast<std::size_t>(state.range(0));
  const auto in = static_cast<std::size_t>(state.range(1));
  const auto out = static_cast<std::size_t>(state.range(2));
  auto x = filled(rows * in, 1.0f), w = filled(in * out, 0.1f), dy = filled(rows * out, 0.01f);
  const auto wo = weights_as<W>(w);
  std::vector<float> dx(rows * in), dw(in * out, 0.0f), db(out, 0.0f);
  std::vector<float> dx_raw(rows * in), dw_raw(in * out, 0.0f);
  compare(
      state, 4.0 * static_cast<double>(rows * in * out),
      [&] {
        ops::linear_backward(dy, x, std::span<const W>(wo), dx, dw, db, rows, in, out);
        benchmark::ClobberMemory();
      },
      [&] {
        ops::detail::sgemm(false, true, rows, in, out, 1.0f, dy.data(), out, w.data(), out, 0.0f, dx_raw.data(), in);
        ops::detail::sgemm(true, false, in, out, rows, 1.0f, x.data(), in, dy.data(), out, 1.0f, dw_raw.data(), out);
        benchmark::ClobberMemory();
      });
}

void BM_LinearForward(benchmark::State& state) { linear_forward_bench<float>(state); }
void BM_LinearBackward(benchmark::State& state) { linear_backward_bench<float>(state); }

void BM_LinearBf16Forward(benchmark::State& state) {
  linear_forward_bench<std::uint16_t>(state);
  state.counters["bf16_kernel"] = std::string(ops::cpu_bf16_gemm()) == "avx512_bf16" ? 1 : 0;
}

void BM_LinearBf16Backward(benchmark::State& state) {
  linear_backward_bench<std::uint16_t>(state);
  state.counters["bf16_kernel"] = std::string(ops::cpu_bf16_gemm()) == "avx512_bf16" ? 1 : 0;
}

// GPT-2 small: c_attn 768->2304, attn c_proj 768->768, mlp c_fc 768->3072, mlp c_proj 3072->768.
void gpt2_shapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"rows", "in", "out"});
  for (auto [in, out] : {std::pair{768, 2304}, {768, 768}, {768, 3072}, {3072, 768}}) b->Args({1024, in, out});
}

}  // namespace

BENCHMARK(BM_LinearForward)->Apply(gpt2_shapes)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_LinearBackward)->Apply(gpt2_shapes)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_LinearBf16Forward)->Apply(gpt2_shapes)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_LinearBf16Backward)->Apply(gpt2_shapes)->UseManualTime()->Unit(benchmark::kMillisecond);

BENCHMARK_MAIN();
