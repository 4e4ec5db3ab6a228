// Multi-process tests: real ranks started by coshard-run on this host.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "coshard/runtime/scheduler.hpp"
#include "coshard/launch/store.hpp"
#include "mp/launcher_nodes.hpp"
#include "support/loopback.hpp"
#include "support/run_command.hpp"

namespace {

using Clock = std::chrono::steady_clock;
using coshard::testing::free_loopback_port;

using coshard::testing::await_node_1_ranks;
using coshard::testing::kCheck;
using coshard::testing::kRun;
using coshard::testing::freeze;
using coshard::testing::launcher_pid;
using coshard::testing::rank_log;
using coshard::testing::run;
using coshard::testing::two_nodes;
using Run = coshard::testing::CommandResult;

// Sets `key` to `value` if given (erases it first if `erase`) in the store at `port` on loopback,
// and returns its value: a test writes what a process of another build would have.
std::optional<std::string> store_ask(std::uint16_t port, const std::string& token, std::string key,
                                     std::optional<std::string> value, bool erase = false) {
  using coshard::Task;
  auto task = [](coshard::launch::StoreClient::Options o, std::string k, std::optional<std::string> v,
                 bool e) -> Task<std::optional<std::string>> {
    auto c = co_await coshard::launch::StoreClient::connect(o);
    if (e) co_await c->erase(k);
    if (v) co_await c->set(k, *v);
    co_return co_await c->get(k);
  };
  coshard::launch::StoreClient::Options o;
  o.port = port;
  o.token = token;
  o.connect_timeout = std::chrono::seconds(10);  // a launcher's store may still be coming up
  // The client lives on the scheduler's thread: it connects, asks and closes there.
  coshard::Scheduler sched;
  sched.start();
  return sched.sync_wait(task(o, std::move(key), std::move(value), erase));
}

// A store as node 0's launcher or rank 0 serves it.
class StoreAt {
 public:
  explicit StoreAt(std::string token) : token_(std::move(token)) {
    sched_.start();
    coshard::launch::StoreServer::Options o;
    o.token = token_;
    server_ = std::make_unique<coshard::launch::StoreServer>(sched_, o);
  }
  ~StoreAt() { server_->stop(); }
  std::uint16_t port() const { return server_->port(); }
  std::optional<std::string> ask(std::string key, std::optional<std::string> value, bool erase = false) {
    return store_ask(port(), token_, std::move(key), std::move(value), erase);
  }

