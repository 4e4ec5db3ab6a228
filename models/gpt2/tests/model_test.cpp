// GPT-2 model: configs, initialisation, the loss at init, a float64 finite-difference gradient
// check of the whole model, the tied versus untied head, and overfitting one batch with AdamW.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>

#include "coshard/gpt2/model.hpp"
#include "coshard/ops/optim.hpp"
#include "coshard/runtime/error.hpp"
#include "ref64.hpp"

namespace {

using namespace coshard;
using namespace coshard::gpt2;

std::vector<std::int32_t> random_tokens(std::size_t n, std::int64_t vocab, std::uint64_t seed) {
  std::vector<std::int32_t> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<std::int32_t>(splitmix64(seed * 1000003 + i) % static_cast<std::uint64_t>(vocab));
  return v;
}

std::string error_of(const std::string& spec) {
  try {
    parse_config(spec);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::bad_config);
    return e.what();
  }
  return "(no error)";
}

TEST(Gpt2Config, NamedConfigs) {
  EXPECT_EQ(named_config("124M").num_params(), 124439808);  // Hugging Face gpt2, tied head
  const auto tiny = named_config("tiny").num_params();
  EXPECT_GT(tiny, 100000);
  EXPECT_LT(tiny, 1000000);
  EXPECT_EQ(parse_config("tiny"), named_config("tiny"));
  for (const auto& n : config_names()) EXPECT_EQ(parse_config(named_config(n).to_string()), named_config(n));
}

TEST(Gpt2Config, ParsesShapesAndOverrides) {
  const Config c = parse_config("layers=2,heads=3,width=48,vocab=97,context=32");
  EXPECT_EQ(c.layers, 2);
  EXPECT_EQ(c.heads, 3);
  EXPECT_EQ(c.width, 48);
  EXPECT_EQ(c.vocab, 97);
  EXPECT_EQ(c.context, 32);
  EXPECT_TRUE(c.tie_head);
  const Config s = parse_config("10M, vocab=50257, tie_head=false");
  EXPECT_EQ(s.vocab, 50257);
  EXPECT_EQ(s.width, named_config("10M").width);
  EXPECT_FALSE(s.tie_head);
  EXPECT_EQ(parse_config(s.to_string()), s);
}

TEST(Gpt2Config, BadSpecsNameKeyAndValue) {
  EXPECT_NE(error_of("layers=2,heads=5,width=48,vocab=97,context=32").find("width=48 is not divisible by heads=5"), std::string::npos);
  EXPECT_NE(error_of("layers=2,heads=3,width=48,vocab=97").find("lacks context"), std::string::npos);
  EXPECT_NE(error_of("tiny,depth=3").find("unknown key 'depth'"), std::string::npos);
  EXPECT_NE(error_of("small").find("GPT-2 small as released is '124M'"), std::string::npos);
  EXPECT_NE(error_of("tiny,width=abc").find("width='abc' is not an integer"), std::string::npos);
  EXPECT_NE(error_of("tiny,width=12x").find("width='12x' is not an integer"), std::string::npos);
  EXPECT_NE(error_of("tiny,layers=0").find("layers=0 is out of range"), std::string::npos);
  EXPECT_NE(error_of("tiny,vocab=-3").find("vocab=-3 is out of range"), std::string::npos);
  EXPECT_NE(error_of("huge").find("unknown config name 'huge'"), std::string::npos);
  EXPECT_NE(error_of("tiny,width=64,width=32").find("key 'width' given twice"), std::string::npos);
  EXPECT_NE(error_of("width=64,tiny").find("'tiny'"), std::string::npos);
  EXPECT_NE(error_of("tiny,tie_head=maybe").find("tie_head='maybe'"), std::string::npos);
  EXPECT_NE(error_of("").find("empty config"), std::string::npos);
}

