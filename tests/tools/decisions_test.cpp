// Node 0's decisions over an attempt's end (decisions.hpp), driven in process with the poll and the
// time given: each verdict row, the wait's exits, silence judged afresh; and the records they read
// (records.hpp), against what another program or build would leave in the store.
#include <gtest/gtest.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "decisions.hpp"
#include "records.hpp"

namespace {

using namespace coshard::run;
using std::chrono::seconds;
using std::chrono::milliseconds;

const LaunchClock::time_point t0{};

JobRules rules(int nnodes, int min_nodes, int max_restarts) {
  return JobRules{.nnodes = nnodes,
                  .min_nodes = min_nodes,
                  .max_restarts = max_restarts,
                  .grace_seconds = 5,
                  .join_timeout = seconds(600),
                  .rejoin_timeout = seconds(60),
                  .take_in_timeout = seconds(300),
                  .silent_for = seconds(15)};
}

Failure rank_failed(int node, int rank) {
  return Failure{.node = node, .rank = rank, .code = 1, .restartable = true, .what = "rank failed"};
}

Failure interrupted(int node, int sig) {
  return Failure{.node = node, .code = 128 + sig, .restartable = false, .what = "coshard-run got a signal"};
}

NodesEnded all_ended(int rc = 0) {
  NodesEnded e;
  e.succeeded = rc == 0;
  e.stopped_on_request = rc == 75;
  return e;
}

struct VerdictRow {
  const char* what;
  JobRules rules;
  int attempt;
  std::vector<int> nodes;
  std::optional<Failure> failed;
  NodesEnded ended;
  // expected
  bool restart;
  int code;
  bool stopped;
  std::vector<int> next;        // the next attempt's nodes after a restart
  std::string reason_has;       // a part of the reason (empty: the reason is empty)
};

std::vector<VerdictRow> verdict_rows() {
  std::vector<VerdictRow> rows;
  rows.push_back({"every rank ended well", rules(2, 2, 1), 0, {0, 1}, std::nullopt, all_ended(), false, 0, false, {},
                  ""});
  rows.push_back({"a rank failed with a restart left", rules(2, 2, 1), 0, {0, 1}, rank_failed(1, 3), all_ended(1), true,
                  1, false, {0, 1}, "node 1: rank failed"});
  rows.push_back({"a rank failed in the last attempt", rules(2, 2, 1), 1, {0, 1}, rank_failed(1, 3), all_ended(1),
                  false, 1, false, {}, "; no restarts left (--max-restarts 1)"});
  {
    NodesEnded e = all_ended(1);
    e.interrupted = {1};
    e.interrupted_code = 143;
    rows.push_back({"a rank failed and a launcher was told to stop", rules(2, 2, 1), 0, {0, 1}, rank_failed(0, 0), e,
                    false, 1, false, {}, "; not restarted: the launcher of node(s) 1 was told to stop"});
  }
  rows.push_back({"a launcher was interrupted", rules(2, 2, 1), 0, {0, 1}, interrupted(1, 15), all_ended(143), false,
                  143, false, {}, "node 1: coshard-run got a signal"});
  {
    NodesEnded e = all_ended(1);
    e.stop_requested = true;
    rows.push_back({"a rank failed after a stop request", rules(2, 2, 1), 0, {0, 1}, rank_failed(1, 2), e, false, 75,
                    true, {}, "not restarted: a stop was requested (SIGUSR2)"});
  }
  rows.push_back({"the ranks stopped on request", rules(2, 2, 1), 0, {0, 1}, std::nullopt, all_ended(75), false, 75,
                  true, {}, "the ranks stopped on request (SIGUSR2) after a checkpoint"});
  {
    NodesEnded e = all_ended(1);
    e.missing = {1};
    rows.push_back({"a node did not say in time", rules(2, 2, 1), 0, {0, 1}, rank_failed(0, 0), e, false, 1, false, {},
                    "node(s) 1 did not say in time that their ranks ended"});
  }
  {
    NodesEnded e = all_ended(1);
    e.missing = {2};
    e.silent = {2};
    rows.push_back({"a silent node is dropped under MIN:MAX", rules(3, 2, 2), 0, {0, 1, 2},
                    Failure{.node = 2, .code = 1, .restartable = true, .what = "its coshard-run fell silent"}, e, true,
                    1, false, {0, 1}, "so the job goes on without them (2 of 3 nodes, --nnodes 2:3)"});
  }
  {
    NodesEnded e = all_ended(1);
    e.missing = {1, 2};
    e.silent = {1, 2};
    rows.push_back({"too few nodes would be left", rules(3, 2, 2), 0, {0, 1, 2},
                    Failure{.node = 1, .code = 1, .restartable = true, .what = "fell silent"}, e, false, 1, false, {},
                    "node(s) 1, 2 did not say in time"});
  }
  {
    NodesEnded e = all_ended(1);
    e.missing = {2};
    e.silent = {2};
    rows.push_back({"no restart is left to drop a silent node", rules(3, 2, 1), 1, {0, 1, 2},
                    Failure{.node = 2, .code = 1, .restartable = true, .what = "fell silent"}, e, false, 1, false, {},
                    "node(s) 2 did not say in time"});
  }
  {
    NodesEnded e = all_ended(1);
    e.rejoined = {2};
    rows.push_back({"a node asks in: the restart takes it", rules(3, 2, 2), 0, {0, 1},
                    Failure{.node = 2, .code = 1, .restartable = true, .at_checkpoint = true, .what = "joined late"}, e,
                    true, 1, false, {0, 1, 2}, "; node(s) 2 rejoin the job"});
  }
  {
    NodesEnded e = all_ended(0);
    e.rejoined = {2};
    rows.push_back({"a node asked in as every rank ended well: the job is done", rules(3, 2, 2), 0, {0, 1},
                    Failure{.node = 2, .code = 1, .restartable = true, .what = "joined late"}, e, false, 0, false, {},
                    ""});
  }
  {
    NodesEnded e = all_ended(130);
    e.interrupted = {0};
    e.interrupted_code = 130;
    e.succeeded = false;
    rows.push_back({"an interrupt while a node asks in ends with the signal's code", rules(3, 2, 2), 0, {0, 1},
                    Failure{.node = 2, .code = 1, .restartable = true, .what = "joined late"}, e, false, 130, false, {},
                    "was told to stop"});
  }
  {
    NodesEnded e = all_ended(1);
    e.never_joined = {1};
    rows.push_back({"a node that never joined is named", rules(2, 2, 0), 0, {0, 1}, rank_failed(0, 0), e, false, 1,
                    false, {}, "; node 1 never joined"});
  }
  return rows;
}

TEST(LauncherDecisions, EachRowOfTheVerdict) {
  for (const auto& r : verdict_rows()) {
    const Verdict v = verdict(r.rules, r.attempt, r.nodes, r.failed, r.ended, "node 1 never joined");
    EXPECT_EQ(v.restart, r.restart) << r.what << ": " << v.reason;
    EXPECT_EQ(v.code, r.code) << r.what << ": " << v.reason;
    EXPECT_EQ(v.stopped, r.stopped) << r.what << ": " << v.reason;
    EXPECT_EQ(v.nodes, r.next) << r.what;
    if (r.reason_has.empty()) {
      EXPECT_EQ(v.reason, "") << r.what;
    } else {
      EXPECT_NE(v.reason.find(r.reason_has), std::string::npos) << r.what << ": " << v.reason;
    }
    EXPECT_EQ(v.failed_rank, r.failed && r.code != 0 ? r.failed->rank : -1) << r.what;
  }
}

// One poll at `at` seconds: the done reports, claims and silence of the nodes listed.
struct Seen {
  int node;
  std::optional<DoneReport> said = std::nullopt;
  bool silent = false;
  bool heard = true;
  bool claimed = true;
};

EndPoll poll(int at, const std::vector<Seen>& seen, int stop = 0) {
  EndPoll p{.now = t0 + seconds(at), .seen = {}, .stop = stop};
  for (const auto& s : seen) {
    p.seen[s.node] = NodeSeen{.said = s.said ? std::optional(encode(*s.said)) : std::nullopt,
                              .claimed = s.claimed,
                              .silent = s.silent,
                              .heard = s.heard};
  }
  return p;
}

TEST(LauncherDecisions, TheWaitEndsOnceEveryNodeSaidAndTalliesWhatTheySaid) {
  const JobRules r = rules(3, 3, 1);
  EndWait w(0, {0, 1, 2}, t0, r);
  EXPECT_EQ(end_step(w, poll(0, {{0, DoneReport{.rc = 0}}, {1}, {2}})), EndStep{EndAction::read_failure});
  EXPECT_EQ(w.ended.missing, (std::vector<int>{1, 2}));
  EXPECT_EQ(end_step(w, poll(1, {{1, DoneReport{.rc = 130, .interrupted = true}}, {2}})),
            EndStep{EndAction::read_failure});
  EXPECT_EQ(end_step(w, poll(2, {{2, DoneReport{.rc = 75, .stop_requested = true}}})), EndStep{EndAction::decide});
  EXPECT_TRUE(w.ended.missing.empty());
  EXPECT_EQ(w.done, (std::vector<int>{1, 2}));  // node 0 reads its own verdict
  EXPECT_EQ(w.ended.interrupted, (std::vector<int>{1}));
  EXPECT_EQ(w.ended.interrupted_code, 130);
  EXPECT_TRUE(w.ended.stop_requested);
  EXPECT_TRUE(w.ended.stopped_on_request);
  EXPECT_FALSE(w.ended.succeeded);
}

TEST(LauncherDecisions, ADoneReportNoLauncherWroteCountsAsAFailure) {
  EndWait w(0, {0, 1}, t0, rules(2, 2, 1));
  EndPoll p = poll(0, {{0, DoneReport{.rc = 0}}, {1}});
  p.seen[1].said = "0 interrupted";  // protocol 3's form
  EXPECT_EQ(end_step(w, p), EndStep{EndAction::decide});
  EXPECT_FALSE(w.ended.succeeded);
  EXPECT_TRUE(w.ended.interrupted.empty());
}

TEST(LauncherDecisions, AFailureGivesTheNodesGraceAndAMinuteToStop) {
  const JobRules r = rules(2, 2, 1);
  EndWait w(0, {0, 1}, t0, r);
  EXPECT_EQ(end_step(w, poll(0, {{0, DoneReport{.rc = 1}}, {1}})), EndStep{EndAction::read_failure});
  took_failure(w, rank_failed(0, 0), t0, r);
  EXPECT_EQ(end_step(w, poll(64, {{1}})), EndStep{EndAction::wait});  // 5 s of --grace and 60 s
  EXPECT_EQ(end_step(w, poll(65, {{1}})), EndStep{EndAction::decide});
  EXPECT_EQ(w.ended.missing, (std::vector<int>{1}));
  // A take-in's stop after a checkpoint gets --take-in-timeout more.
  EXPECT_EQ(ending_by(Failure{.at_checkpoint = true, .what = ""}, t0, r), t0 + seconds(365));
}

TEST(LauncherDecisions, ANodeNoLauncherClaimedIsNotWaitedForAfterAFailure) {
  const JobRules r = rules(3, 3, 0);
  EndWait w(0, {0, 1, 2}, t0, r);
  // Before a failure an unclaimed node is waited for (it may join late).
  EXPECT_EQ(end_step(w, poll(0, {{0, DoneReport{.rc = 1}}, {1, std::nullopt, false, false, false}, {2}})),
            EndStep{EndAction::read_failure});
  EXPECT_EQ(w.ended.missing, (std::vector<int>{1, 2}));
  took_failure(w, rank_failed(0, 0), t0, r);
  EXPECT_EQ(end_step(w, poll(1, {{1, std::nullopt, false, false, false}, {2}})), EndStep{EndAction::wait});
  EXPECT_EQ(w.ended.never_joined, (std::vector<int>{1}));
  EXPECT_EQ(w.ended.missing, (std::vector<int>{2}));
}

TEST(LauncherDecisions, NodesNeverHeardFromEndTheWaitAtTheJoinTimeout) {
  const JobRules r = rules(2, 2, 0);
  EndWait w(0, {0, 1}, t0, r);
  EXPECT_EQ(end_step(w, poll(599, {{0, DoneReport{.rc = 0}}, {1, std::nullopt, false, false}})),
            EndStep{EndAction::read_failure});
  EXPECT_EQ(end_step(w, poll(600, {{1, std::nullopt, false, true}})), EndStep{EndAction::read_failure});  // it beats
  EXPECT_EQ(end_step(w, poll(600, {{1, std::nullopt, false, false}})), EndStep{EndAction::decide});
}

TEST(LauncherDecisions, ASilentNodeWithRestartsLeftGetsTheRejoinTimeout) {
  const JobRules r = rules(3, 2, 2);
  EndWait w(0, {0, 1, 2}, t0, r);
  EXPECT_EQ(end_step(w, poll(0, {{0, DoneReport{.rc = 0}}, {1, DoneReport{.rc = 0}}, {2, std::nullopt, true}})),
            (EndStep{EndAction::report_silent, 2}));
  const Failure silence{.node = 2, .code = 1, .restartable = true, .what = "fell silent"};
  EXPECT_FALSE(fell_silent(w, 2, silence, t0, r));
  EXPECT_EQ(w.rejoining, (std::vector<int>{2}));
  // Not reported twice; the attempt failed, so nothing more to read.
  EXPECT_EQ(end_step(w, poll(59, {{2, std::nullopt, true}})), EndStep{EndAction::wait});
  EXPECT_EQ(end_step(w, poll(60, {{2, std::nullopt, true}})), EndStep{EndAction::decide});
  const NodesEnded ended = close_wait(w, 0, false, {});
  EXPECT_EQ(ended.silent, (std::vector<int>{2}));
  const Verdict v = verdict(r, 0, {0, 1, 2}, w.failed, ended, "");
  EXPECT_TRUE(v.restart) << v.reason;
  EXPECT_EQ(v.nodes, (std::vector<int>{0, 1}));
}

TEST(LauncherDecisions, ASilentNodeThatBeatsAgainIsWaitedForAsAnyOther) {
  const JobRules r = rules(2, 1, 1);
  EndWait w(0, {0, 1}, t0, r);
  EXPECT_EQ(end_step(w, poll(0, {{0, DoneReport{.rc = 0}}, {1, std::nullopt, true}})),
            (EndStep{EndAction::report_silent, 1}));
  EXPECT_FALSE(fell_silent(w, 1, Failure{.node = 1, .what = "fell silent"}, t0, r));
  // It came back and stops its ranks: past --rejoin-timeout, within --grace and a minute.
  EXPECT_EQ(end_step(w, poll(61, {{1, std::nullopt, false}})), EndStep{EndAction::wait});
  EXPECT_EQ(end_step(w, poll(62, {{1, DoneReport{.rc = 1}}})), EndStep{EndAction::decide});
  const NodesEnded ended = close_wait(w, 0, false, {});
  EXPECT_TRUE(ended.silent.empty());
  EXPECT_TRUE(verdict(r, 0, {0, 1}, w.failed, ended, "").restart);
}

TEST(LauncherDecisions, ASilentNodeWithNoRestartLeftEndsTheWaitAtOnce) {
  const JobRules r = rules(2, 2, 1);
  EndWait w(1, {0, 1}, t0, r);
  EXPECT_EQ(end_step(w, poll(0, {{0, DoneReport{.rc = 0}}, {1, std::nullopt, true}})),
            (EndStep{EndAction::report_silent, 1}));
  const Failure silence{.node = 1, .code = 1, .restartable = false, .what = "fell silent"};
  EXPECT_TRUE(fell_silent(w, 1, silence, t0, r));
  const Verdict v = verdict(r, 1, {0, 1}, w.failed, close_wait(w, 0, false, {}), "");
  EXPECT_FALSE(v.restart);
  EXPECT_NE(v.reason.find("node 1: fell silent; node(s) 1 did not say in time"), std::string::npos) << v.reason;
}

TEST(LauncherDecisions, NodeZerosOwnStopEndsTheWaitAndCountsAsAnInterrupt) {
  const JobRules r = rules(2, 2, 1);
  EndWait w(0, {0, 1}, t0, r);
  EXPECT_EQ(end_step(w, poll(0, {{0, DoneReport{.rc = 0}}, {1}}, 15)), EndStep{EndAction::report_stop});
  EXPECT_EQ(w.stop, 15);
  const NodesEnded ended = close_wait(w, w.stop, false, {});
  EXPECT_EQ(ended.interrupted, (std::vector<int>{0}));
  EXPECT_EQ(ended.interrupted_code, 143);
  // A silent node is reported before the stop, as the stop ends the wait.
  EndWait w2(0, {0, 1}, t0, r);
  EXPECT_EQ(end_step(w2, poll(0, {{0, DoneReport{.rc = 0}}, {1, std::nullopt, true}}, 15)),
            (EndStep{EndAction::report_silent, 1}));
}

TEST(LauncherDecisions, AStopRequestBetweenAttemptsEndsTheJobInsteadOfARestart) {
  const JobRules r = rules(2, 2, 1);
  EndWait w(0, {0, 1}, t0, r);
  end_step(w, poll(0, {{0, DoneReport{.rc = 1}}, {1, DoneReport{.rc = 143}}}));
  w.failed = rank_failed(0, 0);
  const Verdict v = verdict(r, 0, {0, 1}, w.failed, close_wait(w, 0, /*stop_pending=*/true, {}), "");
  EXPECT_FALSE(v.restart);
  EXPECT_EQ(v.code, 75);
  EXPECT_TRUE(v.stopped);
}

TEST(LauncherDecisions, NodeZeroIsNeverJudgedSilent) {
  EndWait w(0, {0, 1}, t0, rules(2, 2, 1));
  EXPECT_EQ(end_step(w, poll(0, {{0, std::nullopt, true}, {1}})), EndStep{EndAction::read_failure});
}

TEST(LauncherDecisions, SilenceCountsFromTheLastChangeAndAfreshAfterTheLauncherStoodStill) {
  Silence s(seconds(15));
  EXPECT_FALSE(s.judge(1, std::nullopt, t0));  // never beat: not judged
  EXPECT_FALSE(s.heard(1));
  EXPECT_FALSE(s.judge(1, "4", t0));
  EXPECT_TRUE(s.heard(1));
  EXPECT_FALSE(s.judge(1, "4", t0 + seconds(14)));
  EXPECT_TRUE(s.judge(1, "4", t0 + seconds(15)));
  EXPECT_FALSE(s.judge(1, "5", t0 + seconds(16)));  // it beat
  EXPECT_FALSE(s.judge(1, "5", t0 + seconds(30)));
  s.stood_still(t0 + seconds(30));                   // this launcher was stopped until then
  EXPECT_FALSE(s.judge(1, "5", t0 + seconds(44)));
  EXPECT_TRUE(s.judge(1, "5", t0 + seconds(45)));
  s.forget(1);
  EXPECT_FALSE(s.judge(1, "5", t0 + seconds(100)));  // heard afresh
}

// A store call that takes longer is a cut (or this launcher stood still): well within the silence
// time, so that one slow call never passes for silence.
TEST(LauncherDecisions, AStoreCallMayTakeAThirdOfTheSilenceTimeAndAtMostFiveSeconds) {
  JobRules r = rules(2, 2, 0);
  EXPECT_EQ(store_call_limit(r), seconds(5));
  r.silent_for = seconds(60);
  EXPECT_EQ(store_call_limit(r), seconds(5));
  r.silent_for = seconds(3);
  EXPECT_EQ(store_call_limit(r), seconds(1));
  r.silent_for = seconds(7);
  EXPECT_EQ(store_call_limit(r), std::chrono::milliseconds(2333));
}

// A cut-off launcher tries --rejoin-timeout while a restart may follow (and always on node 0); on
// the last attempt no longer than node 0 waits for it: the silence time less a store call.
TEST(LauncherDecisions, ACutIsTriedForTheRejoinTimeoutOrAsLongAsNodeZeroWaits) {
  struct Row {
    int silence, rejoin, max_restarts, node, attempt;
    RejoinWindow want;
  };
  const std::string last = "no restart left: node 0 ends the job once a node is silent for ";
  for (const Row& r : {Row{15, 60, 1, 1, 0, {seconds(60), "--rejoin-timeout"}},
                       Row{15, 60, 1, 1, 1, {seconds(10), last + "15 s"}},
                       Row{15, 60, 0, 1, 0, {seconds(10), last + "15 s"}},
                       Row{15, 60, 0, 0, 0, {seconds(60), "--rejoin-timeout"}},   // node 0 serves the store
                       Row{15, 8, 0, 1, 0, {seconds(8), "--rejoin-timeout"}},     // shorter than the window
                       Row{6, 60, 0, 2, 0, {seconds(4), last + "6 s"}},
                       Row{60, 30, 0, 1, 0, {seconds(30), "--rejoin-timeout"}}}) {
    JobRules j = rules(3, 3, r.max_restarts);
    j.silent_for = seconds(r.silence);
    j.rejoin_timeout = seconds(r.rejoin);
    EXPECT_EQ(rejoin_window(j, r.node, r.attempt), r.want)
        << "silence " << r.silence << " rejoin " << r.rejoin << " node " << r.node << " attempt " << r.attempt;
  }
}

TEST(LauncherRecords, EachRecordReadsBackAsWritten) {
  const Failure f{.node = 3, .rank = 17, .code = 143, .restartable = false, .at_checkpoint = true,
                  .what = "rank 17 (pid 812 on node3) said \"no\"\nand more"};
  EXPECT_EQ(decode_failure(encode(f)), f);
  const Verdict v{.restart = true, .code = 1, .failed_rank = 17, .stopped = false, .reason = "why", .nodes = {0, 2, 5}};
  EXPECT_EQ(decode_verdict(encode(v)), v);
  const DoneReport d{.rc = 75, .interrupted = true, .stop_requested = true, .asked_in = false};
  EXPECT_EQ(decode_done(encode(d)), d);
  const Claim c{.nproc = 8, .max_restarts = 2, .min_nodes = 1, .host = "node3", .pid = "4242",
                .protocol = kProtocol, .take_in_timeout = 300, .nodes = 4, .silence_timeout = 7};
  const Claim back = decode_claim(encode(c));
  EXPECT_EQ(encode(back), encode(c));
  EXPECT_EQ(foreign_protocol("node 3", back, "node 0"), "");
}

TEST(LauncherRecords, WhatNoLauncherOfThisProtocolWroteIsNotRead) {
  for (const std::string s : {"", "1 -1 1 1 0 rank 3 failed", "restart 1 -1 0 1\nwhy", "{\"v\":3,\"rc\":0}",
                              "{\"rc\":0}", "[1,2]", "{\"v\":4,\"node\":\"x\"}", "{\"v\":4,", "null"}) {
    EXPECT_FALSE(decode_failure(s)) << s;
    EXPECT_FALSE(decode_verdict(s)) << s;
    EXPECT_FALSE(decode_done(s)) << s;
  }
  const std::string why = unreadable_record("attempt/0/failure", "1 -1 1 1 0 rank 3");
  EXPECT_NE(why.find("store key 'attempt/0/failure' holds '1 -1 1 1 0 rank 3'"), std::string::npos) << why;
  EXPECT_NE(why.find("give this job a --master port of its own"), std::string::npos) << why;
}

// Every flag that the nodes must share, checked against node 0's claim before a node claims its own
// node rank (the join's shell is LauncherNodes.ALauncherOfAnotherBuild*'s).
TEST(LauncherRecords, ANodeWhoseSharedFlagsDifferFromNodeZerosIsToldWhichAndWhatToDo) {
  const Claim zero{.nproc = 2, .max_restarts = 1, .min_nodes = 2, .host = "node0", .pid = "4242",
                   .protocol = kProtocol, .take_in_timeout = 300, .nodes = 2, .silence_timeout = 15};
  EXPECT_EQ(unlike_node_zero(1, zero, zero), "");
  const struct {
    void (*change)(Claim&);
    std::string says;
  } rows[] = {
      {[](Claim& c) { c.nproc = 3; }, "--nproc-per-node is 3 on node 1 but 2 on node 0"},
      {[](Claim& c) { c.max_restarts = 0; }, "--max-restarts is 0 on node 1 but 1 on node 0"},
      {[](Claim& c) { c.nodes = 3; }, "--nnodes N (MAX of MIN:MAX) is 3 on node 1 but 2 on node 0"},
      {[](Claim& c) { c.min_nodes = 1; }, "--nnodes MIN (of MIN:MAX) is 1 on node 1 but 2 on node 0"},
      {[](Claim& c) { c.take_in_timeout = 60; }, "--take-in-timeout is 60 on node 1 but 300 on node 0"},
      {[](Claim& c) { c.silence_timeout = 6; }, "--silence-timeout is 6 on node 1 but 15 on node 0"},
      {[](Claim& c) { c.protocol = kProtocol + 1; }, "speaks launcher protocol"},
  };
  for (const auto& r : rows) {
    Claim mine = zero, theirs = zero;
    r.change(r.says.starts_with("speaks") ? theirs : mine);
    const std::string why = unlike_node_zero(1, mine, theirs);
    EXPECT_NE(why.find(r.says), std::string::npos) << why;
    if (!r.says.starts_with("speaks")) {
      EXPECT_NE(why.find("(coshard-run pid 4242 on node0): give every node the same --"), std::string::npos) << why;
    }
  }
}

TEST(LauncherRecords, AClaimOfAnotherBuildIsToldByItsProtocolField) {
  const Claim old = decode_claim("2 1 2 node0 4242");  // from before protocol versions
  EXPECT_EQ(old.protocol, 0);
  EXPECT_EQ(old.describe(), "coshard-run pid 4242 on node0");
  EXPECT_NE(foreign_protocol("node 0", old, "node 1").find("speaks launcher protocol 0 (a build from before protocol "
                                                            "versions), node 1's protocol " + std::to_string(kProtocol)),
            std::string::npos);
  EXPECT_EQ(decode_claim("2 1 2 node0 4242 3 300 2").protocol, 3);
  EXPECT_NE(foreign_protocol("node 0", decode_claim("2 1 2 node0 4242 3 300 2"), "node 1"), "");
}

// A failed store call: a cut to ride out, nothing new while cut or lost already, or, from node 0's
// own store, a loss unless the call timed out (this launcher stalled) or it was cut already.
TEST(LauncherDecisions, AFailedStoreCallIsACutOrALossOfNodeZerosOwnStore) {
  StoreLink fine, cut, broken;
  take_break(cut, BreakMeans::cut, t0);
  take_break(broken, BreakMeans::lost, t0);
  EXPECT_EQ(cut.state, Link::cut);
  EXPECT_EQ(broken.state, Link::broken);
  EXPECT_TRUE(broken.lost());
  EXPECT_FALSE(broken.cut_off());  // it never stopped answering: no "not reached for" to say
  const struct {
    const StoreLink& l;
    bool own, timed_out;
    BreakMeans means;
  } rows[] = {
      {fine, false, false, BreakMeans::cut},        {fine, false, true, BreakMeans::cut},
      {cut, false, false, BreakMeans::still_cut},   {fine, true, true, BreakMeans::cut},
      {fine, true, false, BreakMeans::lost},        {cut, true, false, BreakMeans::still_cut},
      {broken, false, false, BreakMeans::still_cut}, {broken, true, false, BreakMeans::still_cut},
  };
  for (const auto& r : rows) {
    EXPECT_EQ(on_break(r.l, r.own, r.timed_out), r.means) << r.own << r.timed_out << static_cast<int>(r.l.state);
  }
  StoreLink still = cut;
  take_break(still, BreakMeans::still_cut, t0 + seconds(5));
  EXPECT_EQ(still.since, t0);  // a cut counts from its first failed call
}

// A cut is tried at once, then every kReconnectEvery, and given up once it lasted the window; one
// reached again is up, and one whose node rank another launcher took is lost for good.
TEST(LauncherDecisions, ACutIsTriedEverySecondAndGivenUpAfterItsWindow) {
  StoreLink c;
  EXPECT_FALSE(try_again_now(c, t0));  // not cut: nothing to try
  take_break(c, BreakMeans::cut, t0);
  EXPECT_TRUE(try_again_now(c, t0));
  EXPECT_FALSE(try_failed(c, t0 + milliseconds(500), seconds(3)));
  EXPECT_FALSE(try_again_now(c, t0 + milliseconds(1499)));
  EXPECT_TRUE(try_again_now(c, t0 + milliseconds(1500)));
  EXPECT_FALSE(try_failed(c, t0 + milliseconds(2999), seconds(3)));
  EXPECT_EQ(c.state, Link::cut);
  StoreLink healed = c;
  reached_again(healed);
  EXPECT_EQ(healed.state, Link::up);
  EXPECT_TRUE(try_failed(c, t0 + milliseconds(3400), seconds(3)));
  EXPECT_EQ(c.state, Link::given_up);
  EXPECT_EQ(c.cut_for, 3);
  EXPECT_TRUE(c.lost());
  EXPECT_TRUE(c.cut_off());
  EXPECT_FALSE(try_again_now(c, t0 + seconds(10)));  // given up: never tried again
  reached_again(c);
  EXPECT_EQ(c.state, Link::given_up);
  replaced_by(healed, "coshard-run on h2");
  EXPECT_EQ(healed.state, Link::replaced);
  EXPECT_EQ(healed.reason, "coshard-run on h2");
  EXPECT_TRUE(healed.lost());
}

}  // namespace
