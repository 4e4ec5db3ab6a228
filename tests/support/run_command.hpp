#pragma once
// Test helper: runs a shell command, with stderr merged into stdout, and returns its exit code,
// output and duration.
#include <sys/wait.h>

#include <chrono>
#include <cstdio>
#include <string>

namespace coshard::testing {

struct CommandResult {
  int rc = -1;  // exit status, or 128 + signal
  std::string output;
  double seconds = 0;
};

inline CommandResult run_command(const std::string& cmd) {
  CommandResult r;
  auto start = std::chrono::steady_clock::now();
  std::FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return r;
  char buf[4096];
  for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) r.output.append(buf, n);
  int status = ::pclose(p);
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return r;
}

}  // namespace coshard::testing
