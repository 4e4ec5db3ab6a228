// Multi-process tests of the UCX communicator: real ranks started by coshard-run, each checking
// every collective against a locally computed reference (collectives_check.cpp).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <map>
#include <regex>
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

// The sizes cross both thresholds of the direct path (docs/transport.md) in both directions: host
// buffers are shared segments from 1 MiB, and the direct path starts at 256 KiB per rank, so the
// largest f32 buffers take it while the bf16/f16 ones (half the bytes: not shared) and the small
// ones take the ring. With 8 ranks (on 2 cores) the buffers are smaller and so are both thresholds.
// COSHARD_UCX_DIRECT=0 below runs the large buffers through the ring.
// collectives_check also fails when no collective took the direct path.
TEST_P(Collectives, EveryCollectiveMatchesTheLocalReference) {
  const int n = GetParam();
  // 3 ranks: lower thresholds, so that the bf16 and f16 reductions take the direct path too.
  const std::string sizes = n >= 8    ? "--big 20000 --shared-min 65536 --direct-min 32768"
                            : n == 3 ? "--big 300000 --shared-min 131072 --direct-min 65536"
                                     : "--big 300000";
  // 3 ranks also stream every copy and reduction output of 64 KiB or more (non-temporal stores).
  const std::string env = n == 3 ? "COSHARD_UCX_STREAM_MIN_BYTES=65536 " : "";
  auto r = run_command(env + launch(n, "--timeout-ms 120000 " + sizes));
  EXPECT_EQ(r.rc, 0) << r.output;
  for (int i = 0; i < n; ++i) {
    EXPECT_NE(r.output.find("[rank " + std::to_string(i) + "] rank " + std::to_string(i) + ": collectives ok"),
              std::string::npos)
        << r.output;
  }
}

// Named by the rank count: Ranks/Collectives.EveryCollectiveMatchesTheLocalReference/ranks8.
INSTANTIATE_TEST_SUITE_P(Ranks, Collectives, ::testing::Values(1, 2, 3, 4, 8),
                         [](const ::testing::TestParamInfo<int>& p) { return "ranks" + std::to_string(p.param); });

// The same checks with the direct path and the mesh turned off: everything on the ring (and
// collectives_check fails if anything took the direct path or the mesh).
TEST(CollectivesRingOnly, EveryCollectiveMatchesWithTheDirectPathAndTheMeshOff) {
  auto r = run_command("COSHARD_UCX_DIRECT=0 COSHARD_UCX_MESH_MAX_BYTES=0 " +
                       launch(3, "--timeout-ms 120000 --big 300000"));
  EXPECT_EQ(r.rc, 0) << r.output;
  for (int i = 0; i < 3; ++i) {
    EXPECT_NE(r.output.find("rank " + std::to_string(i) + ": collectives ok ("), std::string::npos) << r.output;
  }
  EXPECT_NE(r.output.find(", 0 direct, 0 mesh)"), std::string::npos) << r.output;
}

// The ranks agree on the smallest mesh size any of them proposes: rank 0 alone proposes none, so
// no rank may take the mesh (collectives_check fails if one did), and every operation still
// completes (a rank on the mesh while its peers run the ring would fail or hang).
TEST(CollectivesRingOnly, OneRankWithoutTheMeshTurnsItOffForAll) {
  auto r = run_command(launch(3, "--timeout-ms 120000 --big 3000 --rank0-mesh-max 0"));
  EXPECT_EQ(r.rc, 0) << r.output;
  const std::regex ok(R"re(rank \d: collectives ok \([^)]*, 0 mesh\))re");
  EXPECT_EQ(std::distance(std::sregex_iterator(r.output.begin(), r.output.end(), ok), std::sregex_iterator()), 3)
      << r.output;
}

