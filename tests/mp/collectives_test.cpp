// Multi-process tests of the UCX communicator: real ranks started by coshard-run, each checking
// every collective against a locally computed reference (collectives_check.cpp).
#include <gtest/gtest.h>
#include <unistd.h>

#include <string>

#include "support/run_command.hpp"

namespace {

using coshard::testing::run_command;

const std::string kRun = COSHARD_RUN_BIN;
const std::string kCheck = COLLECTIVES_CHECK_BIN;

std::string launch(int n, const std::string& args, const std::string& launcher_flags = "") {
  return kRun + " --nproc-per-node " + std::to_string(n) + " " + launcher_flags + " -- " + kCheck + " " + args;
}

class Collectives : public ::testing::TestWithParam<int> {};

TEST_P(Collectives, EveryCollectiveMatchesTheLocalReference) {
  const int n = GetParam();
  // Smaller buffers with more ranks: 8 ranks share 2 cores here.
  const std::string big = n >= 8 ? "20000" : "150000";
  auto r = run_command(launch(n, "--timeout-ms 120000 --big " + big));
  EXPECT_EQ(r.rc, 0) << r.output;
  for (int i = 0; i < n; ++i) {
    EXPECT_NE(r.output.find("[rank " + std::to_string(i) + "] rank " + std::to_string(i) + ": collectives ok"),
              std::string::npos)
        << r.output;
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, Collectives, ::testing::Values(1, 2, 3, 4, 8));

TEST(CollectiveErrors, MismatchedSizesAreNamedOnEveryRank) {
  auto r = run_command(launch(3, "--mode mismatch --timeout-ms 20000", "--grace 30"));
  EXPECT_NE(r.rc, 0) << r.output;
  // Rank 1's neighbours see its header; whoever is left sees them go.
  EXPECT_NE(r.output.find("rank 1 issued all_gather#0 (f32 x 1001 per rank) where rank 2 issued all_gather#0 "
                          "(f32 x 1000 per rank)"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("rank 0 issued all_gather#0 (f32 x 1000 per rank) where rank 1 issued"), std::string::npos)
      << r.output;
  for (int i = 0; i < 3; ++i) {
    EXPECT_NE(r.output.find("rank " + std::to_string(i) + ": expected error"), std::string::npos) << r.output;
  }
  EXPECT_LT(r.seconds, 20) << r.output;
}

TEST(CollectiveErrors, ADeadRankFailsEveryOtherRankWithinThirtySeconds) {
  // The survivors ignore SIGTERM, so the launcher cannot be what ends them: the communicator
  // must notice the dead peer itself.
  auto r = run_command(launch(4, "--mode die --die-rank 2 --timeout-ms 600000", "--grace 60"));
  EXPECT_NE(r.rc, 0) << r.output;
  EXPECT_NE(r.output.find("rank 2 (pid"), std::string::npos) << r.output;
  for (int i : {0, 1, 3}) {
    EXPECT_NE(r.output.find("rank " + std::to_string(i) + ": expected error"), std::string::npos) << r.output;
  }
  EXPECT_NE(r.output.find("is gone (its process exited)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("flight record of the last operations: "), std::string::npos) << r.output;
  EXPECT_LT(r.seconds, 30) << r.output;
}

// Two "hosts" in two network namespaces joined by a veth pair; TCP only (namespaces do not
// isolate shared memory) and UCX's peer-failure mode, as across real hosts.
TEST(CollectivesAcrossHosts, TwoNamespacesOverTcp) {
  if (::geteuid() != 0) GTEST_SKIP() << "network namespaces need root";
  const std::string id = std::to_string(::getpid() % 100000);
  const std::string a = "cshA" + id, b = "cshB" + id, va = "vA" + id, vb = "vB" + id;
  const std::string subnet = "10.213." + std::to_string(::getpid() % 200 + 20) + ".";
  auto setup = run_command("ip netns add " + a + " && ip netns add " + b + " && ip link add " + va +
                           " type veth peer name " + vb + " && ip link set " + va + " netns " + a +
                           " && ip link set " + vb + " netns " + b + " && ip -n " + a + " addr add " + subnet +
                           "1/24 dev " + va + " && ip -n " + b + " addr add " + subnet + "2/24 dev " + vb +
                           " && ip -n " + a + " link set " + va + " up && ip -n " + b + " link set " + vb +
                           " up && ip -n " + a + " link set lo up && ip -n " + b + " link set lo up");
  if (setup.rc != 0) {
    run_command("ip netns del " + a + "; ip netns del " + b);
    GTEST_SKIP() << "cannot create network namespaces here (ip netns add failed): " << setup.output;
  }
  const std::string env = "UCX_TLS=tcp COSHARD_UCX_ERROR_MODE=peer ";
  const std::string common = " --nnodes 2 --nproc-per-node 2 --master " + subnet + "1:29731 --token t" + id +
                             " -- " + kCheck + " --timeout-ms 120000 --big 40000";
  auto r = run_command("(ip netns exec " + a + " env " + env + "UCX_NET_DEVICES=" + va + " " + kRun +
                       " --node-rank 0" + common + " > /tmp/coshard-netns-" + id + ".log 2>&1 & p=$!; " +
                       "sleep 0.5; ip netns exec " + b + " env " + env + "UCX_NET_DEVICES=" + vb + " " + kRun +
                       " --node-rank 1" + common + "; rc=$?; wait $p; rc0=$?; cat /tmp/coshard-netns-" + id +
                       ".log; rm -f /tmp/coshard-netns-" + id + ".log; exit $((rc | rc0)))");
  run_command("ip netns del " + a + "; ip netns del " + b);
  EXPECT_EQ(r.rc, 0) << r.output;
  for (int i = 0; i < 4; ++i) {
    EXPECT_NE(r.output.find("rank " + std::to_string(i) + ": collectives ok"), std::string::npos) << r.output;
  }
}

}  // namespace
