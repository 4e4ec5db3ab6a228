#include "coshard/ops/attention.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "ops/gradcheck.hpp"

using namespace coshard::ops;
using namespace coshard::testing;

namespace {

// Bounds (norm-wise relative error against float64): forward 1e-6, backward 1e-5.
// Measured: 9e-8, 1.1e-7.
constexpr double kForwardTol = 1e-6;
constexpr double kBackwardTol = 1e-5;
constexpr std::size_t B = 2, T = 5, C = 12, NH = 3;

// Naive causal attention in float64, written from the definition: per (b, h), S = Q K^T / sqrt(hs)
// with -inf above the diagonal, P = softmax(S) by rows, O = P V.
std::vector<double> ref_attention(const std::vector<double>& qkv, std::size_t b_, std::size_t t_, std::size_t c,
                                  std::size_t nh) {
  const std::size_t hs = c / nh;
  std::vector<double> out(b_ * t_ * c, 0.0);
  auto at = [&](std::size_t b, std::size_t t, std::size_t part, std::size_t h, std::size_t i) {
    return qkv[(b * t_ + t) * 3 * c + part * c + h * hs + i];
  };
  for (std::size_t b = 0; b < b_; ++b) {
    for (std::size_t h = 0; h < nh; ++h) {
      for (std::size_t t = 0; t < t_; ++t) {
        std::vector<double> s(t_, -INFINITY);
        double mx = -INFINITY;
        for (std::size_t j = 0; j < t_; ++j) {
          if (j > t) continue;  // causal mask
          double d = 0.0;
          for (std::size_t i = 0; i < hs; ++i) d += at(b, t, 0, h, i) * at(b, j, 1, h, i);
          s[j] = d / std::sqrt(static_cast<double>(hs));
          mx = std::max(mx, s[j]);
        }
        double sum = 0.0;
        for (auto& v : s) sum += (v = std::exp(v - mx));
        for (std::size_t j = 0; j < t_; ++j)
          for (std::size_t i = 0; i < hs; ++i) out[(b * t_ + t) * c + h * hs + i] += s[j] / sum * at(b, j, 2, h, i);
      }
    }
  }
  return out;
}

TEST(OpsAttention, ForwardMatchesFloat64Reference) {
  auto qkv = random_floats(B * T * 3 * C, 1, -2.0f, 2.0f);
  std::vector<float> out(B * T * C), att(B * NH * T * T, 9.0f);
  attention_forward(qkv, out, att, B, T, C, NH);
  EXPECT_LT(rel_error(out, ref_attention(to_double(qkv), B, T, C, NH)), kForwardTol);
  // att rows are probability distributions over the visible prefix, zero above the diagonal.
  for (std::size_t row = 0; row < B * NH * T; ++row) {
    const std::size_t t = row % T;
    double sum = 0.0;
    for (std::size_t j = 0; j < T; ++j) {
      const float p = att[row * T + j];
      if (j > t) {
        EXPECT_EQ(p, 0.0f) << "row " << row << " col " << j;
      } else {
        EXPECT_GT(p, 0.0f);
      }
      sum += p;
    }
    EXPECT_NEAR(sum, 1.0, 1e-6);
  }
}

TEST(OpsAttention, FirstPositionSeesOnlyItself) {
  auto qkv = random_floats(B * T * 3 * C, 2);
  std::vector<float> out(B * T * C), att(B * NH * T * T);
  attention_forward(qkv, out, att, B, T, C, NH);
  for (std::size_t b = 0; b < B; ++b)
    for (std::size_t i = 0; i < C; ++i) EXPECT_FLOAT_EQ(out[b * T * C + i], qkv[b * T * 3 * C + 2 * C + i]);
}

TEST(OpsAttention, BackwardMatchesFiniteDifferences) {
  auto qkv = random_floats(B * T * 3 * C, 3, -2.0f, 2.0f);
  auto r = random_floats(B * T * C, 4);
  std::vector<float> out(B * T * C), att(B * NH * T * T), dqkv(B * T * 3 * C, 17.0f);
  attention_forward(qkv, out, att, B, T, C, NH);
  attention_backward(r, qkv, att, dqkv, B, T, C, NH);
  const auto rd = to_double(r);
  auto num = numeric_grad([&](const auto& v) { return dot(ref_attention(v, B, T, C, NH), rd); }, to_double(qkv));
  EXPECT_LT(rel_error(dqkv, num), kBackwardTol);
}

TEST(OpsAttention, LaterPositionsGetNoGradientFromTheFirstOutput) {
  // Only the first position's output has a gradient: only position 0's q, k, v may receive one.
  auto qkv = random_floats(B * T * 3 * C, 5);
  std::vector<float> out(B * T * C), att(B * NH * T * T), dqkv(B * T * 3 * C);
  attention_forward(qkv, out, att, B, T, C, NH);
  std::vector<float> r(B * T * C, 0.0f);
  for (std::size_t b = 0; b < B; ++b)
    for (std::size_t i = 0; i < C; ++i) r[b * T * C + i] = 1.0f;  // t = 0 only
  attention_backward(r, qkv, att, dqkv, B, T, C, NH);
  for (std::size_t b = 0; b < B; ++b)
    for (std::size_t t = 1; t < T; ++t)
      for (std::size_t i = 0; i < 3 * C; ++i) EXPECT_EQ(dqkv[(b * T + t) * 3 * C + i], 0.0f) << b << " " << t << " " << i;
}

TEST(OpsAttention, WrongSizesNameTheArgument) {
  std::vector<float> qkv(B * T * 3 * C), out(B * T * C), att(B * NH * T * T);
  std::vector<float> short_att(B * NH * T * T - 1);
  expect_invalid([&] { attention_forward(qkv, out, short_att, B, T, C, NH); },
                 {"attention_forward", "att has 149", "expected 150", "[B, NH, T, T] = [2, 3, 5, 5]"});
  expect_invalid([&] { attention_forward(qkv, out, att, B, T, C, 5); },
                 {"attention_forward", "C = 12 is not divisible", "NH = 5"});
  std::vector<float> dqkv(B * T * C);
  expect_invalid([&] { attention_backward(out, qkv, att, dqkv, B, T, C, NH); },
                 {"attention_backward", "dqkv has 120", "expected 360", "[B, T, 3C] = [2, 5, 36]"});
}

}  // namespace
