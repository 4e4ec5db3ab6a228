// How coshard-run ends its local ranks (stopping.hpp), in process with the wait statuses and the
// time given: what a rank's exit means, what another node's failure asks of this node, and the
// steps that stop what ended ranks left behind.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <optional>

#include "stopping.hpp"

namespace {

using namespace coshard::run;
using std::chrono::milliseconds;
using std::chrono::seconds;

const StopClock::time_point t0{};

int exited(int code) { return W_EXITCODE(code, 0); }
int killed_by(int sig) { return W_EXITCODE(0, sig); }

TEST(LauncherStopping, ARanksEndIsASuccessAStopOnRequestOrAFailureWithItsCode) {
  const struct {
    int status;
    bool takes_stop, ok, stopped;
    int code;
  } rows[] = {
      {exited(0), false, true, false, 0},
      {exited(0), true, true, false, 0},
      {exited(75), true, true, true, 75},    // took SIGUSR2: stopped after a checkpoint
      {exited(75), false, false, false, 75},  // from any other program, a failure
      {exited(3), true, false, false, 3},
      {killed_by(SIGKILL), false, false, false, 137},
      {killed_by(SIGTERM), true, false, false, 143},
  };
  for (const auto& r : rows) {
    const RankEnd e = rank_end(r.status, r.takes_stop);
    EXPECT_EQ(e.ok, r.ok) << r.status;
    EXPECT_EQ(e.stopped, r.stopped) << r.status;
    EXPECT_EQ(e.code, r.code) << r.status;
  }
}

TEST(LauncherStopping, AnotherNodesFailureStopsTheRanksNowAfterACheckpointOrAfterAWhileWithoutTheStore) {
  const Failure rank{.node = 1, .rank = 3, .what = "rank 3 failed"};
  const Failure take_in{.node = 2, .code = 1, .at_checkpoint = true, .what = "node 2 asks to be taken in"};
  const Failure lost{.node = -1, .code = 1, .restartable = false, .what = "lost the store"};
  EXPECT_EQ(on_failure(rank, true, seconds(300)), OnFailure::stop_now);
  EXPECT_EQ(on_failure(take_in, true, seconds(300)), OnFailure::stop_at_checkpoint);
  EXPECT_EQ(on_failure(take_in, false, seconds(300)), OnFailure::stop_now);  // a rank would die of SIGUSR2
  EXPECT_EQ(on_failure(take_in, true, seconds(0)), OnFailure::stop_now);     // --take-in-timeout 0
  EXPECT_EQ(on_failure(lost, true, seconds(300)), OnFailure::lose_store);
  EXPECT_EQ(lost_store_stop(std::nullopt, t0), t0 + kLostStoreWait);
  EXPECT_EQ(lost_store_stop(t0 + seconds(3), t0), t0 + seconds(3));  // what is left of --take-in-timeout
  EXPECT_EQ(lost_store_stop(t0 + seconds(60), t0), t0 + kLostStoreWait);
}

TEST(LauncherStopping, NothingLeftBehindIsDoneAtOnce) {
  Leftovers l;
  EXPECT_EQ(leftover_step(l, false, false, t0, seconds(5)), LeftoverAction::done);
  EXPECT_FALSE(l.since);
}

// A process a rank started lives on and holds the rank's output: a second, then SIGTERM, SIGKILL
// after the grace, and a second later its pipes are drained and closed.
TEST(LauncherStopping, WhatLivesOnGetsASecondThenSigtermThenSigkillAfterTheGrace) {
  Leftovers l;
  EXPECT_EQ(leftover_step(l, true, true, t0, seconds(3)), LeftoverAction::wait);
  EXPECT_EQ(leftover_step(l, true, true, t0 + milliseconds(999), seconds(3)), LeftoverAction::wait);
  EXPECT_EQ(leftover_step(l, true, true, t0 + seconds(1), seconds(3)), LeftoverAction::term);
  EXPECT_EQ(leftover_step(l, true, true, t0 + seconds(2), seconds(3)), LeftoverAction::wait);
  EXPECT_EQ(leftover_step(l, true, true, t0 + seconds(4), seconds(3)), LeftoverAction::kill);
  EXPECT_EQ(l.signal, SIGKILL);
  // SIGKILL did not end it (it is stuck in the kernel): its pipes are drained a second later.
  EXPECT_EQ(leftover_step(l, true, true, t0 + milliseconds(4500), seconds(3)), LeftoverAction::wait);
  EXPECT_EQ(leftover_step(l, true, true, t0 + seconds(5), seconds(3)), LeftoverAction::drain);
}

TEST(LauncherStopping, TheGraceForWhatLivesOnIsAtMostFiveSeconds) {
  Leftovers l;
  leftover_step(l, true, false, t0, seconds(60));
  EXPECT_EQ(leftover_step(l, true, false, t0 + seconds(1), seconds(60)), LeftoverAction::term);
  EXPECT_EQ(leftover_step(l, true, false, t0 + milliseconds(5999), seconds(60)), LeftoverAction::wait);
  EXPECT_EQ(leftover_step(l, true, false, t0 + seconds(6), seconds(60)), LeftoverAction::kill);
}

// What ends after SIGTERM leaves only its pipes: a second for them to close, then they are drained.
TEST(LauncherStopping, WhatEndsOnSigtermGetsASecondForItsPipesToClose) {
  Leftovers l;
  leftover_step(l, true, true, t0, seconds(5));
  EXPECT_EQ(leftover_step(l, true, true, t0 + seconds(1), seconds(5)), LeftoverAction::term);
  EXPECT_EQ(leftover_step(l, false, true, t0 + milliseconds(1500), seconds(5)), LeftoverAction::wait);
  EXPECT_EQ(leftover_step(l, false, false, t0 + milliseconds(1600), seconds(5)), LeftoverAction::done);
  Leftovers held;  // a process outside the groups (setsid) holds the output: nothing to signal
  leftover_step(held, false, true, t0, seconds(5));
  EXPECT_EQ(leftover_step(held, false, true, t0 + seconds(1), seconds(5)), LeftoverAction::drain);
}

// A failure stops the running ranks: flight records first, SIGTERM a second later, SIGKILL --grace
// after it, each once.
TEST(LauncherStopping, RunningRanksGetASecondForTheirRecordsThenSigtermThenSigkillAfterTheGrace) {
  RankStop s;
  EXPECT_EQ(rank_stop_step(s, t0), RankStopStep::none);
  EXPECT_FALSE(records_asked(s, true, t0));
  EXPECT_EQ(rank_stop_step(s, t0 + milliseconds(999)), RankStopStep::none);
  EXPECT_EQ(rank_stop_step(s, t0 + seconds(1)), RankStopStep::term);
  signalled(s, t0 + seconds(1), seconds(5));
  EXPECT_EQ(rank_stop_step(s, t0 + seconds(1)), RankStopStep::none);
  EXPECT_EQ(rank_stop_step(s, t0 + milliseconds(5999)), RankStopStep::none);
  EXPECT_EQ(rank_stop_step(s, t0 + seconds(6)), RankStopStep::kill);
  EXPECT_EQ(rank_stop_step(s, t0 + seconds(60)), RankStopStep::none);  // once
}

// No rank takes SIGUSR1: SIGTERM at once. A second signal (SIGINT after SIGTERM) keeps the first
// one's SIGKILL time.
TEST(LauncherStopping, WithoutFlightRecordsSigtermIsAtOnceAndTheKillTimeIsTheFirstSignals) {
  RankStop s;
  EXPECT_TRUE(records_asked(s, false, t0));
  EXPECT_FALSE(s.term_at);
  signalled(s, t0, seconds(3));
  signalled(s, t0 + seconds(2), seconds(3));
  EXPECT_EQ(rank_stop_step(s, t0 + milliseconds(2999)), RankStopStep::none);
  EXPECT_EQ(rank_stop_step(s, t0 + seconds(3)), RankStopStep::kill);
}

// A deferred stop (the store lost, a take-in's deadline) begins when due, and its steps follow in
// order within one look when they are all due: begin, then SIGTERM, then SIGKILL.
TEST(LauncherStopping, ADeferredStopBeginsWhenDueAndItsStepsFollowInOrder) {
  RankStop s;
  s.begin_at = t0 + kLostStoreWait;
  EXPECT_EQ(rank_stop_step(s, t0 + seconds(9)), RankStopStep::none);
  EXPECT_EQ(rank_stop_step(s, t0 + kLostStoreWait), RankStopStep::begin);
  EXPECT_EQ(rank_stop_step(s, t0 + kLostStoreWait), RankStopStep::none);
  records_asked(s, true, t0 + kLostStoreWait);
  signalled(s, t0 + kLostStoreWait, seconds(0));  // --grace 0
  EXPECT_EQ(rank_stop_step(s, t0 + seconds(30)), RankStopStep::term);
  EXPECT_EQ(rank_stop_step(s, t0 + seconds(30)), RankStopStep::kill);
}

}  // namespace

