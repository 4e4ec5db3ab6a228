// A rank program (start it with coshard-run): trains a model (GPT-2 or Llama) with the FSDP engine
// on its slice of each global batch and, in the same process, the unsharded model on the whole
// global batch, and compares the losses of every step and the parameters at the end.
//   --family gpt2|llama   --config <its spec>   --strategy full_shard|shard_grad_op|no_shard|hybrid_shard
//   --steps 4   --clip 0 (max gradient norm)   --accum 1 (micro-batches per step)
//   --batch 2 (sequences per rank)   --seq 16   --lr 1e-3
//   --mixed none|bf16|f16 (the engine's param_dtype)   --compute f32|bf16 (the units' Compute)
// With mixed precision the reference stays f32: the losses must agree within 1e-3, the parameters
// within 1e-2 and each parameter's update within 0.25 norm-wise (bf16 rounding), else 2e-5 and 1e-4.
// Prints "rank R: <family> parity ok" on success and the issue log of the last step.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "coshard/fsdp/engine.hpp"
#include "coshard/ops/grad_norm.hpp"
#include "coshard/gpt2/data.hpp"
#include "coshard/gpt2/model.hpp"
#include "coshard/gpt2/units.hpp"
#include "coshard/llama/model.hpp"
#include "coshard/llama/units.hpp"
#include "coshard/launch/launch_env.hpp"
#include "coshard/transport/rank_main.hpp"
#include "coshard/transport/process_group.hpp"

using namespace coshard;

namespace {

struct Args {
  std::string family = "gpt2", config = "tiny";
  fsdp::Strategy strategy = fsdp::Strategy::full_shard;
  int steps = 4, accum = 1;
  std::size_t batch = 2, seq = 16;
  double lr = 1e-3, clip = 0;
  DType mixed = DType::f32;
  bool bf16_compute = false;
};

// What differs between the families: their units, their one-process model and their configs.
struct Gpt2Family {
  using Units = gpt2::Gpt2Units;
  using Model = gpt2::Gpt2;
  static gpt2::Config parse(const std::string& s) { return gpt2::parse_config(s); }
  static gpt2::Compute compute(bool bf16) { return bf16 ? gpt2::Compute::bf16 : gpt2::Compute::f32; }
};
struct LlamaFamily {
  using Units = llama::LlamaUnits;
  using Model = llama::Llama;
  static llama::Config parse(const std::string& s) { return llama::parse_config(s); }
  static llama::Compute compute(bool bf16) { return bf16 ? llama::Compute::bf16 : llama::Compute::f32; }
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--family" && (v == "gpt2" || v == "llama")) a.family = v;
    else if (k == "--config") a.config = v;
    else if (k == "--strategy")
      a.strategy = v == "no_shard" ? fsdp::Strategy::no_shard : v == "shard_grad_op" ? fsdp::Strategy::shard_grad_op
                 : v == "hybrid_shard" ? fsdp::Strategy::hybrid_shard : fsdp::Strategy::full_shard;
    else if (k == "--accum") a.accum = std::atoi(v.c_str());
    else if (k == "--clip") a.clip = std::atof(v.c_str());
    else if (k == "--steps") a.steps = std::atoi(v.c_str());
    else if (k == "--batch") a.batch = static_cast<std::size_t>(std::atoi(v.c_str()));
    else if (k == "--seq") a.seq = static_cast<std::size_t>(std::atoi(v.c_str()));
    else if (k == "--lr") a.lr = std::atof(v.c_str());
    else if (k == "--mixed" && (v == "none" || v == "bf16" || v == "f16"))
      a.mixed = v == "bf16" ? DType::bf16 : v == "f16" ? DType::f16 : DType::f32;
    else if (k == "--compute" && (v == "f32" || v == "bf16"))
      a.bf16_compute = v == "bf16";
    else {
      std::fprintf(stderr, "models_fsdp_check: unknown flag or value %s %s\n", k.c_str(), v.c_str());
      std::exit(2);
    }
  }
  return a;
}

