#pragma once
// Joins the Chrome traces of several ranks (each written by a Timeline) into one file: one
// process per rank (pid = rank, named "rank R"), one track per stream (named by the stream, in
// the order of stream_order(), the same track id for a stream on every rank), spans sorted by
// rank, track and start time. Timestamps are kept: CLOCK_MONOTONIC is shared by the processes of
// one host, so the ranks of a host line up.
#include <string>
#include <utility>
#include <vector>

namespace coshard::metrics {

/// One rank's Chrome trace, as merge_chrome_traces() takes it.
struct TraceInput {
  std::string name;  ///< names the input in errors, e.g. its path
  std::string json;  ///< {"traceEvents": [...]} or a bare event array
};

/// Throws Error(corrupt_file) naming the input that is not a Chrome trace, and
/// Error(invalid_argument) when two inputs hold spans of the same rank.
std::string merge_chrome_traces(const std::vector<TraceInput>& inputs);

/// Reads `inputs`, merges them and writes `output` atomically (temporary file, rename).
/// Returns the number of spans written.
std::size_t merge_trace_files(const std::vector<std::string>& inputs, const std::string& output);

}  // namespace coshard::metrics
