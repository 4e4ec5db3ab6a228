#pragma once
// One rank's job as main() hands it to the training coroutine: the flags, where the rank sits in
// the launch, and the inputs checked before the first step.
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "checkpoints.hpp"
#include "corpus.hpp"
#include "coshard/gpt2/safetensors.hpp"
#include "coshard/gpt2/tokenizer.hpp"
#include "coshard/metrics/timeline.hpp"
#include "coshard/launch/launch_env.hpp"
#include "coshard/launch/stop_signal.hpp"
#include "train_options.hpp"

namespace coshard::train {

struct Inputs {
  std::shared_ptr<const gpt2::Tokens> train, val;
  std::unique_ptr<AdditionCorpus> corpus;  // the embedded default
  std::optional<StateDict> init;
  std::optional<gpt2::Tokenizer> tokenizer;  // decodes samples of --data: --tokenizer, or bytes for vocab 256
  DataIdentity data_id;  // what the checkpoints record and the ranks compare (agreement.hpp)
};

struct Job {
  TrainOptions o;
  launch::LaunchEnv env;
  Inputs in;
  metrics::Timeline* timeline = nullptr;  // null without --trace
  std::unique_ptr<CheckpointDir> checkpoints;  // --checkpoint-dir (locked by rank 0)
  std::optional<std::filesystem::path> resume;  // the checkpoint --resume names, if any
  const launch::StopSignal* stop = nullptr;  // SIGUSR2: stop after a checkpoint (with --checkpoint-dir)
  double memory_counted = 0;  // bytes a rank needs at least, as check_memory counted them
};

}  // namespace coshard::train
