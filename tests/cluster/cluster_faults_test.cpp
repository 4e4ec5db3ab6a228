// Failures across hosts of a real (namespace) cluster: a host that crashes mid-step, a link cut
// mid-step, and launches that cannot work (flags that contradict the Slurm step, a master that
// does not answer, two hosts claiming the same node rank). Each ends with every launcher exiting
// non-zero within its deadline, naming the host or flag at fault.
#include "cluster/cluster_support.hpp"

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
    EXPECT_LT(seconds_after(r.output, rc), 40) << r.output << log;  // 8 s collective timeout, then the launcher's grace
  }
  // Each side names a silent rank on the other host.
  EXPECT_NE(node1.find("on node2)"), std::string::npos) << node1;
  EXPECT_NE(node2.find("on node1)"), std::string::npos) << node2;
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
  auto r = run_command(by_hand(1, kFourSteps + "--metrics-port 0 --rendezvous-timeout 5"));
  EXPECT_NE(r.rc, 0) << r.output;
  EXPECT_LT(r.seconds, 30) << r.output;
  EXPECT_NE(r.output.find("cannot reach the rendezvous store at node1:29400 within 5 s"), std::string::npos)
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
  EXPECT_LT(r.seconds, 60) << r.output;
}

}  // namespace
}  // namespace coshard::testing::cluster
