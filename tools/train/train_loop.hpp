#pragma once
// The optimizer steps: micro-batches with gradient accumulation, validation, the step's metrics,
// rank 0's progress line and its --log-json records.
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <optional>
#include <utility>

#include "coshard/fsdp/engine.hpp"
#include "coshard/gpt2/data.hpp"
#include "model.hpp"
#include "coshard/runtime/runtime.hpp"
#include "coshard/transport/process_group.hpp"
#include "job.hpp"
#include "progress.hpp"

namespace coshard::train {

// What one step reports (the progress line, the JSON log).
struct StepRecord {
  int step = 0;  // 1-based
  float loss = NAN;
  double val = NAN;  // NAN: no validation this step
  double lr = 0;
  double step_s = 0;
  double tokens_per_s = 0;
  double exposed = 0;  // seconds the compute stream waited on communication
  double overlap = 0;
  std::size_t peak = 0;  // the allocator's peak since the start
  std::size_t state_bytes = 0;  // the engine's sharded state on the device (memory_report)
  std::size_t pool_bytes = 0;   // what its pools hold: unsharded parameters, gradients, temporaries
};

// Rank 0's --log-json: one JSON object per step, to a file or stdout. Closed by close() or at
// destruction; stdout stays open. A run resumed after `first_step` steps keeps the file's records
// of steps up to it and appends: a restart must not erase the history before its checkpoint.
class StepLog {
 public:
  StepLog(const TrainOptions& o, int rank, int first_step);
  ~StepLog();
  StepLog(const StepLog&) = delete;
  StepLog& operator=(const StepLog&) = delete;

  void write(const StepRecord& r);
  void close();

 private:
  std::FILE* f_ = nullptr;
  std::string path_;
  bool said_failed_ = false;  // said that a write failed
};

// The step's Prometheus series.
struct StepMetrics {
  Histogram& step_seconds;
  Counter& tokens;
  Gauge& loss;
};

struct TrainSummary {
  float first_loss = NAN, loss = NAN;
  double seconds = 0;
  std::optional<int> stopped_after;  // the step after which a stop request (SIGUSR2) ended the run
};

// What every rank agrees on at the end of a step.
struct StepEnd {
  float loss = NAN;   // the mean over ranks
  bool stop = false;  // some rank was asked to stop (launch::StopSignal)
};

// Loads the checkpoint --resume names into the engine (collective), checks that every rank
// resumed at the same step, and returns it: 0 without one.
Task<int> resume(Runtime& rt, Job& job, fsdp::Engine& engine, transport::ProcessGroup& pg);

class TrainLoop {
 public:
  TrainLoop(Runtime& rt, Job& job, transport::ProcessGroup& pg, Units& model, fsdp::Engine& engine,
            int first_step);

  // The whole run; the JSON log is complete when it returns.
  Task<TrainSummary> run();
  // The least and the most resident memory (MiB) that any rank peaked at so far, in one all-reduce.
  Task<std::pair<float, float>> peak_memory_over_ranks();

 private:
  // One optimizer step.
  Task<StepEnd> train_step(int step);
  Task<float> micro_batches();
  Task<float> forward_backward(gpt2::Batch b, bool sync, bool last);
  Task<float> validation_loss();
  // The means over ranks of `v` and of `flag` (0 or 1; more than 0 when any rank's is 1), in one
  // all-reduce.
  Task<std::pair<float, float>> mean_over_ranks(float v, float flag);
  bool validation_due(int step) const;
  // After `steps_done` steps: finishes the previous save, and saves when one is due or `now`.
  Task<void> checkpoint(int steps_done, bool now);
  Task<void> finish_checkpoint();
  Task<void> diverged(int step, float loss);

  Runtime& rt_;
  const TrainOptions& o_;
  const DataIdentity& data_id_;  // recorded in each checkpoint
  metrics::Timeline* timeline_;
  transport::ProcessGroup& pg_;
  Units& model_;
  fsdp::Engine& engine_;
  gpt2::DataLoader loader_;
  std::optional<gpt2::DataLoader> val_loader_;  // with --val-data or --val-fraction
  StepLog log_;
  StepMetrics metrics_;
  Stream& compute_;
  Tensor scalars_;  // the all-reduced loss and stop flag
  Progress progress_;
  const double tokens_per_step_;
  fsdp::CommStats before_;  // at the end of the previous step
  const int first_step_;
  CheckpointDir* checkpoints_;
  const launch::StopSignal* stop_;  // null: no stop requests (no --checkpoint-dir)
  std::optional<int> saving_;  // the step of a checkpoint written or being written, not committed yet
};

}  // namespace coshard::train
