#include "coshard/metrics/timeline.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <set>

#include "coshard/runtime/error.hpp"
#include "coshard/runtime/file_io.hpp"
#include "coshard/runtime/json_escape.hpp"
#include "trace_common.hpp"

namespace coshard::metrics {
namespace {

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

std::span<const std::string_view> stream_order() noexcept {
  static constexpr std::string_view kOrder[] = {"compute", "all_gather", "reduce_scatter", "all_reduce", "unshard",
                                                 "reduce",  "h2d",        "d2h",            "optimizer",  "scheduler"};
  return kOrder;
}

namespace detail {

std::map<std::string, int, std::less<>> track_ids(const std::set<std::string, std::less<>>& streams) {
  std::map<std::string, int, std::less<>> ids;
  const auto order = stream_order();
  int next = static_cast<int>(order.size()) + 1;
  for (const auto& s : streams) {  // sorted by name: the unknown ones get ids in name order
    auto it = std::find(order.begin(), order.end(), s);
    ids.emplace(s, it != order.end() ? static_cast<int>(it - order.begin()) + 1 : next++);
  }
  return ids;
}

void write_atomically(const std::string& path, const std::string& text, const std::string& what) {
  try {
    write_atomic(path, text);
  } catch (const Error& e) {
    throw Error(Errc::io, "cannot write the " + what + ": " + e.message() + " (check the directory exists, is writable "
                          "and has room)");
  }
}

}  // namespace detail

std::string Timeline::chrome_trace_json() const {
  std::lock_guard lock(m_);
  std::set<std::string, std::less<>> streams;
  std::set<std::pair<int, std::string>> tracks;  // (rank, stream)
  for (const auto& s : spans_) {
    streams.insert(s.stream);
    tracks.emplace(s.rank, s.stream);
  }
  const auto tids = detail::track_ids(streams);
  std::string out = "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[";
  bool first = true;
  auto sep = [&] {
    if (!first) out += ",";
    first = false;
  };
  int last_rank = -1;
  bool any_rank = false;
  for (const auto& [rank, stream] : tracks) {
    const std::string pid = std::to_string(rank);
    if (!any_rank || rank != last_rank) {
      any_rank = true;
      last_rank = rank;
      sep();
      out += "{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":" + pid + ",\"args\":{\"name\":\"rank " + pid + "\"}}";
      sep();
      out += "{\"ph\":\"M\",\"name\":\"process_sort_index\",\"pid\":" + pid + ",\"args\":{\"sort_index\":" + pid + "}}";
    }
    const std::string tid = std::to_string(tids.find(stream)->second);
    sep();
    out += "{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":" + pid + ",\"tid\":" + tid +
           ",\"args\":{\"name\":\"" + json_escape(stream) + "\"}}";
    sep();
    out += "{\"ph\":\"M\",\"name\":\"thread_sort_index\",\"pid\":" + pid + ",\"tid\":" + tid +
           ",\"args\":{\"sort_index\":" + tid + "}}";
  }
  for (const auto& s : spans_) {
    char ts[64];
    std::snprintf(ts, sizeof ts, "%.3f,\"dur\":%.3f", micros(s.begin), micros(s.end) - micros(s.begin));
    sep();
    out += "{\"ph\":\"X\",\"name\":\"" + json_escape(s.name) + "\",\"cat\":\"" + json_escape(s.category) +
           "\",\"pid\":" + std::to_string(s.rank) + ",\"tid\":" + std::to_string(tids.find(s.stream)->second) +
           ",\"ts\":" + ts + "}";
  }
  out += "]}";
  return out;
}

void Timeline::write(const std::string& path) const { detail::write_atomically(path, chrome_trace_json(), "timeline"); }

}  // namespace coshard::metrics
