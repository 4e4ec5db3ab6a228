// The Grafana dashboard, its provisioning files and the example Prometheus configuration.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <string>

#include "metrics/catalogue.hpp"
#include "support/run_command.hpp"

using namespace coshard::testing;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

const std::string kSource = COSHARD_SOURCE_DIR;

json dashboard() { return json::parse(read_text(kSource + "/metrics/grafana/coshard.json")); }

// Every panel, rows' nested panels included.
std::vector<json> all_panels(const json& d) {
  std::vector<json> out;
  for (const auto& p : d.at("panels")) {
    out.push_back(p);
    if (p.contains("panels")) {
      for (const auto& q : p["panels"]) out.push_back(q);
    }
  }
  return out;
}

std::vector<std::string> expressions(const json& d) {
  std::vector<std::string> out;
  for (const auto& p : all_panels(d)) {
    if (!p.contains("targets")) continue;
    for (const auto& t : p["targets"]) out.push_back(t.at("expr").get<std::string>());
  }
  return out;
}

bool refers_to_datasource_variable(const json& ds) {
  return ds.is_object() && ds.value("type", "") == "prometheus" && ds.value("uid", "") == "${datasource}";
}

std::string which(const std::string& tool) {
  auto r = run_command("command -v " + tool);
  if (r.rc != 0) return "";
  while (!r.output.empty() && (r.output.back() == '\n' || r.output.back() == '\r')) r.output.pop_back();
  return r.output;
}

// A scratch directory removed at the end of the test.
struct TempDir {
  TempDir() {
    char tmpl[] = "/tmp/coshard-dashboard-XXXXXX";
    path = ::mkdtemp(tmpl);
  }
  ~TempDir() { fs::remove_all(path); }
  std::string path;
};

}  // namespace

TEST(Dashboard, HasTheRequiredStructure) {
  const json d = dashboard();
  EXPECT_GE(d.at("schemaVersion").get<int>(), 36);
  EXPECT_FALSE(d.at("title").get<std::string>().empty());
  EXPECT_FALSE(d.at("uid").get<std::string>().empty());
  ASSERT_TRUE(d.at("panels").is_array());
  std::map<std::string, json> vars;
  for (const auto& v : d.at("templating").at("list")) vars[v.at("name").get<std::string>()] = v;
  ASSERT_TRUE(vars.count("datasource")) << "no datasource variable";
  EXPECT_EQ(vars["datasource"].at("type"), "datasource");
  EXPECT_EQ(vars["datasource"].at("query"), "prometheus");
  for (const char* name : {"rank", "op"}) {
    ASSERT_TRUE(vars.count(name)) << "no $" << name << " variable";
    const auto& v = vars[name];
    EXPECT_EQ(v.at("type"), "query") << name;
    EXPECT_TRUE(refers_to_datasource_variable(v.at("datasource"))) << name;
    const std::string q = v.at("query").is_string() ? v["query"].get<std::string>() : v["query"].at("query").get<std::string>();
    EXPECT_TRUE(std::regex_search(q, std::regex(std::string("^label_values\\(coshard_[a-z_]+, *") + name + "\\)$")))
        << name << ": " << q;
    EXPECT_TRUE(v.value("includeAll", false) && v.value("multi", false)) << name << " should allow All and several";
  }
}

TEST(Dashboard, PanelIdsAreUniqueAndEveryPanelUsesTheDatasourceVariable) {
  const json d = dashboard();
  std::set<int> ids;
  int queries = 0;
  for (const auto& p : all_panels(d)) {
    const std::string title = p.value("title", "?");
    ASSERT_TRUE(p.contains("id")) << title;
    EXPECT_TRUE(ids.insert(p.at("id").get<int>()).second) << "duplicate panel id " << p["id"] << " (" << title << ")";
    EXPECT_TRUE(p.contains("gridPos") && p["gridPos"].contains("w") && p["gridPos"].contains("h")) << title;
    EXPECT_TRUE(p.contains("datasource") && refers_to_datasource_variable(p["datasource"]))
        << title << ": the datasource must be {\"type\":\"prometheus\",\"uid\":\"${datasource}\"}";
    if (p.at("type") == "row") continue;
    ASSERT_TRUE(p.contains("targets") && !p["targets"].empty()) << title << " has no query";
    std::set<std::string> refs;
    for (const auto& t : p["targets"]) {
      ++queries;
      EXPECT_TRUE(refers_to_datasource_variable(t.at("datasource"))) << title;
      EXPECT_TRUE(refs.insert(t.at("refId").get<std::string>()).second) << title << ": duplicate refId";
      const auto expr = t.at("expr").get<std::string>();
      EXPECT_NE(expr.find("rank=~\"$rank\""), std::string::npos) << title << ": filter by $rank: " << expr;
      if (expr.find("coshard_collective_") != std::string::npos) {
        EXPECT_NE(expr.find("op=~\"$op\""), std::string::npos) << title << ": filter by $op: " << expr;
      }
    }
  }
  EXPECT_GE(queries, 10);
}

