#include "coshard/ops/attention.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "ops/attention_ref.hpp"
#include "ops/gradcheck.hpp"

using namespace coshard::ops;
using namespace coshard::testing;

namespace {

// Bounds (norm-wise relative error against float64): forward and lse 1e-6, backward 1e-5.
// Measured: forward <= 6.1e-7 (heads 128 and 256 wide, where the scores' own rounding grows),
// lse <= 1.6e-7, backward <= 4.7e-7 over the shapes below.
constexpr double kForwardTol = 1e-6;
constexpr double kBackwardTol = 1e-5;

struct Shape {
  std::size_t B, T, C, NH;
  std::size_t hs() const { return C / NH; }
  std::size_t n_qkv() const { return B * T * 3 * C; }
  std::size_t n_out() const { return B * T * C; }
  std::size_t n_lse() const { return B * NH * T; }
};

std::string name(const Shape& s) {
  return "B=" + std::to_string(s.B) + " T=" + std::to_string(s.T) + " C=" + std::to_string(s.C) +
         " NH=" + std::to_string(s.NH);
}

Reference ref_attention(const std::vector<double>& qkv, const Shape& s, const std::vector<double>* dout = nullptr) {
  return ref_mha(qkv, s.B, s.T, s.NH, s.hs(), dout);
}

struct Result {
  std::vector<float> out, lse, dqkv;
};

Result run(const std::vector<float>& qkv, const Shape& s, const std::vector<float>& dout) {
  Result r{std::vector<float>(s.n_out(), 9.0f), std::vector<float>(s.n_lse(), 9.0f),
           std::vector<float>(s.n_qkv(), 17.0f)};
  attention_forward(qkv, r.out, r.lse, s.B, s.T, s.C, s.NH);
  if (!dout.empty()) attention_backward(dout, qkv, r.out, r.lse, r.dqkv, s.B, s.T, s.C, s.NH);
  return r;
}

// T around the tile of 64 (1, below, at, above, several tiles with a ragged last one, and 300 and
// 577, where more tiles than a key tile of 256 would hold), heads 1..128 wide, odd widths included.
const Shape kShapes[] = {{2, 5, 12, 3},   {1, 1, 8, 2},    {1, 63, 6, 6},   {2, 64, 14, 2},
                         {1, 65, 3, 1},   {1, 130, 9, 3},  {1, 200, 32, 1}, {1, 70, 128, 1},
                         {2, 129, 256, 2}, {1, 97, 40, 8}, {1, 300, 8, 2},  {1, 577, 12, 3}};

TEST(OpsAttention, MatchesFloat64ReferenceOnOddShapes) {
  std::uint32_t seed = 1;
  for (const Shape& s : kShapes) {
    SCOPED_TRACE(name(s));
    const auto qkv = random_floats(s.n_qkv(), seed++, -2.0f, 2.0f);
    const auto dout = random_floats(s.n_out(), seed++);
    const auto got = run(qkv, s, dout);
    const auto dd = to_double(dout);
    const auto ref = ref_attention(to_double(qkv), s, &dd);
    EXPECT_LT(rel_error(got.out, ref.out), kForwardTol);
    EXPECT_LT(rel_error(got.lse, ref.lse), kForwardTol);
    EXPECT_LT(rel_error(got.dqkv, ref.dqkv), kBackwardTol);
  }
}

// On several threads (blas_threads()) each takes a run of the B x NH heads, which are independent:
// the same bits as one thread, also where the heads do not divide evenly.
TEST(OpsAttention, ThreadsSplitTheHeadsAndGiveTheSameBits) {
  for (const Shape& s : {Shape{2, 300, 48, 3}, Shape{1, 600, 64, 2}, Shape{4, 260, 40, 5}}) {
    SCOPED_TRACE(name(s));
    const auto qkv = random_floats(s.n_qkv(), 21, -2.0f, 2.0f);
    const auto dout = random_floats(s.n_out(), 22);
    const auto one = run(qkv, s, dout);
    const auto three = [&] {
      const BlasThreads threads(3);
      return run(qkv, s, dout);
    }();
    EXPECT_EQ(one.out, three.out);
    EXPECT_EQ(one.lse, three.lse);
    EXPECT_EQ(one.dqkv, three.dqkv);
  }
}

TEST(OpsAttention, BackwardMatchesFiniteDifferences) {
  // Finite differences of the float64 forward, so the analytic reference above is not the only
  // judge of the backward: one shape inside a tile, one across two tiles with a ragged end.
  for (const Shape& s : {Shape{2, 5, 12, 3}, Shape{1, 67, 4, 2}}) {
    SCOPED_TRACE(name(s));
    const auto qkv = random_floats(s.n_qkv(), 3, -2.0f, 2.0f);
    const auto r = random_floats(s.n_out(), 4);
    const auto got = run(qkv, s, r);
    const auto rd = to_double(r);
    auto num = numeric_grad([&](const auto& v) { return dot(ref_attention(v, s).out, rd); }, to_double(qkv));
    EXPECT_LT(rel_error(got.dqkv, num), kBackwardTol);
  }
}

TEST(OpsAttention, LargeScoresDoNotOverflow) {
  // Scores of +-1e3 after scaling: a softmax without the running max would overflow exp.
  const Shape s{1, 80, 4, 1};
  auto qkv = random_floats(s.n_qkv(), 6, -40.0f, 40.0f);
  const auto r = random_floats(s.n_out(), 7);
  const auto got = run(qkv, s, r);
  const auto rd = to_double(r);
  const auto ref = ref_attention(to_double(qkv), s, &rd);
  // The scores themselves carry fp32 rounding of |s| * 6e-8 (about 6e-5 here), which exp turns
  // into a relative error of the same size: the bound follows the conditioning, not the kernel.
  EXPECT_LT(rel_error(got.out, ref.out), 1e-4);
  EXPECT_LT(rel_error(got.dqkv, ref.dqkv), 1e-4);
}

TEST(OpsAttention, FirstPositionSeesOnlyItself) {
  const Shape s{2, 70, 12, 3};
  auto qkv = random_floats(s.n_qkv(), 2);
  const auto got = run(qkv, s, {});
  for (std::size_t b = 0; b < s.B; ++b) {
    for (std::size_t i = 0; i < s.C; ++i) EXPECT_FLOAT_EQ(got.out[b * s.T * s.C + i], qkv[b * s.T * 3 * s.C + 2 * s.C + i]);
    for (std::size_t h = 0; h < s.NH; ++h) {
      // One visible score: its log-sum-exp is the score itself, q . k / sqrt(hs) of position 0.
      double qk = 0.0;
      for (std::size_t i = 0; i < s.hs(); ++i) {
        const std::size_t base = b * s.T * 3 * s.C + h * s.hs() + i;
        qk += static_cast<double>(qkv[base]) * qkv[base + s.C];
      }
      EXPECT_NEAR(got.lse[(b * s.NH + h) * s.T], qk / std::sqrt(static_cast<double>(s.hs())), 1e-6);
    }
  }
}

TEST(OpsAttention, LaterPositionsGetNoGradientFromTheFirstOutput) {
  // Only the first position's output has a gradient: only position 0's q, k, v may receive one,
  // also from key tiles after the first.
  const Shape s{2, 70, 12, 3};
  auto qkv = random_floats(s.n_qkv(), 5);
  std::vector<float> r(s.n_out(), 0.0f);
  for (std::size_t b = 0; b < s.B; ++b)
    for (std::size_t i = 0; i < s.C; ++i) r[b * s.T * s.C + i] = 1.0f;  // t = 0 only
  const auto got = run(qkv, s, r);
  for (std::size_t b = 0; b < s.B; ++b)
    for (std::size_t t = 1; t < s.T; ++t)
      for (std::size_t i = 0; i < 3 * s.C; ++i)
        EXPECT_EQ(got.dqkv[(b * s.T + t) * 3 * s.C + i], 0.0f) << b << " " << t << " " << i;
}

TEST(OpsAttention, NanInAnInputReachesTheOutput) {
  // A diverged run must show NaN, not a finite output from a clamped exponent.
  const Shape s{1, 3, 4, 1};
  auto qkv = random_floats(s.n_qkv(), 8);
  qkv[3 * s.C + s.C] = NAN;  // k of position 1: every later query sees it
  const auto got = run(qkv, s, {});
  EXPECT_FALSE(std::isnan(got.out[0]));
  EXPECT_TRUE(std::isnan(got.out[s.C]));
  EXPECT_TRUE(std::isnan(got.out[2 * s.C]));
}

TEST(OpsAttention, WrongSizesNameTheArgument) {
  const std::size_t B = 2, T = 5, C = 12, NH = 3;
  std::vector<float> qkv(B * T * 3 * C), out(B * T * C), lse(B * NH * T);
  std::vector<float> short_lse(B * NH * T - 1);
  expect_invalid([&] { attention_forward(qkv, out, short_lse, B, T, C, NH); },
                 {"attention_forward", "lse has 29", "expected 30", "[B, NH, T] = [2, 3, 5]"});
  expect_invalid([&] { attention_forward(qkv, out, lse, B, T, C, 5); },
                 {"attention_forward", "C = 12 is not divisible", "NH = 5"});
  expect_invalid([&] { attention_forward(qkv, out, lse, B, 0, C, NH); }, {"attention_forward", "T must be positive"});
  std::vector<float> dqkv(B * T * C);
  expect_invalid([&] { attention_backward(out, qkv, out, lse, dqkv, B, T, C, NH); },
                 {"attention_backward", "dqkv has 120", "expected 360", "[B, T, 3C] = [2, 5, 36]"});
  expect_invalid([&] { attention_forward(qkv, std::span<float>(qkv).subspan(0, B * T * C), lse, B, T, C, NH); },
                 {"attention_forward", "out and qkv must not overlap"});
}

}  // namespace
