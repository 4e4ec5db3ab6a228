// A rank program for the engine's multi-process tests (start it with coshard-run). Each rank
// trains the MLP of mlp_model.hpp with the engine and, in the same process, the same model without
// sharding on the global batch (the reference), and compares them.
//   --mode parity | counts | order | overlap | memory | accumulation | wrong-order | clip | state-dict
//   --strategy full_shard|shard_grad_op|no_shard|hybrid_shard|hybrid_shard_zero2  --shard-group N
//   --layers 16x15,15x8   --steps 10   --rows 4 (per rank)   --param-dtype f32|bf16|f16
//   --reduce-dtype ...    --forward-prefetch K   --backward pre|post|none   --reshard-int G
//   --in-flight N   --micro no_sync,sync   --delay-ms D   --rs-delay-ms D   --compute-ms C   --clip-p 2|1|inf   --lr 0.01   --verbose 1
//   --device cpu|cpu-discrete (device memory the host cannot touch: Runtime::Options::discrete_memory)
//   --unit-params f32|param-dtype (units read param_dtype tensors: Unit::computes_in_f32 false)
// Prints "rank R: <mode> ok ..." on success; exit 1 with the differences otherwise.
#include <signal.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <iterator>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "coshard/fsdp/engine.hpp"
#include "coshard/runtime/copy.hpp"
#include "coshard/ops/grad_norm.hpp"
#include "coshard/transport/rank_main.hpp"
#include "mlp_model.hpp"

using namespace coshard;
using namespace coshard::testing;

namespace {

struct Config {
  std::string mode = "parity";
  fsdp::Strategy strategy = fsdp::Strategy::full_shard;
  int shard_group = 0;
  std::vector<Layer> layers{{16, 15}, {15, 8}};
  int steps = 10;
  int rows = 4;
  DType param_dtype = DType::f32;
  std::optional<DType> reduce_dtype;
  int forward_prefetch = 1;
  fsdp::BackwardPrefetch backward = fsdp::BackwardPrefetch::pre;
  int reshard_int = 0;
  int in_flight = 2;
  bool verbose = false;  // --verbose 1: print each parameter's drift
  std::vector<std::string> micro{"sync"};
  int delay_ms = 0;
  int rs_delay_ms = 0;      // each reduce-scatter also takes this long (overlap mode)
  int compute_ms = 0;       // each unit's compute takes this long (overlap mode; 0: delay_ms)
  double clip_p = 2;
  double lr = 0.01;
  bool root = false;  // first and last layer as one two-phase unit
  std::string offload = "none";  // none | params | all
  bool pipelined = true;
  double clip_max = 0;      // > 0: Options::clip
  bool stress = false;      // a random delay before every work item on every stream
  bool discrete = false;    // --device cpu-discrete: device memory the host cannot touch
  bool param_tensors = false;  // --unit-params param-dtype: units read param_dtype tensors, no f32 copy
  std::size_t host_cap = 0;
  std::string save;          // a sharded checkpoint written after step save_at - 1
  int save_at = -1;
  bool save_async = false;
  std::string resume;        // a sharded checkpoint to start from (its metadata names the step)
};

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr, "engine_check: %s\n", why.c_str());
  std::exit(2);
}

DType dtype_named(const std::string& s) {
  if (s == "f32") return DType::f32;
  if (s == "bf16") return DType::bf16;
  if (s == "f16") return DType::f16;
  usage("unknown dtype " + s);
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, sep);) out.push_back(item);
  return out;
}

Config parse(int argc, char** argv) {
  Config c;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--mode") c.mode = v;
    else if (k == "--strategy") {
      static const std::map<std::string, fsdp::Strategy> m{{"full_shard", fsdp::Strategy::full_shard},
                                                            {"shard_grad_op", fsdp::Strategy::shard_grad_op},
                                                            {"no_shard", fsdp::Strategy::no_shard},
                                                            {"hybrid_shard", fsdp::Strategy::hybrid_shard},
                                                            {"hybrid_shard_zero2", fsdp::Strategy::hybrid_shard_zero2}};
      if (!m.count(v)) usage("unknown strategy " + v);
      c.strategy = m.at(v);
    } else if (k == "--shard-group") c.shard_group = std::atoi(v.c_str());
    else if (k == "--layers") {
      c.layers.clear();
      for (auto& l : split(v, ',')) {
        auto x = l.find('x');
        c.layers.push_back({std::atoll(l.substr(0, x).c_str()), std::atoll(l.substr(x + 1).c_str())});
      }
    } else if (k == "--steps") c.steps = std::atoi(v.c_str());
    else if (k == "--rows") c.rows = std::atoi(v.c_str());
    else if (k == "--param-dtype") c.param_dtype = dtype_named(v);
    else if (k == "--reduce-dtype") c.reduce_dtype = dtype_named(v);
    else if (k == "--forward-prefetch") c.forward_prefetch = std::atoi(v.c_str());
    else if (k == "--backward") c.backward = v == "pre" ? fsdp::BackwardPrefetch::pre : v == "post" ? fsdp::BackwardPrefetch::post : fsdp::BackwardPrefetch::none;
    else if (k == "--reshard-int") c.reshard_int = std::atoi(v.c_str());
    else if (k == "--in-flight") c.in_flight = std::atoi(v.c_str());
    else if (k == "--verbose") c.verbose = v == "1";
    else if (k == "--micro") c.micro = split(v, ',');
    else if (k == "--delay-ms") c.delay_ms = std::atoi(v.c_str());
    else if (k == "--rs-delay-ms") c.rs_delay_ms = std::atoi(v.c_str());
    else if (k == "--compute-ms") c.compute_ms = std::atoi(v.c_str());
    else if (k == "--clip-p") c.clip_p = v == "inf" ? std::numeric_limits<double>::infinity() : std::atof(v.c_str());
    else if (k == "--lr") c.lr = std::atof(v.c_str());
    else if (k == "--root") c.root = v == "1";
    else if (k == "--offload") c.offload = v;
    else if (k == "--pipelined") c.pipelined = v == "1";
    else if (k == "--clip-max") c.clip_max = std::atof(v.c_str());
    else if (k == "--stress") c.stress = v == "1";
    else if (k == "--unit-params") {
      if (v != "f32" && v != "param-dtype") throw std::runtime_error("--unit-params: f32 or param-dtype, not '" + v + "'");
      c.param_tensors = v == "param-dtype";
    } else if (k == "--device") {
      if (v != "cpu" && v != "cpu-discrete") throw std::runtime_error("--device: cpu or cpu-discrete, not '" + v + "'");
      c.discrete = v == "cpu-discrete";
    }
    else if (k == "--host-cap") c.host_cap = std::strtoull(v.c_str(), nullptr, 10);
    else if (k == "--save") c.save = v;
    else if (k == "--save-at") c.save_at = std::atoi(v.c_str());
    else if (k == "--save-async") c.save_async = v == "1";
    else if (k == "--resume") c.resume = v;
    else usage("unknown flag " + k);
  }
  return c;
}

