#pragma once
// gpt2-train's command line: every flag, its default, and the checks that need no other rank.
// (The trainer trains GPT-2 and Llama; its name is the first family's.)
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "coshard/fsdp/options.hpp"
#include "model.hpp"

namespace coshard::train {

struct TrainOptions {
  std::string model = "tiny";
  ModelConfig config;
  std::string data;  // empty: the embedded corpus
  std::string val_data;      // validation tokens (--eval-every); empty: none, or --val-fraction
  double val_fraction = 0;   // the last fraction of --data held out for validation (0: none)
  int steps = 800;
  int batch = 8;     // sequences per rank per micro-batch
  int seq = 64;
  int grad_accum = 1;
  int global_batch = 0;  // sequences per step over every rank; sets grad_accum (fit_global_batch)
  double lr = 3e-3;
  std::string lr_schedule = "constant";  // constant | cosine
  int warmup_steps = 0;
  double weight_decay = 0.0;
  double clip = 1.0;  // 0: off
  std::uint64_t seed = 1337;
  bool shuffle = false;
  fsdp::Strategy strategy = fsdp::Strategy::full_shard;
  int shard_group = 0;
  int forward_prefetch = 1;
  fsdp::BackwardPrefetch backward_prefetch = fsdp::BackwardPrefetch::pre;
  DType param_dtype = DType::f32;
  bool f32_compute = false;  // bf16: the units read an f32 copy (Compute::f32) instead of bf16
  bool offload = false;
  double collective_timeout = 300;  // seconds a collective may wait for its peers
  double rendezvous_timeout = 120;  // seconds to reach the store and for every rank to arrive
  int stream_jitter_us = 0;         // fault injection: random delay before each stream work item
  std::string device = "cpu";       // cpu | cpu-discrete (Runtime::Options::discrete_memory) | cuda
  bool skip_memory_check = false;   // --no-memory-check: start even where check_memory says it cannot fit
  int threads = 0;                  // BLAS threads per rank; 0: ops::threads_per_rank(ranks on this host)
  std::string init;
  std::string save;
  std::string save_hf;    // a Hugging Face model directory (config.json + model.safetensors)
  std::string tokenizer;  // tokenizer.json that decodes the samples of --data
  int eval_every = 0;
  int metrics_port = 9400;
  std::string metrics_bind = "127.0.0.1";
  std::string trace;
  int trace_steps = 4;  // the timeline holds the last N steps
  std::string log_json;
  int samples = 16;
  double metrics_linger = 0;  // seconds the endpoint stays up after training
  std::string checkpoint_dir;   // sharded checkpoints: DIR/step-NNNNNNNN and DIR/latest
  int checkpoint_every = 0;     // steps between checkpoints (0: only with --checkpoint-dir, at the end)
  int checkpoint_keep = 3;      // complete checkpoints kept
  bool checkpoint_async = true;  // written while training goes on
  std::string resume;           // "auto" (latest under --checkpoint-dir, if any) or a checkpoint directory
};

struct ParseResult {
  std::optional<TrainOptions> options;  // empty: exit with `exit_code` (help, or a usage error)
  int exit_code = 0;
  std::string message;  // what to print (help text, or the usage error naming the flag)
};

ParseResult parse_train_options(int argc, char** argv);

// With --global-batch G: sets grad_accum to G / (world x batch), so that a job that goes on at
// another world size (coshard-run --nnodes MIN:MAX) keeps its global batch, and with it its data
// and losses. Returns the error, naming the flags, when G is not a multiple of world x batch.
std::string fit_global_batch(TrainOptions& o, int world);

// The learning rate of `step` (0-based): linear warmup, then constant or cosine to 10% at the end.
double learning_rate(const TrainOptions& o, int step);

}  // namespace coshard::train
