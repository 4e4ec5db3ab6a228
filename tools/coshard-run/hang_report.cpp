#include "hang_report.hpp"

#include <signal.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <optional>

#include "coshard/runtime/json_integer.hpp"
#include "coshard/launch/signal_marker.hpp"

namespace coshard::run {
namespace fs = std::filesystem;

namespace {

// The fields of a /proc/PID/stat after the command (" S ppid pgrp ..."): the command may hold
// spaces and parentheses, so they start after the last ')'. Empty when it cannot be read (it ended).
std::string stat_fields(const fs::path& stat_file) {
  std::ifstream f(stat_file);
  std::string stat;
  std::getline(f, stat);
  const auto close = stat.rfind(')');
  return close == std::string::npos ? std::string() : stat.substr(close + 1);
}

}  // namespace

char process_state(pid_t pid) {
  const std::string fields = stat_fields("/proc/" + std::to_string(pid) + "/stat");
  return fields.size() >= 2 ? fields[1] : '?';
}

std::vector<bool> groups_alive(const std::vector<pid_t>& pgids) {
  std::vector<bool> alive(pgids.size(), false);
  std::error_code ec;
  fs::directory_iterator proc("/proc", ec);
  if (ec) {  // no /proc to read: a zombie then counts as alive
    for (std::size_t i = 0; i < pgids.size(); ++i) alive[i] = ::kill(-pgids[i], 0) == 0;
    return alive;
  }
  for (const auto& e : proc) {
    const std::string name = e.path().filename().string();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::istringstream fields(stat_fields(e.path() / "stat"));  // empty: it ended while the scan ran
    char state = '?';
    long ppid = 0, pgrp = 0, skip = 0, threads = 0;
    if (!(fields >> state >> ppid >> pgrp)) continue;
    for (int i = 6; i < 20 && fields >> skip; ++i) {
    }
    fields >> threads;  // field 20: a leader that exited shows Z while its other threads run
    if ((state == 'Z' || state == 'X') && threads <= 1) continue;
    for (std::size_t i = 0; i < pgids.size(); ++i) alive[i] = alive[i] || pgrp == pgids[i];
  }
  return alive;
}

bool takes_signal(pid_t pid, const std::string& flight_dir, int sig) {
  std::error_code ec;
  if (!fs::exists(fs::path(flight_dir) / launch::signal_marker_name(sig, pid), ec)) return false;
  std::ifstream f("/proc/" + std::to_string(pid) + "/status");
  const unsigned long long bit = 1ull << (sig - 1);
  for (std::string line; std::getline(f, line);) {
    if (line.starts_with("SigCgt:")) return (std::stoull(line.substr(7), nullptr, 16) & bit) != 0;
  }
  return false;
}

std::vector<std::string> stopped_ranks(const std::vector<Child>& children) {
  std::vector<std::string> lines;
  for (const auto& c : children) {
    if (!c.running) continue;
    const char s = process_state(c.pid);
    if (s == 'T' || s == 't') {
      lines.push_back("rank " + std::to_string(c.rank) + " (pid " + std::to_string(c.pid) + ") is " +
                      (s == 'T' ? "stopped (SIGSTOP or job control)" : "stopped by a debugger") +
                      ": it cannot answer its peers, who fail at their collective deadline");
    }
  }
  return lines;
}

namespace {

// Where one rank was in one communicator: its last operation that did not complete, else its last.
struct Position {
  std::uint64_t seq = 0;
  std::string op, state, error;
};

std::string join_ranks(const std::vector<int>& ranks) {
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  for (std::size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s;
}

std::string first_sentence(const std::string& s) {
  auto end = s.find(". ");
  return end == std::string::npos ? s : s.substr(0, end);
}

std::optional<Position> position_of(const nlohmann::json& record) {
  std::optional<Position> at;
  for (const auto& op : record.at("ops")) {
    Position p{json_integer<std::uint64_t>(op.at("seq"), "seq"), op.at("op").get<std::string>(),
               op.at("state").get<std::string>(), op.value("error", std::string())};
    if (p.state != "done") return p;  // the first that did not complete is where the rank is stuck
    at = p;
  }
  return at;
}

// Calls `use` on every JSON record in `dir` whose file name starts with `prefix`. A record cut
// short by a dying rank (or missing a field `use` reads) is skipped, not fatal.
template <class F>
void for_each_record(const std::string& dir, const std::string& prefix, F use) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (!e.path().filename().string().starts_with(prefix) || e.path().extension() != ".json") continue;
    try {
      std::ifstream f(e.path());
      use(nlohmann::json::parse(f));
    } catch (const std::exception&) {
      // skipped: see above
    }
  }
}

// One line per rank that wrote coshard-coroutines-rank<r>.json: what its suspended tasks await,
// longest first (the first three; the rest counted).
std::vector<std::string> suspended_lines(const std::string& dir) {
  std::map<int, std::string> by_rank;
  for_each_record(dir, "coshard-coroutines-rank", [&](const nlohmann::json& record) {
    const auto& waits = record.at("suspended");
    std::string line = "rank " + std::to_string(json_integer<int>(record.at("job_rank"), "job_rank")) + " awaits: ";
    if (waits.empty()) line += "nothing (no task suspended: busy or blocked in a call)";
    for (std::size_t i = 0; i < waits.size() && i < 3; ++i) {
      char secs[32];
      std::snprintf(secs, sizeof secs, "%.1f s", waits[i].at("waited_s").get<double>());
      line += (i ? "; " : "") + waits[i].at("what").get<std::string>() + " for " + secs;
    }
    if (waits.size() > 3) line += " (+" + std::to_string(waits.size() - 3) + " more)";
    by_rank[json_integer<int>(record.at("job_rank"), "job_rank")] = line;
  });
  std::vector<std::string> lines;
  for (auto& [rank, line] : by_rank) lines.push_back(std::move(line));
  return lines;
}

}  // namespace

