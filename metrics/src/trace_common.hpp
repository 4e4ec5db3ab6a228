#pragma once
// Shared by the timeline writer and the trace merger: track ids in a stable order and atomic
// file writes.
#include <map>
#include <set>
#include <string>

namespace coshard::metrics::detail {

// Track (thread) id of each stream: known streams get 1 + their index in stream_order(), the
// others follow by name. The same set of streams always gives the same ids.
std::map<std::string, int, std::less<>> track_ids(const std::set<std::string, std::less<>>& streams);

// Writes `text` to `path` through a temporary file and a rename; `what` names the file in errors.
void write_atomically(const std::string& path, const std::string& text, const std::string& what);

}  // namespace coshard::metrics::detail
