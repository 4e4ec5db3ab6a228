// coshard-run's report of the ranks' flight records: who was where, who wrote nothing, who is behind.
#include "hang_report.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;
using coshard::run::flight_report;

// One op of a record, as FlightRecorder::json writes it (only the fields the report reads).
std::string op(int seq, const std::string& name, const std::string& state, const std::string& error = "") {
  return "{\"seq\":" + std::to_string(seq) + ",\"op\":\"" + name + "\",\"state\":\"" + state + "\",\"error\":\"" +
         error + "\"}";
}

class HangReport : public ::testing::Test {
 protected:
  void SetUp() override {
    dir = fs::path(::testing::TempDir()) / ("coshard-hang-report-" + std::to_string(::getpid()));
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  void TearDown() override { fs::remove_all(dir); }
  void record(const std::string& comm, int job_rank, const std::vector<std::string>& ops) {
    std::ofstream f(dir / ("coshard-flight-" + comm + "-rank" + std::to_string(job_rank) + ".json"));
    f << "{\"comm\":\"" << comm << "\",\"rank\":" << job_rank << ",\"size\":4,\"job_rank\":" << job_rank
      << ",\"backend\":\"ucx\",\"algorithms\":{},\"ops\":[";
    for (std::size_t i = 0; i < ops.size(); ++i) f << (i ? "," : "") << ops[i];
    f << "]}\n";
  }
  std::string report(const std::vector<int>& local) {
    std::string all;
    for (const auto& line : flight_report(dir.string(), local)) all += line + "\n";
    return all;
  }
  fs::path dir;
};

TEST_F(HangReport, NamesWhereEachRankIsWhoWroteNothingAndWhoIsBehind) {
  record("world", 0, {op(6, "all_gather", "done"), op(7, "all_gather", "failed", "timed out. Those ranks are stuck")});
  record("world", 1, {op(6, "all_gather", "done"), op(7, "all_gather", "running")});
  record("world", 2, {op(5, "all_gather", "done"), op(6, "all_gather", "running")});
  const auto r = report({0, 1, 2, 3});
  EXPECT_NE(r.find("communicator 'world': rank 2 in all_gather#6 (running); rank 0 in all_gather#7 (failed); "
                   "rank 1 in all_gather#7 (running); rank 3 wrote no record"),
            std::string::npos)
      << r;
  EXPECT_NE(r.find("  rank 0: timed out\n"), std::string::npos) << r;  // the error's first sentence
  EXPECT_NE(r.find("behind: rank 3 (no record: it did not answer"), std::string::npos) << r;
  EXPECT_NE(r.find("behind: rank 2 (not yet at #7)"), std::string::npos) << r;
}

TEST_F(HangReport, SaysWhatEachRanksSuspendedTasksAwait) {
  record("world", 0, {op(7, "all_gather", "failed", "timed out")});
  record("world", 1, {op(6, "all_gather", "running")});
  std::ofstream(dir / "coshard-coroutines-rank0.json")
      << R"j({"job_rank":0,"suspended":[{"what":"stream 'ucx.world' after work item 9 (last labelled 'all_gather#7')",)j"
      << R"j("waited_s":30.25},{"what":"sleep_for(1 s)","waited_s":0.5},{"what":"a","waited_s":0.1},)j"
      << R"j({"what":"b","waited_s":0.1}]})j" << "\n";
  std::ofstream(dir / "coshard-coroutines-rank1.json") << R"j({"job_rank":1,"suspended":[]})j" << "\n";
  std::ofstream(dir / "coshard-coroutines-rank2.json") << R"j({"job_rank":2,"susp)j";  // cut short
  const auto r = report({0, 1, 2});
  EXPECT_NE(r.find("rank 0 awaits: stream 'ucx.world' after work item 9 (last labelled 'all_gather#7') for 30.2 s; "
                   "sleep_for(1 s) for 0.5 s; a for 0.1 s (+1 more)\n"),
            std::string::npos)
      << r;
  EXPECT_NE(r.find("rank 1 awaits: nothing (no task suspended"), std::string::npos) << r;
  EXPECT_EQ(r.find("rank 2 awaits"), std::string::npos) << r;
}

TEST_F(HangReport, ACommunicatorWhoseOpsAllCompletedIsLeftOut) {
  record("control", 0, {op(3, "all_reduce", "done")});
  record("control", 1, {op(2, "all_reduce", "done")});
  EXPECT_EQ(report({0, 1}), "");
}

TEST_F(HangReport, ATruncatedRecordIsSkippedAndOnlyLocalRanksAreExpected) {
  record("world", 4, {op(9, "reduce_scatter", "running")});
  std::ofstream(dir / "coshard-flight-world-rank5.json") << "{\"comm\":\"world\",\"ops\":[{\"seq\":";
  const auto r = report({4, 5});  // this node's ranks of a job of 8
  EXPECT_NE(r.find("communicator 'world': rank 4 in reduce_scatter#9 (running); rank 5 wrote no record"),
            std::string::npos)
      << r;
  EXPECT_EQ(r.find("rank 0"), std::string::npos) << r;
}

TEST_F(HangReport, NoRecordsNoReport) { EXPECT_TRUE(flight_report((dir / "missing").string(), {0, 1}).empty()); }

}  // namespace
