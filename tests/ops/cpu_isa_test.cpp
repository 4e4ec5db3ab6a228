// The element-wise kernels are built once per instruction set (ops/src/isa): every table this CPU
// can run must give the bits of the baseline build, including for NaN, infinities, signed zeros,
// huge and tiny inputs, and lengths around every vector width. The ops suites test the table the
// process runs against float64; this suite extends them to the others.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "coshard/ops/cpu.hpp"
#include "coshard/runtime/error.hpp"
#include "isa/cpu_kernels.hpp"
#include "ops/gradcheck.hpp"

using namespace coshard;
using namespace coshard::testing;
using ops::detail::CpuKernels;

namespace {

constexpr std::size_t kLengths[] = {1, 3, 7, 15, 16, 17, 31, 33, 63, 64, 65, 100, 384, 1031};

// Random values in [-30, 30] with special values sprinkled in at fixed places.
std::vector<float> inputs(std::size_t n, std::uint32_t seed) {
  auto v = random_floats(n, seed, -30.0f, 30.0f);
  const float special[] = {0.0f, -0.0f, 1e-30f, -1e-30f, 100.0f, -100.0f, 88.5f, -87.5f, 1e30f, -1e30f};
  for (std::size_t i = 0; i < n; i += 11) v[i] = special[(i / 11) % std::size(special)];
  return v;
}

void expect_same_bits(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (std::memcmp(&got[i], &want[i], sizeof(float)) != 0) {
      ADD_FAILURE() << what << ": element " << i << " is " << got[i] << ", the baseline gives " << want[i];
      return;
    }
  }
}

// Runs every kernel of table k on inputs of length n and returns all outputs, concatenated.
std::vector<float> outputs(const CpuKernels& k, std::size_t n) {
  std::vector<float> all;
  auto keep = [&](const std::vector<float>& v) { all.insert(all.end(), v.begin(), v.end()); };
  const auto x = inputs(n, 1), g = random_floats(n, 2);
  std::vector<float> y(n), dx(n);
  k.gelu_forward(x.data(), y.data(), n);
  k.gelu_backward(g.data(), x.data(), dx.data(), n);
  keep(y), keep(dx);

  const std::size_t rows = 3;
  const auto lx = random_floats(rows * n, 3, -5.0f, 5.0f), lg = random_floats(rows * n, 4);
  const auto w = random_floats(n, 5), b = random_floats(n, 6);
  std::vector<float> ly(rows * n), mean(rows), rstd(rows), ldx(rows * n), dw(n, 0.0f), db(n, 0.0f);
  k.layernorm_forward(lx.data(), w.data(), b.data(), ly.data(), mean.data(), rstd.data(), rows, n, 1e-5f);
  k.layernorm_backward(lg.data(), lx.data(), w.data(), mean.data(), rstd.data(), ldx.data(), rows, n);
  k.layernorm_param_grads(lg.data(), lx.data(), mean.data(), rstd.data(), dw.data(), db.data(), rows, n, n);
  keep(ly), keep(mean), keep(rstd), keep(ldx), keep(dw), keep(db);

  std::vector<float> ry(rows * n), rrstd(rows), rdx(rows * n), rdw(n, 0.0f);
  k.rmsnorm_forward(lx.data(), w.data(), ry.data(), rrstd.data(), rows, n, 1e-5f);
  k.rmsnorm_backward(lg.data(), lx.data(), w.data(), rrstd.data(), rdx.data(), rows, n);
  k.rmsnorm_weight_grad(lg.data(), lx.data(), rrstd.data(), rdw.data(), rows, n, n);
  keep(ry), keep(rrstd), keep(rdx), keep(rdw);

  std::vector<float> sy(n), sdg(n), sdu(n);
  k.swiglu_forward(x.data(), g.data(), sy.data(), n);
  k.swiglu_backward(g.data(), x.data(), g.data(), sdg.data(), sdu.data(), n);
  keep(sy), keep(sdg), keep(sdu);

  const std::size_t rh = 2 * ((n + 1) / 2);  // an even head, two of them
  auto rot = random_floats(2 * rh, 15, -3.0f, 3.0f);
  const auto rc = random_floats(rh / 2, 16), rs = random_floats(rh / 2, 17);
  k.rope_rotate(rot.data(), rc.data(), rs.data(), 2, rh, 1.0f);
  keep(rot);
  k.rope_rotate(rot.data(), rc.data(), rs.data(), 2, rh, -1.0f);
  keep(rot);

  const std::vector<std::int32_t> targets = {0, static_cast<std::int32_t>(n - 1)};
  const auto z = random_floats(2 * n, 7, -20.0f, 20.0f);
  std::vector<float> lse(2), dz(2 * n);
  const double loss = k.cross_entropy_forward(z.data(), targets.data(), lse.data(), 2, n);
  k.cross_entropy_backward(z.data(), targets.data(), lse.data(), dz.data(), 2, n, 0.5f);
  keep(lse), keep(dz), keep({static_cast<float>(loss)});

  const std::size_t bc = std::min<std::size_t>(n, 64), hs = std::min<std::size_t>(n, 128);
  auto row = inputs(bc, 8), acc = random_floats(hs, 9);
  float m = 2.0f, l = 3.0f;
  k.attention_online_softmax(row.data(), (bc + 1) / 2, bc, &m, &l, acc.data(), hs);
  auto probs = inputs(bc, 10), dp = random_floats(bc, 11);
  k.attention_probabilities(probs.data(), (bc + 1) / 2, bc, 4.0f);
  k.attention_score_grad(probs.data(), dp.data(), bc, 0.25f, 0.125f);
  keep(row), keep(acc), keep({m, l}), keep(probs), keep(dp);

  auto p = random_floats(n, 12), mom = random_floats(n, 13, -0.1f, 0.1f), var = random_floats(n, 14, 0.0f, 0.01f);
  const ops::detail::AdamWScalars s{0.999f, 0.1f, 0.95f, 0.05f, 1e-3f, 0.5f, 1e-8f};
  k.adamw(p.data(), g.data(), mom.data(), var.data(), n, s);
  keep(p), keep(mom), keep(var);
  return all;
}