// A checkpoint's metadata: the step to resume at. (Made outside coroutines: GCC 12 miscompiles
// initializer lists that live across a suspension.)
fsdp::CheckpointMetadata at_step(int step) {
  fsdp::CheckpointMetadata m;
  m["step"] = std::to_string(step);
  return m;
}

// Machine epsilon of a dtype: 2^-23 (f32), 2^-10 (f16), 2^-7 (bf16) relative spacing.
double epsilon(DType d) { return d == DType::bf16 ? 0x1p-7 : d == DType::f16 ? 0x1p-10 : 0x1p-23; }

// How far (in units of training movement, see compare_params) parameters may be from the f32
// reference: gradients computed from parameters and reduced in the low precision carry a relative
// error of about its epsilon, and the updates inherit it (measured, 10 steps on 3 and 4 ranks with
// offload: at most 2e-7 in f32, 3e-4 with f16, 7e-3 with bf16; 0.034 with bf16 under hybrid sharding
// on 4 ranks, whose weights move 8 times further). The bound is 8 epsilons (at least 1e-4): 0.0625
// for bf16, 0.008 for f16. An optimizer that does nothing is off by 1, one that halves the step by
// 0.5.
double parameter_drift(const Config& c) {
  const double eps = std::max(epsilon(c.param_dtype), epsilon(c.reduce_dtype.value_or(c.param_dtype)));
  return std::max(1e-4, 8 * eps);
}

double tolerance(const Config& c) { return c.param_dtype == DType::f32 && c.reduce_dtype.value_or(c.param_dtype) == DType::f32 ? 2e-5 : 2e-2; }

struct Run {
  Run(Runtime& r, transport::ProcessGroup& g, Config c) : rt(r), pg(g), cfg(std::move(c)) {}
  Runtime& rt;
  transport::ProcessGroup& pg;
  Config cfg;
  MlpState state;
  std::vector<std::unique_ptr<fsdp::Unit>> units;
  std::map<std::string, int> collectives;  // "comm dtype" -> count
  std::map<std::string, int> dtypes;
  int failures = 0;
  std::mutex hook_mutex;
  bool sgd = false;  // the optimizer of the next engine made

