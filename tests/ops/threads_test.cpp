// The element-wise ops split their work over blas_threads() threads (ops/src/parallel.hpp) where
// it is large enough: every split gives the bits of one thread, the loss's sum included, at sizes
// that do not divide evenly. The single-thread results are the ops suites' concern.
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "coshard/ops/blas.hpp"
#include "coshard/ops/cross_entropy.hpp"
#include "coshard/ops/gelu.hpp"
#include "coshard/ops/layernorm.hpp"
#include "coshard/ops/optim.hpp"
#include "ops/gradcheck.hpp"

using namespace coshard;
using namespace coshard::testing;

namespace {

// Runs `op` on one thread, then on 2 and 3, and compares every output bit for bit.
void expect_same_bits_on_any_count(const std::string& what, const std::function<std::vector<std::vector<float>>()>& op) {
  ops::set_blas_threads(1);
  const auto one = op();
  for (const int threads : {2, 3}) {
    ops::set_blas_threads(threads);
    const auto many = op();
    ASSERT_EQ(many.size(), one.size());
    for (std::size_t i = 0; i < one.size(); ++i) EXPECT_EQ(many[i], one[i]) << what << ", output " << i << ", " << threads << " threads";
  }
  ops::set_blas_threads(1);
}

TEST(OpsThreads, GeluGivesTheSameBitsOnAnyThreadCount) {
  const std::size_t n = 1'000'003;
  const auto x = random_floats(n, 51, -6.0f, 6.0f), dy = random_floats(n, 52);
  expect_same_bits_on_any_count("gelu", [&] {
    std::vector<float> y(n), dx(n);
    ops::gelu_forward(x, y);
    ops::gelu_backward(dy, x, dx);
    return std::vector<std::vector<float>>{y, dx};
  });
}

TEST(OpsThreads, LayernormGivesTheSameBitsOnAnyThreadCount) {
  const std::size_t rows = 1001, C = 771;
  const auto x = random_floats(rows * C, 53, -3.0f, 3.0f), w = random_floats(C, 54), b = random_floats(C, 55);
  const auto dy = random_floats(rows * C, 56);
  expect_same_bits_on_any_count("layernorm", [&] {
    std::vector<float> y(rows * C), mean(rows), rstd(rows), dx(rows * C), dw(C, 0.25f), db(C, 0.5f);
    ops::layernorm_forward(x, w, b, y, mean, rstd, rows, C, 1e-5f);
    ops::layernorm_backward(dy, x, w, mean, rstd, dx, dw, db, rows, C);
    return std::vector<std::vector<float>>{y, mean, rstd, dx, dw, db};
  });
}

TEST(OpsThreads, CrossEntropyGivesTheSameLossAndBitsOnAnyThreadCount) {
  const std::size_t N = 333, V = 5003;
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
  const std::size_t n = 1'000'037;
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
