// Llama's configs, parameters and model in one process: the released shapes' parameter counts,
// the spec syntax and its refusals, the loss at initialisation, and the backward against central
// differences of the forward (the float64 comparison with PyTorch is ref_test.cpp's).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "coshard/llama/model.hpp"
#include "coshard/llama/params.hpp"
#include "coshard/runtime/error.hpp"

namespace {

using namespace coshard;
using namespace coshard::llama;

std::string error_of(const std::string& spec) {
  try {
    parse_config(spec);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::bad_config) << e.what();
    return e.message();
  }
  ADD_FAILURE() << "'" << spec << "' was accepted";
  return {};
}

std::int64_t counted(const Config& c) {
  std::int64_t n = 0;
  for (const auto& p : all_params(c)) n += p.numel();
  return n;
}

TEST(LlamaConfig, TheReleasedShapesHaveTheReleasedParameterCounts) {
  // Meta's figures for the released checkpoints (the 1B ties its head).
  EXPECT_EQ(named_config("llama3.1-8B").num_params(), 8030261248);
  EXPECT_EQ(named_config("llama3.2-1B").num_params(), 1235814400);
  for (const auto& name : config_names()) {
    const Config c = named_config(name);
    c.validate();
    EXPECT_EQ(counted(c), c.num_params()) << name;
  }
  EXPECT_NEAR(static_cast<double>(named_config("llama-60M").num_params()), 60e6, 6e6);
  EXPECT_NEAR(static_cast<double>(named_config("llama-150M").num_params()), 150e6, 10e6);
}

TEST(LlamaConfig, SpecsParseOverrideAndRoundTrip) {
  const Config c = parse_config("llama-tiny,kv_heads=1,vocab=97,tie_head=true");
  EXPECT_EQ(c.kv_heads, 1);
  EXPECT_EQ(c.vocab, 97);
  EXPECT_TRUE(c.tie_head);
  for (const auto& name : config_names()) {
    const Config n = named_config(name);
    EXPECT_EQ(parse_config(n.to_string()), n) << n.to_string();
  }
  const Config scaled = parse_config("llama-tiny,rope_theta=500000,rope_scaling=llama3:8:1:4:8192,rms_eps=1e-6");
  EXPECT_TRUE(scaled.rope_llama3);
  EXPECT_EQ(scaled.rope_scaling.factor, 8.0);
  EXPECT_EQ(scaled.rms_eps, 1e-6);
  EXPECT_EQ(parse_config(scaled.to_string()), scaled);
}

TEST(LlamaConfig, ShapesThatCannotWorkAreRefusedNamingTheKey) {
  EXPECT_NE(error_of("llama-tiny,kv_heads=3").find("kv_heads=3 does not divide heads=4"), std::string::npos);
  EXPECT_NE(error_of("llama-tiny,head_dim=15").find("head_dim=15 is odd"), std::string::npos);
  EXPECT_NE(error_of("llama-tiny,rope_scaling=yarn:4").find("rope_scaling='yarn:4'"), std::string::npos);
  EXPECT_NE(error_of("llama-tiny,attention_bias=1").find("unknown key 'attention_bias'"), std::string::npos);
  EXPECT_NE(error_of("llama-tiny,rms_eps=0").find("rms_eps=0 must be positive"), std::string::npos);
  EXPECT_NE(error_of("layers=2,heads=4").find("lacks kv_heads"), std::string::npos);
  EXPECT_NE(error_of("llama-tiny,width=64,width=32").find("key 'width' given twice"), std::string::npos);
  EXPECT_NE(error_of("tiny").find("unknown config name 'tiny'"), std::string::npos);
}

