#include "records.hpp"

#include <nlohmann/json.hpp>

#include <sstream>
#include <tuple>

namespace coshard::run {
namespace {

using nlohmann::json;

std::string dump(json j) {
  j["v"] = kProtocol;
  return j.dump();
}

// The record's object when `s` is one of this protocol; a field of the wrong type throws, for the
// decoder's catch.
std::optional<json> object_of(const std::string& s) {
  json j = json::parse(s, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("v") || j["v"] != kProtocol) return std::nullopt;
  return j;
}

template <class T, class Read>
std::optional<T> decode_with(const std::string& s, Read read) {
  try {
    auto j = object_of(s);
    if (!j) return std::nullopt;
    return read(*j);
  } catch (const json::exception&) {  // a field missing or of another type
    return std::nullopt;
  }
}

}  // namespace

std::string encode(const Failure& f) {
  return dump({{"node", f.node}, {"rank", f.rank}, {"code", f.code}, {"restartable", f.restartable},
               {"at_checkpoint", f.at_checkpoint}, {"what", f.what}});
}

std::string encode(const Verdict& v) {
  return dump({{"restart", v.restart}, {"code", v.code}, {"failed_rank", v.failed_rank}, {"stopped", v.stopped},
               {"reason", v.reason}, {"nodes", v.nodes}});
}

std::string encode(const DoneReport& d) {
  return dump({{"rc", d.rc}, {"interrupted", d.interrupted}, {"stop_requested", d.stop_requested},
               {"asked_in", d.asked_in}});
}

std::string encode(const Claim& c) {
  return std::to_string(c.nproc) + " " + std::to_string(c.max_restarts) + " " + std::to_string(c.min_nodes) + " " +
         c.host + " " + c.pid + " " + std::to_string(c.protocol) + " " + std::to_string(c.take_in_timeout) + " " +
         std::to_string(c.nodes) + " " + std::to_string(c.silence_timeout);
}

std::optional<Failure> decode_failure(const std::string& s) {
  return decode_with<Failure>(s, [](const json& j) {
    return Failure{.node = j.at("node").get<int>(), .rank = j.at("rank").get<int>(), .code = j.at("code").get<int>(),
                   .restartable = j.at("restartable").get<bool>(), .at_checkpoint = j.at("at_checkpoint").get<bool>(),
                   .what = j.at("what").get<std::string>()};
  });
}

std::optional<Verdict> decode_verdict(const std::string& s) {
  return decode_with<Verdict>(s, [](const json& j) {
    return Verdict{.restart = j.at("restart").get<bool>(), .code = j.at("code").get<int>(),
                   .failed_rank = j.at("failed_rank").get<int>(), .stopped = j.at("stopped").get<bool>(),
                   .reason = j.at("reason").get<std::string>(), .nodes = j.at("nodes").get<std::vector<int>>()};
  });
}

std::optional<DoneReport> decode_done(const std::string& s) {
  return decode_with<DoneReport>(s, [](const json& j) {
    return DoneReport{.rc = j.at("rc").get<int>(), .interrupted = j.at("interrupted").get<bool>(),
                      .stop_requested = j.at("stop_requested").get<bool>(), .asked_in = j.at("asked_in").get<bool>()};
  });
}

Claim decode_claim(const std::string& s) {
  Claim c;
  std::istringstream in(s);
  in >> c.nproc >> c.max_restarts >> c.min_nodes >> c.host >> c.pid;
  if (!(in >> c.protocol)) c.protocol = 0;
  if (!(in >> c.take_in_timeout)) c.take_in_timeout = 0;
  if (!(in >> c.nodes)) c.nodes = 0;
  if (!(in >> c.silence_timeout)) c.silence_timeout = 0;
  return c;
}

std::string unreadable_record(const std::string& key, const std::string& value) {
  return "store key '" + key + "' holds '" + value.substr(0, 60) + "', which no coshard-run of launcher protocol " +
         std::to_string(kProtocol) +
         " writes: another program or another coshard build uses this store; give this job a --master port of its "
         "own, and start every node's coshard-run from the same build";
}

std::string unlike_node_zero(int node, const Claim& mine, const Claim& zero) {
  const std::string who = "node " + std::to_string(node);
  if (auto why = foreign_protocol("node 0", zero, who); !why.empty()) return why;
  // --take-in-timeout too: node 0 waits that long for ranks that stop after a checkpoint; and
  // --silence-timeout, how long each node's launcher may stand still before the others give it up.
  for (const auto& [flag, here, there] : {std::tuple{"--nproc-per-node", mine.nproc, zero.nproc},
                                          std::tuple{"--max-restarts", mine.max_restarts, zero.max_restarts},
                                          std::tuple{"--nnodes N (MAX of MIN:MAX)", mine.nodes, zero.nodes},
                                          std::tuple{"--nnodes MIN (of MIN:MAX)", mine.min_nodes, zero.min_nodes},
                                          std::tuple{"--take-in-timeout", mine.take_in_timeout, zero.take_in_timeout},
                                          std::tuple{"--silence-timeout", mine.silence_timeout, zero.silence_timeout}}) {
    if (here != there) {
      return std::string(flag) + " is " + std::to_string(here) + " on " + who + " but " + std::to_string(there) +
             " on node 0 (" + zero.describe() + "): give every node the same " + flag;
    }
  }
  return "";
}

std::string foreign_protocol(const std::string& who_there, const Claim& there, const std::string& who_here) {
  if (there.protocol == kProtocol) return "";
  return who_there + "'s launcher (" + there.describe() + ") speaks launcher protocol " +
         std::to_string(there.protocol) + (there.protocol == 0 ? " (a build from before protocol versions)" : "") +
         ", " + who_here + "'s protocol " + std::to_string(kProtocol) +
         ": launchers of different builds misread each other's records in the store. Start every node's coshard-run "
         "from the same coshard build";
}

}  // namespace coshard::run