  fsdp::Options options() {
    fsdp::Options o;
    o.strategy = cfg.strategy;
    o.shard_group_size = cfg.shard_group;
    o.prefetch.forward = cfg.forward_prefetch;
    o.prefetch.backward = cfg.backward;
    o.in_flight = cfg.in_flight;
    o.mixed_precision.param = cfg.param_dtype;
    o.mixed_precision.reduce = cfg.reduce_dtype;
    o.optimizer = fsdp::AdamW{{.lr = cfg.lr, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.01}};
    if (sgd) o.optimizer = fsdp::SGD{{.lr = cfg.lr, .momentum = 0.9}};
    o.timeout = std::chrono::milliseconds(60000);
    if (cfg.reshard_int > 0) o.reshard_after_forward = cfg.reshard_int;
    if (cfg.offload != "none") {
      o.offload.params = true;
      o.offload.grads = o.offload.optimizer = cfg.offload == "all";
      o.offload.pipelined_optimizer = cfg.pipelined;
      o.offload.host_memory_cap_bytes = cfg.host_cap;
    }
    if (cfg.clip_max > 0) o.clip = fsdp::Clip{cfg.clip_max, cfg.clip_p};
    // Micro-batch gradients add up: divide by their number as well as by the ranks, so that the
    // step equals one on the whole batch (FSDP's custom gradient divide factor).
    if (cfg.micro.size() > 1) o.gradient_divide_factor = static_cast<double>(pg.size() * cfg.micro.size());
    o.comm_hook = [this](const std::string& comm, const transport::OpInfo& info) {
      {
        std::lock_guard lock(hook_mutex);  // runs on the communicators' threads
        ++collectives[comm + " " + std::string(transport::to_string(info.op))];
        ++dtypes[comm + " " + std::string(transport::to_string(info.op)) + " " + std::string(to_string(info.dtype))];
      }
      // Outside the lock: each communicator's delay must not hold up the others'.
      int ms = 0;
      if (comm == "all_gather") ms = cfg.delay_ms;
      if (comm == "reduce_scatter") ms = cfg.rs_delay_ms;
      if (ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    };
    return o;
  }

  Task<std::unique_ptr<fsdp::Engine>> make_engine() {
    state.layers = cfg.layers;
    state.param_tensors = cfg.param_tensors;
    units.clear();
    std::vector<fsdp::Unit*> ptrs;
    if (cfg.root) {
      units.push_back(std::make_unique<MlpRootUnit>(state));
      for (std::size_t i = 1; i + 1 < cfg.layers.size(); ++i) units.push_back(std::make_unique<MlpUnit>(state, i));
    } else {
      for (std::size_t i = 0; i < cfg.layers.size(); ++i) units.push_back(std::make_unique<MlpUnit>(state, i));
    }
    for (auto& u : units) ptrs.push_back(u.get());
    co_return co_await fsdp::Engine::create(rt, pg, ptrs, options());
  }

  Batch local_batch(int step, int micro = 0) {
    const int n = pg.size(), r = pg.rank();
    // Micro-batch m of rank r: rows [(m * n + r) * rows, ... + rows) of the global batch.
    return make_batch(cfg.layers, cfg.rows, (static_cast<std::int64_t>(micro) * n + r) * cfg.rows, step);
  }
  Batch global_batch(int step, int micros = 1) {
    return make_batch(cfg.layers, static_cast<std::int64_t>(cfg.rows) * pg.size() * micros, 0, step);
  }

  Task<float> mean_over_ranks(float v) {
    Stream& compute = rt.stream("compute");
    Tensor t = Tensor::empty(rt.allocator(), DType::f32, {1});
    upload(compute, t, std::vector<float>{v});
    compute.wait(pg.world().all_reduce(t, transport::Reduction::avg(), compute));
    co_return (co_await download<float>(compute, t))[0];
  }

  void expect_close(const std::string& what, double got, double want, double tol) {
    if (!(std::fabs(got - want) <= tol * std::max(1.0, std::fabs(want)))) {
      ++failures;
      std::fprintf(stderr, "rank %d: %s: got %.9g, reference %.9g (tolerance %.1g)\n", pg.rank(), what.c_str(), got, want, tol);
    }
  }

  // Each parameter's distance from the reference, measured in units of how far training moved it
  // (||got - want|| / ||want - init||, L2): an optimizer that did nothing scores 1 whatever the
  // dtype, so the bound (parameter_drift) is well below 1 and a frozen or broken update fails.
  void compare_params(const fsdp::StateDict& sd, const Reference& ref, const Reference& init, double bound) {
    for (std::size_t i = 0; i < ref.w.size(); ++i) {
      for (int k = 0; k < 2; ++k) {
        const auto& want = k == 0 ? ref.w[i] : ref.b[i];
        const auto& start = k == 0 ? init.w[i] : init.b[i];
        const std::string name = "layers." + std::to_string(i) + (k == 0 ? ".weight" : ".bias");
        const auto& got = sd.at(name);
        double off = 0, moved = 0;  // squared L2 norms: AdamW moves every element about lr a step,
        for (std::size_t j = 0; j < want.size(); ++j) {  // so one element's noise says little
          off += std::pow(static_cast<double>(got[j]) - want[j], 2);
          moved += std::pow(static_cast<double>(want[j]) - start[j], 2);
        }
        off = std::sqrt(off);
        moved = std::sqrt(moved);
        const double drift = moved > 0 ? off / moved : (off > 0 ? 1.0 : 0.0);
        if (drift > bound) {
          ++failures;
          std::fprintf(stderr,
                       "rank %d: parameter %s is %.3g of its training movement (%.3g) away from the reference "
                       "(bound %.2g)\n",
                       pg.rank(), name.c_str(), drift, moved, bound);
        }
        if (cfg.verbose) std::printf("rank %d: %s drift %.3g of movement %.3g\n", pg.rank(), name.c_str(), drift, moved);
      }
    }
  }

  // Trains `steps` steps with the configured micro-batch pattern and compares with the reference.
  Task<void> parity() {
    auto engine = co_await make_engine();
    Reference ref(cfg.layers);
    const Reference init = ref;  // where training starts: the unit of compare_params
    const int micros = static_cast<int>(cfg.micro.size());
    // The reference's step: the loss of the whole batch, then clipping and AdamW as the engine's.
    auto reference_step = [&](int step) {
      const float want = ref.forward_backward(global_batch(step, micros));
      if (cfg.clip_max > 0) {
        std::vector<std::span<const float>> grads;
        for (std::size_t i = 0; i < ref.dw.size(); ++i) {
          grads.push_back(ref.dw[i]);
          grads.push_back(ref.db[i]);
        }
        const auto type = cfg.clip_p == 2 ? ops::NormType::l2 : cfg.clip_p == 1 ? ops::NormType::l1 : ops::NormType::inf;
        ref.scale_grads(static_cast<float>(ops::clip_coefficient(ops::grad_norm(grads, type), cfg.clip_max)));
      }
      ref.adamw(std::get<fsdp::AdamW>(options().optimizer).options);
      return want;
    };
    // Resumed: the engine starts from the checkpoint, the reference replays the steps before it.
    int first = 0;
    if (!cfg.resume.empty()) first = std::atoi((co_await engine->load_sharded(cfg.resume)).at("step").c_str());
    for (int step = 0; step < first; ++step) reference_step(step);
    for (int step = first; step < cfg.steps; ++step) {
      float local = 0;
      int last_sync = -1;
      for (int m = 0; m < micros; ++m) {
        if (cfg.micro[static_cast<std::size_t>(m)] == "sync") last_sync = m;
      }
      for (int m = 0; m < micros; ++m) {
        engine->set_requires_gradient_sync(cfg.micro[static_cast<std::size_t>(m)] == "sync");
        engine->set_is_last_backward(m == last_sync);
        state.set_batch(local_batch(step, m));
        co_await engine->forward();
        co_await engine->backward();
        co_await engine->compute_event();
        local += state.loss / static_cast<float>(micros);
      }
      engine->set_requires_gradient_sync(true);
      co_await engine->optimizer_step();
      if (!cfg.save.empty() && step + 1 == cfg.save_at) {
        if (cfg.save_async) {
          co_await engine->save_sharded_async(cfg.save, at_step(step + 1));
        } else {
          co_await engine->save_sharded(cfg.save, at_step(step + 1));
        }
      }
      float loss = co_await mean_over_ranks(local);
      expect_close("loss at step " + std::to_string(step), loss, reference_step(step), tolerance(cfg));
    }
    co_await engine->wait_for_checkpoint();
    compare_params(co_await engine->full_state_dict(), ref, init, parameter_drift(cfg));
  }

  Task<void> step(fsdp::Engine& engine, int s) {
    state.set_batch(local_batch(s));
    co_await engine.forward();
    co_await engine.backward();
    co_await engine.optimizer_step();
    co_await engine.compute_event();
  }

  void expect_count(const std::string& what, int got, int want) {
    if (got != want) {
      ++failures;
      std::fprintf(stderr, "rank %d: %s: %d, expected %d\n", pg.rank(), what.c_str(), got, want);
    }
  }

  // Collectives per iteration, as FSDP's communication tests count them.
  Task<void> counts() {
    auto engine = co_await make_engine();
    const int n = static_cast<int>(cfg.layers.size());
    co_await step(*engine, 0);  // the first iteration records the plan (and checks the order)
    co_await engine->synchronize();
    engine->clear_issue_log();
    collectives.clear();
    co_await step(*engine, 1);
    co_await engine->synchronize();
    int fwd_ag = 0, bwd_ag = 0, rs = 0, ar = 0;
    for (const auto& e : engine->issue_log()) {
      fwd_ag += e.starts_with("forward ") && e.ends_with(" all_gather");
      bwd_ag += e.starts_with("backward ") && e.ends_with(" all_gather");
      rs += e.ends_with(" reduce_scatter");
      ar += e.ends_with(" all_reduce");
    }
    const bool no_shard = cfg.strategy == fsdp::Strategy::no_shard;
    const bool zero2 = cfg.strategy == fsdp::Strategy::shard_grad_op || cfg.strategy == fsdp::Strategy::hybrid_shard_zero2;
    const bool hybrid = cfg.strategy == fsdp::Strategy::hybrid_shard || cfg.strategy == fsdp::Strategy::hybrid_shard_zero2;
    expect_count("forward all-gathers", fwd_ag, no_shard ? 0 : n);
    // Every unit resharded after forward is gathered again, all but the last (FSDP's root).
    expect_count("backward all-gathers", bwd_ag, no_shard || zero2 ? 0 : n - 1);
    expect_count("reduce-scatters", rs, no_shard ? 0 : n);
    expect_count("all-reduces", ar, no_shard || hybrid ? n : 0);
    expect_count("all_gather communicator calls", collectives["all_gather all_gather"], no_shard ? 0 : fwd_ag + bwd_ag);
    expect_count("reduce_scatter communicator calls", collectives["reduce_scatter reduce_scatter"], rs);
    // Inside no_sync nothing is reduced; the synced backward after it reduces once per unit.
    engine->clear_issue_log();
    engine->set_requires_gradient_sync(false);
    state.set_batch(local_batch(2));
    co_await engine->forward();
    co_await engine->backward();
    int reduced = 0;
    for (const auto& e : engine->issue_log()) reduced += e.ends_with(" reduce_scatter") || e.ends_with(" all_reduce");
    expect_count("reductions inside no_sync", reduced, 0);
    engine->set_requires_gradient_sync(true);
    co_await engine->forward();
    co_await engine->backward();
    reduced = 0;
    for (const auto& e : engine->issue_log()) reduced += e.ends_with(" reduce_scatter") || e.ends_with(" all_reduce");
    expect_count("reductions after no_sync", reduced, (no_shard ? 1 : hybrid ? 2 : 1) * n);
    co_await engine->optimizer_step();
  }

  // The exact issue order of the second iteration, printed by rank 0 for the test to compare.
  Task<void> order() {
    auto engine = co_await make_engine();
    co_await step(*engine, 0);
    engine->clear_issue_log();
    co_await step(*engine, 1);
    if (pg.rank() == 0) {
      std::string line;
      for (const auto& e : engine->issue_log()) line += (line.empty() ? "" : "; ") + e;
      std::printf("issue order: %s\n", line.c_str());
    }
  }

  // Step time with every all-gather taking delay_ms and every unit's compute compute_ms (or
  // delay_ms): the fastest of the steps, as a descheduled rank can only make a step slower, never
  // faster (CI's ratio once landed on the limit under load). Also the compute stream's wait for
  // all-gathers (its stalls on the unshard stream) in the least exposed step, next to what the
  // schedule predicts: with prefetch only the first all-gather of each step (nothing computes
  // before it); without it every all-gather, n in forward and n - 1 in backward (the last unit
  // stays gathered). And its wait for reductions in the worst step.
  Task<void> overlap() {
    auto engine = co_await make_engine();
    const int compute = cfg.compute_ms > 0 ? cfg.compute_ms : cfg.delay_ms;
    state.compute_ms = compute;
    co_await step(*engine, 0);
    double ms = 1e300, gather_ms = 1e300, reduce_ms = 0;
    for (int s = 1; s <= cfg.steps; ++s) {
      co_await engine->synchronize();
      const auto t0 = std::chrono::steady_clock::now();
      auto before = engine->comm_stats().compute_stall_seconds;
      co_await step(*engine, s);
      co_await engine->synchronize();
      ms = std::min(ms, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
      auto after = engine->comm_stats().compute_stall_seconds;
      gather_ms = std::min(gather_ms, (after["unshard"] - before["unshard"]) * 1e3);
      reduce_ms = std::max(reduce_ms, (after["reduce"] - before["reduce"]) * 1e3);
    }
    const int n = static_cast<int>(cfg.layers.size());
    const bool no_shard = cfg.strategy == fsdp::Strategy::no_shard;
    // Serialised: forward n x (gather + compute), backward (n - 1) gathers + n computes.
    const double serial = (no_shard ? 0.0 : cfg.delay_ms * (2.0 * n - 1)) + compute * 2.0 * n;
    const bool prefetch = cfg.forward_prefetch > 0 && cfg.backward != fsdp::BackwardPrefetch::none;
    const double predicted = no_shard ? 0.0 : cfg.delay_ms * (prefetch ? 1.0 : 2.0 * n - 1);
    if (pg.rank() == 0) {
      std::printf("step %.1f ms, serialised %.1f ms, ratio %.2f\n", ms, serial, ms / serial);
      std::printf("all-gather wait %.1f ms, predicted %.1f ms; reduce wait %.1f ms in the worst step\n", gather_ms,
                  predicted, reduce_ms);
    }
  }

  // Peak allocator memory over a whole step, once the pools have their size, against the FSDP
  // formula computed here from the model (not from the engine's report): the sharded state, the
  // gathered units (in_flight of them, or every unit when kept after forward), two f32 gradient
  // buffers, and one set of the reduction's temporaries. A unit left unsharded after forward
  // adds its whole size; reduce-scatter outputs that pile up add a shard per unit.
  Task<void> memory() {
    auto engine = co_await make_engine();
    co_await step(*engine, 0);
    co_await step(*engine, 1);
    co_await engine->synchronize();
    rt.allocator().reset_peak();
    co_await step(*engine, 2);
    co_await engine->synchronize();
    const std::size_t peak = rt.allocator().stats().peak_allocated_bytes;
    const auto n = static_cast<std::size_t>(pg.size());
    const std::size_t ps = size_of(cfg.param_dtype), rs = size_of(cfg.reduce_dtype.value_or(cfg.param_dtype));
    const std::size_t align = 16 / ps;  // FlatLayout aligns each parameter and each shard to 16 bytes
    auto block = [&](std::size_t bytes) { return rt.allocator().size_class(bytes); };  // what a tensor takes
    std::size_t sharded = 0, all_units = 0, max_unit = 0, max_padded = 0, max_chunk = 0;
    for (const auto& l : cfg.layers) {
      const auto numel = static_cast<std::size_t>(l.in * l.out + l.out);
      const std::size_t chunk = (numel + 2 * align + n - 1) / n + align;  // an upper bound
      // + its f32 copy under mixed precision, for units that compute in f32
      const bool f32_copy = cfg.param_dtype != DType::f32 && !cfg.param_tensors;
      const std::size_t unit = block(chunk * n * ps) + (f32_copy ? block(chunk * n * 4) : 0);
      sharded += 4 * block(chunk * 4);  // f32 master, gradient shard, AdamW's two moments
      all_units += unit;
      max_unit = std::max(max_unit, unit);
      max_padded = std::max(max_padded, chunk * n);
      max_chunk = std::max(max_chunk, chunk);
    }
    const bool keep = cfg.strategy == fsdp::Strategy::shard_grad_op || cfg.strategy == fsdp::Strategy::hybrid_shard_zero2;
    const std::size_t gathered = keep ? all_units : static_cast<std::size_t>(cfg.in_flight) * max_unit;
    // Two f32 gradient buffers: the unit computing, and the one before whose reduction overlaps it.
    const std::size_t grads = 2 * block(max_padded * 4);
    // One set of temporaries; double buffered when the accumulation runs on d2h (offloaded gradients).
    const std::size_t sets = cfg.offload == "all" ? 2 : 1;
    const std::size_t temporaries = sets * (block(max_chunk * rs) + (rs == 4 ? 0 : block(max_padded * rs)));
    const std::size_t bound = sharded + gathered + grads + temporaries + 4096;  // + scalars (loss, norms)
    if (pg.rank() == 0) {
      std::printf("peak %zu bytes, bound %zu (sharded %zu + gathered %zu + gradients %zu + temporaries %zu + 4096)\n",
                  peak, bound, sharded, gathered, grads, temporaries);
    }
    if (peak > bound) {
      ++failures;
      std::fprintf(stderr, "rank %d: peak %zu bytes above the bound %zu, by %zu (largest unit %zu, shard %zu)\n",
                   pg.rank(), peak, bound, peak - bound, max_unit, max_chunk * rs);
    }
    const std::size_t depth = keep ? cfg.layers.size() : static_cast<std::size_t>(cfg.in_flight);
    if (engine->memory_report().pool_slots > depth) {
      ++failures;
      std::fprintf(stderr, "rank %d: the pool grew to %zu slots (depth %zu)\n", pg.rank(),
                   engine->memory_report().pool_slots, depth);
    }
    // The report accounts for what the engine holds: its pools fit the formula's transient part,
    // and with the sharded state they explain the peak, up to the scalars and the allocator's
    // rounding of each tensor to its size class (the report counts exact sizes); a pool left out
    // of the report falls short by a whole unit's buffer.
    const auto report = engine->memory_report();
    const std::size_t transient = gathered + grads + temporaries;
    const std::size_t rounding = block(1) * (4 * cfg.layers.size() + 16);
    if (pg.rank() == 0) {
      std::printf("report: sharded state %zu + pools %zu bytes (transient bound %zu)\n", report.sharded_state_bytes,
                  report.pool_bytes, transient);
    }
    if (report.pool_bytes > transient || report.sharded_state_bytes + report.pool_bytes + 4096 + rounding < peak) {
      ++failures;
      std::fprintf(stderr, "rank %d: memory_report: sharded %zu + pools %zu bytes against a peak of %zu (pools at most %zu)\n",
                   pg.rank(), report.sharded_state_bytes, report.pool_bytes, peak, transient);
    }
  }

  // Offload: nothing full-size on the device (its allocator), the state in the host pool.
  Task<void> offload_memory() {
    auto engine = co_await make_engine();
    co_await step(*engine, 0);
    co_await step(*engine, 1);
    co_await engine->synchronize();
    auto report = engine->memory_report();
    auto stats = rt.allocator().stats();
    const std::size_t bound = report.sharded_state_bytes + static_cast<std::size_t>(cfg.in_flight + 1) *
                              report.max_unit_unsharded_bytes + 2 * report.shard_copy_bytes + 64 * 1024;
    if (pg.rank() == 0) {
      std::printf("device peak %zu bytes, bound %zu; device sharded state %zu, host state %zu\n",
                  stats.peak_allocated_bytes, bound, report.sharded_state_bytes, report.host_state_bytes);
    }
    if (report.sharded_state_bytes != 0 || report.host_state_bytes == 0) {
      ++failures;
      std::fprintf(stderr, "rank %d: sharded state left on the device: %zu bytes\n", pg.rank(), report.sharded_state_bytes);
    }
    if (stats.peak_allocated_bytes > bound) {
      ++failures;
      std::fprintf(stderr, "rank %d: device peak %zu above %zu\n", pg.rank(), stats.peak_allocated_bytes, bound);
    }
    // Reduced gradients land in host slots only where the host cannot reach device memory.
    if ((report.host_landing_bytes != 0) == rt.host_accessible()) {
      ++failures;
      std::fprintf(stderr, "rank %d: %zu bytes of landing slots on a device the host %s reach\n", pg.rank(),
                   report.host_landing_bytes, rt.host_accessible() ? "can" : "cannot");
    }
  }

  // Bad offload options fail at creation with the reason.
  Task<void> offload_errors() {
    auto expect = [&](std::string what, fsdp::Options o, std::string needle) -> Task<void> {
      state.layers = cfg.layers;
      MlpUnit unit(state, 0);
      std::vector<fsdp::Unit*> ptrs{&unit};
      try {
        auto e = co_await fsdp::Engine::create(rt, pg, ptrs, o);
        ++failures;
        std::fprintf(stderr, "rank %d: %s was accepted\n", pg.rank(), what.c_str());
      } catch (const Error& e) {
        if (e.message().find(needle) == std::string::npos) {
          ++failures;
          std::fprintf(stderr, "rank %d: %s: unexpected error: %s\n", pg.rank(), what.c_str(), e.what());
        }
      }
    };
    fsdp::Options a = options();
    a.offload.optimizer = a.offload.grads = true;
    co_await expect("optimizer offload without parameters", a, "needs offload.params too");
    fsdp::Options b = options();
    b.offload.params = b.offload.grads = b.offload.optimizer = true;
    b.offload.host_memory_cap_bytes = 1024;
    co_await expect("a host cap below the shards", b, "but the host memory cap is 1024 bytes");
    if (cfg.discrete) {  // the optimizer would mix host and device memory (on CUDA as well)
      fsdp::Options c = options();
      c.offload.params = true;
      co_await expect("parameters offloaded alone", c, "without offload.grads and offload.optimizer on cpu:0");
    }
  }

  // Reductions in reduce_dtype, all-gathers in param_dtype (seen by the communicator hook).
  Task<void> dtypes_check() {
    auto engine = co_await make_engine();
    co_await step(*engine, 0);
    co_await engine->synchronize();
    std::lock_guard lock(hook_mutex);
    const std::string pd(to_string(cfg.param_dtype)), rd(to_string(cfg.reduce_dtype.value_or(cfg.param_dtype)));
    for (const auto& [key, n] : dtypes) {
      if (key.starts_with("all_gather all_gather ") && !key.ends_with(" " + pd)) {
        ++failures;
        std::fprintf(stderr, "rank %d: %d all-gathers in the wrong dtype: %s\n", pg.rank(), n, key.c_str());
      }
      if (key.starts_with("reduce_scatter ") && !key.ends_with(" " + rd)) {
        ++failures;
        std::fprintf(stderr, "rank %d: %d reductions in the wrong dtype: %s\n", pg.rank(), n, key.c_str());
      }
    }
    expect_count("all-gathers in " + pd, dtypes["all_gather all_gather " + pd], static_cast<int>(2 * cfg.layers.size() - 1));
    expect_count("reduce-scatters in " + rd, dtypes["reduce_scatter reduce_scatter " + rd], static_cast<int>(cfg.layers.size()));
  }

  // Rank 1 runs the units in another order in the first iteration.
  Task<void> wrong_order() {
    auto engine = co_await make_engine();
    state.set_batch(local_batch(0));
    const std::size_t n = cfg.layers.size();
    for (std::size_t i = 0; i < n; ++i) co_await engine->run_forward(pg.rank() == 1 ? n - 1 - i : i);
    ++failures;
    std::fprintf(stderr, "rank %d: a different order went unnoticed\n", pg.rank());
  }

  // clip_grad_norm against the reference's norm, then the clipped step.
  Task<void> clip() {
    auto engine = co_await make_engine();
    Reference ref(cfg.layers);
    const Reference init = ref;
    auto o = std::get<fsdp::AdamW>(options().optimizer).options;
    const ops::NormType type = cfg.clip_p == 2 ? ops::NormType::l2 : cfg.clip_p == 1 ? ops::NormType::l1 : ops::NormType::inf;
    for (int s = 0; s < 3; ++s) {
      state.set_batch(local_batch(s));
      co_await engine->forward();
      co_await engine->backward();
      ref.forward_backward(global_batch(s));
      std::vector<std::span<const float>> grads;
      for (std::size_t i = 0; i < ref.dw.size(); ++i) {
        grads.push_back(ref.dw[i]);
        grads.push_back(ref.db[i]);
      }
      const double want = ops::grad_norm(grads, type);
      const double max_norm = want / 2;  // always clips
      const double got = co_await engine->clip_grad_norm(max_norm, cfg.clip_p);
      expect_close("gradient norm at step " + std::to_string(s), got, want, 1e-5);
      ref.scale_grads(static_cast<float>(ops::clip_coefficient(want, max_norm)));
      co_await engine->optimizer_step();
      ref.adamw(o);
    }
    compare_params(co_await engine->full_state_dict(), ref, init, parameter_drift(cfg));
  }

  // Sharded checkpoints: a round trip, then damaged copies and a failed save, each a clear error
  // on every rank (the rank that met the problem names it; the others name that rank).
  Task<void> checkpoint_errors() {
    namespace fs = std::filesystem;
    const fs::path base = cfg.save;
    const std::string good = (base / "good").string();
    const fsdp::CheckpointMetadata step_one = at_step(1);
    auto engine = co_await make_engine();
    co_await step(*engine, 0);
    co_await engine->save_sharded(good, step_one);
    auto other = co_await make_engine();
    const auto md = co_await other->load_sharded(good);
    const auto loaded = co_await other->full_state_dict();
    const auto saved = co_await engine->full_state_dict();
    if (md.at("step") != "1" || loaded != saved) {
      ++failures;
      std::fprintf(stderr, "rank %d: the loaded checkpoint differs from the saved engine\n", pg.rank());
    }
    fsdp::verify_checkpoint(good);
    if (pg.rank() == 0) damage_copies(base);
    co_await mean_over_ranks(0);  // a barrier: the copies exist
    auto by = [&](int rank, const char* own, const char* theirs) { return std::string(pg.rank() == rank ? own : theirs); };
    auto in = [&](const char* name) { return (base / name).string(); };
    co_await expect_load_error(*other, in("truncated"), by(1, "truncated file", "rank(s) 1 failed"));
    co_await expect_load_error(*other, in("corrupt"), by(0, "fail their checksum", "rank(s) 0 failed"));
    co_await expect_load_error(*other, in("missing"), by(1, "rank-00001.bin' is missing", "rank(s) 1 failed"));
    co_await expect_load_error(*other, in("looped"),
                               by(1, "rank-00001.bin': Too many levels of symbolic links; the checkpoint may be intact",
                                  "rank(s) 1 failed"));
    co_await expect_load_error(*other, in("newer"), by(0, "newer than the 2 this build reads", "newer than the 2"));
    co_await expect_load_error(*other, in("edited"), by(0, "manifest.json' fails its checksum", "fails its checksum"));
    co_await expect_load_error(*other, in("unfinished"), by(0, "it has no manifest.json", "it has no manifest.json"));
    co_await expect_load_error(*other, in("garbled"), by(0, "is not a valid checkpoint manifest", "is not a valid"));
    cfg.layers[0].out += 1;  // another model shape
    auto wider = co_await make_engine();
    co_await expect_load_error(*wider, good, by(0, "is of another model shape", "is of another model shape"));
    cfg.layers[0].out -= 1;
    sgd = true;
    auto with_sgd = co_await make_engine();
    co_await expect_load_error(*with_sgd, good, by(0, "holds adamw state but this run uses sgd", "this run uses sgd"));
    sgd = false;
    co_await expect_save_error(*engine, in("fails"), by(1, "cannot rename", "rank(s) 1 could not write their part"), false);
    co_await expect_save_error(*engine, good, by(0, "already holds a checkpoint", "already holds a checkpoint"), true);
  }

  void expect_error_text(const std::string& what, const Error& e, const std::string& needle) {
    if (e.message().find(needle) == std::string::npos) {
      ++failures;
      std::fprintf(stderr, "rank %d: %s: expected '%s' in: %s\n", pg.rank(), what.c_str(), needle.c_str(), e.what());
    }
  }

  Task<void> expect_load_error(fsdp::Engine& engine, std::string dir, std::string needle) {
    try {
      co_await engine.load_sharded(dir);
      ++failures;
      std::fprintf(stderr, "rank %d: loading %s was accepted\n", pg.rank(), dir.c_str());
    } catch (const Error& e) {
      expect_error_text("loading " + dir, e, needle);
    }
  }

  // The save fails on every rank and leaves the directory's manifest as it was.
  Task<void> expect_save_error(fsdp::Engine& engine, std::string dir, std::string needle, bool had_manifest) {
    try {
      co_await engine.save_sharded(dir, fsdp::CheckpointMetadata{});
      ++failures;
      std::fprintf(stderr, "rank %d: saving %s was accepted\n", pg.rank(), dir.c_str());
    } catch (const Error& e) {
      expect_error_text("saving " + dir, e, needle);
    }
    if (std::filesystem::exists(std::filesystem::path(dir) / fsdp::kManifestName) != had_manifest) {
      ++failures;
      std::fprintf(stderr, "rank %d: saving %s changed whether it has a manifest\n", pg.rank(), dir.c_str());
    }
  }

  // Damaged copies of base/good, made by rank 0 while the others wait.
  static void damage_copies(const std::filesystem::path& base) {
    namespace fs = std::filesystem;
    const fs::path good = base / "good";
    auto copy = [&](const char* name) {
      fs::copy(good, base / name, fs::copy_options::recursive | fs::copy_options::overwrite_existing);
      return base / name;
    };
    const auto truncated = copy("truncated") / "rank-00001.bin";
    fs::resize_file(truncated, fs::file_size(truncated) - 4);
    const auto corrupt = copy("corrupt") / "rank-00000.bin";
    std::fstream f(corrupt, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(8);
    char c = 0;
    f.read(&c, 1);
    c = static_cast<char>(c ^ 0x40);
    f.seekp(8);
    f.write(&c, 1);
    f.close();
    fs::remove(copy("missing") / "rank-00001.bin");
    const auto looped = copy("looped") / "rank-00001.bin";  // stat fails, but not with ENOENT
    fs::remove(looped);
    fs::create_symlink("rank-00001.bin", looped);
    fs::remove(copy("unfinished") / fsdp::kManifestName);
    auto newer = fsdp::read_manifest(good);
    newer.version = 99;
    std::ofstream(copy("newer") / fsdp::kManifestName) << fsdp::to_json(newer);
    {  // one digit of the step changed, the JSON still valid: only the manifest's own checksum sees it
      std::ifstream in(good / fsdp::kManifestName);
      std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      text.replace(text.find("\"step\": \"1\""), 11, "\"step\": \"7\"");
      std::ofstream(copy("edited") / fsdp::kManifestName) << text;
    }
    std::ofstream(copy("garbled") / fsdp::kManifestName) << "{\"format\": \"coshard-sharded-checkpoint\", \"version\":";
    fs::create_directories(base / "fails" / "rank-00001.bin");  // rank 1's rename cannot replace a directory
  }

  // Full state dict round trip, and the errors of bad ones.
  Task<void> state_dict() {
    auto engine = co_await make_engine();
    co_await step(*engine, 0);
    auto full = co_await engine->full_state_dict();
    auto rank0 = co_await engine->full_state_dict(true);
    if ((pg.rank() == 0) != !rank0.empty()) {
      ++failures;
      std::fprintf(stderr, "rank %d: rank0_only state dict has %zu entries\n", pg.rank(), rank0.size());
    }
    // summon_full_params: the full values, and a write-back that lands in the shards.
    bool seen = false;
    co_await engine->summon_full_params([&](fsdp::StateDict& sd) {
      seen = sd == full;
      for (auto& x : sd.at("layers.0.bias")) x = 7.0f;
    }, true);
    auto after = co_await engine->full_state_dict();
    if (!seen || after.at("layers.0.bias") != std::vector<float>(full.at("layers.0.bias").size(), 7.0f) ||
        after.at("layers.1.weight") != full.at("layers.1.weight")) {
      ++failures;
      std::fprintf(stderr, "rank %d: summon_full_params did not show or write back the full parameters\n", pg.rank());
    }
    auto other = co_await make_engine();  // fresh values
    co_await other->load_full_state_dict(full);
    auto back = co_await other->full_state_dict();
    if (back != full) {
      ++failures;
      std::fprintf(stderr, "rank %d: the loaded engine's state dict differs from the saved one\n", pg.rank());
    }
    auto expect_error = [&](std::string what, fsdp::StateDict bad, std::string needle) -> Task<void> {
      try {
        co_await other->load_full_state_dict(bad);
        ++failures;
        std::fprintf(stderr, "rank %d: %s was accepted\n", pg.rank(), what.c_str());
      } catch (const Error& e) {
        if (e.message().find(needle) == std::string::npos) {
          ++failures;
          std::fprintf(stderr, "rank %d: %s: unexpected error: %s\n", pg.rank(), what.c_str(), e.what());
        }
      }
    };
    auto missing = full;
    missing.erase("layers.0.bias");
    co_await expect_error("a missing tensor", missing, "state dict has no 'layers.0.bias' (unit 'layers.0')");
    auto extra = full;
    extra["layers.9.weight"] = {1.0f};
    co_await expect_error("an extra tensor", extra, "'layers.9.weight' is not a parameter of this model");
    auto shaped = full;
    shaped["layers.1.weight"].pop_back();
    co_await expect_error("a mis-shaped tensor", shaped, "'layers.1.weight' has");
  }
};

Task<int> main_task(Runtime& rt, Config cfg) {
  auto pg = co_await transport::ProcessGroup::from_env(rt);
  Run run(rt, *pg, cfg);
  const int r = pg->rank();
  try {
    static const std::map<std::string, Task<void> (Run::*)()> modes{
        {"parity", &Run::parity},         {"counts", &Run::counts},
        {"order", &Run::order},           {"overlap", &Run::overlap},
        {"memory", &Run::memory},         {"dtypes", &Run::dtypes_check},
        {"wrong-order", &Run::wrong_order}, {"clip", &Run::clip},
        {"offload-memory", &Run::offload_memory}, {"offload-errors", &Run::offload_errors},
        {"state-dict", &Run::state_dict}, {"checkpoint-errors", &Run::checkpoint_errors}};
    auto mode = modes.find(cfg.mode);
    if (mode == modes.end()) {
      std::fprintf(stderr, "engine_check: unknown mode %s\n", cfg.mode.c_str());
      co_return 2;
    }
    co_await (run.*(mode->second))();
  } catch (const Error& e) {
    std::printf("rank %d: error: %s\n", r, e.what());
    std::fflush(stdout);
    co_return 3;
  }
  co_await pg->finish();
  if (run.failures) {
    std::printf("rank %d: %s FAILED (%d differences)\n", r, cfg.mode.c_str(), run.failures);
    co_return 1;
  }
  std::printf("rank %d: %s ok\n", r, cfg.mode.c_str());
  co_return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Config cfg = parse(argc, argv);
  // Every rank must report the error itself, not be stopped by the launcher once one has.
  if (cfg.mode == "wrong-order") ::signal(SIGTERM, SIG_IGN);
  // --stress: up to 1 ms before each work item, longer than any item of these models, so the
  // streams' interleaving varies freely: results must not change.
  const auto jitter = std::chrono::microseconds(cfg.stress ? 1000 : 0);
  return transport::run_rank("engine_check", {.name = "engine", .stream_jitter = jitter, .discrete_memory = cfg.discrete},
                             [&](Runtime& rt, const launch::LaunchEnv&) { return main_task(rt, cfg); });
}