// Every phase against every event: what the attempt becomes here. Each row is one cell.
TEST(LauncherPhase, EachEventMovesTheAttemptToItsPhaseOrLeavesIt) {
  const AttemptPhase running{};
  const AttemptPhase taking_in{.phase = Phase::taking_in};
  const AttemptPhase store_lost{.phase = Phase::store_lost};
  const AttemptPhase failed_here{.phase = Phase::stopping, .cause = StopCause::rank_failed, .code = 3};
  const AttemptPhase failed_there{.phase = Phase::stopping, .cause = StopCause::other_node, .code = 7};
  const AttemptPhase too_late{.phase = Phase::stopping, .cause = StopCause::deadline, .code = 1};
  const AttemptPhase interrupted{.phase = Phase::interrupted, .signal = SIGTERM};
  const AttemptPhase by_sigint{.phase = Phase::interrupted, .signal = SIGINT};
  const struct {
    AttemptPhase from;
    PhaseEvent event;
    int value;
    AttemptPhase to;
  } rows[] = {
      {running, PhaseEvent::take_in, 0, taking_in},
      {running, PhaseEvent::store_lost, 0, store_lost},
      {running, PhaseEvent::other_failed, 7, failed_there},
      {running, PhaseEvent::rank_failed, 3, failed_here},
      {running, PhaseEvent::deadline, 1, running},  // no deadline is set while the ranks run
      {running, PhaseEvent::interrupt, SIGTERM, interrupted},
      {taking_in, PhaseEvent::take_in, 0, taking_in},
      {taking_in, PhaseEvent::store_lost, 0, store_lost},
      {taking_in, PhaseEvent::other_failed, 7, failed_there},
      {taking_in, PhaseEvent::rank_failed, 3, failed_here},
      {taking_in, PhaseEvent::deadline, 1, too_late},  // --take-in-timeout
      {taking_in, PhaseEvent::interrupt, SIGTERM, interrupted},
      {store_lost, PhaseEvent::take_in, 0, store_lost},
      {store_lost, PhaseEvent::store_lost, 0, store_lost},
      {store_lost, PhaseEvent::other_failed, 7, failed_there},
      {store_lost, PhaseEvent::rank_failed, 3, failed_here},  // a rank that fails meanwhile is this node's failure
      {store_lost, PhaseEvent::deadline, 1, too_late},
      {store_lost, PhaseEvent::interrupt, SIGTERM, interrupted},
      {failed_here, PhaseEvent::take_in, 0, failed_here},
      {failed_here, PhaseEvent::store_lost, 0, failed_here},
      {failed_here, PhaseEvent::other_failed, 7, failed_here},
      {failed_here, PhaseEvent::rank_failed, 9, failed_here},  // the first failure stands
      {failed_here, PhaseEvent::deadline, 1, failed_here},
      {failed_here, PhaseEvent::interrupt, SIGTERM, interrupted},  // an interrupt after a failure: no restart
      {failed_there, PhaseEvent::rank_failed, 3, failed_there},  // a rank stopped by this launcher
      {too_late, PhaseEvent::rank_failed, 3, too_late},
      {too_late, PhaseEvent::interrupt, SIGINT, by_sigint},
      {interrupted, PhaseEvent::take_in, 0, interrupted},
      {interrupted, PhaseEvent::store_lost, 0, interrupted},
      {interrupted, PhaseEvent::other_failed, 7, interrupted},
      {interrupted, PhaseEvent::rank_failed, 3, interrupted},  // the ranks die of the signal passed on
      {interrupted, PhaseEvent::deadline, 1, interrupted},
      {interrupted, PhaseEvent::interrupt, SIGINT, interrupted},  // the first signal stands
  };
  int row = 0;
  for (const auto& r : rows) {
    const AttemptPhase to = attempt_step(r.from, r.event, r.value);
    EXPECT_EQ(to, r.to) << "row " << row << ": phase " << static_cast<int>(to.phase) << " cause "
                        << static_cast<int>(to.cause) << " code " << to.code << " signal " << to.signal;
    ++row;
  }
  // A failure whose record has no code still fails the attempt.
  EXPECT_EQ(attempt_step(running, PhaseEvent::other_failed, 0).code, 1);
}

