#pragma once
// Two launchers of one job on this host: the multi-node protocol of coshard-run on loopback, for
// the launcher tests (launcher_test.cpp, launcher_elastic_test.cpp).
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "support/loopback.hpp"
#include "support/run_command.hpp"

namespace coshard::testing {

inline CommandResult run(const std::string& cmd) { return run_command(cmd); }

inline const std::string kRun = COSHARD_RUN_BIN;
inline const std::string kCheck = RENDEZVOUS_CHECK_BIN;

// Two launchers of one job on this host (nodes 0 and 1 of --nnodes 2, each with 2 ranks of
// `script`, a shell script): the multi-node protocol on loopback. `during` runs while they do;
// `command`, when given, is set to the command line of node `n`'s launcher before it starts. With
// `node_1_later` only node 0 is started: `during` starts node 1 from `command` when it will.
struct TwoNodes {
  CommandResult node[2];
};

inline TwoNodes two_nodes(const std::string& name, const std::string& script, const std::string& flags,
                          const std::function<void()>& during = {}, std::vector<std::string>* command = nullptr,
                          bool node_1_later = false) {
  const std::string file = ::testing::TempDir() + "/coshard-run-" + name + ".sh";
  std::ofstream(file) << script;
  const std::string master = "--master 127.0.0.1:" + std::to_string(free_loopback_port()) + " --token " + name;
  std::vector<std::string> lines;
  for (int n = 0; n < 2; ++n) {
    lines.push_back(kRun + " --nnodes 2 --node-rank " + std::to_string(n) + " --nproc-per-node 2 " + master + " " + flags +
                    " -- sh " + file);
  }
  if (command) *command = lines;
  TwoNodes out;
  std::thread nodes[2];
  for (int n = 0; n < (node_1_later ? 1 : 2); ++n) {
    nodes[n] = std::thread([&, n] { out.node[n] = run(lines[static_cast<std::size_t>(n)]); });
  }
  if (during) during();
  for (auto& t : nodes) {
    if (t.joinable()) t.join();
  }
  return out;
}

// A file the ranks of a two_nodes script append their RANK to ("echo $RANK >> FILE"), emptied.
inline std::string rank_log(const std::string& name) {
  const std::string path = ::testing::TempDir() + "/coshard-run-" + name + ".started";
  std::remove(path.c_str());
  return path;
}

// Waits up to `seconds` for `text` in the file `log`; whether it came.
inline bool await_line(const std::string& log, const std::string& text, int seconds = 60) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  while (run("cat " + log + " 2>/dev/null").output.find(text) == std::string::npos) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return true;
}

// Waits up to 30 s for rank 2 to write to `rank_log`: node 1's ranks run, and its launcher has
// joined and beaten by then.
inline void await_node_1_ranks(const std::string& log) { await_line(log, "2", 30); }

// The pid of the launcher of node `node` in the job of token `token`, or 0.
inline int launcher_pid(const std::string& token, int node) {
  // Anchored on the program, so that the shell which runs it (sh -c 'coshard-run ...') is not it.
  auto ps = run("pgrep -f '^[^ ]*coshard-run --nnodes 2 --node-rank " + std::to_string(node) + " .*--token " + token +
                " ' | head -1");
  return std::atoi(ps.output.c_str());
}

// Freezes a process (SIGSTOP) for `how_long`, as a paused VM or a cut link would, then lets it run on.
inline void freeze(int pid, std::chrono::milliseconds how_long) {
  ::kill(pid, SIGSTOP);
  std::this_thread::sleep_for(how_long);
  ::kill(pid, SIGCONT);
}

}  // namespace coshard::testing
