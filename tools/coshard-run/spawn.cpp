#include "spawn.hpp"

#include <fcntl.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "coshard/runtime/error.hpp"

extern char** environ;

namespace coshard::run {
namespace {

std::string name_of(const std::string& kv) { return kv.substr(0, kv.find('=')); }

}  // namespace

std::string find_program(const std::string& program) {
  if (program.empty()) throw Error(Errc::bad_config, "no program given to start");
  if (program.find('/') != std::string::npos) {
    if (::access(program.c_str(), X_OK) != 0) {
      throw Error(Errc::bad_config, "cannot start '" + program + "': " + std::strerror(errno));
    }
    return program;
  }
  const char* path = std::getenv("PATH");
  std::string dirs = path ? path : "/usr/local/bin:/usr/bin:/bin";
  for (std::size_t start = 0;;) {
    auto end = dirs.find(':', start);
    std::string dir = dirs.substr(start, end == std::string::npos ? std::string::npos : end - start);
    std::string candidate = (dir.empty() ? "." : dir) + "/" + program;
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
    if (end == std::string::npos) break;
    start = end + 1;
  }
  throw Error(Errc::bad_config, "cannot start '" + program + "': not found on PATH (" + dirs +
                                    "); give its path or add its folder to PATH");
}

ChildCommand::ChildCommand(const std::vector<std::string>& command, const std::vector<std::string>& extra_env)
    : path_(find_program(command.empty() ? std::string() : command[0])), args_(command) {
  for (char** e = environ; e && *e; ++e) {
    std::string kv = *e;
    bool replaced = false;
    for (const auto& x : extra_env) replaced = replaced || name_of(x) == name_of(kv);
    if (!replaced) env_.push_back(std::move(kv));
  }
  env_.insert(env_.end(), extra_env.begin(), extra_env.end());
  for (auto& a : args_) argv_.push_back(a.data());
  argv_.push_back(nullptr);
  for (auto& e : env_) envp_.push_back(e.data());
  envp_.push_back(nullptr);
  exec_failed_ = "coshard-run: cannot start '" + path_ + "': exec failed\n";
}

pid_t spawn_child(const ChildCommand& cmd, int out_fd, int err_fd, const sigset_t& mask) {
  const pid_t parent = ::getpid();
  pid_t pid = ::fork();
  if (pid < 0) throw Error(Errc::io, std::string("fork failed: ") + std::strerror(errno));
  if (pid == 0) {
    // Async-signal-safe calls only, on memory laid out before the fork (see spawn.hpp).
    ::setpgid(0, 0);                     // the launcher decides who gets which signal
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // a launcher killed outright takes its ranks with it
    if (::getppid() != parent) ::_exit(127);  // it died before the line above took effect
    ::sigprocmask(SIG_SETMASK, &mask, nullptr);
    // Ranks run in process groups of their own, in the background: a read from the terminal would
    // stop one with SIGTTIN and hang the job without a word.
    if (const int nul = ::open("/dev/null", O_RDONLY); nul >= 0) ::dup2(nul, STDIN_FILENO);  // closed below
    ::dup2(out_fd, STDOUT_FILENO);
    ::dup2(err_fd, STDERR_FILENO);
    ::close_range(3, ~0u, 0);  // the store's sockets and the other ranks' pipes are not the rank's
    ::execve(cmd.path_.c_str(), cmd.argv_.data(), cmd.envp_.data());
    ssize_t ignored = ::write(STDERR_FILENO, cmd.exec_failed_.data(), cmd.exec_failed_.size());
    (void)ignored;
    ::_exit(127);
  }
  ::setpgid(pid, pid);  // also here: a signal to the group right after fork must find it
  return pid;
}

}  // namespace coshard::run
