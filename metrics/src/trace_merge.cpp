#include "coshard/metrics/trace_merge.hpp"

#include <algorithm>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "coshard/metrics/timeline.hpp"
#include "coshard/runtime/error.hpp"
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

std::pair<std::string, std::size_t> merge(const std::vector<TraceInput>& inputs) {
  std::map<int, std::string> owner;  // rank -> the input that holds it
  std::set<std::string, std::less<>> streams;
  std::set<std::pair<int, std::string>> tracks;
  std::vector<Event> events;
  std::size_t spans = 0;

  for (const auto& in : inputs) {
    json doc = json::parse(in.json, nullptr, false);
    if (doc.is_discarded()) throw corrupt(in.name, "it is not valid JSON");
    const json* list = nullptr;
    if (doc.is_array()) {
      list = &doc;
    } else if (doc.is_object() && doc.contains("traceEvents") && doc["traceEvents"].is_array()) {
      list = &doc["traceEvents"];
    } else {
      throw corrupt(in.name, "it has no \"traceEvents\" array");
    }
    std::map<std::pair<int, long long>, std::string> names;  // (pid, tid) -> stream
    for (const auto& e : *list) {
      if (!e.is_object()) throw corrupt(in.name, "an event is not an object");
      if (e.value("ph", "") == "M" && e.value("name", "") == "thread_name" && e.contains("pid") &&
          e["pid"].is_number_integer() && e.contains("tid") && e["tid"].is_number_integer() && e.contains("args") &&
          e["args"].is_object() && e["args"].contains("name") && e["args"]["name"].is_string()) {
        names[{e["pid"].get<int>(), e["tid"].get<long long>()}] = e["args"]["name"].get<std::string>();
      }
    }
    std::set<int> ranks;
    for (const auto& e : *list) {
      const std::string ph = e.value("ph", "");
      if (ph == "M") continue;  // process/thread names and order are written anew
      if (!e.contains("pid") || !e["pid"].is_number_integer()) {
        throw corrupt(in.name, "a \"" + ph + "\" event has no integer pid");
      }
      Event ev{.pid = e["pid"].get<int>(), .stream = {}, .ts = 0, .body = e};
      if (e.contains("ts") && e["ts"].is_number()) ev.ts = e["ts"].get<double>();
      if (e.contains("tid") && e["tid"].is_number_integer()) {
        const auto tid = e["tid"].get<long long>();
        auto it = names.find({ev.pid, tid});
        ev.stream = it != names.end() ? it->second : "track " + std::to_string(tid);
        streams.insert(ev.stream);
        tracks.emplace(ev.pid, ev.stream);
      }
      if (ph == "X") ++spans;
      ranks.insert(ev.pid);
      events.push_back(std::move(ev));
    }
    for (int r : ranks) {
      auto [it, fresh] = owner.emplace(r, in.name);
      if (!fresh && it->second != in.name) {
        throw Error(Errc::invalid_argument, "rank " + std::to_string(r) + " has spans in both '" + it->second +
                                                "' and '" + in.name + "': pass each rank's trace once");
      }
    }
  }

  const auto tids = detail::track_ids(streams);
  auto tid_of = [&](const std::string& s) { return tids.find(s)->second; };
  std::stable_sort(events.begin(), events.end(), [&](const Event& a, const Event& b) {
    const int ta = a.stream.empty() ? 0 : tid_of(a.stream);
    const int tb = b.stream.empty() ? 0 : tid_of(b.stream);
    return std::tie(a.pid, ta, a.ts) < std::tie(b.pid, tb, b.ts);
  });

  json out_events = json::array();
  for (const auto& [rank, name] : owner) {
    out_events.push_back({{"ph", "M"}, {"name", "process_name"}, {"pid", rank},
                          {"args", {{"name", "rank " + std::to_string(rank)}}}});
    out_events.push_back({{"ph", "M"}, {"name", "process_sort_index"}, {"pid", rank}, {"args", {{"sort_index", rank}}}});
  }
  for (const auto& [rank, stream] : tracks) {
    out_events.push_back(
        {{"ph", "M"}, {"name", "thread_name"}, {"pid", rank}, {"tid", tid_of(stream)}, {"args", {{"name", stream}}}});
    out_events.push_back({{"ph", "M"},
                          {"name", "thread_sort_index"},
                          {"pid", rank},
                          {"tid", tid_of(stream)},
                          {"args", {{"sort_index", tid_of(stream)}}}});
  }
  for (auto& ev : events) {
    if (!ev.stream.empty()) ev.body["tid"] = tid_of(ev.stream);
    out_events.push_back(std::move(ev.body));
  }
  json out = {{"displayTimeUnit", "ms"}, {"traceEvents", std::move(out_events)}};
  return {out.dump(), spans};
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
