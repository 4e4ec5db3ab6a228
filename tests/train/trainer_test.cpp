// gpt2-train, run for real through coshard-run: it learns, resumes, does not depend on the world
// size, and refuses bad input before training (its timeline: trainer_timeline_test.cpp).
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "coshard/gpt2/safetensors.hpp"
#include "coshard/runtime/cuda.hpp"
#include "coshard/fsdp/checkpoint.hpp"
#include "support/run_command.hpp"
#include "train/trainer_support.hpp"

namespace {

using coshard::testing::run_command;
using namespace coshard::testing::train;
using nlohmann::json;
namespace fs = std::filesystem;

TEST(Trainer, DefaultRunLearnsAndLogsEveryStep) {
  auto d = temp_dir("learn");
  const std::string log = (d / "log.jsonl").string();
  auto r = run_command(launch(2, "--steps 40 --warmup-steps 10 --lr-schedule cosine --log-json " + log));
  ASSERT_EQ(r.rc, 0) << r.output;
  std::ifstream f(log);
  std::vector<json> steps;
  for (std::string line; std::getline(f, line);) steps.push_back(json::parse(line));  // every line parses
  ASSERT_EQ(steps.size(), 40u);
  for (const auto& s : steps) {
    for (const char* key : {"step", "loss", "tokens_per_s", "step_s", "exposed_comm_s", "peak_mem_bytes", "state_bytes", "pool_bytes"}) {
      EXPECT_TRUE(s.contains(key)) << key << " missing in " << s.dump();
    }
    // The engine's state and pools are allocated when the step ends, so the peak covers them.
    EXPECT_GE(s["peak_mem_bytes"].get<double>(), s["state_bytes"].get<double>() + s["pool_bytes"].get<double>()) << s.dump();
    EXPECT_GT(s["pool_bytes"].get<double>(), 0) << s.dump();
  }
  const double first = steps.front()["loss"], last = steps.back()["loss"];
  EXPECT_NEAR(first, std::log(256.0), 0.3);  // byte vocabulary at initialisation
  EXPECT_LT(last, 0.5 * first) << r.output;
  EXPECT_NE(r.output.find("trained 40 steps"), std::string::npos) << r.output;
}

// The losses of steps `from`..end of a --log-json - run.
std::vector<double> losses_from(const std::string& output, int from) {
  std::vector<double> out;
  for (const auto& s : step_records(output)) {
    if (s["step"].get<int>() >= from) out.push_back(s["loss"].get<double>());
  }
  return out;
}

// A run resumed from a checkpoint logs exactly what the uninterrupted run logs: on the same world
// size, and on another world size and strategy with the same global batch. Schedule, warmup,
// weight decay, clipping and shuffled data are all on.
TEST(TrainerCheckpoint, ResumedRunsLogTheUninterruptedLosses) {
  auto d = temp_dir("resume");
  const std::string common = "--steps 8 --seq 32 --lr-schedule cosine --warmup-steps 2 --weight-decay 0.1 --clip 1 "
                             "--shuffle --log-json - ";
  auto whole = run_command(launch(2, common + "--batch 4 --checkpoint-dir " + (d / "a").string() +
                                         " --checkpoint-every 4"));
  ASSERT_EQ(whole.rc, 0) << whole.output;
  const auto want = losses_from(whole.output, 5);
  ASSERT_EQ(want.size(), 4u) << whole.output;
  for (const auto& [ranks, extra] : std::vector<std::pair<int, std::string>>{
           {2, "--batch 4 --checkpoint-async false"}, {4, "--batch 2 --strategy hybrid_shard --shard-group 2"},
           {1, "--batch 8 --strategy no_shard"}}) {
    const fs::path dir = d / ("r" + std::to_string(ranks));
    fs::create_directories(dir);
    fs::copy(d / "a" / "step-00000004", dir / "step-00000004", fs::copy_options::recursive);
    auto resumed = run_command(launch(ranks, common + extra + " --checkpoint-dir " + dir.string() + " --resume auto"));
    ASSERT_EQ(resumed.rc, 0) << resumed.output;
    EXPECT_NE(resumed.output.find("resumed from " + (dir / "step-00000004").string() + " at step 4 of 8"),
              std::string::npos) << resumed.output;
    // It said "trained 8 steps", counting the four of the checkpoint.
    EXPECT_NE(resumed.output.find("trained 4 steps (5 to 8, resumed after step 4)"), std::string::npos) << resumed.output;
    const auto got = losses_from(resumed.output, 1);
    ASSERT_EQ(got.size(), want.size()) << resumed.output;
    const double tol = ranks == 2 ? 1e-6 : 1e-5;
    for (std::size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], tol * want[i]) << ranks << " ranks, step " << i + 5;
    EXPECT_TRUE(fs::exists(dir / "step-00000008" / "manifest.json")) << resumed.output;
  }
  // A cosine schedule decays over --steps: a run of it cannot be extended, and says why.
  auto longer = run_command(launch(2, "--steps 10 --seq 32 --lr-schedule cosine --warmup-steps 2 --weight-decay 0.1 "
                                      "--clip 1 --shuffle --batch 4 --resume " + (d / "a" / "step-00000004").string()));
  EXPECT_NE(longer.rc, 0) << longer.output;
  EXPECT_NE(longer.output.find("its cosine learning-rate schedule decays over --steps"), std::string::npos) << longer.output;
}

