// A model's step time on one rank (forward + backward + AdamW of the unsharded GPT-2 or Llama,
// fp32 CPU kernels) beside the sum of its GEMM times measured in the same run: the same GEMM
// shapes (linear forward, and backward's dx and dW, of every layer and the head) issued as plain
// OpenBLAS calls split over the model's threads as ops splits them (ops/src/blas_internal.hpp).
// The ratio says how much of a step is not GEMM (attention, the norms, GELU or SwiGLU, RoPE,
// cross-entropy, AdamW, copies). A second bound adds attention's own matrix products, issued the same way per
// sequence and head (forward S = Q K^T and O = P V; backward dV = P^T dO, dP = dO V^T,
// dQ = dS K and dK = dS^T Q) and counted at half their time: a causal mask leaves half of each
// T x T product to compute.
//   bench_model [--config 10M | llama-150M | any gpt2-train --model] [--batch 4] [--seq 256] [--steps 5]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "coshard/gpt2/model.hpp"
#include "coshard/llama/model.hpp"
#include "coshard/models/params.hpp"
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
struct Linears {
  int rows;
  std::vector<Gemm> g;
  void add(std::int64_t in, std::int64_t out) {
    const int i = static_cast<int>(in), o = static_cast<int>(out);
    g.push_back({rows, o, i, false, false});  // y = x W
    g.push_back({rows, i, o, false, true});   // dx = dy W^T
    g.push_back({i, o, rows, true, false});   // dW = x^T dy
  }
};

std::vector<Gemm> step_gemms(const gpt2::Config& c, int rows) {
  Linears l{rows, {}};
  const auto C = c.width;
  for (int layer = 0; layer < c.layers; ++layer) {
    l.add(C, 3 * C);
    l.add(C, C);
    l.add(C, 4 * C);
    l.add(4 * C, C);
  }
  l.add(C, c.vocab);
  return l.g;
}

std::vector<Gemm> step_gemms(const llama::Config& c, int rows) {
  Linears l{rows, {}};
  const auto C = c.width;
  for (int layer = 0; layer < c.layers; ++layer) {
    l.add(C, c.q_width());   // q_proj
    l.add(C, c.kv_width());  // k_proj
    l.add(C, c.kv_width());  // v_proj
    l.add(c.q_width(), C);   // o_proj
    l.add(C, c.ffn);         // gate_proj
    l.add(C, c.ffn);         // up_proj
    l.add(c.ffn, C);         // down_proj
  }
  l.add(C, c.vocab);
  return l.g;
}

int head_width(const gpt2::Config& c) { return static_cast<int>(c.width / c.heads); }
int head_width(const llama::Config& c) { return static_cast<int>(c.head_dim); }

// Attention's products of one step at full T x T size (see the top of the file).
// Grouped-query attention computes every query head's products: keys and values are shared, not
// the work.
template <typename ModelConfig>
std::vector<Gemm> attention_gemms(const ModelConfig& c, int batch, int seq) {
  const int T = seq, hs = head_width(c);
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

struct StepShape {
  int batch, seq, steps;
};

template <typename Model, typename ModelConfig>
int run(const std::string& family, const std::string& spec, const ModelConfig& c, StepShape sh) {
  const int batch = sh.batch, steps = sh.steps;
  const int seq = static_cast<int>(std::min<std::int64_t>(sh.seq, c.context));
  const auto B = static_cast<std::size_t>(batch), T = static_cast<std::size_t>(seq);
  Model m(c, 1);
  std::vector<std::int32_t> x(B * T), y(B * T);
  for (std::size_t i = 0; i < x.size(); ++i) {
    x[i] = static_cast<std::int32_t>(models::splitmix64(i) % static_cast<std::uint64_t>(c.vocab));
    y[i] = static_cast<std::int32_t>(models::splitmix64(i + 7) % static_cast<std::uint64_t>(c.vocab));
  }
  ops::AdamWState state(m.params().flat().size());
  const ops::AdamWOptions opt{.lr = 1e-4, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
  const auto ranges = m.params().ranges();
  const auto gemms = step_gemms(c, batch * seq);
  const auto attention = attention_gemms(c, batch, seq);
  double flops = 0;
  for (const auto& g : gemms) flops += 2.0 * g.m * g.n * g.k;

  std::printf("%s %s (%s): %.2fM parameters, batch %d x %d tokens\n", family.c_str(), spec.c_str(),
              c.to_string().c_str(), static_cast<double>(c.num_params()) / 1e6, batch, seq);
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

int main(int argc, char** argv) {
  std::string spec = "10M";
  StepShape sh{4, 256, 5};
  const char* usage = "usage: bench_model [--config 10M | llama-150M | a gpt2-train --model] [--batch 4] [--seq 256] [--steps 5]\n";
  for (int i = 1; i < argc; i += 2) {
    const std::string k = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "bench_model: %s needs a value\n%s", k.c_str(), usage);
      return 2;
    }
    if (k == "--config") spec = argv[i + 1];
    else if (k == "--batch") sh.batch = bench::flag_number("bench_model", k, argv[i + 1], 1, 1 << 16);
    else if (k == "--seq") sh.seq = bench::flag_number("bench_model", k, argv[i + 1], 1, 1 << 16);
    else if (k == "--steps") sh.steps = bench::flag_number("bench_model", k, argv[i + 1], 1, 1000000);
    else {
      std::fprintf(stderr, "bench_model: unknown flag %s\n%s", k.c_str(), usage);
      return 2;
    }
  }
  try {
    if (spec.starts_with("llama")) return run<llama::Llama>("Llama", spec, llama::parse_config(spec), sh);
    return run<gpt2::Gpt2>("GPT-2", spec, gpt2::parse_config(spec), sh);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_model: %s\n", e.what());
    return 2;
  }
}
