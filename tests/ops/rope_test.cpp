#include "coshard/ops/rope.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "ops/gradcheck.hpp"

using namespace coshard::ops;
using namespace coshard::testing;

namespace {

// Hugging Face Llama's inverse frequencies in float64: 1 / theta^(2i / dim), for i < dim / 2.
std::vector<double> ref_inv_freq(std::size_t dim, double theta) {
  std::vector<double> f;
  for (std::size_t i = 0; i < dim; i += 2) f.push_back(1.0 / std::pow(theta, static_cast<double>(i) / dim));
  return f;
}

// transformers' _compute_llama3_parameters, in its own terms (a torch.where over the frequencies).
std::vector<double> ref_llama3(std::vector<double> f, const RopeScaling& s) {
  const double low_wavelen = s.original_context / s.low_freq_factor;
  const double high_wavelen = s.original_context / s.high_freq_factor;
  for (double& inv : f) {
    const double wavelen = 2 * M_PI / inv;
    const double llama = wavelen > low_wavelen ? inv / s.factor : inv;
    const double smooth = (s.original_context / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
    const double smoothed = (1 - smooth) * llama / s.factor + smooth * llama;
    const bool medium = !(wavelen < high_wavelen) && !(wavelen > low_wavelen);
    inv = medium ? smoothed : llama;
  }
  return f;
}

// q * cos + rotate_half(q) * sin on the query and key heads, cos = cat(freqs, freqs).cos():
// rotate_half(x) = cat(-x[hs/2:], x[:hs/2]).
std::vector<double> ref_rope(const std::vector<double>& qkv, const AttentionShape& s, const std::vector<double>& inv) {
  std::vector<double> out = qkv;
  const std::size_t hs = s.head_size, half = hs / 2, ld = s.qkv_width();
  for (std::size_t r = 0; r < s.B * s.T; ++r) {
    const double t = static_cast<double>(r % s.T);
    for (std::size_t h = 0; h < s.heads + s.kv_heads; ++h) {
      const double* x = qkv.data() + r * ld + h * hs;
      for (std::size_t i = 0; i < hs; ++i) {
        const double angle = t * inv[i % half];
        const double rotated = i < half ? -x[i + half] : x[i - half];
        out[r * ld + h * hs + i] = x[i] * std::cos(angle) + rotated * std::sin(angle);
      }
    }
  }
  return out;
}

struct Table {
  std::vector<float> cos, sin;
};

Table table(std::size_t P, std::size_t hs, double theta, const RopeScaling* scaling = nullptr) {
  Table t{std::vector<float>(P * hs / 2), std::vector<float>(P * hs / 2)};
  rope_table(t.cos, t.sin, P, hs, theta, scaling);
  return t;
}

TEST(OpsRope, TableMatchesHuggingFacesFrequenciesWithAndWithoutLlama3Scaling) {
  const std::size_t P = 3000, hs = 64;
  const RopeScaling llama31{8.0, 1.0, 4.0, 8192.0};
  for (const RopeScaling* scaling : {static_cast<const RopeScaling*>(nullptr), &llama31}) {
    const double theta = scaling ? 500000.0 : 10000.0;
    const auto got = table(P, hs, theta, scaling);
    auto inv = ref_inv_freq(hs, theta);
    if (scaling) inv = ref_llama3(inv, *scaling);
    double worst = 0;
    for (std::size_t t = 0; t < P; ++t) {
      for (std::size_t i = 0; i < hs / 2; ++i) {
        worst = std::max(worst, std::fabs(got.cos[t * hs / 2 + i] - std::cos(t * inv[i])));
        worst = std::max(worst, std::fabs(got.sin[t * hs / 2 + i] - std::sin(t * inv[i])));
      }
    }
    EXPECT_LT(worst, 1e-7) << (scaling ? "llama3" : "default");  // one float rounding
  }
  // The three bands of the scaling: high frequencies kept, low ones divided by the factor.
  const auto inv = ref_inv_freq(128, 500000.0);
  const auto scaled = ref_llama3(inv, llama31);
  EXPECT_EQ(scaled.front(), inv.front());
  EXPECT_DOUBLE_EQ(scaled.back(), inv.back() / 8.0);
}

TEST(OpsRope, RotatesQueryAndKeyHeadsAndLeavesTheValues) {
  for (const AttentionShape s : {AttentionShape{2, 7, 4, 2, 8}, AttentionShape{1, 70, 3, 3, 6}, AttentionShape{3, 5, 2, 1, 2}}) {
    const auto t = table(s.T + 3, s.head_size, 10000.0);  // more positions than T: only the first T are read
    const auto x = random_floats(s.B * s.T * s.qkv_width(), 1, -2.0f, 2.0f);
    auto y = x;
    rope_forward(y, t.cos, t.sin, s);
    EXPECT_LT(rel_error(y, ref_rope(to_double(x), s, ref_inv_freq(s.head_size, 10000.0))), 1e-6);
    const std::size_t ld = s.qkv_width(), v0 = (s.heads + s.kv_heads) * s.head_size;
    for (std::size_t r = 0; r < s.B * s.T; ++r)
      for (std::size_t i = v0; i < ld; ++i) ASSERT_EQ(y[r * ld + i], x[r * ld + i]);
    // Position 0 of every sequence is not rotated.
    for (std::size_t b = 0; b < s.B; ++b)
      for (std::size_t i = 0; i < v0; ++i) EXPECT_EQ(y[b * s.T * ld + i], x[b * s.T * ld + i]);
  }
}

TEST(OpsRope, BackwardMatchesFiniteDifferencesAndUndoesTheForward) {
  const AttentionShape s{2, 6, 4, 2, 6};
  const auto t = table(s.T, s.head_size, 10000.0);
  const auto x = random_floats(s.B * s.T * s.qkv_width(), 2, -2.0f, 2.0f);
  const auto r = random_floats(x.size(), 3);
  auto g = r;
  rope_backward(g, t.cos, t.sin, s);
  const auto inv = ref_inv_freq(s.head_size, 10000.0);
  const auto rd = to_double(r);
  EXPECT_LT(rel_error(g, numeric_grad([&](const auto& v) { return dot(ref_rope(v, s, inv), rd); }, to_double(x))), 1e-6);
  auto y = x;
  rope_forward(y, t.cos, t.sin, s);
  rope_backward(y, t.cos, t.sin, s);
  EXPECT_LT(rel_error(y, to_double(x)), 1e-6);
}

TEST(OpsRope, BadShapesNameWhatIsWrong) {
  std::vector<float> c(10 * 3), sn(10 * 3);
  expect_invalid([&] { rope_table(c, sn, 10, 7, 10000.0); }, {"rope_table", "head_size = 7 is odd"});
  expect_invalid([&] { rope_table(c, sn, 10, 6, 0.5); }, {"rope_table", "theta"});
  const AttentionShape s{1, 11, 2, 1, 6};
  std::vector<float> x(s.B * s.T * s.qkv_width());
  expect_invalid([&] { rope_forward(x, c, sn, s); }, {"rope_forward", "cos has 30", "P >= T = 11"});
  const AttentionShape odd{1, 4, 2, 1, 5};
  std::vector<float> xo(odd.B * odd.T * odd.qkv_width());
  expect_invalid([&] { rope_forward(xo, c, sn, odd); }, {"rope_forward", "head_size = 5 is odd"});
  expect_invalid([&] { rope_backward(std::span<float>(x).first(5), c, sn, {1, 4, 2, 1, 6}); },
                 {"rope_backward", "dqkv has 5"});
}

}  // namespace
