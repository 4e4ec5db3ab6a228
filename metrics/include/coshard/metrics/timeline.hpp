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

/// A bounded, thread-safe collection of spans, written as Chrome trace JSON. Give it to
/// RankMetrics or PrometheusTelemetry to record every stream operation.
class Timeline {
 public:
  /// Keeps at most `max_spans` spans; later ones are only counted (dropped()).
  explicit Timeline(std::size_t max_spans = 1'000'000);
  /// Records one span, or counts it as dropped when full. Thread-safe.
  void add(Span span);
  /// Spans held.
  std::size_t size() const;
  /// Forgets the spans and the dropped count.
  void clear();
  /// Spans not kept because the timeline was full, since creation or clear().
  std::size_t dropped() const;
  /// The spans as Chrome trace event JSON, as write() writes them.
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
