// AdamW and SGD against float64 reimplementations of torch.optim.AdamW / torch.optim.SGD
// (single-tensor path), over several steps with a fresh gradient each step.
#include "coshard/ops/optim.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "ops/gradcheck.hpp"

using namespace coshard::ops;
using namespace coshard::testing;

namespace {

// Bound: norm-wise relative error of the parameters (and state) after kSteps steps, fp32 against
// float64. Measured: 3e-7 at most.
constexpr double kTol = 2e-6;
constexpr int kSteps = 6;
constexpr std::size_t kN = 37;

// torch/optim/adamw.py, _single_tensor_adamw, in float64. wd[i] is element i's weight decay.
struct RefAdamW {
  std::vector<double> m, v;
  int step = 0;
  explicit RefAdamW(std::size_t n) : m(n, 0.0), v(n, 0.0) {}
  void update(std::vector<double>& p, const std::vector<double>& g, const AdamWOptions& o, const std::vector<double>& wd) {
    ++step;
    for (std::size_t i = 0; i < p.size(); ++i) {
      p[i] *= 1.0 - o.lr * wd[i];
      m[i] += (g[i] - m[i]) * (1.0 - o.beta1);
      v[i] = v[i] * o.beta2 + (1.0 - o.beta2) * g[i] * g[i];
      const double bc1 = 1.0 - std::pow(o.beta1, step);
      const double bc2 = 1.0 - std::pow(o.beta2, step);
      const double denom = std::sqrt(v[i]) / std::sqrt(bc2) + o.eps;
      p[i] -= o.lr / bc1 * m[i] / denom;
    }
  }
};

// torch/optim/sgd.py, _single_tensor_sgd, in float64.
struct RefSGD {
  std::vector<double> buf;
  bool has = false;
  explicit RefSGD(std::size_t n) : buf(n, 0.0) {}
  void update(std::vector<double>& p, const std::vector<double>& g, const SGDOptions& o) {
    for (std::size_t i = 0; i < p.size(); ++i) {
      double d = g[i] + o.weight_decay * p[i];
      if (o.momentum != 0.0) {
        buf[i] = has ? buf[i] * o.momentum + (1.0 - o.dampening) * d : d;
        d = o.nesterov ? d + o.momentum * buf[i] : buf[i];
      }
      p[i] -= o.lr * d;
    }
    has = true;
  }
};

void run_adamw(const AdamWOptions& opt) {
  auto p = random_floats(kN, 1);
  auto ref = to_double(p);
  AdamWState st(kN);
  RefAdamW rs(kN);
  const std::vector<double> wd(kN, opt.weight_decay);
  for (int s = 0; s < kSteps; ++s) {
    auto g = random_floats(kN, 100 + static_cast<std::uint32_t>(s));
    adamw_step(p, g, st, opt);
    rs.update(ref, to_double(g), opt, wd);
  }
  EXPECT_EQ(st.step, kSteps);
  EXPECT_LT(rel_error(p, ref), kTol);
  EXPECT_LT(rel_error(st.exp_avg, rs.m), kTol);
  EXPECT_LT(rel_error(st.exp_avg_sq, rs.v), kTol);
}

TEST(OpsAdamW, MatchesTorchFormulasWithWeightDecay) { run_adamw({.lr = 1e-2, .weight_decay = 0.1}); }
TEST(OpsAdamW, MatchesTorchFormulasWithoutWeightDecay) { run_adamw({.lr = 3e-3, .weight_decay = 0.0}); }
TEST(OpsAdamW, MatchesTorchFormulasWithOtherBetasAndEps) {
  run_adamw({.lr = 1e-3, .beta1 = 0.8, .beta2 = 0.95, .eps = 1e-3, .weight_decay = 0.05});
}

TEST(OpsAdamW, RangesChooseDecayAndLeavePaddingAlone) {
  // [0, 20) decays (a matrix), [20, 30) does not (a bias), [30, 37) is padding: never touched.
  const std::vector<ParamRange> ranges{{20, 10, false}, {0, 20, true}};
  const AdamWOptions opt{.lr = 1e-2, .weight_decay = 0.5};
  auto p = random_floats(kN, 2);
  const auto p0 = p;
  auto ref = to_double(p);
  std::vector<double> wd(kN, 0.0);
  for (std::size_t i = 0; i < 20; ++i) wd[i] = opt.weight_decay;
  AdamWState st(kN);
  RefAdamW rs(kN);
  for (int s = 0; s < kSteps; ++s) {
    auto g = random_floats(kN, 200 + static_cast<std::uint32_t>(s));
    adamw_step(p, g, st, opt, ranges);
    rs.update(ref, to_double(g), opt, wd);
  }
  EXPECT_EQ(st.step, kSteps);  // once per step, not once per range
  EXPECT_LT(rel_error(std::span<const float>(p).first(30), std::span<const double>(ref).first(30)), kTol);
  for (std::size_t i = 30; i < kN; ++i) {
    EXPECT_EQ(p[i], p0[i]) << i;
    EXPECT_EQ(st.exp_avg[i], 0.0f) << i;
  }
}

TEST(OpsAdamW, LowLevelUpdateTakesTheStepFromTheCaller) {
  const AdamWOptions opt{.lr = 1e-2, .weight_decay = 0.1};
  auto p = random_floats(kN, 3);
  auto ref = to_double(p);
  std::vector<float> m(kN, 0.0f), v(kN, 0.0f);
  RefAdamW rs(kN);
  const std::vector<double> wd(kN, opt.weight_decay);
  for (int s = 1; s <= kSteps; ++s) {
    auto g = random_floats(kN, 300 + static_cast<std::uint32_t>(s));
    adamw_update(p, g, m, v, s, opt.lr, opt.beta1, opt.beta2, opt.eps, opt.weight_decay);
    rs.update(ref, to_double(g), opt, wd);
  }
  EXPECT_LT(rel_error(p, ref), kTol);
}

TEST(OpsAdamW, BadInputIsRefused) {
  std::vector<float> p(kN), g(kN), short_g(kN - 1);
  AdamWState st(kN);
  expect_invalid([&] { adamw_step(p, short_g, st, {}); }, {"adamw_step", "grad has 36", "expected 37"});
  const std::vector<ParamRange> overlap{{0, 10, true}, {5, 10, false}};
  expect_invalid([&] { adamw_step(p, g, st, {}, overlap); }, {"adamw_step", "overlap"});
  const std::vector<ParamRange> outside{{30, 10, true}};
  expect_invalid([&] { adamw_step(p, g, st, {}, outside); }, {"adamw_step", "[30, 40) lies outside", "37 elements"});
  expect_invalid([&] { adamw_step(p, g, st, {.beta2 = 1.0}); }, {"adamw_update", "beta2 must be in [0, 1)"});
  std::vector<float> m(kN), v(kN);
  expect_invalid([&] { adamw_update(p, g, m, v, 0, 1e-3, 0.9, 0.999, 1e-8, 0.0); }, {"step must be >= 1"});
  EXPECT_EQ(st.step, 0);  // a refused step does not count
}

void run_sgd(const SGDOptions& opt) {
  auto p = random_floats(kN, 4);
  auto ref = to_double(p);
  SGDState st(kN);
  RefSGD rs(kN);
  for (int s = 0; s < kSteps; ++s) {
    auto g = random_floats(kN, 400 + static_cast<std::uint32_t>(s));
    sgd_step(p, g, st, opt);
    rs.update(ref, to_double(g), opt);
  }
  EXPECT_LT(rel_error(p, ref), kTol);
  if (opt.momentum != 0.0) {
    EXPECT_LT(rel_error(st.momentum_buffer, rs.buf), kTol);
  }
}

TEST(OpsSGD, Plain) { run_sgd({.lr = 0.1}); }
TEST(OpsSGD, WeightDecay) { run_sgd({.lr = 0.1, .weight_decay = 0.05}); }
TEST(OpsSGD, Momentum) { run_sgd({.lr = 0.1, .momentum = 0.9}); }
TEST(OpsSGD, MomentumWithDampeningAndDecay) { run_sgd({.lr = 0.05, .momentum = 0.9, .dampening = 0.3, .weight_decay = 0.01}); }
TEST(OpsSGD, Nesterov) { run_sgd({.lr = 0.1, .momentum = 0.9, .nesterov = true}); }
TEST(OpsSGD, NesterovWithDecay) { run_sgd({.lr = 0.1, .momentum = 0.8, .weight_decay = 0.02, .nesterov = true}); }

TEST(OpsSGD, FirstStepSetsTheBufferToTheGradientEvenWithDampening) {
  // torch clones d_p into the buffer on the first step: dampening does not scale it.
  std::vector<float> p{1.0f, -2.0f}, g{0.5f, 0.25f};
  SGDState st(2);
  sgd_step(p, g, st, {.lr = 1.0, .momentum = 0.9, .dampening = 0.5});
  EXPECT_EQ(st.momentum_buffer, g);
  EXPECT_FLOAT_EQ(p[0], 0.5f);
  EXPECT_FLOAT_EQ(p[1], -2.25f);
  EXPECT_TRUE(st.has_buffer);
}

TEST(OpsSGD, RangesChooseDecay) {
  const std::vector<ParamRange> ranges{{0, 10, false}, {10, 27, true}};
  const SGDOptions opt{.lr = 0.1, .momentum = 0.9, .weight_decay = 0.3};
  auto p = random_floats(kN, 5);
  auto ref_a = to_double(std::span<const float>(p).first(10));
  auto ref_b = to_double(std::span<const float>(p).subspan(10));
  SGDState st(kN);
  RefSGD ra(10), rb(kN - 10);
  SGDOptions no_decay = opt;
  no_decay.weight_decay = 0.0;
  for (int s = 0; s < kSteps; ++s) {
    auto g = random_floats(kN, 500 + static_cast<std::uint32_t>(s));
    sgd_step(p, g, st, opt, ranges);
    ra.update(ref_a, to_double(std::span<const float>(g).first(10)), no_decay);
    rb.update(ref_b, to_double(std::span<const float>(g).subspan(10)), opt);
  }
  EXPECT_LT(rel_error(std::span<const float>(p).first(10), ref_a), kTol);
  EXPECT_LT(rel_error(std::span<const float>(p).subspan(10), ref_b), kTol);
}

TEST(OpsSGD, BadInputIsRefused) {
  std::vector<float> p(kN), g(kN);
  SGDState st(kN);
  expect_invalid([&] { sgd_step(p, g, st, {.lr = 0.1, .momentum = 0.9, .dampening = 0.1, .nesterov = true}); },
                 {"sgd_update", "nesterov needs momentum > 0 and dampening == 0"});
  expect_invalid([&] { sgd_step(p, g, st, {.lr = 0.1, .nesterov = true}); }, {"nesterov"});
  SGDState small(3);
  expect_invalid([&] { sgd_step(p, g, small, {.lr = 0.1, .momentum = 0.9}); },
                 {"sgd_step", "state.momentum_buffer has 3", "expected 37"});
  expect_invalid([&] { sgd_step(p, g, st, {.lr = -1.0}); }, {"lr must be >= 0"});
}

}  // namespace