TEST(Dashboard, HasPanelsForThroughputLossStepTimeOverlapBandwidthMemoryOffloadAndErrors) {
  std::string all;
  for (const auto& e : expressions(dashboard())) all += e + "\n";
  for (const char* needle :
       {"rate(coshard_tokens_total", "coshard_loss", "histogram_quantile(0.9, sum by (le) (rate(coshard_step_duration_seconds_bucket",
        "coshard_exposed_communication_seconds_total", "coshard_overlap_ratio", "coshard_collective_busbw_bytes_per_second",
        "coshard_collective_duration_seconds_bucket", "coshard_allocator_allocated_bytes", "coshard_allocator_reserved_bytes",
        "coshard_allocator_peak_bytes", "rate(coshard_h2d_bytes_total", "rate(coshard_d2h_bytes_total",
        "sum by (mode) (rate(coshard_optimizer_seconds_total", "coshard_comm_errors_total"}) {
    EXPECT_NE(all.find(needle), std::string::npos) << "no panel queries " << needle;
  }
}

TEST(Dashboard, EveryMetricItQueriesIsInTheCatalogue) {
  std::map<std::string, CatalogueEntry> rows;
  for (auto& e : read_catalogue(kSource + "/docs/metrics.md")) rows.emplace(e.name, e);
  ASSERT_FALSE(rows.empty());
  const json d = dashboard();
  std::vector<std::string> exprs = expressions(d);
  for (const auto& v : d.at("templating").at("list")) {
    if (v.at("type") == "query") exprs.push_back(v.at("definition").get<std::string>());
  }
  const std::regex metric(R"(\bcoshard_[a-z0-9_]+)");
  int seen = 0;
  for (const auto& expr : exprs) {
    for (auto it = std::sregex_iterator(expr.begin(), expr.end(), metric); it != std::sregex_iterator(); ++it) {
      std::string name = it->str();
      ++seen;
      if (!rows.count(name)) {
        for (const std::string suffix : {"_bucket", "_sum", "_count"}) {
          if (name.size() > suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0) {
            const std::string base = name.substr(0, name.size() - suffix.size());
            if (rows.count(base)) {
              EXPECT_EQ(rows[base].type, "histogram") << name << ": " << suffix << " is only served for histograms";
              name = base;
            }
          }
        }
      }
      EXPECT_TRUE(rows.count(name)) << name << " (in `" << expr << "`) is not in docs/metrics.md";
      if (rows.count(name) && rows[name].type == "histogram") {
        EXPECT_NE(it->str(), name) << name << " is a histogram: query _bucket, _sum or _count";
      }
    }
  }
  EXPECT_GE(seen, 20);
}

TEST(Dashboard, ProvisioningFilesPointAtPrometheusAndTheDashboard) {
  const auto ds = read_text(kSource + "/metrics/grafana/provisioning/datasources/prometheus.yml");
  EXPECT_NE(ds.find("apiVersion: 1"), std::string::npos);
  EXPECT_NE(ds.find("type: prometheus"), std::string::npos);
  EXPECT_NE(ds.find("url: http://"), std::string::npos);
  const auto db = read_text(kSource + "/metrics/grafana/provisioning/dashboards/coshard.yml");
  EXPECT_NE(db.find("apiVersion: 1"), std::string::npos);
  EXPECT_NE(db.find("type: file"), std::string::npos);
  EXPECT_NE(db.find("path: "), std::string::npos);
}

TEST(PrometheusConfig, ScrapesOneTargetPerRankEverySecond) {
  const auto cfg = read_text(kSource + "/metrics/prometheus/prometheus.yml");
  EXPECT_NE(cfg.find("'127.0.0.1:9400'"), std::string::npos);
  EXPECT_NE(cfg.find("'127.0.0.1:9401'"), std::string::npos);
  EXPECT_NE(cfg.find("scrape_interval: 1s"), std::string::npos);
  EXPECT_NE(cfg.find("scrape_timeout: 900ms"), std::string::npos);
}

TEST(PrometheusConfig, PromtoolAcceptsIt) {
  const auto promtool = which("promtool");
  if (promtool.empty()) GTEST_SKIP() << "promtool not found (Debian's prometheus package ships it; scripts/setup installs it)";
  auto r = run_command(promtool + " check config " + kSource + "/metrics/prometheus/prometheus.yml");
  EXPECT_EQ(r.rc, 0) << r.output;
  EXPECT_NE(r.output.find("SUCCESS"), std::string::npos) << r.output;
}

// Each dashboard query, with Grafana's variables filled in, must be valid PromQL: promtool checks
// them as recording rules.
TEST(Dashboard, PromtoolParsesEveryQuery) {
  const auto promtool = which("promtool");
  if (promtool.empty()) GTEST_SKIP() << "promtool not found (Debian's prometheus package ships it; scripts/setup installs it)";
  TempDir dir;
  std::ofstream rules(dir.path + "/rules.yml");
  rules << "groups:\n  - name: dashboard\n    rules:\n";
  int i = 0;
  for (auto expr : expressions(dashboard())) {
    expr = std::regex_replace(expr, std::regex(R"(\$__rate_interval)"), "1m");
    expr = std::regex_replace(expr, std::regex(R"(\$(rank|op))"), ".*");
    rules << "      - record: coshard:dashboard_query_" << i++ << "\n        expr: " << json(expr).dump() << "\n";
  }
  rules.close();
  auto r = run_command(promtool + " check rules " + dir.path + "/rules.yml");
  EXPECT_EQ(r.rc, 0) << r.output;
  EXPECT_NE(r.output.find("SUCCESS: " + std::to_string(i) + " rules found"), std::string::npos) << r.output;
}
