#pragma once
// Before any large allocation, each rank checks that the ranks on its host fit in the memory the
// host (or the job's cgroup) has left. A --batch too large for the host used to be killed mid-step
// by the kernel's OOM killer: exit 137, no word of why, sometimes other processes with it.
#include <optional>
#include <string>
#include <utility>

#include "coshard/launch/launch_env.hpp"
#include "train_options.hpp"

namespace coshard::train {

// What one rank needs, in bytes: terms that are sure to be allocated, so the sum is a lower bound
// (BLAS and attention scratch, the allocator's rounding and rank 0's copies at the end are left out).
struct MemoryNeed {
  double activations = 0;  // gpt2::Activations::bytes_for(--batch, --seq): they stay for the run
  double state = 0;        // f32 master, gradient and AdamW moments of this rank's shards
  double unsharded = 0;    // gathered units in the parameter dtype, and their f32 gradients
  double accumulators = 0;  // --grad-accum > 1: an f32 gradient of every unit, across micro-batches
  double data = 0;         // --data and --val-data, which every rank loads whole
  double total() const { return activations + state + unsharded + accumulators + data; }
  // What does not grow with --batch.
  double fixed() const { return total() - activations; }
};

MemoryNeed memory_need(const TrainOptions& o, const launch::LaunchEnv& env);

// Memory this host lets the job have: /proc/meminfo's MemAvailable, or less where the process's
// memory cgroup (v2 memory.max, v1 memory.limit_in_bytes, at any level above it) leaves less.
struct HostMemory {
  double available = 0;
  std::string from;  // "MemAvailable (/proc/meminfo)" or "the cgroup limit in DIR"
};
std::optional<HostMemory> host_memory();

// Throws Error(out_of_memory) when the local ranks cannot fit, naming the terms, the memory and the
// --batch that would fit; says on local rank 0's stderr when they come close. Skipped where the
// memory cannot be read, on --device cuda (GPU memory), and with --no-memory-check. Returns what it
// counts for one rank.
double check_memory(const TrainOptions& o, const launch::LaunchEnv& env);

// Rank 0's line at the end: what the ranks peaked at (MiB resident, least and most) beside what
// the check counted, so that a user sees how much room the floor leaves.
void print_peak_memory(const TrainOptions& o, double counted, std::pair<float, float> least_most);

}  // namespace coshard::train
