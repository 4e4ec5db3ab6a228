#include "supervisor.hpp"

#include "coshard/launch/stop_signal.hpp"
#include "hang_report.hpp"
#include "stopping.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <sys/wait.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

namespace coshard::run {
namespace {

std::string describe(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    return std::string("was killed by signal ") + std::to_string(WTERMSIG(status)) + " (" +
           strsignal(WTERMSIG(status)) + ")";
  }
  return "ended with wait status " + std::to_string(status);
}

// Whole lines, each with its rank in front; a partial last line only when the stream ended.
void emit_lines(Output& o, int rank, bool flush_partial, LineSink& to) {
  std::string lines;
  std::size_t start = 0;
  for (std::size_t nl; (nl = o.pending.find('\n', start)) != std::string::npos; start = nl + 1) {
    lines += "[rank " + std::to_string(rank) + "] ";
    lines.append(o.pending, start, nl + 1 - start);
  }
  o.pending.erase(0, start);
  if (flush_partial && !o.pending.empty()) {
    lines += "[rank " + std::to_string(rank) + "] " + o.pending + "\n";
    o.pending.clear();
  }
  to.add(lines);
}

}  // namespace

void Supervisor::watch(int sigfd) {
  for (;;) {
    std::vector<pollfd> fds{{sigfd, POLLIN, 0}, console_.out.want(), console_.err.want()};
    constexpr std::size_t kFirstOutput = 3;
    std::vector<Output*> outs = open_outputs(fds);
    if (!any_running() && leftovers_ended()) break;

    int timeout_ms = 200;
    ::poll(fds.data(), fds.size(), timeout_ms);

    // Also when poll woke for a rank's output: its pipe's hang-up comes before its SIGCHLD, and
    // reap() below takes the ranks in the order SIGCHLD says they died.
    take_signals(sigfd);
    note_stop_takers();
    if (stop_requested_) pass_on_stop_request();  // also to a rank that takes SIGUSR2 only now
    for (std::size_t i = kFirstOutput; i < fds.size(); ++i) {
      if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) relay(*outs[i - kFirstOutput]);
    }
    console_.write_ready();
    reap();
    if (Clock::now() >= next_check_) {
      next_check_ = Clock::now() + std::chrono::milliseconds(200);  // the store is asked at most 5 times a second
      coordinator_.heartbeat();  // also while the ranks are being stopped, however long --grace is
      if (watches_others(phase_)) phase_.phase == Phase::taking_in ? check_stop_now() : check_other_nodes();
    }
    stop_steps();
  }
}

// What rank_stop_step says is due: the stop that a lost store or a take-in deferred, SIGTERM after
// the flight records, SIGKILL after the grace.
void Supervisor::stop_steps() {
  for (RankStopStep step; (step = rank_stop_step(stop_, Clock::now())) != RankStopStep::none;) {
    switch (step) {
      case RankStopStep::begin: {
        const bool taking_in = phase_.phase == Phase::taking_in;
        phase_ = attempt_step(phase_, PhaseEvent::deadline, 1);
        if (taking_in && any_running()) {
          console_.say("coshard-run: the local ranks did not stop after a checkpoint within %lld s "
                       "(--take-in-timeout); stopping them\n", static_cast<long long>(o_.take_in_timeout.count()));
          coordinator_.stop_now(attempt_);
        }
        if (any_running()) ask_for_flight_records();
        break;
      }
      case RankStopStep::term:
        stop_all(SIGTERM);
        break;
      case RankStopStep::kill:
        for (const auto& c : children_) {
          if (c.running) {
            console_.say("coshard-run: rank %d (pid %d) did not stop within %.0f s; killing it\n", c.rank,
                         static_cast<int>(c.pid), o_.grace_seconds);
            ::kill(-c.pid, SIGKILL);
          }
        }
        break;
      case RankStopStep::none:
        break;
    }
  }
}

bool Supervisor::stop_requested() const noexcept {
  return std::any_of(children_.begin(), children_.end(),
                     [&](const Child& c) { return c.asked_to_stop || (stop_requested_ && c.takes_stop); });
}