// A straggler: rank 2 of 4 enters each of 20 all-reduces (4 KiB) 50 ms late. Its peers' wait
// metrics must name it: the largest per-peer wait of any rank is for peer 2, and about the injected
// delay. On the ring path (the mesh off by rank 0), on the direct path (shared 4 KiB buffers), whose
// ready messages follow the header exchange and so wait on the slow rank too, and on the mesh, on
// one host and across two (where a rank's later rounds wait on whoever waited on the slow rank):
// they must not blame its neighbours.
class CollectiveStragglers : public ::testing::TestWithParam<std::string> {};

TEST_P(CollectiveStragglers, ThePeerWaitMetricNamesTheSlowRank) {
  if (GetParam().find("--hosts") != std::string::npos && ::geteuid() != 0) {
    GTEST_SKIP() << "a hostname per rank needs a UTS namespace, which needs root";
  }
  auto r = run_command(launch(4, "--mode straggler --slow-rank 2 --slow-ms 50 --timeout-ms 60000 " + GetParam()));
  ASSERT_EQ(r.rc, 0) << r.output;
  const std::regex series(R"re(coshard_peer_wait_seconds_total\{[^}]*peer="(\d+)"[^}]*\} ([0-9.e+-]+))re");
  std::map<int, double> worst;  // peer -> the largest wait any rank measured for it
  for (auto it = std::sregex_iterator(r.output.begin(), r.output.end(), series); it != std::sregex_iterator(); ++it) {
    const int peer = std::stoi((*it)[1]);
    worst[peer] = std::max(worst[peer], std::stod((*it)[2]));
  }
  ASSERT_TRUE(worst.count(2)) << r.output;
  for (const auto& [peer, s] : worst) {
    if (peer == 2) {
      EXPECT_GT(s, 0.5 * 20 * 0.050) << r.output;  // about 1 s injected
      EXPECT_LT(s, 3 * 20 * 0.050) << r.output;
    } else {
      EXPECT_LT(s, 0.25 * worst[2]) << "peer " << peer << " is not the slow one\n" << r.output;
    }
  }
}

// Named by the path: CollectiveStragglers/CollectiveStragglers.ThePeerWaitMetricNamesTheSlowRank/direct.
std::string straggler_path(const ::testing::TestParamInfo<std::string>& p) {
  static const char* const names[] = {"ring", "direct", "mesh", "mesh_across_hosts"};
  return names[p.index];
}

INSTANTIATE_TEST_SUITE_P(CollectiveStragglers, CollectiveStragglers,
                         ::testing::Values("--rank0-mesh-max 0", "--rank0-mesh-max 0 --shared-min 4096 --direct-min 1024",
                                           "", "--hosts 2"),
                         straggler_path);

// Rank 1 all-gathers another size than ranks 0 and 2: on the mesh (1001 elements against 1000),
// on the ring (the mesh off), and across the mesh's threshold (3000 elements take the ring, 1000
// the mesh), where a ring's header meets mesh messages and the other way round.
struct Mismatch {
  std::string name, env, flags;
  int elems;
  friend void PrintTo(const Mismatch& m, std::ostream* os) { *os << m.name; }
};

class MismatchedSizes : public ::testing::TestWithParam<Mismatch> {};