TEST(OpsCpuIsa, EveryInstructionSetGivesTheBaselineBits) {
  const auto list = ops::detail::runnable_cpu_kernels();
  ASSERT_GE(list.size, 1u);
  ASSERT_STREQ(list.tables[0]->isa, "baseline");
  if (list.size == 1) GTEST_SKIP() << "this CPU runs only the baseline kernels: nothing to compare";
  for (std::size_t t = 1; t < list.size; ++t) {
    for (std::size_t n : kLengths) {
      expect_same_bits(outputs(*list.tables[t], n), outputs(*list.tables[0], n),
                       std::string(list.tables[t]->isa) + ", length " + std::to_string(n));
    }
  }
}

TEST(OpsCpuIsa, GeluOfNanAndInfinitiesIsTorchs) {
  const auto list = ops::detail::runnable_cpu_kernels();
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  for (std::size_t t = 0; t < list.size; ++t) {
    SCOPED_TRACE(list.tables[t]->isa);
    std::vector<float> x(20, 1.0f), y(20);
    x[3] = nan, x[4] = inf, x[5] = -inf;
    list.tables[t]->gelu_forward(x.data(), y.data(), x.size());
    EXPECT_TRUE(std::isnan(y[3]));
    EXPECT_EQ(y[4], inf);
    EXPECT_TRUE(std::isnan(y[5]));  // -inf * 0, as torch's gelu(-inf, approximate="tanh") gives
  }
}

// The process runs the widest table unless COSHARD_CPU_ISA asks for another; a name it cannot run
// is an error that lists the ones it can. ctest runs this three times: without the variable, with
// baseline, and with a bad name (tests/ops/tests.cmake).
TEST(OpsCpuIsa, TheProcessRunsTheWidestOrTheOneAsked) {
  const auto list = ops::detail::runnable_cpu_kernels();
  const char* want = std::getenv("COSHARD_CPU_ISA");
  if (want == nullptr) {
    EXPECT_STREQ(ops::cpu_isa(), list.tables[list.size - 1]->isa);
    return;
  }
  bool runnable = false;
  for (std::size_t t = 0; t < list.size; ++t) runnable |= std::string(want) == list.tables[t]->isa;
  if (runnable) {
    EXPECT_STREQ(ops::cpu_isa(), want);
    return;
  }
  expect_invalid([] { ops::cpu_isa(); }, {"COSHARD_CPU_ISA", std::string("'") + want + "'", "baseline"});
}

}  // namespace