TEST(Gpt2Params, NamesShapesAndOrderAsHuggingFace) {
  const Config c = parse_config("layers=2,heads=3,width=48,vocab=97,context=32");
  const auto p = all_params(c);
  ASSERT_EQ(p.size(), 2u + 12u * 2u + 2u);
  EXPECT_EQ(p[0].name, "wte.weight");
  EXPECT_EQ(p[0].shape, (Shape{97, 48}));
  EXPECT_EQ(p[1].name, "wpe.weight");
  EXPECT_EQ(p[1].shape, (Shape{32, 48}));
  const std::vector<std::pair<std::string, Shape>> block = {
      {"h.1.ln_1.weight", {48}},          {"h.1.ln_1.bias", {48}},           {"h.1.attn.c_attn.weight", {48, 144}},
      {"h.1.attn.c_attn.bias", {144}},    {"h.1.attn.c_proj.weight", {48, 48}}, {"h.1.attn.c_proj.bias", {48}},
      {"h.1.ln_2.weight", {48}},          {"h.1.ln_2.bias", {48}},           {"h.1.mlp.c_fc.weight", {48, 192}},
      {"h.1.mlp.c_fc.bias", {192}},       {"h.1.mlp.c_proj.weight", {192, 48}}, {"h.1.mlp.c_proj.bias", {48}}};
  for (std::size_t k = 0; k < block.size(); ++k) {
    EXPECT_EQ(p[14 + k].name, block[k].first);
    EXPECT_EQ(p[14 + k].shape, block[k].second);
  }
  EXPECT_EQ(p[26].name, "ln_f.weight");
  EXPECT_EQ(p[27].name, "ln_f.bias");
  std::int64_t n = 0;
  for (const auto& x : p) n += x.numel();
  EXPECT_EQ(n, c.num_params());
  auto untied = c;
  untied.tie_head = false;
  EXPECT_EQ(all_params(untied).back().name, "lm_head.weight");
  EXPECT_EQ(all_params(untied).back().shape, (Shape{97, 48}));
  // Decay: matrices and embeddings only.
  for (const auto& x : p) EXPECT_EQ(x.weight_decay, x.shape.size() == 2) << x.name;
}

TEST(Gpt2Init, Gpt2Statistics) {
  const Config c = named_config("tiny");
  Gpt2 m(c, 7);
  auto stats = [&](const std::string& name) {
    auto v = m.params()[name];
    double s = 0, s2 = 0;
    for (float x : v) s += x, s2 += static_cast<double>(x) * x;
    const double n = static_cast<double>(v.size());
    return std::pair{s / n, std::sqrt(s2 / n - (s / n) * (s / n))};
  };
  EXPECT_NEAR(stats("wte.weight").second, 0.02, 0.0005);
  EXPECT_NEAR(stats("wte.weight").first, 0.0, 0.0005);
  EXPECT_NEAR(stats("wpe.weight").second, 0.01, 0.0005);
  EXPECT_NEAR(stats("h.0.attn.c_attn.weight").second, 0.02, 0.0005);
  EXPECT_NEAR(stats("h.1.mlp.c_fc.weight").second, 0.02, 0.0005);
  const double resid = 0.02 / std::sqrt(2.0 * 2);
  EXPECT_NEAR(stats("h.0.attn.c_proj.weight").second, resid, resid * 0.05);
  EXPECT_NEAR(stats("h.1.mlp.c_proj.weight").second, resid, resid * 0.05);
  for (float x : m.params()["h.0.ln_1.weight"]) EXPECT_EQ(x, 1.0f);
  for (float x : m.params()["ln_f.bias"]) EXPECT_EQ(x, 0.0f);
  for (float x : m.params()["h.1.attn.c_attn.bias"]) EXPECT_EQ(x, 0.0f);
}

TEST(Gpt2Init, DeterministicAndShardable) {
  const Config c = named_config("tiny");
  Gpt2 a(c, 42), b(c, 42), other(c, 43);
  EXPECT_TRUE(std::equal(a.params().flat().begin(), a.params().flat().end(), b.params().flat().begin()));
  EXPECT_NE(a.params()["wte.weight"][5], other.params()["wte.weight"][5]);
  // A shard initialised on its own equals the same slice of the whole parameter.
  for (const auto& info : all_params(c)) {
    const auto whole = a.params()[info.name];
    const std::int64_t first = info.numel() / 3, len = info.numel() / 2 - first;
    std::vector<float> part(static_cast<std::size_t>(len));
    init_values(info, 42, part, first);
    for (std::int64_t k = 0; k < len; ++k) ASSERT_EQ(part[static_cast<std::size_t>(k)], whole[static_cast<std::size_t>(first + k)]) << info.name;
  }
  // Different parameters get different streams.
  EXPECT_NE(a.params()["h.0.attn.c_attn.weight"][0], a.params()["h.1.attn.c_attn.weight"][0]);
  // An untied head starts equal to wte.
  auto u = c;
  u.tie_head = false;
  Gpt2 untied(u, 42);
  const auto wte = untied.params()["wte.weight"], head = untied.params()["lm_head.weight"];
  EXPECT_TRUE(std::equal(wte.begin(), wte.end(), head.begin()));
}

