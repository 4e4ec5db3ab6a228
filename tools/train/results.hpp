#pragma once
// The end of the job: the trained model saved and sampled, rank 0's summary line, and the merged
// timeline.
#include "coshard/fsdp/engine.hpp"
#include "coshard/transport/process_group.hpp"
#include "job.hpp"
#include "train_loop.hpp"

namespace coshard::train {

// Collective when there is something to do: --save, or samples of the embedded corpus; rank 0
// writes and prints.
Task<void> save_and_sample(Job& job, fsdp::Engine& engine, int rank);

void print_summary(const TrainOptions& o, const TrainSummary& s, int world, int shard_group, int first_step);

// Ends the process group; with --trace, each rank writes its part first and rank 0 merges them
// once everyone has.
Task<void> finish_job(Job& job, transport::ProcessGroup& pg);

}  // namespace coshard::train
