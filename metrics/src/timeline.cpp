#include "coshard/metrics/timeline.hpp"

#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>

#include "coshard/runtime/error.hpp"

namespace coshard::metrics {
namespace {

std::string json_escape(const std::string& s) {
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
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += c;
        }
    }
  }
  return out;
}

// CLOCK_MONOTONIC is shared by every process of a host, so ranks' timelines line up when merged.
double micros(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double, std::micro>(t.time_since_epoch()).count();
}

}  // namespace

Timeline::Timeline(std::size_t max_spans) : max_spans_(max_spans) {}

void Timeline::add(Span span) {
  std::lock_guard lock(m_);
  if (spans_.size() >= max_spans_) {
    ++dropped_;
    return;
  }
  spans_.push_back(std::move(span));
}

std::size_t Timeline::size() const {
  std::lock_guard lock(m_);
  return spans_.size();
}

void Timeline::clear() {
  std::lock_guard lock(m_);
  spans_.clear();
  dropped_ = 0;
}

std::size_t Timeline::dropped() const {
  std::lock_guard lock(m_);
  return dropped_;
}

std::string Timeline::chrome_trace_json() const {
  std::lock_guard lock(m_);
  std::map<std::pair<int, std::string>, int> tids;  // (rank, stream) -> track id
  std::string out = "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[";
  bool first = true;
  auto sep = [&] {
    if (!first) out += ",";
    first = false;
  };
  for (const auto& s : spans_) {
    auto key = std::make_pair(s.rank, s.stream);
    auto [it, inserted] = tids.emplace(key, static_cast<int>(tids.size()) + 1);
    if (inserted) {
      sep();
      out += "{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":" + std::to_string(s.rank) +
             ",\"tid\":" + std::to_string(it->second) + ",\"args\":{\"name\":\"" + json_escape(s.stream) + "\"}}";
      sep();
      out += "{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":" + std::to_string(s.rank) +
             ",\"args\":{\"name\":\"rank " + std::to_string(s.rank) + "\"}}";
    }
    char ts[64];
    std::snprintf(ts, sizeof ts, "%.3f,\"dur\":%.3f", micros(s.begin), micros(s.end) - micros(s.begin));
    sep();
    out += "{\"ph\":\"X\",\"name\":\"" + json_escape(s.name) + "\",\"cat\":\"" + json_escape(s.category) +
           "\",\"pid\":" + std::to_string(s.rank) + ",\"tid\":" + std::to_string(it->second) + ",\"ts\":" + ts + "}";
  }
  out += "]}";
  return out;
}

void Timeline::write(const std::string& path) const {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) throw Error(Errc::io, "cannot write the timeline to '" + tmp + "': check the directory exists and is writable");
    f << chrome_trace_json();
    f.flush();
    if (!f) throw Error(Errc::io, "writing the timeline to '" + tmp + "' failed (disk full?)");
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    throw Error(Errc::io, "cannot rename '" + tmp + "' to '" + path + "'");
  }
}

}  // namespace coshard::metrics
