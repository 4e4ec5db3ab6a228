// gpt2-train: GPT-2 on coshard's FSDP engine. One process per rank (coshard-run, torchrun-style
// environments, mpirun, srun; alone: one rank). Every check that can fail on a user's input (flags,
// data file, --init, --save path, metrics port) runs before the first step.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>

#include "corpus.hpp"
#include "coshard/fsdp/engine.hpp"
#include "coshard/gpt2/data.hpp"
#include "coshard/gpt2/model.hpp"
#include "coshard/gpt2/safetensors.hpp"
#include "coshard/gpt2/units.hpp"
#include "coshard/metrics/rank_metrics.hpp"
#include "coshard/metrics/timeline.hpp"
#include "coshard/metrics/trace_merge.hpp"
#include "coshard/runtime/runtime.hpp"
#include "coshard/transport/process_group.hpp"
#include "progress.hpp"
#include "train_options.hpp"

using namespace coshard;
namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;

struct Inputs {
  std::shared_ptr<const std::vector<std::uint16_t>> train, val;
  std::unique_ptr<train::AdditionCorpus> corpus;  // the embedded default
  std::optional<gpt2::StateDict> init;
};

// Everything a user can get wrong, checked on every rank before the job starts.
Inputs prepare(const train::TrainOptions& o) {
  Inputs in;
  std::vector<std::uint16_t> tokens;
  if (o.data.empty()) {
    if (o.config.vocab < 256) {
      throw Error(Errc::bad_config, "the embedded corpus is byte text and needs --model vocab >= 256 (it is " +
                                        std::to_string(o.config.vocab) + "); give --data or a larger vocab");
    }
    in.corpus = std::make_unique<train::AdditionCorpus>(o.seed);
    tokens = in.corpus->tokens();
  } else {
    tokens = gpt2::read_tokens(o.data, o.config.vocab);
  }
  const std::size_t need = static_cast<std::size_t>(o.seq + 1);
  if (tokens.size() < 2 * need) {
    throw Error(Errc::bad_config, "the data has " + std::to_string(tokens.size()) + " tokens, too few for sequences of " +
                                      std::to_string(o.seq) + " (+1) with a validation split; give more data or a "
                                      "smaller --seq");
  }
  // The last tenth (at least one sequence) is the validation split.
  const std::size_t val = std::max(need, tokens.size() / 10);
  in.val = std::make_shared<const std::vector<std::uint16_t>>(tokens.end() - static_cast<std::ptrdiff_t>(val), tokens.end());
  tokens.resize(tokens.size() - val);
  in.train = std::make_shared<const std::vector<std::uint16_t>>(std::move(tokens));
  if (!o.init.empty()) in.init = gpt2::read_model(o.init, o.config);
  if (!o.save.empty()) {
    // Writable where the file will go: a probe beside it (the real write is atomic).
    fs::path target = fs::absolute(o.save);
    fs::path probe = target.parent_path() / (".gpt2-train-probe-" + std::to_string(::getpid()));
    std::ofstream f(probe);
    if (!f) {
      throw Error(Errc::io, "cannot write --save " + o.save + ": the folder " + target.parent_path().string() +
                                " does not exist or is not writable");
    }
    f.close();
    std::error_code ec;
    fs::remove(probe, ec);
  }
  return in;
}

