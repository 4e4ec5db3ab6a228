// coshard-run --nnodes MIN:MAX: a job that goes on without a lost node and takes it back.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "mp/launcher_nodes.hpp"

namespace {

using coshard::testing::await_node_1_ranks;
using coshard::testing::kRun;
using coshard::testing::launcher_pid;
using coshard::testing::rank_log;
using coshard::testing::run;
using coshard::testing::two_nodes;

TEST(LauncherElastic, BadNodeRangesAreUsageErrors) {
  auto r = run(kRun + " --nnodes 1:2 --node-rank 0 --nproc-per-node 1 --master 127.0.0.1:29400 --token t -- true");
  EXPECT_EQ(r.rc, 2);
  EXPECT_NE(r.output.find("--nnodes 1:2 goes on without a lost node by restarting the others: give --max-restarts N"),
            std::string::npos) << r.output;
  r = run(kRun + " --nnodes 3:2 --max-restarts 1 --nproc-per-node 1 -- true");
  EXPECT_EQ(r.rc, 2);
  EXPECT_NE(r.output.find("--nnodes MIN needs an integer in [1, 2], got '3'"), std::string::npos) << r.output;
  r = run(kRun + " --nnodes 1:x --max-restarts 1 --nproc-per-node 1 -- true");
  EXPECT_EQ(r.rc, 2);
  EXPECT_NE(r.output.find("--nnodes needs an integer in [1, 65536], got 'x'"), std::string::npos) << r.output;
}

// Node 1's launcher frozen (SIGSTOP) while every rank would sleep on: to node 0 it is a host that
// crashed. Node 0 finds it silent, gives it --rejoin-timeout, then restarts without it: its own two
// ranks become the whole job (ranks 0 and 1 of 2). Thawed, node 1's launcher finds itself left
// out, stops its ranks and exits 1; started again, it takes its old place, and the restart that
// this causes takes node 1 back: ranks 0..3 of 4 again, which end the job.
TEST(LauncherElastic, TheJobGoesOnWithoutALostNodeAndTakesItBackWhenItsLauncherReturns) {
  const std::string started = rank_log("elastic");
  const std::string log = rank_log("elastic-world");
  const std::string script = "echo $RANK >> " + started + "; echo attempt $COSHARD_RESTART_COUNT rank $RANK of " +
                             "$WORLD_SIZE node $GROUP_RANK >> " + log +
                             "\ncase $COSHARD_RESTART_COUNT in 0|1) exec sleep 120;; esac\n";
  std::vector<std::string> command;
  coshard::testing::CommandResult again;
  auto r = two_nodes("elastic", script, "--nnodes 1:2 --max-restarts 2 --grace 3 --rejoin-timeout 1 --join-timeout 30", [&] {
    await_node_1_ranks(started);
    const int pid = launcher_pid("elastic", 1);
    ASSERT_GT(pid, 0) << "node 1's launcher not found";
    ::kill(pid, SIGSTOP);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (run("cat " + log).output.find("attempt 1 rank 1 of 2") == std::string::npos &&
           std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    ::kill(pid, SIGCONT);
    ASSERT_NE(run("cat " + log).output.find("attempt 1 rank 1 of 2"), std::string::npos) << "no restart without node 1";
    while (::kill(pid, 0) == 0 && std::chrono::steady_clock::now() < deadline) {  // left out, it ends
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    again = run(command.at(1));
  }, &command);
  EXPECT_EQ(r.node[1].rc, 1) << r.node[1].output;
  EXPECT_NE(r.node[1].output.find("coshard-run: node 1 is left out of the job, which restarts without it: node 1: its "
                                  "coshard-run fell silent"),
            std::string::npos) << r.node[1].output;
  EXPECT_EQ(r.node[0].rc, 0) << r.node[0].output;
  EXPECT_EQ(again.rc, 0) << again.output;
  EXPECT_NE(r.node[0].output.find("restart 1 of 2: node 1: its coshard-run fell silent"), std::string::npos)
      << r.node[0].output;
  EXPECT_NE(r.node[0].output.find("; node(s) 1 did not come back within 1 s (--rejoin-timeout), so the job goes on "
                                  "without them (1 of 2 nodes, --nnodes 1:2)"),
            std::string::npos) << r.node[0].output;
  EXPECT_NE(r.node[0].output.find("started 2 rank(s) of 2"), std::string::npos) << r.node[0].output;
  for (const auto& out : {r.node[0].output, again.output}) {
    EXPECT_NE(out.find("restart 2 of 2: node 1: its coshard-run fell silent and coshard-run pid"), std::string::npos)
        << out;
    EXPECT_NE(out.find("; node(s) 1 rejoin the job"), std::string::npos) << out;
  }
  const std::string world = run("cat " + log).output;
  for (const char* line : {"attempt 0 rank 3 of 4 node 1", "attempt 1 rank 0 of 2 node 0",
                           "attempt 1 rank 1 of 2 node 0", "attempt 2 rank 1 of 4 node 0",
                           "attempt 2 rank 3 of 4 node 1"}) {
    EXPECT_NE(world.find(line), std::string::npos) << line << " missing in\n" << world;
  }
  EXPECT_EQ(world.find("attempt 1 rank 2"), std::string::npos) << world;
  EXPECT_LT(r.node[0].seconds, 90) << r.node[0].output;
}

}  // namespace