template <class Family>
Task<int> run(Runtime& rt, Args a) {
  auto pg = co_await transport::ProcessGroup::from_env(rt);
  const int rank = pg->rank(), world = pg->size();
  const auto cfg = Family::parse(a.config);
  const std::uint64_t seed = 1234;
  int failures = 0;
  try {
    typename Family::Units units(cfg, seed, Family::compute(a.bf16_compute));
    fsdp::Options o;
    o.strategy = a.strategy;
    if (a.clip > 0) o.clip = fsdp::Clip{.max_norm = a.clip};
    o.mixed_precision.param = a.mixed;
    const bool mixed = a.mixed != DType::f32;
    const double loss_tol = mixed ? 1e-3 : 2e-5, param_tol = mixed ? 1e-2 : 1e-4, update_tol = 0.25;
    const ops::AdamWOptions adam{.lr = a.lr, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
    o.optimizer = fsdp::AdamW{adam};
    o.timeout = std::chrono::milliseconds(60000);
    auto engine = co_await fsdp::Engine::create(rt, *pg, units.units(), o);

    typename Family::Model ref(cfg, seed);
    const std::vector<float> init(ref.params().flat().begin(), ref.params().flat().end());
    ops::AdamWState state(ref.params().flat().size());
    const auto ranges = ref.params().ranges();

    auto tokens = std::make_shared<gpt2::Tokens>();
    for (std::size_t i = 0; i < 4096; ++i) {
      tokens->push_back(static_cast<gpt2::Token>(gpt2::splitmix64(i) % static_cast<std::uint64_t>(cfg.vocab)));
    }
    gpt2::DataLoader mine(tokens, {.batch = a.batch, .seq_len = a.seq, .rank = rank, .world = world});
    gpt2::DataLoader global(tokens, {.batch = a.batch * static_cast<std::size_t>(world), .seq_len = a.seq});
    const auto dloss = 1.0f / static_cast<float>(a.accum);
    units.set_loss_scale(dloss);
    for (int step = 0; step < a.steps; ++step) {
      if (step + 1 == a.steps) engine->clear_issue_log();
      ref.zero_grad();
      float loss = 0, want = 0;
      for (int m = 0; m < a.accum; ++m) {  // micro-batches: no_sync on all but the last
        auto b = mine.next();
        units.set_batch(b.inputs, b.targets, b.B, b.T);
        engine->set_requires_gradient_sync(m + 1 == a.accum);
        co_await engine->forward();
        co_await engine->backward();
        const float local = co_await units.loss();
        Tensor t = Tensor::empty(rt.allocator(), DType::f32, {1});
        t.data_as<float>()[0] = local;
        co_await pg->world().all_reduce(t, transport::Reduction::avg(), rt.stream("compute"));
        loss += t.data_as<float>()[0] / static_cast<float>(a.accum);
        auto g = global.next();
        want += ref.forward(g.inputs, g.targets, g.B, g.T) / static_cast<float>(a.accum);
        ref.backward(dloss);
      }
      co_await engine->optimizer_step();
      if (a.clip > 0) {  // torch's clip_grad_norm_ over the whole model
        const std::span<const float> all = ref.grads().flat();
        const double norm = ops::grad_norm(std::span(&all, 1), ops::NormType::l2);
        ops::scale_inplace(ref.grads().flat(), static_cast<float>(ops::clip_coefficient(norm, a.clip)));
      }
      ops::adamw_step(ref.params().flat(), ref.grads().flat(), state, adam, ranges);
      if (!(std::fabs(loss - want) <= loss_tol * std::max(1.0f, std::fabs(want)))) {
        ++failures;
        std::fprintf(stderr, "rank %d: loss at step %d: %.9g, reference %.9g\n", rank, step, loss, want);
      }
      if (rank == 0) std::printf("step %d: loss %.6f (reference %.6f)\n", step, loss, want);
    }
    co_await engine->synchronize();
    if (rank == 0) {
      std::string log;
      for (const auto& e : engine->issue_log()) log += e + "; ";
      std::printf("issue log of the last step: %s\n", log.c_str());
    }
    // Without mixed precision every element within param_tol. With it, Adam bounds each element's
    // move by about lr a step whatever the gradients, so elements cannot tell a wrong backward from
    // bf16 rounding: each parameter's whole update must match the reference's, norm-wise.
    auto sd = co_await engine->full_state_dict();
    for (std::size_t i = 0; i < ref.params().size(); ++i) {
      const auto& name = ref.params().infos()[i].name;
      const auto want = ref.params().at(i);
      const auto& got = sd.at(name);
      const auto at = static_cast<std::size_t>(ref.params().offset(i));
      double worst = 0, diff2 = 0, moved2 = 0;
      for (std::size_t j = 0; j < want.size(); ++j) {
        const double d = std::fabs(got[j] - want[j]) / std::max(1.0, static_cast<double>(std::fabs(want[j])));
        if (!(d <= worst)) worst = std::isnan(worst) ? worst : d;  // a NaN stays the worst
        diff2 += (static_cast<double>(got[j]) - want[j]) * (static_cast<double>(got[j]) - want[j]);
        moved2 += (static_cast<double>(want[j]) - init[at + j]) * (static_cast<double>(want[j]) - init[at + j]);
      }
      const double update_error = std::sqrt(diff2 / std::max(moved2, 1e-30));
      if (!(worst <= param_tol) || (mixed && !(update_error <= update_tol))) {
        ++failures;
        std::fprintf(stderr, "rank %d: parameter %s differs from the reference by %.3g (its update by %.3g)\n", rank,
                     name.c_str(), worst, update_error);
      }
    }
  } catch (const Error& e) {
    std::printf("rank %d: error: %s\n", rank, e.what());
    std::fflush(stdout);
    co_return 3;
  }
  co_await pg->finish();
  if (failures) {
    std::printf("rank %d: %s parity FAILED (%d differences)\n", rank, a.family.c_str(), failures);
    co_return 1;
  }
  std::printf("rank %d: %s parity ok\n", rank, a.family.c_str());
  co_return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  return transport::run_rank("models_fsdp_check", {.name = a.family},
                             [&](Runtime& rt, const launch::LaunchEnv&) {
                               return a.family == "llama" ? run<LlamaFamily>(rt, a) : run<Gpt2Family>(rt, a);
                             });
}