TEST(LauncherPhase, ThePhaseSaysWhatIsWatchedPassedOnNamedAndTheExitCode) {
  const struct {
    AttemptPhase p;
    bool watches, passes, names;
    int code, code_after_stop;  // the exit code, and with a rank stopped on request
  } rows[] = {
      {{}, true, true, false, 0, 75},
      {{.phase = Phase::taking_in}, true, true, false, 0, 75},
      {{.phase = Phase::store_lost}, false, true, false, 0, 75},
      {{.phase = Phase::stopping, .cause = StopCause::rank_failed, .code = 3}, false, false, true, 3, 3},
      {{.phase = Phase::stopping, .cause = StopCause::other_node, .code = 7}, false, false, false, 7, 7},
      {{.phase = Phase::stopping, .cause = StopCause::deadline, .code = 1}, false, false, true, 1, 1},
      {{.phase = Phase::interrupted, .signal = SIGINT}, false, false, false, 130, 130},
  };
  for (const auto& r : rows) {
    const int phase = static_cast<int>(r.p.phase);
    EXPECT_EQ(watches_others(r.p), r.watches) << phase;
    EXPECT_EQ(passes_stop_request(r.p), r.passes) << phase;
    EXPECT_EQ(names_failed_ranks(r.p), r.names) << phase;
    EXPECT_EQ(exit_code(r.p, false), r.code) << phase;
    EXPECT_EQ(exit_code(r.p, true), r.code_after_stop) << phase;
  }
}
