// docs/metrics.md is the metric catalogue. These tests keep it honest: naming rules on every row,
// what RankMetrics really serves against the rows emitted by metrics/, and a scan of the sources
// for every "coshard_..." literal against the rows of the other layers.
#include <gtest/gtest.h>

#include <filesystem>
#include <regex>
#include <set>
#include <string>

#include "coshard/metrics/rank_metrics.hpp"
#include "coshard/runtime/allocator.hpp"
#include "metrics/catalogue.hpp"
#include "support/loopback.hpp"

using namespace coshard;
using namespace coshard::testing;
namespace fs = std::filesystem;

namespace {

const std::string kSource = COSHARD_SOURCE_DIR;
const std::string kCatalogue = kSource + "/docs/metrics.md";

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::vector<CatalogueEntry> catalogue() {
  auto c = read_catalogue(kCatalogue);
  if (c.empty()) throw std::runtime_error("no catalogue rows in " + kCatalogue);
  return c;
}

// The folder whose code a layer's metrics must come from.
std::vector<std::string> folders_of(const std::string& layer) {
  if (layer == "metrics") return {"metrics/"};
  if (layer == "transport") return {"transport/"};
  if (layer == "fsdp") return {"fsdp/"};
  if (layer == "runtime") return {"runtime/"};
  if (layer == "ops") return {"ops/"};
  if (layer == "trainer") return {"examples/", "tools/"};
  return {};
}

struct Emission {
  std::set<std::string> files;  // relative paths
  std::set<std::string> types;  // from counter("..."/gauge("..."/histogram("... calls
};

// Every "coshard_..." string literal in the sources of the library, the examples and the tools
// (test folders left out: tests make up names of their own).
std::map<std::string, Emission> scan_sources() {
  std::map<std::string, Emission> out;
  // A complete metric name: a literal ending in a letter or digit (not a prefix such as "coshard_tmp_").
  const std::regex literal(R"re("(coshard_[a-z0-9_]*[a-z0-9])")re");
  const std::regex call(R"re(\b(counter|gauge|histogram)\s*\(\s*"(coshard_[a-z0-9_]*[a-z0-9])")re");
  for (const char* dir : {"kernels", "runtime", "transport", "ops", "fsdp", "metrics", "examples", "tools"}) {
    const fs::path root = fs::path(kSource) / dir;
    if (!fs::exists(root)) continue;
    for (const auto& f : fs::recursive_directory_iterator(root)) {
      const auto ext = f.path().extension().string();
      const std::string rel_dir = fs::relative(f.path().parent_path(), kSource).string() + "/";
      if (rel_dir.find("/tests/") != std::string::npos || rel_dir.find("/test/") != std::string::npos) continue;
      if (!f.is_regular_file() || (ext != ".cpp" && ext != ".hpp" && ext != ".h" && ext != ".cu" && ext != ".cc")) {
        continue;
      }
      const std::string text = read_text(f.path().string());
      const std::string rel = fs::relative(f.path(), kSource).string();
      for (auto it = std::sregex_iterator(text.begin(), text.end(), literal); it != std::sregex_iterator(); ++it) {
        out[(*it)[1]].files.insert(rel);
      }
      for (auto it = std::sregex_iterator(text.begin(), text.end(), call); it != std::sregex_iterator(); ++it) {
        out[(*it)[2]].types.insert((*it)[1]);
      }
    }
  }
  return out;
}

}  // namespace

TEST(Catalogue, ParsesWithUniqueNamesAndKnownTypes) {
  auto c = catalogue();
  std::set<std::string> names;
  for (const auto& e : c) {
    EXPECT_TRUE(names.insert(e.name).second) << e.name << " is listed twice (line " << e.line << ")";
    EXPECT_TRUE(e.type == "counter" || e.type == "gauge" || e.type == "histogram")
        << e.name << ": type '" << e.type << "' (line " << e.line << ")";
    EXPECT_FALSE(folders_of(e.layer).empty()) << e.name << ": unknown layer '" << e.layer << "' (line " << e.line << ")";
  }
}