// A restart emptied --log-json ("w"): only the records since the checkpoint were left.
TEST(TrainerCheckpoint, AResumeKeepsTheLogOfTheStepsBeforeItsCheckpoint) {
  auto d = temp_dir("log-resume");
  const std::string dir = (d / "c").string(), log = (d / "log.jsonl").string();
  const std::string args = "--steps 4 --seq 32 --checkpoint-every 2 --checkpoint-dir " + dir + " --log-json " + log;
  auto r = run_command(launch(2, args));
  ASSERT_EQ(r.rc, 0) << r.output;
  fs::remove_all(fs::path(dir) / "step-00000004");  // as if the job died before its last checkpoint
  r = run_command(launch(2, args + " --resume auto"));
  ASSERT_EQ(r.rc, 0) << r.output;
  std::vector<int> steps;
  std::ifstream f(log);
  for (std::string line; std::getline(f, line);) steps.push_back(json::parse(line)["step"].get<int>());
  EXPECT_EQ(steps, (std::vector<int>{1, 2, 3, 4})) << r.output;

  // A disk that filled up while step 2's record was written left half of it, and the resume kept
  // it: step 3's record was glued to it, a line no reader could parse. Only whole records stay.
  std::string text;
  {
    std::ifstream in(log);
    std::string first, second;
    std::getline(in, first);
    std::getline(in, second);
    text = first + "\n" + second.substr(0, second.size() / 2);
  }
  std::ofstream(log, std::ios::trunc) << text;
  fs::remove_all(fs::path(dir) / "step-00000004");
  r = run_command(launch(2, args + " --resume auto"));
  ASSERT_EQ(r.rc, 0) << r.output;
  steps.clear();
  std::ifstream g(log);
  for (std::string line; std::getline(g, line);) {
    ASSERT_TRUE(json::accept(line)) << "a record cut short stayed: " << line;
    steps.push_back(json::parse(line)["step"].get<int>());
  }
  EXPECT_EQ(steps, (std::vector<int>{1, 3, 4})) << r.output;
}

// A save killed mid-write left its temporary rank file (65 MB for GPT-2 124M) in the step's
// directory for good, also once a later run saved that step again: the commit removes it.
TEST(TrainerCheckpoint, WhatAKilledSaveLeftIsRemovedOnceTheStepIsSavedAgain) {
  auto d = temp_dir("killed-save");
  const std::string dir = (d / "c").string();
  const std::string args = "--steps 4 --seq 32 --checkpoint-every 2 --checkpoint-dir " + dir;
  auto r = run_command(launch(2, args));
  ASSERT_EQ(r.rc, 0) << r.output;
  // As a save of step 4 killed mid-write leaves it: no manifest, half a rank file.
  const fs::path step4 = fs::path(dir) / "step-00000004";
  fs::remove_all(step4);
  fs::create_directories(step4);
  std::ofstream(step4 / "rank00000.bin.tmp.99999") << std::string(4096, 'x');
  r = run_command(launch(2, args + " --resume auto"));
  ASSERT_EQ(r.rc, 0) << r.output;
  EXPECT_TRUE(fs::exists(step4 / "manifest.json")) << r.output;
  for (const auto& e : fs::directory_iterator(step4)) {
    EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos) << e.path() << " stayed";
  }
}

TEST(TrainerCheckpoint, KeepsTheNewestAndPointsLatestAtIt) {
  auto d = temp_dir("keep");
  auto r = run_command(launch(2, "--steps 8 --seq 32 --checkpoint-dir " + d.string() +
                                     " --checkpoint-every 2 --checkpoint-keep 2"));
  ASSERT_EQ(r.rc, 0) << r.output;
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(d)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"latest", "step-00000006", "step-00000008"}));  // no lock left
  std::ifstream latest(d / "latest");
  std::string name;
  latest >> name;
  EXPECT_EQ(name, "step-00000008");
}

