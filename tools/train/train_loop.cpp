#include "train_loop.hpp"

#include <sys/resource.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstring>
#include <exception>
#include <filesystem>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <utility>

#include "checkpoints.hpp"
#include "coshard/runtime/copy.hpp"
#include "coshard/transport/gather_integers.hpp"
#include "coshard/runtime/error.hpp"
#include "coshard/runtime/file_io.hpp"

namespace coshard::train {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::string json_number(double v) {
  if (!std::isfinite(v)) return "null";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9g", v);  // enough digits to compare runs at 1e-7
  return buf;
}

gpt2::LoaderOptions loader_options(const TrainOptions& o, int rank, int world, bool shuffle) {
  gpt2::LoaderOptions lo;
  lo.batch = static_cast<std::size_t>(o.batch);
  lo.seq_len = static_cast<std::size_t>(o.seq);
  lo.rank = rank;
  lo.world = world;
  lo.shuffle = shuffle;
  lo.seed = o.seed;
  return lo;
}

StepMetrics step_metrics(Telemetry& tel) {
  static constexpr double kStepBuckets[] = {0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
  return {tel.histogram("coshard_step_duration_seconds", "Wall time of one optimizer step", {}, kStepBuckets),
          tel.counter("coshard_tokens_total", "Training tokens processed by this rank", {}),
          tel.gauge("coshard_loss", "Training loss of the last step (mean over ranks)", {})};
}

}  // namespace

StepLog::StepLog(const TrainOptions& o, int rank, int first_step) : path_(o.log_json) {
  if (rank != 0 || o.log_json.empty()) return;
  if (o.log_json == "-") {
    f_ = stdout;
    return;
  }
  std::error_code ec;
  if (first_step > 0 && std::filesystem::exists(o.log_json, ec)) {
    // The records of steps after the checkpoint were trained again by this run: they go. So does
    // a record cut short (a full disk, a kill mid-write), which would stay glued to the next.
    std::string kept;
    std::istringstream in(read_text(o.log_json));
    for (std::string line; std::getline(in, line);) {
      int step = 0;
      const char* at = line.c_str() + std::min<std::size_t>(line.size(), 8);
      if (line.rfind("{\"step\":", 0) == 0 && std::from_chars(at, line.c_str() + line.size(), step).ec == std::errc() &&
          step <= first_step && nlohmann::json::accept(line)) {
        kept += line + "\n";
      }
    }
    write_atomic(o.log_json, kept);
  }
  f_ = std::fopen(o.log_json.c_str(), first_step > 0 ? "a" : "w");
  if (!f_) throw Error(Errc::io, "cannot open --log-json " + o.log_json + " for writing: " + std::strerror(errno));
}

StepLog::~StepLog() { close(); }

void StepLog::write(const StepRecord& r) {
  if (!f_) return;
  std::fprintf(f_,
               "{\"step\":%d,\"loss\":%s,\"val_loss\":%s,\"lr\":%s,\"tokens_per_s\":%s,\"step_s\":%s,"
               "\"exposed_comm_s\":%s,\"overlap_ratio\":%s,\"peak_mem_bytes\":%zu,\"state_bytes\":%zu,"
               "\"pool_bytes\":%zu}\n",
               r.step, json_number(r.loss).c_str(), json_number(r.val).c_str(), json_number(r.lr).c_str(),
               json_number(r.tokens_per_s).c_str(), json_number(r.step_s).c_str(), json_number(r.exposed).c_str(),
               json_number(r.overlap).c_str(), r.peak, r.state_bytes, r.pool_bytes);
  if (std::fflush(f_) != 0 && !said_failed_) {
    // Not worth ending a training run for (its checkpoints are what it keeps), but said.
    said_failed_ = true;
    std::fprintf(stderr, "gpt2-train: warning: writing --log-json %s failed (%s); records from step %d on are lost\n",
                 path_.c_str(), std::strerror(errno), r.step);
  }
}

void StepLog::close() {
  if (f_ && f_ != stdout) std::fclose(f_);
  f_ = nullptr;
}

namespace {

// What each rank found to resume, for the error when they differ: "step 8 on rank(s) 0, 2; none
// on rank(s) 1, 3".
std::string found_by_rank(const std::vector<std::int64_t>& steps) {
  std::map<std::int64_t, std::string> ranks;
  for (std::size_t r = 0; r < steps.size(); ++r) {
    std::string& list = ranks[steps[r]];
    list += (list.empty() ? "" : ", ") + std::to_string(r);
  }
  std::string out;
  for (const auto& [step, list] : ranks) {
    out += (out.empty() ? "" : "; ") + (step < 0 ? std::string("none") : "step " + std::to_string(step)) + " on rank(s) " + list;
  }
  return out;
}

}  // namespace

Task<int> resume(Runtime& rt, Job& job, fsdp::Engine& engine, transport::ProcessGroup& pg) {
  // Every rank chose its checkpoint itself, and a file system may show ranks different ones, or
  // none (a directory local to each host): agree before the load, whose collectives would wait
  // for ranks that load nothing. -1: none; -2: this rank cannot read the one it found.
  const std::string where = job.resume ? job.resume->string() : "none";
  std::int64_t mine = -1;
  std::exception_ptr unreadable;
  if (job.resume) {
    try {
      const fsdp::Manifest m = fsdp::read_manifest(*job.resume);
      mine = stored_step(m.metadata, where);
      check_step_counts(m, static_cast<int>(mine), where);
    } catch (...) {
      unreadable = std::current_exception();
      mine = -2;
    }
  }
  std::vector<std::int64_t> own{mine};
  const std::vector<std::int64_t> steps =
      co_await transport::gather_integers(pg.world(), rt.stream("compute"), rt.allocator(), std::move(own));
  if (unreadable) std::rethrow_exception(unreadable);
  if (const auto bad = std::find(steps.begin(), steps.end(), -2); bad != steps.end()) {
    throw Error(Errc::corrupt_file, "rank " + std::to_string(bad - steps.begin()) +
                                        " cannot read the checkpoint it would resume (its error says why)");
  }
  if (std::adjacent_find(steps.begin(), steps.end(), std::not_equal_to<>()) != steps.end()) {
    throw Error(Errc::bad_config, "the ranks found different checkpoints to resume (" + found_by_rank(steps) +
                                      "; this rank: " + where + "): every rank must see the same --checkpoint-dir, "
                                      "on several hosts a directory of a file system they share");
  }
  if (!job.resume) co_return 0;
  const auto state = co_await engine.load_sharded(where);
  const int step = resume_step(state, job.o, job.in.data_id, pg.size(), where);
  if (pg.rank() == 0) {
    std::printf("resumed from %s at step %d of %d%s\n", where.c_str(), step, job.o.steps,
                job.env.restart_count > 0 ? (" after restart " + std::to_string(job.env.restart_count)).c_str() : "");
    std::fflush(stdout);
  }
  co_return step;
}

TrainLoop::TrainLoop(Runtime& rt, Job& job, transport::ProcessGroup& pg, Units& model, fsdp::Engine& engine,
                     int first_step)
    : rt_(rt),
      o_(job.o),
      data_id_(job.in.data_id),
      timeline_(job.timeline),
      pg_(pg),
      model_(model),
      engine_(engine),
      loader_(job.in.train, loader_options(job.o, pg.rank(), pg.size(), job.o.shuffle)),
      log_(job.o, pg.rank(), first_step),
      metrics_(step_metrics(rt.telemetry())),
      compute_(rt.stream("compute")),
      scalars_(Tensor::empty(rt.allocator(), DType::f32, {2})),
      progress_(job.o.steps, pg.rank() == 0),
      tokens_per_step_(static_cast<double>(pg.size()) * job.o.grad_accum * job.o.batch * job.o.seq),
      before_(engine.comm_stats()),
      first_step_(first_step),
      checkpoints_(job.checkpoints.get()),
      stop_(job.stop) {
  loader_.set_step(static_cast<std::int64_t>(first_step) * job.o.grad_accum);
  if (job.in.val) val_loader_.emplace(job.in.val, loader_options(job.o, pg.rank(), pg.size(), false));
}

Task<TrainSummary> TrainLoop::run() {
  TrainSummary s;
  const auto start = Clock::now();
  for (int step = first_step_; step < o_.steps; ++step) {
    // The timeline keeps the last --trace-steps steps: enough to see the overlap, small enough to draw.
    if (timeline_ && step == std::max(0, o_.steps - o_.trace_steps)) timeline_->clear();
    const StepEnd end = co_await train_step(step);
    if (!std::isfinite(end.loss)) co_await diverged(step, end.loss);
    s.loss = end.loss;
    if (step == first_step_) s.first_loss = s.loss;
    co_await checkpoint(step + 1, end.stop);
    if (end.stop && step + 1 < o_.steps) {
      s.stopped_after = step + 1;
      break;
    }
  }
  co_await finish_checkpoint();
  progress_.done();
  s.seconds = seconds_since(start);
  log_.close();
  co_return s;
}

Task<StepEnd> TrainLoop::train_step(int step) {
  const auto t0 = Clock::now();
  StepRecord r;
  r.step = step + 1;
  r.lr = learning_rate(o_, step);
  engine_.set_learning_rate(r.lr);
  const float local = co_await micro_batches();
  co_await engine_.optimizer_step();
  const auto [loss, stop] = co_await mean_over_ranks(local, stop_ && stop_->requested() ? 1.0f : 0.0f);
  r.loss = loss;
  r.step_s = seconds_since(t0);
  r.tokens_per_s = tokens_per_step_ / r.step_s;
  const auto stats = engine_.comm_stats();
  r.exposed = stats.exposed_seconds - before_.exposed_seconds;
  r.overlap = stats.overlap_ratio();
  before_ = stats;
  metrics_.step_seconds.observe(r.step_s);
  metrics_.tokens.add(tokens_per_step_ / pg_.size());
  metrics_.loss.set(r.loss);
  if (validation_due(step)) r.val = co_await validation_loss();
  r.peak = rt_.allocator().stats().peak_allocated_bytes;
  const auto memory = engine_.memory_report();
  r.state_bytes = memory.sharded_state_bytes;
  r.pool_bytes = memory.pool_bytes;
  progress_.step(r.step, r.loss, r.tokens_per_s, r.exposed / r.step_s, r.val);
  log_.write(r);
  co_return StepEnd{.loss = r.loss, .stop = stop > 0};
}

// The local loss of the step's micro-batches; only the last one reduces gradients (no_sync).
Task<float> TrainLoop::micro_batches() {
  float local = 0;
  for (int m = 0; m < o_.grad_accum; ++m) {
    const bool last = m + 1 == o_.grad_accum;
    local += co_await forward_backward(loader_.next(), last, last) / static_cast<float>(o_.grad_accum);
  }
  co_return local;
}

Task<float> TrainLoop::forward_backward(gpt2::Batch b, bool sync, bool last) {
  engine_.set_requires_gradient_sync(sync);
  engine_.set_is_last_backward(last);
  model_.set_batch(std::move(b.inputs), std::move(b.targets), b.B, b.T);
  co_await engine_.forward();
  co_await engine_.backward();
  co_return co_await model_.loss();
}

Task<void> TrainLoop::checkpoint(int steps_done, bool now) {
  if (!checkpoints_) co_return;
  co_await finish_checkpoint();  // usually finished already, by this step's optimizer_step
  const bool due =
      now || steps_done == o_.steps || (o_.checkpoint_every > 0 && steps_done % o_.checkpoint_every == 0);
  if (!due) co_return;
  const std::string dir = checkpoints_->step_dir(steps_done).string();
  const auto state = training_state(o_, data_id_, pg_.size(), steps_done);
  saving_ = steps_done;
  // Committed (DIR/latest, --checkpoint-keep's rotation) once the next step's loss is finite: see diverged().
  if (o_.checkpoint_async) {
    co_await engine_.save_sharded_async(dir, state);
  } else {
    co_await engine_.save_sharded(dir, state);
  }
}

// The loss of `step` (0-based) is not finite. It is the same mean on every rank, so all of them
// end here. The weights that gave it are those checkpoint(step) saved, not committed yet: resuming
// from them would diverge again, and the rotation would have dropped a good checkpoint for them.
Task<void> TrainLoop::diverged(int step, float loss) {
  std::string removed;
  if (saving_ && *saving_ == step) {
    saving_.reset();
    co_await engine_.wait_for_checkpoint();  // every rank's file is written once the manifest is
    const std::string name = checkpoints_->step_dir(step).filename().string();
    float failed = 0;
    if (pg_.rank() == 0) {
      try {
        checkpoints_->discard(step);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "gpt2-train: removing %s failed: %s\n", name.c_str(), e.what());
        failed = 1;
      }
    }
    // Every rank says the same, once rank 0 is done: none exits while the removal runs.
    const bool removed_it = (co_await mean_over_ranks(failed, 0)).first == 0;
    removed = removed_it ? "; the checkpoint of the weights that gave it, " + name +
                               ", is removed, so --resume auto restarts from an older one"
                         : "; removing the checkpoint of the weights that gave it, " + name +
                               ", failed (rank 0 says why): remove it before --resume auto";
  }
  throw Error(Errc::invalid_argument,
              "step " + std::to_string(step + 1) + ": the training loss (mean over ranks) is " +
                  (std::isnan(loss) ? "nan" : loss > 0 ? "inf" : "-inf") +
                  ": training diverged, and --save is not written" + removed +
                  ". Lower --lr, raise --warmup-steps, or clip gradients (--clip)");
}

