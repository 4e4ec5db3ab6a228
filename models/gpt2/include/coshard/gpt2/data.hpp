#pragma once
// Token data and the data loader.
//
// llm.c's token files (.bin): a header of 256 little-endian int32 (magic 20240520, version 1,
// token count, the rest zero), then the tokens as uint16. Plain text: each byte is a token
// (vocabulary 256). Errors name the file and the position: bad magic or version, a size that
// does not match the count (truncated), a token id >= vocab.
//
// The loader cuts the tokens into sequences of T + 1 tokens starting every T tokens (llm.c's
// layout; inputs are the first T, targets the last T). Step s's global batch is the sequences
// g = s*N .. s*N + N - 1 of the stream (N = world x B, the global batch size), wrapping around the
// end; with shuffle, each pass over the data ("epoch") visits the sequences in a permutation that
// is a function of (seed, epoch). Rank r of `world` takes sequences [r*B, (r+1)*B) of the global
// batch, so the global batch of a step is the same set of sequences for any number of ranks with
// the same global batch size.
#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <vector>

namespace coshard::gpt2 {

inline constexpr std::int32_t kLlmcMagic = 20240520;
inline constexpr std::int32_t kLlmcVersion = 1;

// Reads an llm.c token file; every token must be < vocab.
std::vector<std::uint16_t> read_llmc_tokens(const std::filesystem::path& path, std::int64_t vocab);
// Writes one atomically (tokens < 65536).
void write_llmc_tokens(const std::filesystem::path& path, std::span<const std::uint16_t> tokens);
// A file's bytes as tokens (vocab must be >= 256).
std::vector<std::uint16_t> read_text_tokens(const std::filesystem::path& path, std::int64_t vocab);
// ".bin": read_llmc_tokens, anything else: read_text_tokens.
std::vector<std::uint16_t> read_tokens(const std::filesystem::path& path, std::int64_t vocab);

struct LoaderOptions {
  std::size_t batch = 4;     // B: sequences per rank per step
  std::size_t seq_len = 64;  // T
  int rank = 0;
  int world = 1;
  bool shuffle = false;
  std::uint64_t seed = 0;
};

struct Batch {
  std::vector<std::int32_t> inputs, targets;  // [B, T]
  std::size_t B = 0, T = 0;
  std::int64_t step = 0;
};

class DataLoader {
 public:
  // Needs at least T + 1 tokens. Throws Errc::invalid_argument on bad options.
  DataLoader(std::shared_ptr<const std::vector<std::uint16_t>> tokens, LoaderOptions options);

  // This rank's batch of `step` (random access, deterministic).
  Batch batch(std::int64_t step) const;
  // batch(step()), then advances.
  Batch next();
  std::int64_t step() const noexcept { return step_; }
  void set_step(std::int64_t s) noexcept { step_ = s; }
  // Sequences in the data (a pass over them is an epoch).
  std::int64_t sequences() const noexcept { return sequences_; }
  // Start token of global sequence number g of the stream (after shuffling).
  std::int64_t sequence_start(std::int64_t g) const;
  const LoaderOptions& options() const noexcept { return o_; }

 private:
  std::shared_ptr<const std::vector<std::uint16_t>> tokens_;
  LoaderOptions o_;
  std::int64_t sequences_ = 0;
  std::int64_t step_ = 0;
  mutable std::int64_t perm_epoch_ = -1;
  mutable std::vector<std::int64_t> perm_;
};

}  // namespace coshard::gpt2