int Supervisor::result() const {
  if (names_failed_ranks(phase_)) {
    for (const auto& c : children_) {
      if (!rank_end(c.status, c.takes_stop).ok) {
        console_.say("coshard-run:   rank %d %s\n", c.rank, describe(c.status).c_str());
      }
    }
  }
  return exit_code(phase_, stopped_on_request_);
}

// The streams to read now, each after its pollfd in `fds`. While ranks run, one whose lines the
// console cannot take yet is left unread: its rank waits to write. Once they have ended, what
// their pipes hold (64 KiB each at most) is read, so that leftovers_ended sees them closed.
std::vector<Output*> Supervisor::open_outputs(std::vector<pollfd>& fds) {
  std::vector<Output*> outs;
  const bool running = any_running();
  for (auto& c : children_) {
    for (Output* out : {&c.out, &c.err}) {
      if (out->fd.get() >= 0 && (!running || sink(*out).has_room())) {
        fds.push_back({out->fd.get(), POLLIN, 0});
        outs.push_back(out);
      }
    }
  }
  return outs;
}

bool Supervisor::any_running() const {
  bool any = false;
  for (const auto& c : children_) any |= c.running;
  return any;
}

void Supervisor::stop_all(int sig) {
  for (auto& c : children_) {
    if (!c.running) continue;
    ::kill(-c.pid, sig);
    ::kill(-c.pid, SIGCONT);  // a stopped rank acts on the signal only once continued
  }
  signalled(stop_, Clock::now(), grace());
}

// The ranks still running write where they are before they are stopped, so the report can say
// who is behind; SIGTERM follows a second later (at once when no rank takes SIGUSR1).
void Supervisor::ask_for_flight_records() {
  bool asked = false;
  for (const auto& c : children_) {
    if (c.running && process_state(c.pid) != 'T' && takes_signal(c.pid, flight_dir_, SIGUSR1)) {
      asked = ::kill(c.pid, SIGUSR1) == 0 || asked;
    }
  }
  if (records_asked(stop_, asked, Clock::now())) stop_all(SIGTERM);
}

void Supervisor::take_signals(int sigfd) {
  signalfd_siginfo si;
  while (::read(sigfd, &si, sizeof si) == sizeof si) {
    int sig = static_cast<int>(si.ssi_signo);
    // A SIGCHLD that comes while one is pending is merged into it: ssi_pid is the first of the
    // ranks that ended since the last read, which reap() then takes first.
    if (sig == SIGCHLD) died_first_.push_back(static_cast<pid_t>(si.ssi_pid));
    if (sig == SIGUSR2 && !stop_requested_) {
      console_.say("coshard-run: got %s, passing it to the ranks that stop after a checkpoint on it\n",
                   strsignal(sig));
      stop_requested_ = Clock::now();
    }
    if (sig == SIGINT || sig == SIGTERM || sig == SIGHUP || sig == SIGQUIT) {
      // A rank has no use for a hang-up, and SIGQUIT would dump its core: they get SIGTERM.
      const int pass = sig == SIGINT ? SIGINT : SIGTERM;
      console_.say("coshard-run: got %s, passing %s to the ranks\n", strsignal(sig), sig == pass ? "it" : "SIGTERM");
      stop_.begin_at.reset();  // stopping already
      if (phase_.phase != Phase::interrupted) {
        const bool taking_in = phase_.phase == Phase::taking_in;
        phase_ = attempt_step(phase_, PhaseEvent::interrupt, sig);
        coordinator_.report(attempt_, Failure{.node = o_.node_rank, .code = 128 + sig, .restartable = false,
                                              .what = "coshard-run on " + this_host() + " got " + strsignal(sig)});
        if (taking_in) coordinator_.stop_now(attempt_);  // the report loses to the take-in's
      }
      stop_.term_at.reset();
      stop_all(pass);
    }
  }
}

