#include "coshard/metrics/trace_merge.hpp"

#include <algorithm>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "coshard/metrics/timeline.hpp"
#include "coshard/runtime/error.hpp"
#include "coshard/runtime/json_integer.hpp"
#include "trace_common.hpp"

namespace coshard::metrics {
namespace {

using nlohmann::json;

struct Event {
  int pid = 0;
  std::string stream;  // empty: the event has no track
  double ts = 0;
  json body;
};

Error corrupt(const std::string& input, const std::string& why) {
  return Error(Errc::corrupt_file, "'" + input + "' is not a Chrome trace written by coshard: " + why);
}

// A pid is a rank and a tid a track: a number beyond their type is refused, not wrapped onto another.
template <class T>
T integer_of(const json& v, const char* what, const std::string& input) {
  try {
    return json_integer<T>(v, what);
  } catch (const std::out_of_range& e) {
    throw corrupt(input, e.what());
  }
}

using ThreadNames = std::map<std::pair<int, long long>, std::string>;  // (pid, tid) -> stream
using TrackIds = std::map<std::string, int, std::less<>>;

// What the inputs hold, gathered before the tracks get their merged ids.
struct Collected {
  std::map<int, std::string> owner;  // rank -> the input that holds it
  std::set<std::string, std::less<>> streams;
  std::set<std::pair<int, std::string>> tracks;
  std::vector<Event> events;
  std::size_t spans = 0;
};

const json& event_list(const json& doc, const std::string& input) {
  if (doc.is_array()) return doc;
  if (doc.is_object() && doc.contains("traceEvents") && doc["traceEvents"].is_array()) return doc["traceEvents"];
  throw corrupt(input, "it has no \"traceEvents\" array");
}

ThreadNames thread_names(const json& list, const std::string& input) {
  ThreadNames names;
  for (const auto& e : list) {
    if (!e.is_object()) throw corrupt(input, "an event is not an object");
    if (e.value("ph", "") == "M" && e.value("name", "") == "thread_name" && e.contains("pid") &&
        e["pid"].is_number_integer() && e.contains("tid") && e["tid"].is_number_integer() && e.contains("args") &&
        e["args"].is_object() && e["args"].contains("name") && e["args"]["name"].is_string()) {
      names[{integer_of<int>(e["pid"], "a pid", input), integer_of<long long>(e["tid"], "a tid", input)}] = e["args"]["name"].get<std::string>();
    }
  }
  return names;
}

// Adds the input's events to `c`; returns the ranks they belong to.
std::set<int> collect_events(const json& list, const ThreadNames& names, const std::string& input, Collected& c) {
  std::set<int> ranks;
  for (const auto& e : list) {
    const std::string ph = e.value("ph", "");
    if (ph == "M") continue;  // process/thread names and order are written anew
    if (!e.contains("pid") || !e["pid"].is_number_integer()) {
      throw corrupt(input, "a \"" + ph + "\" event has no integer pid");
    }
    Event ev{.pid = integer_of<int>(e["pid"], "a pid", input), .stream = {}, .ts = 0, .body = e};
    if (e.contains("ts") && e["ts"].is_number()) ev.ts = e["ts"].get<double>();
    if (e.contains("tid") && e["tid"].is_number_integer()) {
      const auto tid = integer_of<long long>(e["tid"], "a tid", input);
      auto it = names.find({ev.pid, tid});
      ev.stream = it != names.end() ? it->second : "track " + std::to_string(tid);
      c.streams.insert(ev.stream);
      c.tracks.emplace(ev.pid, ev.stream);
    }
    if (ph == "X") ++c.spans;
    ranks.insert(ev.pid);
    c.events.push_back(std::move(ev));
  }
  return ranks;
}

void claim_ranks(const std::set<int>& ranks, const std::string& input, std::map<int, std::string>& owner) {
  for (int r : ranks) {
    auto [it, fresh] = owner.emplace(r, input);
    if (!fresh && it->second != input) {
      throw Error(Errc::invalid_argument, "rank " + std::to_string(r) + " has spans in both '" + it->second +
                                              "' and '" + input + "': pass each rank's trace once");
    }
  }
}

void collect(const TraceInput& in, Collected& c) {
  json doc = json::parse(in.json, nullptr, false);
  if (doc.is_discarded()) throw corrupt(in.name, "it is not valid JSON");
  const json& list = event_list(doc, in.name);
  const ThreadNames names = thread_names(list, in.name);
  claim_ranks(collect_events(list, names, in.name, c), in.name, c.owner);
}

int tid_of(const TrackIds& tids, const std::string& stream) { return tids.find(stream)->second; }

// Names and orders the processes (ranks) and their tracks.
json metadata_events(const Collected& c, const TrackIds& tids) {
  json out = json::array();
  for (const auto& [rank, name] : c.owner) {
    out.push_back(
        {{"ph", "M"}, {"name", "process_name"}, {"pid", rank}, {"args", {{"name", "rank " + std::to_string(rank)}}}});
    out.push_back({{"ph", "M"}, {"name", "process_sort_index"}, {"pid", rank}, {"args", {{"sort_index", rank}}}});
  }
  for (const auto& [rank, stream] : c.tracks) {
    const int tid = tid_of(tids, stream);
    out.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", rank}, {"tid", tid}, {"args", {{"name", stream}}}});
    out.push_back(
        {{"ph", "M"}, {"name", "thread_sort_index"}, {"pid", rank}, {"tid", tid}, {"args", {{"sort_index", tid}}}});
  }
  return out;
}

std::pair<std::string, std::size_t> merge(const std::vector<TraceInput>& inputs) {
  Collected c;
  for (const auto& in : inputs) collect(in, c);
  const TrackIds tids = detail::track_ids(c.streams);
  std::stable_sort(c.events.begin(), c.events.end(), [&](const Event& a, const Event& b) {
    const int ta = a.stream.empty() ? 0 : tid_of(tids, a.stream);
    const int tb = b.stream.empty() ? 0 : tid_of(tids, b.stream);
    return std::tie(a.pid, ta, a.ts) < std::tie(b.pid, tb, b.ts);
  });
  json out_events = metadata_events(c, tids);
  for (auto& ev : c.events) {
    if (!ev.stream.empty()) ev.body["tid"] = tid_of(tids, ev.stream);
    out_events.push_back(std::move(ev.body));
  }
  json out = {{"displayTimeUnit", "ms"}, {"traceEvents", std::move(out_events)}};
  return {out.dump(), c.spans};
}

}  // namespace

std::string merge_chrome_traces(const std::vector<TraceInput>& inputs) { return merge(inputs).first; }

std::size_t merge_trace_files(const std::vector<std::string>& inputs, const std::string& output) {
  if (inputs.empty()) throw Error(Errc::invalid_argument, "no trace files to merge: name at least one");
  std::vector<TraceInput> traces;
  for (const auto& path : inputs) {
    std::ifstream f(path, std::ios::binary);
    if (!f) throw Error(Errc::io, "cannot read the trace '" + path + "': check the path");
    std::ostringstream text;
    text << f.rdbuf();
    traces.push_back({path, text.str()});
  }
  auto [json_text, spans] = merge(traces);
  detail::write_atomically(output, json_text, "merged trace");
  return spans;
}

}  // namespace coshard::metrics
