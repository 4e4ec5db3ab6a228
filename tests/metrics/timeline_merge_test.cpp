// Per-rank timelines merged into one trace, coshard-trace-merge, and scripts/trace-png.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "coshard/metrics/timeline.hpp"
#include "coshard/metrics/trace_merge.hpp"
#include "coshard/runtime/error.hpp"
#include "metrics/catalogue.hpp"
#include "support/run_command.hpp"

using namespace coshard;
using namespace coshard::metrics;
using nlohmann::json;
namespace fs = std::filesystem;
using std::chrono::milliseconds;

namespace {

struct TempDir {
  TempDir() {
    char tmpl[] = "/tmp/coshard-trace-XXXXXX";
    path = ::mkdtemp(tmpl);
  }
  ~TempDir() { fs::remove_all(path); }
  std::string path;
};

// One FSDP-like step of `rank`: streams added in a scrambled order, one stream coshard does not know.
std::unique_ptr<Timeline> rank_timeline(int rank, std::chrono::steady_clock::time_point t0) {
  auto timeline = std::make_unique<Timeline>();
  Timeline& tl = *timeline;
  auto at = [&](int ms) { return t0 + milliseconds(ms + rank); };
  tl.add({"optimizer h.1", "step", "optimizer", rank, at(40), at(44)});
  tl.add({"reduce_scatter h.1", "backward", "reduce_scatter", rank, at(30), at(36)});
  for (int u = 0; u < 3; ++u) {
    tl.add({"fwd h." + std::to_string(u), "forward", "compute", rank, at(2 + 8 * u), at(9 + 8 * u)});
    tl.add({"all_gather h." + std::to_string(u), "forward", "all_gather", rank, at(8 * u), at(2 + 8 * u)});
  }
  tl.add({"custom thing", "", "zz_custom", rank, at(1), at(3)});
  tl.add({"h2d h.0", "forward", "h2d", rank, at(0), at(1)});
  return timeline;
}

// Checks the structure every merged trace must have; returns stream name by (pid, tid).
std::map<std::pair<int, int>, std::string> check_merged(const json& j, std::size_t spans_expected) {
  std::map<int, std::string> procs;
  std::map<std::pair<int, int>, std::string> threads;
  std::map<std::pair<int, int>, int> sort_index;
  std::size_t spans = 0;
  for (const auto& e : j.at("traceEvents")) {
    if (e.at("ph") == "M") {
      const auto name = e.at("name").get<std::string>();
      if (name == "process_name") procs[e.at("pid")] = e.at("args").at("name");
      if (name == "thread_name") threads[{e.at("pid"), e.at("tid")}] = e.at("args").at("name");
      if (name == "thread_sort_index") sort_index[{e.at("pid"), e.at("tid")}] = e.at("args").at("sort_index");
    }
  }
  for (const auto& e : j.at("traceEvents")) {
    if (e.at("ph") != "X") continue;
    ++spans;
    const int pid = e.at("pid");
    const int tid = e.at("tid");
    EXPECT_EQ(procs[pid], "rank " + std::to_string(pid)) << "span on pid " << pid << " without a rank name";
    EXPECT_TRUE(threads.count({pid, tid})) << e.at("name") << " is on an unnamed track " << tid;
    EXPECT_GE(e.at("dur").get<double>(), 0.0);
    const std::string stream = threads[{pid, tid}];
    const std::string name = e.at("name");
    if (stream != "zz_custom") {
      EXPECT_EQ(name.rfind(stream == "compute" ? "fwd" : stream, 0), 0u) << name << " landed on track " << stream;
    }
  }
  EXPECT_EQ(spans, spans_expected);
  for (const auto& [key, idx] : sort_index) EXPECT_EQ(idx, key.second);
  return threads;
}

}  // namespace

TEST(Timeline, TracksFollowTheFixedStreamOrder) {
  auto tl = rank_timeline(0, std::chrono::steady_clock::now());
  auto threads = check_merged(json::parse(tl->chrome_trace_json()), tl->size());
  std::map<std::string, int> tid;
  for (const auto& [key, name] : threads) tid[name] = key.second;
  EXPECT_EQ(tid["compute"], 1);
  EXPECT_EQ(tid["all_gather"], 2);
  EXPECT_EQ(tid["reduce_scatter"], 3);
  EXPECT_EQ(tid["h2d"], 7);
  EXPECT_EQ(tid["optimizer"], 9);
  EXPECT_EQ(tid["zz_custom"], static_cast<int>(stream_order().size()) + 1);  // unknown streams go last
}

