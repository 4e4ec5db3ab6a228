#include "spawn.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "coshard/runtime/error.hpp"
#include "coshard/runtime/unique_fd.hpp"

extern char** environ;

namespace coshard::run {
namespace {

std::string name_of(const std::string& kv) { return kv.substr(0, kv.find('=')); }

// Why exec could not run `path`, or "" when it can (as far as can be told before trying): a
// directory passes access(X_OK), and the shell skips one on PATH too.
std::string why_not_runnable(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return std::strerror(errno);
  if (S_ISDIR(st.st_mode)) return "it is a directory";
  if (!S_ISREG(st.st_mode)) return "it is not a regular file";
  if (::access(path.c_str(), X_OK) != 0) return std::string(std::strerror(errno)) + " (it needs execute permission)";
  return {};
}

// The child's errno from a failed execve, read from the pipe that exec closes on success.
// Bounded well within a heartbeat's silence (the launcher beats for its node between ranks'
// starts): a child that neither execs nor exits by then is the supervisor's to deal with, as a rank.
int exec_errno(int fd) {
  pollfd p{fd, POLLIN, 0};
  for (auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return 0;
    const int ready = ::poll(&p, 1, static_cast<int>(left.count()));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) return 0;
    int err = 0;
    ssize_t n;
    do n = ::read(fd, &err, sizeof err); while (n < 0 && errno == EINTR);
    return n == static_cast<ssize_t>(sizeof err) ? err : 0;
  }
}

}  // namespace

std::string find_program(const std::string& program) {
  if (program.empty()) throw CannotStart("no program given to start");
  if (program.find('/') != std::string::npos) {
    if (auto why = why_not_runnable(program); !why.empty()) {
      throw CannotStart("cannot start '" + program + "': " + why);
    }
    return program;
  }
  const char* path = std::getenv("PATH");
  std::string dirs = path ? path : "/usr/local/bin:/usr/bin:/bin";
  for (std::size_t start = 0;;) {
    auto end = dirs.find(':', start);
    std::string dir = dirs.substr(start, end == std::string::npos ? std::string::npos : end - start);
    std::string candidate = (dir.empty() ? "." : dir) + "/" + program;
    if (why_not_runnable(candidate).empty()) return candidate;
    if (end == std::string::npos) break;
    start = end + 1;
  }
  throw CannotStart("cannot start '" + program + "': not found on PATH (" + dirs +
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
}

pid_t spawn_child(const ChildCommand& cmd, int out_fd, int err_fd, const sigset_t& mask) {
  // exec closes the write end; a failed exec writes its errno there first.
  auto report = make_pipe(O_CLOEXEC);
  if (!report[0]) throw Error(Errc::io, std::string("pipe failed: ") + std::strerror(errno));
  if (report[1].get() < 3) {  // fds 0-2 were closed in the launcher: keep clear of what the child dup2's onto
    UniqueFd moved(::fcntl(report[1].get(), F_DUPFD_CLOEXEC, 3));
    if (!moved) throw Error(Errc::io, std::string("fcntl failed: ") + std::strerror(errno));
    report[1] = std::move(moved);
  }
  const int report_fd = report[1].get();
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
    // The store's sockets and the other ranks' pipes are not the rank's; the report pipe closes on exec.
    if (report_fd > 3) ::close_range(3, static_cast<unsigned>(report_fd) - 1, 0);
    ::close_range(static_cast<unsigned>(report_fd) + 1, ~0u, 0);
    ::execve(cmd.path_.c_str(), cmd.argv_.data(), cmd.envp_.data());
    const int err = errno;
    ssize_t ignored = ::write(report_fd, &err, sizeof err);
    (void)ignored;
    ::_exit(127);
  }
  ::setpgid(pid, pid);  // also here: a signal to the group right after fork must find it
  report[1].reset();
  const int err = exec_errno(report[0].get());
  report[0].reset();
  // What no retry changes ends the job; a passing refusal (ETXTBSY while the binary is rewritten,
  // ENOMEM, EAGAIN) is a rank failure, with status 127, which a restart may get past.
  const bool lasting = err == ENOEXEC || err == EACCES || err == ENOENT || err == ENOTDIR || err == EISDIR ||
                       err == ELOOP || err == ENAMETOOLONG || err == EPERM || err == E2BIG;
  if (err != 0 && !lasting) {
    std::fprintf(stderr, "coshard-run: cannot start '%s': %s\n", cmd.path_.c_str(), std::strerror(err));
  } else if (err != 0) {
    while (::waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
    }
    throw CannotStart("cannot start '" + cmd.path_ + "': " + std::strerror(err) +
                                      (err == ENOEXEC ? " (not a program this machine runs, nor a script with #!)" : ""));
  }
  return pid;
}

}  // namespace coshard::run
