// Forward + backward time of each non-GEMM op of GPT-2 at the shapes of the `10M` and `124M`
// configs (B*T = 1024 rows), one line per op and shape, in the format that
// bench/torch/kernels_baseline.py prints for PyTorch eager, so scripts/bench can put the two side
// by side:  op=<name> shape=<dims> ms=<median> spread=<(max - min) / median>
// Threads: one unless OPENBLAS_NUM_THREADS says otherwise (coshard's default, blas.hpp); attention
// splits its heads and the element-wise ops their rows or elements over them, except layernorm's
// backward.
//   bench_kernels [--only OP] [--min-seconds S]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "coshard/ops/attention.hpp"
#include "coshard/ops/cross_entropy.hpp"
#include "coshard/ops/gelu.hpp"
#include "coshard/ops/layernorm.hpp"
#include "coshard/ops/optim.hpp"
#include "flags.hpp"
#include "summary.hpp"

using namespace coshard;
using Clock = std::chrono::steady_clock;

namespace {

std::vector<float> filled(std::size_t n, float scale) {
  std::vector<float> v(n);
  std::uint32_t s = 12345;
  for (auto& x : v) {
    s = s * 1664525u + 1013904223u;
    x = scale * (static_cast<float>(s >> 8) / 16777216.0f - 0.5f);
  }
  return v;
}

struct Timer {
  double min_seconds = 0.5;
  std::string only;

  // Runs fn once to warm up, then at least 5 times and for at least min_seconds; prints the median.
  void run(const std::string& op, const std::string& shape, const std::function<void()>& fn) const {
    if (!only.empty() && only != op) return;
    fn();
    std::vector<double> t;
    const auto start = Clock::now();
    while (t.size() < 5 || std::chrono::duration<double>(Clock::now() - start).count() < min_seconds) {
      const auto a = Clock::now();
      fn();
      t.push_back(std::chrono::duration<double>(Clock::now() - a).count() * 1e3);
    }
    const auto s = bench::summarise(std::move(t));
    std::printf("op=%s shape=%s ms=%.3f spread=%.3f\n", op.c_str(), shape.c_str(), s.median, s.spread);
    std::fflush(stdout);
  }
};

void attention(const Timer& tm, std::size_t B, std::size_t T, std::size_t C, std::size_t NH) {
  auto qkv = filled(B * T * 3 * C, 2.0f), dout = filled(B * T * C, 1.0f);
  std::vector<float> out(B * T * C), lse(B * NH * T), dqkv(qkv.size());
  tm.run("attention", "B" + std::to_string(B) + "xT" + std::to_string(T) + "xC" + std::to_string(C) + "xNH" +
                          std::to_string(NH),
         [&] {
           ops::attention_forward(qkv, out, lse, B, T, C, NH);
           ops::attention_backward(dout, qkv, out, lse, dqkv, B, T, C, NH);
         });
}

void gelu(const Timer& tm, std::size_t rows, std::size_t n) {
  auto x = filled(rows * n, 6.0f), dy = filled(rows * n, 1.0f);
  std::vector<float> y(x.size()), dx(x.size());
  tm.run("gelu", std::to_string(rows) + "x" + std::to_string(n), [&] {
    ops::gelu_forward(x, y);
    ops::gelu_backward(dy, x, dx);
  });
}

void layernorm(const Timer& tm, std::size_t rows, std::size_t C) {
  auto x = filled(rows * C, 4.0f), dy = filled(rows * C, 1.0f), w = filled(C, 1.0f), b = filled(C, 1.0f);
  std::vector<float> y(x.size()), mean(rows), rstd(rows), dx(x.size()), dw(C), db(C);
  tm.run("layernorm", std::to_string(rows) + "x" + std::to_string(C), [&] {
    ops::layernorm_forward(x, w, b, y, mean, rstd, rows, C);
    ops::layernorm_backward(dy, x, w, mean, rstd, dx, dw, db, rows, C);
  });
}

void cross_entropy(const Timer& tm, std::size_t N, std::size_t V) {
  auto logits = filled(N * V, 8.0f);
  std::vector<std::int32_t> targets(N);
  for (std::size_t i = 0; i < N; ++i) targets[i] = static_cast<std::int32_t>((i * 7919) % V);
  std::vector<float> lse(N), dlogits(logits.size());
  tm.run("cross_entropy", std::to_string(N) + "x" + std::to_string(V), [&] {
    ops::cross_entropy_forward(logits, targets, lse, N, V);
    ops::cross_entropy_backward(logits, targets, lse, dlogits, N, V, 1.0f);
  });
}

void adamw(const Timer& tm, std::size_t n) {
  auto p = filled(n, 1.0f), g = filled(n, 0.01f);
  ops::AdamWState state(n);
  const ops::AdamWOptions opt{.lr = 1e-4, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
  tm.run("adamw", std::to_string(n), [&] { ops::adamw_step(p, g, state, opt, {}); });
}

}  // namespace

int main(int argc, char** argv) {
  Timer tm;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (k == "--only" && i + 1 < argc) {
      tm.only = argv[++i];
    } else if (k == "--min-seconds" && i + 1 < argc) {
      tm.min_seconds = bench::flag_number("bench_kernels", k, argv[++i], 0.001, 3600.0);
    } else {
      std::fprintf(stderr, "usage: bench_kernels [--only attention|gelu|layernorm|cross_entropy|adamw] [--min-seconds S]\n");
      return 2;
    }
  }
  // 10M (6 layers, width 384, 6 heads, vocab 256), 4 x 256 tokens; 124M (width 768, 12 heads,
  // vocab 50257) at context 1024; and one long context, where an unfused [T, T] matrix is 768 MiB.
  attention(tm, 4, 256, 384, 6);
  attention(tm, 1, 1024, 768, 12);
  attention(tm, 1, 4096, 768, 12);
  gelu(tm, 1024, 1536);
  gelu(tm, 1024, 3072);
  layernorm(tm, 1024, 384);
  layernorm(tm, 1024, 768);
  cross_entropy(tm, 1024, 256);
  cross_entropy(tm, 1024, 50257);
  adamw(tm, 10'838'016);
  return 0;
}