TEST(Gpt2Model, LossAtInitIsAboutLogVocab) {
  const Config c = named_config("tiny");
  Gpt2 m(c, 1);
  const std::size_t B = 4, T = 32;
  const auto x = random_tokens(B * T, c.vocab, 1), y = random_tokens(B * T, c.vocab, 2);
  const float loss = m.forward(x, y, B, T);
  EXPECT_NEAR(loss, std::log(static_cast<double>(c.vocab)), 0.1);
}

// gpt2-train's memory check counts the activations with bytes_for: it must be what the buffers
// hold after a step, for odd shapes and the untied head too.
TEST(Gpt2Model, ActivationBytesAreWhatTheBuffersHoldAfterAStep) {
  for (const std::string spec : {"tiny", "layers=3,heads=3,width=24,vocab=29,context=16,tie_head=false"}) {
    const Config c = parse_config(spec);
    Gpt2 model(c, 7);
    const std::size_t B = 3, T = static_cast<std::size_t>(c.context) - 1;
    const auto tokens = random_tokens(B * T, c.vocab, 1), targets = random_tokens(B * T, c.vocab, 2);
    model.forward_backward(tokens, targets, B, T);
    EXPECT_EQ(static_cast<double>(model.activations().bytes()), Activations::bytes_for(c, B, T)) << spec;
  }
}

TEST(Gpt2Model, BadBatchIsAnError) {
  Gpt2 m(named_config("tiny"), 1);
  std::vector<std::int32_t> x(8, 1), y(8, 1);
  EXPECT_THROW(m.forward(x, y, 2, 5), Error);   // 8 != 10
  EXPECT_THROW(m.forward(std::vector<std::int32_t>(130, 1), std::vector<std::int32_t>(130, 1), 2, 65), Error);  // T > context
  x[3] = 256;
  try {
    m.forward(x, y, 2, 4);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("position 3"), std::string::npos) << e.what();
  }
}

// Central differences of the float64 reference against coshard's fp32 analytic gradient.
// Bound: |analytic - fd| <= 1e-4 * max|fd| over the elements checked in each parameter (fp32
// backward through a 2-layer model; measured: 1.3e-6 tied tiny, 2.3e-6 untied).
void gradient_check(const Config& c) {
  Gpt2 m(c, 3);
  // Non-trivial layernorm weights and biases, so that their gradients are checked in general position.
  for (std::size_t i = 0; i < m.params().size(); ++i) {
    const auto& info = m.params().infos()[i];
    if (info.init != Init::normal) {
      auto v = m.params().at(i);
      for (std::size_t k = 0; k < v.size(); ++k) v[k] += static_cast<float>(0.1 * normal_sample(99 + i, k));
    }
  }
  const std::size_t B = 2, T = 7;
  const auto x = random_tokens(B * T, c.vocab, 5), y = random_tokens(B * T, c.vocab, 6);
  m.zero_grad();
  const float loss = m.forward_backward(x, y, B, T);
  ref64::Params64 p;
  for (std::size_t i = 0; i < m.params().size(); ++i) {
    auto v = m.params().at(i);
    p[m.params().infos()[i].name].assign(v.begin(), v.end());
  }
  const double ref = ref64::loss64(c, p, x, y, B, T);
  EXPECT_NEAR(loss, ref, 1e-5 * std::abs(ref));
  const double h = 1e-5;
  double worst = 0;
  std::string worst_name;
  for (std::size_t i = 0; i < m.params().size(); ++i) {
    const auto& info = m.params().infos()[i];
    auto& values = p[info.name];
    const auto grad = m.grads().at(i);
    std::vector<std::size_t> idx = {0, values.size() - 1, values.size() / 2, values.size() / 3 + 1};
    if (info.name == "wte.weight" || info.name == "lm_head.weight") {
      // Rows of tokens in the batch (embedding and head) and of tokens not in it (head only).
      idx.push_back(static_cast<std::size_t>(x[3]) * static_cast<std::size_t>(c.width) + 2);
      idx.push_back(static_cast<std::size_t>(y[4]) * static_cast<std::size_t>(c.width) + 1);
    }
    double max_ref = 0, max_err = 0;
    for (std::size_t k : idx) {
      const double keep = values[k];
      values[k] = keep + h;
      const double up = ref64::loss64(c, p, x, y, B, T);
      values[k] = keep - h;
      const double down = ref64::loss64(c, p, x, y, B, T);
      values[k] = keep;
      const double fd = (up - down) / (2 * h);
      max_ref = std::max(max_ref, std::abs(fd));
      max_err = std::max(max_err, std::abs(fd - static_cast<double>(grad[k])));
    }
    EXPECT_LE(max_err, 1e-4 * max_ref + 1e-7) << info.name << ": max |fd| " << max_ref << ", max error " << max_err;
    if (max_ref > 0 && max_err / max_ref > worst) worst = max_err / max_ref, worst_name = info.name;
  }
  std::printf("gradient check: loss %.7f vs float64 %.7f; worst relative gradient error %.2g (%s)\n", loss, ref, worst,
              worst_name.c_str());
}