Task<void> TrainLoop::finish_checkpoint() {
  if (!saving_) co_return;
  co_await engine_.wait_for_checkpoint();
  if (pg_.rank() == 0) checkpoints_->commit(*saving_, o_.checkpoint_keep);
  saving_.reset();
}

bool TrainLoop::validation_due(int step) const {
  return o_.eval_every > 0 && ((step + 1) % o_.eval_every == 0 || step + 1 == o_.steps);
}

Task<float> TrainLoop::validation_loss() {
  auto b = val_loader_->batch(0);  // --eval-every is refused without validation data
  model_.set_batch(std::move(b.inputs), std::move(b.targets), b.B, b.T);
  co_await engine_.forward();
  co_await engine_.finish_backward();  // releases what forward left unsharded
  const float local = co_await model_.loss();
  co_return (co_await mean_over_ranks(local, 0)).first;
}

Task<std::pair<float, float>> TrainLoop::peak_memory_over_ranks() {
  rusage usage{};
  ::getrusage(RUSAGE_SELF, &usage);
  const float mib = static_cast<float>(usage.ru_maxrss) / 1024.0f;  // Linux counts it in KiB
  upload(compute_, scalars_, std::vector<float>{mib, -mib});
  compute_.wait(pg_.world().all_reduce(scalars_, transport::Reduction::max(), compute_));
  const std::vector<float> most = co_await download<float>(compute_, scalars_);
  co_return std::pair{-most[1], most[0]};
}

Task<std::pair<float, float>> TrainLoop::mean_over_ranks(float v, float flag) {
  upload(compute_, scalars_, std::vector<float>{v, flag});
  compute_.wait(pg_.world().all_reduce(scalars_, transport::Reduction::avg(), compute_));
  const std::vector<float> means = co_await download<float>(compute_, scalars_);
  co_return std::pair{means[0], means[1]};
}

}  // namespace coshard::train
