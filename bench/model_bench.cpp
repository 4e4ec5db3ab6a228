// GPT-2 step time on one rank (forward + backward + AdamW of the unsharded model, fp32 CPU
// kernels) beside the sum of its GEMM times measured in the same run: the same GEMM shapes
// (linear forward, and backward's dx and dW, of every layer and the tied head) issued as plain
// OpenBLAS calls split over the model's threads as ops splits them (ops/src/blas_internal.hpp).
// The ratio says how much of a step is not GEMM (attention, layernorm, GELU, cross-entropy,
// AdamW, copies). A second bound adds attention's own matrix products, issued the same way per
// sequence and head (forward S = Q K^T and O = P V; backward dV = P^T dO, dP = dO V^T,
// dQ = dS K and dK = dS^T Q) and counted at half their time: a causal mask leaves half of each
// T x T product to compute.
//   bench_gpt2 [--config 10M] [--batch 4] [--seq 256] [--steps 5]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "coshard/gpt2/model.hpp"
#include "coshard/ops/blas.hpp"
#include "coshard/ops/cpu.hpp"
#include "coshard/ops/optim.hpp"
#include "blas_internal.hpp"
#include "flags.hpp"
#include "summary.hpp"

using namespace coshard;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

double median(std::vector<double> v) { return bench::summarise(std::move(v)).median; }

struct Gemm {
  int m, n, k;
  bool ta, tb;
};

// The GEMMs of one step: per linear [rows, in] -> [rows, out], forward y = x W, backward
// dx = dy W^T and dW = x^T dy; the head (out_in layout) likewise.
std::vector<Gemm> step_gemms(const gpt2::Config& c, int rows) {
  const int C = static_cast<int>(c.width), V = static_cast<int>(c.vocab);
  std::vector<Gemm> g;
  auto linear = [&](int in, int out) {
    g.push_back({rows, out, in, false, false});  // y = x W
    g.push_back({rows, in, out, false, true});   // dx = dy W^T
    g.push_back({in, out, rows, true, false});   // dW = x^T dy
  };
  for (int l = 0; l < c.layers; ++l) {
    linear(C, 3 * C);
    linear(C, C);
    linear(C, 4 * C);
    linear(4 * C, C);
  }
  linear(C, V);
  return g;
}

// Attention's products of one step at full T x T size (see the top of the file).
std::vector<Gemm> attention_gemms(const gpt2::Config& c, int batch, int seq) {
  const int T = seq, hs = static_cast<int>(c.width / c.heads);
  const std::vector<Gemm> one = {
      {T, T, hs, false, true},   // S = Q K^T
      {T, hs, T, false, false},  // O = P V
      {T, hs, T, true, false},   // dV = P^T dO
      {T, T, hs, false, true},   // dP = dO V^T
      {T, hs, T, false, false},  // dQ = dS K
      {T, hs, T, true, false},   // dK = dS^T Q
  };
  std::vector<Gemm> g;
  for (std::int64_t i = 0; i < c.layers * c.heads * batch; ++i) g.insert(g.end(), one.begin(), one.end());
  return g;
}

double time_gemms(const std::vector<Gemm>& gemms) {
  std::size_t biggest = 0;
  for (const auto& g : gemms) {
    biggest = std::max({biggest, static_cast<std::size_t>(g.m) * g.k, static_cast<std::size_t>(g.k) * g.n,
                        static_cast<std::size_t>(g.m) * g.n});
  }
  std::vector<float> a(biggest, 0.01f), b(biggest, 0.02f), out(biggest, 0.0f);
  const auto t = Clock::now();
  for (const auto& g : gemms) {
    const int lda = g.ta ? g.m : g.k, ldb = g.tb ? g.k : g.n;
    ops::detail::sgemm(g.ta, g.tb, g.m, g.n, g.k, 1.0f, a.data(), lda, b.data(), ldb, 1.0f, out.data(), g.n);
  }
  return seconds_since(t);
}

}  // namespace