// Which ranks take SIGUSR2, noted while they run (the marker goes when the rank ends): only from
// those is exit code 75 a stop on request rather than a failure.
void Supervisor::note_stop_takers() {
  for (auto& c : children_) {
    if (c.running && !c.takes_stop) c.takes_stop = takes_signal(c.pid, flight_dir_, SIGUSR2);
  }
}

// Each rank that takes SIGUSR2 gets it once; the others (a program without launch::StopSignal,
// gpt2-train without --checkpoint-dir) would die of it and get nothing. Not after the attempt
// started ending: a failure or an interrupt is already stopping the ranks.
void Supervisor::pass_on_stop_request() {
  if (!passes_stop_request(phase_)) return;
  bool any = false;
  for (auto& c : children_) {
    if (c.running && !c.asked_to_stop && c.takes_stop) {
      c.asked_to_stop = ::kill(c.pid, SIGUSR2) == 0;
    }
    any |= c.asked_to_stop;
  }
  // A rank says it takes SIGUSR2 once it has started: give the ranks time before saying none does.
  if (!any && !said_none_stops_ && Clock::now() - *stop_requested_ >= std::chrono::seconds(10)) {
    said_none_stops_ = true;
    console_.say("coshard-run: no local rank takes SIGUSR2 (gpt2-train does with --checkpoint-dir), so none "
                 "was asked to stop: the job goes on (SIGTERM ends it without a checkpoint)\n");
  }
}

void Supervisor::relay(Output& out) {
  char buf[65536];
  ssize_t n = ::read(out.fd.get(), buf, sizeof buf);
  int rank = 0;
  for (const auto& c : children_) {
    if (&c.out == &out || &c.err == &out) rank = c.rank;
  }
  if (n > 0) {
    out.pending.append(buf, static_cast<std::size_t>(n));
    emit_lines(out, rank, false, sink(out));
  } else if (n == 0 || (errno != EINTR && errno != EAGAIN)) {
    emit_lines(out, rank, true, sink(out));
    out.fd.reset();
  }
}

// Every rank has ended, but processes they started may live on in their process groups and hold
// their output open: the launcher would wait for them without end, and a restart would meet them.
// leftover_step (stopping.hpp) says when to signal them and when to stop reading. True once
// nothing is left to wait for.
bool Supervisor::leftovers_ended() {
  std::vector<char> alive(children_.size(), 0);
  bool any_alive = false, any_held = false;
  for (std::size_t i = 0; i < children_.size(); ++i) {
    Child& c = children_[i];
    any_held |= c.out.fd.get() >= 0 || c.err.fd.get() >= 0;
    if (c.group_gone) continue;
    while (::waitpid(-c.pid, nullptr, WNOHANG) > 0) {
    }  // orphans that came to this launcher (as PID 1 or a subreaper) would stay zombies
    alive[i] = ::kill(-c.pid, 0) == 0;
    // Gone for good: the number may go to a new group of someone else's, never to be signalled.
    c.group_gone = !alive[i] && errno == ESRCH;
  }
  std::vector<pid_t> members;  // groups with a process in them, maybe only zombies
  for (std::size_t i = 0; i < children_.size(); ++i) {
    if (alive[i]) members.push_back(children_[i].pid);
  }
  if (!members.empty()) {
    const auto lives = groups_alive(members);
    for (std::size_t i = 0, k = 0; i < children_.size(); ++i) {
      if (alive[i]) alive[i] = lives[k++];
      any_alive |= alive[i] != 0;
    }
  }
  switch (leftover_step(leftovers_, any_alive, any_held, Clock::now(), grace())) {
    case LeftoverAction::done:
      return true;
    case LeftoverAction::wait:
      return false;
    case LeftoverAction::term:
    case LeftoverAction::kill:
      signal_leftovers(alive);
      return false;
    case LeftoverAction::drain:
      break;
  }
  for (std::size_t i = 0; i < children_.size(); ++i) {
    Child& c = children_[i];
    if (c.out.fd.get() < 0 && c.err.fd.get() < 0) continue;
    console_.say("coshard-run: rank %d's output is still held open by %s; not waiting for it\n", c.rank,
                 alive[i] ? "processes of its group that SIGKILL did not end"
                          : "a process outside its process group (one that called setsid)");
    for (Output* out : {&c.out, &c.err}) drain(*out, c.rank);
  }
  return true;
}