TEST(LlamaParams, HuggingFaceNamesAndNnLinearShapes) {
  const Config c = parse_config("llama-tiny,kv_heads=1");
  const auto p = all_params(c);
  ASSERT_EQ(p.size(), 1 + 9 * 2 + 2u);
  EXPECT_EQ(p[0].name, "model.embed_tokens.weight");
  EXPECT_EQ(p[1 + q_proj].name, "model.layers.0.self_attn.q_proj.weight");
  EXPECT_EQ(p[1 + q_proj].shape, (Shape{64, 64}));
  EXPECT_EQ(p[1 + k_proj].shape, (Shape{16, 64}));  // one key/value head of 16
  EXPECT_EQ(p[1 + down_proj].shape, (Shape{64, 176}));
  EXPECT_EQ(p.back().name, "lm_head.weight");
  EXPECT_EQ(all_params(parse_config("llama-tiny,tie_head=true")).back().name, "model.norm.weight");
}

TEST(LlamaModel, TheLossAtInitialisationIsTheUniformOne) {
  Llama m(named_config("llama-tiny"), 7);
  std::vector<std::int32_t> x(2 * 16), y(2 * 16);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<std::int32_t>(i * 37 % 256), y[i] = static_cast<std::int32_t>(i * 11 % 256);
  EXPECT_NEAR(m.forward(x, y, 2, 16), std::log(256.0), 0.05);
}

// The analytic gradient of each parameter against central differences of the (float) loss, at
// a few elements of each, on a shape with grouped-query attention and odd sizes.
TEST(LlamaModel, GradientsMatchCentralDifferences) {
  for (const char* spec : {"layers=2,heads=4,kv_heads=2,width=20,ffn=30,head_dim=6,vocab=37,context=16",
                           "layers=1,heads=3,kv_heads=1,width=12,ffn=18,head_dim=4,vocab=29,context=16,tie_head=true"}) {
    SCOPED_TRACE(spec);
    Llama m(parse_config(spec), 11);
    // Weights 10x Hugging Face's initial scale, norm weights away from 1: at 0.02 the scores are
    // near 0, attention near uniform, and the q and k gradients too small to tell right from wrong.
    for (std::size_t i = 0; i < m.params().size(); ++i) {
      for (float& v : m.params().at(i)) v = m.params().infos()[i].init == models::Init::normal ? 10 * v : v - 0.3f * v * v;
    }
    const std::size_t B = 2, T = 7;
    std::vector<std::int32_t> x(B * T), y(B * T);
    for (std::size_t i = 0; i < x.size(); ++i) {
      x[i] = static_cast<std::int32_t>((i * 13 + 5) % static_cast<std::size_t>(m.config().vocab));
      y[i] = static_cast<std::int32_t>((i * 7 + 3) % static_cast<std::size_t>(m.config().vocab));
    }
    m.zero_grad();
    m.forward(x, y, B, T);
    m.backward(1.0f);
    const std::vector<float> grads(m.grads().flat().begin(), m.grads().flat().end());
    for (std::size_t i = 0; i < m.params().size(); ++i) {
      auto p = m.params().at(i);
      const auto at = static_cast<std::size_t>(m.params().offset(i));
      // Norm-wise over a few elements of each parameter: a wrong backward is off by its own size.
      double worst = 0, scale = 0;
      for (std::size_t k : {std::size_t{0}, p.size() / 3, p.size() / 2, 2 * p.size() / 3, p.size() - 1}) {
        const float keep = p[k], h = 3e-3f;
        p[k] = keep + h;
        const double up = m.forward(x, y, B, T);
        p[k] = keep - h;
        const double down = m.forward(x, y, B, T);
        p[k] = keep;
        const double fd = (up - down) / (2.0 * h);
        worst = std::max(worst, std::fabs(grads[at + k] - fd));
        scale = std::max(scale, std::fabs(fd));
      }
      EXPECT_LT(worst, 2e-4 + 0.03 * scale) << m.params().infos()[i].name << ": largest gradient " << scale;
    }
  }
}

TEST(LlamaModel, ABatchOutsideTheVocabularyOrContextIsRefused) {
  Llama m(named_config("llama-tiny"), 7);
  std::vector<std::int32_t> x(4, 1), y(4, 256);
  EXPECT_THROW(m.forward(x, y, 1, 4), Error);
  std::vector<std::int32_t> long_x(65, 1), long_y(65, 1);
  EXPECT_THROW(m.forward(long_x, long_y, 1, 65), Error);
}

}  // namespace