TEST(TrainerCheckpoint, ResumesThatWouldNotContinueTheRunAreRefused) {
  auto d = temp_dir("refuse");
  const std::string dir = (d / "c").string();
  auto r = run_command(launch(2, "--steps 4 --seq 32 --checkpoint-dir " + dir + " --checkpoint-every 2"));
  ASSERT_EQ(r.rc, 0) << r.output;
  auto expect_refused = [&](int ranks, const std::string& args, const std::string& needle) {
    auto x = run_command(launch(ranks, args));
    EXPECT_NE(x.rc, 0) << args;
    EXPECT_NE(x.output.find(needle), std::string::npos) << args << "\n" << x.output;
    EXPECT_EQ(x.output.find("step 1/"), std::string::npos) << "trained before refusing: " << x.output;
  };
  expect_refused(2, "--steps 4 --seq 32 --checkpoint-dir " + dir,
                 "already holds checkpoints (the newest is step-00000004): pass --resume auto");
  expect_refused(1, "--steps 4 --seq 32 --resume " + dir + "/step-00000002",
                 "was trained with global_batch = 16 and this run has 8: set ranks x --batch x --grad-accum");
  expect_refused(2, "--steps 4 --seq 16 --resume " + dir + "/step-00000002", "set --seq as it was");
  expect_refused(2, "--steps 4 --seq 32 --resume " + d.string(), "is not a checkpoint (it has no manifest.json");
  expect_refused(2, "--steps 4 --seq 32 --checkpoint-dir " + dir + " --resume " + dir + "/step-00000002",
                 "holds step-00000004, newer than the checkpoint resumed");
  expect_refused(1, "--steps 4 --resume auto", "--resume auto looks under --checkpoint-dir");
  // Resumed at the last step: nothing to train, said as such (was "loss nan -> nan").
  auto done = run_command(launch(2, "--steps 4 --seq 32 --checkpoint-dir " + dir + " --resume auto"));
  EXPECT_EQ(done.rc, 0) << done.output;
  EXPECT_NE(done.output.find("nothing to train: the run resumed after step 4, and --steps is 4; give a larger --steps"),
            std::string::npos)
      << done.output;
  EXPECT_EQ(done.output.find("nan"), std::string::npos) << done.output;
  // And so it can: a constant schedule goes on to a larger --steps (it was refused, "set --steps as it was").
  const auto extended = d / "extended";
  fs::copy(dir, extended, fs::copy_options::recursive);
  auto more = run_command(launch(2, "--steps 6 --seq 32 --checkpoint-dir " + extended.string() + " --resume auto"));
  EXPECT_EQ(more.rc, 0) << more.output;
  EXPECT_NE(more.output.find("trained 2 steps (5 to 6, resumed after step 4)"), std::string::npos) << more.output;
  // A live job's lock (this test's own process) keeps others out.
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  std::ofstream(fs::path(dir) / ".lock") << ::getpid() << " " << host << "\n";
  expect_refused(2, "--steps 4 --seq 32 --checkpoint-dir " + dir + " --resume auto", "is in use by another job (pid " +
                                                                                       std::to_string(::getpid()));
  // Also when it is a step of the same Slurm job on this host (it was taken over as if gone).
  std::ofstream(fs::path(dir) / ".lock") << ::getpid() << " " << host << " slurm:42\n";
  auto x = run_command("SLURM_JOB_ID=42 " + launch(2, "--steps 4 --seq 32 --checkpoint-dir " + dir + " --resume auto"));
  EXPECT_NE(x.rc, 0) << x.output;
  EXPECT_NE(x.output.find("is in use by another job (pid " + std::to_string(::getpid())), std::string::npos) << x.output;
  // An empty lock (a job that died writing it, a full disk) read as "pid 0 on host ".
  std::ofstream(fs::path(dir) / ".lock").close();
  expect_refused(2, "--steps 4 --seq 32 --checkpoint-dir " + dir + " --resume auto",
                 "of --checkpoint-dir names no job (it is empty or unreadable");
  // A --checkpoint-dir that is a file said "filesystem error: cannot create directories: ...".
  std::ofstream(fs::path(dir) / "a-file") << "x";
  expect_refused(1, "--steps 4 --seq 32 --checkpoint-dir " + dir + "/a-file",
                 "--checkpoint-dir " + dir + "/a-file cannot be made a directory for checkpoints");
  fs::remove(fs::path(dir) / "a-file");
  // A manifest forged with a valid checksum, whose step is not its units' step counts, resumed at
  // its step with optimizers of another.
  const fs::path forged = d / "forged";
  fs::copy(fs::path(dir) / "step-00000002", forged, fs::copy_options::recursive);
  auto forged_manifest = coshard::fsdp::read_manifest(forged);
  forged_manifest.metadata["step"] = "1";
  coshard::fsdp::write_manifest(forged, forged_manifest);
  expect_refused(2, "--steps 4 --seq 32 --resume " + forged.string(), "names step 1, but unit '");
  // A pid past pid_t's range, cast, named pid 1 (always alive): the job was refused as in use.
  std::ofstream(fs::path(dir) / ".lock") << "4294967297 " << host << "\n";
  expect_refused(2, "--steps 4 --seq 32 --checkpoint-dir " + dir + " --resume auto", "or names no possible pid");
  fs::remove(fs::path(dir) / ".lock");
  // A manifest that cannot be looked at is no absent one: --resume auto went on from step 4.
  fs::create_directories(fs::path(dir) / "step-00000006");
  fs::create_symlink("manifest.json", fs::path(dir) / "step-00000006" / "manifest.json");
  expect_refused(2, "--steps 4 --seq 32 --checkpoint-dir " + dir + " --resume auto",
                 "cannot look at " + dir + "/step-00000006/manifest.json: Too many levels of symbolic links; the "
                 "checkpoint may be intact");
  fs::remove_all(fs::path(dir) / "step-00000006");
  // A step that is no number, in a manifest of version 1 (no checksum of its own): was std::stoi's
  // bare "stoi", or "8x" read as 8.
  const auto manifest = fs::path(dir) / "step-00000002" / "manifest.json";
  json m = json::parse(std::ifstream(manifest));
  m["version"] = 1;
  m.erase("crc32c");
  m["metadata"]["step"] = "2x";
  std::ofstream(manifest) << m.dump(1);
  expect_refused(2, "--steps 4 --seq 32 --resume " + dir + "/step-00000002",
                 "has step '2x' in its training state, not a step number: it is damaged");
}

// Ranks that see different directories under one --checkpoint-dir (a directory local to each
// host): the save reported success with a manifest naming files rank 0 did not have, and the
// resume left the ranks that found no checkpoint waiting in the load's collectives.
TEST(TrainerCheckpoint, ADirectoryTheRanksSeeApartFailsTheSaveAndTheResumeNamingIt) {
  auto d = temp_dir("apart");
  const std::string apart = kRun + " --nproc-per-node 2 -- sh -c 'exec \"$0\" \"$@\" --checkpoint-dir " + d.string() +
                            "/r$RANK' " + kTrain + " --metrics-port 0 --samples 0 --steps 4 --seq 32";
  auto r = run_command(apart + " --checkpoint-every 2");
  EXPECT_NE(r.rc, 0) << r.output;
  EXPECT_NE(r.output.find("rank 1 wrote its file rank-00001.bin ("), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("but in " + (d / "r0" / "step-00000002").string() +
                          " rank 0 does not find it: the checkpoint directory must be one that every rank sees"),
            std::string::npos)
      << r.output;
  EXPECT_FALSE(fs::exists(d / "r0" / "step-00000002" / "manifest.json"));

  ASSERT_EQ(run_command(launch(2, "--steps 4 --seq 32 --checkpoint-every 2 --checkpoint-dir " + (d / "shared").string())).rc, 0);
  fs::remove_all(d / "r0");
  fs::remove_all(d / "r1");
  fs::copy(d / "shared", d / "r0", fs::copy_options::recursive);
  fs::create_directories(d / "r1");
  const auto t0 = std::chrono::steady_clock::now();
  r = run_command(apart + " --resume auto");
  EXPECT_NE(r.rc, 0) << r.output;
  EXPECT_NE(r.output.find("the ranks found different checkpoints to resume (none on rank(s) 1; step 4 on rank(s) 0; "
                          "this rank: "),
            std::string::npos)
      << r.output;
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(60)) << "waited out a collective's deadline";
  EXPECT_EQ(r.output.find("step 1/"), std::string::npos) << r.output;
}

