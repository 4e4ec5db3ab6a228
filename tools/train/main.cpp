// gpt2-train: GPT-2 on coshard's FSDP engine. One process per rank (coshard-run, torchrun-style
// environments, mpirun, srun; alone: one rank). Every check that can fail on a user's input (flags,
// data file, --init, --save path, metrics port) runs before the first step.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>

#include "coshard/fsdp/engine.hpp"
#include "coshard/gpt2/data.hpp"
#include "coshard/gpt2/hf_dir.hpp"
#include "coshard/gpt2/safetensors.hpp"
#include "coshard/metrics/rank_metrics.hpp"
#include "coshard/metrics/timeline.hpp"
#include "coshard/ops/blas.hpp"
#include "coshard/ops/cpu.hpp"
#include "coshard/runtime/runtime.hpp"
#include "coshard/transport/diagnostics_signal.hpp"
#include "coshard/transport/process_group.hpp"
#include "agreement.hpp"
#include "job.hpp"
#include "memory_check.hpp"
#include "results.hpp"
#include "train_loop.hpp"
#include "train_options.hpp"

using namespace coshard;
namespace fs = std::filesystem;

namespace {

// The token stream: --data, or the embedded corpus (kept for the samples at the end).
gpt2::Tokens load_tokens(const train::TrainOptions& o, train::Inputs& in) {
  if (!o.data.empty()) return gpt2::read_tokens(o.data, o.config.vocab());
  if (o.config.vocab() < 256) {
    throw Error(Errc::bad_config, "the embedded corpus is byte text and needs --model vocab >= 256 (it is " +
                                      std::to_string(o.config.vocab()) + "); give --data or a larger vocab");
  }
  in.corpus = std::make_unique<train::AdditionCorpus>(o.seed);
  return in.corpus->tokens();
}

std::string data_name(const train::TrainOptions& o) { return o.data.empty() ? "the embedded corpus" : "--data " + o.data; }

// Every token is training data unless validation is asked for: --val-data names its own file,
// --val-fraction holds out the end of --data (at least one sequence).
void split_validation(gpt2::Tokens tokens, const train::TrainOptions& o, train::Inputs& in) {
  const std::size_t need = static_cast<std::size_t>(o.seq + 1);
  const auto too_few = [&](const std::string& what, std::size_t n, const std::string& fix) {
    return Error(Errc::bad_config, what + " has " + std::to_string(n) + " tokens, fewer than one sequence of --seq " +
                                       std::to_string(o.seq) + " + 1; " + fix);
  };
  in.data_id.data = (o.data.empty() ? "the embedded corpus of " : "") + train::token_identity(tokens);
  if (!o.val_data.empty()) {
    auto val = gpt2::read_tokens(o.val_data, o.config.vocab());
    in.data_id.val_data = train::token_identity(val);
    if (val.size() < need) throw too_few("--val-data " + o.val_data, val.size(), "give more data or a smaller --seq");
    in.val = std::make_shared<const gpt2::Tokens>(std::move(val));
  } else if (o.val_fraction > 0) {
    const auto val = std::max(need, static_cast<std::size_t>(static_cast<double>(tokens.size()) * o.val_fraction));
    if (tokens.size() < val + need) {
      throw too_few(data_name(o) + " less the validation split (--val-fraction)", tokens.size() - std::min(val, tokens.size()),
                    "give more data, a smaller --val-fraction or --val-data");
    }
    in.val = std::make_shared<const gpt2::Tokens>(tokens.end() - static_cast<std::ptrdiff_t>(val), tokens.end());
    tokens.resize(tokens.size() - val);
  }
  if (tokens.size() < need) throw too_few(data_name(o), tokens.size(), "give more data or a smaller --seq");
  in.train = std::make_shared<const gpt2::Tokens>(std::move(tokens));
}

// What the run trains and validates on, said once.
void describe_data(const train::TrainOptions& o, const train::Inputs& in) {
  std::string val = "no validation data";
  if (!o.val_data.empty()) val = std::to_string(in.val->size()) + " validation tokens from --val-data " + o.val_data;
  if (o.val_fraction > 0) {
    // At least one sequence is held out, so the share can exceed --val-fraction: say what it is.
    const double share = static_cast<double>(in.val->size()) / static_cast<double>(in.val->size() + in.train->size());
    val = std::to_string(in.val->size()) + " validation tokens held out (the last " +
          std::to_string(static_cast<int>(share * 100 + 0.5)) + "% of the data, --val-fraction)";
  }
  std::printf("data: %zu training tokens from %s; %s\n", in.train->size(), data_name(o).c_str(), val.c_str());
}

// Writable where the file will go, found before training rather than after it: not a directory,
// and a probe beside it named as long as the temporaries the atomic writes use (NAME.tmp.PID, the
// trace's parts NAME.rankN.tmp.PID), so a name too long for them fails here too.
void probe_output(const std::string& path, const std::string& what, bool make_parent) {
  const fs::path target = fs::absolute(path);
  std::error_code ec;
  if (make_parent) {
    fs::create_directories(target.parent_path(), ec);
    if (ec || !fs::is_directory(target.parent_path())) {
      throw Error(Errc::io, "cannot write " + what + ": cannot make the directory " + target.parent_path().string() +
                                (ec ? " (" + ec.message() + ")" : " (a file of that name exists)"));
    }
  }
  if (fs::is_directory(target, ec)) {
    throw Error(Errc::io, "cannot write " + what + ": " + target.string() + " is a directory; give a file name");
  }
  const fs::path probe = target.parent_path() / (target.filename().string() + ".rank00000.tmp." + std::to_string(::getpid()));
  std::ofstream f(probe);
  if (!f) {
    throw Error(Errc::io, "cannot write " + what + ": cannot create a file beside it (" + std::strerror(errno) +
                              "): the folder " + target.parent_path().string() +
                              " must exist and be writable, and the name short enough for the temporary " +
                              probe.filename().string());
  }
  f.close();
  fs::remove(probe, ec);
}

// Everything a user can get wrong, checked on every rank before the job starts.
train::Inputs prepare(const train::TrainOptions& o) {
  train::Inputs in;
  split_validation(load_tokens(o, in), o, in);
  if (!o.init.empty()) in.init = train::read_init(o.init, o.config);
  if (!o.tokenizer.empty()) {
    in.tokenizer = gpt2::Tokenizer::from_file(o.tokenizer);
    if (static_cast<std::int64_t>(in.tokenizer->size()) != o.config.vocab()) {
      throw Error(Errc::bad_config, "--tokenizer " + o.tokenizer + " has " + std::to_string(in.tokenizer->size()) +
                                        " tokens but the model's vocab is " + std::to_string(o.config.vocab()) +
                                        "; give --model ...,vocab=" + std::to_string(in.tokenizer->size()));
    }
  } else if (!in.corpus && o.config.vocab() == 256) {
    in.tokenizer = gpt2::Tokenizer::bytes();
  }
  if (!o.save.empty()) probe_output(o.save, "--save " + o.save, false);
  if (!o.log_json.empty() && o.log_json != "-") probe_output(o.log_json, "--log-json " + o.log_json, false);
  for (const char* file : {"config.json", "model.safetensors"}) {
    if (!o.save_hf.empty()) probe_output((fs::path(o.save_hf) / file).string(), "--save-hf " + o.save_hf, true);
  }
  if (!o.trace.empty()) probe_output(o.trace, "--trace " + o.trace, false);
  return in;
}

// Under bf16 mixed precision the units compute on the bf16 parameters where this CPU runs the bf16
// GEMM kernel. Elsewhere that path would round and widen both operands of every GEMM into f32
// copies, so they read the engine's f32 copy, made once per unshard, instead. A GPU multiplies
// bf16 natively (cuBLAS), as PyTorch FSDP's param_dtype does there.
bool bf16_compute(const train::TrainOptions& o) {
  if (o.param_dtype != DType::bf16 || o.f32_compute) return false;
  if (o.device == "cuda") return true;
  return std::string_view(ops::cpu_bf16_gemm()) == "avx512_bf16";
}

fsdp::Options engine_options(const train::TrainOptions& o, int world) {
  fsdp::Options fo;
  fo.strategy = o.strategy;
  fo.shard_group_size = o.shard_group;
  fo.prefetch.forward = o.forward_prefetch;
  fo.prefetch.backward = o.backward_prefetch;
  fo.mixed_precision.param = o.param_dtype;
  fo.optimizer = fsdp::AdamW{{.lr = o.lr, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = o.weight_decay}};
  if (o.clip > 0) fo.clip = fsdp::Clip{o.clip, 2.0};
  if (o.offload) fo.offload.params = fo.offload.grads = fo.offload.optimizer = true;
  fo.timeout = std::chrono::milliseconds(static_cast<std::int64_t>(o.collective_timeout * 1000));
  // Micro-batch gradients add up: divide by their number as well as by the ranks.
  if (o.grad_accum > 1) fo.gradient_divide_factor = static_cast<double>(world) * o.grad_accum;
  return fo;
}

Task<int> run(Runtime& rt, train::Job& job) {
  transport::ProcessGroupOptions po;
  po.world.timeout = std::chrono::milliseconds(static_cast<std::int64_t>(job.o.collective_timeout * 1000));
  po.rendezvous.timeout = std::chrono::milliseconds(static_cast<std::int64_t>(job.o.rendezvous_timeout * 1000));
  auto pg = co_await transport::ProcessGroup::create(rt, job.env, po);
  co_await train::check_same_settings(rt, *pg, train::shared_settings(job.o, job.in));
  const auto model = train::make_units(job.o.config, job.o.seed, bf16_compute(job.o));
  auto engine = co_await fsdp::Engine::create(rt, *pg, model->units(), engine_options(job.o, pg->size()));
  if (job.in.init) {
    // The whole model in float32 on every rank (500 MB for 124M): moved in, not needed again.
    co_await engine->load_full_state_dict(std::move(*job.in.init));
    job.in.init.reset();
  }
  const int first_step = co_await train::resume(rt, job, *engine, *pg);

  train::TrainLoop loop(rt, job, *pg, *model, *engine, first_step);
  const train::TrainSummary summary = co_await loop.run();
  if (summary.stopped_after) {
    if (pg->rank() == 0) {
      std::printf("stopped on request (SIGUSR2) after step %d of %d: checkpoint %s; run the job again with --resume "
                  "auto to continue (exit code %d)\n",
                  *summary.stopped_after, job.o.steps, job.checkpoints->step_dir(*summary.stopped_after).c_str(),
                  launch::StopSignal::kExitCode);
    }
    co_await train::finish_job(job, *pg);
    co_return launch::StopSignal::kExitCode;
  }
  co_await train::save_and_sample(job, *engine, pg->rank());
  const auto peaks = co_await loop.peak_memory_over_ranks();
  if (pg->rank() == 0) {
    train::print_summary(job.o, summary, pg->size(), engine->shard_group_size(), first_step);
    train::print_peak_memory(job.o, job.memory_counted, peaks);
  }
  co_await train::finish_job(job, *pg);
  co_return 0;
}

// Prepares the inputs, then trains with the metrics endpoint up (and --metrics-linger seconds
// after, for a last scrape).
// BLAS threads per rank: --threads, else OPENBLAS_NUM_THREADS, else the CPUs this process may use
// shared among the ranks on this host. Said once per host, with the element-wise kernels' ISA.
void choose_threads(const train::Job& job) {
  const char* env = std::getenv("OPENBLAS_NUM_THREADS");
  std::string why;
  if (job.o.threads > 0) {
    ops::set_blas_threads(job.o.threads);
    why = "--threads";
  } else if (env != nullptr && *env != '\0') {
    why = "OPENBLAS_NUM_THREADS";
  } else {
    ops::set_blas_threads(ops::threads_per_rank(job.env.local_world_size));
    why = "CPUs available / " + std::to_string(job.env.local_world_size) + " rank(s) on this host";
  }
  if (job.env.local_rank == 0) {
    std::printf("rank %d: %d BLAS thread(s) per rank (%s), %s element-wise kernels\n", job.env.rank,
                ops::blas_threads(), why.c_str(), ops::cpu_isa());
    if (job.o.param_dtype == DType::bf16) {
      const bool bf16 = bf16_compute(job.o);
      std::printf("rank %d: bf16 mixed precision computes %s\n", job.env.rank,
                  bf16 ? "on the bf16 parameters (avx512_bf16 GEMM kernel)"
                  : job.o.f32_compute ? "on an f32 copy of the parameters (--f32-compute)"
                                      : "on an f32 copy of the parameters (this CPU has no bf16 GEMM kernel)");
    }
  }
}

int prepare_and_run(train::Job& job) {
  transport::DiagnosticsSignal diagnostics;  // SIGUSR1 writes the flight records
  // With somewhere to save to, SIGUSR2 stops after a checkpoint. Taken first: under Slurm it reaches
  // a rank still reading its data too, whose default action would end it.
  std::optional<launch::StopSignal> stop;
  if (!job.o.checkpoint_dir.empty()) job.stop = &stop.emplace();
  // Before the data, the weights and the activations are allocated.
  job.memory_counted = train::check_memory(job.o, job.env);
  job.in = prepare(job.o);
  choose_threads(job);
  if (job.env.rank == 0) describe_data(job.o, job.in);
  if (!job.o.checkpoint_dir.empty()) {
    job.checkpoints = std::make_unique<train::CheckpointDir>(job.o.checkpoint_dir);
    if (job.env.rank == 0) job.checkpoints->lock();
  }
  job.resume = train::checkpoint_to_resume(job.o);
  std::unique_ptr<metrics::Timeline> timeline;
  if (!job.o.trace.empty()) timeline = std::make_unique<metrics::Timeline>();
  job.timeline = timeline.get();
  metrics::RankMetrics m({.rank = job.env.rank,
                          .local_rank = job.env.local_rank,
                          .port = static_cast<std::uint16_t>(job.o.metrics_port),
                          .bind_address = job.o.metrics_bind,
                          .timeline = timeline.get()});
  m.start();
  m.telemetry()
      .gauge("coshard_restarts", "Times the launcher restarted this job before this attempt (coshard-run --max-restarts)", {})
      .set(job.env.restart_count);
  m.telemetry()
      .gauge("coshard_restart_exit_code",
             "Exit code of the failure behind the latest restart (128 + the signal for a rank killed by one; 0 before any)", {})
      .set(job.env.restart_exit_code);
  m.telemetry()
      .gauge("coshard_restart_failed_rank",
             "Job rank whose failure caused the latest restart (-1 before any, or when a launcher failed)", {})
      .set(job.env.restart_failed_rank);
  std::printf("rank %d of %d: metrics at %s\n", job.env.rank, job.env.world_size, m.url().c_str());
  std::fflush(stdout);
  int rc = 0;
  {
    Runtime rt({.name = "gpt2-train",
                .rank = job.env.rank,
                .device = job.o.device == "cuda" ? Device::cuda(job.env.local_rank) : Device::cpu(),
                .telemetry = &m.telemetry(),
                .stream_jitter = std::chrono::microseconds(job.o.stream_jitter_us),
                .discrete_memory = job.o.device == "cpu-discrete"});
    auto serving = diagnostics.serve(rt);
    auto watching = m.watch(rt.allocator());  // live allocator gauges; the last figures stay served
    rc = rt.scheduler().sync_wait(run(rt, job));
  }
  // Not after a stop on request: a scheduler's pre-emption waits for exit code 75, not for a scrape.
  if (job.o.metrics_linger > 0 && rc != launch::StopSignal::kExitCode) {
    std::this_thread::sleep_for(std::chrono::duration<double>(job.o.metrics_linger));
  }
  m.stop();
  return rc;
}

}  // namespace

int main(int argc, char** argv) {
  auto parsed = train::parse_train_options(argc, argv);
  if (!parsed.options) {
    std::fprintf(parsed.exit_code == 0 ? stdout : stderr, "%s\n", parsed.message.c_str());
    return parsed.exit_code;
  }
  auto env = launch::resolve_launch_env(launch::process_env());
  if (!env) {
    std::fprintf(stderr, "gpt2-train: %s\n", env.error().what());
    return 2;
  }
  const auto& e = env.value();
  if (auto why = train::fit_global_batch(*parsed.options, e.world_size); !why.empty()) {
    std::fprintf(stderr, "%s\n", why.c_str());
    return 2;
  }
  train::Job job{*parsed.options, e, {}, nullptr, nullptr, std::nullopt};
  try {
    return prepare_and_run(job);
  } catch (const std::exception& ex) {
    std::fprintf(stderr, "gpt2-train: rank %d: %s\n", e.rank, ex.what());
    return 1;
  }
}
