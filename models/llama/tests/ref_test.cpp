// coshard's Llama against PyTorch in float64 (Debian's python3-torch, /usr/bin/python3 running
// models/llama/ref/llama_ref.py, written from Hugging Face's LlamaForCausalLM): the same
// safetensors weights and tokens in, the loss (relative error under 1e-5) and every parameter's
// gradient (norm-wise under 1e-4) compared, at shapes chosen to catch layout bugs: odd widths,
// grouped-query attention with 1 < NKV < NH and NKV = 1, a vocabulary not a multiple of 8, a
// tied head, and Llama 3.1's rope scaling. Skips, saying why, when torch cannot be imported.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "coshard/gpt2/data.hpp"
#include "coshard/llama/model.hpp"
#include "coshard/models/safetensors.hpp"
#include "tests/support/run_command.hpp"

namespace {

using namespace coshard;
using namespace coshard::llama;
namespace fs = std::filesystem;

const std::string kPython = "/usr/bin/python3";

void compare_with_torch(const std::string& spec, std::size_t B, std::size_t T) {
  SCOPED_TRACE(spec);
  const Config c = parse_config(spec);
  const fs::path dir = fs::temp_directory_path() / ("coshard_llama_ref_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  Llama m(c, 17);
  // RMSNorm weights away from 1, so that their gradients are general.
  for (std::size_t i = 0; i < m.params().size(); ++i) {
    if (m.params().infos()[i].init != models::Init::normal) {
      auto v = m.params().at(i);
      for (std::size_t k = 0; k < v.size(); ++k) v[k] += static_cast<float>(0.1 * models::normal_sample(500 + i, k));
    }
  }
  models::save_params(dir / "w.safetensors", m.params());
  gpt2::Tokens toks(2 * B * T);
  for (std::size_t i = 0; i < toks.size(); ++i) {
    toks[i] = static_cast<gpt2::Token>(models::splitmix64(77 + i) % static_cast<std::uint64_t>(c.vocab));
  }
  gpt2::write_llmc_tokens(dir / "t.bin", toks);
  const std::vector<std::int32_t> x(toks.begin(), toks.begin() + static_cast<std::ptrdiff_t>(B * T)),
      y(toks.begin() + static_cast<std::ptrdiff_t>(B * T), toks.end());
  m.zero_grad();
  const float loss = m.forward(x, y, B, T);
  m.backward(1.0f);

  auto r = coshard::testing::run_command(kPython + " " + LLAMA_REF_SCRIPT + " --config " + c.to_string() +
                                         " --weights " + (dir / "w.safetensors").string() + " --tokens " +
                                         (dir / "t.bin").string() + " --batch " + std::to_string(B) + " --seq " +
                                         std::to_string(T) + " --out " + (dir / "torch.safetensors").string());
  ASSERT_EQ(r.rc, 0) << r.output;
  const auto f = models::SafetensorsFile::open(dir / "torch.safetensors");
  const double torch_loss = f.read(*f.find("loss"))[0];
  EXPECT_LT(std::abs(loss - torch_loss) / torch_loss, 1e-5) << "coshard " << loss << ", torch " << torch_loss;
  double worst = 0;
  std::string worst_name;
  for (std::size_t i = 0; i < m.params().size(); ++i) {
    const auto& name = m.params().infos()[i].name;
    const auto* ge = f.find("grad." + name);
    ASSERT_TRUE(ge) << name;
    const auto g = f.read(*ge);
    const auto got = m.grads().at(i);
    double ref = 0, err = 0;
    for (std::size_t k = 0; k < g.size(); ++k) {
      ref = std::max(ref, static_cast<double>(std::abs(g[k])));
      err = std::max(err, static_cast<double>(std::abs(g[k] - got[k])));
    }
    const double rel = ref > 0 ? err / ref : err;
    EXPECT_LT(rel, 1e-4) << name << ": max |torch grad| " << ref << ", max difference " << err;
    if (rel > worst) worst = rel, worst_name = name;
  }
  std::printf("%s: loss %.7f vs torch %.7f; worst gradient error %.2g (%s)\n", spec.c_str(), loss, torch_loss, worst,
              worst_name.c_str());
  fs::remove_all(dir);
}

class LlamaTorch : public ::testing::Test {
 protected:
  void SetUp() override {
    auto r = coshard::testing::run_command(kPython + " -c 'import torch, numpy'");
    if (r.rc != 0) GTEST_SKIP() << "Debian's python3-torch is not importable by " << kPython << ": " << r.output;
  }
};

TEST_F(LlamaTorch, TinyGroupedQueryLossAndGradients) { compare_with_torch("llama-tiny", 2, 32); }
TEST_F(LlamaTorch, OddShapesOneKeyValueHeadAndATiedHead) {
  compare_with_torch("layers=3,heads=6,kv_heads=1,width=30,ffn=44,head_dim=6,vocab=61,context=24,tie_head=true", 3, 17);
}
TEST_F(LlamaTorch, ThreeKeyValueHeadsOfSixAndLlama3RopeScaling) {
  compare_with_torch("layers=2,heads=6,kv_heads=3,width=26,ffn=40,head_dim=10,vocab=45,context=64,rope_theta=500000,"
                     "rope_scaling=llama3:8:1:4:16,rms_eps=1e-6",
                     2, 40);
}

}  // namespace