// A rank killed with SIGKILL mid-run: coshard-run --max-restarts stops the others, starts every
// rank again, and --resume auto continues from the last complete checkpoint, so the job finishes
// with the uninterrupted run's losses.
TEST(TrainerCheckpoint, AKilledRankIsRestartedAndTheRunContinuesFromItsCheckpoint) {
  auto d = temp_dir("restart");
  const std::string common = "--steps 60 --seq 32 --checkpoint-every 4 --log-json - ";
  auto whole = run_command(launch(2, common + "--checkpoint-dir " + (d / "whole").string()));
  ASSERT_EQ(whole.rc, 0) << whole.output;
  const std::string dir = (d / "killed").string();
  coshard::testing::CommandResult job;
  std::thread runner([&] {
    job = run_command(kRun + " --max-restarts 1 --nproc-per-node 2 -- " + kTrain + " --metrics-port 0 --samples 0 " +
                      common + "--checkpoint-dir " + dir + " --resume auto");
  });
  // Once the checkpoint of step 8 is complete, kill the newest rank outright.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (!fs::exists(fs::path(dir) / "step-00000008" / "manifest.json") && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  // "[g]" keeps the pattern from matching the shell that runs pkill.
  const bool killed = run_command("pkill -9 -n -f -- '[g]pt2-train .*" + dir + "'").rc == 0;
  runner.join();
  ASSERT_TRUE(killed) << "no rank to kill, or the checkpoint never came: " << job.output;
  ASSERT_EQ(job.rc, 0) << job.output;
  EXPECT_NE(job.output.find("coshard-run: restart 1 of 1"), std::string::npos) << job.output;
  EXPECT_NE(job.output.find("resumed from " + dir + "/step-"), std::string::npos) << job.output;
  EXPECT_NE(job.output.find(" after restart 1"), std::string::npos) << job.output;
  // The last records are the restarted attempt's steps 51..60.
  const auto want = step_records(whole.output), got = step_records(job.output);
  ASSERT_EQ(want.size(), 60u);
  ASSERT_GE(got.size(), 10u) << job.output;
  for (std::size_t i = 0; i < 10; ++i) {
    const auto& w = want[want.size() - 10 + i];
    const auto& g = got[got.size() - 10 + i];
    ASSERT_EQ(g["step"], w["step"]) << job.output;
    EXPECT_NEAR(g["loss"].get<double>(), w["loss"].get<double>(), 1e-6 * w["loss"].get<double>()) << "step " << w["step"];
  }
}