// leftovers_.signal to the process groups of the ranks in which a process lives on.
void Supervisor::signal_leftovers(const std::vector<char>& alive) {
  for (std::size_t i = 0; i < children_.size(); ++i) {
    const Child& c = children_[i];
    if (!alive[i]) continue;
    console_.say("coshard-run: rank %d (pid %d) ended, but processes it started live on in its process "
                 "group%s; %s\n", c.rank, static_cast<int>(c.pid),
                 c.out.fd.get() >= 0 || c.err.fd.get() >= 0 ? " and hold its output" : "",
                 leftovers_.signal == SIGTERM ? "sending them SIGTERM" : "they did not end after SIGTERM: killing them");
    ::kill(-c.pid, leftovers_.signal);
    ::kill(-c.pid, SIGCONT);
  }
}

// What is in the pipe now, without waiting for a writer that may never close it; then it is closed.
void Supervisor::drain(Output& out, int rank) {
  if (out.fd.get() < 0) return;
  ::fcntl(out.fd.get(), F_SETFL, ::fcntl(out.fd.get(), F_GETFL) | O_NONBLOCK);
  char buf[65536];
  // No more than a full pipe, and some: a writer outside the group could keep it full for ever.
  std::size_t read = 0;
  for (ssize_t n; read < (std::size_t{1} << 20) && (n = ::read(out.fd.get(), buf, sizeof buf)) > 0;) {
    read += static_cast<std::size_t>(n);
    out.pending.append(buf, static_cast<std::size_t>(n));
    emit_lines(out, rank, false, sink(out));
  }
  emit_lines(out, rank, true, sink(out));
  out.fd.reset();
}

// Reaps whoever ended; the first failure that no interrupt caused stops the others. Ranks that
// ended within one tick are taken in the order they died as far as SIGCHLD tells (died_first_),
// then in rank order: a rank killed first is named, not a peer that aborted when it lost it.
void Supervisor::reap() {
  std::vector<Child*> order;
  for (pid_t pid : std::exchange(died_first_, {})) {
    for (auto& c : children_) {
      if (c.pid == pid && std::find(order.begin(), order.end(), &c) == order.end()) order.push_back(&c);
    }
  }
  for (auto& c : children_) {
    if (std::find(order.begin(), order.end(), &c) == order.end()) order.push_back(&c);
  }
  for (Child* child : order) {
    Child& c = *child;
    if (!c.running) continue;
    int status = 0;
    pid_t r = ::waitpid(c.pid, &status, WNOHANG);
    if (r != c.pid) continue;
    c.running = false;
    c.status = status;
    const RankEnd end = rank_end(status, c.takes_stop);
    stopped_on_request_ |= end.stopped;
    const AttemptPhase was = phase_;
    if (!end.ok) phase_ = attempt_step(phase_, PhaseEvent::rank_failed, end.code);
    if (phase_ != was) {
      console_.say("coshard-run: rank %d (pid %d) %s; stopping the other ranks\n", c.rank,
                   static_cast<int>(c.pid), describe(status).c_str());
      coordinator_.report(attempt_, Failure{.node = o_.node_rank, .rank = c.rank, .code = phase_.code, .restartable = true,
                                            .what = "rank " + std::to_string(c.rank) + " (pid " + std::to_string(c.pid) +
                                                    " on " + this_host() + ") " + describe(status)});
      for (const auto& line : stopped_ranks(children_)) console_.say("coshard-run: %s\n", line.c_str());
      if (was.phase == Phase::taking_in) coordinator_.stop_now(attempt_);  // the report loses to the take-in's
      stop_.begin_at.reset();  // stopping now
      ask_for_flight_records();
    }
  }
}

