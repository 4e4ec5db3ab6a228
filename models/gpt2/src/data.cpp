#include "coshard/gpt2/data.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <cstring>
#include <limits>
#include <numeric>

#include "coshard/gpt2/params.hpp"
#include "coshard/runtime/error.hpp"
#include "coshard/runtime/file_io.hpp"

static_assert(std::endian::native == std::endian::little, "token files are little-endian");

namespace coshard::gpt2 {
namespace {

Error token_file_corrupt(const std::filesystem::path& path, const std::string& msg) {
  return Error(Errc::corrupt_file, "token file '" + path.string() + "': " + msg);
}

void check_vocab(const std::filesystem::path& path, std::span<const Token> tokens, std::int64_t vocab,
                 std::uint64_t first_byte, std::uint64_t bytes_per_token) {
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] >= vocab) {
      throw token_file_corrupt(path, "token " + std::to_string(i) + " (byte " + std::to_string(first_byte + i * bytes_per_token) +
                              ") is " + std::to_string(tokens[i]) + ", outside the vocabulary [0, " +
                              std::to_string(vocab) + ")");
    }
  }
}

constexpr std::size_t kHeaderInts = 256;
constexpr std::uint64_t kHeaderBytes = kHeaderInts * 4;
constexpr std::int64_t kU16Vocab = std::int64_t{1} << 16;

std::string format_name(const LlmcFormat& f) {
  return "uint" + std::to_string(8 * f.token_bytes) + " tokens (magic " + std::to_string(f.magic) + ", version " +
         std::to_string(f.version) + ")";
}

template <typename Word>
void read_words(const std::filesystem::path& path, Tokens& tokens) {
  std::vector<Word> words(tokens.size());
  read_at(path, kHeaderBytes, std::as_writable_bytes(std::span<Word>(words)));
  std::copy(words.begin(), words.end(), tokens.begin());
}

template <typename Word>
void write_words(const std::filesystem::path& path, std::span<const std::byte> header, std::span<const Token> tokens) {
  const std::vector<Word> words(tokens.begin(), tokens.end());
  const std::array<std::span<const std::byte>, 2> parts{header, std::as_bytes(std::span<const Word>(words))};
  write_atomic(path, parts);
}

}  // namespace

const LlmcFormat& llmc_format_for(std::int64_t vocab) { return vocab <= kU16Vocab ? kLlmcU16 : kLlmcU32; }

TokenFileInfo read_llmc_header(const std::filesystem::path& path) {
  const std::uint64_t size = coshard::file_size(path);
  if (size < kHeaderBytes) {
    throw token_file_corrupt(path, "the file has " + std::to_string(size) + " bytes, less than llm.c's 1024-byte header (truncated?)");
  }
  std::array<std::int32_t, kHeaderInts> header{};
  read_at(path, 0, std::as_writable_bytes(std::span<std::int32_t>(header)));
  const LlmcFormat* format = nullptr;
  for (const LlmcFormat* f : {&kLlmcU16, &kLlmcU32}) {
    if (header[0] == f->magic) format = f;
  }
  if (format == nullptr) {
    throw token_file_corrupt(path, "bad magic " + std::to_string(header[0]) + " at byte 0, expected " + std::to_string(kLlmcU16.magic) +
                            " (uint16 tokens) or " + std::to_string(kLlmcU32.magic) + " (uint32 tokens) (not an llm.c token file)");
  }
  if (header[1] != format->version) {
    throw token_file_corrupt(path, "version " + std::to_string(header[1]) + " at byte 4, expected " + std::to_string(format->version) +
                            " for magic " + std::to_string(format->magic));
  }
  if (header[2] < 0) throw token_file_corrupt(path, "negative token count " + std::to_string(header[2]) + " at byte 8");
  const auto count = static_cast<std::uint64_t>(header[2]);
  const std::uint64_t expected = kHeaderBytes + format->token_bytes * count;
  if (size != expected) {
    throw token_file_corrupt(path, "the header announces " + std::to_string(count) + " uint" + std::to_string(8 * format->token_bytes) +
                            " tokens (" + std::to_string(expected) + " bytes) but the file has " + std::to_string(size) +
                            " bytes" + (size < expected ? " (truncated)" : ""));
  }
  return {*format, count};
}

Tokens read_llmc_tokens(const std::filesystem::path& path, std::int64_t vocab) {
  const TokenFileInfo info = read_llmc_header(path);
  if (info.format.token_bytes == 2 && vocab > kU16Vocab) {
    throw token_file_corrupt(path, "it holds uint16 tokens, which cannot hold the ids of the model's vocabulary of " +
                            std::to_string(vocab) + " (above 65,536): tokenize the data again into " + format_name(kLlmcU32) +
                            ", llm.c's Llama 3 format, which scripts/prepare-data writes when the vocabulary needs it");
  }
  Tokens tokens(info.count);
  if (info.format.token_bytes == 2) {
    read_words<std::uint16_t>(path, tokens);
  } else {
    read_words<std::uint32_t>(path, tokens);
  }
  check_vocab(path, tokens, vocab, kHeaderBytes, info.format.token_bytes);
  return tokens;
}

