// gpt2-train when a rank stops without dying (SIGSTOP: a hung kernel, a swapped-out host, a
// debugger): past the collective deadline every other rank fails naming the operation and the
// silent rank, the launcher names the stopped rank and kills it; a shorter stop loses nothing. And
// a stop asked for (SIGUSR2, as Slurm sends before a time limit): a checkpoint, then exit code 75.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <cmath>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "support/loopback.hpp"
#include "support/run_command.hpp"
#include "train/trainer_support.hpp"

namespace {

using coshard::testing::run_command;
using namespace coshard::testing::train;
using Clock = std::chrono::steady_clock;
using coshard::testing::free_loopback_port;

// Lines in `path` (a --log-json file that is still being written).
std::size_t lines_in(const fs::path& path) {
  std::ifstream f(path);
  std::size_t n = 0;
  for (std::string line; std::getline(f, line);) ++n;
  return n;
}

// The newest rank process of the job whose arguments hold `marker` (the last one started), or 0.
pid_t newest_rank(const std::string& marker) {
  // "[g]" keeps the pattern from matching the shell that runs pgrep.
  auto r = run_command("pgrep -n -f -- '[g]pt2-train .*" + marker + "'");
  return r.rc == 0 ? static_cast<pid_t>(std::stoi(r.output)) : 0;
}

// The RANK a process was started with (from its environment), or -1.
int rank_of(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/environ", std::ios::binary);
  for (std::string kv; std::getline(f, kv, '\0');) {
    if (kv.starts_with("RANK=")) return std::stoi(kv.substr(5));
  }
  return -1;
}

// Waits until the job has logged `steps` steps, then stops its newest rank; returns that pid.
pid_t stop_a_rank_after(const fs::path& log, std::size_t steps) {
  const auto deadline = Clock::now() + std::chrono::seconds(120);
  while (lines_in(log) < steps && Clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  const pid_t pid = newest_rank(log.string());
  if (pid > 0) ::kill(pid, SIGSTOP);
  return pid;
}

TEST(TrainerFaults, AStoppedRankFailsTheOthersAtTheDeadlineAndIsNamedAndKilled) {
  auto d = temp_dir("sigstop");
  const fs::path log = d / "log.jsonl";
  coshard::testing::CommandResult job;
  std::thread runner([&] {
    job = run_command(launch(4, "--steps 100000 --seq 32 --collective-timeout 3 --log-json " + log.string()));
  });
  const pid_t stopped = stop_a_rank_after(log, 5);
  const auto stopped_at = Clock::now();
  const int rank = stopped > 0 ? rank_of(stopped) : -1;
  runner.join();
  const double seconds = std::chrono::duration<double>(Clock::now() - stopped_at).count();
  ASSERT_GT(stopped, 0) << "no rank to stop: " << job.output;
  EXPECT_NE(job.rc, 0) << job.output;
  // Deadline (3 s) + the launcher's grace (5 s) + start-up noise, far below a step count's worth.
  EXPECT_LT(seconds, 20) << job.output;
  // The waiting ranks name the operation with its sequence number and whom they did not hear from.
  EXPECT_NE(job.output.find("did not complete within 3000 ms; not heard from: rank "), std::string::npos) << job.output;
  EXPECT_TRUE(job.output.find("all_gather#") != std::string::npos ||
              job.output.find("reduce_scatter#") != std::string::npos ||
              job.output.find("all_reduce#") != std::string::npos)
      << job.output;
  // The launcher names the stopped process, and its report of the flight records puts it behind.
  const std::string pid = std::to_string(stopped);
  EXPECT_NE(job.output.find("(pid " + pid + ") is stopped (SIGSTOP"), std::string::npos) << job.output;
  EXPECT_NE(job.output.find("coshard-run: flight records (in "), std::string::npos) << job.output;
  EXPECT_NE(job.output.find("behind: rank " + std::to_string(rank) + " (no record"), std::string::npos) << job.output;
  // The ranks that failed say what their suspended tasks awaited: a communicator's stream.
  EXPECT_NE(job.output.find(" awaits: stream '"), std::string::npos) << job.output;
  // Nothing of the job is left, the stopped rank included.
  EXPECT_EQ(newest_rank(log.string()), 0) << "a rank outlived its job";
  EXPECT_NE(::kill(stopped, 0), 0);
}

TEST(TrainerFaults, AStopShorterThanTheDeadlineLosesNothing) {
  auto d = temp_dir("sigstop-short");
  const std::string common = "--steps 24 --seq 32 --collective-timeout 60 --log-json ";
  auto whole = run_command(launch(4, common + (d / "whole.jsonl").string()));
  ASSERT_EQ(whole.rc, 0) << whole.output;
  const fs::path log = d / "stopped.jsonl";
  coshard::testing::CommandResult job;
  std::thread runner([&] { job = run_command(launch(4, common + log.string())); });
  const pid_t stopped = stop_a_rank_after(log, 5);
  std::this_thread::sleep_for(std::chrono::seconds(2));
  if (stopped > 0) ::kill(stopped, SIGCONT);
  runner.join();
  ASSERT_GT(stopped, 0) << "no rank to stop: " << job.output;
  ASSERT_EQ(job.rc, 0) << job.output;
  std::ifstream a(d / "whole.jsonl"), b(log);
  std::size_t n = 0;
  for (std::string x, y; std::getline(a, x) && std::getline(b, y); ++n) {
    const double want = json::parse(x)["loss"], got = json::parse(y)["loss"];
    EXPECT_NEAR(got, want, 1e-6 * want) << "step " << n + 1;
  }
  EXPECT_EQ(n, 24u);
}

// The loss of each line of a --log-json file, in order.
std::vector<double> losses_in(const fs::path& path) {
  std::ifstream f(path);
  std::vector<double> out;
  for (std::string line; std::getline(f, line);) out.push_back(json::parse(line)["loss"].get<double>());
  return out;
}

// Two nodes of one rank each; only node 1's launcher gets SIGUSR2. Rank 0 never sees the signal,
// yet both ranks stop after the same step (they reduce the request with the step's loss), with a
// checkpoint of it, and both launchers exit 75 without restarting (--metrics-linger does not hold
// them). Resumed, the run logs the uninterrupted run's losses.
TEST(TrainerStop, Sigusr2ToOneNodeStopsEveryRankAfterACheckpointThatTheRunContinuesFrom) {
  auto d = temp_dir("sigusr2");
  // One thread per rank in both runs: a rank alone on its node would take both CPUs, and the
  // GEMMs' bits depend on the thread count (docs/ops.md, threads).
  const std::string common = "--steps 50 --seq 32 --threads 1 --collective-timeout 30 --log-json ";
  auto whole = run_command(launch(2, common + (d / "whole.jsonl").string()));
  ASSERT_EQ(whole.rc, 0) << whole.output;
  const std::string ckpt = " --checkpoint-dir " + (d / "ckpt").string() + " --resume auto";
  const fs::path log = d / "stopped.jsonl";
  const std::string master = "--master 127.0.0.1:" + std::to_string(free_loopback_port()) + " --token sigusr2 ";
  coshard::testing::CommandResult node[2];
  std::thread nodes[2];
  for (int n = 0; n < 2; ++n) {
    nodes[n] = std::thread([&, n] {
      node[n] = run_command(kRun + " --nnodes 2 --node-rank " + std::to_string(n) + " --nproc-per-node 1 --max-restarts 1 " +
                            master + "-- " + kTrain + " --metrics-port 0 --samples 0 --metrics-linger 300 " + common +
                            log.string() + ckpt);
    });
  }
  const auto deadline = Clock::now() + std::chrono::seconds(120);
  while (lines_in(log) < 10 && Clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  // Anchored at the program, so that neither the shell that runs the launcher nor pkill's matches.
  const bool signalled = run_command("pkill -USR2 -f -- '^[^ ]*/coshard-run --nnodes 2 --node-rank 1 .*sigusr2'").rc == 0;
  for (auto& t : nodes) t.join();
  ASSERT_TRUE(signalled) << "node 1's launcher was gone before step 10: " << node[1].output;
  EXPECT_NE(node[1].output.find("coshard-run: got User defined signal 2, passing it to the ranks"), std::string::npos)
      << node[1].output;
  EXPECT_EQ(node[0].output.find("coshard-run: got User defined signal 2"), std::string::npos) << node[0].output;
  const auto stopped = losses_in(log);
  const int step = static_cast<int>(stopped.size());
  ASSERT_GE(step, 10);
  ASSERT_LT(step, 50) << node[0].output;
  const std::string where = (d / "ckpt" / ("step-" + std::string(8 - std::to_string(step).size(), '0') +
                                           std::to_string(step))).string();
  for (const auto& r : node) {
    EXPECT_EQ(r.rc, 75) << r.output;
    EXPECT_LT(r.seconds, 200) << "--metrics-linger held a stop on request: " << r.output;
    EXPECT_NE(r.output.find("coshard-run: the job stopped (exit code 75): the ranks stopped on request (SIGUSR2)"),
              std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("restart 1 of 1"), std::string::npos) << r.output;
  }
  EXPECT_NE(node[0].output.find("stopped on request (SIGUSR2) after step " + std::to_string(step) +
                                " of 50: checkpoint " + where),
            std::string::npos) << node[0].output;
  EXPECT_TRUE(fs::exists(fs::path(where) / "manifest.json")) << node[0].output;

  auto resumed = run_command(launch(2, common + (d / "resumed.jsonl").string() + ckpt));
  ASSERT_EQ(resumed.rc, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("resumed from " + where + " at step " + std::to_string(step) + " of 50"),
            std::string::npos) << resumed.output;
  auto got = stopped;
  for (double loss : losses_in(d / "resumed.jsonl")) got.push_back(loss);
  const auto want = losses_in(d / "whole.jsonl");
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-6 * want[i]) << "step " << i + 1;
}

}  // namespace
