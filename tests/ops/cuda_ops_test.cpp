// CUDA ops (coshard::ops::cuda) against the CPU ops (coshard::ops) on the same seeded inputs:
// copy to the device, run, copy back, compare. Label gpu: every test skips, naming the reason,
// where no CUDA device is usable (the fixture's SetUp runs the skip before the test body).
//
// Errors are norm-wise, max|gpu - cpu| / max|cpu| (gradcheck.hpp's rel_error). Bounds:
//   bitwise equal: casts (all 65536 half patterns and special/tie/random floats), residual add,
//     accumulate, scale, embedding forward (f32 and bf16 tables) and backward (same summation
//     order as the CPU loops), with checked ids as with checking ones
//   1e-6: gelu fwd (device tanhf, 2 ulp), cross-entropy loss and lse, AdamW/SGD after 6 steps
//   5e-6: gelu bwd (the tanhf error amplified through 1 - tanh^2)
//   1e-5: linear fwd/bwd (cuBLAS vs OpenBLAS summation order; bf16 weights: GemmEx vs the CPU's
//     bf16 GEMM, both exact products summed in f32), layernorm fwd/bwd, attention
//     fwd/bwd, cross-entropy dlogits (block reductions instead of sequential sums)
//   1e-12: grad norm partials (double accumulation, different order); inf norm exact
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "coshard/ops/attention.hpp"
#include "coshard/ops/cast.hpp"
#include "coshard/ops/columns.hpp"
#include "coshard/ops/cross_entropy.hpp"
#include "coshard/ops/cuda_ops.hpp"
#include "coshard/ops/embedding.hpp"
#include "coshard/ops/gelu.hpp"
#include "coshard/ops/grad_norm.hpp"
#include "coshard/ops/layernorm.hpp"
#include "coshard/ops/linear.hpp"
#include "coshard/ops/optim.hpp"
#include "coshard/ops/residual.hpp"
#include "coshard/ops/rmsnorm.hpp"
#include "coshard/ops/rope.hpp"
#include "coshard/ops/swiglu.hpp"
#include "coshard/runtime/cuda.hpp"
#include "ops/gradcheck.hpp"

namespace cpu = coshard::ops;
namespace gpu = coshard::ops::cuda;
using coshard::DType;
using coshard::ops::NormType;
using coshard::ops::WeightLayout;
using coshard::testing::expect_invalid;
using coshard::testing::random_floats;

