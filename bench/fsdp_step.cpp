// FSDP step time, one rank per process (start it with coshard-run; scripts/bench does, beside
// PyTorch's DDP and a gloo ZeRO-3 on the same model). Models: the MLP of tests/fsdp/mlp_model.hpp,
// `layers` x Linear(hidden, hidden) with ReLU, MSE loss, Adam, `batch` rows per rank; or GPT-2
// `10M` (--model gpt2-10M: `batch` sequences of --seq tokens per rank). Rank 0 prints
//   coshard <model> <key=value ...>
// with the step time (the median of --rounds rounds of --steps steps each, each round ended by a
// synchronize, and spread = (slowest - fastest round) / median), the collectives' time (their
// streams' busy time), exposed communication (the compute stream's stalls waiting for other
// streams), and the allocator's peak beside the pool bound.
//   --model mlp|gpt2-10M --hidden 2048 --layers 4 --batch 128 (gpt2: 4) --seq 256 --steps 4 --rounds 5
//   --strategy full_shard|shard_grad_op|no_shard
//   --prefetch on|off   --no-compute (the same schedule without kernels: collectives alone)
//   --offload none|serial|pipelined (sharded state in host memory; the host optimizer after
//   backward, as PyTorch, or per unit as soon as its gradient arrives)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "coshard/fsdp/engine.hpp"
#include "coshard/gpt2/units.hpp"
#include "coshard/transport/rank_main.hpp"
#include "mlp_model.hpp"
#include "flags.hpp"
#include "summary.hpp"

using namespace coshard;

namespace {

struct Flags {
  std::string model = "mlp";
  std::int64_t hidden = 2048;
  int layers = 4, batch = 0, seq = 256, steps = 4, rounds = 5;
  std::string strategy = "full_shard";
  bool prefetch = true, compute = true;
  std::string offload = "none";
};

// The same unit without its kernels: the engine's schedule and collectives alone.
class Hollow final : public fsdp::Unit {
 public:
  explicit Hollow(fsdp::Unit* inner) : inner_(inner) {}
  std::string name() const override { return inner_->name(); }
  std::vector<fsdp::ParamSpec> params() const override { return inner_->params(); }
  int phases() const override { return inner_->phases(); }
  Task<void> forward(fsdp::Scope&) override { co_return; }
  Task<void> backward(fsdp::Scope&) override { co_return; }

