#include "coshard/gpt2/tokenizer.hpp"

#include <nlohmann/json.hpp>

#include "coshard/runtime/error.hpp"
#include "coshard/runtime/file_io.hpp"
#include "coshard/runtime/json_integer.hpp"

namespace coshard::gpt2 {
namespace {

using json = nlohmann::json;

Error bad(const std::filesystem::path& path, const std::string& msg) {
  return Error(Errc::bad_config, "tokenizer '" + path.string() + "': " + msg);
}

// GPT-2's byte-level alphabet: printable bytes stand for themselves, the other 68 bytes for code
// points 256.. in byte order. Returns the byte a code point stands for, or -1.
int byte_of(char32_t cp) {
  const auto printable = [](unsigned b) { return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174; };
  if (cp < 256) return printable(cp) ? static_cast<int>(cp) : -1;
  unsigned n = 0;
  for (unsigned b = 0; b < 256; ++b) {
    if (printable(b)) continue;
    if (cp == 256 + n) return static_cast<int>(b);
    ++n;
  }
  return -1;
}

// The next UTF-8 code point of s at i (advancing i); -1 for a malformed sequence.
std::int64_t next_code_point(const std::string& s, std::size_t& i) {
  const auto c = static_cast<unsigned char>(s[i]);
  const int len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xe ? 3 : (c >> 3) == 0x1e ? 4 : 0;
  if (len == 0 || i + len > s.size()) return -1;
  std::int64_t cp = len == 1 ? c : c & (0x7f >> len);
  for (int k = 1; k < len; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3f);
  i += len;
  return cp;
}

// The bytes a byte-level vocabulary entry stands for.
std::string piece_bytes(const std::filesystem::path& path, const std::string& token) {
  std::string out;
  for (std::size_t i = 0; i < token.size();) {
    const auto cp = next_code_point(token, i);
    const int b = cp < 0 ? -1 : byte_of(static_cast<char32_t>(cp));
    if (b < 0) throw bad(path, "vocabulary entry '" + token + "' is not byte-level (not a GPT-2 style BPE)");
    out += static_cast<char>(b);
  }
  return out;
}

// Token files hold 16-bit ids, so a vocabulary entry's id must be one.
void put(std::vector<std::string>& pieces, const std::filesystem::path& path, const json& id,
         const std::string& what, std::string bytes) {
  std::uint16_t i = 0;
  try {
    i = json_integer<std::uint16_t>(id, what);
  } catch (const std::out_of_range& e) {
    throw bad(path, e.what());
  }
  if (i >= pieces.size()) pieces.resize(std::size_t{i} + 1);
  pieces[i] = std::move(bytes);
}

}  // namespace

Tokenizer Tokenizer::bytes() {
  Tokenizer t;
  for (int b = 0; b < 256; ++b) t.pieces_.emplace_back(1, static_cast<char>(b));
  return t;
}

Tokenizer Tokenizer::from_file(const std::filesystem::path& path) {
  try {
    return parse(path);
  } catch (const json::exception& e) {  // a field of the wrong type
    throw bad(path, std::string("malformed: ") + e.what());
  }
}

Tokenizer Tokenizer::parse(const std::filesystem::path& path) {
  const std::string text = read_text(path, "tokenizer");
  const json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) throw bad(path, "not JSON (a Hugging Face tokenizer.json?)");
  const json& model = j.contains("model") ? j["model"] : json();
  if (!model.is_object() || model.value("type", "") != "BPE" || !model.contains("vocab") || !model["vocab"].is_object()) {
    throw bad(path, "not a BPE model with a vocabulary (\"model\": {\"type\": \"BPE\", \"vocab\": ...})");
  }
  const json& pre = j.contains("pre_tokenizer") ? j["pre_tokenizer"] : json();
  if (!pre.is_object() || pre.value("type", "") != "ByteLevel") {
    throw bad(path, "the pre-tokenizer is not ByteLevel: only byte-level BPEs (GPT-2's scheme) are decoded");
  }
  Tokenizer t;
  for (const auto& [token, id] : model["vocab"].items()) {
    put(t.pieces_, path, id, "the id of vocabulary entry '" + token + "'", piece_bytes(path, token));
  }
  if (j.contains("added_tokens") && j["added_tokens"].is_array()) {
    for (const auto& a : j["added_tokens"]) {
      const auto content = a.value("content", "");
      put(t.pieces_, path, a.contains("id") ? a["id"] : json(), "the id of added token '" + content + "'", content);
    }
  }
  if (t.pieces_.empty()) throw bad(path, "its vocabulary is empty");
  return t;
}

std::string Tokenizer::decode(std::span<const std::int32_t> ids) const {
  std::string out;
  for (const auto id : ids) {
    if (id < 0 || static_cast<std::size_t>(id) >= pieces_.size()) {
      throw Error(Errc::invalid_argument, "token " + std::to_string(id) + " is outside the tokenizer's " +
                                              std::to_string(pieces_.size()) + " entries");
    }
    out += pieces_[static_cast<std::size_t>(id)];
  }
  return out;
}

}  // namespace coshard::gpt2
