#pragma once
// Collects spans and writes them as Chrome trace event JSON (Perfetto, chrome://tracing): one
// process per rank, one thread (track) per stream. Bounded: past `max_spans` new spans are
// counted as dropped instead of growing memory without limit.
#include <cstddef>
#include <mutex>
#include <string>
#include <vector>

#include "coshard/runtime/telemetry.hpp"

namespace coshard::metrics {

class Timeline {
 public:
  explicit Timeline(std::size_t max_spans = 1'000'000);
  void add(Span span);
  std::size_t size() const;
  void clear();
  std::size_t dropped() const;
  std::string chrome_trace_json() const;
  // Written atomically: a temporary file, then rename.
  void write(const std::string& path) const;

 private:
  mutable std::mutex m_;
  std::size_t max_spans_;
  std::size_t dropped_ = 0;
  std::vector<Span> spans_;
};

}  // namespace coshard::metrics