TEST(Catalogue, ListsTheStepCommunicationOffloadMemoryAndErrorMetrics) {
  std::set<std::string> names;
  for (const auto& e : catalogue()) names.insert(e.name);
  for (const char* required :
       {"coshard_step_duration_seconds", "coshard_tokens_total", "coshard_loss", "coshard_collective_duration_seconds",
        "coshard_collective_bytes_total", "coshard_collective_busbw_bytes_per_second",
        "coshard_exposed_communication_seconds_total", "coshard_overlap_ratio", "coshard_h2d_bytes_total",
        "coshard_d2h_bytes_total", "coshard_h2d_seconds_total", "coshard_d2h_seconds_total",
        "coshard_optimizer_seconds_total", "coshard_buffer_pool_occupancy", "coshard_limiter_waits_total",
        "coshard_prefetch_hits_total", "coshard_prefetch_misses_total", "coshard_allocator_allocated_bytes",
        "coshard_allocator_reserved_bytes", "coshard_allocator_peak_bytes", "coshard_comm_errors_total",
        "coshard_build_info"}) {
    EXPECT_TRUE(names.count(required)) << required << " is missing from " << kCatalogue;
  }
}

TEST(Catalogue, NamesFollowPrometheusConventions) {
  const std::regex name_re("^coshard_[a-z][a-z0-9_]*[a-z0-9]$");
  // comm: a communicator's name, fixed by the program (the engine makes six), never per operation.
  const std::set<std::string> allowed_labels = {"op",   "transport", "kind", "mode", "device",    "stream",
                                                "version", "cuda",  "nccl", "ucx",  "peer", "algorithm", "comm",
                                                "wire_protocol"};
  const std::regex non_base_unit(
      "_(ms|msec|milliseconds|us|usec|microseconds|ns|nanoseconds|minutes|hours|kb|kib|mb|mib|gb|gib|bits|percent|"
      "pct)(_|$)");
  for (const auto& e : catalogue()) {
    SCOPED_TRACE(e.name + " (docs/metrics.md line " + std::to_string(e.line) + ")");
    EXPECT_TRUE(std::regex_match(e.name, name_re)) << "names are coshard_ then lower-case words";
    EXPECT_FALSE(std::regex_search(e.name, non_base_unit)) << "use base units: seconds and bytes";
    const bool total = ends_with(e.name, "_total");
    EXPECT_EQ(total, e.type == "counter") << "_total is for counters, and every counter ends in _total";
    const std::string stem = total ? e.name.substr(0, e.name.size() - 6) : e.name;
    if (e.unit == "seconds") {
      EXPECT_TRUE(ends_with(stem, "_seconds")) << "a metric in seconds ends in _seconds";
    } else if (e.unit == "bytes") {
      EXPECT_TRUE(ends_with(stem, "_bytes")) << "a metric in bytes ends in _bytes";
    } else if (e.unit == "bytes per second") {
      EXPECT_TRUE(ends_with(stem, "_bytes_per_second"));
    } else if (e.unit == "ratio") {
      EXPECT_TRUE(ends_with(stem, "_ratio")) << "a ratio ends in _ratio";
    } else {
      EXPECT_FALSE(ends_with(stem, "_seconds") || ends_with(stem, "_bytes") || ends_with(stem, "_ratio") ||
                   ends_with(stem, "_per_second"))
          << "the name says a unit but the unit column says '" << e.unit << "'";
    }
    if (e.type == "histogram") {
      EXPECT_TRUE(e.unit == "seconds" || e.unit == "bytes") << "histograms in base units";
    }
    if (ends_with(e.name, "_info")) {
      EXPECT_TRUE(e.type == "gauge" && e.unit == "1") << "info metrics: gauge of 1";
    }
    for (const auto& l : e.labels) {
      EXPECT_TRUE(allowed_labels.count(l)) << "label '" << l << "' is not in the bounded set (rank and local_rank "
                                           << "are constant labels and not listed)";
    }
  }
}

