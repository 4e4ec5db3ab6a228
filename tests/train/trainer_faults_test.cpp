// gpt2-train when a rank stops without dying (SIGSTOP: a hung kernel, a swapped-out host, a
// debugger): past the collective deadline every other rank fails naming the operation and the
// silent rank, the launcher names the stopped rank and kills it; a shorter stop loses nothing.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <cmath>
#include <fstream>
#include <string>
#include <thread>

#include "support/run_command.hpp"
#include "train/trainer_support.hpp"

namespace {

using coshard::testing::run_command;
using namespace coshard::testing::train;
using Clock = std::chrono::steady_clock;

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
  const std::string common = "--steps 40 --seq 32 --collective-timeout 60 --log-json ";
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
  EXPECT_EQ(n, 40u);
}

}  // namespace
