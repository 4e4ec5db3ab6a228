// coshard-run --nnodes MIN:MAX: a job that starts without every node, goes on without a lost
// node, and takes a node in when its launcher comes.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "mp/launcher_nodes.hpp"
#include "support/loopback.hpp"

namespace {

using coshard::testing::await_line;
using coshard::testing::await_node_1_ranks;
using coshard::testing::kRun;
using coshard::testing::freeze;
using coshard::testing::launcher_pid;
using coshard::testing::rank_log;
using coshard::testing::run;
using coshard::testing::two_nodes;

// Each rank appends "attempt A rank R of W node G" to `log`; the ranks of attempts up to `last`
// sleep on (until a restart stops them), the others end at once.
std::string world_script(const std::string& log, const std::string& sleepers) {
  return "echo attempt $COSHARD_RESTART_COUNT rank $RANK of $WORLD_SIZE node $GROUP_RANK >> " + log +
         "\ncase $COSHARD_RESTART_COUNT in " + sleepers + ") exec sleep 120;; esac\n";
}

// The take-in tests' scripts, in pieces. Each rank appends "attempt A rank R of W node G" to
// `log`; only attempt 0's ranks go on (later attempts end at once).
std::string attempt_0_only(const std::string& log) {
  return "echo attempt $COSHARD_RESTART_COUNT rank $RANK of $WORLD_SIZE node $GROUP_RANK >> " + log +
         "\n[ $COSHARD_RESTART_COUNT = 0 ] || exit 0\n";
}

// Takes SIGUSR2 as a StopSignal would: logs "usr2 rank R" and runs `then`, and leaves the marker
// that tells the launcher so.
std::string takes_usr2(const std::string& log, const std::string& then = "") {
  return "trap 'echo usr2 rank $RANK >> " + log + (then.empty() ? "" : "; " + then) +
         "' USR2\ntouch \"$COSHARD_FLIGHT_DIR/coshard-sigusr2-$$\"\n";
}

// "ready rank R" in `log`, for await_ready; kRunOn then runs until the rank is stopped.
std::string ready(const std::string& log) { return "echo ready rank $RANK >> " + log + "\n"; }
const std::string kRunOn = "while true; do sleep 0.1; done\n";

// Waits until ranks 0..n-1 wrote "ready rank R" to `log` (after their SIGUSR2 marker), and the
// launchers, which poll the markers every 200 ms, have seen them; whether they did.
bool await_ready(const std::string& log, int n) {
  for (int rank = 0; rank < n; ++rank) {
    if (!await_line(log, "ready rank " + std::to_string(rank))) return false;
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  return true;
}

void expect_lines(const std::string& log, const std::vector<std::string>& lines) {
  const std::string world = run("cat " + log).output;
  for (const auto& line : lines) EXPECT_NE(world.find(line), std::string::npos) << line << " missing in\n" << world;
}

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
  r = run(kRun + " --nnodes 2 --node-rank 0 --nproc-per-node 1 --master 127.0.0.1:29400 --token t --last-call 5 -- "
                 "true");
  EXPECT_EQ(r.rc, 2);
  EXPECT_NE(r.output.find("with --nnodes 2 every node must join: drop --last-call, or give --nnodes MIN:2"),
            std::string::npos) << r.output;
  r = run(kRun + " --nnodes 2 --node-rank 0 --nproc-per-node 1 --master 127.0.0.1:29400 --token t --take-in-timeout 5 "
                 "-- true");
  EXPECT_EQ(r.rc, 2);
  EXPECT_NE(r.output.find("with --nnodes 2 no node is taken in: drop --take-in-timeout, or give --nnodes MIN:2"),
            std::string::npos) << r.output;
}

// Fewer than MIN nodes by --join-timeout: node 0 names the nodes that did not come. A node that
// comes when node 0 runs its last attempt cannot be taken in: it says so and leaves the job be.
TEST(LauncherElastic, TooFewNodesOrNoRestartLeftToTakeOneInAreNamed) {
  const std::string master = "--master 127.0.0.1:" + std::to_string(coshard::testing::free_loopback_port());
  auto r = run(kRun + " --nnodes 2:3 --node-rank 0 --nproc-per-node 1 " + master + " --token few --max-restarts 1 "
               "--join-timeout 1 -- true");
  EXPECT_EQ(r.rc, 1) << r.output;
  EXPECT_NE(r.output.find("only node(s) 0 joined within 1 s (--join-timeout), fewer than the 2 that --nnodes 2:3 "
                          "needs: start coshard-run on node(s) 1, 2 with " + master + ", or lower MIN"),
            std::string::npos) << r.output;
  // At the largest MAX node 0 still gives up within its deadline and a poll, and names the nodes
  // as a range, not 65535 numbers. (How long a poll takes is a figure for docs/launch.md: here
  // 2.15 s in all under --join-timeout 2, against 4.6 s with a store get per node.)
  r = run(kRun + " --nnodes 2:65536 --node-rank 0 --nproc-per-node 1 " + master + " --token many --max-restarts 1 "
          "--join-timeout 1 -- true");
  EXPECT_EQ(r.rc, 1) << r.output;
  EXPECT_NE(r.output.find("only node(s) 0 joined within 1 s (--join-timeout), fewer than the 2 that --nnodes 2:65536 "
                          "needs: start coshard-run on node(s) 1-65535 with " + master + ", or lower MIN"),
            std::string::npos) << r.output.substr(0, 2000);
  EXPECT_LT(r.seconds, 10) << r.output.substr(0, 2000);

  const std::string log = rank_log("last-call");
  std::vector<std::string> command;
  coshard::testing::CommandResult late;
  // Attempt 0 fails on node 0 alone, attempt 1 (the last) runs until node 1 has come and gone.
  const std::string gone = log + ".gone";
  std::remove(gone.c_str());
  const std::string script = "echo attempt $COSHARD_RESTART_COUNT rank $RANK >> " + log +
                             "\ncase $COSHARD_RESTART_COUNT in 0) exit 3;; esac\nfor i in $(seq 600); do [ -e " + gone +
                             " ] && exit 0; sleep 0.1; done\n";
  auto job = two_nodes("last-call", script, "--nnodes 1:2 --max-restarts 1 --grace 3 --last-call 0 --join-timeout 30",
                       [&] {
                         ASSERT_TRUE(await_line(log, "attempt 1 rank 1")) << "node 0 did not restart";
                         late = run(command.at(1));
                         run("touch " + gone);
                       }, &command, /*node_1_later=*/true);
  EXPECT_EQ(job.node[0].rc, 0) << job.node[0].output;
  EXPECT_EQ(late.rc, 1) << late.output;
  EXPECT_NE(late.output.find("node 1: its coshard-run joined after the job started on node(s) 0 (--nnodes 1:2), but "
                             "node 0 runs the job's last attempt (--max-restarts 1): no restart is left to take node "
                             "1 in"),
            std::string::npos) << late.output;
}

// Under --nnodes 2:3 node 0 waits --last-call (60 s) for node 2 with node 1 joined. Node 1's
// launcher beats while it waits, so a second launcher for node rank 1 is refused rather than
// taken for its successor; SIGTERM ends node 0's wait, and node 0 tells node 1 why.
TEST(LauncherElastic, ALauncherWaitingForTheStartBeatsSoThatASecondOneIsRefused) {
  std::vector<std::string> command;
  coshard::testing::CommandResult twice;
  auto r = two_nodes("waiting", "true\n", "--nnodes 2:3 --max-restarts 1 --last-call 60 --join-timeout 30", [&] {
    std::this_thread::sleep_for(std::chrono::seconds(2));
    twice = run(command.at(1));
    const int pid = launcher_pid("waiting", 0);
    ASSERT_GT(pid, 0) << "node 0's launcher not found";
    ::kill(pid, SIGTERM);
  }, &command);
  EXPECT_EQ(twice.rc, 1) << twice.output;
  EXPECT_NE(twice.output.find("node rank 1 was started twice: coshard-run pid"), std::string::npos) << twice.output;
  EXPECT_EQ(r.node[0].rc, 128 + SIGTERM) << r.node[0].output;
  EXPECT_NE(r.node[0].output.find("2 of 3 nodes joined (--nnodes 2:3); the job starts in 60 s (--last-call)"),
            std::string::npos) << r.node[0].output;
  EXPECT_NE(r.node[0].output.find("node 0 got Terminated while the nodes joined"), std::string::npos)
      << r.node[0].output;
  EXPECT_EQ(r.node[1].rc, 1) << r.node[1].output;
  EXPECT_NE(r.node[1].output.find("node 1 cannot join the job: node 0 got Terminated while the nodes joined"),
            std::string::npos) << r.node[1].output;
  EXPECT_LT(r.node[0].seconds, 40) << r.node[0].output;
  EXPECT_LT(r.node[1].seconds, 40) << r.node[1].output;
}

// As above with node 2 still absent, but node 0's launcher frozen (SIGSTOP) for 4 s while it waits
// --last-call: node 1's store calls time out (after 2 s, a third of --silence-timeout 6) before
// node 0 started the job. Node 1 tries again for
// --rejoin-timeout, as it would in an attempt (it gave up at its first call that timed out), reaches
// the store once node 0 runs on, and the job starts on nodes 0 and 1 after the last call.
TEST(LauncherElastic, ANodeWaitingForTheStartRidesOutAStoreOutage) {
  const std::string log = rank_log("start-outage");
  auto r = two_nodes("start-outage", attempt_0_only(log), "--nnodes 2:3 --max-restarts 1 --last-call 9 "
                     "--rejoin-timeout 20 --join-timeout 30 --silence-timeout 6", [&] {
    std::this_thread::sleep_for(std::chrono::seconds(3));
    const int pid = launcher_pid("start-outage", 0);
    ASSERT_GT(pid, 0) << "node 0's launcher not found";
    freeze(pid, std::chrono::seconds(4));
  });
  for (const auto& node : r.node) EXPECT_EQ(node.rc, 0) << node.output;
  EXPECT_NE(r.node[1].output.find("stopped answering"), std::string::npos) << r.node[1].output;
  EXPECT_NE(r.node[1].output.find("trying to reach it again for 20 s (--rejoin-timeout)"), std::string::npos)
      << r.node[1].output;
  EXPECT_NE(r.node[1].output.find(" again after "), std::string::npos) << r.node[1].output;
  expect_lines(log, {"attempt 0 rank 0 of 4 node 0", "attempt 0 rank 3 of 4 node 1"});
}

// As above, node 0's launcher killed (SIGKILL) instead: it cannot say why, so node 1 takes the
// store's loss for a cut, tries for --rejoin-timeout (2 s) and then names the store it lost.
TEST(LauncherElastic, ANodeWhoseNodeZeroIsKilledBeforeTheStartGivesUpAtTheRejoinTimeout) {
  auto r = two_nodes("start-killed", "true\n", "--nnodes 2:3 --max-restarts 1 --last-call 60 --rejoin-timeout 2 "
                     "--join-timeout 30", [&] {
    std::this_thread::sleep_for(std::chrono::seconds(3));
    const int pid = launcher_pid("start-killed", 0);
    ASSERT_GT(pid, 0) << "node 0's launcher not found";
    ::kill(pid, SIGKILL);
  });
  EXPECT_EQ(r.node[0].rc, 128 + SIGKILL) << r.node[0].output;
  EXPECT_EQ(r.node[1].rc, 1) << r.node[1].output;
  EXPECT_NE(r.node[1].output.find("node 1 lost the store at 127.0.0.1:"), std::string::npos) << r.node[1].output;
  EXPECT_NE(r.node[1].output.find("(node 0's coshard-run): not reached for "), std::string::npos) << r.node[1].output;
  EXPECT_NE(r.node[1].output.find(" s (--rejoin-timeout): "), std::string::npos) << r.node[1].output;
  EXPECT_NE(r.node[1].output.find(", before node 0 started the job"), std::string::npos) << r.node[1].output;
  EXPECT_LT(r.node[1].seconds, 20) << r.node[1].output;
}

// Node 0 starts alone after --last-call: its two ranks are the job (0 and 1 of 2). Node 1's
// launcher, started later, asks to be taken in, and the restart that this causes runs ranks 0..3
// of 4, which end the job.
TEST(LauncherElastic, AJobStartsOnTheNodesThatJoinedAndTakesInOneThatJoinsLater) {
  const std::string log = rank_log("late");
  std::vector<std::string> command;
  coshard::testing::CommandResult late;
  auto r = two_nodes("late", world_script(log, "0"), "--nnodes 1:2 --max-restarts 1 --grace 3 --last-call 1 "
                     "--join-timeout 30", [&] {
    ASSERT_TRUE(await_line(log, "attempt 0 rank 1 of 2 node 0")) << "node 0 did not start alone";
    late = run(command.at(1));
  }, &command, /*node_1_later=*/true);
  EXPECT_EQ(r.node[0].rc, 0) << r.node[0].output;
  EXPECT_EQ(late.rc, 0) << late.output;
  EXPECT_NE(r.node[0].output.find("1 of 2 nodes joined (--nnodes 1:2); the job starts in 1 s (--last-call)"),
            std::string::npos) << r.node[0].output;
  EXPECT_NE(r.node[0].output.find("the job starts on node(s) 0 of 2; node(s) 1 are taken in"), std::string::npos)
      << r.node[0].output;
  for (const auto& out : {r.node[0].output, late.output}) {
    EXPECT_NE(out.find("restart 1 of 1: node 1: its coshard-run joined after the job started on node(s) 0 (--nnodes "
                       "1:2); node(s) 1 rejoin the job"),
              std::string::npos) << out;
  }
  expect_lines(log, {"attempt 0 rank 0 of 2 node 0", "attempt 0 rank 1 of 2 node 0", "attempt 1 rank 0 of 4 node 0",
                     "attempt 1 rank 3 of 4 node 1"});
  EXPECT_EQ(run("cat " + log).output.find("attempt 0 rank 2"), std::string::npos);
}

// Node 1's launcher frozen (SIGSTOP) while every rank would sleep on: to node 0 it is a host that
// crashed. Node 0 finds it silent (--silence-timeout 4), gives it --rejoin-timeout, then restarts
// without it: its own two ranks become the whole job (ranks 0 and 1 of 2). Thawed, node 1's
// launcher finds itself left out of that restart, stops its ranks and asks to be taken in, and the
// restart that this causes runs ranks 0..3 of 4 again, which end the job.
TEST(LauncherElastic, TheJobGoesOnWithoutALostNodeAndTakesItBackWhenItsLauncherRunsAgain) {
  const std::string started = rank_log("elastic");
  const std::string log = rank_log("elastic-world");
  const std::string script = "echo $RANK >> " + started + "\n" + world_script(log, "0|1");
  auto r = two_nodes("elastic", script, "--nnodes 1:2 --max-restarts 2 --grace 3 --rejoin-timeout 1 --join-timeout 30 "
                     "--silence-timeout 4", [&] {
    await_node_1_ranks(started);
    const int pid = launcher_pid("elastic", 1);
    ASSERT_GT(pid, 0) << "node 1's launcher not found";
    ::kill(pid, SIGSTOP);
    const bool without = await_line(log, "attempt 1 rank 1 of 2");
    ::kill(pid, SIGCONT);
    ASSERT_TRUE(without) << "no restart without node 1";
  });
  EXPECT_EQ(r.node[0].rc, 0) << r.node[0].output;
  EXPECT_EQ(r.node[1].rc, 0) << r.node[1].output;
  EXPECT_NE(r.node[0].output.find("restart 1 of 2: node 1: its coshard-run fell silent"), std::string::npos)
      << r.node[0].output;
  EXPECT_NE(r.node[0].output.find("; node(s) 1 did not come back within 1 s (--rejoin-timeout), so the job goes on "
                                  "without them (1 of 2 nodes, --nnodes 1:2)"),
            std::string::npos) << r.node[0].output;
  EXPECT_NE(r.node[0].output.find("started 2 rank(s) of 2"), std::string::npos) << r.node[0].output;
  EXPECT_EQ(r.node[0].output.find("the job starts on node(s)"), std::string::npos)
      << "every node joined: the job starts without waiting for the last call\n" << r.node[0].output;
  EXPECT_NE(r.node[1].output.find("coshard-run: node 1 is left out of restart 1: node 1: its coshard-run fell silent"),
            std::string::npos) << r.node[1].output;
  for (const auto& out : {r.node[0].output, r.node[1].output}) {
    EXPECT_NE(out.find("restart 2 of 2: node 1: its coshard-run was left out of restart 1 and asks to rejoin; node(s) "
                       "1 rejoin the job"),
              std::string::npos) << out;
  }
  expect_lines(log, {"attempt 0 rank 3 of 4 node 1", "attempt 1 rank 0 of 2 node 0", "attempt 1 rank 1 of 2 node 0",
                     "attempt 2 rank 1 of 4 node 0", "attempt 2 rank 3 of 4 node 1"});
  EXPECT_EQ(run("cat " + log).output.find("attempt 1 rank 2"), std::string::npos);
  EXPECT_LT(r.node[0].seconds, 90) << r.node[0].output;
}

// Node 0's launcher, which serves the store, frozen (SIGSTOP) for 6 s: node 1 is cut off from the
// store for longer than a store call's limit (2 s, a third of --silence-timeout 6) and its
// --rejoin-timeout, so it stops its ranks and gives the attempt up. Under
// --nnodes 1:2 it keeps trying to reach the store, joins again once node 0 runs, and asks to be
// taken in rather than run ranks in the attempt it gave up. Thawed, node 0 may find node 1 silent
// first and go on alone for an attempt: either way the job ends on both nodes (the ranks sleep
// on in attempt 0 and while node 0 is alone, and end in a later attempt of 4).
TEST(LauncherElastic, ANodeCutOffForLongerThanTheRejoinTimeoutJoinsAgain) {
  const std::string started = rank_log("cut-off");
  const std::string log = rank_log("cut-off-world");
  const std::string script = "echo $RANK >> " + started + "\necho attempt $COSHARD_RESTART_COUNT rank $RANK of " +
                             "$WORLD_SIZE node $GROUP_RANK >> " + log + "\ncase \"$COSHARD_RESTART_COUNT $WORLD_SIZE\" " +
                             "in \"0 \"*|*\" 2\") exec sleep 120;; esac\n";
  auto r = two_nodes("cut-off", script, "--nnodes 1:2 --max-restarts 2 --grace 3 --rejoin-timeout 1 --join-timeout 30 "
                     "--silence-timeout 6", [&] {
    await_node_1_ranks(started);
    const int pid = launcher_pid("cut-off", 0);
    ASSERT_GT(pid, 0) << "node 0's launcher not found";
    freeze(pid, std::chrono::seconds(6));
  });
  EXPECT_EQ(r.node[0].rc, 0) << r.node[0].output;
  EXPECT_EQ(r.node[1].rc, 0) << r.node[1].output;
  EXPECT_NE(r.node[1].output.find("coshard-run: node 1 lost the store at 127.0.0.1:"), std::string::npos)
      << r.node[1].output;
  EXPECT_NE(r.node[1].output.find("; trying to reach the store for up to 30 s (--join-timeout) to be taken back in"),
            std::string::npos) << r.node[1].output;
  EXPECT_NE(r.node[1].output.find("node 1: its coshard-run, cut off from the store in attempt 0 for longer than "
                                  "--rejoin-timeout, reached it again (--nnodes 1:2); attempt "),
            std::string::npos) << r.node[1].output;
  const std::string world = run("cat " + log).output;
  const auto first = world.find("rank 3 of 4 node 1");
  ASSERT_NE(first, std::string::npos) << world;
  EXPECT_NE(world.find("rank 3 of 4 node 1", first + 1), std::string::npos) << "node 1 was not taken back in\n" << world;
}

// A node taken in while the ranks take SIGUSR2 (a marker and a trap, as a StopSignal would): they
// are asked to stop after a checkpoint instead of being killed. Rank 0 stops (exit code 75, no
// failure); rank 1 takes the signal but goes on, and is stopped at --take-in-timeout. The restart
// takes node 1 in all the same.
TEST(LauncherElastic, RanksAskedToStopAfterACheckpointForANodeTakenInAreStoppedAtTheTakeInTimeout) {
  const std::string log = rank_log("take-in");
  const std::string script = attempt_0_only(log) + takes_usr2(log, "[ $RANK = 0 ] && exit 75") + ready(log) + kRunOn;
  std::vector<std::string> command;
  coshard::testing::CommandResult late;
  auto r = two_nodes("take-in", script, "--nnodes 1:2 --max-restarts 1 --grace 3 --last-call 0 --join-timeout 30 "
                     "--take-in-timeout 2", [&] {
    ASSERT_TRUE(await_ready(log, 2)) << "node 0's ranks did not start";
    late = run(command.at(1));
  }, &command, /*node_1_later=*/true);
  EXPECT_EQ(r.node[0].rc, 0) << r.node[0].output;
  EXPECT_EQ(late.rc, 0) << late.output;
  EXPECT_LT(late.seconds, 20) << late.output;  // the timeout, and not a wait for the ranks
  EXPECT_NE(r.node[0].output.find("asking the local ranks to stop after a checkpoint (SIGUSR2), so that the restart "
                                  "loses no step (--take-in-timeout 2 s)"),
            std::string::npos) << r.node[0].output;
  EXPECT_NE(r.node[0].output.find("the local ranks did not stop after a checkpoint within 2 s (--take-in-timeout); "
                                  "stopping them"),
            std::string::npos) << r.node[0].output;
  EXPECT_NE(late.output.find("restart 1 of 1: node 1: its coshard-run joined after the job started"), std::string::npos)
      << late.output;
  expect_lines(log, {"usr2 rank 0", "usr2 rank 1", "attempt 1 rank 3 of 4 node 1"});
}

// Ranks stop after a checkpoint at the same step on every node, so a node's ranks may end (exit
// code 75) before its launcher has seen why: here node 1's ranks stop on their own (as when they
// follow node 0's), before node 2's launcher (--nnodes 2:3) even comes. Node 1 says its ranks
// stopped, not that it was asked to stop; the take-in then restarts the job on all three nodes
// rather than ending it as a stop request would.
TEST(LauncherElastic, RanksThatStoppedAfterACheckpointBeforeTheirLauncherSawWhyStillRestartForANodeTakenIn) {
  const std::string log = rank_log("stopped-first");
  const std::string go = log + ".go";
  std::remove(go.c_str());
  const std::string script = attempt_0_only(log) + takes_usr2(log, "exit 75") + ready(log) +
                             "if [ $GROUP_RANK = 1 ]; then while [ ! -e " + go + " ]; do sleep 0.1; done; echo early rank "
                             "$RANK >> " + log + "; exit 75; fi\n" + kRunOn;
  std::vector<std::string> command;
  coshard::testing::CommandResult third;
  auto r = two_nodes("stopped-first", script, "--nnodes 2:3 --max-restarts 1 --grace 3 --last-call 0 --join-timeout 30",
                     [&] {
    ASSERT_TRUE(await_ready(log, 4)) << "the ranks of nodes 0 and 1 did not start";
    run("touch " + go);
    for (const char* line : {"early rank 2", "early rank 3"}) ASSERT_TRUE(await_line(log, line)) << line;
    std::this_thread::sleep_for(std::chrono::milliseconds(500));  // node 1's launcher reaped them, and said so
    std::string line = command.at(1);
    line.replace(line.find("--node-rank 1 "), 14, "--node-rank 2 ");
    third = run(line);
  }, &command);
  for (const auto& out : {r.node[0], r.node[1], third}) EXPECT_EQ(out.rc, 0) << out.output;
  EXPECT_NE(r.node[0].output.find("asking the local ranks to stop after a checkpoint (SIGUSR2)"), std::string::npos)
      << r.node[0].output;
  expect_lines(log, {"usr2 rank 0", "usr2 rank 1", "attempt 1 rank 5 of 6 node 2"});
}

// A node whose ranks do not take SIGUSR2 (here node 1's, under --nnodes 2:3) stops them at once
// when node 2 asks in, and says so: node 0's ranks, which take SIGUSR2 but could not finish a step
// without node 1's, are stopped then too, not at --take-in-timeout (60 s).
TEST(LauncherElastic, ANodeThatStopsItsRanksWithoutACheckpointStopsTheOthersAtOnce) {
  const std::string log = rank_log("stop-now");
  const std::string script = attempt_0_only(log) + "if [ $GROUP_RANK = 0 ]; then\n" + takes_usr2(log) + "fi\n" +
                             ready(log) + kRunOn;
  std::vector<std::string> command;
  coshard::testing::CommandResult third;
  auto r = two_nodes("stop-now", script, "--nnodes 2:3 --max-restarts 1 --grace 3 --last-call 0 --join-timeout 30 "
                     "--take-in-timeout 60", [&] {
    ASSERT_TRUE(await_ready(log, 4)) << "the ranks of nodes 0 and 1 did not start";
    std::string line = command.at(1);
    line.replace(line.find("--node-rank 1 "), 14, "--node-rank 2 ");
    third = run(line);
  }, &command);
  for (const auto& out : {r.node[0], r.node[1], third}) EXPECT_EQ(out.rc, 0) << out.output;
  EXPECT_LT(r.node[0].seconds, 40) << r.node[0].output;
  EXPECT_NE(r.node[0].output.find("asking the local ranks to stop after a checkpoint (SIGUSR2)"), std::string::npos)
      << r.node[0].output;
  EXPECT_NE(r.node[0].output.find("node 1 stopped its ranks without a checkpoint; stopping the local ranks"),
            std::string::npos) << r.node[0].output;
  expect_lines(log, {"usr2 rank 0", "attempt 1 rank 5 of 6 node 2"});
}

// Node 1's launcher frozen (SIGSTOP, as a host that crashed) while the ranks stop after a
// checkpoint for node 2 (--nnodes 2:3): node 1's ranks can no longer save their share, so node 0,
// which finds node 1 silent after --silence-timeout (4 s), stops its own then rather than at
// --take-in-timeout (120 s),
// and restarts on nodes 0 and 2. Node 1's launcher, thawed once the job is over, has lost the
// store and stops its ranks as for any such loss.
TEST(LauncherElastic, ANodeThatFallsSilentWhileTheRanksStopForANodeTakenInStopsTheOthers) {
  const std::string log = rank_log("take-in-silent");
  const std::string script = attempt_0_only(log) + takes_usr2(log) + ready(log) + kRunOn;
  std::vector<std::string> command;
  coshard::testing::CommandResult third;
  auto r = two_nodes("take-in-silent", script, "--nnodes 2:3 --max-restarts 1 --grace 3 --last-call 0 --join-timeout 30 "
                     "--take-in-timeout 120 --rejoin-timeout 1 --silence-timeout 4", [&] {
    ASSERT_TRUE(await_ready(log, 4)) << "the ranks of nodes 0 and 1 did not start";
    std::string line = command.at(1);
    line.replace(line.find("--node-rank 1 "), 14, "--node-rank 2 ");
    std::thread joiner([&] { third = run(line); });
    const bool asked = await_line(log, "usr2 rank 3", 30);
    const int pid = launcher_pid("take-in-silent", 1);
    if (pid > 0) ::kill(pid, SIGSTOP);
    const bool restarted = await_line(log, "attempt 1 rank 3 of 4", 60);
    // Thawed once node 0 (and with it the store) is gone, node 1 cannot learn why its ranks stop.
    for (int i = 0; i < 300 && launcher_pid("take-in-silent", 0) > 0; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    if (pid > 0) ::kill(pid, SIGCONT);
    joiner.join();
    ASSERT_TRUE(asked) << "node 1's ranks were not asked to stop";
    ASSERT_GT(pid, 0) << "node 1's launcher not found";
    ASSERT_TRUE(restarted) << "no restart on nodes 0 and 2";
  }, &command);
  EXPECT_EQ(r.node[0].rc, 0) << r.node[0].output;
  EXPECT_EQ(third.rc, 0) << third.output;
  EXPECT_NE(r.node[0].output.find("node 1 fell silent; stopping the local ranks"), std::string::npos)
      << r.node[0].output;
  EXPECT_LT(r.node[0].seconds, 90) << r.node[0].output;  // 4 s of silence, not the 120 s take-in timeout
  expect_lines(log, {"usr2 rank 0", "attempt 1 rank 1 of 4 node 0"});
  // Node 1 finds the store lost, and stops its ranks as after any loss of the store, not at the
  // take-in timeout; it is no longer in the job.
  EXPECT_EQ(r.node[1].rc, 1) << r.node[1].output;
  EXPECT_NE(r.node[1].output.find("; stopping the local ranks in 10 s unless they end first"), std::string::npos)
      << r.node[1].output;
  EXPECT_EQ(r.node[1].output.find("(--take-in-timeout); stopping them"), std::string::npos) << r.node[1].output;
  EXPECT_LT(r.node[1].seconds, 90) << r.node[1].output;
}

// SIGTERM to node 0's launcher while its ranks stop after a checkpoint for node 1, taken in: the
// job ends with 128 + SIGTERM on both nodes, as for any interrupt, though the take-in was the
// attempt's first report.
TEST(LauncherElastic, AnInterruptWhileTheRanksStopForANodeTakenInEndsTheJobWithTheSignalsCode) {
  const std::string log = rank_log("take-in-term");
  const std::string script = attempt_0_only(log) + takes_usr2(log) + ready(log) + kRunOn;
  std::vector<std::string> command;
  coshard::testing::CommandResult late;
  auto r = two_nodes("take-in-term", script, "--nnodes 1:2 --max-restarts 1 --grace 3 --last-call 0 --join-timeout 30 "
                     "--take-in-timeout 60", [&] {
    ASSERT_TRUE(await_ready(log, 2)) << "node 0's ranks did not start";
    std::thread joiner([&] { late = run(command.at(1)); });
    const bool asked = await_line(log, "usr2 rank 1", 30);
    const int pid = launcher_pid("take-in-term", 0);
    if (pid > 0) ::kill(pid, SIGTERM);
    joiner.join();
    ASSERT_TRUE(asked) << "node 0's ranks were not asked to stop";
    ASSERT_GT(pid, 0) << "node 0's launcher not found";
  }, &command, /*node_1_later=*/true);
  EXPECT_EQ(r.node[0].rc, 128 + SIGTERM) << r.node[0].output;
  EXPECT_EQ(late.rc, 128 + SIGTERM) << late.output;
  EXPECT_NE(r.node[0].output.find("not restarted: the launcher of node(s) 0 was told to stop"), std::string::npos)
      << r.node[0].output;
  EXPECT_LT(r.node[0].seconds, 30) << r.node[0].output;
}

}  // namespace
