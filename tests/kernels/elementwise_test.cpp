// The element-wise rules the CPU and CUDA kernels share (coshard/kernels/elementwise.hpp), against
// float64: the fast exp within its ulp bound and its edges, GELU and its derivative (the latter also
// against finite differences), and single AdamW and SGD element updates.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>

#include "coshard/kernels/elementwise.hpp"

namespace k = coshard::kernels;

namespace {

double ulps(float got, double want) {
  const double ulp = std::ldexp(1.0, std::ilogb(static_cast<float>(want)) - 23);
  return std::fabs(static_cast<double>(got) - want) / ulp;
}

TEST(SharedElementwise, ExpIsWithinThreeUlpOverItsRangeAndExactAtTheEdges) {
  double worst = 0;
  for (double x = -86.9; x < 88.0; x += 0.000731) worst = std::max(worst, ulps(k::exp_approx(static_cast<float>(x)),
                                                                               std::exp(static_cast<double>(static_cast<float>(x)))));
  EXPECT_LE(worst, 3.0);
  EXPECT_EQ(k::exp_approx(0.0f), 1.0f);
  EXPECT_EQ(k::exp_approx(-100.0f), 0.0f);
  EXPECT_EQ(k::exp_approx(100.0f), std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(k::exp_approx(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_EQ(k::sigmoid_approx(-200.0f), 0.0f);
  EXPECT_EQ(k::sigmoid_approx(200.0f), 1.0f);
}

double gelu64(double x) { return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x))); }

TEST(SharedElementwise, GeluAndItsDerivativeMatchFloat64) {
  double worst_y = 0, worst_dy = 0, worst_fd = 0;
  for (double x = -12.0; x <= 12.0; x += 0.00113) {
    const auto xf = static_cast<float>(x);
    const double xd = xf;
    const double c = std::sqrt(2.0 / M_PI);
    const double th = std::tanh(c * (xd + 0.044715 * xd * xd * xd));
    const double dy = 0.5 * (1 + th) + 0.5 * xd * (1 - th * th) * c * (1 + 3 * 0.044715 * xd * xd);
    const double h = 1e-6;
    const double fd = (gelu64(xd + h) - gelu64(xd - h)) / (2 * h);
    worst_y = std::max(worst_y, std::fabs(k::gelu(xf) - gelu64(xd)) / std::max(1.0, std::fabs(xd)));
    worst_dy = std::max(worst_dy, std::fabs(k::gelu_grad(xf) - dy) / std::max(1.0, std::fabs(xd)));  // terms grow with x
    worst_fd = std::max(worst_fd, std::fabs(dy - fd));
  }
  EXPECT_LT(worst_y, 1e-6);
  EXPECT_LT(worst_dy, 1e-6);
  EXPECT_LT(worst_fd, 1e-8) << "the float64 derivative itself";
}

double silu64(double x) { return x / (1.0 + std::exp(-x)); }

TEST(SharedElementwise, SiluAndItsDerivativeMatchFloat64) {
  double worst_y = 0, worst_dy = 0, worst_fd = 0;
  for (double x = -40.0; x <= 40.0; x += 0.00117) {
    const auto xf = static_cast<float>(x);
    const double xd = xf, s = 1.0 / (1.0 + std::exp(-xd));
    const double dy = s * (1.0 + xd * (1.0 - s));
    worst_y = std::max(worst_y, std::fabs(k::silu(xf) - silu64(xd)) / std::max(1.0, std::fabs(silu64(xd))));
    worst_dy = std::max(worst_dy, std::fabs(k::silu_grad(xf) - dy));
    const double h = 1e-6;
    worst_fd = std::max(worst_fd, std::fabs(k::silu_grad(xf) - (silu64(xd + h) - silu64(xd - h)) / (2 * h)));
  }
  // Measured: 1.3e-7, 9.7e-7, 9.7e-7. The derivative's error is absolute and grows with x: 1 - s
  // near s = 1 keeps a float's ulp of 1, which x multiplies (x = 16: about 1e-6).
  EXPECT_LT(worst_y, 1e-6);
  EXPECT_LT(worst_dy, 2e-6);
  EXPECT_LT(worst_fd, 2e-6);
  EXPECT_EQ(k::silu(0.0f), 0.0f);
  EXPECT_EQ(k::silu(-200.0f), -0.0f);
  EXPECT_EQ(k::silu(200.0f), 200.0f);
}

TEST(SharedElementwise, AdamWAndSgdElementsMatchFloat64) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  const double lr = 1e-3, b1 = 0.9, b2 = 0.999, eps = 1e-8, wd = 0.1;
  for (int step = 1; step <= 5; ++step) {
    const double bc1 = 1 - std::pow(b1, step), bc2 = 1 - std::pow(b2, step);
    const k::AdamWScalars s{.decay = static_cast<float>(1 - lr * wd), .w1 = static_cast<float>(1 - b1),
                            .b2 = static_cast<float>(b2), .w2 = static_cast<float>(1 - b2),
                            .step_size = static_cast<float>(lr / bc1), .bc2_sqrt = static_cast<float>(std::sqrt(bc2)),
                            .eps = static_cast<float>(eps)};
    for (int i = 0; i < 1000; ++i) {
      float p = u(rng), g = u(rng), m = 0.1f * u(rng), v = 0.01f * std::fabs(u(rng));
      double pd = p * (1 - lr * wd), md = m + (1 - b1) * (g - static_cast<double>(m));
      const double vd = v * b2 + (1 - b2) * static_cast<double>(g) * g;
      pd -= lr / bc1 * md / (std::sqrt(vd) / std::sqrt(bc2) + eps);
      k::adamw_update(p, g, m, v, s);
      ASSERT_NEAR(m, md, 1e-7);
      ASSERT_NEAR(v, vd, 1e-7 * std::max(1.0, vd));
      ASSERT_NEAR(p, pd, 2e-6);
    }
  }
  for (const bool nesterov : {false, true}) {
    const k::SGDScalars s{.wd = 0.01f, .mu = 0.9f, .damp = 1.0f, .neg_lr = -0.1f, .first_step = false, .nesterov = nesterov};
    float p = 0.5f, buf = 0.25f;
    const double d = -0.75 + 0.01 * 0.5, b = 0.25 * 0.9 + d;
    k::sgd_update(p, -0.75f, &buf, s);
    EXPECT_NEAR(buf, b, 1e-7);
    EXPECT_NEAR(p, 0.5 - 0.1 * (nesterov ? d + 0.9 * b : b), 1e-7);
  }
  float p = 1.0f;
  k::sgd_update(p, 2.0f, nullptr, {.wd = 0.5f, .mu = 0.0f, .damp = 1.0f, .neg_lr = -0.1f, .first_step = true, .nesterov = false});
  EXPECT_NEAR(p, 1.0 - 0.1 * 2.5, 1e-7);
}

}  // namespace
