#include "launcher.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "coshard/runtime/error.hpp"
#include "coshard/runtime/scheduler.hpp"
#include "coshard/transport/store.hpp"

namespace coshard::run {
namespace {

using Clock = std::chrono::steady_clock;

// An owned file descriptor.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Fd& operator=(Fd&& o) noexcept {
    reset();
    fd_ = std::exchange(o.fd_, -1);
    return *this;
  }
  ~Fd() { reset(); }
  int get() const noexcept { return fd_; }
  void reset() noexcept {
    if (fd_ >= 0) ::close(std::exchange(fd_, -1));
  }

 private:
  int fd_ = -1;
};

// One stream of a child: buffered so each line is written whole, with its rank in front.
struct Output {
  Fd fd;
  std::FILE* to = stdout;
  std::string pending;
};

struct Child {
  int rank = 0;
  pid_t pid = -1;
  bool running = false;
  int status = 0;
  Output out, err;
};

std::string random_token() {
  std::ifstream urandom("/dev/urandom", std::ios::binary);
  unsigned char bytes[16] = {};
  urandom.read(reinterpret_cast<char*>(bytes), sizeof bytes);
  if (!urandom) throw Error(Errc::io, "cannot read /dev/urandom to make a token; pass --token");
  std::string hex;
  for (auto b : bytes) {
    char buf[3];
    std::snprintf(buf, sizeof buf, "%02x", b);
    hex += buf;
  }
  return hex;
}

std::string describe(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    return std::string("was killed by signal ") + std::to_string(WTERMSIG(status)) + " (" +
           strsignal(WTERMSIG(status)) + ")";
  }
  return "ended with wait status " + std::to_string(status);
}

int exit_code_of(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

void emit_lines(Output& o, int rank, bool flush_partial) {
  std::size_t start = 0;
  for (std::size_t nl; (nl = o.pending.find('\n', start)) != std::string::npos; start = nl + 1) {
    std::fprintf(o.to, "[rank %d] %.*s\n", rank, static_cast<int>(nl - start), o.pending.data() + start);
  }
  o.pending.erase(0, start);
  if (flush_partial && !o.pending.empty()) {
    std::fprintf(o.to, "[rank %d] %s\n", rank, o.pending.c_str());
    o.pending.clear();
  }
  std::fflush(o.to);
}

pid_t spawn(const Options& o, int local_rank, const std::vector<std::string>& env, int out_fd, int err_fd,
            const sigset_t& old_mask) {
  std::vector<char*> argv;
  for (const auto& a : o.command) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  pid_t pid = ::fork();
  if (pid < 0) throw Error(Errc::io, std::string("fork failed: ") + std::strerror(errno));
  if (pid == 0) {
    ::setpgid(0, 0);                    // the launcher decides who gets which signal
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // a launcher killed outright takes its ranks with it
    ::sigprocmask(SIG_SETMASK, &old_mask, nullptr);
    ::dup2(out_fd, STDOUT_FILENO);
    ::dup2(err_fd, STDERR_FILENO);
    for (const auto& kv : env) ::putenv(const_cast<char*>(kv.c_str()));
    ::execvp(argv[0], argv.data());
    std::fprintf(stderr, "coshard-run: cannot start '%s' for local rank %d: %s\n", argv[0], local_rank,
                 std::strerror(errno));
    ::_exit(127);
  }
  return pid;
}

}  // namespace