// A rank killed while it writes its part of a checkpoint: the interrupted directory is no
// checkpoint (no manifest), the one before stays the latest and verifies, and a job started with
// --resume auto continues from it.
TEST(TrainerCheckpoint, AKillDuringASaveLeavesThePreviousCheckpointTheLatest) {
  auto d = temp_dir("kill-save");
  const std::string dir = (d / "c").string();
  // GPT-2 10M's state (130 MB a checkpoint) takes long enough to write to be caught mid-write.
  const std::string common = "--model 10M --steps 12 --batch 1 --seq 32 --checkpoint-dir " + dir +
                             " --checkpoint-every 1 --checkpoint-async false --checkpoint-keep 20 ";
  coshard::testing::CommandResult job;
  std::thread runner([&] { job = run_command(launch(2, common)); });
  // Once step 2 is complete, wait for a rank's temporary file of a later step, then kill that rank.
  auto writing = [&]() -> std::string {
    std::error_code ec;
    for (const auto& e : fs::recursive_directory_iterator(dir, ec)) {
      const auto name = e.path().filename().string();
      if (name.find(".bin.tmp.") != std::string::npos && e.path().parent_path().filename() != "step-00000001" &&
          e.path().parent_path().filename() != "step-00000002") {
        return name.substr(name.rfind('.') + 1);  // the writer's pid
      }
    }
    return {};
  };
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  std::string pid;
  while ((pid = writing()).empty() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  const bool killed = !pid.empty() && ::kill(std::stoi(pid), SIGKILL) == 0;
  runner.join();
  ASSERT_TRUE(killed) << "never caught a rank writing: " << job.output;
  EXPECT_NE(job.rc, 0) << job.output;
  std::map<int, bool> steps;  // step -> complete
  for (const auto& e : fs::directory_iterator(dir)) {
    const auto name = e.path().filename().string();
    if (name.starts_with("step-")) steps[std::stoi(name.substr(5))] = fs::exists(e.path() / "manifest.json");
  }
  ASSERT_FALSE(steps.empty());
  EXPECT_FALSE(steps.rbegin()->second) << "the interrupted save left a manifest";
  const int previous = std::prev(steps.end(), 2)->first;
  char name[32];
  std::snprintf(name, sizeof name, "step-%08d", previous);
  EXPECT_EQ(run_command(std::string(COSHARD_CKPT_BIN) + " verify " + dir + "/" + name).rc, 0);
  auto resumed = run_command(launch(2, common + "--resume auto"));
  EXPECT_EQ(resumed.rc, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("resumed from " + dir + "/" + name), std::string::npos) << resumed.output;
}

// Rank 0 killed at the very system call that would publish step 8's manifest (strace injects the
// SIGKILL at the rename), after every rank's file of that step is complete: the step is no
// checkpoint, step 4 stays the latest and verifies, and --resume auto continues from it.
TEST(TrainerCheckpoint, AKillBetweenTheLastRankFileAndTheManifestLeavesThePreviousCheckpointTheLatest) {
  if (run_command("command -v strace").rc != 0) GTEST_SKIP() << "strace is not installed: scripts/setup installs it";
  auto d = temp_dir("kill-manifest");
  const std::string dir = (d / "c").string(), step8 = dir + "/step-00000008";
  const std::string common = "--steps 12 --seq 32 --checkpoint-every 4 --checkpoint-async false --checkpoint-dir " + dir + " ";
  const std::string wrapper = (d / "rank.sh").string();
  // strace 6.1 matches a rename by its first path only: the temporary manifest, named for rank 0's
  // pid, which -D keeps the shell's ($$). --seccomp-bpf would let that rename through.
  std::ofstream(wrapper) << "if [ \"$RANK\" = 0 ]; then exec strace -D -f -qq -o /dev/null -P " << step8
                         << "/manifest.json.tmp.$$ -e trace=rename -e inject=rename:signal=KILL \"$@\"; fi\n"
                            "exec \"$@\"\n";
  auto job = run_command(kRun + " --nproc-per-node 2 -- sh " + wrapper + " " + kTrain + " --metrics-port 0 --samples 0 " +
                         common);
  EXPECT_NE(job.rc, 0) << job.output;
  EXPECT_NE(job.output.find("rank 0 (pid"), std::string::npos) << job.output;
  EXPECT_NE(job.output.find("was killed by signal 9"), std::string::npos) << job.output;
  // Every rank's file of step 8 is whole; only the manifest is missing.
  for (const char* rank : {"rank-00000.bin", "rank-00001.bin"}) {
    EXPECT_TRUE(fs::exists(step8 + "/" + rank)) << rank << " of step 8 is missing: the kill came too early";
  }
  EXPECT_FALSE(fs::exists(step8 + "/manifest.json")) << "the kill came too late";
  std::ifstream latest(dir + "/latest");
  std::string points_to;
  latest >> points_to;
  EXPECT_EQ(points_to, "step-00000004");
  EXPECT_EQ(run_command(std::string(COSHARD_CKPT_BIN) + " verify " + dir + "/step-00000004").rc, 0);
  auto broken = run_command(std::string(COSHARD_CKPT_BIN) + " verify " + step8);
  EXPECT_NE(broken.rc, 0) << broken.output;
  EXPECT_NE(broken.output.find("no manifest.json"), std::string::npos) << broken.output;
  auto resumed = run_command(launch(2, common + "--resume auto"));
  EXPECT_EQ(resumed.rc, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("resumed from " + dir + "/step-00000004"), std::string::npos) << resumed.output;
}

// coshard-ckpt: export writes what --save writes at the same step, byte for byte; import makes a
// checkpoint of it that exports back to the same bytes; verify finds a flipped byte.
TEST(TrainerCheckpoint, CkptToolExportsWhatSaveWritesImportsAndVerifies) {
  auto d = temp_dir("ckpt-tool");
  const std::string tool = COSHARD_CKPT_BIN, dir = (d / "c").string(), step = dir + "/step-00000004";
  auto r = run_command(launch(2, "--steps 4 --seq 32 --checkpoint-dir " + dir + " --save " +
                                     (d / "saved.safetensors").string() + " --save-hf " + (d / "hf").string()));
  ASSERT_EQ(r.rc, 0) << r.output;
  auto bytes = [](const fs::path& p) {
    std::ifstream f(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), {});
  };
  auto x = run_command(tool + " export " + step + " --to " + (d / "exported.safetensors").string());
  ASSERT_EQ(x.rc, 0) << x.output;
  EXPECT_EQ(bytes(d / "exported.safetensors"), bytes(d / "saved.safetensors"));
  x = run_command(tool + " import " + (d / "saved.safetensors").string() + " " + (d / "imported").string() + " --model tiny");
  ASSERT_EQ(x.rc, 0) << x.output;
  x = run_command(tool + " export " + (d / "imported").string() + " --to " + (d / "again.safetensors").string());
  ASSERT_EQ(x.rc, 0) << x.output;
  EXPECT_EQ(bytes(d / "again.safetensors"), bytes(d / "saved.safetensors"));
  // A Hugging Face directory, as --init takes it (was "Is a directory").
  x = run_command(tool + " import " + (d / "hf").string() + " " + (d / "from-hf").string() + " --model tiny");
  ASSERT_EQ(x.rc, 0) << x.output;
  x = run_command(tool + " export " + (d / "from-hf").string() + " --to " + (d / "hf.safetensors").string());
  ASSERT_EQ(x.rc, 0) << x.output;
  EXPECT_EQ(bytes(d / "hf.safetensors"), bytes(d / "saved.safetensors"));
  // The --checkpoint-dir itself, for one of its checkpoints.
  x = run_command(tool + " export " + dir + " --to " + (d / "root.safetensors").string());
  EXPECT_EQ(x.rc, 1) << x.output;
  EXPECT_NE(x.output.find("has no manifest.json, but holds checkpoints: give one of them, such as '" + step + "'"),
            std::string::npos)
      << x.output;
  x = run_command(tool + " inspect " + step);
  EXPECT_EQ(x.rc, 0) << x.output;
  EXPECT_NE(x.output.find("saved by 2 rank(s), full_shard"), std::string::npos) << x.output;
  EXPECT_NE(x.output.find("step = 4"), std::string::npos) << x.output;
  x = run_command(tool + " verify " + step);
  EXPECT_EQ(x.rc, 0) << x.output;
  // A --to inside the checkpoint replaced one of its files and exited 0.
  const auto manifest = bytes(fs::path(step) / "manifest.json");
  for (const std::string& to : {step + "/manifest.json", dir + "/./step-00000004/rank-00000.bin", step}) {
    x = run_command(tool + " export " + step + " --to " + to);
    EXPECT_EQ(x.rc, 1) << x.output;
    EXPECT_NE(x.output.find("lies inside the checkpoint " + step + " and would replace its files"), std::string::npos)
        << x.output;
  }
  EXPECT_EQ(bytes(fs::path(step) / "manifest.json"), manifest);
  EXPECT_EQ(run_command(tool + " verify " + step).rc, 0);
  {
    std::fstream f(fs::path(step) / "rank-00001.bin", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(100);
    f.put('\x7f');
  }
  x = run_command(tool + " verify " + step);
  EXPECT_EQ(x.rc, 1) << x.output;
  EXPECT_NE(x.output.find("rank-00001.bin' fails its checksum"), std::string::npos) << x.output;
  // A piece that cannot be looked at (root passes EACCES; a loop fails the same stat) is not damage.
  fs::remove(fs::path(step) / "rank-00001.bin");
  fs::create_symlink("rank-00001.bin", fs::path(step) / "rank-00001.bin");
  x = run_command(tool + " verify " + step);
  EXPECT_EQ(x.rc, 1) << x.output;
  EXPECT_NE(x.output.find("rank-00001.bin': Too many levels of symbolic links; the checkpoint may be intact"),
            std::string::npos)
      << x.output;
  EXPECT_EQ(x.output.find("damaged"), std::string::npos) << x.output;
  EXPECT_EQ(run_command(tool + " frobnicate").rc, 2);
}

// A full disk in the middle of a save: the job fails naming the file and the error, no manifest
// is left behind, and the previous checkpoint stays the latest and loadable. The disk is a 4.5 MB
// tmpfs in a mount namespace of the test's own (a checkpoint of the tiny model takes 3.1 MB).
TEST(TrainerCheckpointE2E, AFullDiskFailsTheSaveAndKeepsThePreviousCheckpoint) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to mount a small tmpfs in a private mount namespace";
  auto d = temp_dir("enospc");
  const std::string disk = (d / "disk").string(), dir = disk + "/ckpt";
  fs::create_directories(disk);
  auto r = run_command("unshare -m sh -c 'mount --make-rprivate / && mount -t tmpfs -o size=4608k tmpfs " + disk +
                       " && " + launch(2, "--steps 6 --seq 32 --checkpoint-dir " + dir + " --checkpoint-every 2 "
                                          "--checkpoint-async false") +
                       "; rc=$?; " + COSHARD_CKPT_BIN + " verify $(cat " + dir + "/latest | sed s@^@" + dir + "/@); " +
                       "ls " + dir + "; exit $rc'");
  EXPECT_NE(r.rc, 0) << r.output;
  EXPECT_NE(r.output.find("No space left on device"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("No manifest was written, so the previous checkpoint is still the latest"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("step-00000002: ok"), std::string::npos) << r.output;  // latest, and it verifies
  EXPECT_EQ(r.output.find("step-00000004/manifest"), std::string::npos) << r.output;
}

// The cpu-discrete device (device memory the host cannot touch, as a GPU's) trains GPT-2 to the
// same losses as the plain CPU device: checkpoints saved and resumed, mixed precision and offload
// included. A host access to device memory anywhere on the way aborts the rank, naming it.
TEST(TrainerDiscrete, SameLossesAsTheCpuDevice) {
  auto d = temp_dir("discrete");
  const std::string common = "--steps 6 --seq 32 --clip 1 --log-json - ";
  for (const std::string extra : {"", "--mixed-precision bf16 --offload --strategy shard_grad_op"}) {
    auto cpu = run_command(launch(2, common + extra));
    ASSERT_EQ(cpu.rc, 0) << cpu.output;
    const fs::path dir = d / ("ckpt" + std::to_string(extra.size()));
    auto discrete = run_command(launch(2, common + extra + " --device cpu-discrete --checkpoint-every 3 --checkpoint-dir " +
                                              dir.string()));
    ASSERT_EQ(discrete.rc, 0) << discrete.output;
    const auto want = losses_from(cpu.output, 1), got = losses_from(discrete.output, 1);
    ASSERT_EQ(want.size(), 6u) << cpu.output;
    ASSERT_EQ(got, want) << discrete.output;
    auto resumed = run_command(launch(2, common + extra + " --device cpu-discrete --resume " +
                                             (dir / "step-00000003").string()));
    ASSERT_EQ(resumed.rc, 0) << resumed.output;
    const auto tail = losses_from(resumed.output, 4);
    ASSERT_EQ(tail.size(), 3u) << resumed.output;
    for (std::size_t i = 0; i < tail.size(); ++i) EXPECT_NEAR(tail[i], want[3 + i], 1e-6 * want[3 + i]) << "step " << i + 4;
  }
}

// The CUDA runs themselves are the gpu suite's (trainer_cuda_test.cpp).
// Without a usable GPU (this machine and CI's), --device cuda says why and fails. Not every rank
// gets to say it: the first rank to fail makes coshard-run stop the others (a fresh machine's run
// saw rank 1 stopped before it printed anything), so the job's own lines are what is checked.
TEST(TrainerCuda, WithoutAUsableGpuDeviceCudaSaysWhy) {
  if (coshard::cuda::probe().devices > 0) GTEST_SKIP() << "a CUDA device is visible here";
  auto r = run_command(launch(2, "--steps 1 --device cuda"));
  EXPECT_NE(r.rc, 0) << r.output;
  EXPECT_NE(r.output.find("started 2 rank(s) of 2"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("cannot use cuda:"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("run on the CPU backend"), std::string::npos) << r.output;
}

// The global batch of a step is the same sequences for any world size with the same global batch.
class WorldSize : public ::testing::TestWithParam<std::string> {};

TEST_P(WorldSize, OneRankOfSixEqualsThreeRanksOfTwo) {
  const std::string common = "--steps 4 --seq 32 --clip 0 --log-json - --strategy " + GetParam();
  const bool hybrid = GetParam().starts_with("hybrid");
  auto one = run_command(launch(1, common + " --batch 6" + (hybrid ? " --shard-group 1" : "")));
  // A hybrid strategy's shard group defaults to the ranks of the host: the 3 here.
  auto three = run_command(launch(3, common + " --batch 2"));
  ASSERT_EQ(one.rc, 0) << one.output;
  ASSERT_EQ(three.rc, 0) << three.output;
  if (hybrid) {
    EXPECT_NE(one.output.find("1 rank(s), hybrid_shard (shard groups of 1 rank)"), std::string::npos) << one.output;
    EXPECT_NE(three.output.find("3 rank(s), hybrid_shard (shard groups of 3 ranks)"), std::string::npos)
        << three.output;
  }
  expect_same_step_losses(one.output, three.output, 4, 1e-5);
}

// Named by the strategy: Trainer/WorldSize.OneRankOfSixEqualsThreeRanksOfTwo/hybrid_shard.
INSTANTIATE_TEST_SUITE_P(Trainer, WorldSize,
                         ::testing::Values("full_shard", "shard_grad_op", "no_shard", "hybrid_shard"),
                         [](const ::testing::TestParamInfo<std::string>& p) { return p.param; });

// mpirun starts the ranks with nothing of ours set: they derive the store from Open MPI's job
// name, on loopback, and train as coshard-run's (hybrid: the 3 ranks of this host, one group).
TEST(TrainerLaunchers, MpirunOnOneHostTrainsWithTheLossesOfCoshardRun) {
  if (run_command("command -v mpirun").rc != 0) GTEST_SKIP() << "mpirun is not installed: scripts/setup installs openmpi-bin";
  const std::string common = "--steps 4 --seq 32 --batch 2 --log-json - --strategy hybrid_shard";
  auto ours = run_command(launch(3, common));
  auto mpi = run_command("mpirun --allow-run-as-root --oversubscribe -np 3 " + kTrain + " --metrics-port 0 --samples 0 " +
                         common + device_args(common));
  ASSERT_EQ(ours.rc, 0) << ours.output;
  ASSERT_EQ(mpi.rc, 0) << mpi.output;
  EXPECT_NE(mpi.output.find("3 rank(s), hybrid_shard (shard groups of 3 ranks)"), std::string::npos) << mpi.output;
  expect_same_step_losses(ours.output, mpi.output, 4, 1e-6);
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
  r = run_command(kTrain + " --f32-compute");
  EXPECT_EQ(r.rc, 2) << r.output;
  EXPECT_NE(r.output.find("--f32-compute goes with --mixed-precision bf16"), std::string::npos) << r.output;
  // NaN passes CLI11's range checks: --lr nan failed after a step, --clip nan turned clipping off,
  // a timeout of nan became an integer's undefined value; -1 became the largest seed.
  for (const char* flag : {"--lr", "--weight-decay", "--clip", "--val-fraction", "--collective-timeout",
                           "--rendezvous-timeout", "--metrics-linger"}) {
    r = run_command(kTrain + " " + flag + " nan");
    EXPECT_EQ(r.rc, 2) << flag << ": " << r.output;
    EXPECT_NE(r.output.find(std::string(flag) + ": must be a finite number, not nan"), std::string::npos) << r.output;
  }
  // CLI11 said "Value 0 not in range 0.000000 to 1797...(309 digits)" of --lr 0, and the digits
  // of the largest double of a negative --clip.
  for (const auto& [flag, said] : std::vector<std::pair<std::string, std::string>>{
           {"--lr 0", "--lr: must be greater than 0, not 0"}, {"--clip -1", "--clip: must be at least 0, not -1"},
           {"--warmup-steps -2", "--warmup-steps: must be at least 0, not -2"}}) {
    r = run_command(kTrain + " " + flag);
    EXPECT_EQ(r.rc, 2) << flag << ": " << r.output;
    EXPECT_NE(r.output.find(said), std::string::npos) << r.output;
    EXPECT_LT(r.output.size(), 400u) << "a short message: " << r.output;
  }
  for (const char* seed : {"-1", "18446744073709551616"}) {
    r = run_command(kTrain + " --seed " + seed);
    EXPECT_EQ(r.rc, 2) << r.output;
    EXPECT_NE(r.output.find("--seed: must be a whole number from 0 to 18446744073709551615, not " + std::string(seed)),
              std::string::npos)
        << r.output;
  }
  // CLI11 read whole numbers as C literals: 010 was 8 (so this passed as 8 <= 9), 0x10 was 16.
  r = run_command(kTrain + " --steps 9 --warmup-steps 010");
  EXPECT_EQ(r.rc, 2) << r.output;
  EXPECT_NE(r.output.find("--warmup-steps 10 is more than --steps 9"), std::string::npos) << r.output;
  for (const char* batch : {"0x10", "1e3", "+"}) {
    r = run_command(kTrain + " --batch " + batch);
    EXPECT_EQ(r.rc, 2) << r.output;
    EXPECT_NE(r.output.find("--batch: must be a whole number in decimal, not " + std::string(batch)), std::string::npos)
        << r.output;
  }
  r = run_command(kTrain + " --steps 3 --warmup-steps 10");
  EXPECT_EQ(r.rc, 2) << r.output;
  EXPECT_NE(r.output.find("--warmup-steps 10 is more than --steps 3: the learning rate would never reach --lr"),
            std::string::npos)
      << r.output;
  r = run_command(kTrain + " --help");
  EXPECT_EQ(r.rc, 0);
  EXPECT_NE(r.output.find("--backward-prefetch"), std::string::npos);
}

// A diverged run trained on in nan, wrote checkpoints of nan weights (pruning the good ones with
// --checkpoint-keep) and its --save, and exited 0. The weights that gave the first nan are those
// of the checkpoint before that step: it goes too, and the newest left is older.
TEST(TrainerErrors, ADivergedRunStopsWithoutKeepingTheWeightsThatDiverged) {
  auto d = temp_dir("diverge");
  const std::string save = (d / "model.safetensors").string();
  // At this rate the loss is nan by step 3 (step 2 at higher ones): a good checkpoint comes first.
  auto r = run_command(launch(2, "--steps 20 --seq 32 --lr 1e5 --clip 0 --checkpoint-dir " + (d / "c").string() +
                                     " --checkpoint-every 1 --checkpoint-keep 2 --save " + save));
  EXPECT_EQ(r.rc, 1) << r.output;
  const auto at = r.output.find(": the training loss (mean over ranks) is ");
  ASSERT_NE(at, std::string::npos) << r.output;
  EXPECT_TRUE(r.output.compare(at, 47, ": the training loss (mean over ranks) is nan: t") == 0 ||
              r.output.compare(at, 47, ": the training loss (mean over ranks) is inf: t") == 0)
      << r.output;
  // "step N: the training loss ...": the weights of step-(N-1) gave it.
  const int diverged = std::atoi(r.output.c_str() + r.output.rfind("step ", at) + 5);
  ASSERT_GT(diverged, 2) << "diverged too early to keep a checkpoint before: raise --lr less\n" << r.output;
  char removed[32];
  std::snprintf(removed, sizeof removed, "step-%08d", diverged - 1);
  EXPECT_NE(r.output.find("training diverged, and --save is not written; the checkpoint of the weights that gave it, " +
                          std::string(removed) + ", is removed, so --resume auto restarts from an older one. Lower --lr"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("trained 20 steps"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(save)) << r.output;
  for (const auto& e : fs::directory_iterator(d / "c")) {
    const auto name = e.path().filename().string();
    if (name.rfind("step-", 0) == 0) {
      EXPECT_LT(std::atoi(name.c_str() + 5), diverged - 1) << name << "\n" << r.output;
    }
  }
  {  // the one before is kept, and named the latest
    char kept[32];
    std::snprintf(kept, sizeof kept, "step-%08d", diverged - 2);
    EXPECT_TRUE(fs::exists(d / "c" / kept / "manifest.json")) << r.output;
    std::string latest;
    std::ifstream(d / "c" / "latest") >> latest;
    EXPECT_EQ(latest, kept) << r.output;
  }
}

// A --trace in a folder local to each host: rank 0 failed after training with "cannot read the
// trace '...rank1': check the path".
TEST(TrainerErrors, ATraceTheRanksSeeApartIsNamedAndItsPartsAreKept) {
  auto d = temp_dir("trace-apart");
  const std::string apart = kRun + " --nproc-per-node 2 -- sh -c 'mkdir -p " + d.string() + "/r$RANK && exec \"$0\" " +
                            "\"$@\" --trace " + d.string() + "/r$RANK/t.json' " + kTrain +
                            " --metrics-port 0 --samples 0 --steps 2 --seq 32";
  auto r = run_command(apart);
  EXPECT_NE(r.rc, 0) << r.output;
  EXPECT_NE(r.output.find("--trace " + (d / "r0" / "t.json").string() + ": rank 0 does not find the part(s) of rank(s) "
                          "1 (" + (d / "r0" / "t.json").string() + ".rankN): give --trace on a file system that every "
                          "rank sees"),
            std::string::npos)
      << r.output;
  EXPECT_TRUE(fs::exists(d / "r1" / "t.json.rank1")) << r.output;
  EXPECT_TRUE(fs::exists(d / "r0" / "t.json.rank0")) << r.output;
}

// A directory as --init's config.json gave a parse error without naming it.
TEST(TrainerErrors, AnInitConfigThatIsADirectoryIsNamed) {
  auto d = temp_dir("init-dir");
  fs::create_directories(d / "hf" / "config.json");
  auto r = run_command("timeout 60 " + kTrain + " --metrics-port 0 --steps 1 --init " + (d / "hf").string());
  EXPECT_NE(r.rc, 0) << r.output;
  EXPECT_NE(r.output.find("cannot read '" + (d / "hf" / "config.json").string() + "': it is a directory"),
            std::string::npos)
      << r.output;
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
  // Outputs that failed only after the whole run: a directory, a name too long for the atomic
  // write's temporary, a --trace that was never probed.
  auto d = temp_dir("outputs");
  fs::create_directories(d / "adir");
  fs::create_directories(d / "hf" / "model.safetensors");
  const std::string long_name = (d / (std::string(250, 'x') + ".st")).string();
  for (const auto& [args, needle] : std::vector<std::pair<std::string, std::string>>{
           {"--save " + (d / "adir").string(), (d / "adir").string() + " is a directory; give a file name"},
           {"--save-hf " + (d / "hf").string(), (d / "hf" / "model.safetensors").string() + " is a directory"},
           {"--save " + long_name, "the name short enough for the temporary"},
           {"--trace " + (d / "adir").string(), "cannot write --trace " + (d / "adir").string()},
           {"--log-json " + (d / "adir").string(), "cannot write --log-json " + (d / "adir").string()},
           {"--trace " + (d / "nodir" / "t.json").string(), "the folder " + (d / "nodir").string() + " must exist"}}) {
    r = run_command(kTrain + " --metrics-port 0 --samples 0 --steps 5 " + args);
    EXPECT_NE(r.rc, 0) << args;
    EXPECT_NE(r.output.find(needle), std::string::npos) << args << "\n" << r.output;
    EXPECT_EQ(r.output.find("step "), std::string::npos) << "training started: " << r.output;
  }
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

// The local addresses (hex, as /proc/net/tcp{,6} write them) that process `pid` listens on.
std::vector<std::string> listening_addresses(int pid) {
  std::set<std::string> inodes;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/proc/" + std::to_string(pid) + "/fd", ec)) {
    const std::string link = fs::read_symlink(e.path(), ec).string();
    if (link.rfind("socket:[", 0) == 0) inodes.insert(link.substr(8, link.size() - 9));
  }
  std::vector<std::string> out;
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream f(table);
    std::string line;
    std::getline(f, line);  // the header
    while (std::getline(f, line)) {
      std::istringstream in(line);
      std::string slot, local, remote, state, queues, timer, retransmits, uid, timeout, inode;
      in >> slot >> local >> remote >> state >> queues >> timer >> retransmits >> uid >> timeout >> inode;
      if (state == "0A" && inodes.count(inode)) out.push_back(local.substr(0, local.find(':')));
    }
  }
  return out;
}

// Each rank's UCX workers listened on every interface (192.0.2.2 as well as 127.0.0.1 here), in a
// job that never leaves this host: such a job's ranks now listen on loopback only.
TEST(TrainerNetwork, AJobOnOneHostListensOnLoopbackOnly) {
  auto d = temp_dir("loopback");
  const std::string pid_file = (d / "launcher.pid").string();
  coshard::testing::CommandResult r;
  std::thread job([&] {
    r = run_command("bash -c 'echo $$ > " + pid_file + "; exec " + launch(2, "--steps 100000 --seq 32") + "'");
  });
  int launcher = 0;
  std::vector<int> ranks;
  std::vector<std::string> seen;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  // Each rank: its metrics endpoint and, once connected, its UCX workers' listeners.
  while (seen.size() < 4 && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    if (!launcher) std::ifstream(pid_file) >> launcher;
    if (!launcher) continue;
    ranks.clear();
    std::ifstream children("/proc/" + std::to_string(launcher) + "/task/" + std::to_string(launcher) + "/children");
    for (int pid; children >> pid;) ranks.push_back(pid);
    seen.clear();
    for (int pid : ranks) {
      for (const auto& a : listening_addresses(pid)) seen.push_back(a);
    }
  }
  if (launcher) ::kill(launcher, SIGTERM);
  job.join();
  ASSERT_EQ(ranks.size(), 2u) << r.output;
  ASSERT_GE(seen.size(), 4u) << "the ranks did not listen as they train\n" << r.output;
  for (const auto& a : seen) {
    EXPECT_TRUE(a == "0100007F" || a == "00000000000000000000000001000000") << "a rank listens on " << a;
  }
}

}  // namespace
