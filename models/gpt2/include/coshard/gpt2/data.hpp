#pragma once
// Token data and the data loader.
//
// llm.c's token files (.bin): a header of 256 little-endian int32 (magic, version, token count,
// the rest zero), then the tokens, in one of llm.c's two formats: GPT-2's (magic 20240520,
// version 1, uint16 tokens) and Llama 3's (magic 20240801, version 7, uint32 tokens, for a
// vocabulary above 65,536). Plain text: each byte is a token (vocabulary 256). Errors name the
// file and the position: bad magic or version, a size that does not match the count (truncated),
// a token id >= vocab, a uint16 file given to a model whose vocabulary it cannot hold.
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

// Tokens in memory are 32-bit whatever the file holds, so one loader serves every vocabulary.
using Token = std::uint32_t;
using Tokens = std::vector<Token>;

struct LlmcFormat {
  std::int32_t magic = 0, version = 0;
  std::uint32_t token_bytes = 0;  // 2 or 4
};
inline constexpr LlmcFormat kLlmcU16{20240520, 1, 2};  // GPT-2's
inline constexpr LlmcFormat kLlmcU32{20240801, 7, 4};  // llm.c's Llama 3 files
// The narrowest format that holds every id of a vocabulary.
const LlmcFormat& llmc_format_for(std::int64_t vocab);

struct TokenFileInfo {
  LlmcFormat format;
  std::uint64_t count = 0;
};
// An llm.c file's header, checked against its size.
TokenFileInfo read_llmc_header(const std::filesystem::path& path);
// Reads an llm.c token file of either format; every token must be < vocab, and a uint16 file
// cannot feed a vocabulary above 65,536 (its ids would have been cut to 16 bits when written).
Tokens read_llmc_tokens(const std::filesystem::path& path, std::int64_t vocab);
// Writes one atomically; every token must fit the format.
void write_llmc_tokens(const std::filesystem::path& path, std::span<const Token> tokens,
                       const LlmcFormat& format = kLlmcU16);
// A file's bytes as tokens (vocab must be >= 256).
Tokens read_text_tokens(const std::filesystem::path& path, std::int64_t vocab);
// ".bin": read_llmc_tokens, anything else: read_text_tokens.
Tokens read_tokens(const std::filesystem::path& path, std::int64_t vocab);
// The tokens read_tokens would load from a file, from its header or size; 0 when it cannot tell
// (read_tokens names the problem).
std::uint64_t tokens_in(const std::filesystem::path& path) noexcept;

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
  DataLoader(std::shared_ptr<const Tokens> tokens, LoaderOptions options);

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
  std::shared_ptr<const Tokens> tokens_;
  LoaderOptions o_;
  std::int64_t sequences_ = 0;
  std::int64_t step_ = 0;
  mutable std::int64_t perm_epoch_ = -1;
  mutable std::vector<std::int64_t> perm_;
};

}  // namespace coshard::gpt2