TEST_P(MismatchedSizes, AreNamedOnEveryRank) {
  const auto& p = GetParam();
  auto r = run_command(p.env + launch(3, "--mode mismatch --timeout-ms 20000 " + p.flags, "--grace 30"));
  EXPECT_NE(r.rc, 0) << r.output;
  // Rank 1's neighbours see its header; whoever is left sees them go.
  EXPECT_NE(r.output.find("rank 1 issued all_gather#0 (f32 x " + std::to_string(p.elems) +
                          " per rank) where rank 2 issued all_gather#0 (f32 x 1000 per rank)"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("rank 0 issued all_gather#0 (f32 x 1000 per rank) where rank 1 issued"), std::string::npos)
      << r.output;
  for (int i = 0; i < 3; ++i) {
    EXPECT_NE(r.output.find("rank " + std::to_string(i) + ": expected error"), std::string::npos) << r.output;
  }
  EXPECT_LT(r.seconds, 20) << r.output;
}

// Across hosts (fake ones, as below) on the mesh: the size check names the ranks by their rank in
// the communicator, not by their index on the per-host or cross-host wire.
TEST(CollectiveErrors, MismatchedSizesOnTheMeshAcrossHostsAreNamedByRank) {
  if (::geteuid() != 0) GTEST_SKIP() << "a hostname per rank needs a UTS namespace, which needs root";
  auto r = run_command(launch(4, "--mode mismatch --timeout-ms 20000 --hosts 2", "--grace 30"));
  EXPECT_NE(r.rc, 0) << r.output;
  // Ranks 1 and 3 have local index 1 on hosts 0 and 1: they meet first, across hosts.
  EXPECT_NE(r.output.find("rank 1 issued all_gather#0 (f32 x 1001 per rank) where rank 3 issued all_gather#0 "
                          "(f32 x 1000 per rank)"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("rank 3 issued all_gather#0 (f32 x 1000 per rank) where rank 1 issued"), std::string::npos)
      << r.output;
  for (int i = 0; i < 4; ++i) {
    EXPECT_NE(r.output.find("rank " + std::to_string(i) + ": expected error"), std::string::npos) << r.output;
  }
  EXPECT_LT(r.seconds, 20) << r.output;
}

INSTANTIATE_TEST_SUITE_P(CollectiveErrors, MismatchedSizes,
                         ::testing::Values(Mismatch{"on_the_mesh", "", "", 1001},
                                           Mismatch{"on_the_ring", "COSHARD_UCX_MESH_MAX_BYTES=0 ", "", 1001},
                                           Mismatch{"across_the_mesh_threshold", "", "--mismatch-elems 3000", 3000}),
                         [](const ::testing::TestParamInfo<Mismatch>& p) { return p.param.name; });

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

// The same with all-reduces of 1 KiB, which take the mesh: every survivor waits on the dead rank's
// message directly.
TEST(CollectiveErrors, ADeadRankFailsEveryOtherRankOnTheMesh) {
  auto r = run_command(launch(4, "--mode die --die-rank 2 --die-elems 256 --timeout-ms 600000", "--grace 60"));
  EXPECT_NE(r.rc, 0) << r.output;
  for (int i : {0, 1, 3}) {
    EXPECT_NE(r.output.find("rank " + std::to_string(i) + ": expected error"), std::string::npos) << r.output;
  }
  EXPECT_NE(r.output.find("rank 2 (pid"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("is gone (its process exited)"), std::string::npos) << r.output;
  EXPECT_LT(r.seconds, 30) << r.output;
}

// The same with all-reduces of 1 MiB per rank, which take the direct path: the survivors wait
// for the dead rank's "ready" or "done" message and must notice it is gone.
TEST(CollectiveErrors, ADeadRankFailsEveryOtherRankOnTheDirectPath) {
  auto r = run_command(launch(4, "--mode die --die-rank 2 --die-elems 1048576 --timeout-ms 600000", "--grace 60"));
  EXPECT_NE(r.rc, 0) << r.output;
  for (int i : {0, 1, 3}) {
    EXPECT_NE(r.output.find("rank " + std::to_string(i) + ": expected error"), std::string::npos) << r.output;
  }
  EXPECT_NE(r.output.find("is gone (its process exited)"), std::string::npos) << r.output;
  EXPECT_LT(r.seconds, 30) << r.output;
}

// Ranks on "hosts" of their own: each rank takes a hostname in a UTS namespace (network and shared
// memory stay shared), which is all UCX tells hosts apart by. When every host has the same number
// (> 1) of ranks the collectives take the two-level schedule (docs/transport.md, "Across hosts");
// collectives_check fails when they did not, or did where they should not, and checks every
// result against its own reference either way. "round" puts ranks 0 and 2 on one host, 1 and 3 on
// the other, so the schedule's blocks are not in rank order.
struct FakeHosts {
  std::string name;
  int ranks;
  std::string flags;
  std::string env;
  bool hierarchical;  // whether the world takes the two-level schedule
  friend void PrintTo(const FakeHosts& h, std::ostream* os) { *os << h.name; }
};

class CollectivesAcrossFakeHosts : public ::testing::TestWithParam<FakeHosts> {};

TEST_P(CollectivesAcrossFakeHosts, EveryCollectiveMatchesTheLocalReference) {
  if (::geteuid() != 0) GTEST_SKIP() << "a hostname per rank needs a UTS namespace, which needs root";
  const auto& p = GetParam();
  auto r = run_command(p.env + launch(p.ranks, "--timeout-ms 120000 --big 40000 " + p.flags));
  EXPECT_EQ(r.rc, 0) << r.output;
  for (int i = 0; i < p.ranks; ++i) {
    EXPECT_NE(r.output.find("rank " + std::to_string(i) + ": collectives ok ("), std::string::npos) << r.output;
  }
  // collectives_check also fails on its own when the schedule is not the expected one.
  const bool flat_somewhere = r.output.find("ranks, 0 hierarchical") != std::string::npos;
  EXPECT_EQ(flat_somewhere, !p.hierarchical) << r.output;
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, CollectivesAcrossFakeHosts,
    ::testing::Values(FakeHosts{"two_hosts_in_blocks", 4, "--hosts 2", "", true},
                      FakeHosts{"two_hosts_round_robin", 4, "--hosts 2 --host-layout round", "", true},
                      FakeHosts{"three_hosts", 6, "--hosts 3 --host-layout round", "", true},
                      // Chunks of 16 KiB: buffers of 32 KiB and more (up to 160 KB here) overlap
                      // their phases in 2 to 8 chunks.
                      FakeHosts{"two_hosts_overlapped", 4, "--hosts 2 --host-layout round",
                                "COSHARD_UCX_HIERARCHY_CHUNK_BYTES=16384 ", true},
                      FakeHosts{"three_hosts_overlapped", 6, "--hosts 3", "COSHARD_UCX_HIERARCHY_CHUNK_BYTES=16384 ",
                                true},
                      FakeHosts{"hierarchy_off", 4, "--hosts 2", "COSHARD_UCX_HIERARCHY=0 ", false},
                      FakeHosts{"uneven_hosts", 3, "--hosts 2", "", false}),
    [](const ::testing::TestParamInfo<FakeHosts>& p) { return p.param.name; });

// A rank dies in the middle of a two-level all-reduce (fake hosts as above): every survivor fails
// within the deadline naming it, by its job rank (the sub-wires name it "job rank 2", the flat
// ring, whose header exchange may notice first under load, "rank 2"), never by a sub-wire index.
// `env` chooses the phases one after another or overlapped in chunks; `elems` the all-reduces' size.
void expect_the_dead_rank_named(const std::string& env, int elems = 1048576) {
  if (::geteuid() != 0) GTEST_SKIP() << "a hostname per rank needs a UTS namespace, which needs root";
  auto r = run_command(env + launch(4,
                                    "--mode die --die-rank 2 --die-elems " + std::to_string(elems) +
                                        " --timeout-ms 600000 --hosts 2",
                                    "--grace 60"));
  EXPECT_NE(r.rc, 0) << r.output;
  for (int i : {0, 1, 3}) {
    EXPECT_NE(r.output.find("rank " + std::to_string(i) + ": expected error"), std::string::npos) << r.output;
  }
  const auto named = r.output.find("rank 2 (pid ");
  ASSERT_NE(named, std::string::npos) << r.output;
  // Rank 2 is index 1 of the cross-host wire: naming that index would say "rank 1" with rank 2's
  // pid. (Rank 1 itself may be named: a survivor that failed and exited first is gone too.)
  const std::string pid = r.output.substr(named + 12, r.output.find(' ', named + 12) - (named + 12));
  EXPECT_EQ(r.output.find("rank 1 (pid " + pid + " "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("is gone"), std::string::npos) << r.output;
  EXPECT_LT(r.seconds, 30) << r.output;
}

TEST(CollectiveErrors, ADeadRankFailsEveryOtherRankOnTheTwoLevelSchedule) {
  expect_the_dead_rank_named("COSHARD_UCX_HIERARCHY_CHUNK_BYTES=0 ");
}

// 1 KiB all-reduces: the mesh's three rounds on the per-host and cross-host wires.
TEST(CollectiveErrors, ADeadRankFailsEveryOtherRankOnTheMeshAcrossHosts) { expect_the_dead_rank_named("", 256); }

// 4 MiB all-reduces in 8 chunks: the survivors' two threads both stop.
TEST(CollectiveErrors, ADeadRankFailsEveryOtherRankOnTheOverlappedTwoLevelSchedule) {
  expect_the_dead_rank_named("COSHARD_UCX_HIERARCHY_CHUNK_BYTES=262144 ");
}

// Two "hosts" in two network namespaces joined by a veth pair; TCP only (namespaces do not
// isolate shared memory, hence also COSHARD_UCX_DIRECT=0: the host name is the same) and UCX's
// peer-failure mode, as across real hosts.
TEST(CollectivesAcrossHosts, TwoNamespacesOverTcp) {
  if (::geteuid() != 0) GTEST_SKIP() << "network namespaces need root";
  const std::string id = std::to_string(::getpid() % 100000);
  const std::string a = "cshA" + id, b = "cshB" + id, va = "vA" + id, vb = "vB" + id;
  const std::string subnet = "10.213." + std::to_string(::getpid() % 200 + 20) + ".";
  // scripts/cluster's lock: its `down` unmounts /run/netns when it sees no namespace left, which
  // must not fall between that look and this test's first `ip netns add` (ctest runs both at once).
  const auto netns_locked = [](const std::string& cmd) {
    return "mkdir -p /run/lock && flock -w 120 /run/lock/coshard-netns.lock sh -c '" + cmd + "'";
  };
  auto setup = run_command(netns_locked("ip netns add " + a + " && ip netns add " + b + " && ip link add " + va +
                           " type veth peer name " + vb + " && ip link set " + va + " netns " + a +
                           " && ip link set " + vb + " netns " + b + " && ip -n " + a + " addr add " + subnet +
                           "1/24 dev " + va + " && ip -n " + b + " addr add " + subnet + "2/24 dev " + vb +
                           " && ip -n " + a + " link set " + va + " up && ip -n " + b + " link set " + vb +
                           " up && ip -n " + a + " link set lo up && ip -n " + b + " link set lo up"));
  if (setup.rc != 0) {
    run_command(netns_locked("ip netns del " + a + "; ip netns del " + b));
    GTEST_SKIP() << "cannot create network namespaces here (ip netns add failed): " << setup.output;
  }
  const std::string env = "UCX_TLS=tcp COSHARD_UCX_ERROR_MODE=peer COSHARD_UCX_DIRECT=0 ";
  const std::string common = " --nnodes 2 --nproc-per-node 2 --master " + subnet + "1:29731 --token t" + id +
                             " -- " + kCheck + " --timeout-ms 120000 --big 40000";
  auto r = run_command("(ip netns exec " + a + " env " + env + "UCX_NET_DEVICES=" + va + " " + kRun +
                       " --node-rank 0" + common + " > /tmp/coshard-netns-" + id + ".log 2>&1 & p=$!; " +
                       "sleep 0.5; ip netns exec " + b + " env " + env + "UCX_NET_DEVICES=" + vb + " " + kRun +
                       " --node-rank 1" + common + "; rc=$?; wait $p; rc0=$?; cat /tmp/coshard-netns-" + id +
                       ".log; rm -f /tmp/coshard-netns-" + id + ".log; exit $((rc | rc0)))");
  run_command(netns_locked("ip netns del " + a + "; ip netns del " + b));
  EXPECT_EQ(r.rc, 0) << r.output;
  for (int i = 0; i < 4; ++i) {
    EXPECT_NE(r.output.find("rank " + std::to_string(i) + ": collectives ok"), std::string::npos) << r.output;
  }
}

}  // namespace
