// A rank's CPU work split over blas_threads() threads (ops/src/parallel.hpp, blas_internal.hpp):
// when a call splits, that the GEMM split computes every layout right with padded strides, that
// OpenBLAS stays on one thread, and that every split element-wise op gives the bits of one thread,
// the loss's sum included, at sizes that do not divide evenly. The single-thread results are the
// ops suites' concern.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "coshard/ops/blas.hpp"
#include "coshard/ops/cross_entropy.hpp"
#include "coshard/ops/gelu.hpp"
#include "coshard/ops/layernorm.hpp"
#include "coshard/ops/rmsnorm.hpp"
#include "coshard/ops/rope.hpp"
#include "coshard/ops/swiglu.hpp"
#include "coshard/ops/optim.hpp"
#include "blas_internal.hpp"
#include "ops/gradcheck.hpp"
#include "parallel.hpp"

using namespace coshard;
using namespace coshard::testing;

namespace {

// Elements enough for an element-wise op to split over 3 threads, and not a multiple of them.
std::size_t split_size(double macs_each) {
  return static_cast<std::size_t>(3.0 * ops::detail::kSplitMacs / macs_each) + 7;
}

// Runs `op` on one thread, then on 2 and 3, and compares every output bit for bit.
void expect_same_bits_on_any_count(const std::string& what, const std::function<std::vector<std::vector<float>>()>& op) {
  const auto one = op();
  for (const int threads : {2, 3}) {
    const BlasThreads scoped(threads);
    const auto many = op();
    ASSERT_EQ(many.size(), one.size());
    for (std::size_t i = 0; i < one.size(); ++i) EXPECT_EQ(many[i], one[i]) << what << ", output " << i << ", " << threads << " threads";
  }
}

TEST(OpsThreads, LargeCallsSplitOverTheThreadsSmallOnesDoNot) {
  const BlasThreads scoped(3);
  EXPECT_EQ(ops::detail::threads_for(1e8, 100), 3u);
  EXPECT_EQ(ops::detail::threads_for(1e8, 2), 2u);  // no more threads than pieces
  EXPECT_EQ(ops::detail::threads_for(1e5, 100), 1u);
  EXPECT_EQ(ops::detail::openblas_threads(), 1);  // OpenBLAS's own workers stay asleep
}

// Every (op(A), op(B)) split by rows and by columns on 3 threads, with leading dimensions wider
// than the operands, against float64 sums; C's padding is never written.
TEST(OpsThreads, TheGemmSplitComputesEveryLayoutWithPaddedStrides) {
  const BlasThreads scoped(3);
  struct Shape {
    std::size_t m, n, k;
  };
  for (const Shape s : {Shape{700, 90, 80}, Shape{90, 700, 80}}) {  // rows, then 16-column slices
    for (const bool ta : {false, true}) {
      for (const bool tb : {false, true}) {
        SCOPED_TRACE(std::to_string(s.m) + " x " + std::to_string(s.n) + (ta ? " A^T" : "") + (tb ? " B^T" : ""));
        const std::size_t lda = (ta ? s.m : s.k) + 3, ldb = (tb ? s.k : s.n) + 5, ldc = s.n + 7;
        const auto a = random_floats((ta ? s.k : s.m) * lda, 61), b = random_floats((tb ? s.n : s.k) * ldb, 62);
        const auto before = random_floats(s.m * ldc, 63);
        auto c = before;
        ops::detail::sgemm(ta, tb, s.m, s.n, s.k, 0.5f, a.data(), lda, b.data(), ldb, 1.0f, c.data(), ldc);
        std::vector<double> ref(s.m * s.n);
        std::vector<float> got(s.m * s.n);
        for (std::size_t i = 0; i < s.m; ++i) {
          for (std::size_t j = 0; j < s.n; ++j) {
            double sum = before[i * ldc + j];
            for (std::size_t p = 0; p < s.k; ++p)
              sum += 0.5 * a[ta ? p * lda + i : i * lda + p] * b[tb ? j * ldb + p : p * ldb + j];
            ref[i * s.n + j] = sum, got[i * s.n + j] = c[i * ldc + j];
          }
          for (std::size_t j = s.n; j < ldc; ++j) ASSERT_EQ(c[i * ldc + j], before[i * ldc + j]) << "wrote C padding";
        }
        EXPECT_LT(rel_error(got, ref), 1e-6);
      }
    }
  }
}

TEST(OpsThreads, GeluGivesTheSameBitsOnAnyThreadCount) {
  const std::size_t n = split_size(ops::detail::kElementMacs);
  const auto x = random_floats(n, 51, -6.0f, 6.0f), dy = random_floats(n, 52);
  expect_same_bits_on_any_count("gelu", [&] {
    std::vector<float> y(n), dx(n);
    ops::gelu_forward(x, y);
    ops::gelu_backward(dy, x, dx);
    return std::vector<std::vector<float>>{y, dx};
  });
}

TEST(OpsThreads, LayernormGivesTheSameBitsOnAnyThreadCount) {
  const std::size_t C = 771, rows = split_size(C * ops::detail::kElementMacs);
  const auto x = random_floats(rows * C, 53, -3.0f, 3.0f), w = random_floats(C, 54), b = random_floats(C, 55);
  const auto dy = random_floats(rows * C, 56);
  expect_same_bits_on_any_count("layernorm", [&] {
    std::vector<float> y(rows * C), mean(rows), rstd(rows), dx(rows * C), dw(C, 0.25f), db(C, 0.5f);
    ops::layernorm_forward(x, w, b, y, mean, rstd, rows, C, 1e-5f);
    ops::layernorm_backward(dy, x, w, mean, rstd, dx, dw, db, rows, C);
    return std::vector<std::vector<float>>{y, mean, rstd, dx, dw, db};
  });
}

TEST(OpsThreads, RmsnormGivesTheSameBitsOnAnyThreadCount) {
  const std::size_t C = 771, rows = split_size(C * ops::detail::kElementMacs);
  const auto x = random_floats(rows * C, 60, -3.0f, 3.0f), w = random_floats(C, 61), dy = random_floats(rows * C, 62);
  expect_same_bits_on_any_count("rmsnorm", [&] {
    std::vector<float> y(rows * C), rstd(rows), dx(rows * C), dw(C, 0.25f);
    ops::rmsnorm_forward(x, w, y, rstd, rows, C, 1e-5f);
    ops::rmsnorm_backward(dy, x, w, rstd, dx, dw, rows, C);
    return std::vector<std::vector<float>>{y, rstd, dx, dw};
  });
}

TEST(OpsThreads, SwigluAndRopeGiveTheSameBitsOnAnyThreadCount) {
  const std::size_t n = split_size(2 * ops::detail::kElementMacs);
  const auto gate = random_floats(n, 63, -8.0f, 8.0f), up = random_floats(n, 64), dy = random_floats(n, 65);
  expect_same_bits_on_any_count("swiglu", [&] {
    std::vector<float> y(n), dgate(n), dup(n);
    ops::swiglu_forward(gate, up, y);
    ops::swiglu_backward(dy, gate, up, dgate, dup);
    return std::vector<std::vector<float>>{y, dgate, dup};
  });
  const ops::AttentionShape s{3, 97, 4, 2, 16};
  const std::size_t rows_needed = split_size((s.heads + s.kv_heads) * s.head_size * ops::detail::kElementMacs);
  const ops::AttentionShape big{(rows_needed + s.T - 1) / s.T, s.T, s.heads, s.kv_heads, s.head_size};
  std::vector<float> cos(big.T * big.head_size / 2), sin(cos.size());
  ops::rope_table(cos, sin, big.T, big.head_size, 10000.0);
  const auto x = random_floats(big.B * big.T * big.qkv_width(), 66, -2.0f, 2.0f);
  expect_same_bits_on_any_count("rope", [&] {
    auto y = x, g = x;
    ops::rope_forward(y, cos, sin, big);
    ops::rope_backward(g, cos, sin, big);
    return std::vector<std::vector<float>>{y, g};
  });
}

TEST(OpsThreads, CrossEntropyGivesTheSameLossAndBitsOnAnyThreadCount) {
  const std::size_t V = 5003, N = std::max<std::size_t>(333, split_size(V * ops::detail::kElementMacs));
  const auto z = random_floats(N * V, 57, -8.0f, 8.0f);
  std::vector<std::int32_t> targets(N);
  for (std::size_t i = 0; i < N; ++i) targets[i] = static_cast<std::int32_t>((i * 7919) % V);
  expect_same_bits_on_any_count("cross-entropy", [&] {
    std::vector<float> lse(N), d(N * V);
    const float loss = ops::cross_entropy_forward(z, targets, lse, N, V);
    ops::cross_entropy_backward(z, targets, lse, d, N, V, 1.0f);
    return std::vector<std::vector<float>>{{loss}, lse, d};
  });
}

TEST(OpsThreads, AdamWGivesTheSameBitsOnAnyThreadCount) {
  const std::size_t n = split_size(ops::detail::kElementMacs);
  const auto p0 = random_floats(n, 58), g = random_floats(n, 59, -0.1f, 0.1f);
  expect_same_bits_on_any_count("adamw", [&] {
    std::vector<float> p = p0;
    ops::AdamWState state(n);
    const ops::AdamWOptions opt{.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
    for (int s = 0; s < 2; ++s) ops::adamw_step(p, g, state, opt);
    return std::vector<std::vector<float>>{p, state.exp_avg, state.exp_avg_sq};
  });
}

}  // namespace