// A failure on another node ends this attempt here too: every node restarts, or none does.
void Supervisor::check_other_nodes() {
  // Only reached before this node reported anything: a failure naming this node is node 0's
  // verdict that it fell silent, and its ranks stop too.
  auto f = coordinator_.failure(attempt_);
  if (!f) return;
  const bool all_take_it =
      std::all_of(children_.begin(), children_.end(), [](const Child& c) { return !c.running || c.takes_stop; });
  switch (on_failure(*f, all_take_it, o_.take_in_timeout)) {
    case OnFailure::stop_at_checkpoint:
      stop_at_checkpoint(*f);
      return;
    case OnFailure::lose_store:
      lose_store(*f);
      return;
    case OnFailure::stop_now:
      if (f->at_checkpoint) coordinator_.stop_now(attempt_);  // ranks elsewhere may be stopping after a checkpoint
      stop_for(*f);
      return;
  }
}

// `f`, another node's failure or this launcher's replacement, ends the attempt here: the ranks stop now.
void Supervisor::stop_for(const Failure& f) {
  phase_ = attempt_step(phase_, PhaseEvent::other_failed, f.code);
  stop_.begin_at.reset();
  console_.say("coshard-run: node %d failed: %s; stopping the local ranks\n", f.node, f.what.c_str());
  ask_for_flight_records();
}

// This launcher lost the store (`f` says how). Its ranks likely meet the same fault (a cut link,
// node 0's host down) and name the peer they miss when their collectives time out: give them that
// time, or what is left of --take-in-timeout if less. A rank failing meanwhile is handled as
// usual (reap); otherwise they are stopped at stop_.begin_at.
void Supervisor::lose_store(const Failure& f) {
  phase_ = attempt_step(phase_, PhaseEvent::store_lost, 0);
  const auto now = Clock::now();
  stop_.begin_at = lost_store_stop(stop_.begin_at, now);
  console_.say("coshard-run: %s; stopping the local ranks in %lld s unless they end first\n", f.what.c_str(),
               static_cast<long long>(std::chrono::ceil<std::chrono::seconds>(*stop_.begin_at - now).count()));
}

// Another node asks to be taken in while this attempt's ranks are well, and every local rank takes
// SIGUSR2 (on_failure): they stop after a checkpoint (exit code 75, the same step on every rank),
// and the restart resumes from it with no step lost; at --take-in-timeout they are stopped as
// after a failure.
void Supervisor::stop_at_checkpoint(const Failure& f) {
  phase_ = attempt_step(phase_, PhaseEvent::take_in, 0);
  // Not over a save the user asked for (SIGUSR2 passed on before): that one ends the job anyway.
  if (std::none_of(children_.begin(), children_.end(), [](const Child& c) { return c.asked_to_stop; })) {
    stop_.begin_at = Clock::now() + o_.take_in_timeout;
  }
  if (!any_running()) return;  // they stopped already, after their peers elsewhere
  for (const auto& c : children_) {
    if (c.running) ::kill(c.pid, SIGUSR2);
  }
  console_.say("coshard-run: node %d: %s; asking the local ranks to stop after a checkpoint (SIGUSR2), so "
               "that the restart loses no step (--take-in-timeout %lld s)\n", f.node, f.what.c_str(),
               static_cast<long long>(o_.take_in_timeout.count()));
}

// While the local ranks stop after a checkpoint for a node taken in: another node stopped its
// ranks without one, or fell silent, so theirs cannot finish the step either.
void Supervisor::check_stop_now() {
  const auto why = coordinator_.stopping_now(attempt_);
  if (!why) {
    // Without the store no node can say that it stopped its ranks: no wait for --take-in-timeout.
    // A launcher that another took the place of stops its ranks at once, as in check_other_nodes.
    const auto f = coordinator_.lost() ? coordinator_.failure(attempt_) : std::nullopt;
    if (f && f->node < 0) {
      lose_store(*f);
    } else if (f) {
      stop_for(*f);
    }
    return;
  }
  phase_ = attempt_step(phase_, PhaseEvent::other_failed, 1);
  stop_.begin_at.reset();
  console_.say("coshard-run: %s; stopping the local ranks\n", why->c_str());
  if (any_running()) ask_for_flight_records();
}

}  // namespace coshard::run