TEST(Gpt2Gradient, TinyTiedMatchesFloat64FiniteDifferences) { gradient_check(named_config("tiny")); }

TEST(Gpt2Gradient, UntiedOddShapesMatchFloat64FiniteDifferences) {
  gradient_check(parse_config("layers=2,heads=3,width=24,vocab=29,context=9,tie_head=false"));
}

// The tied gradient of wte is the untied model's wte gradient plus its head gradient.
TEST(Gpt2Gradient, TiedEqualsUntiedSum) {
  Config c = named_config("tiny");
  Gpt2 tied(c, 11);
  c.tie_head = false;
  Gpt2 untied(c, 11);
  const std::size_t B = 2, T = 16;
  const auto x = random_tokens(B * T, c.vocab, 8), y = random_tokens(B * T, c.vocab, 9);
  const float lt = tied.forward_backward(x, y, B, T), lu = untied.forward_backward(x, y, B, T);
  EXPECT_EQ(lt, lu);
  const auto gt = tied.grads()["wte.weight"], gw = untied.grads()["wte.weight"], gh = untied.grads()["lm_head.weight"];
  for (std::size_t k = 0; k < gt.size(); ++k) ASSERT_NEAR(gt[k], gw[k] + gh[k], 1e-6f * (1 + std::abs(gt[k]))) << k;
  // Gradients accumulate over backwards.
  std::vector<float> once(gt.begin(), gt.end());
  tied.forward_backward(x, y, B, T);
  for (std::size_t k = 0; k < gt.size(); ++k) ASSERT_NEAR(gt[k], 2 * once[k], 1e-6f * (1 + std::abs(once[k])));
}

TEST(Gpt2Train, OverfitsOneBatch) {
  const Config c = named_config("tiny");
  Gpt2 m(c, 5);
  const std::size_t B = 2, T = 32;
  const auto x = random_tokens(B * T, c.vocab, 21), y = random_tokens(B * T, c.vocab, 22);
  ops::AdamWState state(m.params().flat().size());
  const ops::AdamWOptions opt{.lr = 3e-3, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.01};
  const auto ranges = m.params().ranges();
  float first = 0, loss = 0;
  int steps = 0;
  for (; steps < 300; ++steps) {
    m.zero_grad();
    loss = m.forward_backward(x, y, B, T);
    if (steps == 0) first = loss;
    if (loss < 0.1f) break;
    ops::adamw_step(m.params().flat(), m.grads().flat(), state, opt, ranges);
  }
  EXPECT_NEAR(first, std::log(256.0), 0.1);
  EXPECT_LT(loss, 0.1f) << "after " << steps << " AdamW steps";
  std::printf("overfit: loss %.3f -> %.4f in %d AdamW steps\n", first, loss, steps);
}

}  // namespace
