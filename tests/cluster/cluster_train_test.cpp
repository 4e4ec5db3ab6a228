// gpt2-train across two hosts of a real (namespace) cluster: started by srun with no launcher of
// ours, by mpirun inside an allocation, by an sbatch script running coshard-run on every host, and
// by coshard-run started by hand on each host; every way gives the losses of the same global
// batch on one host, and a real Prometheus on the login host scrapes every rank of every host
// over the bridge.
#include "cluster/cluster_support.hpp"

namespace coshard::testing::cluster {
namespace {

TEST_F(Cluster, SrunTrainsEveryStrategyWithTheLossesOfOneHost) {
  for (std::string strategy : {"full_shard", "shard_grad_op", "no_shard", "hybrid_shard", "hybrid_shard_zero2"}) {
    // Across hosts a hybrid strategy shards within the host by default; on one host of 4 ranks
    // the same groups need --shard-group 2.
    const bool hybrid = strategy.starts_with("hybrid");
    auto one = one_host_run("--strategy " + strategy + (hybrid ? " --shard-group 2" : ""));
    ASSERT_EQ(one.rc, 0) << one.output;
    auto two = run_command(on("login", "srun -N2 --ntasks-per-node=2 " + kTrain + kFourSteps +
                                           "--metrics-port 0 --strategy " + strategy));
    ASSERT_EQ(two.rc, 0) << two.output;
    expect_same_losses(two.output, one.output, strategy + " on 2 hosts x 2 ranks by srun");
    EXPECT_NE(two.output.find("4 rank(s), " + strategy + (hybrid ? " (shard groups of 2 ranks)" : "")),
              std::string::npos)
        << two.output;
  }
}

// srun -N2 -n3 puts 2 ranks on node1 and 1 on node2: full_shard trains with the losses of 3 ranks
// on one host; a hybrid strategy, whose default shard group is a host's ranks, cannot group them
// and says so (each rank had counted its own host's ranks: they disagreed, and failed apart).
TEST_F(Cluster, AnUnevenSlurmStepTrainsFullShardAndHybridNamesTheSplit) {
  auto one = run_command(kRun + " --nproc-per-node 3 -- " + kTrain + kFourSteps + "--metrics-port 0");
  ASSERT_EQ(one.rc, 0) << one.output;
  const std::string uneven = "srun -N2 -n3 " + kTrain + kFourSteps + "--metrics-port 0 ";
  auto full = run_command(on("login", uneven));
  ASSERT_EQ(full.rc, 0) << full.output;
  expect_same_losses(full.output, one.output, "full_shard on 2 hosts holding 2 and 1 ranks");
  auto hybrid = run_command(on("login", uneven + "--strategy hybrid_shard --rendezvous-timeout 20"));
  EXPECT_NE(hybrid.rc, 0) << hybrid.output;
  EXPECT_LT(hybrid.seconds, 60) << hybrid.output;
  EXPECT_NE(hybrid.output.find("hybrid sharding's shard group is the ranks of a host by default, but the hosts hold "
                               "different numbers of ranks (node1: 2, node2: 1)"),
            std::string::npos)
      << hybrid.output;
  EXPECT_NE(hybrid.output.find("srun --ntasks-per-node=N"), std::string::npos) << hybrid.output;
}

// Open MPI's mpirun inside an allocation (it starts its daemons through Slurm): given rank 0's
// host, the ranks derive the rest from the job; without it every rank says what to give.
TEST_F(Cluster, MpirunInsideAnAllocationTrainsAcrossHostsWithTheLossesOfOneHost) {
  if (run_command("command -v mpirun").rc != 0) GTEST_SKIP() << "mpirun is not installed: scripts/setup installs openmpi-bin";
  auto one = one_host_run("--strategy hybrid_shard --shard-group 2");
  ASSERT_EQ(one.rc, 0) << one.output;
  const std::string mpirun = "salloc -N2 --ntasks-per-node=2 mpirun --allow-run-as-root --mca btl_tcp_if_include eth0 "
                             "--mca oob_tcp_if_include eth0 ";
  const std::string train = kTrain + kFourSteps + "--metrics-port 0 --strategy hybrid_shard";
  auto two = run_command(on("login", mpirun + "-x MASTER_ADDR=node1 " + train));
  ASSERT_EQ(two.rc, 0) << two.output;
  expect_same_losses(two.output, one.output, "hybrid_shard on 2 hosts x 2 ranks by mpirun");
  EXPECT_NE(two.output.find("4 rank(s), hybrid_shard (shard groups of 2 ranks)"), std::string::npos) << two.output;
  auto unnamed = run_command(on("login", mpirun + train));
  EXPECT_NE(unnamed.rc, 0) << unnamed.output;
  EXPECT_NE(unnamed.output.find("MASTER_ADDR is not set, and the job spans hosts: give every rank rank 0's host "
                                "(mpirun -x MASTER_ADDR=HOST)"),
            std::string::npos)
      << unnamed.output;
}

TEST_F(Cluster, SbatchScriptRunsCoshardRunOnEveryHost) {
  auto dir = train::temp_dir("cluster-sbatch");
  const std::string script = dir / "job.sh", out = dir / "job.out";
  std::ofstream(script) << "#!/bin/bash\nsrun --ntasks-per-node=1 " << kRun << " --nproc-per-node 2 -- " << kTrain
                        << kFourSteps << "--metrics-port 0\n";
  auto r = run_command(on("login", "sbatch --wait -N2 -o " + out + " " + script));
  const std::string log = read_file(out);
  ASSERT_EQ(r.rc, 0) << r.output << log;
  auto one = one_host_run("");
  ASSERT_EQ(one.rc, 0) << one.output;
  expect_same_losses(log, one.output, "sbatch with coshard-run on 2 hosts");
  EXPECT_NE(log.find("[rank 3]"), std::string::npos) << log;  // node2's coshard-run started ranks 2 and 3
}

// By hand on each host (no Slurm), the metrics bound to the host's address: Prometheus on login
// must see 4 targets up and a coshard_tokens_total series from each rank, while the ranks linger,
// and every rank's collectives across the 2 hosts x 2 ranks must have taken the two-level schedule.
const std::string kTwoLevel =
    "count(count%20by(instance)(coshard_collective_algorithm_total%7Balgorithm%3D%22hierarchical%22%7D))";
TEST_F(Cluster, CoshardRunOnEachHostIsScrapedFromTheLoginHost) {
  auto dir = train::temp_dir("cluster-prometheus");
  const std::string d = dir.string();
  std::ofstream(d + "/prom.yml") << "global: {scrape_interval: 1s}\nscrape_configs:\n  - job_name: coshard\n"
                                    "    static_configs: [{targets: [node1:9400, node1:9401, node2:9400, node2:9401]}]\n";
  const std::string train = kFourSteps + "--metrics-bind 0.0.0.0 --metrics-port 9400 --metrics-linger 20";
  auto ask = [&](const std::string& promql) {
    return on("login", "curl -s " + quote("http://127.0.0.1:9090/api/v1/query?query=" + promql));
  };
  const std::string prometheus = on("login", "exec prometheus --config.file=" + d + "/prom.yml --storage.tsdb.path=" + d +
                                                 "/tsdb --web.listen-address=127.0.0.1:9090 > " + d + "/prom.log 2>&1");
  auto r = run_script(prometheus + " & p=$!; " + by_hand(0, train) + " > " + d + "/node1.log 2>&1 & a=$!; " +
                       by_hand(1, train) + " > " + d + "/node2.log 2>&1 & b=$!; for i in $(seq 60); do u=$(" +
                       ask("count(up==1)") + "); s=$(" + ask("count(count%20by(instance)(coshard_tokens_total))") +
                       "); h=$(" + ask(kTwoLevel) + "); case \"$u$s$h\" in *'\"4\"]'*'\"4\"]'*'\"4\"]'*) break;; esac; "
                       "sleep 1; done; echo \"up: $u\"; echo \"series: $s\"; echo \"two-level: $h\"; wait $a; "
                       "echo rc1=$?; wait $b; echo rc2=$?; kill $p");
  const std::string node1 = read_file(d + "/node1.log"), node2 = read_file(d + "/node2.log");
  EXPECT_NE(r.output.find("rc1=0"), std::string::npos) << r.output << node1;
  EXPECT_NE(r.output.find("rc2=0"), std::string::npos) << r.output << node2;
  // 4 targets up; 4 instances with the series; 4 ranks whose collectives took the two-level schedule
  for (const std::string what : {"up: ", "series: ", "two-level: "}) {
    auto at = r.output.find(what);
    ASSERT_NE(at, std::string::npos) << r.output;
    auto answer = train::json::parse(r.output.substr(at + what.size(), r.output.find('\n', at) - at - what.size()),
                                     nullptr, false);
    ASSERT_FALSE(answer.is_discarded()) << r.output << read_file(d + "/prom.log");
    ASSERT_EQ(answer["data"]["result"].size(), 1u) << r.output;
    EXPECT_EQ(answer["data"]["result"][0]["value"][1], "4") << what << r.output;
  }
  auto one = one_host_run("");
  ASSERT_EQ(one.rc, 0) << one.output;
  expect_same_losses(node1, one.output, "coshard-run by hand on 2 hosts");
}

// scripts/cluster-test's real-host suite as a user runs it on hosts of their own: from a hostfile
// (each command entering its host as ssh would), and inside a Slurm allocation (srun). Every check
// of the suite must pass, each with its verdict line.
TEST_F(Cluster, TheRealHostSuitePassesFromAHostfileAndInsideAnAllocation) {
  auto dir = train::temp_dir("cluster-real-suite");
  const std::string hostfile = (dir / "hosts").string();
  std::ofstream(hostfile) << "# the namespace cluster's nodes\nnode1\n\nnode2  # the second\n";
  const std::string suite = std::string(COSHARD_SOURCE_DIR) + "/scripts/cluster-test --build " + COSHARD_BUILD_DIR;
  const std::vector<std::string> checks = {
      "collectives_match_the_reference_across_hosts: Passed",
      "full_shard_across_hosts_has_the_losses_of_one_host: Passed",
      "hybrid_shard_across_hosts_has_the_losses_of_one_host: Passed",
      "a_dead_rank_ends_every_host_naming_it: Passed",
  };
  auto from_hostfile =
      run_command(suite + " --hostfile " + hostfile + " --port 29472 --launch " + quote(cluster("exec", "{host} -- bash -c")));
  EXPECT_EQ(from_hostfile.rc, 0) << from_hostfile.output;
  auto in_allocation = run_command(on("login", "salloc -N2 " + suite + " --allocation"));
  EXPECT_EQ(in_allocation.rc, 0) << in_allocation.output;
  for (const auto& run : {from_hostfile.output, in_allocation.output}) {
    const auto verdicts = run.find("== cluster verdicts");
    ASSERT_NE(verdicts, std::string::npos) << run;
    for (const auto& check : checks) EXPECT_NE(run.find(check, verdicts), std::string::npos) << check << "\n" << run;
  }
  // A hostfile of one host is refused, naming what it has.
  std::ofstream(hostfile) << "node1\n";
  auto one = run_command(suite + " --hostfile " + hostfile);
  EXPECT_EQ(one.rc, 2) << one.output;
  EXPECT_NE(one.output.find("needs 2 or more hosts; it has 1 (node1)"), std::string::npos) << one.output;
}

}  // namespace
}  // namespace coshard::testing::cluster