void write_llmc_tokens(const std::filesystem::path& path, std::span<const Token> tokens, const LlmcFormat& format) {
  if (tokens.size() > static_cast<std::size_t>(INT32_MAX)) {
    throw Error(Errc::invalid_argument, "write_llmc_tokens: " + std::to_string(tokens.size()) +
                                            " tokens do not fit llm.c's int32 count");
  }
  if (format.token_bytes != 2 && format.token_bytes != 4) {
    throw Error(Errc::invalid_argument, "write_llmc_tokens: tokens of " + std::to_string(format.token_bytes) +
                                            " bytes; llm.c's files hold 2 or 4");
  }
  if (format.token_bytes == 2) {
    for (std::size_t i = 0; i < tokens.size(); ++i) {
      if (tokens[i] >= kU16Vocab) {
        throw Error(Errc::invalid_argument, "write_llmc_tokens '" + path.string() + "': token " + std::to_string(i) + " is " +
                                                std::to_string(tokens[i]) + ", too large for uint16 tokens; write " +
                                                format_name(kLlmcU32) + " (llmc_format_for(vocab) picks it)");
      }
    }
  }
  std::array<std::int32_t, kHeaderInts> header{};
  header[0] = format.magic;
  header[1] = format.version;
  header[2] = static_cast<std::int32_t>(tokens.size());
  const auto head = std::as_bytes(std::span<const std::int32_t>(header));
  if (format.token_bytes == 2) {
    write_words<std::uint16_t>(path, head, tokens);
  } else {
    write_words<std::uint32_t>(path, head, tokens);
  }
}

Tokens read_text_tokens(const std::filesystem::path& path, std::int64_t vocab) {
  const std::uint64_t size = coshard::file_size(path);
  std::vector<unsigned char> bytes(size);
  read_at(path, 0, std::as_writable_bytes(std::span<unsigned char>(bytes)));
  Tokens tokens(bytes.begin(), bytes.end());
  check_vocab(path, tokens, vocab, 0, 1);
  return tokens;
}

Tokens read_tokens(const std::filesystem::path& path, std::int64_t vocab) {
  return path.extension() == ".bin" ? read_llmc_tokens(path, vocab) : read_text_tokens(path, vocab);
}

std::uint64_t tokens_in(const std::filesystem::path& path) noexcept {
  try {
    return path.extension() == ".bin" ? read_llmc_header(path).count : coshard::file_size(path);
  } catch (...) {
    return 0;
  }
}

// ---- DataLoader ----

DataLoader::DataLoader(std::shared_ptr<const Tokens> tokens, LoaderOptions options)
    : tokens_(std::move(tokens)), o_(options) {
  if (!tokens_) throw Error(Errc::invalid_argument, "DataLoader: no tokens");
  if (o_.batch == 0 || o_.seq_len == 0) throw Error(Errc::invalid_argument, "DataLoader: batch and seq_len must be >= 1");
  if (o_.world < 1 || o_.rank < 0 || o_.rank >= o_.world) {
    throw Error(Errc::invalid_argument, "DataLoader: rank " + std::to_string(o_.rank) + " is not in a world of " +
                                            std::to_string(o_.world));
  }
  if (tokens_->size() < o_.seq_len + 1) {
    throw Error(Errc::invalid_argument, "DataLoader: " + std::to_string(tokens_->size()) + " tokens are fewer than one sequence of T + 1 = " +
                                            std::to_string(o_.seq_len + 1));
  }
  sequences_ = static_cast<std::int64_t>((tokens_->size() - 1) / o_.seq_len);
}

std::int64_t DataLoader::sequence_start(std::int64_t g) const {
  const std::int64_t epoch = g / sequences_, pos = g % sequences_;
  std::int64_t seq = pos;
  if (o_.shuffle) {
    if (perm_epoch_ != epoch) {
      // Fisher-Yates with a counter-based generator of (seed, epoch, i).
      perm_.resize(static_cast<std::size_t>(sequences_));
      std::iota(perm_.begin(), perm_.end(), std::int64_t{0});
      const std::uint64_t key = splitmix64(o_.seed ^ splitmix64(0x5eed0000ull + static_cast<std::uint64_t>(epoch)));
      for (std::int64_t i = sequences_ - 1; i > 0; --i) {
        const std::uint64_t r = splitmix64(key ^ splitmix64(static_cast<std::uint64_t>(i)));
        const auto j = static_cast<std::int64_t>(r % static_cast<std::uint64_t>(i + 1));
        std::swap(perm_[static_cast<std::size_t>(i)], perm_[static_cast<std::size_t>(j)]);
      }
      perm_epoch_ = epoch;
    }
    seq = perm_[static_cast<std::size_t>(pos)];
  }
  return seq * static_cast<std::int64_t>(o_.seq_len);
}

Batch DataLoader::batch(std::int64_t step) const {
  Batch b;
  b.B = o_.batch;
  b.T = o_.seq_len;
  b.step = step;
  b.inputs.resize(b.B * b.T);
  b.targets.resize(b.B * b.T);
  const auto B = static_cast<std::int64_t>(o_.batch);
  const auto global = B * o_.world;
  // The index of this rank's first sequence over the whole run, and of its last: past 2^63 the
  // product overflowed.
  std::int64_t first = 0;
  if (step < 0 || __builtin_mul_overflow(step, global, &first) || __builtin_add_overflow(first, o_.rank * B, &first) ||
      first > std::numeric_limits<std::int64_t>::max() - (B - 1)) {
    throw Error(Errc::invalid_argument, "data loader: micro-batch " + std::to_string(step) + " of " +
                                            std::to_string(global) + " sequences is past the 2^63 a run can count");
  }
  const auto& tok = *tokens_;
  for (std::size_t i = 0; i < b.B; ++i) {
    const std::int64_t g = first + static_cast<std::int64_t>(i);
    const auto start = static_cast<std::size_t>(sequence_start(g));
    for (std::size_t t = 0; t < b.T; ++t) {
      b.inputs[i * b.T + t] = static_cast<std::int32_t>(tok[start + t]);
      b.targets[i * b.T + t] = static_cast<std::int32_t>(tok[start + t + 1]);
    }
  }
  return b;
}

Batch DataLoader::next() { return batch(step_++); }

}  // namespace coshard::gpt2
