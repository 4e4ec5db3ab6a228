#pragma once
// The records the launchers of one job keep in node 0's store (coordinator.hpp lists the keys):
// each a struct, stored as JSON with the launcher protocol as its "v" field, so that a field can
// be added without a reader misplacing the others. The claim is the exception: it stays
// positional text whose sixth field is the protocol in every version, so that any build, however
// old, can tell another's (it is read before anything else, and read only to refuse or to name).
#include <optional>
#include <string>
#include <vector>

namespace coshard::run {

// The shape and meaning of the launchers' records in the store. Raise it whenever one changes, so
// that launchers of different builds refuse to run one job together rather than misread each
// other: a joining node compares it with node 0's, and node 0 with every other node's (a build
// from before it checks nothing), so every node agrees with every other. Claims made before it
// existed carry none (0).
inline constexpr int kProtocol = 5;  // 3: the claim gained --nnodes; 4: records in JSON; 5: --silence-timeout

// Why an attempt failed; the first report of an attempt stands.
struct Failure {
  int node = 0;
  int rank = -1;            // the job rank that failed; -1 when a launcher did
  int code = 1;             // the job's exit code when it is not restarted
  bool restartable = true;  // false when a launcher was interrupted or lost the store
  // A node asks to be taken in while the attempt's ranks are well: they stop after a checkpoint
  // (SIGUSR2, --take-in-timeout) rather than at once, so that the restart loses no step.
  bool at_checkpoint = false;
  std::string what;         // "rank 3 (pid 812 on node2) exited with status 1"
  bool operator==(const Failure&) const = default;
};

// What node 0 decided once every node's ranks of an attempt had ended.
struct Verdict {
  bool restart = false;
  int code = 0;        // the launcher's exit code when not restarting; the failure's when restarting
  int failed_rank = -1;  // the rank whose failure ended the attempt, if a rank's did
  bool stopped = false;  // the job ends on a stop request (SIGUSR2): code is 75, to be continued
  std::string reason;  // why it ends unsuccessfully or restarts; empty after success
  std::vector<int> nodes = {};  // the nodes that run ranks in the next attempt, after a restart
  bool operator==(const Verdict&) const = default;
};

// What a node says once its ranks of an attempt have all ended (attempt/A/done/K).
struct DoneReport {
  int rc = 1;                   // the local exit code (Supervisor::result)
  bool interrupted = false;     // the launcher got SIGINT/SIGTERM: no restart then
  bool stop_requested = false;  // the launcher got SIGUSR2 for its ranks: no restart then either
  bool asked_in = false;        // it ran no ranks: it asks to be taken in (Coordinator::ask_in)
  bool operator==(const DoneReport&) const = default;
};

// A launcher's claim of its node rank (node/K): "<nproc> <max restarts> <min nodes> <host> <pid>
// <protocol> <take-in timeout s> <nodes> <silence timeout s>" (nodes: --nnodes N, or MAX of
// MIN:MAX); the fields after the pid are read as absent (0) from a build that did not write them.
struct Claim {
  int nproc = 0, max_restarts = 0, min_nodes = 0;
  std::string host, pid;
  int protocol = 0, take_in_timeout = 0, nodes = 0, silence_timeout = 0;
  std::string describe() const { return "coshard-run pid " + pid + " on " + host; }
};

std::string encode(const Failure& f);
std::string encode(const Verdict& v);
std::string encode(const DoneReport& d);
std::string encode(const Claim& c);

// Each reads what encode wrote; nullopt for what no launcher of this protocol writes (another
// program, or another build, uses the store: unreadable_record says so).
std::optional<Failure> decode_failure(const std::string& s);
std::optional<Verdict> decode_verdict(const std::string& s);
std::optional<DoneReport> decode_done(const std::string& s);
Claim decode_claim(const std::string& s);

// What to say of `key`, which holds `value` that no launcher of this build writes.
std::string unreadable_record(const std::string& key, const std::string& value);

// Why node `node`'s launcher (its claim `mine`) may not join the job of node 0's (its claim `zero`):
// they speak different launcher protocols, or differ in a flag that every node must share. Empty
// when it may.
std::string unlike_node_zero(int node, const Claim& mine, const Claim& zero);

// Why `who_there`'s launcher (its claim `there`) cannot run in one job with this one, `who_here`'s:
// it speaks another launcher protocol. Empty when it can.
std::string foreign_protocol(const std::string& who_there, const Claim& there, const std::string& who_here);

}  // namespace coshard::run
