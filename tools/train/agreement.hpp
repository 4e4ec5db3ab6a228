#pragma once
// What every rank of a job must have the same: its flags by meaning (a model spec in either form,
// a path spelled either way) and its data by content. Ranks started with another --lr, --seed,
// --batch or --data trained without complaint, each on its own; a different --strategy or --steps
// was found only at the collective deadline. Checked once at start, before the engine's collectives.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "coshard/gpt2/data.hpp"
#include "coshard/runtime/runtime.hpp"
#include "coshard/transport/process_group.hpp"
#include "job.hpp"

namespace coshard::train {

// One setting, named by the flag that sets it, with its value by meaning.
struct Setting {
  std::string flag;
  std::string value;
};

// What identifies a token stream: its length and a hash of its first and last 4096 tokens and of
// a stride through the rest (at most 2^20 tokens read, so a file of billions costs milliseconds).
std::string token_identity(const gpt2::Tokens& tokens);

// Whether the run gathers the whole model once it has trained (save_and_sample): to --save or
// --save-hf it, or for --samples where a tokenizer (or the embedded corpus) decodes them.
bool gathers_model_at_end(const TrainOptions& o, const Inputs& in);

// The settings of `o` that must agree across ranks, with the data by `in`'s identities.
std::vector<Setting> shared_settings(const TrainOptions& o, const Inputs& in);

// Each setting as one integer to compare across ranks.
std::vector<std::int64_t> setting_hashes(const std::vector<Setting>& settings);

// Given every rank's hashes (rank-major, settings.size() each), what differs: the first setting
// some rank has otherwise than rank 0, said with this rank's value and the ranks that differ.
std::optional<std::string> first_difference(const std::vector<Setting>& settings, const std::vector<std::int64_t>& all,
                                            int world, int rank);

// Throws Error(bad_config) with first_difference's words when the ranks disagree.
Task<void> check_same_settings(Runtime& rt, transport::ProcessGroup& pg, std::vector<Setting> settings);

}  // namespace coshard::train