 private:
  std::string token_;
  coshard::Scheduler sched_;
  std::unique_ptr<coshard::launch::StoreServer> server_;
};

class Ranks : public ::testing::TestWithParam<int> {};

TEST_P(Ranks, EveryRankRendezvousesAndExchanges) {
  int n = GetParam();
  auto r = run(kRun + " --nproc-per-node " + std::to_string(n) + " -- " + kCheck + " --timeout-ms 30000");
  EXPECT_EQ(r.rc, 0) << r.output;
  for (int i = 0; i < n; ++i) {
    EXPECT_NE(r.output.find("[rank " + std::to_string(i) + "] rank " + std::to_string(i) + " ok world " +
                            std::to_string(n)),
              std::string::npos)
        << r.output;
  }
}

// Named by the rank count: Launcher/Ranks.EveryRankRendezvousesAndExchanges/ranks8.
INSTANTIATE_TEST_SUITE_P(Launcher, Ranks, ::testing::Values(1, 2, 3, 4, 8, 16),
                         [](const ::testing::TestParamInfo<int>& p) { return "ranks" + std::to_string(p.param); });

TEST(Launcher, AFailingRankStopsTheOthersAndIsNamed) {
  auto r = run(kRun + " --nproc-per-node 4 --grace 3 -- " + kCheck + " --fail-rank 2 --timeout-ms 120000");
  EXPECT_EQ(r.rc, 3) << r.output;
  EXPECT_NE(r.output.find("rank 2 (pid"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("exited with status 3"), std::string::npos) << r.output;
  EXPECT_LT(r.seconds, 30) << r.output;
}

// 100 idle connections to a launcher's store under ulimit -n 64 made its accept loop spin (2.4 s of
// CPU in 3 s), and the restart after a rank's failure died with "pipe failed: Too many open files".
// The store now leaves a reserve of descriptors to its process: the restart runs. (The spin itself:
// StoreHostile.OutOfDescriptorsTheAcceptLoopBacksOffAndRecovers.)
TEST(Launcher, IdleConnectionsUnderALowDescriptorLimitLeaveTheRestartItsDescriptors) {
  const auto port = free_loopback_port();
  ASSERT_NE(port, 0);
  const std::string ready = ::testing::TempDir() + "/coshard-run-flood-" + std::to_string(::getpid());
  std::remove(ready.c_str());
  std::remove((ready + ".running").c_str());
  const std::string script = ready + ".sh";
  std::ofstream{script} << "if [ \"$COSHARD_RESTART_COUNT\" = 0 ]; then\n"
                        << "  touch " << ready << ".running\n"
                        << "  while [ ! -e " << ready << " ]; do sleep 0.1; done\n"
                        << "  sleep 1; [ \"$RANK\" = 1 ] && exit 3; sleep 60\n"
                        << "fi\necho \"rank $RANK restarted\"\n";
  std::vector<int> held;
  std::thread flood([&] {  // once the ranks run: 100 connections that never say hello
    // Not before: the launcher's own client of its store connects first (at the reserve it too
    // would be refused, as any client).
    const auto until_running = Clock::now() + std::chrono::seconds(60);
    while (!std::filesystem::exists(ready + ".running") && Clock::now() < until_running) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    for (int i = 0; i < 100; ++i) {
      const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
      timeval limit{1, 0};  // a full accept queue must not hold this thread for the SYN retries
      ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &limit, sizeof limit);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_port = htons(port);
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      const auto until = Clock::now() + std::chrono::seconds(20);
      while (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 && i == 0 && Clock::now() < until) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the launcher is starting
      }
      held.push_back(fd);
    }
    std::ofstream{ready} << "1";
  });
  auto r = run("bash -c 'ulimit -n 64; " + kRun + " --nproc-per-node 2 --max-restarts 1 --grace 2 --master 127.0.0.1:" +
               std::to_string(port) + " -- sh " + script + "'");
  flood.join();
  for (int fd : held) ::close(fd);
  std::remove(ready.c_str());
  std::remove((ready + ".running").c_str());
  std::remove(script.c_str());
  EXPECT_EQ(r.rc, 0) << r.output;
  EXPECT_NE(r.output.find("[rank 0] rank 0 restarted"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("[rank 1] rank 1 restarted"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("Too many open files"), std::string::npos) << r.output;
}

// A rank killed first was not always the one named: when its peer aborted on losing it within the
// same tick of the launcher (UCX's cma_ep.c, 2 of 20 kill -9 trials), the launcher took the ranks
// in rank order and said "rank 0 ... killed by signal 6 (Aborted)", exit 134. The first SIGCHLD
// names the first to die. Here the launcher is stopped while rank 1 is killed and rank 0 aborts.
TEST(Launcher, TheRankThatDiedFirstIsNamedNotThePeerThatAbortedAfterIt) {
  const std::string dir = ::testing::TempDir() + "/coshard-run-died-first-" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string script = dir + "/rank.sh";
  std::ofstream{script} << "if [ \"$RANK\" = 1 ]; then\n"
                        << "  echo $$ > " << dir << "/r1.tmp; mv " << dir << "/r1.tmp " << dir << "/r1.pid\n"
                        << "  while [ ! -e " << dir << "/go ]; do sleep 0.05; done\n"
                        << "  kill -9 $$\n"
                        << "fi\n"
                        << "while [ ! -e " << dir << "/r1.pid ]; do sleep 0.05; done\n"
                        << "p=$(cat " << dir << "/r1.pid)\n"
                        << "while [ \"$(cut -d' ' -f3 /proc/$p/stat 2>/dev/null)\" != Z ]; do sleep 0.01; done\n"
                        << "kill -ABRT $$\n";
  coshard::testing::CommandResult r;
  std::thread job([&] {
    // A session of its own (setsid keeps the pid): in the test's process group, a launcher
    // stopped while its ranks ended once got the kernel's SIGHUP for an orphaned group (ASan).
    r = run("bash -c 'echo $$ > " + dir + "/launcher.pid; exec setsid " + kRun + " --nproc-per-node 2 --grace 2 -- sh " +
            script + "'");
  });
  const auto until = Clock::now() + std::chrono::seconds(30);
  while (!std::filesystem::exists(dir + "/r1.pid") && Clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  int launcher = 0;
  std::ifstream(dir + "/launcher.pid") >> launcher;
  ASSERT_GT(launcher, 0);
  ::kill(launcher, SIGSTOP);  // both ranks end before it looks again
  std::ofstream{dir + "/go"} << "1";
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  ::kill(launcher, SIGCONT);
  job.join();
  EXPECT_EQ(r.rc, 137) << r.output;
  EXPECT_NE(r.output.find("coshard-run: rank 1 (pid"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("was killed by signal 9 (Killed); stopping the other ranks"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("the job failed (exit code 137): node 0: rank 1"), std::string::npos) << r.output;
  // Both ended while the launcher was stopped: rank 0 of its own abort, not of the launcher's SIGTERM.
  EXPECT_NE(r.output.find("rank 0 was killed by signal 6 (Aborted)"), std::string::npos) << r.output;
  std::filesystem::remove_all(dir);
}

// The flight-record folder was named by the launcher's pid alone: a pid the kernel gave again (it
// wraps at pid_max, 32768 here; a CI run wraps it) reused the folder a failed job had kept, and
// the report read that job's records as this one's. `exec` keeps the shell's pid for the launcher.
TEST(Launcher, AFlightRecordFolderAnotherJobKeptIsNeitherReadNorTouched) {
  const std::string base = ::testing::TempDir() + "/coshard-flight-reuse-" + std::to_string(::getpid());
  std::filesystem::remove_all(base);
  std::filesystem::create_directories(base);
  std::ofstream(base + "/stale.json")
      << R"({"comm": "stale", "job_rank": 0, "ops": [{"seq": 7, "op": "all_gather", "state": "failed"}]})";
  std::ofstream(base + "/go.sh") << "d=\"$BASE/coshard-run-$$-attempt0\"\n"
                                 << "mkdir -p \"$d\" && cp \"$BASE/stale.json\" \"$d/coshard-flight-stale-rank0.json\"\n"
                                 << "COSHARD_FLIGHT_DIR=\"$BASE\" exec " << kRun << " --nproc-per-node 1 -- sh -c 'exit 3'\n";
  auto r = run("BASE=" + base + " sh " + base + "/go.sh");
  EXPECT_EQ(r.rc, 3) << r.output;
  EXPECT_NE(r.output.find("exited with status 3"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("stale"), std::string::npos) << r.output;
  std::size_t kept = 0;  // the other job's folder, as it was; this job's own, empty, is gone
  for (const auto& e : std::filesystem::directory_iterator(base)) {
    if (!e.is_directory()) continue;
    ++kept;
    EXPECT_TRUE(std::filesystem::exists(e.path() / "coshard-flight-stale-rank0.json")) << e.path();
  }
  EXPECT_EQ(kept, 1u);
  std::filesystem::remove_all(base);
}

TEST(Launcher, MismatchedWorldSizeIsNamed) {
  auto r = run(kRun + " --nproc-per-node 2 -- " + kCheck + " --claim-world 3 --timeout-ms 20000");
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.output.find("world size mismatch: rank 1"), std::string::npos) << r.output;
  EXPECT_LT(r.seconds, 30);
}

// Rank 0 here is a store holding the claim that a rank of another build would have made.
TEST(Launcher, ARankOfAnotherBuildIsNamedAtTheRendezvous) {
  StoreAt store("wire");
  const std::string rank_1 = "RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=" + std::to_string(store.port()) +
                             " COSHARD_TOKEN=wire timeout 20 " + kCheck + " --timeout-ms 10000";
  auto join_as = [&](const std::string& rank_0s_claim) {
    store.ask("coshard/rendezvous/rank/1", std::nullopt, true);
    store.ask("coshard/rendezvous/rank/0", rank_0s_claim);
    return run(rank_1);
  };
  const ::Run older = join_as("2 node0 4242");  // "<world> <host> <pid>", as before protocol versions
  EXPECT_EQ(older.rc, 1) << older.output;
  EXPECT_NE(older.output.find("rank 0 (pid 4242 on node0) speaks coshard wire protocol 0 (a build from before "
                              "protocol versions), this rank speaks protocol 1: ranks of different builds misread each "
                              "other's messages. Start every rank from the same coshard build"),
            std::string::npos)
      << older.output;
  const ::Run newer = join_as("2 node0 4242 9");
  EXPECT_NE(newer.output.find("rank 0 (pid 4242 on node0) speaks coshard wire protocol 9, this rank speaks protocol 1"),
            std::string::npos)
      << newer.output;
  for (const ::Run* r : {&older, &newer}) EXPECT_LT(r->seconds, 5) << r->output;
}

// Runs `launch` (a coshard-run command line for bash's single quotes) in the background, sends it
// `signo` after `after`, and returns its output ending in "launcher exited <code>".
::Run run_and_signal(const std::string& launch, int signo, std::chrono::milliseconds after) {
  const std::string pidfile = ::testing::TempDir() + "/coshard-run-signal-" + std::to_string(signo) + ".pid";
  std::remove(pidfile.c_str());
  std::thread sender([&] {
    std::this_thread::sleep_for(after);
    std::FILE* f = std::fopen(pidfile.c_str(), "r");
    int pid = 0;
    if (f && std::fscanf(f, "%d", &pid) == 1 && pid > 0) ::kill(pid, signo);
    if (f) std::fclose(f);
  });
  auto r = run("bash -c '" + launch + " & echo $! > " + pidfile + "; wait $!; echo launcher exited $?'");
  sender.join();
  return r;
}

TEST(Launcher, SigtermIsForwardedAndTheLauncherExits) {
  auto r = run_and_signal(kRun + " --nproc-per-node 2 --grace 2 -- sleep 60", SIGTERM, std::chrono::milliseconds(500));
  EXPECT_LT(r.seconds, 10) << r.output;
  EXPECT_NE(r.output.find("passing it to the ranks"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("launcher exited 143"), std::string::npos) << r.output;
}

// A closed terminal or ssh session killed the launcher at once: the ranks died of PDEATHSIG with
// no grace and no flight records. Now it is SIGTERM's path, with SIGTERM for the ranks.
TEST(Launcher, SighupStopsTheRanksWithSigtermAndTheLauncherExits129) {
  auto r = run_and_signal(kRun + " --nproc-per-node 2 --grace 2 -- sh -c \"trap \\\"echo rank got TERM; exit 3\\\" TERM; "
                                 "echo rank up; while :; do sleep 0.1; done\"",
                          SIGHUP, std::chrono::milliseconds(800));
  EXPECT_LT(r.seconds, 10) << r.output;
  EXPECT_NE(r.output.find("coshard-run: got Hangup, passing SIGTERM to the ranks"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("rank got TERM"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("launcher exited 129"), std::string::npos) << r.output;
}

// A process a rank leaves behind held the rank's output open: the launcher waited for it without
// end after the job was over. Now it is stopped with its process group, and one that left the
// group (setsid) is no longer waited for.
TEST(Launcher, WhatARankLeavesBehindIsStoppedAndNotWaitedFor) {
  const auto left = run(kRun + " --nproc-per-node 1 --grace 1 -- sh -c \"sleep 30 & echo rank done\"");
  EXPECT_EQ(left.rc, 0) << left.output;
  EXPECT_LT(left.seconds, 10) << left.output;
  EXPECT_NE(left.output.find("[rank 0] rank done"), std::string::npos) << left.output;
  EXPECT_NE(left.output.find("rank 0 (pid"), std::string::npos) << left.output;
  EXPECT_NE(left.output.find("ended, but processes it started live on in its process group and hold its output; "
                             "sending them SIGTERM"),
            std::string::npos)
      << left.output;
  // One that ignores SIGTERM gets SIGKILL after --grace.
  const auto stubborn = run(kRun + " --nproc-per-node 1 --grace 1 -- sh -c \"sh -c 'trap \\\"\\\" TERM; sleep 30' & "
                                   "sleep 0.2; echo rank done\"");
  EXPECT_EQ(stubborn.rc, 0) << stubborn.output;
  EXPECT_LT(stubborn.seconds, 10) << stubborn.output;
  EXPECT_NE(stubborn.output.find("they did not end after SIGTERM: killing them"), std::string::npos) << stubborn.output;
  const std::string pid_file = ::testing::TempDir() + "/coshard-run-escaped-" + std::to_string(::getpid()) + ".pid";
  const auto escaped = run(kRun + " --nproc-per-node 1 --grace 1 -- sh -c \"setsid sleep 30 & echo \\$! > " + pid_file +
                           "; echo rank done\"");
  EXPECT_EQ(escaped.rc, 0) << escaped.output;
  EXPECT_LT(escaped.seconds, 10) << escaped.output;
  EXPECT_NE(escaped.output.find("rank 0's output is still held open by a process outside its process group (one that "
                                "called setsid); not waiting for it"),
            std::string::npos)
      << escaped.output;
  if (std::ifstream f(pid_file); f) {
    int pid = 0;
    if (f >> pid && pid > 0) ::kill(pid, SIGKILL);
  }
  std::remove(pid_file.c_str());
}

// `coshard-run ... | head` killed the launcher with SIGPIPE on the next line, and the ranks with it.
TEST(Launcher, AClosedStdoutDropsTheLinesAndTheJobGoesOn) {
  const auto r = run("bash -c '{ " + kRun + " --nproc-per-node 1 -- sh -c \"echo first; sleep 0.5; seq 1 20000; "
                     "echo rank finished >&2\"; echo launcher exited $? >&2; } | head -1'");
  EXPECT_NE(r.output.find("[rank 0] first"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("coshard-run: the ranks' stdout is a closed pipe (its reader ended); their lines to it are "
                          "dropped and the job goes on"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("[rank 0] rank finished"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("launcher exited 0"), std::string::npos) << r.output;
  // A closed stdout (>&-): the launcher's signalfd took its number, and the lines waited there.
  const auto closed = run("{ timeout 30 " + kRun + " --nproc-per-node 1 -- sh -c 'seq 1 1000000; echo rank finished "
                          ">&2' >&-; }");
  EXPECT_EQ(closed.rc, 0) << closed.output;
  EXPECT_NE(closed.output.find("[rank 0] rank finished"), std::string::npos) << closed.output;
}

// A reader that stops reading (a paused pager): the launcher's writes used to block its loop, so
// a rank's failure went unseen (and no heartbeat reached the other nodes) until the reader read
// again. Now the lines wait in a queue, the rank that fills it waits to write, and once the reader
// reads again it gets every line, whole and in order, stdout and stderr sharing the pipe (2>&1).
// Rank 0 writes the pid of its seq: the launcher stopping it shows while the reader still stalls.
TEST(Launcher, AReaderThatStopsReadingStopsNeitherTheLauncherNorItsLines) {
  const auto r = run("d=$(mktemp -d); mkfifo $d/fifo; "
                     "( read -r first; echo \"$first\"; while [ ! -e $d/go ]; do sleep 0.1; done; cat ) < $d/fifo "
                     "> $d/out & reader=$!; "
                     "timeout 120 " + kRun + " --nproc-per-node 2 -- sh -c 'if [ \"$LOCAL_RANK\" = 0 ]; then "
                     "seq 1 2000000 & echo $! > '$d'/seq; wait; else sleep 3; echo failing >&2; exit 3; fi' "
                     "> $d/fifo 2>&1 & launcher=$!; "
                     // Gone, or a zombie that PID 1 has yet to reap.
                     "gone() { s=$(awk '{ print $3 }' /proc/$(cat $d/seq)/stat 2>/dev/null); [ -z \"$s\" ] || "
                     "[ \"$s\" = Z ]; }; "
                     "for i in $(seq 300); do [ -s $d/seq ] && gone && break; sleep 0.1; done; "
                     "[ -s $d/seq ] && gone && echo stopped while the reader stalls; "
                     "touch $d/go; wait $launcher; echo launcher exited $?; wait $reader; "
                     "grep -v '^\\[rank 0\\] [0-9]*$' $d/out; "
                     // The last line may be cut where the rank was stopped.
                     "grep '^\\[rank 0\\] ' $d/out | awk '!bad && ($3 != NR || NF != 3) { bad = NR; what = $0; n = $3 } "
                     "END { if (bad && (bad != NR || index(NR, n) != 1)) print \"line \" bad \" is \" what; "
                     "print \"lines \" NR }'; rm -rf $d");
  EXPECT_NE(r.output.find("stopped while the reader stalls"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("launcher exited 3"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("\n[rank 1] failing\n"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("\ncoshard-run: rank 1 (pid "), std::string::npos) << r.output;
  // The orphaned seq's zombie, which PID 1 may reap late, is nothing left behind.
  EXPECT_EQ(r.output.find("live on"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("line "), std::string::npos) << r.output;  // a line dropped, cut or out of order
  const auto at = r.output.find("lines ");
  ASSERT_NE(at, std::string::npos) << r.output;
  // Far more than the pipes hold (64 KiB each, some 8,000 lines): the queue kept them.
  EXPECT_GT(std::stol(r.output.substr(at + 6)), 100000) << r.output;
}

// A file that exec cannot run is named with the reason, once, not restarted as a failed rank.
TEST(Launcher, AProgramExecCannotRunIsNamedWithTheReason) {
  const std::string file = ::testing::TempDir() + "/coshard-run-noexec-" + std::to_string(::getpid());
  run("printf 'echo hi\\n' > " + file + " && chmod +x " + file);
  const auto r = run(kRun + " --nproc-per-node 2 --max-restarts 3 -- " + file);
  EXPECT_EQ(r.rc, 127) << r.output;
  EXPECT_NE(r.output.find("the job failed (exit code 127): node 0: coshard-run on "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("cannot start '" + file + "': Exec format error"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("restart 1"), std::string::npos) << r.output;
  const auto dir = run(kRun + " --nproc-per-node 1 -- " + ::testing::TempDir());
  EXPECT_EQ(dir.rc, 127) << dir.output;
  EXPECT_NE(dir.output.find("it is a directory"), std::string::npos) << dir.output;
  std::remove(file.c_str());
}

// Ranks run in background process groups: a read from the terminal stopped one (SIGTTIN) and the
// job hung without a word. Their stdin is /dev/null.
TEST(Launcher, RanksReadDevNullAsStdin) {
  auto r = run("echo typed | " + kRun + " --nproc-per-node 1 -- sh -c 'echo stdin is $(readlink /proc/self/fd/0)'");
  EXPECT_EQ(r.rc, 0) << r.output;
  EXPECT_NE(r.output.find("stdin is /dev/null"), std::string::npos) << r.output;
}

// What each bad flag says is tests/tools/options_test.cpp's, in process; here the launcher's answer
// to one: the message, and exit code 2 (0 and the usage for --help).
TEST(Launcher, BadFlagsAreUsageErrors) {
  auto r = run(kRun + " --nproc-per-node zero -- true");
  EXPECT_EQ(r.rc, 2);
  EXPECT_NE(r.output.find("coshard-run: --nproc-per-node needs an integer in [1, 1024], got 'zero' (coshard-run "
                          "--help shows the usage)"),
            std::string::npos)
      << r.output;
  r = run(kRun + " --help");
  EXPECT_EQ(r.rc, 0);
  EXPECT_NE(r.output.find("Usage: coshard-run [OPTIONS] -- PROGRAM [ARGS...]"), std::string::npos) << r.output;
}

TEST(Launcher, AMissingProgramIsNamed) {
  auto r = run(kRun + " --nproc-per-node 2 -- /nonexistent/trainer");
  EXPECT_EQ(r.rc, 127) << r.output;
  EXPECT_NE(r.output.find("cannot start '/nonexistent/trainer'"), std::string::npos) << r.output;
}

TEST(Launcher, AnUnreachableMasterFailsWithinTheDeadline) {
  // Rank 1 of 2 whose store never comes up.
  auto r = run("env RANK=1 WORLD_SIZE=2 LOCAL_RANK=1 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=9 "
               "COSHARD_STORE_HOSTED=1 " + kCheck + " --timeout-ms 500");
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.output.find("cannot reach the rendezvous store at 127.0.0.1:9"), std::string::npos) << r.output;
  EXPECT_LT(r.seconds, 10);
}

TEST(Launcher, APortInUseIsNamed) {
  auto first = run(kRun + " --nproc-per-node 1 --master 127.0.0.1:0 -- true");
  EXPECT_EQ(first.rc, 0) << first.output;
  // Occupy a port with a launcher whose rank sleeps, then ask a second launcher for it.
  std::string pidfile = ::testing::TempDir() + "/coshard-run-port.out";
  auto r = run("bash -c '" + kRun + " --nproc-per-node 1 -- sleep 5 2>" + pidfile +
               " & sleep 0.5; port=$(sed -n \"s/.*store at 127.0.0.1:\\([0-9]*\\)/\\1/p\" " + pidfile +
               "); " + kRun + " --nproc-per-node 1 --master 127.0.0.1:$port -- true; rc=$?; kill %1; exit $rc'");
  EXPECT_NE(r.rc, 0) << r.output;
  EXPECT_NE(r.output.find("cannot listen on 127.0.0.1:"), std::string::npos) << r.output;
}

// Rank 3 (on node 1) fails in the first attempt; the other ranks would sleep for a minute.
const std::string kFailsOnceOnNode1 =
    "echo attempt $COSHARD_RESTART_COUNT rank $RANK after $COSHARD_RESTART_EXIT_CODE from $COSHARD_RESTART_FAILED_RANK\n"
    "if [ $COSHARD_RESTART_COUNT = 0 ]; then if [ $RANK = 3 ]; then sleep 1; exit 5; fi; sleep 60; fi\n";

TEST(LauncherNodes, AFailureOnOneNodeStopsAndRestartsEveryNode) {
  auto r = two_nodes("restart", kFailsOnceOnNode1, "--max-restarts 2 --grace 3");
  for (const auto& node : r.node) {
    EXPECT_EQ(node.rc, 0) << node.output;
    EXPECT_NE(node.output.find("restart 1 of 2: node 1: rank 3 (pid"), std::string::npos) << node.output;
    EXPECT_NE(node.output.find("exited with status 5; starting every rank again"), std::string::npos) << node.output;
    EXPECT_EQ(node.output.find("restart 2 of 2"), std::string::npos) << node.output;
    EXPECT_LT(node.seconds, 30) << node.output;  // node 0's sleeping ranks were stopped, not waited for
  }
  EXPECT_NE(r.node[0].output.find("coshard-run: node 1 failed: rank 3"), std::string::npos) << r.node[0].output;
  EXPECT_NE(r.node[0].output.find("stopping the local ranks"), std::string::npos) << r.node[0].output;
  EXPECT_NE(r.node[0].output.find("[rank 0] attempt 0 rank 0 after 0 from -1"), std::string::npos) << r.node[0].output;
  // The restarted ranks know which rank failed and how (the trainer exports it as metrics).
  EXPECT_NE(r.node[0].output.find("[rank 0] attempt 1 rank 0 after 5 from 3"), std::string::npos) << r.node[0].output;
  EXPECT_NE(r.node[1].output.find("[rank 3] attempt 1 rank 3 after 5 from 3"), std::string::npos) << r.node[1].output;
}

TEST(LauncherNodes, WhenRestartsRunOutEveryNodeExitsWithTheFailure) {
  const std::string always = "if [ $RANK = 3 ]; then sleep 1; exit 5; fi; sleep 60\n";
  auto r = two_nodes("give-up", always, "--max-restarts 1 --grace 3");
  for (const auto& node : r.node) {
    EXPECT_EQ(node.rc, 5) << node.output;
    EXPECT_NE(node.output.find("restart 1 of 1"), std::string::npos) << node.output;
    EXPECT_NE(node.output.find("the job failed (exit code 5): node 1: rank 3 (pid"), std::string::npos) << node.output;
    EXPECT_NE(node.output.find("no restarts left (--max-restarts 1)"), std::string::npos) << node.output;
    EXPECT_LT(node.seconds, 40) << node.output;
  }
}

TEST(LauncherNodes, AnInterruptedNodeEndsTheJobWithoutARestart) {
  const std::string file = ::testing::TempDir() + "/coshard-run-interrupt.pids";
  std::remove(file.c_str());
  auto r = two_nodes("interrupt", "echo $PPID >> " + file + "; sleep 60\n", "--max-restarts 3 --grace 3", [&] {
    // The launcher of rank 2 or 3 (node 1): the parent of its rank's shell.
    for (int i = 0; i < 200; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      auto pids = run("cat " + file + " 2>/dev/null").output;
      for (std::size_t at = 0; at < pids.size();) {
        const auto nl = pids.find('\n', at);
        const int pid = std::atoi(pids.substr(at, nl - at).c_str());
        if (run("tr '\\0' ' ' < /proc/" + std::to_string(pid) + "/cmdline").output.find("--node-rank 1") !=
            std::string::npos) {
          ::kill(pid, SIGTERM);
          return;
        }
        at = nl == std::string::npos ? pids.size() : nl + 1;
      }
    }
  });
  EXPECT_EQ(r.node[1].rc, 128 + SIGTERM) << r.node[1].output;
  EXPECT_EQ(r.node[0].rc, 128 + SIGTERM) << r.node[0].output;
  for (const auto& node : r.node) {
    EXPECT_EQ(node.output.find("restart 1"), std::string::npos) << node.output;
    EXPECT_NE(node.output.find("got Terminated"), std::string::npos) << node.output;
    EXPECT_LT(node.seconds, 30) << node.output;
  }
}

// Node 1's ranks ignore SIGTERM, so its launcher takes --grace 8 s to stop them after rank 1 on
// node 0 failed: it keeps beating meanwhile, and node 0 waits for it and restarts both nodes
// instead of taking it for lost after --silence-timeout 4 s.
TEST(LauncherNodes, ANodeSlowToStopItsRanksIsWaitedForNotTakenForLost) {
  const std::string script =
      "if [ $RANK -ge 2 ]; then trap '' TERM; fi\n"
      "if [ $COSHARD_RESTART_COUNT = 0 ]; then if [ $RANK = 1 ]; then sleep 1; exit 5; fi; sleep 60; fi\n";
  auto r = two_nodes("slow-stop", script, "--max-restarts 1 --grace 8 --silence-timeout 4");
  for (const auto& node : r.node) {
    EXPECT_EQ(node.rc, 0) << node.output;
    EXPECT_NE(node.output.find("restart 1 of 1: node 0: rank 1 (pid"), std::string::npos) << node.output;
  }
  EXPECT_NE(r.node[1].output.find("did not stop within 8 s; killing it"), std::string::npos) << r.node[1].output;
}

// A launcher killed outright (its host crashed) while its ranks, like node 0's, would sleep on
// without noticing: node 0 finds it silent, stops its own ranks, waits --rejoin-timeout for it to
// come back (it might only be cut off), and ends the job, not restarting it without that node.
TEST(LauncherNodes, ANodeThatFallsSilentEndsTheJobOnTheOthers) {
  const std::string started = rank_log("silent");
  auto r = two_nodes("silent", "echo $RANK >> " + started + "; sleep 120\n",
                     "--max-restarts 2 --grace 3 --rejoin-timeout 5 --silence-timeout 4", [&] {
    await_node_1_ranks(started);
    const int pid = launcher_pid("silent", 1);
    ASSERT_GT(pid, 0) << "node 1's launcher not found";
    ::kill(pid, SIGKILL);
  });
  EXPECT_EQ(r.node[1].rc, 128 + SIGKILL) << r.node[1].output;
  EXPECT_EQ(r.node[0].rc, 1) << r.node[0].output;
  EXPECT_NE(r.node[0].output.find("coshard-run: node 1 failed: its coshard-run fell silent 4 s ago"), std::string::npos)
      << r.node[0].output;
  EXPECT_NE(r.node[0].output.find("node 1 fell silent; waiting up to 5 s (--rejoin-timeout) for it to come back"),
            std::string::npos) << r.node[0].output;
  EXPECT_NE(r.node[0].output.find("not restarted"), std::string::npos) << r.node[0].output;
  EXPECT_EQ(r.node[0].output.find("restart 1"), std::string::npos) << r.node[0].output;
  EXPECT_LT(r.node[0].seconds, 40) << r.node[0].output;
}

// Node 1's launcher killed outright while its ranks, like node 0's, would sleep on: its host
// crashed. Started again (the host is back), it waits --silence-timeout (4 s) for the old one to
// beat, takes its place, and both nodes restart: the second attempt's ranks end at once.
TEST(LauncherNodes, ALauncherStartedAgainAfterItsHostCrashedTakesItsPlace) {
  const std::string started = rank_log("back");
  const std::string script = "echo $RANK >> " + started + "; if [ $COSHARD_RESTART_COUNT = 0 ]; then sleep 120; fi\n";
  std::vector<std::string> command;
  coshard::testing::CommandResult again;
  auto r = two_nodes("back", script, "--max-restarts 1 --grace 3 --silence-timeout 4", [&] {
    await_node_1_ranks(started);
    const int pid = launcher_pid("back", 1);
    ASSERT_GT(pid, 0) << "node 1's launcher not found";
    ::kill(pid, SIGKILL);
    std::this_thread::sleep_for(std::chrono::seconds(1));
    again = run(command.at(1));
  }, &command);
  EXPECT_EQ(r.node[1].rc, 128 + SIGKILL) << r.node[1].output;
  EXPECT_EQ(r.node[0].rc, 0) << r.node[0].output;
  EXPECT_EQ(again.rc, 0) << again.output;
  EXPECT_NE(again.output.find("coshard-run: node rank 1 is held by coshard-run pid"), std::string::npos) << again.output;
  EXPECT_NE(again.output.find("took its place; attempt 0 ends so that every node restarts, taking node 1 in"), std::string::npos)
      << again.output;
  for (const auto& out : {r.node[0].output, again.output}) {
    EXPECT_NE(out.find("restart 1 of 1: node "), std::string::npos) << out;
  }
  EXPECT_LT(r.node[0].seconds, 60) << r.node[0].output;
}

// Node 0's launcher, which serves the store, frozen (SIGSTOP) for 6 s while every rank runs on: a
// store outage, as node 1 sees a cut link to node 0. Node 1's store calls time out (after 4 s, a
// third of --silence-timeout 12); its launcher keeps trying instead of stopping its ranks, reaches
// the store once node 0 runs again, and the job ends as if nothing happened. With restarts left it
// tries for --rejoin-timeout; with none, until node 0 would end the job, 12 s after node 1's last
// beat (it used to give up at once).
void ride_out_a_store_outage(const std::string& name, const std::string& restarts, const std::string& window) {
  const std::string started = rank_log(name);
  auto r = two_nodes(name, "echo $RANK >> " + started + "; sleep 16\n",
                     "--max-restarts " + restarts + " --grace 3 --silence-timeout 12", [&] {
    await_node_1_ranks(started);
    const int pid = launcher_pid(name, 0);
    ASSERT_GT(pid, 0) << "node 0's launcher not found";
    freeze(pid, std::chrono::seconds(6));
  });
  for (const auto& node : r.node) {
    EXPECT_EQ(node.rc, 0) << node.output;
    EXPECT_EQ(node.output.find("restart 1"), std::string::npos) << node.output;
  }
  EXPECT_NE(r.node[1].output.find("coshard-run: the store at 127.0.0.1:"), std::string::npos) << r.node[1].output;
  EXPECT_NE(r.node[1].output.find("stopped answering"), std::string::npos) << r.node[1].output;
  EXPECT_NE(r.node[1].output.find("trying to reach it again for " + window), std::string::npos) << r.node[1].output;
  EXPECT_NE(r.node[1].output.find(" again after "), std::string::npos) << r.node[1].output;
}

TEST(LauncherNodes, AStoreOutageShorterThanTheRejoinTimeoutIsRiddenOut) {
  ride_out_a_store_outage("outage", "1", "60 s (--rejoin-timeout)");
}

TEST(LauncherNodes, AStoreOutageWithNoRestartLeftIsRiddenOutIfNodeZeroWouldWaitForIt) {
  ride_out_a_store_outage("outage-last", "0", "8 s (no restart left: node 0 ends the job once a node is silent for 12 s)");
}

// Both launchers frozen (a paused VM), node 0's for 10 s and thawed 3 s before node 1's: node 0 did
// not watch node 1 while it stood still itself, so it gives node 1 a fresh --silence-timeout (8 s)
// rather than take the 14.5 s without a beat for silence (it restarted the job).
TEST(LauncherNodes, ALauncherThatStoodStillJudgesTheOthersSilenceAfresh) {
  const std::string started = rank_log("paused");
  auto r = two_nodes("paused", "echo $RANK >> " + started + "; sleep 20\n",
                     "--max-restarts 1 --grace 3 --silence-timeout 8", [&] {
    await_node_1_ranks(started);
    const int zero = launcher_pid("paused", 0), one = launcher_pid("paused", 1);
    ASSERT_GT(zero, 0) << "node 0's launcher not found";
    ASSERT_GT(one, 0) << "node 1's launcher not found";
    // Node 1 first, so that node 0 reads its last count (once a second) before it stops too.
    ::kill(one, SIGSTOP);
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    ::kill(zero, SIGSTOP);
    std::this_thread::sleep_for(std::chrono::seconds(10));
    ::kill(zero, SIGCONT);
    std::this_thread::sleep_for(std::chrono::seconds(3));
    ::kill(one, SIGCONT);
  });
  for (const auto& node : r.node) {
    EXPECT_EQ(node.rc, 0) << node.output;
    EXPECT_EQ(node.output.find("restart 1"), std::string::npos) << node.output;
    EXPECT_EQ(node.output.find("fell silent"), std::string::npos) << node.output;
  }
}

// Node 1's launcher starts late, after node 0's ranks gave up their 3 s rendezvous. Without a
// restart node 0 ends naming the ranks that never came (and node 1 then finds no store); with one,
// node 1 (6 s late) joins the attempt that node 0 runs by then, and the job completes.
TEST(LauncherNodes, ANodeThatJoinsAfterTheRendezvousDeadlineIsNamedOrJoinsTheNextAttempt) {
  for (const int restarts : {0, 1}) {
    const std::string master = "--master 127.0.0.1:" + std::to_string(free_loopback_port()) + " --token late" +
                               std::to_string(restarts) + " --max-restarts " + std::to_string(restarts) + " --join-timeout 5 ";
    // 3 s to meet in the first attempt, 30 s in the next (sanitizer builds start slowly).
    const std::string ranks = " --nnodes 2 --nproc-per-node 2 " + master + "-- sh -c 'exec " + kCheck +
                              " --timeout-ms $(( COSHARD_RESTART_COUNT == 0 ? 3000 : 30000 ))'";
    ::Run node0, node1;
    std::thread first([&] { node0 = run(kRun + " --node-rank 0" + ranks); });
    if (restarts == 0) {
      first.join();  // node 0 and its store are gone before node 1 comes
    } else {
      std::this_thread::sleep_for(std::chrono::seconds(6));
    }
    node1 = run(kRun + " --node-rank 1" + ranks);
    if (first.joinable()) first.join();
    if (restarts == 0) {
      EXPECT_NE(node0.rc, 0) << node0.output;
      EXPECT_NE(node0.output.find("rendezvous of 4 ranks did not complete"), std::string::npos) << node0.output;
      EXPECT_NE(node0.output.find("coshard/attempt/0/coshard/rendezvous/rank/2"), std::string::npos) << node0.output;
      // Its launcher names the node behind those ranks, and what to do.
      EXPECT_NE(node0.output.find("node(s) 1 never joined the job (no coshard-run holds their node rank): start "
                                  "coshard-run on each with its --node-rank and --master 127.0.0.1:"),
                std::string::npos)
          << node0.output;
      EXPECT_NE(node1.rc, 0) << node1.output;  // node 0 and its store are gone
      EXPECT_NE(node1.output.find("node 1 cannot join the job"), std::string::npos) << node1.output;
      EXPECT_NE(node1.output.find("if it ran already, it gave up waiting for this node"), std::string::npos)
          << node1.output;
    } else {
      EXPECT_EQ(node0.rc, 0) << node0.output;
      EXPECT_EQ(node1.rc, 0) << node1.output;
      EXPECT_NE(node0.output.find("restart 1 of 1"), std::string::npos) << node0.output;
      EXPECT_NE(node1.output.find("[rank 3] rank 3 ok world 4"), std::string::npos) << node1.output;
    }
  }
}

TEST(LauncherNodes, ANodeRankTakenTwiceOrFlagsThatDifferAreNamed) {
  ::Run twin, other_size, other_restarts, other_min;
  auto r = two_nodes("twice", "sleep 4\n", "--max-restarts 1", [&] {
    std::this_thread::sleep_for(std::chrono::seconds(1));
    // Find the job's --master from node 0's command line, and join it wrongly three times.
    auto ps = run("ps -eo args | grep -- '--token twice' | grep -- '--node-rank 0' | grep -v grep | head -1").output;
    const auto at = ps.find("--master ");
    ASSERT_NE(at, std::string::npos) << ps;
    const std::string master = ps.substr(at, ps.find(' ', at + 9) - at);
    const std::string join = kRun + " --nnodes 2 --node-rank 1 " + master + " --token twice --join-timeout 5 ";
    twin = run(join + "--nproc-per-node 2 --max-restarts 1 -- true");
    other_size = run(join + "--nproc-per-node 3 --max-restarts 1 -- true");
    other_restarts = run(join + "--nproc-per-node 2 --max-restarts 0 -- true");
    other_min = run(join + "--nproc-per-node 2 --max-restarts 1 --nnodes 1:2 -- true");
  });
  EXPECT_EQ(r.node[0].rc, 0) << r.node[0].output;
  // Which of node 1's two launchers claimed it first is a race: one runs the job, the other is refused.
  const bool twin_won = twin.rc == 0;
  const ::Run& refused = twin_won ? r.node[1] : twin;
  EXPECT_EQ((twin_won ? twin : r.node[1]).rc, 0) << (twin_won ? twin : r.node[1]).output;
  EXPECT_NE(refused.output.find("node rank 1 was started twice: coshard-run pid"), std::string::npos) << refused.output;
  EXPECT_NE(refused.output.find("Give every node its own --node-rank"), std::string::npos) << refused.output;
  // Flags are checked before the claim, so these are refused for their flags.
  EXPECT_NE(other_size.rc, 0) << other_size.output;
  EXPECT_NE(other_size.output.find("--nproc-per-node is 3 on node 1 but 2 on node 0 (coshard-run pid"),
            std::string::npos)
      << other_size.output;
  EXPECT_NE(other_restarts.rc, 0) << other_restarts.output;
  EXPECT_NE(other_restarts.output.find("give every node the same --max-restarts"), std::string::npos)
      << other_restarts.output;
  // Node 0's own output says which launcher it refused and why (its job runs on meanwhile).
  EXPECT_NE(r.node[0].output.find(") was refused: --nproc-per-node is 3 on node 1 but 2 on node 0"), std::string::npos)
      << r.node[0].output;
  EXPECT_NE(other_min.rc, 0) << other_min.output;
  EXPECT_NE(other_min.output.find("--nnodes MIN (of MIN:MAX) is 1 on node 1 but 2 on node 0"), std::string::npos)
      << other_min.output;
}

// Node 0 here is a store holding the claim that a launcher of another build would have made.
TEST(LauncherNodes, ALauncherOfAnotherBuildNodeCountOrTakeInTimeoutIsRefusedAtTheJoin) {
  StoreAt store("builds");
  auto ask = [&](std::string key, std::optional<std::string> value) {
    return store.ask("coshard/launch/" + key, std::move(value));
  };
  const std::string port = std::to_string(store.port());
  // No launcher beats for this node 0: one that got past the check would wait for it, bounded here.
  const std::string join = "timeout 20 " + kRun + " --node-rank 1 --master 127.0.0.1:" + port +
                           " --token builds --join-timeout 5 --nproc-per-node 2 --max-restarts 1 ";
  auto join_as = [&](const std::string& node_zeros_claim, const std::string& flags) {
    ask("node/0", node_zeros_claim);
    return run(join + flags + " -- true");
  };
  // "<nproc> <max restarts> <min nodes> <host> <pid>", as before protocol versions.
  const ::Run older = join_as("2 1 2 node0 4242", "--nnodes 2");
  EXPECT_EQ(older.rc, 1) << older.output;
  EXPECT_NE(older.output.find("node 0's launcher (coshard-run pid 4242 on node0) speaks launcher protocol 0 (a build "
                              "from before protocol versions), node 1's protocol 5"),
            std::string::npos)
      << older.output;
  EXPECT_NE(older.output.find("Start every node's coshard-run from the same coshard build"), std::string::npos)
      << older.output;
  const ::Run newer = join_as("2 1 2 node0 4242 6 300 2 15", "--nnodes 2");
  EXPECT_NE(newer.output.find("speaks launcher protocol 6, node 1's protocol 5"), std::string::npos) << newer.output;
  const ::Run take_in = join_as("2 1 1 node0 4242 5 300 2 15", "--nnodes 1:2 --take-in-timeout 60");
  const ::Run nodes = join_as("2 1 2 node0 4242 5 300 2 15", "--nnodes 3");

  EXPECT_NE(take_in.output.find("--take-in-timeout is 60 on node 1 but 300 on node 0 (coshard-run pid 4242 on "
                                "node0): give every node the same --take-in-timeout"),
            std::string::npos)
      << take_in.output;
  // Refused before it claimed its node rank.
  EXPECT_FALSE(ask("node/1", std::nullopt).has_value());
  EXPECT_NE(nodes.output.find("--nnodes N (MAX of MIN:MAX) is 3 on node 1 but 2 on node 0 (coshard-run pid 4242 on "
                              "node0): give every node the same --nnodes N (MAX of MIN:MAX)"),
            std::string::npos)
      << nodes.output;
  for (const ::Run* r : {&older, &newer, &take_in, &nodes}) EXPECT_LT(r->seconds, 5) << r->output;
}

// A launcher of a build from before protocol versions checks nothing when it joins: node 0 finds
// its claim (written here as that build writes it) of another protocol, before the job starts
// (--nnodes 1:2, gathering) and while it runs (--nnodes 2).
TEST(LauncherNodes, NodeZeroRefusesANodeOfAnotherLauncherProtocol) {
  for (const std::string nodes : {"--nnodes 2", "--nnodes 1:2 --max-restarts 1 --last-call 20"}) {
    const auto port = coshard::testing::free_loopback_port();
    ::Run zero;
    std::thread node_0([&] {
      zero = run(kRun + " " + nodes + " --node-rank 0 --nproc-per-node 1 --master 127.0.0.1:" + std::to_string(port) +
                 " --token foreign --join-timeout 3 -- sleep 30");
    });
    try {
      store_ask(port, "foreign", "coshard/launch/node/1",
                "1 " + std::string(nodes == "--nnodes 2" ? "0 2" : "1 1") + " node1 4242");
    } catch (const std::exception& e) {
      ADD_FAILURE() << "cannot write node 1's claim into node 0's store: " << e.what();  // node 0 ends at --join-timeout
    }
    node_0.join();
    EXPECT_EQ(zero.rc, 1) << nodes << "\n" << zero.output;
    EXPECT_NE(zero.output.find("node 1's launcher (coshard-run pid 4242 on node1) speaks launcher protocol 0 (a build "
                               "from before protocol versions), node 0's protocol 5"),
              std::string::npos)
        << nodes << "\n" << zero.output;
    EXPECT_LT(zero.seconds, 15) << nodes << "\n" << zero.output;
  }
}

// Node 1, started with `flags`, exits 1 within 10 s with output holding every one of `needles`.
void expect_node_1_cannot_join(const std::string& flags, const std::vector<std::string>& needles) {
  auto r = run(kRun + " --nnodes 2 --node-rank 1 --nproc-per-node 1 " + flags + " -- true");
  EXPECT_EQ(r.rc, 1) << r.output;
  EXPECT_LT(r.seconds, 10) << r.output;
  for (const auto& needle : needles) EXPECT_NE(r.output.find(needle), std::string::npos) << needle << "\n" << r.output;
}

TEST(LauncherNodes, ANodeWhoseMasterNeverAnswersGivesUpAtTheJoinTimeout) {
  expect_node_1_cannot_join("--master 127.0.0.1:9 --token t --join-timeout 2",
                            {"node 1 cannot join the job: cannot reach the rendezvous store at 127.0.0.1:9 within 2 s",
                             "start it with --master 127.0.0.1:9"});
}

// A node with another --token was told to fix its ranks' COSHARD_TOKEN.
TEST(LauncherNodes, ANodeWithAnotherTokenIsToldToGiveEveryNodeTheSameToken) {
  StoreAt store("right");
  const std::string at = "127.0.0.1:" + std::to_string(store.port());
  expect_node_1_cannot_join("--master " + at + " --token wrong --join-timeout 60",
                            {"node 1 cannot join the job: the rendezvous store at " + at + " rejected this client's token",
                             "every node's coshard-run the same --token"});
}

// A typo in --master was retried as a store that does not answer, for the whole --join-timeout,
// and named only as a timeout.
TEST(LauncherNodes, AMasterWhoseNameDoesNotResolveIsNamedAsSuch) {
  // Retried for a minute at most (a name not published yet): here --join-timeout ends it first.
  expect_node_1_cannot_join("--master no-such-host.invalid:29500 --token t --join-timeout 3",
                            {"node 1 cannot join the job: cannot resolve the rendezvous store's host "
                             "'no-such-host.invalid'",
                             "Check MASTER_ADDR (coshard-run's --master) for a typo"});
}


// SIGUSR2 that reaches the ranks but not their launcher (`kill -USR2` of the ranks themselves): they
// stop after a checkpoint with 75, which ends the job as a stop request, with 75 and not restarted,
// although no launcher was asked.
TEST(Launcher, RanksStoppedOnRequestBehindTheLaunchersBackEndTheJobWith75) {
  const std::string log = ::testing::TempDir() + "/coshard-run-ranks-usr2.log";
  std::remove(log.c_str());
  const std::string file = ::testing::TempDir() + "/coshard-run-ranks-usr2.sh";
  std::ofstream(file) << "trap 'exit 75' USR2\ntouch \"$COSHARD_FLIGHT_DIR/coshard-sigusr2-$$\"\necho $$ >> " << log
                      << "\nwhile true; do sleep 0.1; done\n";
  coshard::testing::CommandResult r;
  std::thread job([&] { r = run(kRun + " --nproc-per-node 2 --max-restarts 1 --grace 3 -- sh " + file); });
  std::string pids;
  for (int i = 0; i < 300 && std::count(pids.begin(), pids.end(), '\n') < 2; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    pids = run("cat " + log + " 2>/dev/null").output;
  }
  const bool both = std::count(pids.begin(), pids.end(), '\n') == 2;
  if (both) {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));  // the launcher polls the markers every 200 ms
    run("kill -USR2 $(cat " + log + ")");
  } else {  // ends the job rather than leave it running
    run("pkill -TERM -f '^[^ ]*coshard-run --nproc-per-node 2 --max-restarts 1 --grace 3 -- sh " + file + "'");
  }
  job.join();
  ASSERT_TRUE(both) << "the ranks did not start within 15 s: " << r.output;
  EXPECT_EQ(r.rc, 75) << r.output;
  EXPECT_NE(r.output.find("coshard-run: the job stopped (exit code 75): the ranks stopped on request (SIGUSR2)"),
            std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("restart 1"), std::string::npos) << r.output;
}

// Exit code 75 means "stopped on request" only from a rank that takes SIGUSR2 (a StopSignal's
// marker); from any other program it is a failure like any other, and restarted.
TEST(Launcher, AnExit75FromARankThatDoesNotTakeSigusr2IsAFailure) {
  const std::string file = ::testing::TempDir() + "/coshard-run-exit75.sh";
  std::ofstream(file) << "if [ $COSHARD_RESTART_COUNT = 0 ]; then if [ $RANK = 1 ]; then exit 75; fi; sleep 60; fi\n";
  auto r = run(kRun + " --nproc-per-node 2 --max-restarts 1 --grace 3 -- sh " + file);
  EXPECT_EQ(r.rc, 0) << r.output;
  EXPECT_NE(r.output.find("rank 1 (pid"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("exited with status 75; stopping the other ranks"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("restart 1 of 1"), std::string::npos) << r.output;
  EXPECT_LT(r.seconds, 30) << r.output;
  auto last = run(kRun + " --nproc-per-node 2 --grace 3 -- sh " + file);  // no restarts: the job fails with it
  EXPECT_EQ(last.rc, 75) << last.output;
  EXPECT_NE(last.output.find("coshard-run: the job failed (exit code 75): node 0: rank 1 (pid"), std::string::npos)
      << last.output;
}

// SIGUSR2 to node 1's launcher, whose ranks take it (a marker and a trap, as a StopSignal would)
// but fail while stopping (exit 5, as a save that fails would): with restarts left, nothing is
// restarted, since the allocation is ending, and every launcher exits 75 naming the failure.
TEST(LauncherNodes, AFailureAfterAStopRequestEndsTheJobWithoutARestart) {
  const std::string started = rank_log("stop-fail");
  const std::string script = "[ $COSHARD_RESTART_COUNT = 0 ] || exit 0\ntrap 'exit 5' USR2\n"
                             "touch \"$COSHARD_FLIGHT_DIR/coshard-sigusr2-$$\"\necho $RANK >> " + started +
                             "\nwhile true; do sleep 0.1; done\n";
  auto r = two_nodes("stop-fail", script, "--max-restarts 2 --grace 3", [&] {
    await_node_1_ranks(started);
    const int pid = launcher_pid("stop-fail", 1);
    ASSERT_GT(pid, 0) << "node 1's launcher not found";
    ::kill(pid, SIGUSR2);
  });
  for (const auto& node : r.node) {
    EXPECT_EQ(node.rc, 75) << node.output;
    EXPECT_NE(node.output.find("exited with status 5; not restarted: a stop was requested (SIGUSR2)"),
              std::string::npos) << node.output;
    EXPECT_EQ(node.output.find("restart 1"), std::string::npos) << node.output;
    EXPECT_LT(node.seconds, 30) << node.output;
  }
  EXPECT_NE(r.node[1].output.find("coshard-run: got User defined signal 2, passing it to the ranks"), std::string::npos)
      << r.node[1].output;
}

}  // namespace
