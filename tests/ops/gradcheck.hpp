#pragma once
// Test helpers for the ops suites: seeded inputs, float64 central differences of a float64
// reference, a norm-wise relative error, and a check for Errc::invalid_argument messages.
//
// Gradient checks work on the scalar L = sum(out .* R) for a fixed random R: the analytic backward
// gets dout = R, the numeric gradient is (L(x + h e_i) - L(x - h e_i)) / 2h of the float64
// reference forward. Because the reference is float64, the numeric gradient is accurate to about
// 1e-9 and the comparison measures the fp32 kernel alone.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "coshard/ops/blas.hpp"
#include "coshard/runtime/error.hpp"

namespace coshard::testing {

/// blas_threads() set to `n` for a scope, then back to one (the default the other tests expect).
class BlasThreads {
 public:
  explicit BlasThreads(int n) { ops::set_blas_threads(n); }
  ~BlasThreads() { ops::set_blas_threads(1); }
  BlasThreads(const BlasThreads&) = delete;
  BlasThreads& operator=(const BlasThreads&) = delete;
};

inline std::vector<float> random_floats(std::size_t n, std::uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(gen);
  return v;
}

inline std::vector<double> to_double(std::span<const float> v) { return {v.begin(), v.end()}; }

inline double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// max_i |got_i - ref_i| / max_i |ref_i| (norm-wise, so tiny reference entries do not blow it up).
inline double rel_error(std::span<const float> got, std::span<const double> ref) {
  EXPECT_EQ(got.size(), ref.size());
  double num = 0.0;
  double den = 0.0;
  for (std::size_t i = 0; i < std::min(got.size(), ref.size()); ++i) {
    const double d = std::fabs(static_cast<double>(got[i]) - ref[i]);
    num = std::isnan(d) ? INFINITY : std::max(num, d);
    den = std::max(den, std::fabs(ref[i]));
  }
  return den > 0.0 ? num / den : num;
}

// Central differences of f at x (every coordinate), in float64.
inline std::vector<double> numeric_grad(const std::function<double(const std::vector<double>&)>& f,
                                        std::vector<double> x, double h = 1e-5) {
  std::vector<double> g(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double keep = x[i];
    x[i] = keep + h;
    const double up = f(x);
    x[i] = keep - h;
    const double down = f(x);
    x[i] = keep;
    g[i] = (up - down) / (2.0 * h);
  }
  return g;
}

// Runs fn, expects coshard::Error with Errc::invalid_argument and a message holding every part.
template <class F>
void expect_invalid(F&& fn, std::initializer_list<std::string> parts) {
  try {
    fn();
    ADD_FAILURE() << "expected Errc::invalid_argument, nothing was thrown";
  } catch (const coshard::Error& e) {
    EXPECT_EQ(e.code(), coshard::Errc::invalid_argument) << e.what();
    for (const auto& p : parts) EXPECT_NE(e.message().find(p), std::string::npos) << "'" << p << "' not in: " << e.message();
  }
}

}  // namespace coshard::testing
