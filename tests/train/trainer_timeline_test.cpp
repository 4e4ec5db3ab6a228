// gpt2-train's timeline (--trace): valid JSON, a named track per rank and stream, and the overlap
// it exists to show. Overlap is a matter of timing, so this runs alone (label timing, RUN_SERIAL,
// main build only): beside other tests on 2 cores, the ranks' stream threads may not get a core
// while compute runs, and CI saw a run with no forward prefetch overlap (2026-11-29).
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "support/run_command.hpp"
#include "train/trainer_support.hpp"

namespace {

using coshard::testing::run_command;
using namespace coshard::testing::train;
using nlohmann::json;

TEST(Trainer, TimelineShowsEveryRankAndStreamAndTheOverlap) {
  auto d = temp_dir("trace");
  const std::string trace = (d / "trace.json").string();
  auto r = run_command(
      launch(2, "--steps 6 --trace-steps 6 --model layers=4,heads=4,width=64,vocab=256,context=64 --trace " + trace));
  ASSERT_EQ(r.rc, 0) << r.output;
  std::ifstream f(trace);
  json t = json::parse(f);  // valid JSON
  std::map<std::pair<int, int>, std::string> tracks;  // (pid, tid) -> stream
  struct SpanT {
    std::string name;
    double begin, end;
  };
  std::map<int, std::map<std::string, std::vector<SpanT>>> spans;  // rank -> stream -> spans
  for (const auto& e : t["traceEvents"]) {
    if (e["ph"] == "M" && e["name"] == "thread_name") tracks[{e["pid"].get<int>(), e["tid"].get<int>()}] = e["args"]["name"];
  }
  for (const auto& e : t["traceEvents"]) {
    if (e["ph"] != "X") continue;
    const int pid = e["pid"], tid = e["tid"];
    ASSERT_TRUE(pid == 0 || pid == 1) << e.dump();
    ASSERT_TRUE(tracks.count({pid, tid})) << "span on an unnamed track: " << e.dump();
    const double ts = e["ts"], dur = e["dur"];
    spans[pid][tracks[{pid, tid}]].push_back({e["name"], ts, ts + dur});
  }
  // Overlap is a matter of timing: a loaded machine may deschedule a rank at any point, so the
  // checks count over all 6 steps. Every rank overlaps some all-gather with compute, and on some
  // rank the all-gather of a block i+1 runs while block i computes (prefetch).
  const auto overlap = [](const SpanT& a, const SpanT& b) { return a.begin < b.end && b.begin < a.end; };
  int prefetch_overlaps = 0;
  for (int rank : {0, 1}) {
    for (const char* stream : {"compute", "all_gather", "reduce_scatter", "unshard"}) {
      EXPECT_FALSE(spans[rank][stream].empty()) << "rank " << rank << " has no " << stream << " spans";
    }
    int any = 0;
    for (const auto& c : spans[rank]["compute"]) {
      for (const auto& g : spans[rank]["all_gather"]) any += overlap(c, g) ? 1 : 0;
    }
    EXPECT_GT(any, 0) << "rank " << rank << ": no all-gather overlapped any compute";
    for (const auto& c : spans[rank]["compute"]) {
      auto at = c.name.find("forward h.");
      if (at == std::string::npos) continue;
      const int i = std::stoi(c.name.substr(at + 10));
      for (const auto& g : spans[rank]["all_gather"]) {
        if (g.name.find(" h." + std::to_string(i + 1) + " ") == std::string::npos &&
            !g.name.ends_with(" h." + std::to_string(i + 1))) {
          continue;
        }
        if (overlap(c, g)) ++prefetch_overlaps;
      }
    }
  }
  EXPECT_GT(prefetch_overlaps, 0) << "no all-gather of a block overlapped the compute of the one before, on any rank";
}

}  // namespace
