// Failures across hosts of a real (namespace) cluster: a host that crashes mid-step, a link cut
// mid-step (for good, or until a restart recovers once it is back, or for good with the job going
// on without that host under --nnodes MIN:MAX, by hand and in a Slurm step), Slurm's SIGUSR2 ahead of a time
// limit (a checkpoint, then exit code 75), and launches that cannot work
// (flags that contradict the Slurm step, a master that does not answer, two hosts claiming the
// same node rank). Each that cannot recover ends with every launcher exiting non-zero within its
// deadline, naming the host or flag at fault, on both sides.
#include "cluster/cluster_support.hpp"

#include <sstream>
#include <tuple>

namespace coshard::testing::cluster {
namespace {

// Runs coshard-run by hand on node1 and node2 (training until stopped), waits for step 3, does
// `fault`, then waits for both launchers: prints rc1/rc2 and the seconds each took after the fault.
std::string fault_script(const std::string& node1, const std::string& node2, const std::string& dir,
                         const std::string& fault) {
  return node1 + " > " + dir + "/node1.log 2>&1 & a=$!; " + node2 + " > " + dir + "/node2.log 2>&1 & b=$!; " +
         "for i in $(seq 600); do grep -q '\"step\":3,' " + dir + "/node1.log && break; sleep 0.1; done; " + fault +
         "; t0=$SECONDS; wait $a; echo rc1=$? after=$((SECONDS - t0)); wait $b; echo rc2=$? after=$((SECONDS - t0))";
}

// The restart tests train 40 steps with a checkpoint every 4, and act once step 8's is complete.
const std::string kRestartArgs = kTrainArgs + "--steps 40 --checkpoint-every 4 --metrics-port 0 ";

std::string after_step_8(const std::string& ckpt) {
  return "for i in $(seq 1200); do [ -e " + ckpt + "/step-00000008/manifest.json ] && break; sleep 0.1; done; ";
}

// The restart tests' reference: the same training, uninterrupted, on 4 ranks of this host.
std::string uninterrupted_run(const std::filesystem::path& dir, const std::string& common) {
  auto whole = run_command(kRun + " --nproc-per-node 4 -- " + kTrain + common + (dir / "whole").string());
  EXPECT_EQ(whole.rc, 0) << whole.output;
  return whole.output;
}

// The restarted job's last 10 steps are those of the uninterrupted run on one host (1e-5).
void expect_the_uninterrupted_losses(const std::string& whole, const std::string& log) {
  const auto want = losses(whole), got = losses(log);
  ASSERT_EQ(want.size(), 40u) << whole;
  ASSERT_GE(got.size(), 10u) << log;
  for (std::size_t i = 0; i < 10; ++i) {
    EXPECT_NEAR(got[got.size() - 10 + i], want[30 + i], 1e-5 * std::abs(want[30 + i])) << "step " << 31 + i;
  }
}

// The first line coshard-run relayed from `rank` that holds `text`; empty if none.
std::string rank_line(const std::string& log, int rank, const std::string& text) {
  std::istringstream in(log);
  const std::string prefix = "[rank " + std::to_string(rank) + "] ";
  for (std::string line; std::getline(in, line);) {
    if (line.starts_with(prefix) && line.find(text) != std::string::npos) return line;
  }
  return "";
}

int seconds_after(const std::string& out, const std::string& rc) {
  auto at = out.find(rc + "=");
  if (at == std::string::npos) return 1 << 20;
  return std::stoi(out.substr(out.find("after=", at) + 6));
}

TEST_F(Cluster, AHostThatCrashesMidStepFailsTheOtherHostNamingIt) {
  auto dir = train::temp_dir("cluster-crash");
  const std::string train = kTrainArgs + "--steps 1000000 --metrics-port 0";
  auto r = run_script(fault_script(by_hand(0, train), by_hand(1, train), dir.string(), cluster("kill", "node2")));
  const std::string node1 = read_file(dir / "node1.log");
  ASSERT_NE(r.output.find("killed ["), std::string::npos) << r.output << node1;
  EXPECT_EQ(r.output.find("rc1=0"), std::string::npos) << r.output << node1;
  EXPECT_LT(seconds_after(r.output, "rc1"), 30) << r.output;
  EXPECT_NE(node1.find("on node2) is gone"), std::string::npos) << node1;
  EXPECT_NE(node1.find("coshard-run: rank "), std::string::npos) << node1;  // the launcher says which rank failed
}

TEST_F(Cluster, ACutLinkFailsEveryRankOnBothHostsWithinTheDeadline) {
  auto dir = train::temp_dir("cluster-cut");
  const std::string train = kTrainArgs + "--steps 1000000 --metrics-port 0 --collective-timeout 8";
  auto r = run_script(fault_script(by_hand(0, train), by_hand(1, train), dir.string(), cluster("link", "node2 down")));
  const std::string node1 = read_file(dir / "node1.log"), node2 = read_file(dir / "node2.log");
  for (const auto& [rc, log] : {std::pair{"rc1", node1}, std::pair{"rc2", node2}}) {
    EXPECT_NE(r.output.find(std::string(rc) + "="), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find(std::string(rc) + "=0"), std::string::npos) << r.output << log;
    EXPECT_LT(seconds_after(r.output, rc), 40) << r.output << log;  // node2: 5 s store call + 10 s to reach it again
  }
  // Each side names a silent rank on the other host.
  EXPECT_NE(node1.find("on node2)"), std::string::npos) << node1;
  EXPECT_NE(node2.find("on node1)"), std::string::npos) << node2;
  // So does every rank that says why it failed, also one that waited on a rank of its own host
  // (which waited across). A rank its launcher stopped first says nothing itself.
  for (const auto& [log, ranks, other] :
       {std::tuple{node1, std::pair{0, 1}, "node2"}, std::tuple{node2, std::pair{2, 3}, "node1"}}) {
    for (const int rank : {ranks.first, ranks.second}) {
      const std::string why = rank_line(log, rank, "coshard timeout [rank " + std::to_string(rank) + "]");
      if (why.empty()) {
        EXPECT_NE(log.find("rank " + std::to_string(rank) + " was killed by signal"), std::string::npos) << log;
      } else {
        EXPECT_NE(why.find(std::string("on ") + other + ")"), std::string::npos) << why;
      }
    }
  }
}

// A rank killed outright on one host under --max-restarts 1 --resume auto: both hosts' launchers
// stop their ranks, start them again, and the job ends with the uninterrupted run's losses.
TEST_F(Cluster, ARankKilledOnOneHostRestartsBothHostsFromTheLastCheckpoint) {
  auto dir = train::temp_dir("cluster-restart");
  const std::string common = kRestartArgs + "--checkpoint-dir ";
  const std::string whole = uninterrupted_run(dir, common);
  const std::string ckpt = (dir / "killed").string(), d = dir.string();
  const std::string train = common + ckpt + " --resume auto";
  // Once step 8's checkpoint is complete, SIGKILL rank 3 (on node2); "[g]" keeps pgrep off this shell.
  const std::string kill = after_step_8(ckpt) + "for p in $(pgrep -f '[g]pt2-train .*" + ckpt +
                           " '); do tr '\\0' '\\n' < /proc/$p/environ | grep -qx RANK=3 && kill -9 $p && echo killed "
                           "rank 3; done";
  auto r = run_script(by_hand(0, train, " --max-restarts 1") + " > " + d + "/node1.log 2>&1 & a=$!; " +
                      by_hand(1, train, " --max-restarts 1") + " > " + d + "/node2.log 2>&1 & b=$!; " + kill +
                      "; wait $a; echo rc1=$?; wait $b; echo rc2=$?");
  const std::string node1 = read_file(dir / "node1.log"), node2 = read_file(dir / "node2.log");
  ASSERT_NE(r.output.find("killed rank 3"), std::string::npos) << r.output << node1 << node2;
  EXPECT_NE(r.output.find("rc1=0"), std::string::npos) << r.output << node1;
  EXPECT_NE(r.output.find("rc2=0"), std::string::npos) << r.output << node2;
  // Node 1's launcher names the first rank of node2 to end: rank 3 as a rule. Rank 2 when it read
  // from rank 3 over UCX's CMA transport as rank 3 died: UCX 1.13 then aborts the reader itself
  // (process_vm_readv ... No such process; docs/transport.md). Either way the failure names a rank
  // and its pid, and the restart follows.
  const bool neighbour_first = node2.find("process_vm_readv") != std::string::npos &&
                               node1.find("coshard-run: node 1 failed: rank 2 (pid") != std::string::npos;
  const std::string first = neighbour_first ? "2" : "3";
  EXPECT_NE(node1.find("coshard-run: node 1 failed: rank " + first + " (pid"), std::string::npos) << node1;
  for (const auto& log : {node1, node2}) {
    EXPECT_NE(log.find("coshard-run: restart 1 of 1: node 1: rank " + first), std::string::npos) << log;
  }
  EXPECT_NE(node1.find("resumed from " + ckpt + "/step-"), std::string::npos) << node1;
  EXPECT_NE(node1.find(" after restart 1"), std::string::npos) << node1;
  expect_the_uninterrupted_losses(whole, node1);
}

// The link between the hosts cut for 12 s, longer than the ranks' 8 s collective timeout, under
// --max-restarts 1 --resume auto: every rank fails, node2's launcher cannot reach node 0's store
// and keeps trying (--rejoin-timeout), and once the link is back both hosts restart from the last
// checkpoint and the job ends with the uninterrupted run's losses.
TEST_F(Cluster, ACutLinkThatComesBackRestartsBothHostsFromTheLastCheckpoint) {
  auto dir = train::temp_dir("cluster-cut-restart");
  const std::string common = kRestartArgs + "--collective-timeout 8 --checkpoint-dir ";
  const std::string whole = uninterrupted_run(dir, common);
  const std::string ckpt = (dir / "cut").string(), d = dir.string();
  const std::string train = common + ckpt + " --resume auto";
  const std::string cut =
      after_step_8(ckpt) + cluster("link", "node2 down") + " && echo cut; sleep 12; " + cluster("link", "node2 up");
  auto r = run_script(by_hand(0, train, " --max-restarts 1") + " > " + d + "/node1.log 2>&1 & a=$!; " +
                      by_hand(1, train, " --max-restarts 1") + " > " + d + "/node2.log 2>&1 & b=$!; " + cut +
                      "; wait $a; echo rc1=$?; wait $b; echo rc2=$?");
  const std::string node1 = read_file(dir / "node1.log"), node2 = read_file(dir / "node2.log");
  ASSERT_NE(r.output.find("cut"), std::string::npos) << r.output << node1 << node2;
  EXPECT_NE(r.output.find("rc1=0"), std::string::npos) << r.output << node1;
  EXPECT_NE(r.output.find("rc2=0"), std::string::npos) << r.output << node2;
  EXPECT_NE(node2.find("coshard-run: the store at node1:29400 stopped answering"), std::string::npos) << node2;
  EXPECT_NE(node2.find("coshard-run: reached the store at node1:29400 again after"), std::string::npos) << node2;
  for (const auto& log : {node1, node2}) {
    EXPECT_NE(log.find("coshard-run: restart 1 of 1: node "), std::string::npos) << log;
  }
  EXPECT_NE(node1.find("resumed from " + ckpt + "/step-"), std::string::npos) << node1;
  expect_the_uninterrupted_losses(whole, node1);
}

// The link to node2 cut for good under --nnodes 1:2: every rank fails at its 8 s collective
// timeout, node2's launcher gives up on the store after --rejoin-timeout and exits naming it,
// and node1 restarts alone from the last checkpoint: 2 ranks that take two micro-batches a step
// (--global-batch 32) end the job with the uninterrupted 4-rank run's losses.
TEST_F(Cluster, ACutLinkThatStaysCutLeavesTheJobToTheHostLeftUnderNnodesMinMax) {
  auto dir = train::temp_dir("cluster-elastic");
  const std::string common = kRestartArgs + "--collective-timeout 8 --global-batch 32 --checkpoint-dir ";
  const std::string whole = uninterrupted_run(dir, common);
  const std::string ckpt = (dir / "cut").string(), d = dir.string();
  const std::string train = common + ckpt + " --resume auto";
  const std::string flags = " --nnodes 1:2 --max-restarts 1 --rejoin-timeout 5";
  auto r = run_script(by_hand(0, train, flags) + " > " + d + "/node1.log 2>&1 & a=$!; " + by_hand(1, train, flags) +
                      " > " + d + "/node2.log 2>&1 & b=$!; " + after_step_8(ckpt) + cluster("link", "node2 down") +
                      " && echo cut; wait $a; echo rc1=$?; wait $b; echo rc2=$?");
  const std::string node1 = read_file(dir / "node1.log"), node2 = read_file(dir / "node2.log");
  ASSERT_NE(r.output.find("cut"), std::string::npos) << r.output << node1 << node2;
  EXPECT_NE(r.output.find("rc1=0"), std::string::npos) << r.output << node1;
  EXPECT_NE(r.output.find("rc2=1"), std::string::npos) << r.output << node2;
  EXPECT_NE(node2.find("lost the store at node1:29400 (node 0's coshard-run): not reached for "), std::string::npos)
      << node2;
  EXPECT_NE(node1.find("so the job goes on without them (1 of 2 nodes, --nnodes 1:2)"), std::string::npos) << node1;
  EXPECT_NE(node1.find("started 2 rank(s) of 2"), std::string::npos) << node1;
  EXPECT_NE(node1.find("resumed from " + ckpt + "/step-"), std::string::npos) << node1;
  expect_the_uninterrupted_losses(whole, node1);
}

// The same inside a Slurm step: `srun --no-kill` runs coshard-run on both hosts, with --nnodes 1:2
// against the step's 2, and node2's link is cut for good: node1's launcher restarts alone and ends
// the job (exit 0), and the step does not end it first (--no-kill). Slurm itself cannot end that
// step: node2's task exit was lost with its link (slurmd: "Failed to send MESSAGE_TASK_EXIT"), so
// the test cancels it once node1's launcher has ended.
TEST_F(Cluster, ASlurmStepGoesOnWithoutAHostItLostUnderNnodesMinMax) {
  auto dir = train::temp_dir("cluster-slurm-elastic");
  const std::string common = kRestartArgs + "--collective-timeout 8 --global-batch 32 --checkpoint-dir ";
  const std::string whole = uninterrupted_run(dir, common);
  const std::string ckpt = (dir / "cut").string(), d = dir.string(), job = "elastic-" + name_;
  const std::string task = kRun + " --nnodes 1:2 --max-restarts 1 --rejoin-timeout 5 --nproc-per-node 2 -- " + kTrain +
                           common + ckpt + " --resume auto; echo launcher-rc=$?";
  auto r = run_script(on("login", "srun --no-kill -N2 --ntasks-per-node=1 -J " + job + " -o " + d + "/task-%t.log " +
                                      "bash -c " + quote(task)) +
                      " & a=$!; " + after_step_8(ckpt) + cluster("link", "node2 down") + " && echo link-cut; " +
                      "for i in $(seq 1200); do grep -q launcher-rc= " + d + "/task-0.log && break; sleep 0.1; done; " +
                      cluster("link", "node2 up") + "; " + on("login", "scancel -n " + job) +
                      "; for i in $(seq 600); do kill -0 $a 2>/dev/null || break; sleep 0.1; done; " +
                      "pkill -KILL -f -- '-J " + job + " ' && echo srun-killed; wait $a");
  const std::string node1 = read_file(dir / "task-0.log"), node2 = read_file(dir / "task-1.log");
  ASSERT_NE(r.output.find("link-cut"), std::string::npos) << r.output << node1 << node2;
  EXPECT_EQ(r.output.find("srun-killed"), std::string::npos) << "scancel did not end the step\n" << r.output;
  EXPECT_NE(node1.find("launcher-rc=0"), std::string::npos) << node1;
  EXPECT_NE(node1.find("so the job goes on without them (1 of 2 nodes, --nnodes 1:2)"), std::string::npos) << node1;
  EXPECT_NE(node1.find("started 2 rank(s) of 2"), std::string::npos) << node1;
  EXPECT_NE(node1.find("resumed from " + ckpt + "/step-"), std::string::npos) << node1;
  EXPECT_NE(node2.find("launcher-rc=1"), std::string::npos) << node2;
  EXPECT_NE(node2.find("lost the store at "), std::string::npos) << node2;
  expect_the_uninterrupted_losses(whole, node1);
}

// Every process on node2 killed mid-training (its host crashed) under --max-restarts 1 --resume
// auto, then node2's coshard-run started again (the host is back): it takes the silent
// launcher's place, both hosts restart from the last checkpoint, and the job ends with the
// uninterrupted run's losses.
TEST_F(Cluster, AHostThatCrashesAndComesBackRestartsTheJobFromTheLastCheckpoint) {
  auto dir = train::temp_dir("cluster-crash-back");
  const std::string common = kRestartArgs + "--checkpoint-dir ";
  const std::string whole = uninterrupted_run(dir, common);
  const std::string ckpt = (dir / "crash").string(), d = dir.string();
  const std::string train = common + ckpt + " --resume auto";
  const std::string crash = after_step_8(ckpt) + cluster("kill", "node2") + "; sleep 2; ";
  auto r = run_script(by_hand(0, train, " --max-restarts 1") + " > " + d + "/node1.log 2>&1 & a=$!; " +
                      by_hand(1, train, " --max-restarts 1") + " > " + d + "/node2.log 2>&1 & " + crash +
                      by_hand(1, train, " --max-restarts 1") + " > " + d + "/node2-again.log 2>&1; echo rc2=$?; " +
                      "wait $a; echo rc1=$?");
  const std::string node1 = read_file(dir / "node1.log"), again = read_file(dir / "node2-again.log");
  ASSERT_NE(r.output.find("killed ["), std::string::npos) << r.output << node1;
  EXPECT_NE(r.output.find("rc1=0"), std::string::npos) << r.output << node1;
  EXPECT_NE(r.output.find("rc2=0"), std::string::npos) << r.output << again;
  EXPECT_NE(again.find("took its place; attempt 0 ends so that every node restarts, taking node 1 in"), std::string::npos) << again;
  for (const auto& log : {node1, again}) {
    EXPECT_NE(log.find("coshard-run: restart 1 of 1: node "), std::string::npos) << log;
  }
  EXPECT_NE(node1.find("resumed from " + ckpt + "/step-"), std::string::npos) << node1;
  expect_the_uninterrupted_losses(whole, node1);
}

// Slurm's warning before a time limit or a preemption, as `srun --signal=USR2@SECONDS` gives it:
// here scancel sends SIGUSR2 to every task of the step at once. The ranks (started by srun, no
// launcher of ours) agree on a step, checkpoint it, and exit 75, which srun passes on.
TEST_F(Cluster, SlurmsSigusr2StopsEveryRankAfterACheckpoint) {
  auto dir = train::temp_dir("cluster-sigusr2");
  const std::string d = dir.string(), ckpt = d + "/ckpt";
  auto r = run_script(on("login", "srun -N2 --ntasks-per-node=1 -J stop-" + name_ + " " + kTrain + kTrainArgs +
                                      "--steps 1000000 --metrics-port 0 --checkpoint-dir " + ckpt + " > " + d +
                                      "/job.log 2>&1 & a=$!; for i in $(seq 600); do grep -q '\"step\":3,' " + d +
                                      "/job.log && break; sleep 0.1; done; scancel --signal=USR2 -n stop-" + name_ +
                                      "; t0=$SECONDS; wait $a; echo rc=$? after=$((SECONDS - t0))"));
  const std::string log = read_file(dir / "job.log");
  EXPECT_NE(r.output.find("rc=75"), std::string::npos) << r.output << log;
  EXPECT_LT(seconds_after(r.output, "rc"), 30) << r.output;
  const auto at = log.find("stopped on request (SIGUSR2) after step ");
  ASSERT_NE(at, std::string::npos) << log;
  const int step = std::stoi(log.substr(at + 40));
  EXPECT_GE(step, 3) << log;
  EXPECT_EQ(static_cast<int>(losses(log).size()), step) << log;  // the checkpoint holds the last step logged
  char name[32];
  std::snprintf(name, sizeof name, "/step-%08d", step);
  EXPECT_TRUE(std::filesystem::exists(ckpt + name + "/manifest.json")) << log;
}

TEST_F(Cluster, CoshardRunRefusesFlagsThatContradictTheSlurmStep) {
  auto r = run_command(on("login", "srun -N2 --ntasks-per-node=1 " + kRun + " --nnodes 3 --nproc-per-node 2 -- true"));
  EXPECT_NE(r.rc, 0) << r.output;
  EXPECT_NE(r.output.find("--nnodes 3 but this Slurm step spans 2 host(s) (node1...): drop --nnodes"),
            std::string::npos) << r.output;
  r = run_command(on("login", "srun -N2 --ntasks-per-node=2 " + kRun + " --nproc-per-node 2 -- true"));
  EXPECT_NE(r.rc, 0) << r.output;
  EXPECT_NE(r.output.find("runs 2 coshard-run tasks on node"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("srun --ntasks-per-node=1 coshard-run"), std::string::npos) << r.output;
}

TEST_F(Cluster, AMasterThatDoesNotAnswerIsNamedWithinTheDeadline) {
  auto r = run_command(by_hand(1, kFourSteps + "--metrics-port 0", " --join-timeout 5"));
  EXPECT_NE(r.rc, 0) << r.output;
  EXPECT_LT(r.seconds, 30) << r.output;
  EXPECT_NE(r.output.find("node 1 cannot join the job: cannot reach the rendezvous store at node1:29400 within 5 s"),
            std::string::npos)
      << r.output;
}

TEST_F(Cluster, TwoHostsWithTheSameNodeRankAreNamed) {
  auto dir = train::temp_dir("cluster-same-rank");
  const std::string train = kFourSteps + "--metrics-port 0 --rendezvous-timeout 10";
  // node2 claims node rank 0 too: its ranks find ranks 0 and 1 held by node1's.
  const std::string twin = on("node2", kRun + " --nnodes 2 --node-rank 0 --nproc-per-node 2 --master node1:29400 --token " +
                                           name_ + " -- " + kTrain + train);
  auto r = run_script(by_hand(0, train) + " > " + dir.string() + "/node1.log 2>&1 & a=$!; sleep 1; " + twin +
                       "; echo rc2=$?; wait $a; echo rc1=$?");
  const std::string node1 = read_file(dir / "node1.log");
  EXPECT_EQ(r.output.find("rc1=0"), std::string::npos) << r.output << node1;
  EXPECT_EQ(r.output.find("rc2=0"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("was started twice"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("on node1 already holds it"), std::string::npos) << r.output;
  // Node 0's side names the host it refused, and the node rank that never came.
  EXPECT_NE(node1.find("on node2 (--node-rank 0) was refused: node rank 0 was started twice"), std::string::npos)
      << node1;
  EXPECT_NE(node1.find("the job failed (exit code 1): "), std::string::npos) << node1;
  EXPECT_NE(node1.find("node(s) 1 never joined the job (no coshard-run holds their node rank): start coshard-run on "
                       "each with its --node-rank and --master node1:29400"),
            std::string::npos)
      << node1;
  EXPECT_NE(node1.find("; node 0 refused meanwhile: coshard-run pid "), std::string::npos) << node1;
  EXPECT_LT(r.seconds, 60) << r.output;
}

// scripts/cluster shape: each node's link, both ways, at the rate given (tbf), and none lifts it.
// Measured by a TCP transfer of 4 MB between the nodes, each way: the receiver prints bits/s.
TEST_F(Cluster, ShapeLimitsEachNodesLinkBothWaysAndNoneLiftsIt) {
  const std::string receive =
      "python3 -c " + quote("import socket, time\ns = socket.socket(); s.setsockopt(socket.SOL_SOCKET, "
                            "socket.SO_REUSEADDR, 1); s.bind(('0.0.0.0', 29500)); s.listen(1); c, _ = s.accept()\n"
                            "n, t0 = 0, None\nwhile True:\n    b = c.recv(1 << 16)\n    if not b: break\n"
                            "    t0 = t0 or time.time(); n += len(b)\nprint('bits/s', int(n * 8 / (time.time() - t0)))");
  auto bits_per_s = [&](const std::string& from, const std::string& to) {
    const std::string send = "python3 -c " + quote("import socket\ns = socket.create_connection(('" + to +
                                                   "', 29500), 5); s.sendall(b'x' * 4000000); s.close()");
    auto r = run_script(on(to, receive) + " & r=$!; for i in $(seq 50); do " + on(from, send) +
                        " 2>/dev/null && break; sleep 0.1; done; wait $r");
    const auto at = r.output.find("bits/s ");
    EXPECT_NE(at, std::string::npos) << from << " to " << to << ": " << r.output;
    return at == std::string::npos ? 0.0 : std::stod(r.output.substr(at + 7));
  };
  const double rate = 40e6;
  auto shaped = run_command(cluster("shape", "--rate 40mbit"));
  ASSERT_EQ(shaped.rc, 0) << shaped.output;
  for (const auto& [from, to] : {std::pair{"node1", "node2"}, std::pair{"node2", "node1"}}) {
    const double got = bits_per_s(from, to);
    // Above the rate by at most the 512 KB burst tbf lets through at once.
    EXPECT_GT(got, 0.5 * rate) << from << " to " << to;
    EXPECT_LT(got, 1.5 * rate) << from << " to " << to;
  }
  EXPECT_NE(run_command(cluster("status", "")).output.find("links 40mbit"), std::string::npos);
  ASSERT_EQ(run_command(cluster("shape", "--rate none")).rc, 0);
  for (const auto& [from, to] : {std::pair{"node1", "node2"}, std::pair{"node2", "node1"}}) {
    EXPECT_GT(bits_per_s(from, to), 5 * rate) << from << " to " << to << " once unshaped";
  }
}

// A test killed by ctest's timeout (SIGKILL) cannot take its cluster down: `reap` does, for every
// cluster whose --owner is gone, and leaves the others. Checked on the namespaces and processes
// themselves, not on what the script says.
TEST_F(Cluster, AClusterWhoseOwnerIsGoneIsReapedToTheLastNamespaceAndProcess) {
  const std::string other = name_ + "r";
  auto owner = run_command("sleep 600 >/dev/null 2>&1 & echo $!");
  const std::string pid = owner.output.substr(0, owner.output.find('\n'));
  ASSERT_EQ(run_command(kCluster + " up --no-slurm --name " + other + " --owner " + pid).rc, 0);
  // The processes holding its hosts' namespaces.
  const std::string holders = run_command("cat /tmp/coshard-cluster/" + other + "/run/holder-*.pid | tr '\\n' ' '").output;
  ASSERT_FALSE(holders.empty());
  EXPECT_EQ(run_command("ip netns list | grep -c 'cc-" + other + "-'").output, "4\n");  // br, login, node1, node2
  auto kept = run_command(kCluster + " reap");
  EXPECT_EQ(kept.output.find(other), std::string::npos) << kept.output;  // its owner lives
  EXPECT_TRUE(std::filesystem::exists("/tmp/coshard-cluster/" + other));
  run_command("kill -9 " + pid);
  auto reaped = run_command(kCluster + " reap");
  EXPECT_EQ(reaped.rc, 0) << reaped.output;
  EXPECT_NE(reaped.output.find("cluster '" + other + "': its owner (pid " + pid + ") is gone"), std::string::npos)
      << reaped.output;
  EXPECT_EQ(run_command("ip netns list | grep -c 'cc-" + other + "-'").output, "0\n");
  EXPECT_FALSE(std::filesystem::exists("/tmp/coshard-cluster/" + other));
  EXPECT_EQ(run_command("for p in " + holders + "; do kill -0 $p 2>/dev/null && echo $p; done").output, "") << holders;
  // This test's own cluster is still up: its owner is alive.
  EXPECT_EQ(run_command(on("node1", "hostname")).output, "node1\n");
}

}  // namespace
}  // namespace coshard::testing::cluster
