#pragma once
// The rendezvous store's wire format. A frame is a little-endian u32 length, then that many bytes:
// a u8 opcode (requests) or status (replies), then fields. A string field is a u32 length and its
// bytes; an integer field is an i64. Frames above the configured bound are refused unread.
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace coshard::launch::wire {

enum class Op : std::uint8_t { hello = 1, set = 2, get = 3, wait = 4, add = 5, compare_set = 6, del = 7, get_many = 8 };
enum class Status : std::uint8_t { ok = 0, not_found = 1, timeout = 2, bad_request = 3, unauthorized = 4 };

class Writer {
 public:
  explicit Writer(std::uint8_t head) { bytes_.resize(4); bytes_.push_back(head); }
  Writer& str(std::string_view s) {
    u32(static_cast<std::uint32_t>(s.size()));
    bytes_.insert(bytes_.end(), s.begin(), s.end());
    return *this;
  }
  Writer& i64(std::int64_t v) {
    char b[8];
    std::memcpy(b, &v, 8);
    bytes_.insert(bytes_.end(), b, b + 8);
    return *this;
  }
  // The finished frame, length prefix filled in.
  std::vector<char>& frame() {
    auto n = static_cast<std::uint32_t>(bytes_.size() - 4);
    std::memcpy(bytes_.data(), &n, 4);
    return bytes_;
  }

 private:
  void u32(std::uint32_t v) {
    char b[4];
    std::memcpy(b, &v, 4);
    bytes_.insert(bytes_.end(), b, b + 4);
  }
  std::vector<char> bytes_;
};

// Reads fields from a frame body; every read is bounds-checked (garbage yields nullopt).
class Reader {
 public:
  explicit Reader(std::string_view body) : rest_(body) {}
  std::optional<std::uint8_t> head() {
    if (rest_.empty()) return std::nullopt;
    auto h = static_cast<std::uint8_t>(rest_[0]);
    rest_.remove_prefix(1);
    return h;
  }
  std::optional<std::string> str() {
    if (rest_.size() < 4) return std::nullopt;
    std::uint32_t n;
    std::memcpy(&n, rest_.data(), 4);
    if (rest_.size() - 4 < n) return std::nullopt;
    std::string s(rest_.substr(4, n));
    rest_.remove_prefix(4 + static_cast<std::size_t>(n));
    return s;
  }
  std::optional<std::int64_t> i64() {
    if (rest_.size() < 8) return std::nullopt;
    std::int64_t v;
    std::memcpy(&v, rest_.data(), 8);
    rest_.remove_prefix(8);
    return v;
  }
  bool done() const noexcept { return rest_.empty(); }

 private:
  std::string_view rest_;
};

}  // namespace coshard::launch::wire
