// coshard's GPT-2 against PyTorch (Debian's python3-torch, run as /usr/bin/python3 on
// models/gpt2/ref/gpt2_ref.py): the same safetensors weights and tokens in, loss and every
// parameter's gradient compared (norm-wise relative error under 1e-4 in fp32). The weights make
// the trip coshard -> PyTorch (its own safetensors parser) and the gradients PyTorch -> coshard.
// Skips, saying why, when torch cannot be imported.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>

#include "coshard/gpt2/data.hpp"
#include "coshard/gpt2/model.hpp"
#include "coshard/gpt2/safetensors.hpp"
#include "coshard/ops/cast.hpp"
#include "tests/support/run_command.hpp"

namespace {

using namespace coshard;
using namespace coshard::gpt2;
namespace fs = std::filesystem;

const std::string kPython = "/usr/bin/python3";

bool have_torch(std::string& why) {
  auto r = coshard::testing::run_command(kPython + " -c 'import torch, numpy'");
  why = r.output;
  return r.rc == 0;
}

struct Compared {
  double loss_err = 0, worst_grad = 0;
  std::string worst_name;
};

Compared compare_with_torch(const std::string& spec, DType weights_dtype, std::size_t B, std::size_t T) {
  const Config c = parse_config(spec);
  const fs::path dir = fs::temp_directory_path() / ("coshard_gpt2_ref_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  Gpt2 m(c, 17);
  // Layernorm weights and biases away from 1 and 0, so that their gradients are general.
  for (std::size_t i = 0; i < m.params().size(); ++i) {
    if (m.params().infos()[i].init != Init::normal) {
      auto v = m.params().at(i);
      for (std::size_t k = 0; k < v.size(); ++k) v[k] += static_cast<float>(0.1 * normal_sample(500 + i, k));
    }
  }
  save_model(dir / "w.safetensors", m.params(), weights_dtype);
  load_model(dir / "w.safetensors", m.params(), c);  // the values PyTorch sees (rounded when bf16/f16)
  Tokens toks(2 * B * T);
  for (std::size_t i = 0; i < toks.size(); ++i) toks[i] = static_cast<Token>(splitmix64(77 + i) % static_cast<std::uint64_t>(c.vocab));
  write_llmc_tokens(dir / "t.bin", toks);
  std::vector<std::int32_t> x(toks.begin(), toks.begin() + static_cast<std::ptrdiff_t>(B * T)),
      y(toks.begin() + static_cast<std::ptrdiff_t>(B * T), toks.end());
  m.zero_grad();
  const float loss = m.forward_backward(x, y, B, T);

  auto r = coshard::testing::run_command(kPython + " " + GPT2_REF_SCRIPT + " --config " + c.to_string() + " --weights " +
                                         (dir / "w.safetensors").string() + " --tokens " + (dir / "t.bin").string() +
                                         " --batch " + std::to_string(B) + " --seq " + std::to_string(T) + " --out " +
                                         (dir / "torch.safetensors").string());
  EXPECT_EQ(r.rc, 0) << r.output;
  std::printf("%s", r.output.c_str());
  Compared out;
  if (r.rc != 0) return out;
  const auto f = SafetensorsFile::open(dir / "torch.safetensors");
  const float torch_loss = f.read(*f.find("loss"))[0];
  out.loss_err = std::abs(loss - torch_loss) / std::abs(torch_loss);
  for (std::size_t i = 0; i < m.params().size(); ++i) {
    const auto& name = m.params().infos()[i].name;
    // The values PyTorch read are ours, bit for bit.
    const auto* pe = f.find("param." + name);
    EXPECT_TRUE(pe) << name;
    if (!pe) continue;
    const auto seen = f.read(*pe);
    const auto mine = m.params().at(i);
    EXPECT_TRUE(std::equal(mine.begin(), mine.end(), seen.begin())) << name << " changed on the way to PyTorch";
    const auto g = f.read(*f.find("grad." + name));
    const auto got = m.grads().at(i);
    double ref = 0, err = 0;
    for (std::size_t k = 0; k < g.size(); ++k) {
      ref = std::max(ref, static_cast<double>(std::abs(g[k])));
      err = std::max(err, static_cast<double>(std::abs(g[k] - got[k])));
    }
    const double rel = ref > 0 ? err / ref : err;
    EXPECT_LT(rel, 1e-4) << name << ": max |torch grad| " << ref << ", max difference " << err;
    if (rel > out.worst_grad) out.worst_grad = rel, out.worst_name = name;
  }
  EXPECT_LT(out.loss_err, 1e-4) << "coshard " << loss << ", torch " << torch_loss;
  std::printf("%s (%s weights): loss %.7f vs torch %.7f (relative %.2g); worst gradient error %.2g (%s)\n", spec.c_str(),
              std::string(to_string(weights_dtype)).c_str(), loss, torch_loss, out.loss_err, out.worst_grad,
              out.worst_name.c_str());
  fs::remove_all(dir);
  return out;
}

class Gpt2Torch : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!have_torch(why)) GTEST_SKIP() << "Debian's python3-torch is not importable by " << kPython << ": " << why;
  }
};

TEST_F(Gpt2Torch, TinyTiedLossAndGradients) { compare_with_torch("tiny", DType::f32, 2, 32); }
TEST_F(Gpt2Torch, UntiedOddShapes) {
  compare_with_torch("layers=3,heads=3,width=36,vocab=61,context=20,tie_head=false", DType::f32, 3, 17);
}
TEST_F(Gpt2Torch, Bf16AndF16WeightFiles) {
  compare_with_torch("layers=1,heads=2,width=16,vocab=40,context=8", DType::bf16, 2, 8);
  compare_with_torch("layers=1,heads=2,width=16,vocab=40,context=8", DType::f16, 2, 8);
}

}  // namespace
