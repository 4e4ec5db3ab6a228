#pragma once
// Test helpers for the metric catalogue (docs/metrics.md) and Prometheus' text exposition format.
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace coshard::testing {

struct CatalogueEntry {
  std::string name;
  std::string type;                // counter | gauge | histogram
  std::set<std::string> labels;    // besides the constant rank and local_rank
  std::string unit;                // seconds, bytes, bytes per second, ratio, 1, or a count noun
  std::string layer;               // metrics, transport, fsdp, trainer, ...
  bool pending = false;            // "(pending)": its producer has not landed yet
  int line = 0;
};

inline std::string trim(std::string s) {
  const auto b = s.find_first_not_of(" \t");
  const auto e = s.find_last_not_of(" \t");
  return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}

inline std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error("cannot read " + path);
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

// The rows of the catalogue table: lines "| `coshard_...` | type | labels | unit | emitted by | meaning |".
inline std::vector<CatalogueEntry> read_catalogue(const std::string& path) {
  std::istringstream in(read_text(path));
  std::vector<CatalogueEntry> out;
  std::string line;
  int n = 0;
  const std::regex backticked("`([^`]*)`");
  while (std::getline(in, line)) {
    ++n;
    if (line.rfind("| `coshard_", 0) != 0) continue;
    std::vector<std::string> cells;
    std::string cell;
    for (std::size_t i = 1; i < line.size(); ++i) {
      if (line[i] == '|') {
        cells.push_back(trim(cell));
        cell.clear();
      } else {
        cell += line[i];
      }
    }
    if (cells.size() != 6) {
      throw std::runtime_error(path + ":" + std::to_string(n) + ": a catalogue row needs 6 cells, has " +
                               std::to_string(cells.size()));
    }
    CatalogueEntry e;
    e.line = n;
    std::smatch m;
    if (!std::regex_search(cells[0], m, backticked)) throw std::runtime_error("no `name` on line " + std::to_string(n));
    e.name = m[1];
    e.type = cells[1];
    for (auto it = std::sregex_iterator(cells[2].begin(), cells[2].end(), backticked); it != std::sregex_iterator();
         ++it) {
      e.labels.insert((*it)[1]);
    }
    e.unit = cells[3];
    e.layer = cells[4];
    if (auto p = e.layer.find("(pending)"); p != std::string::npos) {
      e.pending = true;
      e.layer = trim(e.layer.substr(0, p));
    }
    out.push_back(std::move(e));
  }
  return out;
}

// A metric family as /metrics serves it.
struct ServedFamily {
  std::string type;
  std::set<std::set<std::string>> label_sets;  // label names of each sample (le and quantile left out)
  std::vector<std::pair<std::map<std::string, std::string>, double>> samples;  // base-name samples only
};

// Parses Prometheus' text format: "# TYPE name type" and "name{k="v",...} value" lines.
inline std::map<std::string, ServedFamily> parse_exposition(const std::string& text) {
  std::map<std::string, ServedFamily> fams;
  std::istringstream in(text);
  std::string line;
  const std::regex type_re(R"(^# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) ([a-z]+)$)");
  const std::regex sample_re(R"(^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (\S+).*$)");
  const std::regex label_re(R"lbl(([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)")lbl");
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    std::smatch m;
    if (std::regex_match(line, m, type_re)) {
      fams[m[1]].type = m[2];
      continue;
    }
    if (line.empty() || line[0] == '#' || !std::regex_match(line, m, sample_re)) continue;
    std::string name = m[1];
    std::string family = name;
    for (const char* suffix : {"_bucket", "_sum", "_count"}) {
      const std::string s = suffix;
      if (name.size() > s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0) {
        const std::string base = name.substr(0, name.size() - s.size());
        if (fams.count(base) && (fams[base].type == "histogram" || fams[base].type == "summary")) family = base;
      }
    }
    std::map<std::string, std::string> labels;
    const std::string body = m[3];
    for (auto it = std::sregex_iterator(body.begin(), body.end(), label_re); it != std::sregex_iterator(); ++it) {
      labels[(*it)[1]] = (*it)[2];
    }
    std::set<std::string> names;
    for (const auto& [k, v] : labels) {
      if (k != "le" && k != "quantile") names.insert(k);
    }
    auto& f = fams[family];
    f.label_sets.insert(names);
    if (family == name) f.samples.emplace_back(labels, std::stod(m[4]));
  }
  return fams;
}

// The body of an HTTP response (after the blank line), or "" when there is none.
inline std::string http_body(const std::string& response) {
  const auto p = response.find("\r\n\r\n");
  return p == std::string::npos ? std::string() : response.substr(p + 4);
}

}  // namespace coshard::testing