TEST(TraceMerge, TwoRanksBecomeOneTraceWithNamedTracksInOrder) {
  const auto t0 = std::chrono::steady_clock::now();
  TempDir dir;
  auto r0 = rank_timeline(0, t0);
  auto r1 = rank_timeline(1, t0);
  r0->write(dir.path + "/rank0.json");
  r1->write(dir.path + "/rank1.json");
  const auto n = merge_trace_files({dir.path + "/rank1.json", dir.path + "/rank0.json"}, dir.path + "/merged.json");
  EXPECT_EQ(n, r0->size() + r1->size());
  const json j = json::parse(coshard::testing::read_text(dir.path + "/merged.json"));
  const auto threads = check_merged(j, r0->size() + r1->size());
  // The same stream has the same track on both ranks; tracks in stream_order().
  std::map<std::string, std::set<int>> tids;
  std::map<int, std::vector<std::string>> order;  // pid -> streams by tid
  for (const auto& [key, name] : threads) {
    tids[name].insert(key.second);
    order[key.first].push_back(name);
  }
  for (const auto& [name, set] : tids) EXPECT_EQ(set.size(), 1u) << name;
  const std::vector<std::string> want = {"compute", "all_gather", "reduce_scatter", "h2d", "optimizer", "zz_custom"};
  EXPECT_EQ(order[0], want);
  EXPECT_EQ(order[1], want);
  // Spans sorted by rank, track, time; rank 0 first.
  double last_ts = -1;
  int last_pid = -1, last_tid = -1;
  for (const auto& e : j["traceEvents"]) {
    if (e["ph"] != "X") continue;
    const int pid = e["pid"], tid = e["tid"];
    const double ts = e["ts"];
    EXPECT_TRUE(std::tie(last_pid, last_tid, last_ts) <= std::tie(pid, tid, ts));
    last_pid = pid, last_tid = tid, last_ts = ts;
  }
}

TEST(TraceMerge, ARankInTwoInputsIsRefused) {
  auto tl = rank_timeline(0, std::chrono::steady_clock::now());
  try {
    merge_chrome_traces({{"a.json", tl->chrome_trace_json()}, {"b.json", tl->chrome_trace_json()}});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::invalid_argument);
    EXPECT_NE(std::string(e.what()).find("rank 0"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("b.json"), std::string::npos) << e.what();
  }
}

TEST(TraceMerge, ANonTraceInputIsNamed) {
  try {
    merge_chrome_traces({{"broken.json", "{\"traceEvents\": [1, "}});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::corrupt_file);
    EXPECT_NE(std::string(e.what()).find("broken.json"), std::string::npos) << e.what();
  }
  EXPECT_THROW(merge_chrome_traces({{"x.json", "{\"events\": []}"}}), Error);
  // A pid beyond an int was wrapped onto another rank (2^32 became rank 0).
  for (const std::string pid : {"4294967296", "-2147483649"}) {
    try {
      merge_chrome_traces({{"big.json", R"({"traceEvents": [{"ph": "X", "pid": )" + pid + R"(, "ts": 1, "dur": 1}]})"}});
      ADD_FAILURE() << pid << " accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::corrupt_file);
      EXPECT_NE(std::string(e.what()).find("'big.json' is not a Chrome trace written by coshard: a pid is "), std::string::npos)
          << e.what();
    }
  }
  EXPECT_THROW(merge_trace_files({"/nonexistent/trace.json"}, "/tmp/never-written.json"), Error);
}

TEST(TraceMergeTool, MergesFilesAndRejectsBadUsage) {
  TempDir dir;
  const auto t0 = std::chrono::steady_clock::now();
  rank_timeline(0, t0)->write(dir.path + "/r0.json");
  rank_timeline(1, t0)->write(dir.path + "/r1.json");
  const std::string bin = COSHARD_TRACE_MERGE_BIN;
  auto ok = coshard::testing::run_command(bin + " " + dir.path + "/r0.json " + dir.path + "/r1.json -o " + dir.path +
                                          "/all.json");
  EXPECT_EQ(ok.rc, 0) << ok.output;
  EXPECT_NE(ok.output.find("spans from 2 traces"), std::string::npos) << ok.output;
  EXPECT_TRUE(fs::exists(dir.path + "/all.json"));
  EXPECT_EQ(coshard::testing::run_command(bin + " " + dir.path + "/r0.json").rc, 2);  // no -o
  EXPECT_EQ(coshard::testing::run_command(bin + " --bogus x -o y").rc, 2);
  auto missing = coshard::testing::run_command(bin + " " + dir.path + "/none.json -o " + dir.path + "/x.json");
  EXPECT_EQ(missing.rc, 1);
  EXPECT_NE(missing.output.find("none.json"), std::string::npos) << missing.output;
}

TEST(TracePng, RendersTheMergedTrace) {
  if (::access("/usr/bin/python3", X_OK) != 0) GTEST_SKIP() << "no /usr/bin/python3";
  if (coshard::testing::run_command("/usr/bin/python3 -c 'import matplotlib'").rc != 0) {
    GTEST_SKIP() << "Debian's python3-matplotlib is not installed (scripts/setup installs it)";
  }
  TempDir dir;
  const auto t0 = std::chrono::steady_clock::now();
  rank_timeline(0, t0)->write(dir.path + "/r0.json");
  rank_timeline(1, t0)->write(dir.path + "/r1.json");
  merge_trace_files({dir.path + "/r0.json", dir.path + "/r1.json"}, dir.path + "/merged.json");
  auto r = coshard::testing::run_command(std::string(COSHARD_SOURCE_DIR) + "/scripts/trace-png " + dir.path +
                                         "/merged.json -o " + dir.path + "/trace.png");
  ASSERT_EQ(r.rc, 0) << r.output;
  EXPECT_NE(r.output.find("12 tracks"), std::string::npos) << r.output;
  const auto png = coshard::testing::read_text(dir.path + "/trace.png");
  ASSERT_GT(png.size(), 8000u);
  EXPECT_EQ(png.substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8));
  auto bad = coshard::testing::run_command(std::string(COSHARD_SOURCE_DIR) + "/scripts/trace-png " + dir.path +
                                           "/missing.json");
  EXPECT_NE(bad.rc, 0);
  EXPECT_NE(bad.output.find("missing.json"), std::string::npos) << bad.output;
}
