#pragma once
// Escapes text for a JSON string literal (quotes, backslashes, control characters), for the few
// places that write JSON by hand (timelines, flight records) without a JSON library.
#include <cstdio>
#include <string>
#include <string_view>

namespace coshard {

/// `s` escaped for use between the quotes of a JSON string; the quotes are not added.
inline std::string json_escape(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 2);
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(static_cast<unsigned char>(c)));
          out += buf;
        } else {
          out += c;
        }
    }
  }
  return out;
}

}  // namespace coshard