std::string json_number(double v) {
  if (!std::isfinite(v)) return "null";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

// Greedy completion of `prompt` up to a newline, on the whole model in this process.
std::string complete(gpt2::Gpt2& model, const std::string& prompt, int max_new) {
  std::vector<std::int32_t> tokens(prompt.begin(), prompt.end());
  std::string out;
  const auto V = static_cast<std::size_t>(model.config().vocab);
  for (int i = 0; i < max_new && static_cast<std::int64_t>(tokens.size()) < model.config().context; ++i) {
    model.forward(tokens, {}, 1, tokens.size());
    auto logits = model.activations().logits();
    auto last = logits.subspan((tokens.size() - 1) * V, V);
    auto next = static_cast<std::int32_t>(std::max_element(last.begin(), last.end()) - last.begin());
    if (next == '\n') break;
    out += static_cast<char>(next);
    tokens.push_back(next);
  }
  return out;
}

struct Run {
  train::TrainOptions o;
  transport::LaunchEnv env;
  Inputs in;
  metrics::Timeline* timeline = nullptr;
};

Task<int> run(Runtime& rt, Run& r) {
  const auto& o = r.o;
  transport::ProcessGroupOptions po;
  auto pg = co_await transport::ProcessGroup::create(rt, r.env, po);
  const int rank = pg->rank(), world = pg->size();

  gpt2::Gpt2Units model(o.config, o.seed);
  fsdp::Options fo;
  fo.strategy = o.strategy;
  fo.shard_group_size = o.shard_group;
  fo.prefetch.forward = o.forward_prefetch;
  fo.prefetch.backward = o.backward_prefetch;
  fo.mixed_precision.param = o.param_dtype;
  fo.optimizer = fsdp::AdamW{{.lr = o.lr, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = o.weight_decay}};
  if (o.clip > 0) fo.clip = fsdp::Clip{o.clip, 2.0};
  if (o.offload) fo.offload.params = fo.offload.grads = fo.offload.optimizer = true;
  // Micro-batch gradients add up: divide by their number as well as by the ranks.
  if (o.grad_accum > 1) fo.gradient_divide_factor = static_cast<double>(world) * o.grad_accum;
  auto engine = co_await fsdp::Engine::create(rt, *pg, model.units(), fo);
  if (r.in.init) co_await engine->load_full_state_dict(*r.in.init);

  gpt2::LoaderOptions lo;
  lo.batch = static_cast<std::size_t>(o.batch);
  lo.seq_len = static_cast<std::size_t>(o.seq);
  lo.rank = rank;
  lo.world = world;
  lo.shuffle = o.shuffle;
  lo.seed = o.seed;
  gpt2::DataLoader loader(r.in.train, lo);
  gpt2::LoaderOptions vo = lo;
  vo.shuffle = false;
  gpt2::DataLoader val_loader(r.in.val, vo);

  std::FILE* log = nullptr;
  if (rank == 0 && !o.log_json.empty()) {
    log = o.log_json == "-" ? stdout : std::fopen(o.log_json.c_str(), "w");
    if (!log) throw Error(Errc::io, "cannot open --log-json " + o.log_json + " for writing");
  }
  auto& tel = rt.telemetry();
  static constexpr double kStepBuckets[] = {0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
  Histogram& step_hist = tel.histogram("coshard_step_duration_seconds", "Wall time of one optimizer step", {}, kStepBuckets);
  Counter& tokens_total = tel.counter("coshard_tokens_total", "Training tokens processed by this rank", {});
  Gauge& loss_gauge = tel.gauge("coshard_loss", "Training loss of the last step (mean over ranks)", {});

  Stream& compute = rt.stream("compute");
  Tensor scalar = Tensor::empty(rt.allocator(), DType::f32, {1});
  auto mean_over_ranks = [&](float v) -> Task<float> {
    scalar.data_as<float>()[0] = v;
    co_await pg->world().all_reduce(scalar, transport::Reduction::avg(), compute);
    co_return scalar.data_as<float>()[0];
  };
  auto forward_backward = [&](const gpt2::Batch& b, bool sync, bool last) -> Task<float> {
    engine->set_requires_gradient_sync(sync);
    engine->set_is_last_backward(last);
    model.set_batch(b.inputs, b.targets, b.B, b.T);
    co_await model.forward(*engine);
    co_await model.backward(*engine);
    co_await engine->compute_event();
    co_return model.loss();
  };

  train::Progress progress(o.steps, rank == 0);
  const double tokens_per_step = static_cast<double>(world) * o.grad_accum * o.batch * o.seq;
  auto before = engine->comm_stats();
  const auto t_start = Clock::now();
  float first_loss = NAN, loss = NAN;
  for (int step = 0; step < o.steps; ++step) {
    // The timeline keeps the last --trace-steps steps: enough to see the overlap, small enough to draw.
    if (r.timeline && step == std::max(0, o.steps - o.trace_steps)) r.timeline->clear();
    const auto t0 = Clock::now();
    const double lr = train::learning_rate(o, step);
    engine->set_learning_rate(lr);
    float local = 0;
    for (int m = 0; m < o.grad_accum; ++m) {
      const bool last = m + 1 == o.grad_accum;
      local += co_await forward_backward(loader.next(), last, last) / static_cast<float>(o.grad_accum);
    }
    co_await engine->optimizer_step();
    loss = co_await mean_over_ranks(local);
    if (step == 0) first_loss = loss;
    const double step_s = std::chrono::duration<double>(Clock::now() - t0).count();
    const auto stats = engine->comm_stats();
    const double exposed = stats.exposed_seconds - before.exposed_seconds;
    before = stats;
    step_hist.observe(step_s);
    tokens_total.add(tokens_per_step / world);
    loss_gauge.set(loss);
    double val = NAN;
    if (o.eval_every > 0 && ((step + 1) % o.eval_every == 0 || step + 1 == o.steps)) {
      model.set_batch(val_loader.batch(0).inputs, val_loader.batch(0).targets, lo.batch, lo.seq_len);
      co_await model.forward(*engine);
      co_await engine->finish_backward();  // releases what forward left unsharded
      co_await engine->compute_event();
      val = co_await mean_over_ranks(model.loss());
    }
    const auto peak = rt.allocator().stats().peak_allocated_bytes;
    progress.step(step + 1, loss, tokens_per_step / step_s, exposed / step_s, val);
    if (log) {
      std::fprintf(log,
                   "{\"step\":%d,\"loss\":%s,\"val_loss\":%s,\"lr\":%s,\"tokens_per_s\":%s,\"step_s\":%s,"
                   "\"exposed_comm_s\":%s,\"overlap_ratio\":%s,\"peak_mem_bytes\":%zu}\n",
                   step + 1, json_number(loss).c_str(), json_number(val).c_str(), json_number(lr).c_str(),
                   json_number(tokens_per_step / step_s).c_str(), json_number(step_s).c_str(),
                   json_number(exposed).c_str(), json_number(stats.overlap_ratio()).c_str(), peak);
      std::fflush(log);
    }
  }
  progress.done();
  const double total_s = std::chrono::duration<double>(Clock::now() - t_start).count();
  if (log && log != stdout) std::fclose(log);

  // The trained model: saved, and sampled on rank 0.
  const bool want_samples = r.in.corpus && o.samples > 0;
  if (!o.save.empty() || want_samples) {
    auto state = co_await engine->full_state_dict(true);
    if (rank == 0) {
      if (!o.save.empty()) {
        gpt2::save_state_dict(o.save, o.config, state);
        std::printf("saved the model to %s\n", o.save.c_str());
      }
      if (want_samples) {
        gpt2::Gpt2 full(o.config, o.seed);
        for (std::size_t i = 0; i < full.params().size(); ++i) {
          const auto& name = full.params().infos()[i].name;
          auto dst = full.params().at(i);
          const auto& src = state.at(name);
          std::copy(src.begin(), src.end(), dst.begin());
        }
        int right = 0;
        std::string shown;
        const auto probes = r.in.corpus->probes(static_cast<std::size_t>(o.samples));
        for (std::size_t i = 0; i < probes.size(); ++i) {
          const auto got = complete(full, probes[i].prompt(), 4);
          const bool ok = got == probes[i].answer();
          right += ok ? 1 : 0;
          if (i < 6) shown += "  " + probes[i].prompt() + got + (ok ? "   right" : "   wrong (" + probes[i].answer() + ")") + "\n";
        }
        std::printf("samples: %d of %zu completions right\n%s", right, probes.size(), shown.c_str());
      }
    }
  }
  if (rank == 0) {
    std::printf("trained %d steps in %.1f s: loss %.4f -> %.4f, %d rank(s), %s\n", o.steps, total_s, first_loss, loss,
                world, std::string(fsdp::to_string(o.strategy)).c_str());
    std::fflush(stdout);
  }
  // The timeline: each rank writes its part, rank 0 merges them once everyone has.
  if (r.timeline) r.timeline->write(o.trace + ".rank" + std::to_string(rank));
  co_await pg->finish();
  if (r.timeline && rank == 0) {
    std::vector<std::string> parts;
    for (int q = 0; q < world; ++q) parts.push_back(o.trace + ".rank" + std::to_string(q));
    const auto spans = metrics::merge_trace_files(parts, o.trace);
    for (const auto& p : parts) fs::remove(p);
    std::printf("timeline: %zu spans of %d rank(s) in %s (open in https://ui.perfetto.dev or chrome://tracing)\n",
                spans, world, o.trace.c_str());
  }
  co_return 0;
}

}  // namespace

int main(int argc, char** argv) {
  auto parsed = train::parse_train_options(argc, argv);
  if (!parsed.options) {
    std::fprintf(parsed.exit_code == 0 ? stdout : stderr, "%s\n", parsed.message.c_str());
    return parsed.exit_code;
  }
  auto env = transport::resolve_launch_env(transport::process_env());
  if (!env) {
    std::fprintf(stderr, "gpt2-train: %s\n", env.error().what());
    return 2;
  }
  const auto& e = env.value();
  Run r{*parsed.options, e, {}, nullptr};
  try {
    r.in = prepare(r.o);
    std::unique_ptr<metrics::Timeline> timeline;
    if (!r.o.trace.empty()) timeline = std::make_unique<metrics::Timeline>();
    r.timeline = timeline.get();
    metrics::RankMetrics m({.rank = e.rank,
                            .local_rank = e.local_rank,
                            .port = static_cast<std::uint16_t>(r.o.metrics_port),
                            .bind_address = r.o.metrics_bind,
                            .timeline = timeline.get()});
    m.start();
    std::printf("rank %d of %d: metrics at %s\n", e.rank, e.world_size, m.url().c_str());
    std::fflush(stdout);
    int rc = 0;
    {
      Runtime rt({.name = "gpt2-train", .rank = e.rank, .telemetry = &m.telemetry()});
      rc = rt.scheduler().sync_wait(run(rt, r));
      m.update(rt.allocator());
    }
    if (r.o.metrics_linger > 0) std::this_thread::sleep_for(std::chrono::duration<double>(r.o.metrics_linger));
    m.stop();
    return rc;
  } catch (const std::exception& ex) {
    std::fprintf(stderr, "gpt2-train: rank %d: %s\n", e.rank, ex.what());
    return 1;
  }
}
