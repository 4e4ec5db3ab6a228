// gpt2-train, run for real through coshard-run: it learns, resumes, does not depend on the world
// size, writes a usable timeline, and refuses bad input before training.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "coshard/gpt2/safetensors.hpp"
#include "support/run_command.hpp"

namespace {

using coshard::testing::run_command;
using nlohmann::json;
namespace fs = std::filesystem;

const std::string kRun = COSHARD_RUN_BIN;
const std::string kTrain = GPT2_TRAIN_BIN;

std::string launch(int ranks, const std::string& args) {
  return kRun + " --nproc-per-node " + std::to_string(ranks) + " -- " + kTrain + " --metrics-port 0 --samples 0 " + args;
}

fs::path temp_dir(const std::string& name) {
  fs::path d = fs::path(::testing::TempDir()) / ("coshard-train-" + name + "-" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// The JSON step records rank 0 wrote to stdout (--log-json -), in order.
std::vector<json> step_records(const std::string& output) {
  std::vector<json> out;
  std::istringstream in(output);
  for (std::string line; std::getline(in, line);) {
    auto at = line.find("{\"step\":");
    if (at == std::string::npos) continue;
    out.push_back(json::parse(line.substr(at)));
  }
  return out;
}

TEST(Trainer, DefaultRunLearnsAndLogsEveryStep) {
  auto d = temp_dir("learn");
  const std::string log = (d / "log.jsonl").string();
  auto r = run_command(launch(2, "--steps 150 --warmup-steps 20 --lr-schedule cosine --log-json " + log));
  ASSERT_EQ(r.rc, 0) << r.output;
  std::ifstream f(log);
  std::vector<json> steps;
  for (std::string line; std::getline(f, line);) steps.push_back(json::parse(line));  // every line parses
  ASSERT_EQ(steps.size(), 150u);
  for (const auto& s : steps) {
    for (const char* key : {"step", "loss", "tokens_per_s", "step_s", "exposed_comm_s", "peak_mem_bytes"}) {
      EXPECT_TRUE(s.contains(key)) << key << " missing in " << s.dump();
    }
  }
  const double first = steps.front()["loss"], last = steps.back()["loss"];
  EXPECT_NEAR(first, std::log(256.0), 0.3);  // byte vocabulary at initialisation
  EXPECT_LT(last, 0.5 * first) << r.output;
  EXPECT_NE(r.output.find("trained 150 steps"), std::string::npos) << r.output;
}

TEST(Trainer, SaveThenInitResumesWithTheSameParameters) {
  auto d = temp_dir("resume");
  const std::string a = (d / "a.safetensors").string(), b = (d / "b.safetensors").string();
  auto r = run_command(launch(2, "--steps 20 --save " + a));
  ASSERT_EQ(r.rc, 0) << r.output;
  // A second job that starts from the file and takes one step of a negligible learning rate.
  r = run_command(launch(2, "--steps 1 --lr 1e-20 --clip 0 --init " + a + " --save " + b));
  ASSERT_EQ(r.rc, 0) << r.output;
  auto config = coshard::gpt2::parse_config("tiny");
  auto sa = coshard::gpt2::read_model(a, config), sb = coshard::gpt2::read_model(b, config);
  ASSERT_EQ(sa.size(), sb.size());
  for (const auto& [name, values] : sa) {
    const auto& other = sb.at(name);
    ASSERT_EQ(values.size(), other.size()) << name;
    double worst = 0;
    for (std::size_t i = 0; i < values.size(); ++i) worst = std::max(worst, static_cast<double>(std::fabs(values[i] - other[i])));
    EXPECT_LT(worst, 1e-6) << name;
  }
}

// The global batch of a step is the same sequences for any world size with the same global batch.
class WorldSize : public ::testing::TestWithParam<std::string> {};

TEST_P(WorldSize, OneRankOfSixEqualsThreeRanksOfTwo) {
  const std::string common = "--steps 4 --seq 32 --clip 0 --log-json - --strategy " + GetParam();
  const bool hybrid = GetParam().starts_with("hybrid");
  auto one = run_command(launch(1, common + " --batch 6" + (hybrid ? " --shard-group 1" : "")));
  auto three = run_command(launch(3, common + " --batch 2" + (hybrid ? " --shard-group 3" : "")));
  ASSERT_EQ(one.rc, 0) << one.output;
  ASSERT_EQ(three.rc, 0) << three.output;
  auto a = step_records(one.output), b = step_records(three.output);
  ASSERT_EQ(a.size(), 4u) << one.output;
  ASSERT_EQ(b.size(), 4u) << three.output;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double x = a[i]["loss"], y = b[i]["loss"];
    EXPECT_NEAR(x, y, 1e-5 * std::fabs(x)) << "step " << i + 1;
  }
}

// Named by the strategy: Trainer/WorldSize.OneRankOfSixEqualsThreeRanksOfTwo/hybrid_shard.
INSTANTIATE_TEST_SUITE_P(Trainer, WorldSize,
                         ::testing::Values("full_shard", "shard_grad_op", "no_shard", "hybrid_shard"),
                         [](const ::testing::TestParamInfo<std::string>& p) { return p.param; });

TEST(Trainer, TimelineShowsEveryRankAndStreamAndTheOverlap) {
  auto d = temp_dir("trace");
  const std::string trace = (d / "trace.json").string();
  auto r = run_command(launch(2, "--steps 6 --model layers=4,heads=4,width=64,vocab=256,context=64 --trace " + trace));
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
  for (int rank : {0, 1}) {
    for (const char* stream : {"compute", "all_gather", "reduce_scatter", "unshard"}) {
      EXPECT_FALSE(spans[rank][stream].empty()) << "rank " << rank << " has no " << stream << " spans";
    }
    // With prefetch on, the all-gather of block i+1 runs while block i computes.
    int overlaps = 0;
    for (const auto& c : spans[rank]["compute"]) {
      auto at = c.name.find("forward h.");
      if (at == std::string::npos) continue;
      const int i = std::stoi(c.name.substr(at + 10));
      for (const auto& g : spans[rank]["all_gather"]) {
        if (g.name.find(" h." + std::to_string(i + 1) + " ") == std::string::npos &&
            !g.name.ends_with(" h." + std::to_string(i + 1))) {
          continue;
        }
        if (g.begin < c.end && c.begin < g.end) ++overlaps;
      }
    }
    EXPECT_GT(overlaps, 0) << "rank " << rank << ": no all-gather of a block overlapped the compute of the one before";
  }
}

// Bad input: a usage error or a clear error before any training, and no file half-written.
TEST(TrainerErrors, UnknownFlagAndBadValuesAreUsageErrors) {
  auto r = run_command(kTrain + " --no-such-flag");
  EXPECT_EQ(r.rc, 2) << r.output;
  EXPECT_NE(r.output.find("--no-such-flag"), std::string::npos) << r.output;
  r = run_command(kTrain + " --strategy quarter_shard");
  EXPECT_EQ(r.rc, 2) << r.output;
  EXPECT_NE(r.output.find("--strategy"), std::string::npos) << r.output;
  r = run_command(kTrain + " --model layers=2,heads=3,width=64,vocab=256,context=32");
  EXPECT_EQ(r.rc, 2) << r.output;
  EXPECT_NE(r.output.find("--model"), std::string::npos) << r.output;
  r = run_command(kTrain + " --help");
  EXPECT_EQ(r.rc, 0);
  EXPECT_NE(r.output.find("--backward-prefetch"), std::string::npos);
}

TEST(TrainerErrors, MissingDataFileIsNamed) {
  auto r = run_command(kTrain + " --data /nonexistent/tokens.bin");
  EXPECT_EQ(r.rc, 2) << r.output;
  EXPECT_NE(r.output.find("/nonexistent/tokens.bin"), std::string::npos) << r.output;
}

TEST(TrainerErrors, UnwritableSaveFailsBeforeTraining) {
  auto r = run_command(kTrain + " --metrics-port 0 --steps 5 --save /nonexistent/dir/model.safetensors");
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.output.find("cannot write --save /nonexistent/dir/model.safetensors"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("step "), std::string::npos) << "training started: " << r.output;
}

TEST(TrainerErrors, InitFileOfAnotherModelSizeIsRefusedBeforeTraining) {
  auto d = temp_dir("init");
  const std::string other = (d / "other.safetensors").string(), out = (d / "out.safetensors").string();
  auto r = run_command(launch(1, "--steps 1 --model layers=1,heads=2,width=32,vocab=256,context=64 --save " + other));
  ASSERT_EQ(r.rc, 0) << r.output;
  r = run_command(launch(1, "--steps 5 --model tiny --init " + other + " --save " + out));
  EXPECT_NE(r.rc, 0) << r.output;
  EXPECT_NE(r.output.find(other), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("step "), std::string::npos) << "training started: " << r.output;
  EXPECT_FALSE(fs::exists(out)) << "a model was written";
}

TEST(TrainerErrors, MetricsPortInUseIsNamed) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(::listen(fd, 1), 0);
  socklen_t len = sizeof addr;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  const int port = ntohs(addr.sin_port);
  auto r = run_command(kTrain + " --steps 5 --metrics-port " + std::to_string(port));
  ::close(fd);
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.output.find(std::to_string(port)), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("--metrics-port"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("step "), std::string::npos) << "training started: " << r.output;
}

}  // namespace