int launch(const Options& o) {
  // Signals arrive through a descriptor, so the loop below sees them in order with child output.
  sigset_t mask, old_mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGINT);
  sigaddset(&mask, SIGTERM);
  sigaddset(&mask, SIGCHLD);
  if (::sigprocmask(SIG_BLOCK, &mask, &old_mask) != 0) throw Error(Errc::io, "sigprocmask failed");
  Fd sigfd(::signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK));
  if (sigfd.get() < 0) throw Error(Errc::io, std::string("signalfd failed: ") + std::strerror(errno));

  const int world = o.nnodes * o.nproc_per_node;
  const std::string token = o.token.empty() ? random_token() : o.token;

  // Node 0 serves the rendezvous store for the whole job.
  std::unique_ptr<Scheduler> sched;
  std::unique_ptr<transport::StoreServer> store;
  std::uint16_t port = o.master_port;
  if (o.node_rank == 0) {
    sched = std::make_unique<Scheduler>(Scheduler::Options{.name = "coshard-run"});
    sched->start();
    transport::StoreServer::Options so;
    so.bind_address = o.master_addr == "localhost" ? "127.0.0.1" : o.master_addr;
    so.port = o.master_port;
    so.token = token;
    store = std::make_unique<transport::StoreServer>(*sched, so);
    port = store->port();
  }

  std::vector<Child> children(static_cast<std::size_t>(o.nproc_per_node));
  for (int lr = 0; lr < o.nproc_per_node; ++lr) {
    int out_pipe[2], err_pipe[2];
    if (::pipe2(out_pipe, O_CLOEXEC) != 0 || ::pipe2(err_pipe, O_CLOEXEC) != 0) {
      throw Error(Errc::io, std::string("pipe failed: ") + std::strerror(errno));
    }
    auto& c = children[static_cast<std::size_t>(lr)];
    c.rank = o.node_rank * o.nproc_per_node + lr;
    std::vector<std::string> env = {
        "RANK=" + std::to_string(c.rank),
        "WORLD_SIZE=" + std::to_string(world),
        "LOCAL_RANK=" + std::to_string(lr),
        "LOCAL_WORLD_SIZE=" + std::to_string(o.nproc_per_node),
        "GROUP_RANK=" + std::to_string(o.node_rank),
        "MASTER_ADDR=" + o.master_addr,
        "MASTER_PORT=" + std::to_string(port),
        "COSHARD_TOKEN=" + token,
        "COSHARD_STORE_HOSTED=1",
    };
    c.pid = spawn(o, lr, env, out_pipe[1], err_pipe[1], old_mask);
    c.running = true;
    ::close(out_pipe[1]);
    ::close(err_pipe[1]);
    c.out.fd = Fd(out_pipe[0]);
    c.err.fd = Fd(err_pipe[0]);
    c.err.to = stderr;
  }
  std::fprintf(stderr, "coshard-run: started %d rank(s) of %d; store at %s:%u\n", o.nproc_per_node, world,
               o.master_addr.c_str(), static_cast<unsigned>(port));

  std::optional<Clock::time_point> kill_at;  // set once stopping: SIGKILL the rest then
  bool killed = false;
  int exit_code = 0;
  int interrupted_by = 0;
  auto stop_all = [&](int sig) {
    for (auto& c : children) {
      if (c.running) ::kill(-c.pid, sig);
    }
    if (!kill_at) kill_at = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o.grace_seconds));
  };

  for (;;) {
    std::vector<pollfd> fds{{sigfd.get(), POLLIN, 0}};
    std::vector<Output*> outs;
    for (auto& c : children) {
      for (Output* out : {&c.out, &c.err}) {
        if (out->fd.get() >= 0) {
          fds.push_back({out->fd.get(), POLLIN, 0});
          outs.push_back(out);
        }
      }
    }
    bool any_running = false;
    for (auto& c : children) any_running |= c.running;
    if (!any_running && outs.empty()) break;

    int timeout_ms = 200;
    ::poll(fds.data(), fds.size(), timeout_ms);

    if (fds[0].revents & POLLIN) {
      signalfd_siginfo si;
      while (::read(sigfd.get(), &si, sizeof si) == sizeof si) {
        int sig = static_cast<int>(si.ssi_signo);
        if (sig == SIGINT || sig == SIGTERM) {
          std::fprintf(stderr, "coshard-run: got %s, passing it to the ranks\n", strsignal(sig));
          if (!interrupted_by) interrupted_by = sig;
          stop_all(sig);
        }
      }
    }
    for (std::size_t i = 1; i < fds.size(); ++i) {
      if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      Output* out = outs[i - 1];
      char buf[65536];
      ssize_t n = ::read(out->fd.get(), buf, sizeof buf);
      int rank = 0;
      for (auto& c : children) {
        if (&c.out == out || &c.err == out) rank = c.rank;
      }
      if (n > 0) {
        out->pending.append(buf, static_cast<std::size_t>(n));
        emit_lines(*out, rank, false);
      } else if (n == 0 || (errno != EINTR && errno != EAGAIN)) {
        emit_lines(*out, rank, true);
        out->fd.reset();
      }
    }
    // Reap whoever ended.
    for (auto& c : children) {
      if (!c.running) continue;
      int status = 0;
      pid_t r = ::waitpid(c.pid, &status, WNOHANG);
      if (r != c.pid) continue;
      c.running = false;
      c.status = status;
      bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
      if (!ok && !exit_code && !interrupted_by) {
        exit_code = exit_code_of(status) ? exit_code_of(status) : 1;
        std::fprintf(stderr, "coshard-run: rank %d (pid %d) %s; stopping the other ranks\n", c.rank,
                     static_cast<int>(c.pid), describe(status).c_str());
        stop_all(SIGTERM);
      }
    }
    if (kill_at && !killed && Clock::now() >= *kill_at) {
      for (auto& c : children) {
        if (c.running) {
          std::fprintf(stderr, "coshard-run: rank %d (pid %d) did not stop within %.0f s; killing it\n", c.rank,
                       static_cast<int>(c.pid), o.grace_seconds);
          ::kill(-c.pid, SIGKILL);
        }
      }
      killed = true;
    }
  }
  if (store) store->stop();
  if (sched) sched->stop();
  if (interrupted_by) return 128 + interrupted_by;
  if (exit_code) {
    for (auto& c : children) {
      if (!(WIFEXITED(c.status) && WEXITSTATUS(c.status) == 0)) {
        std::fprintf(stderr, "coshard-run:   rank %d %s\n", c.rank, describe(c.status).c_str());
      }
    }
  }
  return exit_code;
}

}  // namespace coshard::run
