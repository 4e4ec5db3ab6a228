// Multi-process tests: real ranks started by coshard-run on this host.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

#include "support/run_command.hpp"

namespace {

using Clock = std::chrono::steady_clock;

using Run = coshard::testing::CommandResult;
Run run(const std::string& cmd) { return coshard::testing::run_command(cmd); }

const std::string kRun = COSHARD_RUN_BIN;
const std::string kCheck = RENDEZVOUS_CHECK_BIN;

class Ranks : public ::testing::TestWithParam<int> {};

TEST_P(Ranks, EveryRankRendezvousesAndExchanges) {
  int n = GetParam();
  auto r = run(kRun + " --nproc-per-node " + std::to_string(n) + " -- " + kCheck + " --timeout-ms 30000");
  EXPECT_EQ(r.rc, 0) << r.output;
  for (int i = 0; i < n; ++i) {
    EXPECT_NE(r.output.find("[rank " + std::to_string(i) + "] rank " + std::to_string(i) + " ok world " +
                            std::to_string(n)),
              std::string::npos)
        << r.output;
  }
}

// Named by the rank count: Launcher/Ranks.EveryRankRendezvousesAndExchanges/ranks8.
INSTANTIATE_TEST_SUITE_P(Launcher, Ranks, ::testing::Values(1, 2, 3, 4, 8, 16),
                         [](const ::testing::TestParamInfo<int>& p) { return "ranks" + std::to_string(p.param); });

TEST(Launcher, AFailingRankStopsTheOthersAndIsNamed) {
  auto r = run(kRun + " --nproc-per-node 4 --grace 3 -- " + kCheck + " --fail-rank 2 --timeout-ms 120000");
  EXPECT_EQ(r.rc, 3) << r.output;
  EXPECT_NE(r.output.find("rank 2 (pid"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("exited with status 3"), std::string::npos) << r.output;
  EXPECT_LT(r.seconds, 30) << r.output;
}

TEST(Launcher, MismatchedWorldSizeIsNamed) {
  auto r = run(kRun + " --nproc-per-node 2 -- " + kCheck + " --claim-world 3 --timeout-ms 20000");
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.output.find("world size mismatch: rank 1"), std::string::npos) << r.output;
  EXPECT_LT(r.seconds, 30);
}

TEST(Launcher, SigtermIsForwardedAndTheLauncherExits) {
  std::string pidfile = ::testing::TempDir() + "/coshard-run-sigterm.pid";
  std::string cmd = kRun + " --nproc-per-node 2 --grace 2 -- sleep 60 & echo $! > " + pidfile + "; wait";
  auto start = Clock::now();
  std::thread killer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    std::FILE* f = std::fopen(pidfile.c_str(), "r");
    int pid = 0;
    if (f && std::fscanf(f, "%d", &pid) == 1) ::kill(pid, SIGTERM);
    if (f) std::fclose(f);
  });
  auto r = run("bash -c '" + cmd + "'");
  killer.join();
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - start).count(), 10) << r.output;
  EXPECT_NE(r.output.find("passing it to the ranks"), std::string::npos) << r.output;
}

TEST(Launcher, BadFlagsAreUsageErrors) {
  auto r = run(kRun + " --nproc-per-node zero -- true");
  EXPECT_EQ(r.rc, 2);
  EXPECT_NE(r.output.find("--nproc-per-node needs an integer"), std::string::npos) << r.output;
  r = run(kRun + " --nproc-per-node 2");
  EXPECT_EQ(r.rc, 2);
  EXPECT_NE(r.output.find("no program given"), std::string::npos) << r.output;
  r = run(kRun + " --nnodes 2 --nproc-per-node 1 -- true");
  EXPECT_EQ(r.rc, 2);
  EXPECT_NE(r.output.find("--nnodes > 1 needs --master ADDR:PORT with a fixed port"), std::string::npos) << r.output;
  r = run(kRun + " --nnodes 2 --nproc-per-node 1 --master 127.0.0.1:29400 -- true");
  EXPECT_EQ(r.rc, 2);
  EXPECT_NE(r.output.find("--nnodes > 1 needs --token T"), std::string::npos) << r.output;
}

TEST(Launcher, AMissingProgramIsNamed) {
  auto r = run(kRun + " --nproc-per-node 2 -- /nonexistent/trainer");
  EXPECT_EQ(r.rc, 127) << r.output;
  EXPECT_NE(r.output.find("cannot start '/nonexistent/trainer'"), std::string::npos) << r.output;
}

TEST(Launcher, AnUnreachableMasterFailsWithinTheDeadline) {
  // Rank 1 of 2 whose store never comes up.
  auto r = run("env RANK=1 WORLD_SIZE=2 LOCAL_RANK=1 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=9 "
               "COSHARD_STORE_HOSTED=1 " + kCheck + " --timeout-ms 500");
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.output.find("cannot reach the rendezvous store at 127.0.0.1:9"), std::string::npos) << r.output;
  EXPECT_LT(r.seconds, 10);
}

TEST(Launcher, APortInUseIsNamed) {
  auto first = run(kRun + " --nproc-per-node 1 --master 127.0.0.1:0 -- true");
  EXPECT_EQ(first.rc, 0) << first.output;
  // Occupy a port with a launcher whose rank sleeps, then ask a second launcher for it.
  std::string pidfile = ::testing::TempDir() + "/coshard-run-port.out";
  auto r = run("bash -c '" + kRun + " --nproc-per-node 1 -- sleep 5 2>" + pidfile +
               " & sleep 0.5; port=$(sed -n \"s/.*store at 127.0.0.1:\\([0-9]*\\)/\\1/p\" " + pidfile +
               "); " + kRun + " --nproc-per-node 1 --master 127.0.0.1:$port -- true; rc=$?; kill %1; exit $rc'");
  EXPECT_NE(r.rc, 0) << r.output;
  EXPECT_NE(r.output.find("cannot listen on 127.0.0.1:"), std::string::npos) << r.output;
}

}  // namespace
