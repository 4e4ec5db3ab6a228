// The smallest training binary on coshard: a two-unit MLP, y = tanh(x W1 + b1) W2 + b2, fitted to
// sin(x0 + x1 + x2) with FULL_SHARD on the ranks coshard-run starts. Each rank trains on data of
// its own; the engine averages the gradients. Exits 0 when the loss fell tenfold.
//   coshard-run --nproc-per-node 2 -- ./minimal
#include <cmath>
#include <cstdio>
#include <vector>

#include <coshard/fsdp/engine.hpp>
#include <coshard/runtime/readback.hpp>
#include <coshard/transport/process_group.hpp>

using namespace coshard;
constexpr std::size_t N = 64, D = 8, H = 32;  // rows per rank, inputs, hidden width

struct Activations {  // one rank's batch and what the kernels compute from it
  std::vector<float> x, target, h, y, dy, dh;
};

// y[N, out] = x[N, in] W[in, out] + b, row-major.
std::vector<float> affine(const std::vector<float>& x, std::span<const float> w, std::span<const float> b) {
  const std::size_t out = b.size(), in = w.size() / out;
  std::vector<float> y(N * out);
  for (std::size_t n = 0; n < N; ++n)
    for (std::size_t o = 0; o < out; ++o) {
      y[n * out + o] = b[o];
      for (std::size_t i = 0; i < in; ++i) y[n * out + o] += x[n * in + i] * w[i * out + o];
    }
  return y;
}

// Adds the gradients of W and b, given the input x and dy = dLoss/dy.
void accumulate(const std::vector<float>& x, const std::vector<float>& dy, std::span<float> dw, std::span<float> db) {
  const std::size_t out = db.size(), in = dw.size() / out;
  for (std::size_t n = 0; n < N; ++n)
    for (std::size_t o = 0; o < out; ++o) {
      db[o] += dy[n * out + o];
      for (std::size_t i = 0; i < in; ++i) dw[i * out + o] += x[n * in + i] * dy[n * out + o];
    }
}

// Initial values depend only on the element index: each rank fills just its own shard.
fsdp::InitFn wave(float scale) {
  return [=](std::span<float> out, std::int64_t first) {
    for (std::size_t k = 0; k < out.size(); ++k) out[k] = scale * std::sin(1.7f * float(first + std::int64_t(k)));
  };
}

class Hidden final : public fsdp::Unit {
 public:
  explicit Hidden(Activations& a) : a_(&a) {}
  std::string name() const override { return "hidden"; }
  std::vector<fsdp::ParamSpec> params() const override { return {{"w1", {D, H}, wave(0.5f)}, {"b1", {H}}}; }
  Task<void> forward(fsdp::Scope& s) override {  // enqueues the kernel on the compute stream
    s.enqueue([a = a_, w = s.param(0), b = s.param(1)] {
      a->h = affine(a->x, w, b);
      for (float& v : a->h) v = std::tanh(v);
    });
    co_return;
  }
  Task<void> backward(fsdp::Scope& s) override {
    s.enqueue([a = a_, dw = s.grad(0), db = s.grad(1)] {
      std::vector<float> dz(N * H);
      for (std::size_t k = 0; k < N * H; ++k) dz[k] = a->dh[k] * (1 - a->h[k] * a->h[k]);
      accumulate(a->x, dz, dw, db);
    });
    co_return;
  }
  Activations* a_;
};

class Output final : public fsdp::Unit {
 public:
  Output(Activations& a, Readback<float>& loss) : a_(&a), loss_(&loss) {}
  std::string name() const override { return "output"; }
  std::vector<fsdp::ParamSpec> params() const override { return {{"w2", {H, 1}, wave(0.3f)}, {"b2", {1}}}; }
  Task<void> forward(fsdp::Scope& s) override {
    s.enqueue([a = a_, w = s.param(0), b = s.param(1)] { a->y = affine(a->h, w, b); });
    // The loop reads the loss with co_await loss.get(), which waits for this to have run.
    loss_->publish(s.compute(), [a = a_] {
      float sum = 0;
      for (std::size_t n = 0; n < N; ++n) sum += (a->y[n] - a->target[n]) * (a->y[n] - a->target[n]);
      return sum / N;
    });
    co_return;
  }
  Task<void> backward(fsdp::Scope& s) override {
    s.enqueue([a = a_, w = s.param(0), dw = s.grad(0), db = s.grad(1)] {
      a->dy.resize(N);
      for (std::size_t n = 0; n < N; ++n) a->dy[n] = 2 * (a->y[n] - a->target[n]) / N;  // d(mean squared error)
      accumulate(a->h, a->dy, dw, db);
      a->dh.resize(N * H);
      for (std::size_t k = 0; k < N * H; ++k) a->dh[k] = a->dy[k / H] * w[k % H];
    });
    co_return;
  }
  Activations* a_;
  Readback<float>* loss_;
};

Task<int> train(Runtime& rt) {
  auto pg = co_await transport::ProcessGroup::from_env(rt);
  Activations acts;
  for (std::size_t k = 0; k < N * D; ++k) acts.x.push_back(std::sin(0.37f * float(k + N * D * std::size_t(pg->rank()))));
  for (std::size_t n = 0; n < N; ++n) acts.target.push_back(std::sin(acts.x[n * D] + acts.x[n * D + 1] + acts.x[n * D + 2]));
  Readback<float> loss;
  Hidden hidden(acts);
  Output output(acts, loss);
  std::vector<fsdp::Unit*> units{&hidden, &output};  // a named list: g++ 12 rejects {&a, &b} inside co_await
  fsdp::Options options;
  options.strategy = fsdp::Strategy::full_shard;
  options.optimizer = fsdp::AdamW{{.lr = 0.02, .weight_decay = 0}};
  auto engine = co_await fsdp::Engine::create(rt, *pg, units, options);

  float first = 0, last = 0;
  for (int step = 0; step < 150; ++step) {
    co_await engine->forward();  // returns once the kernels are queued, not run
    co_await engine->backward();
    co_await engine->optimizer_step();
    last = co_await loss.get();  // like PyTorch's loss.item(): waits for the kernel
    if (step == 0) first = last;
    if (step % 50 == 0) std::printf("rank %d step %3d loss %.5f\n", pg->rank(), step, last);
  }
  std::printf("rank %d of %d: loss %.5f -> %.5f\n", pg->rank(), pg->size(), first, last);
  co_return last < first / 10 ? 0 : 1;
}

int main() {
  try {
    auto env = launch::resolve_launch_env(launch::process_env()).value();  // coshard-run, torchrun, srun
    Runtime rt({.name = "minimal", .rank = env.rank});
    return rt.scheduler().sync_wait(train(rt));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "minimal: %s\n", e.what());
    return 1;
  }
}
