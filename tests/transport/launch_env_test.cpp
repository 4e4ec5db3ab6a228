#include <gtest/gtest.h>

#include <map>
#include <string>

#include "coshard/transport/launch_env.hpp"

using namespace coshard;
using namespace coshard::transport;

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
                                       {"SLURM_TASKS_PER_NODE", "4(x2)"}, {"MASTER_ADDR", "n0"},
                                       {"MASTER_PORT", "7000"}}));
  ASSERT_TRUE(slurm) << slurm.error().what();
  EXPECT_EQ(slurm.value().source, "slurm");
  EXPECT_EQ(slurm.value().local_world_size, 4);
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
  auto bad = with("COSHARD_RESTART_COUNT", "-1");
  ASSERT_FALSE(bad);
  EXPECT_NE(std::string(bad.error().what()).find("COSHARD_RESTART_COUNT=-1 must not be negative"), std::string::npos);
}

TEST(LaunchEnv, GarbageNumbersAreNamed) {
  auto r = resolve_launch_env(env({{"RANK", "zero"}, {"WORLD_SIZE", "2"}}));
  ASSERT_FALSE(r);
  EXPECT_NE(std::string(r.error().what()).find("RANK='zero' is not an integer"), std::string::npos);
}

}  // namespace