int main(int argc, char** argv) {
  std::string spec = "10M";
  int batch = 4, seq = 256, steps = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    if (k == "--config") spec = argv[i + 1];
    else if (k == "--batch") batch = bench::flag_number("bench_gpt2", k, argv[i + 1], 1, 1 << 16);
    else if (k == "--seq") seq = bench::flag_number("bench_gpt2", k, argv[i + 1], 1, 1 << 16);
    else if (k == "--steps") steps = bench::flag_number("bench_gpt2", k, argv[i + 1], 1, 1000000);
    else {
      std::fprintf(stderr, "usage: bench_gpt2 [--config 10M] [--batch 4] [--seq 256] [--steps 5]\n");
      return 2;
    }
  }
  if (batch < 1 || seq < 1 || steps < 1) {
    std::fprintf(stderr, "bench_gpt2: --batch, --seq and --steps must be at least 1\n");
    return 2;
  }
  const gpt2::Config c = gpt2::parse_config(spec);
  if (seq > c.context) seq = static_cast<int>(c.context);
  const auto B = static_cast<std::size_t>(batch), T = static_cast<std::size_t>(seq);
  gpt2::Gpt2 m(c, 1);
  std::vector<std::int32_t> x(B * T), y(B * T);
  for (std::size_t i = 0; i < x.size(); ++i) {
    x[i] = static_cast<std::int32_t>(gpt2::splitmix64(i) % static_cast<std::uint64_t>(c.vocab));
    y[i] = static_cast<std::int32_t>(gpt2::splitmix64(i + 7) % static_cast<std::uint64_t>(c.vocab));
  }
  ops::AdamWState state(m.params().flat().size());
  const ops::AdamWOptions opt{.lr = 1e-4, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
  const auto ranges = m.params().ranges();
  const auto gemms = step_gemms(c, batch * seq);
  const auto attention = attention_gemms(c, batch, seq);
  double flops = 0;
  for (const auto& g : gemms) flops += 2.0 * g.m * g.n * g.k;

  std::printf("GPT-2 %s (%s): %.2fM parameters, batch %d x %d tokens\n", spec.c_str(), c.to_string().c_str(),
              static_cast<double>(c.num_params()) / 1e6, batch, seq);
  std::vector<double> fwd, bwd, adam, step, gemm, attn;
  for (int s = 0; s <= steps; ++s) {  // step 0 warms up
    auto t = Clock::now();
    m.zero_grad();
    const float loss = m.forward(x, y, B, T);
    const double tf = seconds_since(t);
    t = Clock::now();
    m.backward();
    const double tb = seconds_since(t);
    t = Clock::now();
    ops::adamw_step(m.params().flat(), m.grads().flat(), state, opt, ranges);
    const double ta = seconds_since(t);
    const double tg = time_gemms(gemms);  // interleaved with the steps: same machine state
    const double tt = 0.5 * time_gemms(attention);
    if (s == 0) {
      std::printf("  (warm-up step done; %d thread(s), %s element-wise kernels)\n", ops::blas_threads(),
                  ops::cpu_isa());
      continue;
    }
    fwd.push_back(tf), bwd.push_back(tb), adam.push_back(ta), step.push_back(tf + tb + ta), gemm.push_back(tg), attn.push_back(tt);
    std::printf("  step %d: loss %.4f, %.1f ms (forward %.1f, backward %.1f, AdamW %.1f); GEMMs alone %.1f ms\n", s, loss,
                1e3 * (tf + tb + ta), 1e3 * tf, 1e3 * tb, 1e3 * ta, 1e3 * tg);
  }
  const double st = median(step), gt = median(gemm), at = median(attn);
  std::printf("median step %.1f ms (forward %.1f, backward %.1f, AdamW %.1f), %.0f tokens/s, spread %.2f\n", 1e3 * st,
              1e3 * median(fwd), 1e3 * median(bwd), 1e3 * median(adam), static_cast<double>(batch * seq) / st,
              bench::summarise(step).spread);
  std::printf("sum of its %zu GEMMs %.1f ms (%.1f GFLOP/s); step / GEMMs = %.2f\n", gemms.size(), 1e3 * gt,
              flops / gt / 1e9, st / gt);
  std::printf("with attention's %zu products (half of %.1f ms, causal) %.1f ms; step / all GEMMs = %.2f\n",
              attention.size(), 2e3 * at, 1e3 * (gt + at), st / (gt + at));
  return 0;
}