namespace {

// GPU tests skip, naming the reason, where no device is usable.
#define REQUIRE_GPU()                                                        \
  if (auto probe_ = ::coshard::cuda::probe(); probe_.devices == 0) {         \
    GTEST_SKIP() << "no CUDA device: " << probe_.reason;                     \
  }

void cuda_ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

// Owning device buffer for the tests.
template <class T>
class Dev {
 public:
  explicit Dev(std::size_t n) : n_(n) {
    if (n_ != 0) cuda_ok(cudaMalloc(reinterpret_cast<void**>(&p_), n_ * sizeof(T)), "cudaMalloc");
  }
  explicit Dev(const std::vector<T>& h) : Dev(h.size()) { upload(h); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  ~Dev() { cudaFree(p_); }
  void upload(const std::vector<T>& h) {
    if (n_ != 0) cuda_ok(cudaMemcpy(p_, h.data(), n_ * sizeof(T), cudaMemcpyHostToDevice), "cudaMemcpy H2D");
  }
  std::vector<T> host() const {
    std::vector<T> h(n_);
    cuda_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    if (n_ != 0) cuda_ok(cudaMemcpy(h.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
    return h;
  }
  std::span<T> s() { return {p_, n_}; }
  std::span<const T> c() const { return {p_, n_}; }

 private:
  T* p_ = nullptr;
  std::size_t n_ = 0;
};

double rel(const std::vector<float>& got, const std::vector<float>& ref) {
  std::vector<double> r(ref.begin(), ref.end());
  return coshard::testing::rel_error(got, r);
}

template <class T>
void expect_bitwise(const std::vector<T>& got, const std::vector<T>& ref, const char* what) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  std::size_t bad = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (std::memcmp(&got[i], &ref[i], sizeof(T)) != 0 && bad++ < 5) {
      ADD_FAILURE() << what << ": element " << i << " differs";
    }
  }
  EXPECT_EQ(bad, 0u) << what;
}

std::vector<std::int32_t> random_ids(std::size_t n, std::int32_t V, std::uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<std::int32_t> d(0, V - 1);
  std::vector<std::int32_t> v(n);
  for (auto& x : v) x = d(gen);
  return v;
}

class OpsCuda : public ::testing::Test {
 protected:
  void SetUp() override {
    REQUIRE_GPU();
    cuda_ok(cudaStreamCreate(&stream_), "cudaStreamCreate");
  }
  void TearDown() override {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }
  void* st() const { return static_cast<void*>(stream_); }
  cudaStream_t stream_ = nullptr;
};

// ---- linear ----

// Seeded weights: f32, or (W = std::uint16_t) the bf16 bits nearest to the same values.
template <class W>
std::vector<W> random_weights(std::size_t n, std::uint32_t seed) {
  auto v = random_floats(n, seed);
  if constexpr (std::is_same_v<W, float>) {
    return v;
  } else {
    std::vector<W> bits(n);
    cpu::cast_f32_to_bf16(v, bits);
    return bits;
  }
}

// W = float: f32 weights. W = std::uint16_t: bf16 weights, the CPU's bf16 GEMM (x and dy rounded
// to bf16, exact products, f32 sums) against cuBLAS's GemmEx on the same bits; only the summation
// order differs, as for f32.
template <class W>
void check_linear(void* stream, std::size_t rows, std::size_t in, std::size_t out, WeightLayout layout, bool bias) {
  SCOPED_TRACE(std::string(std::is_same_v<W, float> ? "f32" : "bf16") + " rows " + std::to_string(rows) + " in " +
               std::to_string(in) + " out " + std::to_string(out) +
               (layout == WeightLayout::in_out ? " in_out" : " out_in") + (bias ? " bias" : ""));
  auto x = random_floats(rows * in, 1);
  const auto w = random_weights<W>(in * out, 2);
  auto b = bias ? random_floats(out, 3) : std::vector<float>{};
  auto dy = random_floats(rows * out, 4);
  auto dw0 = random_floats(in * out, 5);  // gradients of parameters accumulate
  auto db0 = random_floats(out, 6);

  std::vector<float> y(rows * out), dx(rows * in), dw = dw0, db = db0;
  cpu::linear_forward(x, std::span<const W>(w), b, y, rows, in, out, layout);
  cpu::linear_backward(dy, x, std::span<const W>(w), dx, dw, db, rows, in, out, layout);

  gpu::Blas blas(stream);
  Dev<float> gx(x), gb(b), gy(rows * out), gdy(dy), gdx(rows * in), gdw(dw0), gdb(db0);
  Dev<W> gw(w);
  gpu::linear_forward(blas, gx.c(), gw.c(), gb.c(), gy.s(), rows, in, out, layout);
  gpu::linear_backward(blas, gdy.c(), gx.c(), gw.c(), gdx.s(), gdw.s(), gdb.s(), rows, in, out, layout);
  EXPECT_LT(rel(gy.host(), y), 1e-5);
  EXPECT_LT(rel(gdx.host(), dx), 1e-5);
  EXPECT_LT(rel(gdw.host(), dw), 1e-5);
  EXPECT_LT(rel(gdb.host(), db), 1e-5);
}

TEST_F(OpsCuda, LinearMatchesCpuBothLayouts) {
  for (auto layout : {WeightLayout::in_out, WeightLayout::out_in}) {
    check_linear<float>(st(), 10, 7, 5, layout, true);
    check_linear<float>(st(), 10, 7, 5, layout, false);
    check_linear<float>(st(), 67, 131, 93, layout, true);
  }
}

TEST_F(OpsCuda, LinearWithBf16WeightsMatchesTheCpuBf16Gemm) {
  for (auto layout : {WeightLayout::in_out, WeightLayout::out_in}) {
    check_linear<std::uint16_t>(st(), 10, 7, 5, layout, true);
    check_linear<std::uint16_t>(st(), 67, 131, 93, layout, false);
  }
}

TEST_F(OpsCuda, LinearOptionalGradientsAndBadSizes) {
  const std::size_t rows = 6, in = 4, out = 3;
  Dev<float> x(random_floats(rows * in, 1)), w(random_floats(in * out, 2)), dy(random_floats(rows * out, 3));
  Dev<float> dw(std::vector<float>(in * out, 0.0f)), y(rows * out);
  gpu::Blas blas(st());
  gpu::linear_backward(blas, dy.c(), x.c(), w.c(), {}, dw.s(), {}, rows, in, out);
  std::vector<float> ref(in * out, 0.0f);
  const auto hx = random_floats(rows * in, 1), hw = random_floats(in * out, 2), hdy = random_floats(rows * out, 3);
  cpu::linear_backward(hdy, hx, hw, {}, ref, {}, rows, in, out);
  EXPECT_LT(rel(dw.host(), ref), 1e-5);
  Dev<float> short_x(rows * in - 1);
  expect_invalid([&] { gpu::linear_forward(blas, short_x.c(), w.c(), {}, y.s(), rows, in, out); },
                 {"linear_forward", "x has 23 elements, expected 24", "[rows, in] = [6, 4]"});
}

TEST_F(OpsCuda, BlasHandleMovesAndRebinds) {
  gpu::Blas a(st());
  EXPECT_NE(a.native(), nullptr);
  gpu::Blas b(std::move(a));
  EXPECT_EQ(a.native(), nullptr);  // NOLINT(bugprone-use-after-move): moved-from state is specified
  EXPECT_EQ(b.stream(), st());
  b.set_stream(nullptr);
  EXPECT_EQ(b.stream(), nullptr);
}

// ---- layernorm ----

TEST_F(OpsCuda, LayernormMatchesCpu) {
  for (std::size_t C : {12u, 768u}) {
    SCOPED_TRACE("C " + std::to_string(C));
    const std::size_t rows = 10;
    auto x = random_floats(rows * C, 1, -2.0f, 3.0f);
    auto w = random_floats(C, 2);
    auto b = random_floats(C, 3);
    auto dy = random_floats(rows * C, 4);
    auto dw0 = random_floats(C, 5);
    auto db0 = random_floats(C, 6);
    std::vector<float> y(rows * C), mean(rows), rstd(rows), dx(rows * C), dw = dw0, db = db0;
    cpu::layernorm_forward(x, w, b, y, mean, rstd, rows, C);
    cpu::layernorm_backward(dy, x, w, mean, rstd, dx, dw, db, rows, C);

    Dev<float> gx(x), gw(w), gb(b), gy(rows * C), gm(rows), gr(rows), gdy(dy), gdx(rows * C), gdw(dw0), gdb(db0);
    gpu::layernorm_forward(st(), gx.c(), gw.c(), gb.c(), gy.s(), gm.s(), gr.s(), rows, C);
    gpu::layernorm_backward(st(), gdy.c(), gx.c(), gw.c(), gm.c(), gr.c(), gdx.s(), gdw.s(), gdb.s(), rows, C);
    EXPECT_LT(rel(gy.host(), y), 1e-5);
    EXPECT_LT(rel(gm.host(), mean), 1e-5);
    EXPECT_LT(rel(gr.host(), rstd), 1e-5);
    EXPECT_LT(rel(gdx.host(), dx), 1e-5);
    EXPECT_LT(rel(gdw.host(), dw), 1e-5);
    EXPECT_LT(rel(gdb.host(), db), 1e-5);
  }
}

// ---- element-wise ----

TEST_F(OpsCuda, GeluMatchesCpu) {
  const std::size_t n = 10007;
  auto x = random_floats(n, 1, -6.0f, 6.0f);
  auto dy = random_floats(n, 2);
  std::vector<float> y(n), dx(n);
  cpu::gelu_forward(x, y);
  cpu::gelu_backward(dy, x, dx);
  Dev<float> gx(x), gy(n), gdy(dy), gdx(n);
  gpu::gelu_forward(st(), gx.c(), gy.s());
  gpu::gelu_backward(st(), gdy.c(), gx.c(), gdx.s());
  EXPECT_LT(rel(gy.host(), y), 1e-6);
  EXPECT_LT(rel(gdx.host(), dx), 5e-6);  // tanhf's 2 ulp, amplified through 1 - tanh^2 by x gelu'
}

TEST_F(OpsCuda, ResidualAccumulateScaleAreExact) {
  const std::size_t n = 4099;
  auto a = random_floats(n, 1);
  auto b = random_floats(n, 2);
  std::vector<float> out(n), acc = a;
  cpu::residual_forward(a, b, out);
  cpu::accumulate(acc, b);
  Dev<float> ga(a), gb(b), gout(n);
  gpu::residual_forward(st(), ga.c(), gb.c(), gout.s());
  expect_bitwise(gout.host(), out, "residual_forward");
  gpu::residual_forward(st(), ga.c(), gb.c(), ga.s());  // in place
  expect_bitwise(ga.host(), out, "residual_forward in place");
  Dev<float> gacc(a);
  gpu::accumulate(st(), gacc.s(), gb.c());
  expect_bitwise(gacc.host(), acc, "accumulate");
  cpu::scale_inplace(acc, 0.37f);
  gpu::scale_inplace(st(), gacc.s(), 0.37f);
  expect_bitwise(gacc.host(), acc, "scale_inplace");
  Dev<float> short_b(n - 1);
  expect_invalid([&] { gpu::residual_forward(st(), ga.c(), short_b.c(), gout.s()); },
                 {"residual_forward", "b has 4098 elements, expected 4099"});
}

// ---- casts ----

std::vector<float> cast_inputs() {
  std::vector<float> v = random_floats(20000, 7, -70000.0f, 70000.0f);
  auto small = random_floats(20000, 8, -1e-4f, 1e-4f);
  v.insert(v.end(), small.begin(), small.end());
  const float specials[] = {0.0f, -0.0f, INFINITY, -INFINITY, std::numeric_limits<float>::quiet_NaN(),
                            -std::numeric_limits<float>::quiet_NaN(), std::bit_cast<float>(0x7f800001u),
                            std::bit_cast<float>(0xffc12345u), 65504.0f, 65520.0f, 65519.99f, 1e-8f, 2.9802322e-8f,
                            std::numeric_limits<float>::max(), std::numeric_limits<float>::denorm_min()};
  v.insert(v.end(), std::begin(specials), std::end(specials));
  // Every half value and the midpoints to its neighbours (ties to even), in both formats.
  for (std::uint32_t h = 0; h < 0x10000; h += 7) {
    const auto b = static_cast<std::uint32_t>(h) << 16;
    v.push_back(std::bit_cast<float>(b));
    v.push_back(std::bit_cast<float>(b | 0x8000u));
    v.push_back(cpu::f16_to_f32(static_cast<std::uint16_t>(h)));
    v.push_back(std::bit_cast<float>(std::bit_cast<std::uint32_t>(cpu::f16_to_f32(static_cast<std::uint16_t>(h))) +
                                     0x1000u));
  }
  return v;
}

TEST_F(OpsCuda, CastsAreBitwiseEqualToCpu) {
  auto f = cast_inputs();
  const std::size_t n = f.size();
  std::vector<std::uint16_t> bf(n), hf(n);
  cpu::cast_f32_to_bf16(f, bf);
  cpu::cast_f32_to_f16(f, hf);
  Dev<float> gf(f);
  Dev<std::uint16_t> gbf(n), ghf(n);
  gpu::cast_f32_to_bf16(st(), gf.c(), gbf.s());
  gpu::cast_f32_to_f16(st(), gf.c(), ghf.s());
  expect_bitwise(gbf.host(), bf, "cast_f32_to_bf16");
  expect_bitwise(ghf.host(), hf, "cast_f32_to_f16");

  std::vector<std::uint16_t> all(0x10000);
  for (std::uint32_t h = 0; h < 0x10000; ++h) all[h] = static_cast<std::uint16_t>(h);
  std::vector<float> from_bf(all.size()), from_hf(all.size());
  cpu::cast_bf16_to_f32(all, from_bf);
  cpu::cast_f16_to_f32(all, from_hf);
  Dev<std::uint16_t> gall(all);
  Dev<float> gfrom_bf(all.size()), gfrom_hf(all.size());
  gpu::cast_bf16_to_f32(st(), gall.c(), gfrom_bf.s());
  gpu::cast_f16_to_f32(st(), gall.c(), gfrom_hf.s());
  expect_bitwise(gfrom_bf.host(), from_bf, "cast_bf16_to_f32");
  expect_bitwise(gfrom_hf.host(), from_hf, "cast_f16_to_f32");

  Dev<std::uint16_t> shorter(n - 1);
  expect_invalid([&] { gpu::cast_f32_to_bf16(st(), gf.c(), shorter.s()); }, {"cast_f32_to_bf16", "input has"});
}

// The FSDP engine's casts (fsdp/src/device_work.cpp): bitwise equal to its CPU loops, which are
// these scalar casts element by element.
TEST_F(OpsCuda, EngineCastsAreBitwiseEqualToTheCpuLoops) {
  auto f = cast_inputs();
  const std::size_t n = f.size();
  const float scale = 0.3f;
  std::vector<std::uint16_t> bf(n);
  std::vector<float> widened(n), rounded(n), acc(n, 0.5f);
  for (std::size_t i = 0; i < n; ++i) {
    bf[i] = cpu::f32_to_bf16(f[i] * scale);
    widened[i] = cpu::bf16_to_f32(bf[i]);
    rounded[i] = cpu::f16_to_f32(cpu::f32_to_f16(f[i]));
    acc[i] += cpu::bf16_to_f32(cpu::f32_to_bf16(cpu::bf16_to_f32(bf[i]) * scale));
  }
  Dev<float> gf(f), gwide(n), grounded(n), gacc(std::vector<float>(n, 0.5f));
  Dev<std::uint16_t> gbf(n);
  gpu::cast_scaled(st(), gf.c(), gbf.s().data(), DType::bf16, scale);
  gpu::widen(st(), gbf.c().data(), DType::bf16, gwide.s());
  gpu::round_through(st(), gf.c(), grounded.s(), DType::f16);
  gpu::accumulate_scaled(st(), gacc.s(), gbf.c().data(), DType::bf16, scale, DType::bf16);
  expect_bitwise(gbf.host(), bf, "cast_scaled");
  expect_bitwise(gwide.host(), widened, "widen");
  expect_bitwise(grounded.host(), rounded, "round_through");
  expect_bitwise(gacc.host(), acc, "accumulate_scaled");
  // Unrounded (keep_low_precision_grads off), where nvcc would fuse the multiply and the add.
  std::vector<float> acc32(n, 0.5f);
  for (std::size_t i = 0; i < n; ++i) acc32[i] += f[i] * scale;
  Dev<float> gacc32(std::vector<float>(n, 0.5f));
  gpu::accumulate_scaled(st(), gacc32.s(), gf.c().data(), DType::f32, scale, DType::f32);
  expect_bitwise(gacc32.host(), acc32, "accumulate_scaled, f32 unrounded");
}

// ---- embedding ----

TEST_F(OpsCuda, EmbeddingMatchesCpuWithRepeatedTokens) {
  const std::size_t B = 3, T = 5, C = 37, V = 4, P = 7;  // V = 4: tokens repeat
  auto tok = random_ids(B * T, static_cast<std::int32_t>(V), 1);
  auto wte = random_floats(V * C, 2);
  auto wpe = random_floats(P * C, 3);
  auto dout = random_floats(B * T * C, 4);
  auto dwte0 = random_floats(V * C, 5);
  auto dwpe0 = random_floats(P * C, 6);
  std::vector<float> out(B * T * C), dwte = dwte0, dwpe = dwpe0;
  cpu::embedding_forward(tok, wte, wpe, out, B, T, C, V);
  cpu::embedding_backward(dout, tok, dwte, dwpe, B, T, C, V);

  Dev<std::int32_t> gtok(tok);
  Dev<float> gwte(wte), gwpe(wpe), gout(B * T * C), gdout(dout), gdwte(dwte0), gdwpe(dwpe0);
  gpu::embedding_forward(st(), gtok.c(), gwte.c(), gwpe.c(), gout.s(), B, T, C, V);
  gpu::embedding_backward(st(), gdout.c(), gtok.c(), gdwte.s(), gdwpe.s(), B, T, C, V);
  expect_bitwise(gout.host(), out, "embedding out");
  expect_bitwise(gdwte.host(), dwte, "embedding dwte");
  expect_bitwise(gdwpe.host(), dwpe, "embedding dwpe");
}

// Checked ids (validated on the host): the overloads that never synchronise give the same bits, on
// f32 and on bf16 tables (widened exactly), and the loss stays in device memory.
TEST_F(OpsCuda, CheckedIdOverloadsGiveTheBitsOfTheCheckingOnes) {
  const std::size_t B = 3, T = 5, C = 37, V = 4, P = 7, N = B * T;
  auto tok = random_ids(N, static_cast<std::int32_t>(V), 1);
  auto wte = random_floats(V * C, 2), wpe = random_floats(P * C, 3), dout = random_floats(N * C, 4);
  std::vector<std::uint16_t> wte16(V * C), wpe16(P * C);
  cpu::cast_f32_to_bf16(wte, wte16);
  cpu::cast_f32_to_bf16(wpe, wpe16);
  std::vector<float> out(N * C), out16(N * C), dwte(V * C, 0.0f), dwpe(P * C, 0.0f);
  cpu::embedding_forward(tok, wte, wpe, out, B, T, C, V);
  cpu::embedding_forward(tok, std::span<const std::uint16_t>(wte16), std::span<const std::uint16_t>(wpe16), out16, B,
                         T, C, V);
  cpu::embedding_backward(dout, tok, dwte, dwpe, B, T, C, V);

  Dev<std::int32_t> gtok(tok);
  const gpu::CheckedIds ids{gtok.c()};
  Dev<float> gwte(wte), gwpe(wpe), gout(N * C), gout16(N * C), gdout(dout);
  Dev<float> gdwte(std::vector<float>(V * C, 0.0f)), gdwpe(std::vector<float>(P * C, 0.0f));
  Dev<std::uint16_t> gwte16(wte16), gwpe16(wpe16);
  gpu::embedding_forward(st(), ids, gwte.c(), gwpe.c(), gout.s(), B, T, C, V);
  gpu::embedding_forward(st(), ids, gwte16.c(), gwpe16.c(), gout16.s(), B, T, C, V);
  gpu::embedding_backward(st(), gdout.c(), ids, gdwte.s(), gdwpe.s(), B, T, C, V);
  expect_bitwise(gout.host(), out, "embedding out");
  expect_bitwise(gout16.host(), out16, "embedding out, bf16 tables");
  expect_bitwise(gdwte.host(), dwte, "embedding dwte");
  expect_bitwise(gdwpe.host(), dwpe, "embedding dwpe");

  auto logits = random_floats(N * V, 5, -3.0f, 3.0f);
  std::vector<float> lse(N), dlogits(N * V);
  const float loss = cpu::cross_entropy_forward(logits, tok, lse, N, V);
  cpu::cross_entropy_backward(logits, tok, lse, dlogits, N, V, 0.5f);
  Dev<float> glogits(logits), glse(N), gloss(1), gdlogits(N * V);
  gpu::cross_entropy_forward(st(), glogits.c(), ids, glse.s(), gloss.s(), N, V);
  gpu::cross_entropy_backward(st(), glogits.c(), ids, glse.c(), gdlogits.s(), N, V, 0.5f);
  EXPECT_NEAR(gloss.host()[0], loss, 1e-6 * std::fabs(loss));
  EXPECT_LT(rel(glse.host(), lse), 1e-5);
  EXPECT_LT(rel(gdlogits.host(), dlogits), 1e-5);
}

TEST_F(OpsCuda, EmbeddingBadTokenNamesThePositionAndLeavesGradientsAlone) {
  const std::size_t B = 2, T = 3, C = 4, V = 5;
  std::vector<std::int32_t> tok = {0, 1, 2, 3, 7, -1};  // first bad at position 4 (b = 1, t = 1)
  Dev<std::int32_t> gtok(tok);
  Dev<float> wte(random_floats(V * C, 1)), wpe(random_floats(T * C, 2)), out(B * T * C);
  Dev<float> dout(random_floats(B * T * C, 3));
  const std::vector<float> zeros(V * C, 0.0f);
  Dev<float> dwte(zeros);
  expect_invalid([&] { gpu::embedding_forward(st(), gtok.c(), wte.c(), wpe.c(), out.s(), B, T, C, V); },
                 {"embedding_forward", "token id 7 at position 4 (b = 1, t = 1) is outside [0, V = 5)"});
  expect_invalid([&] { gpu::embedding_backward(st(), dout.c(), gtok.c(), dwte.s(), {}, B, T, C, V); },
                 {"embedding_backward", "token id 7 at position 4"});
  expect_bitwise(dwte.host(), zeros, "dwte after a bad id");
}

// ---- attention ----

void check_attention(void* stream, std::size_t B, std::size_t T, std::size_t C, std::size_t NH) {
  SCOPED_TRACE("B " + std::to_string(B) + " T " + std::to_string(T) + " C " + std::to_string(C) + " NH " +
               std::to_string(NH));
  auto qkv = random_floats(B * T * 3 * C, 1);
  auto dout = random_floats(B * T * C, 2);
  // The CPU kernel is tiled and keeps only each row's log-sum-exp; the CUDA one keeps the
  // probabilities. Outputs and gradients are compared.
  std::vector<float> out(B * T * C), lse(B * NH * T), dqkv(B * T * 3 * C);
  cpu::attention_forward(qkv, out, lse, B, T, C, NH);
  cpu::attention_backward(dout, qkv, out, lse, dqkv, B, T, C, NH);

  Dev<float> gqkv(qkv), gout(B * T * C), gatt(B * NH * T * T), gdout(dout), gdqkv(B * T * 3 * C);
  gpu::attention_forward(stream, gqkv.c(), gout.s(), gatt.s(), B, T, C, NH);
  gpu::attention_backward(stream, gdout.c(), gqkv.c(), gatt.c(), gdqkv.s(), B, T, C, NH);
  EXPECT_LT(rel(gout.host(), out), 1e-5);
  auto first = gdqkv.host();
  EXPECT_LT(rel(first, dqkv), 1e-5);
  // No atomics: a second run is bitwise identical.
  gpu::attention_backward(stream, gdout.c(), gqkv.c(), gatt.c(), gdqkv.s(), B, T, C, NH);
  expect_bitwise(gdqkv.host(), first, "attention_backward rerun");
}

TEST_F(OpsCuda, AttentionMatchesCpu) {
  check_attention(st(), 2, 5, 12, 3);
  check_attention(st(), 2, 130, 64, 4);  // rows longer than a block of threads
}

TEST_F(OpsCuda, AttentionRejectsHeadsThatDoNotDivideC) {
  Dev<float> qkv(2 * 5 * 3 * 10), out(2 * 5 * 10), att(2 * 3 * 5 * 5);
  expect_invalid([&] { gpu::attention_forward(st(), qkv.c(), out.s(), att.s(), 2, 5, 10, 3); },
                 {"attention_forward", "C = 10 is not divisible by the number of heads NH = 3"});
}

// Grouped-query attention (a key/value head for 2 and for 4 query heads, and multi-query) against
// the tiled CPU kernel, and a rerun bitwise.
TEST_F(OpsCuda, GroupedQueryAttentionMatchesCpu) {
  for (const cpu::AttentionShape s : {cpu::AttentionShape{2, 5, 4, 2, 3}, cpu::AttentionShape{1, 130, 8, 2, 16},
                                      cpu::AttentionShape{2, 70, 4, 1, 8}}) {
    SCOPED_TRACE("NH " + std::to_string(s.heads) + " NKV " + std::to_string(s.kv_heads) + " T " + std::to_string(s.T));
    auto qkv = random_floats(s.B * s.T * s.qkv_width(), 1);
    auto dout = random_floats(s.B * s.T * s.out_width(), 2);
    std::vector<float> out(dout.size()), lse(s.B * s.heads * s.T), dqkv(qkv.size());
    cpu::attention_forward(qkv, out, lse, s);
    cpu::attention_backward(dout, qkv, out, lse, dqkv, s);
    Dev<float> gqkv(qkv), gout(out.size()), gatt(s.B * s.heads * s.T * s.T), gdout(dout), gdqkv(qkv.size());
    gpu::attention_forward(st(), gqkv.c(), gout.s(), gatt.s(), s);
    gpu::attention_backward(st(), gdout.c(), gqkv.c(), gatt.c(), gdqkv.s(), s);
    EXPECT_LT(rel(gout.host(), out), 1e-5);
    const auto first = gdqkv.host();
    EXPECT_LT(rel(first, dqkv), 1e-5);
    gpu::attention_backward(st(), gdout.c(), gqkv.c(), gatt.c(), gdqkv.s(), s);
    expect_bitwise(gdqkv.host(), first, "grouped attention_backward rerun");
  }
  Dev<float> qkv(1 * 2 * (8 + 2) * 2), out(1 * 2 * 8 * 2), att(1 * 8 * 2 * 2);
  expect_invalid([&] { gpu::attention_forward(st(), qkv.c(), out.s(), att.s(), cpu::AttentionShape{1, 2, 8, 1, 2}); },
                 {"attention_forward", "8 query heads per key/value head exceed head_size = 2"});
}

TEST_F(OpsCuda, RmsnormSwigluRopeAndColumnsMatchCpu) {
  const std::size_t rows = 10, C = 768;
  auto x = random_floats(rows * C, 1, -2.0f, 3.0f), w = random_floats(C, 2), dy = random_floats(rows * C, 3);
  auto dw0 = random_floats(C, 4);
  std::vector<float> y(rows * C), rstd(rows), dx(rows * C), dw = dw0;
  cpu::rmsnorm_forward(x, w, y, rstd, rows, C, 1e-5f);
  cpu::rmsnorm_backward(dy, x, w, rstd, dx, dw, rows, C);
  Dev<float> gx(x), gw(w), gy(rows * C), gr(rows), gdy(dy), gdx(rows * C), gdw(dw0);
  gpu::rmsnorm_forward(st(), gx.c(), gw.c(), gy.s(), gr.s(), rows, C, 1e-5f);
  gpu::rmsnorm_backward(st(), gdy.c(), gx.c(), gw.c(), gr.c(), gdx.s(), gdw.s(), rows, C);
  EXPECT_LT(rel(gy.host(), y), 1e-5);
  EXPECT_LT(rel(gr.host(), rstd), 1e-5);
  EXPECT_LT(rel(gdx.host(), dx), 1e-5);
  EXPECT_LT(rel(gdw.host(), dw), 1e-5);

  const std::size_t n = 10007;
  auto gate = random_floats(n, 5, -8.0f, 8.0f), up = random_floats(n, 6), g = random_floats(n, 7);
  std::vector<float> sy(n), dgate(n), dup(n);
  cpu::swiglu_forward(gate, up, sy);
  cpu::swiglu_backward(g, gate, up, dgate, dup);
  Dev<float> ggate(gate), gup(up), gsy(n), gg(g), gdgate(n), gdup(n);
  gpu::swiglu_forward(st(), ggate.c(), gup.c(), gsy.s());
  gpu::swiglu_backward(st(), gg.c(), ggate.c(), gup.c(), gdgate.s(), gdup.s());
  EXPECT_LT(rel(gsy.host(), sy), 1e-6);
  EXPECT_LT(rel(gdgate.host(), dgate), 1e-5);
  EXPECT_LT(rel(gdup.host(), dup), 1e-6);

  // The rotation has no contraction on either side: the same bits.
  const cpu::AttentionShape s{2, 33, 4, 2, 8};
  std::vector<float> cos(s.T * s.head_size / 2), sin(cos.size());
  cpu::rope_table(cos, sin, s.T, s.head_size, 10000.0);
  auto q = random_floats(s.B * s.T * s.qkv_width(), 8);
  auto fwd = q, back = q;
  cpu::rope_forward(fwd, cos, sin, s);
  cpu::rope_backward(back, cos, sin, s);
  Dev<float> gq(q), gq2(q), gcos(cos), gsin(sin);
  gpu::rope_forward(st(), gq.s(), gcos.c(), gsin.c(), s);
  gpu::rope_backward(st(), gq2.s(), gcos.c(), gsin.c(), s);
  expect_bitwise(gq.host(), fwd, "rope_forward");
  expect_bitwise(gq2.host(), back, "rope_backward");

  const std::size_t cols = 5, ld = 11, first = 3;
  auto narrow = random_floats(rows * cols, 9), wide = random_floats(rows * ld, 10);
  auto put = wide;
  std::vector<float> got(rows * cols);
  cpu::put_columns(narrow, put, rows, cols, ld, first);
  cpu::get_columns(wide, got, rows, cols, ld, first);
  Dev<float> gn(narrow), gwide(wide), gwide2(wide), gout(rows * cols);
  gpu::put_columns(st(), gn.c(), gwide.s(), rows, cols, ld, first);
  gpu::get_columns(st(), gwide2.c(), gout.s(), rows, cols, ld, first);
  expect_bitwise(gwide.host(), put, "put_columns");
  expect_bitwise(gout.host(), got, "get_columns");
}

// ---- cross-entropy ----

TEST_F(OpsCuda, CrossEntropyMatchesCpu) {
  for (std::size_t V : {13u, 1000u}) {
    SCOPED_TRACE("V " + std::to_string(V));
    const std::size_t N = 10;
    auto logits = random_floats(N * V, 1, -4.0f, 4.0f);
    auto tgt = random_ids(N, static_cast<std::int32_t>(V), 2);
    std::vector<float> lse(N), dlogits(N * V);
    const float loss = cpu::cross_entropy_forward(logits, tgt, lse, N, V);
    cpu::cross_entropy_backward(logits, tgt, lse, dlogits, N, V, 0.5f);

    Dev<float> gl(logits), glse(N), gd(N * V);
    Dev<std::int32_t> gt(tgt);
    const float gloss = gpu::cross_entropy_forward(st(), gl.c(), gt.c(), glse.s(), N, V);
    gpu::cross_entropy_backward(st(), gl.c(), gt.c(), glse.c(), gd.s(), N, V, 0.5f);
    EXPECT_NEAR(gloss, loss, 1e-6 * std::fabs(loss));
    EXPECT_LT(rel(glse.host(), lse), 1e-6);
    EXPECT_LT(rel(gd.host(), dlogits), 1e-5);
  }
}

TEST_F(OpsCuda, CrossEntropyBadTargetIsReportedFromTheDevice) {
  const std::size_t N = 6, V = 5;
  std::vector<std::int32_t> tgt = {0, 4, 1, 5, 2, -3};  // first bad at position 3
  Dev<float> logits(random_floats(N * V, 1)), lse(N), d(N * V);
  Dev<std::int32_t> gt(tgt);
  expect_invalid([&] { gpu::cross_entropy_forward(st(), logits.c(), gt.c(), lse.s(), N, V); },
                 {"cross_entropy_forward", "target 5 at position 3 is outside [0, V = 5)"});
  expect_invalid([&] { gpu::cross_entropy_backward(st(), logits.c(), gt.c(), lse.c(), d.s(), N, V); },
                 {"cross_entropy_backward", "target 5 at position 3"});
  // The stream is still usable afterwards.
  gt.upload({0, 1, 2, 3, 4, 0});
  EXPECT_NO_THROW(gpu::cross_entropy_forward(st(), logits.c(), gt.c(), lse.s(), N, V));
}

// ---- gradient norm ----

TEST_F(OpsCuda, GradNormMatchesCpu) {
  auto a = random_floats(100003, 1, -3.0f, 3.0f);
  auto b = random_floats(17, 2);
  std::vector<float> empty;
  Dev<float> ga(a), gb(b);
  const std::span<const float> host_bufs[] = {a, empty, b};
  const std::span<const float> dev_bufs[] = {ga.c(), std::span<const float>(), gb.c()};
  for (auto type : {NormType::l2, NormType::l1, NormType::inf}) {
    const double ref = cpu::norm_partial(host_bufs, type);
    const double got = gpu::norm_partial(st(), dev_bufs, type);
    if (type == NormType::inf) {
      EXPECT_EQ(got, ref);
    } else {
      EXPECT_NEAR(got, ref, 1e-12 * ref);
    }
    EXPECT_NEAR(gpu::grad_norm(st(), dev_bufs, type), cpu::grad_norm(host_bufs, type), 1e-12 * ref);
  }
  // Device-resident partial (the input of a cross-rank reduction).
  Dev<double> partial(1);
  gpu::norm_partial(st(), dev_bufs, NormType::l2, partial.s());
  EXPECT_NEAR(partial.host()[0], cpu::norm_partial(host_bufs, NormType::l2), 1e-12 * partial.host()[0]);
}

TEST_F(OpsCuda, GradNormPropagatesNaN) {
  auto a = random_floats(5000, 1);
  a[4321] = std::numeric_limits<float>::quiet_NaN();
  Dev<float> ga(a);
  const std::span<const float> bufs[] = {ga.c()};
  for (auto type : {NormType::l2, NormType::l1, NormType::inf}) {
    EXPECT_TRUE(std::isnan(gpu::norm_partial(st(), bufs, type)));
  }
}

// ---- optimizers ----

TEST_F(OpsCuda, AdamWStepMatchesCpuWithRanges) {
  const std::size_t n = 1037;
  const cpu::ParamRange ranges[] = {{0, 500, true}, {500, 300, false}, {900, 137, true}};  // 800..900 untouched
  cpu::AdamWOptions opt;
  opt.lr = 1e-2;
  opt.weight_decay = 0.1;
  auto p = random_floats(n, 1);
  cpu::AdamWState state(n);
  Dev<float> gp(p), gm(std::vector<float>(n, 0.0f)), gv(std::vector<float>(n, 0.0f)), gg(n);
  std::int64_t step = 0;
  for (int s = 0; s < 6; ++s) {
    auto g = random_floats(n, 100 + static_cast<std::uint32_t>(s));
    cpu::adamw_step(p, g, state, opt, ranges);
    gg.upload(g);
    gpu::adamw_step(st(), gp.s(), gg.c(), gm.s(), gv.s(), step, opt, ranges);
  }
  EXPECT_EQ(step, state.step);
  EXPECT_LT(rel(gp.host(), p), 1e-6);
  EXPECT_LT(rel(gm.host(), state.exp_avg), 1e-6);
  EXPECT_LT(rel(gv.host(), state.exp_avg_sq), 1e-6);
  const auto host_p = gp.host();
  for (std::size_t i = 800; i < 900; ++i) ASSERT_EQ(host_p[i], p[i]);
}

TEST_F(OpsCuda, SgdStepMatchesCpu) {
  const std::size_t n = 777;
  struct Case {
    double momentum, dampening;
    bool nesterov;
  };
  for (const Case c : {Case{0.0, 0.0, false}, Case{0.9, 0.1, false}, Case{0.9, 0.0, true}}) {
    SCOPED_TRACE("momentum " + std::to_string(c.momentum) + (c.nesterov ? " nesterov" : ""));
    cpu::SGDOptions opt;
    opt.lr = 0.05;
    opt.momentum = c.momentum;
    opt.dampening = c.dampening;
    opt.nesterov = c.nesterov;
    opt.weight_decay = 0.01;
    auto p = random_floats(n, 1);
    cpu::SGDState state(n);
    Dev<float> gp(p), gbuf(std::vector<float>(n, 0.0f)), gg(n);
    bool has_buffer = false;
    for (int s = 0; s < 6; ++s) {
      auto g = random_floats(n, 200 + static_cast<std::uint32_t>(s));
      cpu::sgd_step(p, g, state, opt);
      gg.upload(g);
      gpu::sgd_step(st(), gp.s(), gg.c(), c.momentum != 0.0 ? gbuf.s() : std::span<float>(), has_buffer, opt);
    }
    EXPECT_EQ(has_buffer, state.has_buffer);
    EXPECT_LT(rel(gp.host(), p), 1e-6);
    if (c.momentum != 0.0) {
      EXPECT_LT(rel(gbuf.host(), state.momentum_buffer), 1e-6);
    }
  }
}

TEST_F(OpsCuda, OptimizerArgumentChecksMatchCpu) {
  Dev<float> p(8), g(8), m(8), v(8);
  expect_invalid([&] { gpu::adamw_update(st(), p.s(), g.c(), m.s(), v.s(), 0, 1e-3, 0.9, 0.999, 1e-8, 0.0); },
                 {"adamw_update", "step must be >= 1"});
  expect_invalid([&] { gpu::sgd_update(st(), p.s(), g.c(), m.s(), false, 0.1, 0.9, 0.5, 0.0, true); },
                 {"sgd_update", "nesterov needs momentum > 0 and dampening == 0"});
  const cpu::ParamRange overlapping[] = {{0, 5, true}, {4, 4, true}};
  std::int64_t step = 0;
  expect_invalid([&] { gpu::adamw_step(st(), p.s(), g.c(), m.s(), v.s(), step, {}, overlapping); },
                 {"adamw_step", "ranges starting at 0 and 4 overlap"});
  EXPECT_EQ(step, 0);
}

}  // namespace
