#include "coshard/ops/linear.hpp"

#include <gtest/gtest.h>
#include <sched.h>

#include <algorithm>

#include <cstdlib>
#include <ostream>
#include <string>
#include <vector>

#include "coshard/ops/blas.hpp"
#include "ops/gradcheck.hpp"

namespace {

// The layout's name: the cases' names, and what a failing case prints for its parameter.
std::string layout_name(coshard::ops::WeightLayout layout) {
  return layout == coshard::ops::WeightLayout::in_out ? "in_out" : "out_in";
}

}  // namespace

namespace coshard::ops {

// In WeightLayout's namespace, where gtest looks (else it prints "4-byte object <...>").
static void PrintTo(WeightLayout layout, std::ostream* os) { *os << layout_name(layout); }

}  // namespace coshard::ops

using namespace coshard::ops;
using namespace coshard::testing;

namespace {

// Bounds (norm-wise relative error against float64): forward 1e-6 (3e-6 at K = 131), backward
// 1e-5. Measured: about 1e-7 (3e-7 at K = 131) and 7e-8.
constexpr double kForwardTol = 1e-6;
constexpr double kBlockedForwardTol = 3e-6;
constexpr double kBackwardTol = 1e-5;

constexpr std::size_t B = 2, T = 5, kRows = B * T, kIn = 7, kOut = 5;

// y = x W + b in float64; W is [in, out] (in_out) or [out, in] (out_in).
std::vector<double> ref_linear(const std::vector<double>& x, const std::vector<double>& w, const std::vector<double>& b,
                               std::size_t rows, std::size_t in, std::size_t out, WeightLayout layout) {
  std::vector<double> y(rows * out);
  for (std::size_t r = 0; r < rows; ++r) {
    for (std::size_t o = 0; o < out; ++o) {
      double s = b.empty() ? 0.0 : b[o];
      for (std::size_t i = 0; i < in; ++i) {
        s += x[r * in + i] * (layout == WeightLayout::in_out ? w[i * out + o] : w[o * in + i]);
      }
      y[r * out + o] = s;
    }
  }
  return y;
}

class OpsLinear : public ::testing::TestWithParam<WeightLayout> {};

TEST_P(OpsLinear, ForwardMatchesFloat64Reference) {
  const auto layout = GetParam();
  auto x = random_floats(kRows * kIn, 1);
  auto w = random_floats(kIn * kOut, 2);
  auto b = random_floats(kOut, 3);
  std::vector<float> y(kRows * kOut, -7.0f);  // stale contents must be overwritten
  linear_forward(x, w, b, y, kRows, kIn, kOut, layout);
  auto ref = ref_linear(to_double(x), to_double(w), to_double(b), kRows, kIn, kOut, layout);
  EXPECT_LT(rel_error(y, ref), kForwardTol);

  linear_forward(x, w, {}, y, kRows, kIn, kOut, layout);  // no bias
  auto ref_nb = ref_linear(to_double(x), to_double(w), {}, kRows, kIn, kOut, layout);
  EXPECT_LT(rel_error(y, ref_nb), kForwardTol);
}

TEST_P(OpsLinear, ForwardAtBlockedSizesMatchesReference) {
  // Large enough that OpenBLAS takes its blocked kernels and edge paths (not multiples of 8/16).
  const auto layout = GetParam();
  const std::size_t rows = 67, in = 131, out = 93;
  auto x = random_floats(rows * in, 11);
  auto w = random_floats(in * out, 12);
  auto b = random_floats(out, 13);
  std::vector<float> y(rows * out);
  linear_forward(x, w, b, y, rows, in, out, layout);
  EXPECT_LT(rel_error(y, ref_linear(to_double(x), to_double(w), to_double(b), rows, in, out, layout)), kBlockedForwardTol);
}

TEST_P(OpsLinear, BackwardMatchesFiniteDifferences) {
  const auto layout = GetParam();
  auto x = random_floats(kRows * kIn, 4);
  auto w = random_floats(kIn * kOut, 5);
  auto b = random_floats(kOut, 6);
  auto r = random_floats(kRows * kOut, 7);  // dL/dy
  const auto xd = to_double(x), wd = to_double(w), bd = to_double(b), rd = to_double(r);

  std::vector<float> dx(kRows * kIn, 99.0f), dw(kIn * kOut, 0.0f), db(kOut, 0.0f);
  linear_backward(r, x, w, dx, dw, db, kRows, kIn, kOut, layout);

  auto num_dx = numeric_grad([&](const auto& v) { return dot(ref_linear(v, wd, bd, kRows, kIn, kOut, layout), rd); }, xd);
  auto num_dw = numeric_grad([&](const auto& v) { return dot(ref_linear(xd, v, bd, kRows, kIn, kOut, layout), rd); }, wd);
  auto num_db = numeric_grad([&](const auto& v) { return dot(ref_linear(xd, wd, v, kRows, kIn, kOut, layout), rd); }, bd);
  EXPECT_LT(rel_error(dx, num_dx), kBackwardTol);
  EXPECT_LT(rel_error(dw, num_dw), kBackwardTol);
  EXPECT_LT(rel_error(db, num_db), kBackwardTol);
}

TEST_P(OpsLinear, ParameterGradientsAccumulateAndDxIsOverwritten) {
  const auto layout = GetParam();
  auto x = random_floats(kRows * kIn, 8);
  auto w = random_floats(kIn * kOut, 9);
  auto r = random_floats(kRows * kOut, 10);
  std::vector<float> dx1(kRows * kIn), dw1(kIn * kOut, 0.0f), db1(kOut, 0.0f);
  linear_backward(r, x, w, dx1, dw1, db1, kRows, kIn, kOut, layout);

  auto dw = random_floats(kIn * kOut, 20);  // an earlier micro-batch's gradients
  auto db = random_floats(kOut, 21);
  const auto dw0 = dw, db0 = db;
  std::vector<float> dx(kRows * kIn, 123.0f);
  linear_backward(r, x, w, dx, dw, db, kRows, kIn, kOut, layout);
  // Equal up to summation order (GEMM's beta = 1 and the row-by-row bias sum).
  for (std::size_t i = 0; i < dw.size(); ++i) EXPECT_NEAR(dw[i], dw0[i] + dw1[i], 1e-5) << i;
  for (std::size_t i = 0; i < db.size(); ++i) EXPECT_NEAR(db[i], db0[i] + db1[i], 1e-5) << i;
  for (std::size_t i = 0; i < dx.size(); ++i) EXPECT_FLOAT_EQ(dx[i], dx1[i]) << i;
}

TEST_P(OpsLinear, EmptyGradientSpansAreSkipped) {
  const auto layout = GetParam();
  auto x = random_floats(kRows * kIn, 30);
  auto w = random_floats(kIn * kOut, 31);
  auto r = random_floats(kRows * kOut, 32);
  std::vector<float> dx_all(kRows * kIn), dw_all(kIn * kOut, 0.0f), db_all(kOut, 0.0f);
  linear_backward(r, x, w, dx_all, dw_all, db_all, kRows, kIn, kOut, layout);
  std::vector<float> dw_only(kIn * kOut, 0.0f);
  linear_backward(r, x, w, {}, dw_only, {}, kRows, kIn, kOut, layout);
  EXPECT_EQ(dw_only, dw_all);
  std::vector<float> dx_only(kRows * kIn);
  linear_backward(r, x, w, dx_only, {}, {}, kRows, kIn, kOut, layout);
  EXPECT_EQ(dx_only, dx_all);
}

INSTANTIATE_TEST_SUITE_P(Layouts, OpsLinear, ::testing::Values(WeightLayout::in_out, WeightLayout::out_in),
                         [](const ::testing::TestParamInfo<WeightLayout>& p) { return layout_name(p.param); });

TEST(OpsLinearBadInput, WrongSizesNameTheArgument) {
  std::vector<float> x(kRows * kIn), w(kIn * kOut), b(kOut), y(kRows * kOut);
  std::vector<float> short_x(kRows * kIn - 1), long_b(kOut + 1), short_y(3);
  expect_invalid([&] { linear_forward(short_x, w, b, y, kRows, kIn, kOut); },
                 {"linear_forward", "x has 69 elements", "expected 70", "[rows, in] = [10, 7]"});
  expect_invalid([&] { linear_forward(x, w, long_b, y, kRows, kIn, kOut); }, {"linear_forward", "b has 6", "expected 5"});
  expect_invalid([&] { linear_forward(x, w, b, short_y, kRows, kIn, kOut); }, {"y has 3", "expected 50"});
  expect_invalid([&] { linear_forward(x, w, b, y, kRows, kIn, 0); }, {"linear_forward", "out must be positive"});
  std::vector<float> dx(kRows * kIn), dw(kIn * kOut + 2), db(kOut);
  expect_invalid([&] { linear_backward(y, x, w, dx, dw, db, kRows, kIn, kOut, WeightLayout::out_in); },
                 {"linear_backward", "dw has 37", "expected 35", "[out, in] = [5, 7]"});
  expect_invalid([&] { linear_backward(x, x, w, dx, {}, {}, kRows, kIn, kOut); }, {"linear_backward", "dy has 70"});
}

TEST(OpsLinearBadInput, OverlappingOutputIsRefused) {
  std::vector<float> buf(kRows * kIn + kRows * kOut), w(kIn * kOut), b(kOut);
  std::span<float> all(buf);
  auto x = all.subspan(0, kRows * kIn);
  auto y = all.subspan(kRows * kIn - 1, kRows * kOut);  // one element shared with x
  expect_invalid([&] { linear_forward(x, w, b, y, kRows, kIn, kOut); }, {"linear_forward", "y and x must not overlap"});
}

// Each of the three products split over 3 threads (blas_threads()), by rows and by columns of its
// result, on shapes that do not divide evenly: the result of one thread, up to OpenBLAS's blocking
// of the slices (the split itself, with padded strides: OpsThreads).
TEST_P(OpsLinear, ThreadsSplitEveryProduct) {
  const auto layout = GetParam();
  struct Shape {
    std::size_t rows, in, out;
  };
  for (const Shape s : {Shape{1000, 50, 300}, Shape{200, 100, 1000}, Shape{100, 1000, 200}}) {
    SCOPED_TRACE(std::to_string(s.rows) + " x " + std::to_string(s.in) + " x " + std::to_string(s.out));
    const auto x = random_floats(s.rows * s.in, 41), w = random_floats(s.in * s.out, 42);
    const auto b = random_floats(s.out, 43), dy = random_floats(s.rows * s.out, 44);
    struct Out {
      std::vector<float> y, dx, dw;
    };
    auto run = [&](int threads) {
      const BlasThreads scoped(threads);
      Out o{std::vector<float>(s.rows * s.out), std::vector<float>(s.rows * s.in), std::vector<float>(s.in * s.out, 0.5f)};
      linear_forward(x, w, b, o.y, s.rows, s.in, s.out, layout);
      linear_backward(dy, x, w, o.dx, o.dw, {}, s.rows, s.in, s.out, layout);
      return o;
    };
    const Out one = run(1), three = run(3);
    EXPECT_LT(rel_error(three.y, to_double(one.y)), 1e-6);
    EXPECT_LT(rel_error(three.dx, to_double(one.dx)), 1e-6);
    EXPECT_LT(rel_error(three.dw, to_double(one.dw)), 1e-6);
  }
}

TEST(OpsBlas, DefaultIsOneThreadPerRank) {
  if (std::getenv("OPENBLAS_NUM_THREADS") != nullptr) GTEST_SKIP() << "OPENBLAS_NUM_THREADS is set";
  std::vector<float> x(kRows * kIn, 1.0f), w(kIn * kOut, 1.0f), y(kRows * kOut);
  linear_forward(x, w, {}, y, kRows, kIn, kOut);
  EXPECT_EQ(blas_threads(), 1);
}

// Without a chosen count, OPENBLAS_NUM_THREADS is the count; one that is not a count is an error
// naming it. ctest runs this again with the variable set to 2 and to "two" (tests/ops/tests.cmake).
TEST(OpsBlas, TheEnvironmentGivesTheCountOrAnError) {
  const char* env = std::getenv("OPENBLAS_NUM_THREADS");
  if (env == nullptr) {
    EXPECT_EQ(blas_threads(), 1);
  } else if (std::string(env) == "two") {
    expect_invalid([] { blas_threads(); }, {"OPENBLAS_NUM_THREADS", "'two'", "whole number"});
  } else {
    EXPECT_EQ(blas_threads(), std::atoi(env));
  }
}

TEST(OpsBlas, ThreadCountIsConfigurable) {
  set_blas_threads(1);
  EXPECT_EQ(blas_threads(), 1);
  expect_invalid([] { set_blas_threads(0); }, {"set_blas_threads", "from 1 to 4096", "got 0"});
  expect_invalid([] { set_blas_threads(4097); }, {"set_blas_threads", "from 1 to 4096", "got 4097"});
}

TEST(OpsBlas, ThreadsPerRankShareTheCpusThisProcessMayUse) {
  // Against the affinity mask read here, and against a narrower one set for this test.
  cpu_set_t mine;
  ASSERT_EQ(sched_getaffinity(0, sizeof(mine), &mine), 0);
  const int cpus = CPU_COUNT(&mine);
  EXPECT_EQ(threads_per_rank(1), cpus);
  EXPECT_EQ(threads_per_rank(2), std::max(1, cpus / 2));
  EXPECT_EQ(threads_per_rank(cpus + 1), 1);  // more ranks than CPUs: never 0
  cpu_set_t one;
  CPU_ZERO(&one);
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &mine)) {
      CPU_SET(c, &one);
      break;
    }
  }
  ASSERT_EQ(sched_setaffinity(0, sizeof(one), &one), 0);
  EXPECT_EQ(threads_per_rank(1), 1);
  ASSERT_EQ(sched_setaffinity(0, sizeof(mine), &mine), 0);
  expect_invalid([] { threads_per_rank(0); }, {"threads_per_rank", "local_ranks must be >= 1, got 0"});
}

}  // namespace
