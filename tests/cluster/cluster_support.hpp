#pragma once
// What the multi-host tests share: a real cluster for each test (scripts/cluster: hosts login,
// node1 and node2 as network + UTS namespaces on a bridge, Slurm with slurmctld on login and a
// slurmd per node), torn down after it, also when it fails; commands run on one of its hosts;
// and the one-host run every multi-host run is compared with.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "support/run_command.hpp"
#include "train/trainer_support.hpp"

namespace coshard::testing::cluster {

using train::kRun;
using train::kTrain;
inline const std::string kCluster = std::string(COSHARD_SOURCE_DIR) + "/scripts/cluster";
// GPT-2 tiny with the steps as JSON records from rank 0 and no sample text; kFourSteps: 4 steps.
inline const std::string kTrainArgs = " --seq 32 --samples 0 --log-json - ";
inline const std::string kFourSteps = kTrainArgs + "--steps 4 ";

// One word for a shell: 'it'\''s'.
inline std::string quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// A shell script as one command, so that run_command captures the stderr of all of it.
inline CommandResult run_script(const std::string& script) { return run_command("bash -c " + quote(script)); }

inline std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

inline std::vector<double> losses(const std::string& output) {
  std::vector<double> out;
  for (const auto& r : train::step_records(output)) out.push_back(r.at("loss").get<double>());
  return out;
}

// Same global batch, same losses: 1e-5 relative (reductions run in another order across hosts).
inline void expect_same_losses(const std::string& got_output, const std::string& want_output, const std::string& what) {
  auto got = losses(got_output), want = losses(want_output);
  ASSERT_EQ(want.size(), 4u) << "reference run of " << what << ":\n" << want_output;
  ASSERT_EQ(got.size(), want.size()) << what << ":\n" << got_output;
  for (std::size_t i = 0; i < want.size(); ++i) {
    EXPECT_NEAR(got[i], want[i], 1e-5 * std::abs(want[i])) << what << ", step " << i + 1;
  }
}

// gpt2-train on 4 ranks of this machine's own host: the reference.
inline CommandResult one_host_run(const std::string& extra) {
  return run_command(kRun + " --nproc-per-node 4 -- " + kTrain + kFourSteps + "--metrics-port 0 " + extra);
}

class Cluster : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "the namespace cluster needs root (network namespaces and mounts)";
    for (const char* tool : {"slurmctld", "slurmd", "srun", "munged"}) {
      if (run_command(std::string("command -v ") + tool).rc != 0) {
        GTEST_SKIP() << tool << " is not installed: scripts/setup installs Slurm and munge";
      }
    }
    // A cluster test killed by ctest's timeout never ran its TearDown: take down what such tests
    // left, then own this one, so that the next run takes it down if this process is killed too.
    run_command(kCluster + " reap");
    name_ = "t" + std::to_string(::getpid());
    auto r = run_command(cluster("up", "--nodes 2 --owner " + std::to_string(::getpid())));
    ASSERT_EQ(r.rc, 0) << r.output;
    up_ = true;
  }
  void TearDown() override {
    if (!up_) return;
    const std::string lab = "/tmp/coshard-cluster/" + name_;
    if (HasFailure()) std::fprintf(stderr, "%s\n", run_command("tail -n 8 " + lab + "/log/*.log").output.c_str());
    // What `up` started, so that each test also checks that `down` leaves none of it: every
    // process in the cluster's namespaces (holders, slurmctld, slurmd, ranks) and every pid file's.
    // A pid file's pid counts while it is still the cluster's (as `down` judges it), not reused.
    const std::string made = run_command("{ for ns in $(ip netns list | awk '/^cc-" + name_ +
                                         "-/ {print $1}'); do ip netns pids $ns; done; for f in " + lab + "/run/*.pid " +
                                         lab + "/munge/munged.pid; do p=$(cat $f) && tr '\\0' ' ' < /proc/$p/cmdline "
                                         "| grep -qE '" + lab + "|sleep infinity' && echo $p; done; } 2>/dev/null | "
                                         "sort -un | tr '\\n' ' '")
                                 .output;
    auto r = run_command(cluster("down", ""));
    EXPECT_EQ(r.rc, 0) << r.output;
    // A zombie has ended; its parent reaps it.
    auto left = run_command("for p in " + made + "; do [ -e /proc/$p ] && ! grep -q '^State:.Z' /proc/$p/status && "
                            "echo \"process $p: $(tr '\\0' ' ' < /proc/$p/cmdline)\"; done; ip netns list | grep 'cc-" +
                            name_ + "-'; [ -e " + lab + " ] && echo " + lab + "; true");
    EXPECT_EQ(left.output, "") << "scripts/cluster down left these behind (of " << made << ")";
  }

  // scripts/cluster VERB --name <this test's cluster> ARGS.
  std::string cluster(const std::string& verb, const std::string& args) const {
    return kCluster + " " + verb + " --name " + name_ + " " + args;
  }
  // A bash command line run on HOST (login, node1, node2), in this process's working directory.
  std::string on(const std::string& host, const std::string& cmd) const {
    return cluster("exec", host + " -- bash -c " + quote(cmd));
  }
  // coshard-run on one host of two, started by hand: node1 serves the store.
  std::string by_hand(int node_rank, const std::string& train_args, const std::string& launcher_args = "") const {
    return on("node" + std::to_string(node_rank + 1),
              kRun + " --nnodes 2 --node-rank " + std::to_string(node_rank) + " --nproc-per-node 2 --master node1:29400 " +
                  "--token " + name_ + launcher_args + " -- " + kTrain + train_args);
  }

  std::string name_;
  bool up_ = false;
};

}  // namespace coshard::testing::cluster