 private:
  fsdp::Unit* inner_;
};

Task<int> run(Runtime& rt, Flags f) {
  auto pg = co_await transport::ProcessGroup::from_env(rt);
  const bool gpt = f.model == "gpt2-10M";
  if (f.batch == 0) f.batch = gpt ? 4 : 128;
  testing::MlpState state;
  for (int i = 0; i < f.layers; ++i) state.layers.push_back({f.hidden, f.hidden});
  state.skip_compute = !f.compute;
  std::vector<std::unique_ptr<testing::MlpUnit>> units;
  std::unique_ptr<gpt2::Gpt2Units> gpt2_model;
  std::vector<fsdp::Unit*> ptrs;
  std::vector<std::unique_ptr<Hollow>> hollow;
  if (gpt) {
    gpt2_model = std::make_unique<gpt2::Gpt2Units>(gpt2::named_config("10M"), 1337);
    ptrs = gpt2_model->units();
    if (!f.compute) {
      for (auto*& u : ptrs) {
        hollow.push_back(std::make_unique<Hollow>(u));
        u = hollow.back().get();
      }
    }
  } else {
    for (std::size_t i = 0; i < state.layers.size(); ++i) {
      units.push_back(std::make_unique<testing::MlpUnit>(state, i));
      ptrs.push_back(units.back().get());
    }
  }
  fsdp::Options o;
  o.strategy = f.strategy == "no_shard" ? fsdp::Strategy::no_shard
               : f.strategy == "shard_grad_op" ? fsdp::Strategy::shard_grad_op : fsdp::Strategy::full_shard;
  if (!f.prefetch) {
    o.prefetch.forward = 0;
    o.prefetch.backward = fsdp::BackwardPrefetch::none;
  }
  o.optimizer = fsdp::AdamW{{.lr = 1e-4, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.0}};
  if (f.offload != "none") {
    o.offload.params = o.offload.grads = o.offload.optimizer = true;
    o.offload.pipelined_optimizer = f.offload == "pipelined";
  }
  auto engine = co_await fsdp::Engine::create(rt, *pg, ptrs, o);
  const auto batch = gpt ? testing::Batch{} : testing::make_batch(state.layers, f.batch,
                                                                   static_cast<std::int64_t>(pg->rank()) * f.batch, 0);
  std::vector<std::int32_t> tokens(static_cast<std::size_t>(f.batch * f.seq)), targets(tokens.size());
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] = static_cast<std::int32_t>(testing::mix(i + 7919 * static_cast<std::size_t>(pg->rank())) % 256);
    targets[i] = static_cast<std::int32_t>(testing::mix(i + 1) % 256);
  }
  auto step = [&]() -> Task<void> {
    if (gpt && f.compute) {
      gpt2_model->set_batch(tokens, targets, static_cast<std::size_t>(f.batch), static_cast<std::size_t>(f.seq));
    } else {
      state.set_batch(batch);
    }
    co_await engine->forward();
    co_await engine->backward();
    co_await engine->compute_event();  // as a trainer reading the loss; the activations are reused
    co_await engine->optimizer_step();
  };
  for (int i = 0; i < 2; ++i) co_await step();
  co_await engine->synchronize();
  const auto before = engine->comm_stats();
  std::vector<double> round_ms;
  for (int round = 0; round < f.rounds; ++round) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < f.steps; ++i) co_await step();
    co_await engine->synchronize();
    round_ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / f.steps);
  }
  const auto [ms, spread] = bench::summarise(round_ms);
  const int measured = f.steps * f.rounds;
  const auto after = engine->comm_stats();
  const auto report = engine->memory_report();
  const auto peak = rt.allocator().stats().peak_allocated_bytes;
  const bool keep = o.strategy == fsdp::Strategy::shard_grad_op;
  const std::size_t depth = keep ? state.layers.size() : static_cast<std::size_t>(o.in_flight);
  const std::size_t bound = report.sharded_state_bytes + (depth + 1) * report.max_unit_unsharded_bytes;
  if (pg->rank() == 0) {
    std::printf("coshard %s strategy=%s prefetch=%s compute=%s offload=%s world=%d batch=%d step_ms=%.1f "
                "steps_per_s=%.3f spread=%.2f comm_ms=%.1f exposed_ms=%.1f peak_bytes=%zu bound_bytes=%zu\n",
                f.model.c_str(), f.strategy.c_str(), f.prefetch ? "on" : "off", f.compute ? "on" : "off",
                f.offload.c_str(), pg->size(), f.batch, ms, 1e3 / ms, spread,
                (after.communication_seconds - before.communication_seconds) * 1e3 / measured,
                (after.exposed_seconds - before.exposed_seconds) * 1e3 / measured, peak, bound);
    std::fflush(stdout);
  }
  co_await pg->finish();
  co_return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "bench_fsdp_step: %s needs a value\n", k.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (k == "--model") f.model = next();
    else if (k == "--seq") f.seq = bench::flag_number("bench_fsdp_step", k, next(), 1, 1 << 16);
    else if (k == "--hidden") f.hidden = bench::flag_number<std::int64_t>("bench_fsdp_step", k, next(), 1, 1 << 16);
    else if (k == "--layers") f.layers = bench::flag_number("bench_fsdp_step", k, next(), 1, 1024);
    else if (k == "--batch") f.batch = bench::flag_number("bench_fsdp_step", k, next(), 1, 1 << 16);
    else if (k == "--steps") f.steps = bench::flag_number("bench_fsdp_step", k, next(), 1, 1000000);
    else if (k == "--rounds") f.rounds = bench::flag_number("bench_fsdp_step", k, next(), 1, 1000);
    else if (k == "--strategy") f.strategy = next();
    else if (k == "--prefetch") f.prefetch = next() == "on";
    else if (k == "--no-compute") f.compute = false;
    else if (k == "--offload") f.offload = next();
    else {
      std::fprintf(stderr, "bench_fsdp_step: unknown flag %s\n", k.c_str());
      return 2;
    }
  }
  if (f.steps < 1 || f.rounds < 1) {
    std::fprintf(stderr, "bench_fsdp_step: --steps and --rounds must be at least 1\n");
    return 2;
  }
  return transport::run_rank("bench_fsdp_step", {.name = "bench"},
                             [&](Runtime& rt, const launch::LaunchEnv&) { return run(rt, f); });
}