std::vector<std::string> flight_report(const std::string& dir, const std::vector<int>& local_ranks) {
  std::map<std::string, std::map<int, Position>> comms;  // comm -> rank -> position
  for_each_record(dir, "coshard-flight-", [&](const nlohmann::json& record) {
    const auto comm = record.at("comm").get<std::string>();
    const char* key = record.contains("job_rank") ? "job_rank" : "rank";
    const int rank = json_integer<int>(record.at(key), key);
    if (auto p = position_of(record)) comms[comm][rank] = *p;
  });
  std::vector<std::string> lines;
  for (const auto& [comm, ranks] : comms) {
    bool stuck = false;  // a communicator whose every recorded op completed says nothing of the hang
    for (const auto& [r, p] : ranks) stuck = stuck || p.state != "done";
    if (!stuck) continue;
    std::map<std::pair<std::uint64_t, std::string>, std::vector<int>> groups;  // (seq, op state) -> ranks
    std::uint64_t newest = 0;
    for (const auto& [r, p] : ranks) {
      groups[{p.seq, p.op + "#" + std::to_string(p.seq) + " (" + p.state + ")"}].push_back(r);
      newest = std::max(newest, p.seq);
    }
    std::string line = "communicator '" + comm + "':";
    for (const auto& [key, rs] : groups) line += " " + join_ranks(rs) + " in " + key.second + ";";
    std::vector<int> silent;
    for (int r : local_ranks) {
      if (!ranks.count(r)) silent.push_back(r);
    }
    if (!silent.empty()) line += " " + join_ranks(silent) + " wrote no record";
    lines.push_back(line);
    for (const auto& [r, p] : ranks) {
      if (p.state == "failed" && !p.error.empty()) {
        lines.push_back("  rank " + std::to_string(r) + ": " + first_sentence(p.error));
        break;  // one example: the others say the same of their own peers
      }
    }
    std::vector<int> behind;
    for (const auto& [r, p] : ranks) {
      if (p.seq < newest) behind.push_back(r);
    }
    if (!silent.empty()) {
      lines.push_back("  behind: " + join_ranks(silent) + " (no record: it did not answer, so it is stopped, hung "
                      "or dead; the likely cause)");
    }
    if (!behind.empty()) {
      lines.push_back("  behind: " + join_ranks(behind) + " (not yet at #" + std::to_string(newest) + ")");
    }
  }
  if (!lines.empty()) {
    for (auto& line : suspended_lines(dir)) lines.push_back(std::move(line));
  }
  return lines;
}

}  // namespace coshard::run
