#include "console.hpp"

#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstring>

#include "coordinator_internal.hpp"

namespace coshard::run {

LineSink::LineSink(int fd, const char* name) : fd_(fd), name_(name) {
  struct stat st;
  if (::fstat(fd, &st) != 0) return;
  socket_ = S_ISSOCK(st.st_mode);
  if (S_ISFIFO(st.st_mode) || S_ISCHR(st.st_mode)) {
    own_ = UniqueFd(::open(("/proc/self/fd/" + std::to_string(fd)).c_str(), O_WRONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC));
    // The same file, or none: opening a pty's master by its name makes a new pty nobody reads.
    struct stat again;
    if (own_.get() >= 0 && (::fstat(own_.get(), &again) != 0 || again.st_dev != st.st_dev ||
                            again.st_ino != st.st_ino || again.st_rdev != st.st_rdev)) {
      own_.reset();
    }
  }
}

// At most PIPE_BUF, ending at a line's end where one is in reach: a pipe takes that much whole or
// not at all, so the ranks' stdout and stderr sharing one (2>&1) never cut each other's lines.
ssize_t LineSink::write_some(std::size_t n) {
  const char* at = text_.data() + head_;
  if (n > PIPE_BUF) {
    n = PIPE_BUF;
    const std::string_view chunk(at, n);
    if (const auto nl = chunk.rfind('\n'); nl != std::string_view::npos) n = nl + 1;
  }
  if (own_.get() >= 0) return ::write(own_.get(), at, n);
  if (socket_) return ::send(fd_, at, n, MSG_DONTWAIT | MSG_NOSIGNAL);
  return ::write(fd_, at, n);  // polled writable: a page fits in a pipe (the FIFO without a reader yet)
}

std::optional<std::string> LineSink::write_ready() {
  std::optional<std::string> failure;
  // A bound per call keeps the loop turning for a reader that is fast but never done.
  for (std::size_t budget = std::size_t{1} << 20; !idle() && budget > 0;) {
    pollfd p{target(), POLLOUT, 0};
    if (::poll(&p, 1, 0) <= 0 || (p.revents & (POLLOUT | POLLERR | POLLHUP | POLLNVAL)) == 0) break;
    const ssize_t w = write_some(queued());
    if (w < 0 && errno == EINTR) continue;
    if (w == 0 || (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))) break;
    if (w < 0) {
      const int err = errno;
      closed_ = err == EPIPE || err == EBADF;
      const std::size_t lost = drop();
      if (!said_failure_) {
        said_failure_ = true;
        failure = err == EPIPE ? std::string("the ranks' ") + name_ +
                                     " is a closed pipe (its reader ended); their lines to it are dropped and the "
                                     "job goes on"
                               : std::string("cannot write the ranks' ") + name_ + " (" + std::strerror(err) + "); " +
                                     std::to_string(lost) + " bytes of their lines are dropped" +
                                     (closed_ ? "" : ", and so are later ones it does not take");
      }
      break;
    }
    head_ += static_cast<std::size_t>(w);
    budget -= std::min(budget, static_cast<std::size_t>(w));
    progress_at_ = Clock::now();
  }
  if (idle()) {
    text_.clear();
    head_ = 0;
  } else if (head_ >= (std::size_t{1} << 20)) {
    text_.erase(0, head_);
    head_ = 0;
  }
  return failure;
}

void LineSink::add(std::string_view text) {
  if (closed_ || text.empty()) return;
  if (idle()) progress_at_ = Clock::now();  // the wait is counted from the first byte that waits
  text_.append(text);
}

std::size_t LineSink::drop() noexcept {
  const std::size_t n = queued();
  text_.clear();
  head_ = 0;
  return n;
}

void Console::say(const char* format, ...) {
  va_list args;
  va_start(args, format);
  va_list again;
  va_copy(again, args);
  const int n = std::vsnprintf(nullptr, 0, format, args);
  va_end(args);
  std::string text(n > 0 ? static_cast<std::size_t>(n) : 0, '\0');
  if (n > 0) std::vsnprintf(text.data(), text.size() + 1, format, again);
  va_end(again);
  err.add(text);
  write_ready();  // at once when the stream keeps up: in order with what the coordinator writes itself
}

void Console::note(LineSink& broken, const std::string& what) {
  LineSink& other = &broken == &out ? err : out;
  other.add("coshard-run: " + what + "\n");
  (void)other.write_ready();  // a failure of that one too has nowhere left to be said
}

void Console::write_ready() {
  LineSink* sinks[2] = {&out, &err};
  for (int i = 0; i < 2; ++i) {
    LineSink& s = *sinks[i];
    if (auto failure = s.write_ready()) note(s, *failure);
    if (s.idle()) {
      warned_[i] = false;
    } else if (!warned_[i] && s.stalled_for() >= kStallWarning) {
      warned_[i] = true;
      note(s, std::string("the launcher's ") + s.name() + " has taken nothing for " +
                  std::to_string(kStallWarning.count()) + " s: its reader is not reading (a paused pager or "
                  "terminal?). The ranks wait to write to it, and ranks elsewhere may time out waiting for them");
    }
  }
}

bool Console::stop_signalled() const noexcept {
  signalfd_siginfo si;
  bool stop = false;
  while (::read(stop_fd_, &si, sizeof si) == sizeof si) {
    const auto sig = static_cast<int>(si.ssi_signo);
    stop = stop || sig == SIGINT || sig == SIGTERM || sig == SIGHUP || sig == SIGQUIT;
  }
  return stop;
}

void Console::wait(Clock::duration d) {
  const auto until = Clock::now() + d;
  for (auto now = Clock::now(); now < until; now = Clock::now()) {
    pollfd fds[2] = {out.want(), err.want()};
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(until - now).count();
    ::poll(fds, 2, static_cast<int>(left));
    write_ready();
  }
}

void Console::finish(Clock::duration stall) noexcept {
  try {
    // A stop signal the job already ended on stays pending for main's exit code.
    const bool stopped = coord::pending_stop() != 0;
    if (stopped) stall = std::min<Clock::duration>(stall, std::chrono::seconds(10));
    for (;;) {
      write_ready();
      if (out.idle() && err.idle()) return;
      for (LineSink* s : {&out, &err}) {
        if (s->idle() || s->stalled_for() < stall) continue;
        const std::size_t lost = s->drop();
        LineSink& other = s == &out ? err : out;
        if (other.idle()) {  // one that waits too would only be given up on in turn
          note(*s, std::string("the launcher's ") + s->name() + " took nothing for " +
                       std::to_string(std::chrono::duration_cast<std::chrono::seconds>(stall).count()) + " s; the " +
                       std::to_string(lost) + " bytes of lines left for it are dropped");
        }
      }
      // Signals stay blocked (the coordinator reads what is pending): a Ctrl-C comes through here.
      pollfd fds[3] = {out.want(), err.want(), {stopped ? -1 : stop_fd_, POLLIN, 0}};
      ::poll(fds, 3, 1000);
      if ((fds[2].revents & POLLIN) && stop_signalled()) {
        out.drop();
        err.drop();
        return;
      }
    }
  } catch (...) {
    // Out of memory while saying so: what waits is lost with the process.
  }
}

}  // namespace coshard::run
