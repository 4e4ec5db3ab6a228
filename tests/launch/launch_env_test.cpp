#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "coshard/launch/launch_env.hpp"
#include "coshard/launch/slurm.hpp"

using namespace coshard;
using namespace coshard::launch;

namespace {

EnvLookup env(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](std::string_view n) -> std::optional<std::string> {
    auto it = vars.find(std::string(n));
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

TEST(LaunchEnv, NoLauncherIsASingleRank) {
  auto r = resolve_launch_env(env({}));
  ASSERT_TRUE(r);
  EXPECT_EQ(r.value().world_size, 1);
  EXPECT_EQ(r.value().rank, 0);
  EXPECT_EQ(r.value().source, "none");
}

TEST(LaunchEnv, Torchrun) {
  auto r = resolve_launch_env(env({{"RANK", "3"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"},
                                   {"LOCAL_WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"},
                                   {"MASTER_PORT", "29500"}, {"COSHARD_TOKEN", "s3cret"}}));
  ASSERT_TRUE(r) << r.error().what();
  auto e = r.value();
  EXPECT_EQ(e.source, "torchrun");
  EXPECT_EQ(e.rank, 3);
  EXPECT_EQ(e.world_size, 8);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.local_world_size, 2);
  EXPECT_EQ(e.master_port, 29500);
  EXPECT_EQ(e.token, "s3cret");
}

TEST(LaunchEnv, TorchrunNamesWinOverSlurm) {
  auto r = resolve_launch_env(env({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "0"},
                                   {"LOCAL_WORLD_SIZE", "2"}, {"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "9"},
                                   {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}}));
  ASSERT_TRUE(r);
  EXPECT_EQ(r.value().source, "torchrun");
  EXPECT_EQ(r.value().world_size, 2);
}

TEST(LaunchEnv, OpenMpiPmiAndSlurm) {
  auto ompi = resolve_launch_env(env({{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "4"},
                                      {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                                      {"MASTER_ADDR", "n0"}, {"MASTER_PORT", "7000"}}));
  ASSERT_TRUE(ompi) << ompi.error().what();
  EXPECT_EQ(ompi.value().source, "openmpi");
  EXPECT_EQ(ompi.value().local_world_size, 2);
  auto pmi = resolve_launch_env(env({{"PMI_RANK", "2"}, {"PMI_SIZE", "3"}, {"MASTER_ADDR", "n0"},
                                     {"MASTER_PORT", "7000"}}));
  ASSERT_TRUE(pmi) << pmi.error().what();
  EXPECT_EQ(pmi.value().rank, 2);
  auto slurm = resolve_launch_env(env({{"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "8"}, {"SLURM_LOCALID", "1"},
                                       {"SLURM_TASKS_PER_NODE", "4(x2)"}, {"SLURM_NODEID", "1"},
                                       {"SLURM_STEP_NODELIST", "n[0-1]"}, {"SLURM_JOB_ID", "12"},
                                       {"SLURM_STEP_ID", "0"}, {"MASTER_ADDR", "m"}, {"MASTER_PORT", "7000"}}));
  ASSERT_TRUE(slurm) << slurm.error().what();
  EXPECT_EQ(slurm.value().source, "slurm");
  EXPECT_EQ(slurm.value().local_world_size, 4);
  EXPECT_EQ(slurm.value().master_addr, "m");  // what the user sets wins over the step's first host
  EXPECT_EQ(slurm.value().master_port, 7000);
}

// What srun gives each task of `srun -N3 -n5`: no MASTER_*; the first host serves the store on a
// port and with a token that only this job step derives.
std::map<std::string, std::string> slurm_step(const std::string& procid, const std::string& nodeid) {
  return {{"SLURM_PROCID", procid},        {"SLURM_NTASKS", "5"},
          {"SLURM_LOCALID", "0"},          {"SLURM_NODEID", nodeid},
          {"SLURM_JOB_ID", "4242"},        {"SLURM_STEP_ID", "3"},
          {"SLURM_STEP_NODELIST", "gpu-a[07-08],login2"}, {"SLURM_STEP_TASKS_PER_NODE", "2(x2),1"}};
}

TEST(LaunchEnv, SlurmStepWithoutMasterFindsItsFirstHost) {
  auto a = resolve_launch_env(env(slurm_step("4", "2")));
  ASSERT_TRUE(a) << a.error().what();
  EXPECT_EQ(a.value().rank, 4);
  EXPECT_EQ(a.value().world_size, 5);
  EXPECT_EQ(a.value().local_world_size, 1);  // the third host runs one task
  EXPECT_EQ(a.value().master_addr, "gpu-a07");
  EXPECT_EQ(a.value().token, "slurm-4242.3");
  auto b = resolve_launch_env(env(slurm_step("1", "0")));
  ASSERT_TRUE(b) << b.error().what();
  EXPECT_EQ(b.value().local_world_size, 2);
  EXPECT_EQ(b.value().master_port, a.value().master_port);
  EXPECT_GE(a.value().master_port, 20000);
  EXPECT_LT(a.value().master_port, 32768);  // below Linux's ephemeral ports
  auto other_step = slurm_step("1", "0");
  other_step["SLURM_STEP_ID"] = "4";
  EXPECT_NE(resolve_launch_env(env(other_step)).value().master_port, a.value().master_port);
  other_step["SLURM_STEP_RESV_PORTS"] = "12000-12003";
  EXPECT_EQ(resolve_launch_env(env(other_step)).value().master_port, 12000);
}

TEST(LaunchEnv, SlurmBatchScriptOutsideAStepIsOneProcess) {
  // sbatch -N2 -n4: the batch shell sees SLURM_PROCID=0 and SLURM_NTASKS=4, but it is no rank.
  auto r = resolve_launch_env(env({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "4"}, {"SLURM_JOB_ID", "7"},
                                   {"SLURM_JOB_NODELIST", "node[1-2]"}, {"SLURM_NODEID", "0"}}));
  ASSERT_TRUE(r) << r.error().what();
  EXPECT_EQ(r.value().source, "none");
  EXPECT_EQ(r.value().world_size, 1);
}

TEST(LaunchEnv, SlurmStepWithABadHostListSaysWhichVariable) {
  auto vars = slurm_step("0", "0");
  vars["SLURM_STEP_NODELIST"] = "node[1-";
  auto r = resolve_launch_env(env(vars));
  ASSERT_FALSE(r);
  EXPECT_NE(std::string(r.error().what()).find("Slurm host list 'node[1-'"), std::string::npos) << r.error().what();
  vars = slurm_step("0", "5");
  r = resolve_launch_env(env(vars));
  ASSERT_FALSE(r);
  EXPECT_NE(std::string(r.error().what()).find("SLURM_NODEID=5 is outside the step's 3 hosts"), std::string::npos)
      << r.error().what();
}

TEST(SlurmHostlist, ExpandsRangesPaddingAndProducts) {
  using V = std::vector<std::string>;
  EXPECT_EQ(expand_hostlist("node1").value(), V{"node1"});
  EXPECT_EQ(expand_hostlist("node[1-3,7]").value(), (V{"node1", "node2", "node3", "node7"}));
  EXPECT_EQ(expand_hostlist("a[08-10],b").value(), (V{"a08", "a09", "a10", "b"}));
  EXPECT_EQ(expand_hostlist("r[1-2]-n[1-2]").value(), (V{"r1-n1", "r1-n2", "r2-n1", "r2-n2"}));
  for (const char* bad : {"", "a,,b", "n[1-", "n]1", "n[3-1]", "n[x]", "n[[1]]", "n[1-99999]"}) {
    EXPECT_FALSE(expand_hostlist(bad)) << bad;
  }
  EXPECT_EQ(expand_tasks_per_node("2(x3),1").value(), (std::vector<int>{2, 2, 2, 1}));
  for (const char* bad : {"", "x", "2(x0)", "2(x3", "0", "4294967297"}) EXPECT_FALSE(expand_tasks_per_node(bad)) << bad;
  // A range ending at LONG_MAX: the loop stepped past it (overflow) and never ended.
  EXPECT_EQ(expand_hostlist("n[9223372036854775806-9223372036854775807]").value(),
            (V{"n9223372036854775806", "n9223372036854775807"}));
}

// They were read into an int by a cast: RANK=4294967296 trained as rank 0 of a world of one.
TEST(LaunchEnv, IntegersBeyondAnIntAreRefusedNotWrapped) {
  auto r = resolve_launch_env(env({{"RANK", "4294967296"}, {"WORLD_SIZE", "4294967297"}, {"MASTER_ADDR", "127.0.0.1"},
                                   {"MASTER_PORT", "29500"}}));
  ASSERT_FALSE(r);
  std::string w = r.error().what();
  for (const char* part : {"RANK='4294967296' is out of range (at most 2147483647)", "WORLD_SIZE='4294967297' is out of range"}) {
    EXPECT_NE(w.find(part), std::string::npos) << part << " missing in: " << w;
  }
  // LOCAL_RANK=INT_MAX without a local size: the size taken from it, local rank + 1, overflowed.
  r = resolve_launch_env(env({{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"LOCAL_RANK", "2147483647"}}));
  ASSERT_FALSE(r);
  EXPECT_NE(std::string(r.error().what()).find("local world size 2147483647 exceeds the world size 1"), std::string::npos)
      << r.error().what();
  r = resolve_launch_env(env({{"RANK", "0"}, {"WORLD_SIZE", "2147483647"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "29500"}}));
  ASSERT_FALSE(r);
  EXPECT_NE(std::string(r.error().what()).find("WORLD_SIZE=2147483647 is more ranks than coshard runs (at most 1048576)"),
            std::string::npos)
      << r.error().what();
  // A job id of LONG_MAX: 131 x it overflowed the port's hash; the port is still below the ephemeral range.
  auto huge = slurm_step("1", "0");
  huge["SLURM_JOB_ID"] = "9223372036854775807";
  huge["SLURM_STEP_ID"] = "9223372036854775807";
  auto h = resolve_launch_env(env(huge));
  ASSERT_TRUE(h) << h.error().what();
  EXPECT_GE(h.value().master_port, 20000);
  EXPECT_LT(h.value().master_port, 32000);
  auto vars = slurm_step("0", "4294967296");
  r = resolve_launch_env(env(vars));
  ASSERT_FALSE(r);
  EXPECT_NE(std::string(r.error().what()).find("SLURM_NODEID='4294967296' is not a node index"), std::string::npos)
      << r.error().what();
}

TEST(LaunchEnv, ListsEveryProblemAtOnce) {
  auto r = resolve_launch_env(env({{"RANK", "9"}, {"WORLD_SIZE", "4"}, {"MASTER_PORT", "99999"}}));
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), Errc::bad_config);
  std::string w = r.error().what();
  for (const char* part : {"RANK=9 is outside [0, 4)", "MASTER_ADDR is not set", "MASTER_PORT=99999"}) {
    EXPECT_NE(w.find(part), std::string::npos) << part << " missing in: " << w;
  }
}

TEST(LaunchEnv, RestartCountFromCoshardRunOrTorchrun) {
  const std::map<std::string, std::string> base{{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"},
                                                {"MASTER_PORT", "29500"}};
  EXPECT_EQ(resolve_launch_env(env(base)).value().restart_count, 0);
  auto with = [&](const char* name, const char* value) {
    auto vars = base;
    vars[name] = value;
    return resolve_launch_env(env(vars));
  };
  EXPECT_EQ(with("COSHARD_RESTART_COUNT", "2").value().restart_count, 2);
  EXPECT_EQ(with("TORCHELASTIC_RESTART_COUNT", "3").value().restart_count, 3);
  EXPECT_EQ(with("COSHARD_RESTART_EXIT_CODE", "137").value().restart_exit_code, 137);
  EXPECT_EQ(with("COSHARD_RESTART_FAILED_RANK", "3").value().restart_failed_rank, 3);
  EXPECT_EQ(resolve_launch_env(env(base)).value().restart_failed_rank, -1);
  auto bad = with("COSHARD_RESTART_COUNT", "-1");
  ASSERT_FALSE(bad);
  EXPECT_NE(std::string(bad.error().what()).find("COSHARD_RESTART_COUNT=-1 must not be negative"), std::string::npos);
}

TEST(LaunchEnv, GarbageNumbersAreNamed) {
  auto r = resolve_launch_env(env({{"RANK", "zero"}, {"WORLD_SIZE", "2"}}));
  ASSERT_FALSE(r);
  EXPECT_NE(std::string(r.error().what()).find("RANK='zero' is not an integer"), std::string::npos);
}

// mpirun sets no MASTER_*: each rank derives the store's port and token from the job's name, and
// on one host the store is on loopback; across hosts only MASTER_ADDR is asked for.
TEST(LaunchEnv, OpenMpiDerivesTheStoreFromTheJobAndAsksOnlyForTheHostAcrossHosts) {
  std::map<std::string, std::string> one_host = {{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "4"},
                                                 {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                                                 {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"}, {"PMIX_NAMESPACE", "924778497"}};
  auto a = resolve_launch_env(env(one_host));
  ASSERT_TRUE(a) << a.error().what();
  EXPECT_EQ(a.value().master_addr, "127.0.0.1");
  EXPECT_GE(a.value().master_port, 20000);
  EXPECT_LT(a.value().master_port, 32000);
  EXPECT_EQ(a.value().token, "openmpi-924778497");
  auto rank_0 = one_host;
  rank_0["OMPI_COMM_WORLD_RANK"] = "0";
  rank_0["OMPI_COMM_WORLD_LOCAL_RANK"] = "0";
  EXPECT_EQ(resolve_launch_env(env(rank_0)).value().master_port, a.value().master_port);  // every rank alike
  auto other_job = one_host;
  other_job["PMIX_NAMESPACE"] = "924778498";
  EXPECT_NE(resolve_launch_env(env(other_job)).value().master_port, a.value().master_port);
  auto given = one_host;
  given["MASTER_PORT"] = "7000";
  given["COSHARD_TOKEN"] = "mine";
  EXPECT_EQ(resolve_launch_env(env(given)).value().master_port, 7000);
  EXPECT_EQ(resolve_launch_env(env(given)).value().token, "mine");

  auto two_hosts = one_host;
  two_hosts["OMPI_COMM_WORLD_LOCAL_SIZE"] = "2";
  auto b = resolve_launch_env(env(two_hosts));
  ASSERT_FALSE(b);
  EXPECT_NE(b.error().message().find("MASTER_ADDR is not set, and the job spans hosts: give every rank rank 0's host "
                                     "(mpirun -x MASTER_ADDR=HOST)"),
            std::string::npos)
      << b.error().message();
  EXPECT_EQ(b.error().message().find("MASTER_PORT"), std::string::npos) << b.error().message();  // derived
  two_hosts["MASTER_ADDR"] = "node1";
  EXPECT_EQ(resolve_launch_env(env(two_hosts)).value().master_addr, "node1");
  // An Open MPI without PMIx names no job: on one host only the port is to be given.
  auto no_pmix = one_host;
  no_pmix.erase("PMIX_NAMESPACE");
  auto c = resolve_launch_env(env(no_pmix));
  ASSERT_FALSE(c);
  EXPECT_NE(c.error().message().find("MASTER_PORT is not set"), std::string::npos) << c.error().message();
  EXPECT_EQ(c.error().message().find("MASTER_ADDR"), std::string::npos) << c.error().message();
}

}  // namespace