// What RankMetrics serves over HTTP for the metrics metrics/ itself produces.
TEST(Catalogue, ServedMetricsMatchTheRowsOfTheMetricsLayer) {
  metrics::RankMetrics m({.rank = 1, .local_rank = 1, .port = 0, .bind_address = "127.0.0.1", .timeline = nullptr});
  m.start();
  Allocator alloc(cpu_memory());
  auto buf = alloc.allocate(1 << 20);
  m.update(alloc);
  const auto response =
      loopback_exchange(m.port(), "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
  ASSERT_NE(response.find("200 OK"), std::string::npos) << response;
  const auto served = parse_exposition(http_body(response));
  ASSERT_FALSE(served.empty()) << response;

  std::map<std::string, CatalogueEntry> rows;
  for (const auto& e : catalogue()) rows.emplace(e.name, e);
  for (const auto& [name, fam] : served) {
    if (name.rfind("exposer_", 0) == 0) continue;  // prometheus-cpp's own scrape metrics (see docs/metrics.md)
    auto it = rows.find(name);
    EXPECT_NE(it, rows.end()) << name << " is served but not in " << kCatalogue;
  }
  for (const auto& [name, e] : rows) {
    if (e.layer != "metrics") continue;
    SCOPED_TRACE(name);
    auto it = served.find(name);
    ASSERT_NE(it, served.end()) << "the catalogue says metrics/ emits it, but RankMetrics does not serve it";
    EXPECT_EQ(it->second.type, e.type);
    std::set<std::string> want = e.labels;
    want.insert({"rank", "local_rank"});
    for (const auto& got : it->second.label_sets) EXPECT_EQ(got, want);
    for (const auto& [labels, value] : it->second.samples) {
      EXPECT_EQ(labels.at("rank"), "1");
      EXPECT_EQ(labels.at("local_rank"), "1");
    }
  }
  EXPECT_EQ(served.at("coshard_allocator_allocated_bytes").samples.at(0).second,
            static_cast<double>(alloc.stats().allocated_bytes));
}

TEST(Catalogue, EveryRowIsEmittedByItsLayerAndEveryEmittedNameIsListed) {
  const auto emitted = scan_sources();
  ASSERT_FALSE(emitted.empty()) << "no \"coshard_...\" literal found under " << kSource;
  std::map<std::string, CatalogueEntry> rows;
  for (const auto& e : catalogue()) rows.emplace(e.name, e);

  for (const auto& [name, em] : emitted) {
    EXPECT_TRUE(rows.count(name)) << name << " is emitted by " << *em.files.begin()
                                  << " but has no row in docs/metrics.md: add it (name, type, labels, unit, layer)";
  }
  for (const auto& [name, e] : rows) {
    SCOPED_TRACE(name + " (docs/metrics.md line " + std::to_string(e.line) + ")");
    auto it = emitted.find(name);
    if (e.pending) {
      EXPECT_EQ(it, emitted.end()) << "marked (pending) but emitted by " << *it->second.files.begin()
                                   << ": remove the (pending) mark in docs/metrics.md and check its row";
      continue;
    }
    ASSERT_NE(it, emitted.end()) << "no code emits it: remove the row, or mark it (pending) until its producer lands";
    bool in_layer = false;
    for (const auto& f : it->second.files) {
      for (const auto& dir : folders_of(e.layer)) in_layer = in_layer || f.rfind(dir, 0) == 0;
    }
    EXPECT_TRUE(in_layer) << "the catalogue says layer '" << e.layer << "' but it is emitted by "
                          << *it->second.files.begin();
    for (const auto& t : it->second.types) {
      EXPECT_EQ(t, e.type) << "the code registers it as a " << t;
    }
  }
}
