#pragma once
// Collects spans and writes them as Chrome trace event JSON (Perfetto, chrome://tracing): one
// process per rank named "rank R", one thread (track) per stream named by the stream, tracks in
// the stable order of stream_order(). Bounded: past `max_spans` new spans are counted as dropped
// instead of growing memory without limit. merge_trace_files() (trace_merge.hpp) joins the files
// of several ranks.
#include <cstddef>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "coshard/runtime/telemetry.hpp"

namespace coshard::metrics {

/// The track order of every trace: these streams first, in this order; any other stream after
/// them, by name. compute, all_gather, reduce_scatter, all_reduce, unshard, reduce, h2d, d2h,
/// optimizer, scheduler.
std::span<const std::string_view> stream_order() noexcept;

class Timeline {
 public:
  explicit Timeline(std::size_t max_spans = 1'000'000);
  void add(Span span);
  std::size_t size() const;
  void clear();
  std::size_t dropped() const;
  std::string chrome_trace_json() const;
  /// Written atomically: a temporary file, then rename.
  void write(const std::string& path) const;

 private:
  mutable std::mutex m_;
  std::size_t max_spans_;
  std::size_t dropped_ = 0;
  std::vector<Span> spans_;
};

}  // namespace coshard::metrics
