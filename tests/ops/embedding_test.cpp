#include "coshard/ops/embedding.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "ops/gradcheck.hpp"

using namespace coshard::ops;
using namespace coshard::testing;

namespace {

// Bounds: forward 1e-7 relative (one float add); backward 1e-6 (sums of a few terms).
// Measured: 3e-8, 5e-8.
constexpr double kForwardTol = 1e-7;
constexpr double kBackwardTol = 1e-6;
constexpr std::size_t B = 2, T = 5, C = 12, V = 11, P = 8;  // P: positions in wpe, >= T

std::vector<std::int32_t> tokens() {
  // Token 3 repeats (in both sequences) so the backward must add, not overwrite.
  return {3, 0, 10, 3, 7, 1, 3, 9, 2, 3};
}

std::vector<double> ref_embedding(const std::vector<std::int32_t>& tok, const std::vector<double>& wte,
                                  const std::vector<double>& wpe) {
  std::vector<double> out(B * T * C);
  for (std::size_t b = 0; b < B; ++b)
    for (std::size_t t = 0; t < T; ++t)
      for (std::size_t i = 0; i < C; ++i)
        out[(b * T + t) * C + i] = wte[static_cast<std::size_t>(tok[b * T + t]) * C + i] + wpe[t * C + i];
  return out;
}

TEST(OpsEmbedding, ForwardMatchesFloat64Reference) {
  auto wte = random_floats(V * C, 1);
  auto wpe = random_floats(P * C, 2);
  std::vector<float> out(B * T * C);
  embedding_forward(tokens(), wte, wpe, out, B, T, C, V);
  EXPECT_LT(rel_error(out, ref_embedding(tokens(), to_double(wte), to_double(wpe))), kForwardTol);
}

TEST(OpsEmbedding, BackwardMatchesFiniteDifferencesAndAccumulates) {
  auto wte = random_floats(V * C, 3);
  auto wpe = random_floats(P * C, 4);
  auto r = random_floats(B * T * C, 5);
  auto dwte = random_floats(V * C, 6);  // earlier contents: the backward adds to them
  auto dwpe = random_floats(P * C, 7);
  const auto dwte0 = dwte, dwpe0 = dwpe;
  embedding_backward(r, tokens(), dwte, dwpe, B, T, C, V);

  const auto ed = to_double(wte), pd = to_double(wpe), rd = to_double(r);
  auto num_e = numeric_grad([&](const auto& v) { return dot(ref_embedding(tokens(), v, pd), rd); }, ed);
  auto num_p = numeric_grad([&](const auto& v) { return dot(ref_embedding(tokens(), ed, v), rd); }, pd);
  for (std::size_t i = 0; i < num_e.size(); ++i) num_e[i] += dwte0[i];
  for (std::size_t i = 0; i < num_p.size(); ++i) num_p[i] += dwpe0[i];
  EXPECT_LT(rel_error(dwte, num_e), kBackwardTol);
  EXPECT_LT(rel_error(dwpe, num_p), kBackwardTol);
  // Positions past T get no gradient.
  for (std::size_t i = T * C; i < P * C; ++i) EXPECT_EQ(dwpe[i], dwpe0[i]);
}

// Llama's embedding has no position table: an empty wpe gives the token rows alone, exactly.
TEST(OpsEmbedding, WithoutAPositionTableTheRowsAreTheTokens) {
  auto wte = random_floats(V * C, 8);
  std::vector<float> out(B * T * C, 7.0f);
  embedding_forward(tokens(), wte, {}, out, B, T, C, V);
  const auto tok = tokens();
  for (std::size_t n = 0; n < B * T; ++n)
    for (std::size_t i = 0; i < C; ++i) ASSERT_EQ(out[n * C + i], wte[static_cast<std::size_t>(tok[n]) * C + i]);
  std::vector<float> dwte(V * C, 0.0f);
  embedding_backward(out, tokens(), dwte, {}, B, T, C, V);
  EXPECT_NE(dwte, std::vector<float>(V * C, 0.0f));
}

TEST(OpsEmbedding, TokenOutOfRangeNamesThePosition) {
  std::vector<float> wte(V * C), wpe(P * C), out(B * T * C);
  auto tok = tokens();
  tok[7] = static_cast<std::int32_t>(V);
  expect_invalid([&] { embedding_forward(tok, wte, wpe, out, B, T, C, V); },
                 {"embedding_forward", "token id 11 at position 7 (b = 1, t = 2)", "[0, V = 11)"});
  tok[7] = -3;
  expect_invalid([&] { embedding_backward(out, tok, wte, wpe, B, T, C, V); }, {"embedding_backward", "token id -3"});
}

TEST(OpsEmbedding, WrongSizesNameTheArgument) {
  std::vector<float> wte(V * C), out(B * T * C);
  std::vector<float> short_wpe((T - 1) * C), short_wte(V * C - 1);
  expect_invalid([&] { embedding_forward(tokens(), wte, short_wpe, out, B, T, C, V); },
                 {"embedding_forward", "wpe has 48", "P >= T = 5"});
  std::vector<float> wpe(P * C);
  expect_invalid([&] { embedding_forward(tokens(), short_wte, wpe, out, B, T, C, V); },
                 {"wte has 131", "expected 132", "[V, C] = [11, 12]"});
  std::vector<std::int32_t> short_tok(B * T - 1);
  expect_invalid([&] { embedding_forward(short_tok, wte, wpe, out, B, T, C, V); }, {"tokens has 9", "expected 10"});
}

}  // namespace
