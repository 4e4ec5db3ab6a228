// Grouped-query attention (AttentionShape with fewer key/value heads than query heads) against
// Hugging Face's definition: each key/value head repeated for the query heads it serves
// (repeat_kv), multi-head attention in float64 on that, and the repeated heads' gradients summed.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "coshard/ops/attention.hpp"
#include "ops/attention_ref.hpp"
#include "ops/gradcheck.hpp"

using namespace coshard::ops;
using namespace coshard::testing;

namespace {

constexpr double kForwardTol = 1e-6;  // as the multi-head suite's
constexpr double kBackwardTol = 1e-5;

std::string name(const AttentionShape& s) {
  return "B=" + std::to_string(s.B) + " T=" + std::to_string(s.T) + " NH=" + std::to_string(s.heads) +
         " NKV=" + std::to_string(s.kv_heads) + " hs=" + std::to_string(s.head_size);
}

// qkv [B, T, (NH + 2 NKV) hs] as multi-head qkv [B, T, 3 NH hs], each key/value head repeated.
std::vector<double> repeat_kv(const std::vector<double>& qkv, const AttentionShape& s) {
  const std::size_t hs = s.head_size, C = s.heads * hs, group = s.heads / s.kv_heads, ld = s.qkv_width();
  std::vector<double> out(s.B * s.T * 3 * C);
  for (std::size_t r = 0; r < s.B * s.T; ++r) {
    for (std::size_t h = 0; h < s.heads; ++h) {
      for (std::size_t i = 0; i < hs; ++i) {
        out[r * 3 * C + h * hs + i] = qkv[r * ld + h * hs + i];
        out[r * 3 * C + C + h * hs + i] = qkv[r * ld + (s.heads + h / group) * hs + i];
        out[r * 3 * C + 2 * C + h * hs + i] = qkv[r * ld + (s.heads + s.kv_heads + h / group) * hs + i];
      }
    }
  }
  return out;
}

// The multi-head gradient [B, T, 3 NH hs] back onto the grouped layout: repeated heads summed.
std::vector<double> fold_kv(const std::vector<double>& d3, const AttentionShape& s) {
  const std::size_t hs = s.head_size, C = s.heads * hs, group = s.heads / s.kv_heads, ld = s.qkv_width();
  std::vector<double> out(s.B * s.T * ld, 0.0);
  for (std::size_t r = 0; r < s.B * s.T; ++r) {
    for (std::size_t h = 0; h < s.heads; ++h) {
      for (std::size_t i = 0; i < hs; ++i) {
        out[r * ld + h * hs + i] = d3[r * 3 * C + h * hs + i];
        out[r * ld + (s.heads + h / group) * hs + i] += d3[r * 3 * C + C + h * hs + i];
        out[r * ld + (s.heads + s.kv_heads + h / group) * hs + i] += d3[r * 3 * C + 2 * C + h * hs + i];
      }
    }
  }
  return out;
}

struct Result {
  std::vector<float> out, lse, dqkv;
};

Result run(const std::vector<float>& qkv, const AttentionShape& s, const std::vector<float>& dout) {
  Result r{std::vector<float>(s.B * s.T * s.out_width(), 9.0f), std::vector<float>(s.B * s.heads * s.T, 9.0f),
           std::vector<float>(s.B * s.T * s.qkv_width(), 17.0f)};
  attention_forward(qkv, r.out, r.lse, s);
  if (!dout.empty()) attention_backward(dout, qkv, r.out, r.lse, r.dqkv, s);
  return r;
}

// Groups of 1 (multi-head), 2, 3 and all (multi-query), odd head sizes, T around the tile of 64.
const AttentionShape kShapes[] = {{2, 5, 4, 2, 3},  {1, 70, 6, 3, 8},  {2, 65, 6, 2, 5},  {1, 130, 8, 1, 16},
                                  {1, 9, 3, 3, 7},  {3, 33, 12, 4, 4}, {1, 200, 4, 2, 64}};

TEST(OpsAttentionGqa, MatchesRepeatedKeyValueHeadsInFloat64) {
  std::uint32_t seed = 1;
  for (const AttentionShape& s : kShapes) {
    SCOPED_TRACE(name(s));
    const auto qkv = random_floats(s.B * s.T * s.qkv_width(), seed++, -2.0f, 2.0f);
    const auto dout = random_floats(s.B * s.T * s.out_width(), seed++);
    const auto got = run(qkv, s, dout);
    const auto dd = to_double(dout);
    const auto ref = ref_mha(repeat_kv(to_double(qkv), s), s.B, s.T, s.heads, s.head_size, &dd);
    EXPECT_LT(rel_error(got.out, ref.out), kForwardTol);
    EXPECT_LT(rel_error(got.lse, ref.lse), kForwardTol);
    EXPECT_LT(rel_error(got.dqkv, fold_kv(ref.dqkv, s)), kBackwardTol);
  }
}

TEST(OpsAttentionGqa, BackwardMatchesFiniteDifferences) {
  for (const AttentionShape& s : {AttentionShape{2, 5, 4, 2, 3}, AttentionShape{1, 67, 3, 1, 4}}) {
    SCOPED_TRACE(name(s));
    const auto qkv = random_floats(s.B * s.T * s.qkv_width(), 3, -2.0f, 2.0f);
    const auto r = random_floats(s.B * s.T * s.out_width(), 4);
    const auto got = run(qkv, s, r);
    const auto rd = to_double(r);
    auto num = numeric_grad(
        [&](const auto& v) { return dot(ref_mha(repeat_kv(v, s), s.B, s.T, s.heads, s.head_size).out, rd); },
        to_double(qkv));
    EXPECT_LT(rel_error(got.dqkv, num), kBackwardTol);
  }
}

// A group of query heads is one thread's in the backward, so a key/value head's gradient sums
// in one order: the same bits on any thread count, also where the groups do not divide evenly.
TEST(OpsAttentionGqa, ThreadsGiveTheSameBits) {
  for (const AttentionShape& s : {AttentionShape{2, 300, 6, 2, 16}, AttentionShape{3, 260, 8, 1, 8}}) {
    SCOPED_TRACE(name(s));
    const auto qkv = random_floats(s.B * s.T * s.qkv_width(), 21, -2.0f, 2.0f);
    const auto dout = random_floats(s.B * s.T * s.out_width(), 22);
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

// With as many key/value heads as query heads the grouped form is GPT-2's multi-head attention,
// bit for bit (the fused [B, T, 3C] layout is the same layout).
TEST(OpsAttentionGqa, AsManyKeyValueHeadsIsTheMultiHeadForm) {
  const std::size_t B = 2, T = 70, NH = 3, hs = 8, C = NH * hs;
  const auto qkv = random_floats(B * T * 3 * C, 5, -2.0f, 2.0f);
  const auto dout = random_floats(B * T * C, 6);
  const auto grouped = run(qkv, {B, T, NH, NH, hs}, dout);
  std::vector<float> out(B * T * C), lse(B * NH * T), dqkv(B * T * 3 * C);
  attention_forward(qkv, out, lse, B, T, C, NH);
  attention_backward(dout, qkv, out, lse, dqkv, B, T, C, NH);
  EXPECT_EQ(grouped.out, out);
  EXPECT_EQ(grouped.lse, lse);
  EXPECT_EQ(grouped.dqkv, dqkv);
}

TEST(OpsAttentionGqa, BadShapesNameWhatIsWrong) {
  const AttentionShape s{1, 4, 6, 4, 2};  // 4 key/value heads do not divide 6 query heads
  std::vector<float> qkv(s.B * s.T * s.qkv_width()), out(s.B * s.T * s.out_width()), lse(s.B * s.heads * s.T);
  expect_invalid([&] { attention_forward(qkv, out, lse, s); },
                 {"attention_forward", "kv_heads = 4 does not divide heads = 6"});
  const AttentionShape ok{1, 4, 6, 3, 2};
  std::vector<float> qkv2(ok.B * ok.T * ok.qkv_width()), out2(ok.B * ok.T * ok.out_width()), lse2(6 * 4);
  std::vector<float> short_qkv(qkv2.size() - 1);
  expect_invalid([&] { attention_forward(short_qkv, out2, lse2, ok); },
                 {"attention_forward", "qkv has 95", "expected 96", "[B, T, (NH + 2 NKV) hs] = [1, 4, 24]"});
  expect_invalid([&] { attention_forward(qkv2, out2, lse2, {1, 4, 6, 0, 2}); }, {"kv_heads must be positive"});
  std::vector<float> dqkv(qkv2.size());
  expect_invalid([&] { attention_backward(lse2, qkv2, out2, lse2, dqkv, ok); },
                 {"attention_backward", "dout has 24", "expected 48", "[B, T, NH hs] = [1, 4, 12]"});
}

}  // namespace
